//! `lunkit pr` without a device that answers: the node's key, bad keys and types as usage
//! errors before anything is opened, a device that is not there, each command's exit codes
//! in its `--help`, and no panic into a closed pipe. The reservations themselves are tested
//! on LIO in the VM (tests/vm_pr.rs).
#![allow(clippy::disallowed_methods)]

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use lunkit::pr::Key;

fn lunkit(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lunkit"))
        .args(args)
        .output()
        .unwrap()
}

/// A root with `etc/machine-id` (and nothing else), removed when dropped.
struct MachineRoot(PathBuf);

impl MachineRoot {
    fn new(tag: &str, id: &str) -> MachineRoot {
        let dir = std::env::temp_dir().join(format!("lunkit-cli-pr-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("etc")).unwrap();
        std::fs::write(dir.join("etc/machine-id"), id).unwrap();
        MachineRoot(dir)
    }

    fn arg(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for MachineRoot {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const ID: &str = "0123456789abcdef0123456789abcdef\n";

#[test]
fn pr_key_prints_the_key_derived_from_the_machine_id() {
    let root = MachineRoot::new("key", ID);
    let out = lunkit(&["--root", root.arg(), "pr", "key"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let want = Key::from_identity("0123456789abcdef0123456789abcdef");
    assert_eq!(String::from_utf8_lossy(&out.stdout), format!("{want}\n"));
    // Without a machine-id: refused, saying what to do.
    let bare = MachineRoot::new("bare", "uninitialized\n");
    let out = lunkit(&["--root", bare.arg(), "pr", "key"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("machine-id"));
}

#[test]
fn bad_keys_and_types_are_usage_errors_before_anything_is_opened() {
    let root = MachineRoot::new("bad", ID);
    for args in [
        vec!["pr", "register", "sdz", "--key", "0xzz"],
        vec!["pr", "register", "sdz", "--key", "0x12345678901234567"],
        vec!["pr", "reserve", "sdz", "--type", "exclusive"],
        vec!["pr", "preempt", "sdz", "--victim", "-1"],
        // A key of 0 is no key: refused before the device is looked up.
        vec!["pr", "reserve", "sdz", "--key", "0"],
        vec!["pr", "show", "sdz", "--timeout", "99999999"],
    ] {
        let mut all = vec!["--root", root.arg()];
        all.extend(&args);
        let out = lunkit(&all);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            !err.contains("panicked") && out.stdout.is_empty(),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn a_device_that_is_not_there_is_not_found() {
    let root = MachineRoot::new("none", ID);
    for cmd in [
        "show",
        "register",
        "reserve",
        "release",
        "preempt",
        "clear",
        "unregister",
    ] {
        let out = lunkit(&["--root", root.arg(), "pr", cmd, "sdz"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{cmd}: {err}");
        assert!(err.contains("no block device sdz"), "{cmd}: {err}");
    }
}

#[test]
fn every_pr_command_says_its_exit_codes_and_is_quiet_into_a_closed_pipe() {
    for cmd in [
        "show",
        "key",
        "register",
        "unregister",
        "reserve",
        "release",
        "preempt",
        "clear",
    ] {
        let long = String::from_utf8_lossy(&lunkit(&["pr", cmd, "--help"]).stdout).into_owned();
        assert!(long.contains("Exit 0"), "{cmd}: {long}");
    }
    let preempt =
        String::from_utf8_lossy(&lunkit(&["pr", "preempt", "--help"]).stdout).into_owned();
    for opt in [
        "--key",
        "--type",
        "--victim",
        "--abort",
        "--force",
        "--timeout",
    ] {
        assert!(preempt.contains(opt), "{opt}: {preempt}");
    }
    let root = MachineRoot::new("pipe", ID);
    let mut child = Command::new(env!("CARGO_BIN_EXE_lunkit"))
        .args(["--root", root.arg(), "pr", "key"])
        .stdout(closed_pipe())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = child.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(0), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// The write end of a pipe whose read end is closed already (as in conventions.rs): a
/// `true` was given the read end as its stdin and has exited.
fn closed_pipe() -> Stdio {
    let mut reader = Command::new("true").stdin(Stdio::piped()).spawn().unwrap();
    let write_end = reader.stdin.take().unwrap();
    assert!(reader.wait().unwrap().success());
    Stdio::from(write_end)
}

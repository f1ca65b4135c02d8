//! Without root, the teardown commands fail with a permission error that names the file they
//! could not open, and exit 1, never a panic (issue 7). Runs the binary as `nobody` through
//! setpriv, so it needs root to start with; it checks nothing when not root.
#![allow(clippy::disallowed_methods)]

use std::process::{Command, Output};

fn is_root() -> bool {
    // The effective uid is the second field of the Uid: line.
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("Uid:"))?.to_owned();
            line.split_whitespace().nth(2).map(|u| u == "0")
        })
        .unwrap_or(false)
}

fn as_nobody(args: &[&str]) -> Output {
    Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(env!("CARGO_BIN_EXE_lunkit"))
        .args(args)
        .output()
        .expect("setpriv (util-linux)")
}

fn assert_denied(out: &Output, names: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("Permission denied"), "{err}");
    assert!(
        err.contains(names),
        "the message should name {names}: {err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

/// A loop device over a file in a temp dir, detached on drop.
struct Loop {
    dev: String,
    dir: std::path::PathBuf,
}

impl Loop {
    fn new() -> Loop {
        let dir = std::env::temp_dir().join(format!("lunkit-perm-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let img = dir.join("img");
        std::fs::File::create(&img)
            .unwrap()
            .set_len(1 << 20)
            .unwrap();
        let out = Command::new("losetup")
            .args(["--find", "--show", img.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        Loop {
            dev: String::from_utf8(out.stdout).unwrap().trim().to_owned(),
            dir,
        }
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.dev]).status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn flush_without_root_names_the_device_node() {
    if !is_root() {
        eprintln!("skipped: needs root to set up the loop device and drop to nobody");
        return;
    }
    let lo = Loop::new();
    assert_denied(&as_nobody(&["flush", &lo.dev]), &lo.dev);
}

#[test]
fn detach_without_root_names_the_lock_it_cannot_take() {
    if !is_root() {
        eprintln!("skipped: needs root to drop to nobody");
        return;
    }
    let root = std::env::temp_dir().join(format!("lunkit-perm-root-{}", std::process::id()));
    // A root whose run/ belongs to root, like the real one.
    std::fs::create_dir_all(root.join("run")).unwrap();
    std::fs::create_dir_all(root.join("sys/class/scsi_device")).unwrap();
    let out = as_nobody(&[
        "--root",
        root.to_str().unwrap(),
        "detach",
        "--wwid",
        "36001405a1b2c3d4e5f60718293a4b5c6",
    ]);
    assert_denied(&out, "run/lunkit");
    let _ = std::fs::remove_dir_all(&root);
}

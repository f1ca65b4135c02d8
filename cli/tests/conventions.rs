//! The command line as storage engineers expect it (issue 55): a closed stdout pipe ends a
//! command quietly; a malformed name is a usage error (exit 2) naming the accepted forms; one
//! spelling per thing, the old ones kept as hidden aliases; an option of another kind of
//! volume is refused; `attach`'s usage line shows only what it takes; one line per command in
//! `lunkit --help`; messages that say what to do.
#![allow(clippy::disallowed_methods)]

use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

const USAGE: i32 = 2;
const IQN: &str = "iqn.2003-01.org.example:none";
const NQN: &str = "nqn.2014-08.org.example:none";
const WWPN: &str = "0x5001438002a3c4d6";

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(name)
}

/// A root that does not exist: what is refused there was refused before anything was read.
const NOWHERE: &str = "/nonexistent/lunkit-conventions";

fn lunkit(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lunkit"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// `lunkit --root NOWHERE ARGS…`.
fn nowhere(args: &[&str]) -> Output {
    let mut all = vec!["--root", NOWHERE];
    all.extend_from_slice(args);
    lunkit(&all)
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The write end of a pipe whose read end is closed already, for a child's stdout: a
/// `true` was given the read end as its stdin and has exited, and this process never held
/// it. Every write to it fails with EPIPE, however fast the child writes.
fn closed_pipe() -> Stdio {
    let mut reader = Command::new("true").stdin(Stdio::piped()).spawn().unwrap();
    let write_end = reader.stdin.take().unwrap();
    assert!(reader.wait().unwrap().success());
    Stdio::from(write_end)
}

/// Runs `lunkit ARGS…` with stdout a closed pipe and `input` on stdin; checks it ended
/// quietly: exit 0 (or killed by SIGPIPE, 141 in a shell), at most one line on stderr and
/// that one about the pipe, and never a panic.
fn assert_quiet_into_closed_pipe(args: &[&str], input: &str) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_lunkit"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(closed_pipe())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(input.as_bytes()).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    let err = stderr(&out);
    let sigpipe = out.status.signal() == Some(13);
    assert!(
        out.status.code() == Some(0) || sigpipe,
        "{args:?}: {:?}, stderr {err}",
        out.status
    );
    assert!(!err.contains("panicked"), "{args:?}: {err}");
    assert!(
        err.is_empty() || (err.lines().count() == 1 && err.to_lowercase().contains("pipe")),
        "{args:?}: {err}"
    );
}

#[test]
fn a_closed_stdout_pipe_ends_a_command_quietly() {
    let root = fixture("iscsi-multipath");
    let r = root.to_str().unwrap();
    assert_quiet_into_closed_pipe(&["--root", r, "list", "--json"], "");
    assert_quiet_into_closed_pipe(&["--root", r, "list"], "");
    assert_quiet_into_closed_pipe(&["--help"], "");
    assert_quiet_into_closed_pipe(&["attach", "--help"], "");
    // A batch stops after the line whose output could not be written: more lines than the
    // pipe could ever hold are given, and none of them panics.
    let lines = "list --json\n".repeat(500);
    assert_quiet_into_closed_pipe(&["--root", r, "batch"], &lines);
}

#[test]
fn malformed_names_are_usage_errors_naming_the_accepted_forms() {
    let wwid_forms = "naa.<16 or 32 hex digits>";
    let iqn_forms = "iqn.yyyy-mm.<reverse domain name>[:<name>]";
    let nqn_forms = "nqn.yyyy-mm.<reverse domain name>[:<name>]";
    let cases: Vec<(Vec<&str>, &str)> = vec![
        // `detach --wwid foo` used to find nothing, and call that "detached".
        (vec!["detach", "--wwid", "foo"], wwid_forms),
        (vec!["detach", "--wwid", "naa.1234"], wwid_forms),
        (vec!["detach", "--wwid", "3xyz", "--json"], wwid_forms),
        (vec!["resize", "--wwid", "8foo"], wwid_forms),
        (
            vec!["scan", "hctl", "0:0:0:1", "--expect-wwid", "foo"],
            "uuid.",
        ),
        (
            vec!["attach", "--iscsi-target", "x", "--lun", "1"],
            iqn_forms,
        ),
        (
            vec!["detach", "--iscsi-target", "x", "--lun", "1"],
            iqn_forms,
        ),
        (
            vec!["resize", "--iscsi-target", "eui.12", "--lun", "1"],
            iqn_forms,
        ),
        (
            vec!["scan", "iscsi", "--iscsi-target", "x", "--lun", "1"],
            iqn_forms,
        ),
        (
            vec!["scan", "iscsi", "--target", "x", "--lun", "1"],
            iqn_forms,
        ),
        (
            vec!["nvme", "connect", "--traddr", "127.0.0.1", "--nqn", "nqn.x"],
            nqn_forms,
        ),
        (
            vec![
                "nvme",
                "connect",
                "--traddr",
                "127.0.0.1",
                "--nvme-nqn",
                "nqn.x",
            ],
            nqn_forms,
        ),
        (vec!["nvme", "rescan", "--nvme-nqn", "nqn.x"], nqn_forms),
        (
            vec!["attach", "--nvme-nqn", "nqn.x", "--nsid", "1"],
            nqn_forms,
        ),
        (
            vec![
                "scan",
                "iscsi",
                "--iscsi-target",
                IQN,
                "--lun",
                "1",
                "--portal",
                "san1",
            ],
            "expected ADDR:PORT",
        ),
        (
            vec![
                "attach",
                "--iscsi-target",
                IQN,
                "--lun",
                "1",
                "--portal",
                "10.0.0.1",
            ],
            "expected ADDR:PORT",
        ),
        (
            vec!["attach", "--fc-wwpn", "zz", "--lun", "1"],
            "16 hex digits",
        ),
        (
            vec!["scan", "fc", "--fc-wwpn", "zz", "--lun", "1"],
            "16 hex digits",
        ),
    ];
    for (args, forms) in cases {
        let out = nowhere(&args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(USAGE), "{args:?}: {err}");
        assert!(err.contains(forms), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?} printed a result");
    }
}

/// Every old spelling parses and does what the new one does: the same exit code and the same
/// message, on a root where each finds nothing. The old ones are not in `--help`.
#[test]
fn every_old_option_spelling_still_works_and_is_hidden() {
    let cases: [(&[&str], &str, &str, &[&str]); 5] = [
        (
            &["scan", "iscsi"],
            "--target",
            "--iscsi-target",
            &[IQN, "--lun", "1"],
        ),
        (
            &["scan", "fc"],
            "--wwpn",
            "--fc-wwpn",
            &[WWPN, "--lun", "1"],
        ),
        (
            &["nvme", "connect"],
            "--nqn",
            "--nvme-nqn",
            &[NQN, "--traddr", "127.0.0.1"],
        ),
        (&["nvme", "disconnect"], "--nqn", "--nvme-nqn", &[NQN]),
        (&["nvme", "rescan"], "--nqn", "--nvme-nqn", &[NQN]),
    ];
    for (cmd, old, new, rest) in cases {
        let run = |flag: &str| {
            let mut args = cmd.to_vec();
            args.push(flag);
            args.extend_from_slice(rest);
            nowhere(&args)
        };
        let (was, is) = (run(old), run(new));
        assert_ne!(
            was.status.code(),
            Some(USAGE),
            "{cmd:?} {old}: {}",
            stderr(&was)
        );
        assert_eq!(
            was.status.code(),
            is.status.code(),
            "{cmd:?} {old} vs {new}"
        );
        assert_eq!(stderr(&was), stderr(&is), "{cmd:?} {old} vs {new}");
        assert_eq!(was.stdout, is.stdout, "{cmd:?} {old} vs {new}");

        let mut args = cmd.to_vec();
        args.push("--help");
        let help = String::from_utf8_lossy(&lunkit(&args).stdout).into_owned();
        assert!(help.contains(&format!("{new} <")), "{cmd:?}: {help}");
        assert!(!help.contains(&format!(" {old} ")), "{cmd:?}: {help}");
    }
}

#[test]
fn options_for_another_kind_of_volume_are_refused_by_name() {
    let nvme = ["--nvme-nqn", NQN, "--nsid", "1"];
    let iscsi = ["--iscsi-target", IQN, "--lun", "1"];
    let fc = ["--fc-wwpn", WWPN, "--lun", "1"];
    let cases: Vec<(&str, Vec<&str>, &str)> = vec![
        ("attach", [&iscsi[..], &["--nsid", "3"]].concat(), "--nsid"),
        (
            "attach",
            [&iscsi[..], &["--nguid", "eui.x"]].concat(),
            "--nguid",
        ),
        ("attach", [&nvme[..], &["--lun", "2"]].concat(), "--lun"),
        (
            "attach",
            [&nvme[..], &["--wait-map"]].concat(),
            "--wait-map",
        ),
        (
            "attach",
            [&nvme[..], &["--initiator", WWPN]].concat(),
            "--initiator",
        ),
        (
            "attach",
            [&iscsi[..], &["--initiator", WWPN]].concat(),
            "--initiator",
        ),
        (
            "attach",
            [&fc[..], &["--portal", "10.0.0.1:3260"]].concat(),
            "--portal",
        ),
        (
            "attach",
            [&iscsi[..], &["--hostnqn", NQN]].concat(),
            "--hostnqn",
        ),
        (
            "attach",
            [&fc[..], &["--discover", "10.0.0.1"]].concat(),
            "--discover",
        ),
        (
            "attach",
            [&iscsi[..], &["--dhchap-secret-file", "/k"]].concat(),
            "--dhchap-secret-file",
        ),
        ("attach", vec!["1:0:0:1", "--lun", "3"], "--lun"),
        ("attach", vec!["1:0:0:1", "--nsid", "3"], "--nsid"),
        ("detach", [&iscsi[..], &["--nsid", "3"]].concat(), "--nsid"),
        ("detach", vec!["/dev/sdc", "--nsid", "3"], "--nsid"),
        ("detach", vec!["/dev/sdc", "--lun", "3"], "--lun"),
        (
            "detach",
            vec![
                "--wwid",
                "naa.600a098038303053453f463045727a41",
                "--lun",
                "3",
            ],
            "--lun",
        ),
        ("resize", [&nvme[..], &["--lun", "2"]].concat(), "--lun"),
        ("resize", [&fc[..], &["--nsid", "2"]].concat(), "--nsid"),
    ];
    for (cmd, args, option) in cases {
        let mut all = vec![cmd];
        all.extend(args);
        let out = nowhere(&all);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(USAGE), "{all:?}: {err}");
        assert!(
            err.contains("cannot be used with") && err.contains(option),
            "{all:?}: {err}"
        );
    }
}

#[test]
fn attach_shows_only_what_it_takes() {
    let help = String::from_utf8_lossy(&lunkit(&["attach", "--help"]).stdout).into_owned();
    let usage = help.lines().find(|l| l.starts_with("Usage:")).unwrap();
    assert!(
        usage.contains("<H:C:T:L|--iscsi-target <IQN>|--fc-wwpn <WWPN>|--nvme-nqn <NQN>>"),
        "{usage}"
    );
    assert!(!help.contains("DEVICE"), "{help}");
    assert!(!help.contains("--wwid "), "{help}");
    // What it does not take is refused as clap refuses any unknown option, not after a look
    // at the node.
    for args in [
        &["attach", "--wwid", "naa.600a098038303053453f463045727a41"][..],
        &["attach", "/dev/sdc"],
    ] {
        let out = nowhere(args);
        assert_eq!(out.status.code(), Some(USAGE), "{args:?}");
        assert!(
            !stderr(&out).contains("attach needs an address"),
            "{args:?}"
        );
    }
}

#[test]
fn lunkit_help_gives_each_command_one_line_and_its_help_the_exit_codes() {
    let help = String::from_utf8_lossy(&lunkit(&["--help"]).stdout).into_owned();
    let commands: Vec<&str> = help
        .lines()
        .skip_while(|l| *l != "Commands:")
        .skip(1)
        .take_while(|l| !l.is_empty())
        .collect();
    assert!(commands.len() >= 12, "{help}");
    for line in &commands {
        // "  NAME   summary": a line per command, no continuation, no exit codes.
        let name = line.split_whitespace().next().unwrap();
        assert!(line.starts_with(&format!("  {name} ")), "{line}");
        assert!(!line.contains("Exit "), "{line}");
        assert!(line.len() < 110, "{line}");
    }
    assert!(help.contains("Exit codes: 0 done"), "{help}");
    for cmd in ["attach", "detach", "resize", "delete", "flush", "doctor"] {
        let long = String::from_utf8_lossy(&lunkit(&[cmd, "--help"]).stdout).into_owned();
        assert!(long.contains("Exit 0"), "{cmd}: {long}");
        let short = String::from_utf8_lossy(&lunkit(&[cmd, "-h"]).stdout).into_owned();
        assert!(!short.contains("Exit 0"), "{cmd}: {short}");
    }
}

/// The messages that used to glue a sentence to "not found", or stop at it, say in one
/// sentence what is missing and what to do: the library's own words, which the CLI prints
/// as they are.
#[test]
fn a_missing_session_host_nqn_port_or_controller_says_what_to_do() {
    // A copy: `attach` takes its volume lock under run/ of the root.
    let root = std::env::temp_dir().join(format!("lunkit-conventions-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let st = Command::new("cp")
        .arg("-a")
        .arg(fixture("iscsi-multipath"))
        .arg(&root)
        .status()
        .unwrap();
    assert!(st.success());
    let r = root.to_str().unwrap();
    for args in [
        &["scan", "iscsi", "--iscsi-target", IQN, "--lun", "1"][..],
        &["attach", "--iscsi-target", IQN, "--lun", "1"],
    ] {
        let mut all = vec!["--root", r];
        all.extend_from_slice(args);
        let out = lunkit(&all);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(3), "{args:?}: {err}");
        assert!(
            err.contains(&format!("iscsiadm -m node -T {IQN} -p PORTAL --login")),
            "{err}"
        );
        assert!(!err.trim_end().ends_with("not found"), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
    }
    let out = nowhere(&[
        "nvme",
        "connect",
        "--traddr",
        "127.0.0.1",
        "--nvme-nqn",
        NQN,
    ]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(
        err.contains(&format!("nvme gen-hostnqn > {NOWHERE}/etc/nvme/hostnqn"))
            && err.contains("--hostnqn"),
        "{err}"
    );
    assert!(!err.contains("(write one there"), "{err}");
    let fc = fixture("fc");
    let out = lunkit(&[
        "--root",
        fc.to_str().unwrap(),
        "scan",
        "fc",
        "--fc-wwpn",
        WWPN,
        "--lun",
        "1",
    ]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(
        err.contains(&format!("no FC remote port {WWPN} is on this node; check")),
        "{err}"
    );
    let out = nowhere(&["nvme", "rescan", "--nvme-nqn", NQN]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains(&format!("--nvme-nqn {NQN}")), "{err}");
    let _ = std::fs::remove_dir_all(&root);
}

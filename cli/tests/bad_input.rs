//! Bad input through the `lunkit` binary (issue 7, path safety): malformed or out-of-range
//! addresses, names that could climb out of sysfs, and nonsense options are usage errors
//! (exit 2) before any file is read, never a panic; a `--root` tree with links out of it is
//! listed without what lies outside.
#![allow(clippy::disallowed_methods)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

const USAGE: i32 = 2;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(name)
}

fn lunkit(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lunkit"))
        .args(args)
        .output()
        .unwrap()
}

/// Runs `lunkit --root ROOT ARGS…` and checks it is refused as a usage error without a panic.
fn assert_usage_error(root: &Path, args: &[&str]) {
    let mut all = vec!["--root", root.to_str().unwrap()];
    all.extend_from_slice(args);
    let out = lunkit(&all);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(USAGE), "{args:?}: {err}");
    assert!(!err.contains("panicked"), "{args:?}: {err}");
    assert!(out.stdout.is_empty(), "{args:?} printed a result");
}

/// A root that does not exist: a usage error there was found before anything was read.
fn nowhere() -> PathBuf {
    PathBuf::from("/nonexistent/lunkit-bad-input")
}

#[test]
fn malformed_and_out_of_range_addresses_are_usage_errors() {
    for root in [fixture("fc"), nowhere()] {
        for hctl in [
            "1:2:3",
            "1:2:3:4:5",
            "4294967296:0:0:0",
            "0:4294967296:0:0",
            "0:0:0:18446744073709551616",
            " 5:0:0:0",
            "5:0:0:0 ",
            "5:0:0:0/../1",
            "5:0:0:../1",
            "+5:0:0:0",
            "0x5:0:0:0",
            "",
        ] {
            assert_usage_error(&root, &["scan", "hctl", hctl]);
        }
        // A negative part cannot even be mistaken for an option after `--`.
        assert_usage_error(&root, &["scan", "hctl", "--", "-1:0:0:0"]);
        for lun in ["-1", "18446744073709551616", "1/../2", "0x1"] {
            assert_usage_error(
                &root,
                &[
                    "scan",
                    "iscsi",
                    "--target",
                    "iqn.2003-01.org.example:x",
                    "--lun",
                    lun,
                ],
            );
        }
    }
}

#[test]
fn names_that_could_leave_sysfs_are_usage_errors() {
    let long_iqn = format!("iqn.2003-01.org.example:{}", "x".repeat(200));
    for root in [fixture("iscsi-multipath"), nowhere()] {
        for target in [
            "iqn.2003-01.org.example/../x",
            "../../etc",
            "iqn.2003-01.org.example: x",
            "",
            long_iqn.as_str(),
        ] {
            assert_usage_error(&root, &["scan", "iscsi", "--target", target, "--lun", "0"]);
        }
        for wwpn in [
            "../../etc",
            "50:01:43:80:02:a3:c4:d6/..",
            "0x5001438002a3c4d6ff",
        ] {
            assert_usage_error(&root, &["scan", "fc", "--wwpn", wwpn, "--lun", "0"]);
            assert_usage_error(
                &root,
                &[
                    "scan",
                    "fc",
                    "--wwpn",
                    "0x5001438002a3c4d6",
                    "--initiator",
                    wwpn,
                    "--lun",
                    "0",
                ],
            );
            // A bad port anywhere in a list spoils the whole list, before anything is done.
            let list = format!("0x5001438002a3c4d6,{wwpn}");
            assert_usage_error(&root, &["scan", "fc", "--wwpn", &list, "--lun", "0"]);
            for cmd in ["attach", "detach"] {
                assert_usage_error(&root, &[cmd, "--fc-wwpn", &list, "--lun", "0"]);
            }
        }
        for wwid in ["../../etc/passwd", "naa.6001405/abc", "naa.xyz"] {
            assert_usage_error(&root, &["scan", "hctl", "6:0:0:0", "--expect-wwid", wwid]);
        }
    }
}

#[test]
fn nonsense_timeouts_are_usage_errors() {
    for timeout in ["-1", "nan", "inf", "1e300", "abc"] {
        assert_usage_error(
            &fixture("fc"),
            &["scan", "hctl", "5:0:0:0", "--timeout", timeout],
        );
        assert_usage_error(
            &nowhere(),
            &["multipath", "remove", "mpatha", "--timeout", timeout],
        );
    }
}

#[test]
fn timeouts_beyond_a_day_are_usage_errors_not_panics() {
    // 1e19 s fits a Duration but not an Instant: `Instant + Duration` used to panic on it.
    for timeout in ["1e19", "86400.5", "1e10"] {
        let root = fixture("iscsi-multipath");
        assert_usage_error(&root, &["detach", "9:0:0:3", "--timeout", timeout]);
        assert_usage_error(
            &root,
            &[
                "detach",
                "--wwid",
                "naa.60014055e7a100000000000000000000",
                "--timeout",
                timeout,
            ],
        );
        assert_usage_error(&root, &["delete", "9:0:0:3", "--timeout", timeout]);
        assert_usage_error(&root, &["flush", "sdzz", "--timeout", timeout]);
        assert_usage_error(&root, &["scan", "hctl", "5:0:0:0", "--timeout", timeout]);
    }
    // A day is the limit, and allowed.
    let out = lunkit(&[
        "--root",
        fixture("iscsi-multipath").to_str().unwrap(),
        "detach",
        "9:0:0:3",
        "--no-lock-file",
        "--timeout",
        "86400",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn list_of_a_tree_with_links_out_of_it_shows_only_the_tree() {
    // A scratch copy of the FC fixture, with class entries that lead outside it.
    let base = std::env::temp_dir().join(format!("lunkit-cli-badinput-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).unwrap();
    let root = base.join("root");
    let outside = base.join("outside");
    let st = Command::new("cp")
        .arg("-a")
        .arg(fixture("fc"))
        .arg(&root)
        .status()
        .unwrap();
    assert!(st.success());
    std::fs::create_dir_all(&outside).unwrap();
    for (name, value) in [
        ("dev", "3917:39170"),
        ("size", "8"),
        ("proc_name", "ESCAPED"),
        ("state", "ESCAPED"),
        ("port_name", "0x0bad0bad0bad0bad"),
        ("port_state", "Online"),
    ] {
        std::fs::write(outside.join(name), format!("{value}\n")).unwrap();
    }
    let link = |dir: &str, name: &str, to: &Path| {
        std::os::unix::fs::symlink(to, root.join(dir).join(name)).unwrap();
    };
    link("sys/block", "sdz", &outside);
    link("sys/class/scsi_host", "host42", &outside);
    link("sys/class/fc_host", "host42", &outside);
    link(
        "sys/class/scsi_host",
        "host43",
        Path::new("../../../../outside"),
    );

    let out = lunkit(&["--root", root.to_str().unwrap(), "list", "--json"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let _ = std::fs::remove_dir_all(&base);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !text.contains("ESCAPED") && !text.contains("3917"),
        "{text}"
    );
    let doc: Value = serde_json::from_str(&text).unwrap();
    let hosts: Vec<u64> = doc["scsi_hosts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["host"].as_u64().unwrap())
        .collect();
    assert_eq!(hosts, [5, 6, 7]);
    assert_eq!(doc["fc_hosts"].as_array().unwrap().len(), 3);
    let blocks: Vec<&str> = doc["block_devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["name"].as_str().unwrap())
        .collect();
    assert_eq!(blocks, ["dm-0", "dm-1", "sdc", "sdd"]);
}

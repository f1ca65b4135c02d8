//! The plugin binary's command line: `--topology` is checked at startup (a bad key or value,
//! a key given twice, differing prefixes: clap's usage error, exit code 2, nothing served),
//! and a good one reaches NodeGetInfo; `--kubelet-dir` must be an absolute path.

// The test starts the plugin binary; the plugin itself runs programs only through exec.rs.
#![allow(clippy::disallowed_methods)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lunkit_csi::Client;
use lunkit_csi::proto::*;

fn plugin(dir: &std::path::Path, topology: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_lunkit-csi"));
    c.args([
        "--endpoint",
        &format!("unix://{}", dir.join("csi.sock").display()),
    ])
    .args(["--nodeid", "node-a"])
    .arg("--state-dir")
    .arg(dir.join("state"))
    .stdin(Stdio::null());
    for t in topology {
        c.args(["--topology", t]);
    }
    c
}

#[test]
fn a_bad_topology_is_refused_at_startup_with_exit_code_2() {
    let cases: &[(&[&str], &str)] = &[
        (&["bad key=Z1"], "\"bad key\""),
        (&["zone"], "is not KEY=VALUE"),
        (&["Example.com/zone=Z1"], "the prefix \"Example.com\""),
        (&["zone=-Z1"], "topology value \"-Z1\""),
        (&["zone=Z1", "Zone=Z2"], "given twice"),
        (&["a.io/zone=Z1", "rack=R1"], "same prefix"),
    ];
    for (args, says) in cases {
        let dir = tempfile::tempdir().unwrap();
        let out = plugin(dir.path(), args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(
            err.contains("--topology") || err.contains("topology"),
            "{err}"
        );
        assert!(
            !dir.path().join("csi.sock").exists() && !dir.path().join("state").exists(),
            "{args:?}: the plugin started"
        );
    }
}

#[test]
fn the_topology_given_is_what_node_get_info_reports() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = plugin(
        dir.path(),
        &[
            "topology.kubernetes.io/zone=eu-1a",
            "topology.kubernetes.io/region=eu-1",
        ],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    let limit = Instant::now() + Duration::from_secs(30);
    let info = loop {
        let answer = Client::connect(&dir.path().join("csi.sock"))
            .ok()
            .and_then(|mut c| c.node_get_info(NodeGetInfoRequest {}).ok());
        if let Some(info) = answer {
            break info;
        }
        assert!(Instant::now() < limit, "the plugin did not answer in 30 s");
        std::thread::sleep(Duration::from_millis(20));
    };
    let _ = child.kill();
    let _ = child.wait();
    let segments = info.accessible_topology.expect("a topology").segments;
    assert_eq!(segments.len(), 2, "{segments:?}");
    assert_eq!(segments["topology.kubernetes.io/zone"], "eu-1a");
    assert_eq!(segments["topology.kubernetes.io/region"], "eu-1");
}

/// A `--root` that is not there (or is not a node's root: no `sys/`, `dev/`) is refused at
/// start, naming it, before a socket or a state directory is made: every call would fail
/// `NOT_FOUND` otherwise.
#[test]
fn a_root_that_does_not_exist_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-root");
    let out = plugin(dir.path(), &[])
        .arg("--root")
        .arg(&missing)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("--root") && err.contains("no-such-root"),
        "{err}"
    );
    assert!(
        !dir.path().join("csi.sock").exists() && !dir.path().join("state").exists(),
        "the plugin started: {err}"
    );
}

/// `--kubelet-dir` must be absolute and written plainly: anything else is a usage error
/// naming it, exit code 2, nothing served.
#[test]
fn a_kubelet_dir_that_is_not_absolute_is_a_usage_error() {
    for bad in ["var/lib/kubelet", "/var/lib/../kubelet"] {
        let dir = tempfile::tempdir().unwrap();
        let out = plugin(dir.path(), &[])
            .args(["--kubelet-dir", bad])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad}: {err}");
        assert!(err.contains("--kubelet-dir") && err.contains(bad), "{err}");
        assert!(
            !dir.path().join("csi.sock").exists() && !dir.path().join("state").exists(),
            "{bad}: the plugin started"
        );
    }
}

//! VM tests of `lunkit doctor` (issue 36): what a node accumulates, found in one read, each
//! finding with the in-use check a detach makes, and nothing changed.
//!
//! Run by `cargo xtask test` inside the QEMU guest (ignored on the host).

use lunkit_lab as support;

use std::fs;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::cli::{describe, lunkit};
use support::lab::{IscsiLab, LabConfig};
use support::lio::LioConfig;
use support::nvmet::{PortConfig, Target};
use support::require_vm;

/// `lunkit doctor --json`: its exit code and document.
fn doctor() -> (i32, Value) {
    let out = lunkit(&["doctor", "--json"]);
    let doc: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("doctor's JSON: {e}; {}", describe(&out)));
    eprintln!("doctor: {doc:#}\n{}", String::from_utf8_lossy(&out.stderr));
    (out.status.code().unwrap_or(-1), doc)
}

/// The findings of `kind`, as (objects, in_use, users).
fn findings(doc: &Value, kind: &str) -> Vec<(Vec<String>, Option<bool>, Option<String>)> {
    doc["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["kind"] == kind)
        .map(|f| {
            let objects = f["objects"]
                .as_array()
                .unwrap()
                .iter()
                .map(|o| o.as_str().unwrap().to_owned())
                .collect();
            (
                objects,
                f["in_use"].as_bool(),
                f["users"].as_str().map(str::to_owned),
            )
        })
        .collect()
}

/// Sets a disk's SCSI state (`state` takes a name followed by a newline, nothing else).
fn set_state(disk: &str, state: &str) {
    fs::write(
        format!("/sys/block/{disk}/device/state"),
        format!("{state}\n"),
    )
    .unwrap_or_else(|e| panic!("{disk} {state}: {e}"));
}

/// Two sessions with one LUN each path: both idle; a session whose disk this test holds
/// open is not; a disk set offline is found, in use (naming this process) or not.
#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn idle_sessions_and_offline_disks_are_found_with_who_uses_them() {
    require_vm();
    let (code, doc) = doctor();
    assert_eq!((code, doc["findings"].as_array().unwrap().len()), (0, 0));

    let lab = IscsiLab::build(LabConfig {
        target: LioConfig {
            luns: 1,
            ..LioConfig::default()
        },
        scan: vec![0],
        multipath: None,
    })
    .expect("build the iSCSI lab");
    let disk_of = |host: u32| {
        let hctl = format!("{host}:0:0:0");
        fs::read_dir(format!("/sys/class/scsi_device/{hctl}/device/block"))
            .unwrap()
            .flatten()
            .next()
            .unwrap()
            .file_name()
            .to_string_lossy()
            .into_owned()
    };
    // udev's rules run `multipath -u` on each new disk, which holds it open for a moment:
    // a user while it lasts. Let them finish.
    support::udev::settle(Duration::from_secs(60)).unwrap();
    let (a, b) = (lab.sessions[0].clone(), lab.sessions[1].clone());
    let (disk_a, disk_b) = (disk_of(a.host), disk_of(b.host));
    let session =
        |s: &support::iscsi::Session, d: &str| vec![format!("session{}", s.sid), d.to_owned()];

    let (code, doc) = doctor();
    assert_eq!(code, 1);
    let mut idle = findings(&doc, "idle-session");
    idle.sort();
    let mut want = vec![
        (session(&a, &disk_a), Some(false), None),
        (session(&b, &disk_b), Some(false), None),
    ];
    want.sort();
    assert_eq!(idle, want);

    // This process holds disk A: its session is in use, so not idle.
    let held = fs::File::open(format!("/dev/{disk_a}")).unwrap();
    let (_, doc) = doctor();
    assert_eq!(
        findings(&doc, "idle-session"),
        [(session(&b, &disk_b), Some(false), None)]
    );

    // Both disks offline: found; A in use by this process, B not; exit 4.
    set_state(&disk_a, "offline");
    set_state(&disk_b, "offline");
    let (code, doc) = doctor();
    let down = findings(&doc, "scsi-device-down");
    assert_eq!(down.len(), 2, "{doc}");
    let a_down = down.iter().find(|d| d.0.contains(&disk_a)).unwrap();
    assert_eq!(a_down.1, Some(true));
    let users = a_down.2.as_deref().unwrap_or("");
    assert!(users.contains(&std::process::id().to_string()), "{users}");
    let b_down = down.iter().find(|d| d.0.contains(&disk_b)).unwrap();
    assert_eq!((b_down.1, b_down.2.as_deref()), (Some(false), None));
    assert_eq!(code, 4);
    assert_eq!(doc["in_use"], 1);

    // Doctor changed nothing: the disks are still there, still offline.
    for d in [&disk_a, &disk_b] {
        let state = fs::read_to_string(format!("/sys/block/{d}/device/state")).unwrap();
        assert_eq!(state.trim(), "offline");
    }
    drop(held);
    set_state(&disk_a, "running");
    set_state(&disk_b, "running");
    lab.teardown().unwrap();
    let (code, _) = doctor();
    assert_eq!(code, 0);
}

/// An NVMe/TCP controller whose port went away reconnects: found, with its subsystem.
#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn a_reconnecting_nvme_controller_is_found() {
    require_vm();
    let mut t = Target::builder()
        .nqn("nqn.2014-08.org.lunkit:doctor")
        .namespace(16 << 20)
        .port(PortConfig::new(61, "127.0.0.1", "4420"))
        .build()
        .expect("nvmet target");
    let root = lunkit::Root::default();
    let opts = lunkit::nvme::ConnectOptions::new(
        "127.0.0.1".parse().unwrap(),
        4420,
        t.nqn().parse().unwrap(),
    );
    let c = lunkit::nvme::connect(&root, &opts).expect("connect");
    let (code, _) = doctor();
    assert_eq!(code, 0);

    t.remove_port(61).unwrap();
    let state = || {
        fs::read_to_string(format!("/sys/class/nvme/{}/state", c.controller))
            .unwrap_or_default()
            .trim()
            .to_owned()
    };
    // The host notices the lost link on its own (keep-alive, I/O errors); bounded wait.
    let deadline = Instant::now() + Duration::from_secs(60);
    while state() == "live" && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_ne!(state(), "live");
    let (code, doc) = doctor();
    let down = findings(&doc, "nvme-controller-down");
    assert_eq!(down.len(), 1, "{doc}");
    assert_eq!(down[0].0, std::slice::from_ref(&c.controller));
    assert!(code == 1 || code == 4, "{code}");
    fs::write(
        format!("/sys/class/nvme/{}/delete_controller", c.controller),
        "1",
    )
    .unwrap();
    t.teardown().unwrap();
}

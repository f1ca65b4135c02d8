//! VM tests of `lunkit doctor` (issue 36): what a node accumulates, found in one read, each
//! finding with the in-use check a detach makes, and nothing changed; with `--fix`, what is
//! not in use cleaned up, what is left named, and a second `--fix` changing nothing.
//!
//! Run by `cargo xtask test` inside the QEMU guest (ignored on the host).

use lunkit_lab as support;

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use lunkit::dm::{self, Control, DevId};
use serde_json::Value;
use support::cli::{describe, lunkit};
use support::lab::{IscsiLab, LabConfig};
use support::lio::LioConfig;
use support::multipath;
use support::nvmet::{PortConfig, Target};
use support::require_vm;
use support::scsi_debug::ScsiDebug;

/// `lunkit doctor --json`: its exit code and document.
fn doctor() -> (i32, Value) {
    doctor_with(&[])
}

/// `lunkit doctor --json ARGS...`: its exit code and document.
fn doctor_with(args: &[&str]) -> (i32, Value) {
    let mut all = vec!["doctor", "--json"];
    all.extend_from_slice(args);
    let out = lunkit(&all);
    let doc: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("doctor's JSON: {e}; {}", describe(&out)));
    eprintln!("doctor: {doc:#}\n{}", String::from_utf8_lossy(&out.stderr));
    (out.status.code().unwrap_or(-1), doc)
}

/// The findings of `kind` in a `doctor --json` document, each with its objects.
fn of_kind<'a>(doc: &'a Value, kind: &'a str) -> impl Iterator<Item = (Vec<String>, &'a Value)> {
    doc["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(move |f| f["kind"] == kind)
        .map(|f| {
            let objects = f["objects"]
                .as_array()
                .unwrap()
                .iter()
                .map(|o| o.as_str().unwrap().to_owned())
                .collect();
            (objects, f)
        })
}

/// The findings of `kind`, as (objects, in_use, users).
fn findings(doc: &Value, kind: &str) -> Vec<(Vec<String>, Option<bool>, Option<String>)> {
    of_kind(doc, kind)
        .map(|(objects, f)| {
            let users = f["users"].as_str().map(str::to_owned);
            (objects, f["in_use"].as_bool(), users)
        })
        .collect()
}

/// What `--fix` did with the findings of `kind`, as (objects, outcome, detail).
fn fixes(doc: &Value, kind: &str) -> Vec<(Vec<String>, String, String)> {
    of_kind(doc, kind)
        .map(|(objects, f)| {
            let fix = &f["fix"];
            (
                objects,
                fix["outcome"].as_str().unwrap_or("none").to_owned(),
                fix["detail"].as_str().unwrap_or("").to_owned(),
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
/// open is not; a disk set offline is found, in use (naming this process) or not. `--fix`
/// deletes the one not in use and leaves the one held, naming the holder; a second `--fix`
/// changes nothing.
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

    // --fix: B is deleted; A, held by this process, is left, and the holder named.
    let (code, doc) = doctor_with(&["--fix"]);
    assert_eq!(code, 4, "{doc}");
    let down = fixes(&doc, "scsi-device-down");
    let a_fix = down.iter().find(|d| d.0.contains(&disk_a)).unwrap();
    assert_eq!(a_fix.1, "in-use");
    assert!(
        a_fix.2.contains(&std::process::id().to_string()),
        "{a_fix:?}"
    );
    let b_fix = down.iter().find(|d| d.0.contains(&disk_b)).unwrap();
    assert_eq!(b_fix.1, "fixed", "{b_fix:?}");
    assert!(!Path::new(&format!("/sys/block/{disk_b}")).exists());
    let state = fs::read_to_string(format!("/sys/block/{disk_a}/device/state")).unwrap();
    assert_eq!(state.trim(), "offline");
    // Idle sessions are an opt-in kind: left.
    for s in fixes(&doc, "idle-session") {
        assert_eq!(s.1, "not-selected", "{s:?}");
    }

    // Again: B is not found any more, A is left as it was.
    let (code, doc) = doctor_with(&["--fix"]);
    assert_eq!(code, 4, "{doc}");
    let down = fixes(&doc, "scsi-device-down");
    assert_eq!(down.len(), 1, "{doc}");
    assert_eq!(
        (down[0].0.contains(&disk_a), down[0].1.as_str()),
        (true, "in-use")
    );
    assert!(Path::new(&format!("/sys/block/{disk_a}")).exists());

    drop(held);
    set_state(&disk_a, "running");
    lab.teardown().unwrap();
    let (code, _) = doctor();
    assert_eq!(code, 0);
}

/// A multipath map that queues, over two scsi_debug paths to one LU, both set offline: a
/// plain `--fix` leaves it (its kind is opt-in: paths down may come back by themselves) and
/// its paths (held by it); `--fix map-paths-down,scsi-device-down` detaches it (queueing
/// off, as nothing has it open; paths deleted; map removed), the paths' own findings gone
/// with it; a second such `--fix` finds nothing and exits 0.
#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn a_map_whose_paths_are_all_down_is_removed_by_fix() {
    require_vm();
    let sd = ScsiDebug::load(
        &[
            ("add_host", "2"),
            ("num_tgts", "1"),
            ("max_luns", "1"),
            ("dev_size_mb", "16"),
            // One device identity on both hosts, as two paths to one LU have.
            ("vpd_use_hostno", "0"),
        ],
        2,
    )
    .expect("load scsi_debug");
    let mut paths = sd.disks();
    paths.sort();
    let map = queueing_map("lunkit-doctor", &paths);
    for p in &paths {
        set_state(p, "offline");
    }

    let (code, doc) = doctor_with(&["--fix"]);
    let left = fixes(&doc, "map-paths-down");
    assert_eq!(left.len(), 1, "{doc}");
    assert_eq!(left[0].1, "not-selected", "{left:?}");
    let held = fixes(&doc, "scsi-device-down");
    assert!(
        held.len() == 2 && held.iter().all(|d| d.1 == "in-use"),
        "{doc}"
    );
    assert!(Path::new(&format!("/sys/block/{map}")).exists());
    assert_eq!(code, 4, "{doc}");

    let kinds = ["--fix", "map-paths-down,scsi-device-down"];
    let (code, doc) = doctor_with(&kinds);
    let fixed = fixes(&doc, "map-paths-down");
    assert_eq!(fixed.len(), 1, "{doc}");
    assert_eq!(fixed[0].0, ["lunkit-doctor".to_owned(), map.clone()]);
    assert_eq!(fixed[0].1, "fixed", "{fixed:?}");
    assert!(fixed[0].2.contains("disable-queueing"), "{fixed:?}");
    assert!(!Path::new(&format!("/sys/block/{map}")).exists());
    for p in &paths {
        assert!(!Path::new(&format!("/sys/block/{p}")).exists(), "{p}");
    }
    // The paths' own findings (held by the map when examined) went with it.
    let down = fixes(&doc, "scsi-device-down");
    assert_eq!(down.len(), 2, "{doc}");
    assert!(down.iter().all(|d| d.1 == "gone"), "{down:?}");
    assert_eq!(code, 0, "{doc}");

    // Again: nothing found, nothing changed.
    let (code, doc) = doctor_with(&kinds);
    assert_eq!((code, doc["findings"].as_array().unwrap().len()), (0, 0));
    drop(sd);
}

/// Creates multipath map `name` over `paths` (kernel names) with `queue_if_no_path`, as
/// multipathd would: its uuid carries the paths' WWID.
fn queueing_map(name: &str, paths: &[String]) -> String {
    support::udev::settle(Duration::from_secs(30)).expect("udev settle");
    support::cmd::run("modprobe", &["dm_multipath"]).expect("modprobe dm_multipath");
    let dev = |d: &String| fs::read_to_string(format!("/sys/block/{d}/dev")).unwrap();
    let devs: Vec<String> = paths.iter().map(|d| dev(d).trim().to_owned()).collect();
    // The kernel's WWID (VPD page 0x83's best designator), which lunkit compares a map's
    // with; scsi_debug offers a T10 one too, udev's ID_SERIAL.
    let wwid: lunkit::Wwid = fs::read_to_string(format!("/sys/block/{}/device/wwid", paths[0]))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let wwid = wwid.to_multipath();
    let sectors: u64 = fs::read_to_string(format!("/sys/block/{}/size", paths[0]))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let params = format!(
        "1 queue_if_no_path 0 1 1 round-robin 0 2 1 {} 1 {} 1",
        devs[0], devs[1]
    );
    let uuid = format!("mpath-{wwid}");
    let ctl = Control::open(&lunkit::Root::default()).expect("open /dev/mapper/control");
    let info = ctl.create(name, Some(&uuid)).expect("create map");
    let table = dm::Target {
        start: 0,
        length: sectors,
        target_type: "multipath".into(),
        params,
    };
    ctl.load(&DevId::Name(name), &[table]).expect("load table");
    ctl.resume(&DevId::Name(name)).expect("resume map");
    support::udev::settle(Duration::from_secs(30)).expect("udev settle");
    format!("dm-{}", info.dev.minor)
}

/// An NVMe/TCP controller whose port went away reconnects: found, with its subsystem. A
/// plain `--fix` leaves it (an opt-in kind); `--fix nvme-controller-down` deletes it, and
/// run again finds nothing.
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

    let (code, doc) = doctor_with(&["--fix"]);
    let left = fixes(&doc, "nvme-controller-down");
    assert_eq!((code, left[0].1.as_str()), (1, "not-selected"), "{doc}");
    assert!(Path::new(&format!("/sys/class/nvme/{}", c.controller)).exists());

    let (code, doc) = doctor_with(&["--fix", "nvme-controller-down"]);
    let fixed = fixes(&doc, "nvme-controller-down");
    assert_eq!((code, fixed[0].1.as_str()), (0, "fixed"), "{doc}");
    assert!(!Path::new(&format!("/sys/class/nvme/{}", c.controller)).exists());
    let (code, doc) = doctor_with(&["--fix", "nvme-controller-down"]);
    assert_eq!((code, doc["findings"].as_array().unwrap().len()), (0, 0));
    t.teardown().unwrap();
}

/// The disk `sd` made of the SCSI device at `hctl`.
fn disk_at(hctl: &str) -> String {
    fs::read_dir(format!("/sys/class/scsi_device/{hctl}/device/block"))
        .unwrap_or_else(|e| panic!("{hctl}'s disk: {e}"))
        .flatten()
        .next()
        .unwrap_or_else(|| panic!("{hctl} has no disk"))
        .file_name()
        .to_string_lossy()
        .into_owned()
}

/// The array deletes a LUN under an attached volume: LIO takes LUN 1 out of its TPG, and
/// both paths' disks stay `running`, answering LOGICAL UNIT NOT SUPPORTED. `doctor` finds
/// `lun-gone` for each path, the one this test holds open in use by this process; `--fix`
/// leaves that one (`in-use`) and deletes the other; released, the next `--fix` deletes it
/// too, and a third changes nothing.
#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn a_lun_the_array_deleted_is_found_and_its_disks_deleted() {
    require_vm();
    // LUN 1, not 0: without a mapped LUN 0, LIO answers for a virtual one.
    let lab = IscsiLab::build(LabConfig {
        target: LioConfig {
            luns: 2,
            ..LioConfig::default()
        },
        scan: vec![1],
        multipath: None,
    })
    .expect("build the iSCSI lab");
    support::udev::settle(Duration::from_secs(60)).unwrap();
    let paths: Vec<(String, String)> = lab
        .sessions
        .iter()
        .map(|s| {
            let hctl = format!("{}:0:0:1", s.host);
            let disk = disk_at(&hctl);
            (hctl, disk)
        })
        .collect();
    let ((hctl_a, disk_a), (hctl_b, disk_b)) = (paths[0].clone(), paths[1].clone());

    // Served: asked, and not a finding.
    let (_, doc) = doctor();
    assert_eq!(findings(&doc, "lun-gone"), [], "{doc}");

    let held = fs::File::open(format!("/dev/{disk_a}")).unwrap();
    lab.target().unmap(1).expect("unmap LUN 1");

    let (code, doc) = doctor();
    let mut gone = findings(&doc, "lun-gone");
    gone.sort();
    assert_eq!(gone.len(), 2, "{doc}");
    let a = gone
        .iter()
        .find(|f| f.0[1] == disk_a)
        .expect("path A found");
    assert_eq!(a.0, [hctl_a.clone(), disk_a.clone()]);
    assert_eq!(a.1, Some(true));
    let users = a.2.as_deref().unwrap_or("");
    assert!(users.contains(&std::process::id().to_string()), "{users}");
    let b = gone
        .iter()
        .find(|f| f.0[1] == disk_b)
        .expect("path B found");
    assert_eq!(
        (&b.0, b.1, b.2.as_deref()),
        (&vec![hctl_b, disk_b.clone()], Some(false), None)
    );
    let (_, f) = of_kind(&doc, "lun-gone").next().unwrap();
    assert!(
        f["why"]
            .as_str()
            .unwrap()
            .contains("LOGICAL UNIT NOT SUPPORTED (ILLEGAL REQUEST 25/00)"),
        "{f}"
    );
    let wwid = fs::read_to_string(format!("/sys/block/{disk_a}/device/wwid")).unwrap();
    assert_eq!(f["identity"].as_str(), Some(wwid.trim()));
    assert_eq!(code, 4, "{doc}");
    // The doctor changed nothing.
    for d in [&disk_a, &disk_b] {
        let state = fs::read_to_string(format!("/sys/block/{d}/device/state")).unwrap();
        assert_eq!(state.trim(), "running");
    }

    // --fix: B is deleted; A, held by this process, is left, and the holder named.
    let (code, doc) = doctor_with(&["--fix"]);
    let done = fixes(&doc, "lun-gone");
    let a_fix = done.iter().find(|f| f.0[1] == disk_a).unwrap();
    assert_eq!(a_fix.1, "in-use", "{a_fix:?}");
    assert!(
        a_fix.2.contains(&std::process::id().to_string()),
        "{a_fix:?}"
    );
    let b_fix = done.iter().find(|f| f.0[1] == disk_b).unwrap();
    assert_eq!(b_fix.1, "fixed", "{b_fix:?}");
    assert!(!Path::new(&format!("/sys/block/{disk_b}")).exists());
    assert!(Path::new(&format!("/sys/block/{disk_a}")).exists());
    assert_eq!(code, 4, "{doc}");

    // Released: the next --fix deletes A.
    drop(held);
    let (_, doc) = doctor_with(&["--fix"]);
    let done = fixes(&doc, "lun-gone");
    assert_eq!(done.len(), 1, "{doc}");
    assert_eq!(
        (done[0].0[1].as_str(), done[0].1.as_str()),
        (disk_a.as_str(), "fixed")
    );
    assert!(!Path::new(&format!("/sys/block/{disk_a}")).exists());
    assert!(!Path::new(&format!("/sys/class/scsi_device/{hctl_a}")).exists());

    // Again: nothing of the LUN is found, nothing changes. The sessions, carrying no LUN
    // now, are idle (an opt-in kind: left).
    let (code, doc) = doctor_with(&["--fix"]);
    assert_eq!(fixes(&doc, "lun-gone"), [], "{doc}");
    for s in fixes(&doc, "idle-session") {
        assert_eq!(s.1, "not-selected", "{s:?}");
    }
    assert_eq!(code, 1, "{doc}");

    lab.teardown().unwrap();
    let (code, _) = doctor();
    assert_eq!(code, 0);
}

/// The array deletes a LUN under a multipath map: each path is found `lun-gone` with the map
/// named, and judged with the map's users. While this test holds the map open both are in
/// use by this process and `--fix` leaves them; released, `--fix` deletes both paths and
/// never the map itself (multipathd may flush it once its last path is gone).
#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn a_lun_deleted_under_a_map_is_judged_with_the_map() {
    require_vm();
    let lab = IscsiLab::build(LabConfig {
        target: LioConfig {
            luns: 2,
            ..LioConfig::default()
        },
        scan: vec![1],
        multipath: Some(multipath::DEFAULT_CONF),
    })
    .expect("build the iSCSI lab with multipathd");
    support::udev::settle(Duration::from_secs(60)).unwrap();
    let map = lab.maps[0].clone();
    assert_eq!(map.paths.len(), 2, "{map:?}");

    let held = fs::File::open(format!("/dev/{}", map.dm)).unwrap();
    lab.target().unmap(1).expect("unmap LUN 1");

    let (code, doc) = doctor();
    let mut gone: Vec<_> = of_kind(&doc, "lun-gone").collect();
    gone.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(gone.len(), 2, "{doc}");
    for (objects, f) in &gone {
        assert_eq!(objects.len(), 3, "{f}");
        assert!(map.paths.contains(&objects[1]), "{f}");
        assert_eq!(objects[2], map.name, "{f}");
        assert_eq!(f["devices"], serde_json::json!([objects[1], map.dm]), "{f}");
        assert_eq!(f["in_use"], true, "{f}");
        let users = f["users"].as_str().unwrap_or("");
        assert!(users.contains(&std::process::id().to_string()), "{users}");
    }
    assert_eq!(code, 4, "{doc}");

    let (code, doc) = doctor_with(&["--fix"]);
    let left = fixes(&doc, "lun-gone");
    assert_eq!(left.len(), 2, "{doc}");
    assert!(left.iter().all(|f| f.1 == "in-use"), "{left:?}");
    for p in &map.paths {
        assert!(Path::new(&format!("/sys/block/{p}")).exists(), "{p}");
    }
    assert_eq!(code, 4, "{doc}");

    drop(held);
    let (_, doc) = doctor_with(&["--fix"]);
    let done = fixes(&doc, "lun-gone");
    assert_eq!(done.len(), 2, "{doc}");
    for (objects, outcome, detail) in &done {
        assert_eq!(outcome, "fixed", "{objects:?}: {detail}");
        assert!(
            detail.ends_with(&format!("map {} is left", map.name)),
            "{detail}"
        );
        assert!(!Path::new(&format!("/sys/block/{}", objects[1])).exists());
    }

    let (_, doc) = doctor_with(&["--fix"]);
    assert_eq!(fixes(&doc, "lun-gone"), [], "{doc}");
    lab.teardown().unwrap();
}

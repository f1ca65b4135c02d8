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
    forget_records();
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
    forget_records();
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
    forget_records();
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

/// lunkit's lock directory, whose `names/` and `attached/` the doctor checks.
const LOCKS: &str = "/run/lunkit/locks";

/// Removes the name records and attach marks earlier tests of this guest left: a detach
/// keeps a record of what an address named, and with nothing of it left on the node the
/// doctor reports it (`stale-name-record`). Each test builds its own lab, so none needs them.
fn forget_records() {
    for sub in ["names", "attached"] {
        match fs::remove_dir_all(Path::new(LOCKS).join(sub)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => panic!("remove {LOCKS}/{sub}: {e}"),
        }
    }
}

/// `lunkit attach ARGS...`, which must succeed.
fn attach_ok(args: &[&str]) {
    let mut all = vec!["attach"];
    all.extend_from_slice(args);
    let out = lunkit(&all);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
}

/// The disks (`sdX`) at LUN `lun` of the lab's sessions.
fn disks_at(lab: &IscsiLab, lun: u32) -> Vec<String> {
    let mut disks: Vec<String> = lab
        .sessions
        .iter()
        .filter_map(|s| {
            fs::read_dir(format!(
                "/sys/class/scsi_device/{}:0:0:{lun}/device/block",
                s.host
            ))
            .ok()?
            .flatten()
            .next()
            .map(|e| e.file_name().to_string_lossy().into_owned())
        })
        .collect();
    disks.sort();
    disks
}

fn wwid_of(disk: &str) -> lunkit::Wwid {
    fs::read_to_string(format!("/sys/block/{disk}/device/wwid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// The iSCSI lab with `luns` LUNs, none scanned and no multipathd; the records earlier
/// tests left forgotten, and a doctor that finds nothing.
fn records_lab(luns: u32) -> (IscsiLab, String) {
    forget_records();
    let lab = IscsiLab::build(LabConfig {
        target: LioConfig {
            luns,
            ..LioConfig::default()
        },
        scan: vec![],
        multipath: None,
    })
    .expect("build the iSCSI lab");
    let iqn = lab.config.target.iqn.clone();
    // Spelt in a record name as it is: letters, digits, `.`, `:` and `-` only.
    assert!(
        iqn.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".:-".contains(&b)),
        "{iqn}"
    );
    (lab, iqn)
}

/// A LUN attached by its address (the record of its WWID written), then its paths deleted
/// behind lunkit's back: the record names nothing on the node any more. Found as
/// `stale-name-record` with the record's file and WWID; a plain `--fix` removes the file,
/// and a second one finds nothing of it.
#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn a_name_record_of_a_volume_gone_behind_lunkits_back_is_removed_by_fix() {
    require_vm();
    let (lab, iqn) = records_lab(2);
    attach_ok(&["--iscsi-target", &iqn, "--lun", "1"]);
    support::udev::settle(Duration::from_secs(60)).unwrap();
    let disks = disks_at(&lab, 1);
    assert_eq!(disks.len(), lab.sessions.len(), "{disks:?}");
    let wwid = wwid_of(&disks[0]);
    let file = format!("iscsi-{iqn}-lun-1");
    let record = Path::new(LOCKS).join("names").join(&file);
    let recorded: lunkit::Wwid = fs::read_to_string(&record).unwrap().trim().parse().unwrap();
    assert_eq!(recorded, wwid);
    // The volume is on the node: nothing to say of its record.
    let (_, doc) = doctor();
    assert_eq!(findings(&doc, "stale-name-record"), []);
    assert_eq!(findings(&doc, "remapped-address"), []);

    for d in &disks {
        fs::write(format!("/sys/block/{d}/device/delete"), "1").unwrap();
    }
    support::udev::settle(Duration::from_secs(60)).unwrap();
    assert_eq!(disks_at(&lab, 1), Vec::<String>::new());

    let (code, doc) = doctor();
    let stale: Vec<_> = of_kind(&doc, "stale-name-record").collect();
    assert_eq!(stale.len(), 1, "{doc}");
    assert_eq!(stale[0].0[0], file);
    assert_eq!(
        stale[0].1["identity"]
            .as_str()
            .map(|w| w.parse::<lunkit::Wwid>().unwrap()),
        Some(wwid.clone())
    );
    assert_eq!(code, 1, "{doc}");
    // Examined only: the record is still there.
    assert!(record.exists());

    let (_, doc) = doctor_with(&["--fix"]);
    let fixed = fixes(&doc, "stale-name-record");
    assert_eq!(fixed.len(), 1, "{doc}");
    assert_eq!(fixed[0].1, "fixed", "{fixed:?}");
    assert!(fixed[0].2.contains(&file), "{fixed:?}");
    assert!(!record.exists());

    // Again: nothing of it found, nothing changed.
    let (_, doc) = doctor_with(&["--fix"]);
    assert_eq!(findings(&doc, "stale-name-record"), []);
    lab.teardown().unwrap();
    forget_records();
}

/// A LUN attached by its address (its record written), then re-mapped on the target to
/// another backstore and rescanned: the devices at the address report another WWID than the
/// record. Found as `remapped-address` naming both WWIDs and the devices; `--fix`, plain or
/// naming the kind, deletes nothing and leaves the record.
#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn an_address_the_array_remapped_is_reported_and_nothing_deleted() {
    require_vm();
    let (lab, iqn) = records_lab(3);
    attach_ok(&["--iscsi-target", &iqn, "--lun", "1"]);
    support::udev::settle(Duration::from_secs(60)).unwrap();
    let disks = disks_at(&lab, 1);
    assert_eq!(disks.len(), lab.sessions.len(), "{disks:?}");
    let old = wwid_of(&disks[0]);
    let record = Path::new(LOCKS)
        .join("names")
        .join(format!("iscsi-{iqn}-lun-1"));
    let recorded =
        || -> lunkit::Wwid { fs::read_to_string(&record).unwrap().trim().parse().unwrap() };
    assert_eq!(recorded(), old);

    // LUN 1 is LUN 2's backstore from now on; the node rescans LUN 1's devices.
    lab.target().remap(1, 2).unwrap();
    for d in &disks {
        fs::write(format!("/sys/block/{d}/device/rescan"), "1").unwrap();
    }
    support::udev::settle(Duration::from_secs(60)).unwrap();
    let new = wwid_of(&disks[0]);
    assert_ne!(new, old);
    assert_eq!(disks_at(&lab, 1), disks);

    let (code, doc) = doctor();
    let remapped: Vec<_> = of_kind(&doc, "remapped-address").collect();
    assert_eq!(remapped.len(), 1, "{doc}");
    let (objects, f) = &remapped[0];
    assert_eq!(&objects[2..], &disks[..], "{doc}");
    let why = f["why"].as_str().unwrap();
    assert!(
        why.contains(&old.to_string()) && why.contains(&new.to_string()),
        "{why}"
    );
    let devices: Vec<&str> = f["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_str().unwrap())
        .collect();
    assert_eq!(devices, disks);
    assert_eq!(f["in_use"], false, "{doc}");
    assert_eq!(findings(&doc, "stale-name-record"), []);
    assert_eq!(code, 1, "{doc}");

    for args in [&["--fix"][..], &["--fix", "remapped-address"]] {
        let (_, doc) = doctor_with(args);
        let left = fixes(&doc, "remapped-address");
        assert_eq!(left.len(), 1, "{doc}");
        let want = if args.len() == 1 {
            "not-selected"
        } else {
            "unsupported"
        };
        assert_eq!(left[0].1, want, "{left:?}");
        if want == "unsupported" {
            assert!(left[0].2.contains("--wwid"), "{left:?}");
        }
        assert_eq!(disks_at(&lab, 1), disks, "nothing deleted");
        assert_eq!(recorded(), old);
    }

    // Back as found: LUN 1 on its own backstore again, its devices taken away.
    lab.target().remap(1, 1).unwrap();
    for d in &disks {
        fs::write(format!("/sys/block/{d}/device/delete"), "1").unwrap();
    }
    lab.teardown().unwrap();
    forget_records();
}

/// An NVMe namespace attached through lunkit (its attach mark and name record written),
/// then its controller deleted behind lunkit's back: no controller of the subsystem serves
/// it, and the mark would keep the subsystem's controllers through every later detach. Found
/// as `stale-attach-mark` (and its record as `stale-name-record`); a plain `--fix` removes
/// both files, and a second one finds nothing.
#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn an_attach_mark_of_a_namespace_no_controller_serves_is_removed_by_fix() {
    require_vm();
    forget_records();
    let nqn = "nqn.2014-08.org.lunkit:doctor-marks";
    let t = Target::builder()
        .nqn(nqn)
        .namespace(16 << 20)
        .port(PortConfig::new(62, "127.0.0.1", "4420"))
        .build()
        .expect("nvmet target");
    attach_ok(&[
        "--nvme-nqn",
        nqn,
        "--nsid",
        "1",
        "--portal",
        "127.0.0.1:4420",
        "--hostnqn",
        "nqn.2014-08.org.nvmexpress:uuid:6c1d8a70-1c9e-4d5e-9a40-3b4c5d6e7f80",
        "--hostid",
        "6c1d8a70-1c9e-4d5e-9a40-3b4c5d6e7f80",
    ]);
    let file = format!("nvme-{nqn}-ns-1");
    let mark = Path::new(LOCKS).join("attached").join(&file);
    let record = Path::new(LOCKS).join("names").join(&file);
    assert!(mark.exists() && record.exists());
    let (_, doc) = doctor();
    assert_eq!(findings(&doc, "stale-attach-mark"), []);
    assert_eq!(findings(&doc, "stale-name-record"), []);

    let controllers: Vec<String> = support::sysfs::names("/sys/class/nvme")
        .into_iter()
        .filter(|c| {
            fs::read_to_string(format!("/sys/class/nvme/{c}/subsysnqn"))
                .is_ok_and(|n| n.trim() == nqn)
        })
        .collect();
    assert_eq!(controllers.len(), 1, "{controllers:?}");
    fs::write(
        format!("/sys/class/nvme/{}/delete_controller", controllers[0]),
        "1",
    )
    .unwrap();
    support::udev::settle(Duration::from_secs(60)).unwrap();

    let (code, doc) = doctor();
    let marks: Vec<_> = of_kind(&doc, "stale-attach-mark").collect();
    assert_eq!(marks.len(), 1, "{doc}");
    assert_eq!(marks[0].0[0], file);
    assert_eq!(marks[0].1["identity"], nqn);
    let records = findings(&doc, "stale-name-record");
    assert_eq!(records.len(), 1, "{doc}");
    assert_eq!(records[0].0[0], file);
    assert_eq!(code, 1, "{doc}");
    assert!(mark.exists() && record.exists());

    let (code, doc) = doctor_with(&["--fix"]);
    for kind in ["stale-attach-mark", "stale-name-record"] {
        let fixed = fixes(&doc, kind);
        assert_eq!(fixed.len(), 1, "{doc}");
        assert_eq!(fixed[0].1, "fixed", "{kind}: {fixed:?}");
    }
    assert!(!mark.exists() && !record.exists());
    assert_eq!(code, 0, "{doc}");

    let (code, doc) = doctor_with(&["--fix"]);
    assert_eq!((code, doc["findings"].as_array().unwrap().len()), (0, 0));
    t.teardown().unwrap();
    forget_records();
}

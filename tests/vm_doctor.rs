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
    // Its table queues: the finding says so, since writes to it hang.
    let (_, found) = of_kind(&doc, "map-paths-down").next().unwrap();
    assert_eq!(found["queues"], true, "{doc}");
    assert!(
        found["why"].as_str().unwrap().contains("queue_if_no_path"),
        "{doc}"
    );
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
    path_map(name, paths, "1 queue_if_no_path")
}

/// Creates multipath map `name` over `paths` (kernel names, one priority group) with
/// `features`, its uuid carrying the first path's WWID.
fn path_map(name: &str, paths: &[String], features: &str) -> String {
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
    let each: Vec<String> = devs.iter().map(|d| format!("{d} 1")).collect();
    let params = format!(
        "{features} 0 1 1 round-robin 0 {} 1 {}",
        devs.len(),
        each.join(" ")
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

/// The namespace device a controller serves: its subsystem's head (`nvme<S>n<N>`, native
/// multipath), else the controller's own (`nvme<C>n<N>`).
fn namespace_of(controller: &str) -> String {
    use lunkit::nvme::sysfs::parse_namespace_name;
    let names = |dir: &Path| -> Vec<String> {
        fs::read_dir(dir)
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    };
    let subsystem = names(Path::new("/sys/class/nvme-subsystem"))
        .into_iter()
        .map(|s| Path::new("/sys/class/nvme-subsystem").join(s))
        .find(|p| p.join(controller).exists())
        .expect("the controller's subsystem");
    names(&subsystem)
        .into_iter()
        .chain(names(&Path::new("/sys/class/nvme").join(controller)))
        .find(|n| matches!(parse_namespace_name(n), Some((_, None, _))))
        .expect("a namespace device")
}

/// An NVMe/TCP controller whose port went away reconnects: pending while it has lasted less
/// than the grace, then found, with its subsystem and for how long it was seen. A plain
/// `--fix` leaves it (an opt-in kind); `--fix nvme-controller-down` deletes it, and run
/// again finds nothing.
#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn a_reconnecting_nvme_controller_is_found_once_past_its_grace() {
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
    // Held open, the subsystem is in use: not idle, and nothing else is wrong.
    let ns = namespace_of(&c.controller);
    let held = fs::File::open(format!("/dev/{ns}")).expect("open the namespace");
    let (code, doc) = doctor();
    assert_eq!(code, 0, "{doc}");
    drop(held);

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
    // The default grace (120 s) has not passed: pending, not a finding.
    let (_, doc) = doctor();
    assert!(findings(&doc, "nvme-controller-down").is_empty(), "{doc}");
    let pending: Vec<&Value> = doc["pending"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["kind"] == "nvme-controller-down")
        .collect();
    assert_eq!(pending.len(), 1, "{doc}");
    assert_eq!(pending[0]["objects"][0], c.controller.as_str());
    assert_eq!(doc["grace_s"], 120);
    // Past a grace of 1 s (the first sighting was kept): a finding, seen for 1 s or more.
    std::thread::sleep(Duration::from_millis(1500));
    let (code, doc) = doctor_with(&["--grace", "1"]);
    let down: Vec<(Vec<String>, &Value)> = of_kind(&doc, "nvme-controller-down").collect();
    assert_eq!(down.len(), 1, "{doc}");
    assert_eq!(down[0].0, std::slice::from_ref(&c.controller));
    assert!(
        down[0].1["since_s"].as_u64().is_some_and(|s| s >= 1),
        "{doc}"
    );
    let why = down[0].1["why"].as_str().unwrap();
    assert!(why.contains("ctrl_loss_tmo"), "{why}");
    assert!(code == 1 || code == 4, "{code}");
    // Its subsystem, whose namespace nothing uses, is idle too.
    assert_eq!(findings(&doc, "idle-subsystem").len(), 1, "{doc}");

    let (code, doc) = doctor_with(&["--grace", "0", "--fix"]);
    let left = fixes(&doc, "nvme-controller-down");
    assert_eq!((code, left[0].1.as_str()), (1, "not-selected"), "{doc}");
    assert!(Path::new(&format!("/sys/class/nvme/{}", c.controller)).exists());

    let (code, doc) = doctor_with(&["--grace", "0", "--fix", "nvme-controller-down"]);
    let fixed = fixes(&doc, "nvme-controller-down");
    assert_eq!(fixed[0].1.as_str(), "fixed", "{doc}");
    // The idle subsystem goes with its only controller; not selected, it was not touched,
    // and counts as left by this run.
    assert_eq!(fixes(&doc, "idle-subsystem")[0].1, "not-selected", "{doc}");
    assert_eq!(code, 1, "{doc}");
    assert!(!Path::new(&format!("/sys/class/nvme/{}", c.controller)).exists());
    let (code, doc) = doctor_with(&["--grace", "0", "--fix", "nvme-controller-down"]);
    assert_eq!((code, doc["findings"].as_array().unwrap().len()), (0, 0));
    t.teardown().unwrap();
}

/// A subsystem connected for nothing (no namespace in use, none attached through lunkit) is
/// idle: held open it is not; attached through lunkit (marked) it is not, even unused; a
/// plain `--fix` leaves it (opt-in); `--fix idle-subsystem` disconnects every controller of
/// it, and a second run finds nothing.
#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn an_idle_nvme_subsystem_is_found_and_disconnected_only_when_named() {
    require_vm();
    forget_records();
    let nqn = "nqn.2014-08.org.lunkit:doctor-idle";
    let t = Target::builder()
        .nqn(nqn)
        .namespace(16 << 20)
        .port(PortConfig::new(63, "127.0.0.1", "4420"))
        .port(PortConfig::new(64, "127.0.0.2", "4420"))
        .build()
        .expect("nvmet target");
    // Attached through lunkit: marked, so not idle though nothing uses it.
    let attach = |verb: &str| {
        let mut args = vec![verb, "--nvme-nqn", nqn, "--nsid", "1"];
        if verb == "attach" {
            args.extend(["--portal", "127.0.0.1:4420", "--portal", "127.0.0.2:4420"]);
        }
        args.extend(["--timeout", "60", "--json"]);
        let out = lunkit(&args);
        assert!(out.status.success(), "{verb}: {}", describe(&out));
    };
    attach("attach");
    let (code, doc) = doctor();
    assert_eq!(code, 0, "{doc}");
    attach("detach");
    // Detached: the mark is gone and the name record retired; nothing to say.
    let (code, doc) = doctor();
    assert_eq!(code, 0, "{doc}");

    // Connected behind lunkit's back, on both ports: idle.
    let root = lunkit::Root::default();
    let mut controllers = Vec::new();
    for addr in ["127.0.0.1", "127.0.0.2"] {
        let opts =
            lunkit::nvme::ConnectOptions::new(addr.parse().unwrap(), 4420, nqn.parse().unwrap());
        controllers.push(
            lunkit::nvme::connect(&root, &opts)
                .expect("connect")
                .controller,
        );
    }
    let (code, doc) = doctor();
    let idle: Vec<(Vec<String>, &Value)> = of_kind(&doc, "idle-subsystem").collect();
    assert_eq!(idle.len(), 1, "{doc}");
    assert_eq!(idle[0].1["identity"], nqn);
    assert_eq!(idle[0].1["in_use"], false);
    for c in &controllers {
        assert!(idle[0].0.contains(c), "{doc}");
    }
    assert_eq!(code, 1);
    // Held open: in use, so not idle.
    let held = fs::File::open(format!("/dev/{}", namespace_of(&controllers[0]))).unwrap();
    let (code, doc) = doctor();
    assert!(findings(&doc, "idle-subsystem").is_empty(), "{doc}");
    assert_eq!(code, 0, "{doc}");
    drop(held);

    let (code, doc) = doctor_with(&["--fix"]);
    assert_eq!(fixes(&doc, "idle-subsystem")[0].1, "not-selected", "{doc}");
    assert_eq!(code, 1);
    let (code, doc) = doctor_with(&["--fix", "idle-subsystem"]);
    let fixed = fixes(&doc, "idle-subsystem");
    assert_eq!(fixed[0].1, "fixed", "{doc}");
    assert_eq!(code, 0, "{doc}");
    for c in &controllers {
        assert!(!Path::new(&format!("/sys/class/nvme/{c}")).exists(), "{c}");
    }
    let (code, doc) = doctor_with(&["--fix", "idle-subsystem"]);
    assert_eq!((code, doc["findings"].as_array().unwrap().len()), (0, 0));
    t.teardown().unwrap();
}

/// The disk at `hctl` (`sdX`).
fn disk_at(hctl: &str) -> String {
    fs::read_dir(format!("/sys/class/scsi_device/{hctl}/device/block"))
        .unwrap()
        .flatten()
        .next()
        .unwrap()
        .file_name()
        .to_string_lossy()
        .into_owned()
}

/// The array re-maps a LUN number under a map to another volume: the path rescanned reports
/// the other WWID and is found as `remapped-path` (the map's WWID and the path's both
/// named); `--fix` deletes that path and leaves the map on its other path; a second `--fix`
/// finds nothing of it.
#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn a_lun_remapped_under_a_map_is_found_and_only_its_path_deleted() {
    require_vm();
    forget_records();
    let lab = IscsiLab::build(LabConfig {
        target: LioConfig {
            luns: 3,
            ..LioConfig::default()
        },
        scan: vec![1],
        multipath: None,
    })
    .expect("build the iSCSI lab");
    let hctls: Vec<String> = lab
        .sessions
        .iter()
        .map(|s| format!("{}:0:0:1", s.host))
        .collect();
    let paths: Vec<String> = hctls.iter().map(|h| disk_at(h)).collect();
    let map = path_map("lunkit-remap", &paths, "0");
    let (code, doc) = doctor_with(&["--no-use-check"]);
    assert_eq!(code, 0, "{doc}");

    // LUN 1 is backstore 2's now; the first path reads its VPD again.
    lab.target().remap(1, 2).unwrap();
    fs::write(
        format!("/sys/class/scsi_device/{}/device/rescan", hctls[0]),
        "1",
    )
    .unwrap();
    support::udev::settle(Duration::from_secs(30)).unwrap();
    let (code, doc) = doctor();
    let found = findings(&doc, "remapped-path");
    assert_eq!(found.len(), 1, "{doc}");
    assert_eq!(found[0].0, ["lunkit-remap".to_owned(), paths[0].clone()]);
    assert_eq!(found[0].1, Some(false), "{doc}");
    let (_, f) = of_kind(&doc, "remapped-path").next().unwrap();
    let why = f["why"].as_str().unwrap();
    assert!(why.contains("re-mapped"), "{why}");
    assert_eq!(code, 1, "{doc}");

    let (_, doc) = doctor_with(&["--fix"]);
    let fixed = fixes(&doc, "remapped-path");
    assert_eq!(fixed[0].1, "fixed", "{doc}");
    assert!(!Path::new(&format!("/sys/block/{}", paths[0])).exists());
    assert!(Path::new(&format!("/sys/block/{map}/slaves/{}", paths[1])).exists());
    let (_, doc) = doctor_with(&["--fix"]);
    assert!(fixes(&doc, "remapped-path").is_empty(), "{doc}");

    let ctl = Control::open(&lunkit::Root::default()).unwrap();
    ctl.remove(&DevId::Name("lunkit-remap"), false).unwrap();
    lab.teardown().unwrap();
}

/// A map with no path at all (multipathd reloads a map without its last path when it does
/// not flush it): found, with whether it queues; held open, in use naming the holder and
/// left by `--fix`; released, detached by a plain `--fix`, and a second finds nothing.
#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn a_map_without_paths_is_found_and_detached_when_nothing_holds_it() {
    require_vm();
    forget_records();
    support::cmd::run("modprobe", &["dm_multipath"]).expect("modprobe dm_multipath");
    let ctl = Control::open(&lunkit::Root::default()).unwrap();
    // Failing its I/O, not queueing it: udev's probe of a new map must not hang.
    let uuid = "mpath-36001405d0c70000000000000000dead";
    let info = ctl.create("lunkit-nopaths", Some(uuid)).unwrap();
    let table = dm::Target {
        start: 0,
        length: 32768,
        target_type: "multipath".into(),
        params: "0 0 0 0".into(),
    };
    ctl.load(&DevId::Name("lunkit-nopaths"), &[table]).unwrap();
    ctl.resume(&DevId::Name("lunkit-nopaths")).unwrap();
    support::udev::settle(Duration::from_secs(30)).unwrap();
    let dm = format!("dm-{}", info.dev.minor);

    let held = fs::File::open(format!("/dev/{dm}")).unwrap();
    let (code, doc) = doctor_with(&["--fix"]);
    let (objects, f) = of_kind(&doc, "map-without-paths").next().expect("found");
    assert_eq!(objects, ["lunkit-nopaths".to_owned(), dm.clone()]);
    assert_eq!(f["queues"], false, "{doc}");
    assert!(f["why"].as_str().unwrap().contains("fails I/O"), "{doc}");
    assert_eq!(f["in_use"], true, "{doc}");
    let users = f["users"].as_str().unwrap();
    assert!(users.contains(&std::process::id().to_string()), "{users}");
    assert_eq!(f["fix"]["outcome"], "in-use", "{doc}");
    assert_eq!(code, 4, "{doc}");
    assert!(Path::new(&format!("/sys/block/{dm}")).exists());
    drop(held);

    let (code, doc) = doctor_with(&["--fix"]);
    let fixed = fixes(&doc, "map-without-paths");
    assert_eq!(fixed[0].1, "fixed", "{doc}");
    assert_eq!(code, 0, "{doc}");
    assert!(!Path::new(&format!("/sys/block/{dm}")).exists());
    let (code, doc) = doctor_with(&["--fix"]);
    assert_eq!((code, doc["findings"].as_array().unwrap().len()), (0, 0));
}

/// An array that went away for longer than the grace: its sessions recover for ever
/// (`recovery_tmo` 600 s), their disks stay blocked. Pending at first, then found with how
/// long they were seen; a plain `--fix` leaves them (opt-in); `--fix scsi-device-blocked`
/// deletes the one nothing holds and leaves the held one naming its holder. Back, the held
/// disk runs again and nothing is found of it.
#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn disks_blocked_past_the_grace_are_found_and_deleted_only_when_named_and_unheld() {
    require_vm();
    forget_records();
    let lab = IscsiLab::build(LabConfig {
        target: LioConfig {
            luns: 1,
            ..LioConfig::default()
        },
        scan: vec![0],
        multipath: None,
    })
    .expect("build the iSCSI lab");
    support::udev::settle(Duration::from_secs(60)).unwrap();
    let hctls: Vec<String> = lab
        .sessions
        .iter()
        .map(|s| format!("{}:0:0:0", s.host))
        .collect();
    let disks: Vec<String> = hctls.iter().map(|h| disk_at(h)).collect();
    for s in &lab.sessions {
        fs::write(
            format!("/sys/class/iscsi_session/session{}/recovery_tmo", s.sid),
            "600",
        )
        .unwrap();
    }
    let state = |d: &str| {
        fs::read_to_string(format!("/sys/block/{d}/device/state"))
            .unwrap_or_default()
            .trim()
            .to_owned()
    };
    lab.target().set_enabled(false).unwrap();
    support::wait::until_true("both disks blocked", Duration::from_secs(60), || {
        disks.iter().all(|d| state(d) == "blocked")
    })
    .expect("the disks blocked");

    let blocked = |doc: &Value, list: &str| -> Vec<(String, u64)> {
        doc[list]
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| f["kind"] == "scsi-device-blocked")
            .map(|f| {
                (
                    f["objects"][1].as_str().unwrap().to_owned(),
                    f["since_s"].as_u64().unwrap(),
                )
            })
            .collect()
    };
    let (_, doc) = doctor_with(&["--grace", "2"]);
    assert!(blocked(&doc, "findings").is_empty(), "{doc}");
    assert_eq!(blocked(&doc, "pending").len(), 2, "{doc}");
    std::thread::sleep(Duration::from_millis(2500));
    let held = fs::File::open(format!("/dev/{}", disks[0])).unwrap();
    let (_, doc) = doctor_with(&["--grace", "2", "--fix"]);
    let found = blocked(&doc, "findings");
    assert_eq!(found.len(), 2, "{doc}");
    assert!(found.iter().all(|(_, since)| *since >= 2), "{doc}");
    for f in fixes(&doc, "scsi-device-blocked") {
        assert_eq!(f.1, "not-selected", "{doc}");
    }

    let (code, doc) = doctor_with(&["--grace", "2", "--fix", "scsi-device-blocked"]);
    let fixed = fixes(&doc, "scsi-device-blocked");
    let of = |d: &str| {
        fixed
            .iter()
            .find(|f| f.0.contains(&d.to_owned()))
            .unwrap()
            .clone()
    };
    let (a, b) = (of(&disks[0]), of(&disks[1]));
    assert_eq!(a.1, "in-use", "{doc}");
    assert!(a.2.contains(&std::process::id().to_string()), "{a:?}");
    assert_eq!(b.1, "fixed", "{doc}");
    assert!(!Path::new(&format!("/sys/block/{}", disks[1])).exists());
    assert_eq!(code, 4, "{doc}");
    let (_, doc) = doctor_with(&["--grace", "2", "--fix", "scsi-device-blocked"]);
    let again = fixes(&doc, "scsi-device-blocked");
    assert_eq!(again.len(), 1, "{doc}");
    assert_eq!(again[0].1, "in-use", "{doc}");

    drop(held);
    lab.target().set_enabled(true).unwrap();
    support::wait::until_true(
        "the held disk running again",
        Duration::from_secs(90),
        || state(&disks[0]) == "running",
    )
    .expect("the session back");
    let (_, doc) = doctor_with(&["--grace", "0"]);
    assert!(blocked(&doc, "findings").is_empty(), "{doc}");
    assert!(blocked(&doc, "pending").is_empty(), "{doc}");
    lab.teardown().unwrap();
}

/// lunkit's lock directory, whose `names/` and `attached/` the doctor checks.
const LOCKS: &str = "/run/lunkit/locks";

/// Removes the name records and attach marks earlier tests of this guest left: tests that
/// take volumes away behind lunkit's back leave records that name nothing, which the doctor
/// reports (`stale-name-record`). Each test builds its own lab, so none needs them.
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
    // Where its time goes: 66-74 s in full runs, 22 s alone. In the full run at 21af426
    // every phase took 2.5-4x its time alone, none stuck: the guest was slow then.
    let t0 = Instant::now();
    let mark = |what: &str| eprintln!("[{:6.1} s] {what}", t0.elapsed().as_secs_f64());
    let (lab, iqn) = records_lab(2);
    mark("lab up");
    attach_ok(&["--iscsi-target", &iqn, "--lun", "1"]);
    support::udev::settle(Duration::from_secs(60)).unwrap();
    mark("LUN 1 attached, udev settled");
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
    mark("first doctor");

    for d in &disks {
        fs::write(format!("/sys/block/{d}/device/delete"), "1").unwrap();
    }
    support::udev::settle(Duration::from_secs(60)).unwrap();
    assert_eq!(disks_at(&lab, 1), Vec::<String>::new());
    mark("disks deleted, udev settled");

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
    mark("doctor found the record");

    let (_, doc) = doctor_with(&["--fix"]);
    let fixed = fixes(&doc, "stale-name-record");
    assert_eq!(fixed.len(), 1, "{doc}");
    assert_eq!(fixed[0].1, "fixed", "{fixed:?}");
    assert!(fixed[0].2.contains(&file), "{fixed:?}");
    assert!(!record.exists());
    mark("doctor --fix");

    // Again: nothing of it found, nothing changed.
    let (_, doc) = doctor_with(&["--fix"]);
    assert_eq!(findings(&doc, "stale-name-record"), []);
    mark("doctor --fix again");

    // Attached and detached through lunkit: the detach retires the record (kept, for a
    // retry to recall), and doctor says nothing of it.
    attach_ok(&["--iscsi-target", &iqn, "--lun", "0"]);
    let out = lunkit(&["detach", "--iscsi-target", &iqn, "--lun", "0", "--json"]);
    assert!(out.status.success(), "{}", describe(&out));
    mark("LUN 0 attached and detached");
    let retired = Path::new(LOCKS)
        .join("names")
        .join(format!("iscsi-{iqn}-lun-0"));
    let text = fs::read_to_string(&retired).unwrap();
    assert_eq!(text.lines().nth(1), Some("detached"), "{text}");
    let (_, doc) = doctor();
    assert_eq!(findings(&doc, "stale-name-record"), [], "{doc}");
    let out = lunkit(&["detach", "--iscsi-target", &iqn, "--lun", "0", "--json"]);
    assert!(out.status.success(), "a retry: {}", describe(&out));
    mark("doctor, and the detach retried");
    lab.teardown().unwrap();
    mark("lab torn down");
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
    // The devices come in H:C:T:L order, which need not be their names' order.
    let mut named = objects[2..].to_vec();
    named.sort();
    assert_eq!(named, disks, "{doc}");
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
    let mut devices = devices;
    devices.sort_unstable();
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

/// Whether the node has a disk of namespace `nsid` of subsystem `nqn` (a head, or a
/// controller's own disk).
fn namespace_on_node(nqn: &str, nsid: u32) -> bool {
    support::sysfs::names("/sys/block").iter().any(|d| {
        support::sysfs::attr(format!("/sys/block/{d}/nsid")) == Some(nsid.to_string())
            && support::sysfs::attr(format!("/sys/block/{d}/device/subsysnqn")).as_deref()
                == Some(nqn)
    })
}

/// Two NVMe namespaces of one subsystem attached through lunkit (attach marks and name
/// records written).
/// - The array hides namespace 1 for a moment: its mark is `stale-attach-mark` only past the
///   grace (pending before), and a plain `--fix` leaves it (`not-selected`), since the
///   subsystem's controller is still on the node. The namespace comes back, and the
///   sibling's detach keeps the controller that serves it.
/// - Its controller deleted behind lunkit's back: no controller of the subsystem serves it,
///   and the mark would keep the subsystem's controllers through every later detach. Found
///   as `stale-attach-mark` (and its record as `stale-name-record`); a plain `--fix` removes
///   both files, and a second one finds nothing.
#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn an_attach_mark_is_removed_by_fix_only_once_its_subsystem_is_gone() {
    require_vm();
    forget_records();
    let nqn = "nqn.2014-08.org.lunkit:doctor-marks";
    let t = Target::builder()
        .nqn(nqn)
        .namespace(16 << 20)
        .namespace_id(2, 16 << 20)
        .port(PortConfig::new(62, "127.0.0.1", "4420"))
        .build()
        .expect("nvmet target");
    let host = [
        "--nvme-nqn",
        nqn,
        "--portal",
        "127.0.0.1:4420",
        "--hostnqn",
        "nqn.2014-08.org.nvmexpress:uuid:6c1d8a70-1c9e-4d5e-9a40-3b4c5d6e7f80",
        "--hostid",
        "6c1d8a70-1c9e-4d5e-9a40-3b4c5d6e7f80",
    ];
    for nsid in ["1", "2"] {
        attach_ok(&[&host[..], &["--nsid", nsid]].concat());
    }
    let file = format!("nvme-{nqn}-ns-1");
    let mark = Path::new(LOCKS).join("attached").join(&file);
    let record = Path::new(LOCKS).join("names").join(&file);
    assert!(mark.exists() && record.exists());
    let (_, doc) = doctor_with(&["--grace", "0"]);
    assert_eq!(findings(&doc, "stale-attach-mark"), []);
    assert_eq!(findings(&doc, "stale-name-record"), []);

    // Hidden for a moment.
    t.set_namespace_enabled(1, false).unwrap();
    support::wait::until_true("namespace 1 to leave", Duration::from_secs(60), || {
        !namespace_on_node(nqn, 1)
    })
    .unwrap();
    let (_, doc) = doctor_with(&["--grace", "0", "--fix"]);
    let left = fixes(&doc, "stale-attach-mark");
    assert_eq!(left.len(), 1, "{doc}");
    assert_eq!(left[0].0[0], file);
    assert_eq!(left[0].1, "not-selected", "{doc}");
    assert!(
        mark.exists(),
        "a plain --fix removed the mark of a hidden namespace"
    );
    let (_, doc) = doctor();
    assert_eq!(
        findings(&doc, "stale-attach-mark"),
        [],
        "within the grace: {doc}"
    );
    assert!(doc["pending"].to_string().contains(&file), "{doc}");
    t.set_namespace_enabled(1, true).unwrap();
    support::wait::until_true("namespace 1 to come back", Duration::from_secs(60), || {
        namespace_on_node(nqn, 1)
    })
    .unwrap();
    let out = lunkit(&[&["detach"], &host[..2], &["--nsid", "2"]].concat());
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(
        namespace_on_node(nqn, 1),
        "the sibling's detach took namespace 1's controller"
    );

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

    let (code, doc) = doctor_with(&["--grace", "0"]);
    let marks: Vec<_> = of_kind(&doc, "stale-attach-mark").collect();
    assert_eq!(marks.len(), 1, "{doc}");
    assert_eq!(marks[0].0[0], file);
    assert_eq!(marks[0].1["identity"], nqn);
    // Namespace 1's name record went with the plain fix while it was hidden (a record names
    // no device and keeps none); whatever name records are stale now go with the mark.
    let records = findings(&doc, "stale-name-record");
    assert_eq!(code, 1, "{doc}");
    assert!(mark.exists());

    let (code, doc) = doctor_with(&["--grace", "0", "--fix"]);
    for (kind, n) in [
        ("stale-attach-mark", 1),
        ("stale-name-record", records.len()),
    ] {
        let fixed = fixes(&doc, kind);
        assert_eq!(fixed.len(), n, "{doc}");
        assert!(fixed.iter().all(|f| f.1 == "fixed"), "{kind}: {fixed:?}");
    }
    assert!(!mark.exists() && !record.exists());
    assert_eq!(code, 0, "{doc}");

    let (code, doc) = doctor_with(&["--grace", "0", "--fix"]);
    assert_eq!((code, doc["findings"].as_array().unwrap().len()), (0, 0));
    t.teardown().unwrap();
    forget_records();
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
    forget_records();
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
    let idle: Vec<_> = of_kind(&doc, "idle-session").collect();
    assert_eq!(idle.len(), lab.sessions.len(), "{doc}");
    for (_, f) in &idle {
        assert!(
            f["why"].as_str().unwrap().contains("carries no LUN"),
            "{doc}"
        );
        assert_eq!(f["fix"]["outcome"], "not-selected", "{doc}");
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
    forget_records();
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

    // Again, fixing only this kind: no lun-gone is left. (A plain `--fix` here also tried the
    // pathless, queueing map's own kind, map-without-paths, which waits 30 s for a path to
    // come back and fails: a third of this test's time, for nothing it asserts.)
    let (_, doc) = doctor_with(&["--fix", "lun-gone"]);
    assert_eq!(fixes(&doc, "lun-gone"), [], "{doc}");
    lab.teardown().unwrap();
}

/// Offline disks held the way a node's pods hold volumes: disk A through kubelet's raw block
/// layout (the node bind-mounted onto a publish file and a loop device on the node, the
/// "descriptor lock"), disk B by a filesystem mounted only in a mount namespace of its own (a
/// container's). Both are found in use, each naming its holder, and `--fix` leaves both
/// untouched; released, they are deleted.
#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn offline_disks_held_as_pods_hold_them_are_left_naming_the_holder() {
    require_vm();
    forget_records();
    let sd = ScsiDebug::load(
        &[
            ("add_host", "1"),
            ("num_tgts", "1"),
            ("max_luns", "2"),
            ("dev_size_mb", "16"),
        ],
        2,
    )
    .expect("load scsi_debug");
    support::udev::settle(Duration::from_secs(30)).expect("udev settle");
    let mut disks = sd.disks();
    disks.sort();
    let (a, b) = (disks[0].clone(), disks[1].clone());

    // A: kubelet's publish bind mount of the node, and its loop device on the node. The loop
    // driver is a module that no earlier test in this guest may have loaded.
    support::cmd::run("modprobe", &["loop"]).expect("modprobe loop");
    let publish = "/tmp/lunkit-doctor-publish";
    fs::write(publish, "").unwrap();
    support::cmd::run("mount", &["--bind", &format!("/dev/{a}"), publish]).unwrap();
    let lo = support::cmd::run("losetup", &["-f", "--show", &format!("/dev/{a}")]).unwrap();
    let lo = lo.trim().to_owned();
    // B: ext4 mounted in a mount namespace of its own, kept alive by its one process.
    support::cmd::run("mkfs.ext4", &["-q", &format!("/dev/{b}")]).unwrap();
    // A test may start processes: it plays the pod that holds the volume.
    #[allow(clippy::disallowed_methods)]
    let mut pod = std::process::Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(format!(
            "mkdir -p /tmp/lunkit-doctor-pod && mount /dev/{b} /tmp/lunkit-doctor-pod && \
             echo ready && exec sleep 600"
        ))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("unshare");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(pod.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line.trim(), "ready");
    support::udev::settle(Duration::from_secs(30)).expect("udev settle");
    set_state(&a, "offline");
    set_state(&b, "offline");

    let (code, doc) = doctor_with(&["--fix", "scsi-device-down"]);
    let of = |d: &str| {
        of_kind(&doc, "scsi-device-down")
            .find(|(o, _)| o.contains(&d.to_owned()))
            .map(|(_, f)| f.clone())
            .unwrap_or_else(|| panic!("{d} not found: {doc}"))
    };
    let (fa, fb) = (of(&a), of(&b));
    for f in [&fa, &fb] {
        assert_eq!(f["in_use"], true, "{doc}");
        assert_eq!(f["fix"]["outcome"], "in-use", "{doc}");
    }
    let users_a = fa["users"].as_str().unwrap();
    let lo_name = lo.trim_start_matches("/dev/");
    assert!(
        users_a.contains(lo_name),
        "the loop device named: {users_a}"
    );
    assert!(users_a.contains(publish), "the bind mount named: {users_a}");
    let users_b = fb["users"].as_str().unwrap();
    assert!(
        users_b.contains("/tmp/lunkit-doctor-pod"),
        "the pod's mount named: {users_b}"
    );
    assert_eq!(code, 4, "{doc}");
    for d in [&a, &b] {
        assert!(
            Path::new(&format!("/sys/block/{d}")).exists(),
            "{d} untouched"
        );
    }

    // Released: nothing holds them, and the fix deletes both.
    let _ = pod.kill();
    let _ = pod.wait();
    support::cmd::run("losetup", &["-d", &lo]).unwrap();
    support::cmd::run("umount", &[publish]).unwrap();
    let _ = fs::remove_file(publish);
    support::wait::until_true("the loop device unbound", Duration::from_secs(30), || {
        !Path::new(&format!(
            "/sys/block/{}/loop",
            lo.trim_start_matches("/dev/")
        ))
        .exists()
    })
    .unwrap();
    let (code, doc) = doctor_with(&["--fix", "scsi-device-down"]);
    let fixed = fixes(&doc, "scsi-device-down");
    assert_eq!(fixed.len(), 2, "{doc}");
    assert!(fixed.iter().all(|f| f.1 == "fixed"), "{doc}");
    assert_eq!(code, 0, "{doc}");
    drop(sd);
}

//! VM tests for device-mapper control and multipath map removal (issue 4) that need no
//! iSCSI: the map is built with the library's own create/load, as a `multipath` target over
//! the two paths of a scsi_debug LUN (scsi_debug hosts share one RAM store, so two hosts give
//! two paths to the same data), with a kpartx-style partition map on top.
//!
//! Run by `cargo xtask test` inside the QEMU guest (ignored on the host).

// The fixtures load modules with modprobe.
#![allow(clippy::disallowed_methods)]

use lunkit_lab as support;

use std::fs::OpenOptions;
use std::io::Write;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use lunkit::dm::{Control, DevId, ListedUuid, Removed, Target};
use lunkit::multipath::{self, RemoveOptions, Status, Table};
use lunkit::{DevNum, ErrorKind, Root};
use support::scsi_debug::ScsiDebug;
use support::{cmd, require_vm, sysfs, udev};

/// scsi_debug with two hosts of one 64 MiB LUN each: two paths to one store.
fn two_paths() -> (ScsiDebug, Vec<(String, DevNum)>) {
    let sd = ScsiDebug::load(
        &[
            ("add_host", "2"),
            ("num_tgts", "1"),
            ("max_luns", "1"),
            ("dev_size_mb", "64"),
            // One device identity on both hosts, as two paths to one LU have.
            ("vpd_use_hostno", "0"),
        ],
        2,
    )
    .expect("load scsi_debug");
    cmd::run("modprobe", &["dm_multipath"]).expect("modprobe dm_multipath");
    let mut disks: Vec<(String, DevNum)> = sd
        .disks()
        .into_iter()
        .map(|d| {
            let dev = sysfs::attr(format!("/sys/block/{d}/dev"))
                .unwrap()
                .parse()
                .unwrap();
            (d, dev)
        })
        .collect();
    disks.sort();
    assert_eq!(disks.len(), 2, "{disks:?}");
    (sd, disks)
}

/// A multipath map and its partition map, removed on drop if a test left them.
struct Lab {
    name: String,
    part: String,
    wwid: String,
    dev: DevNum,
    paths: Vec<(String, DevNum)>,
    _sd: ScsiDebug,
}

const SECTORS: u64 = 64 * 2048;

impl Lab {
    fn build(tag: &str, queue_if_no_path: bool) -> Lab {
        let (sd, paths) = two_paths();
        let ctl = Control::open(&Root::default()).expect("open /dev/mapper/control");
        let name = format!("lunkit-{tag}");
        let part = format!("{name}p1");
        // The map must carry its paths' WWID, as multipath-tools computes it. On every change
        // uevent of an `mpath-` map, its udev rules run `multipath -U`, which fails
        // (`fail_path`) each path whose WWID differs from the map's: seen in the VM with
        // ftrace on dm-multipath's fail_path, called from `multipath`'s message ioctl.
        let wwid = match udev::running() {
            true => {
                udev::settle(Duration::from_secs(30)).expect("udev settle");
                let of = |dev: DevNum| udev::property(dev, "ID_SERIAL").expect("path's ID_SERIAL");
                let wwid = of(paths[0].1);
                assert_eq!(of(paths[1].1), wwid, "both paths show one LU");
                wwid
            }
            // Without udevd no rule looks at the map.
            false => format!("3600140500000000000000000000{:04x}", tag.len() * 97),
        };
        let uuid = format!("mpath-{wwid}");
        let features = if queue_if_no_path {
            "1 queue_if_no_path"
        } else {
            "0"
        };
        let params = format!(
            "{features} 0 1 1 round-robin 0 2 1 {} 1 {} 1",
            paths[0].1, paths[1].1
        );
        let info = ctl.create(&name, Some(&uuid)).expect("create map");
        let id = DevId::Name(&name);
        ctl.load(&id, &[target(0, SECTORS, "multipath", &params)])
            .expect("load multipath table");
        ctl.resume(&id).expect("resume map");
        let dev = info.dev;
        // The partition map kpartx would make: sectors 2048.. of the map.
        let puuid = format!("part1-{uuid}");
        ctl.create(&part, Some(&puuid))
            .expect("create partition map");
        let pid = DevId::Name(&part);
        ctl.load(
            &pid,
            &[target(0, SECTORS - 2048, "linear", &format!("{dev} 2048"))],
        )
        .expect("load partition table");
        ctl.resume(&pid).expect("resume partition map");
        // Let udev's probes of the new nodes finish, so open counts are ours alone.
        if udev::running() {
            udev::settle(Duration::from_secs(30)).expect("udev settle");
        }
        let st = Status::parse(&ctl.status(&id).expect("status")[0].params).expect("parse");
        assert_eq!(
            st.active_paths(),
            2,
            "both paths active once udev has looked at the map: {st:?}"
        );
        Lab {
            name,
            part,
            wwid,
            dev,
            paths,
            _sd: sd,
        }
    }

    fn node(&self) -> String {
        format!("/dev/dm-{}", self.dev.minor)
    }

    fn present(&self, ctl: &Control, name: &str) -> bool {
        ctl.list().unwrap().iter().any(|d| d.name == name)
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for (d, _) in &self.paths {
            let _ = std::fs::write(format!("/sys/block/{d}/device/state"), "running\n");
        }
        if let Ok(ctl) = Control::open(&Root::default()) {
            for n in [&self.part, &self.name] {
                let _ = ctl.message(&DevId::Name(n), 0, "fail_if_no_path");
                let _ = ctl.remove(&DevId::Name(n), false);
            }
        }
    }
}

fn target(start: u64, length: u64, tt: &str, params: &str) -> Target {
    Target {
        start,
        length,
        target_type: tt.into(),
        params: params.into(),
    }
}

fn opts(secs: u64) -> RemoveOptions {
    let mut o = RemoveOptions::default();
    o.timeout = Duration::from_secs(secs);
    o
}

#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn mpath_remove_dm_control_basics() {
    require_vm();
    let lab = Lab::build("basics", true);
    let ctl = Control::open(&Root::default()).unwrap();
    assert_eq!(ctl.version().major, 4);
    let list = ctl.list().unwrap();
    let me = list.iter().find(|d| d.name == lab.name).expect("listed");
    assert_eq!(me.dev, lab.dev);
    assert_eq!(me.uuid, ListedUuid::Some(format!("mpath-{}", lab.wwid)));

    let id = DevId::Name(&lab.name);
    let info = ctl.info(&id).unwrap();
    assert_eq!(info.open_count, 1, "held by its partition map");
    assert!(info.live_table() && !info.suspended());
    let table = ctl.table(&id).unwrap();
    assert_eq!(table.len(), 1);
    let t = Table::parse(&table[0].params).unwrap();
    assert!(t.queue_if_no_path());
    assert_eq!(
        t.paths().collect::<Vec<_>>(),
        [lab.paths[0].1, lab.paths[1].1]
    );
    let st = Status::parse(&ctl.status(&id).unwrap()[0].params).unwrap();
    assert_eq!(st.active_paths(), 2);
    let mut deps = ctl.deps(&id).unwrap();
    deps.sort();
    assert_eq!(deps, [lab.paths[0].1, lab.paths[1].1]);
    // Lookup by number and by uuid find the same device.
    assert_eq!(ctl.info(&DevId::Dev(lab.dev)).unwrap().name, lab.name);
    let uuid = format!("mpath-{}", lab.wwid);
    assert_eq!(ctl.info(&DevId::Uuid(&uuid)).unwrap().name, lab.name);
    // Messages: fail a path, see it failed, reinstate it.
    ctl.message(&id, 0, &format!("fail_path {}", lab.paths[0].1))
        .unwrap();
    let st = Status::parse(&ctl.status(&id).unwrap()[0].params).unwrap();
    assert_eq!(st.active_paths(), 1);
    assert_eq!(st.paths().next().unwrap().fail_count, 1);
    ctl.message(&id, 0, &format!("reinstate_path {}", lab.paths[0].1))
        .unwrap();
    // Suspend and resume.
    assert!(ctl.suspend(&id, Default::default()).unwrap().suspended());
    assert!(!ctl.resume(&id).unwrap().suspended());
    // Errors name the ioctl, the device and the errno.
    let e = ctl.info(&DevId::Name("lunkit-no-such-map")).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound);
    let msg = e.to_string();
    assert!(
        msg.contains("DM_DEV_STATUS") && msg.contains("lunkit-no-such-map"),
        "{msg}"
    );
    // A busy map refuses a plain remove with EBUSY.
    let e = ctl.remove(&id, false).unwrap_err();
    assert_eq!(e.errno(), Some(libc::EBUSY), "{e}");
}

#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn mpath_remove_map_and_partition_map() {
    require_vm();
    let lab = Lab::build("both", true);
    let ctl = Control::open(&Root::default()).unwrap();
    let t0 = Instant::now();
    let report = multipath::remove(&Root::default(), &lab.name, &opts(30)).expect("remove");
    assert_eq!(report.outcome, Removed::Now);
    assert_eq!(report.partitions_removed, std::slice::from_ref(&lab.part));
    assert!(!report.via_multipathd);
    assert!(!lab.present(&ctl, &lab.name), "map gone");
    assert!(!lab.present(&ctl, &lab.part), "partition map gone");
    assert!(
        !std::path::Path::new(&format!("/sys/dev/block/{}", lab.dev)).exists(),
        "dm node gone from sysfs"
    );
    eprintln!("removed in {:?}", t0.elapsed());
    // Removing again: no such map.
    let e = multipath::remove(&Root::default(), &lab.name, &opts(5)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
}

#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn mpath_remove_open_fd_is_busy_and_untouched() {
    require_vm();
    let lab = Lab::build("openfd", true);
    let ctl = Control::open(&Root::default()).unwrap();
    let fd = std::fs::File::open(lab.node()).expect("open the map");
    let t0 = Instant::now();
    let e = multipath::remove(&Root::default(), &lab.node(), &opts(10)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Busy, "{e}");
    assert!(t0.elapsed() < Duration::from_secs(10));
    let msg = e.to_string();
    assert!(
        msg.contains(&lab.name) && msg.contains("open count 2"),
        "{msg}"
    );
    // And it names who: this process, by pid.
    assert!(
        msg.contains(&format!("open by pid {}", std::process::id())),
        "{msg}"
    );
    // Untouched: both maps there, not suspended, still queueing.
    assert!(lab.present(&ctl, &lab.part));
    let info = ctl.info(&DevId::Name(&lab.name)).unwrap();
    assert!(!info.suspended());
    let t = ctl.table(&DevId::Name(&lab.name)).unwrap();
    assert!(Table::parse(&t[0].params).unwrap().queue_if_no_path());
    drop(fd);
    // Now by WWID.
    let r = multipath::remove(&Root::default(), &lab.wwid, &opts(30)).expect("remove by WWID");
    assert_eq!(r.outcome, Removed::Now);
    assert!(!lab.present(&ctl, &lab.name));
}

#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn mpath_remove_deferred_with_open_fd() {
    require_vm();
    let lab = Lab::build("deferred", false);
    let ctl = Control::open(&Root::default()).unwrap();
    let fd = std::fs::File::open(lab.node()).expect("open the map");
    let mut o = opts(30);
    o.deferred = true;
    let kname = format!("dm-{}", lab.dev.minor);
    let r = multipath::remove(&Root::default(), &kname, &o).expect("deferred remove");
    assert_eq!(r.outcome, Removed::Deferred);
    let info = ctl.info(&DevId::Name(&lab.name)).unwrap();
    assert!(info.deferred_remove(), "flags {:#x}", info.flags);
    assert!(
        !info.suspended(),
        "a deferred map must keep serving its holder, not stay suspended"
    );
    drop(fd);
    let deadline = Instant::now() + Duration::from_secs(10);
    while lab.present(&ctl, &lab.name) {
        assert!(
            Instant::now() < deadline,
            "map still there 10 s after the last close"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn mpath_remove_no_active_path_with_dirty_data() {
    require_vm();
    let lab = Lab::build("nopath", true);
    let ctl = Control::open(&Root::default()).unwrap();
    let id = DevId::Name(&lab.name);
    // Both paths offline, and failed in the map.
    for (d, dev) in &lab.paths {
        std::fs::write(format!("/sys/block/{d}/device/state"), "offline\n").unwrap();
        ctl.message(&id, 0, &format!("fail_path {dev}")).unwrap();
    }
    let st = Status::parse(&ctl.status(&id).unwrap()[0].params).unwrap();
    assert_eq!(st.active_paths(), 0);
    // Dirty page-cache data: a buffered write whose flush on close queues in the map.
    let (tx, rx) = mpsc::channel();
    let node = lab.node();
    std::thread::spawn(move || {
        let r = (|| {
            let mut f = OpenOptions::new().write(true).open(&node)?;
            f.write_all(&vec![0x5a; 1 << 20])?;
            drop(f); // blocks on the sync of the dirty pages until queued I/O is failed
            Ok::<_, std::io::Error>(())
        })();
        let _ = tx.send(r);
    });
    // Until its write-back is queued in the map: a fixed sleep raced the writer under load,
    // and a test that asserted before its I/O queued left the writer blocked forever.
    support::wait::until_true(
        "the writer's I/O to queue in the map",
        Duration::from_secs(60),
        || {
            ctl.status(&id)
                .ok()
                .and_then(|s| Status::parse(&s[0].params).ok())
                .is_some_and(|st| st.queue_io)
        },
    )
    .expect("the writer's write-back queues in the map");

    // Without force: refused within the timeout, map present and still queueing.
    let t0 = Instant::now();
    let e = multipath::remove(&Root::default(), &lab.name, &opts(10)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Busy, "{e}");
    assert!(e.to_string().contains("no path is active"), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    assert!(lab.present(&ctl, &lab.name));
    let t = ctl.table(&id).unwrap();
    assert!(Table::parse(&t[0].params).unwrap().queue_if_no_path());
    let st = Status::parse(&ctl.status(&id).unwrap()[0].params).unwrap();
    assert!(st.queue_io, "still queueing");

    // With force: queued I/O fails, the writer lets go, and the map is gone in time.
    let t0 = Instant::now();
    let mut o = opts(20);
    o.force = true;
    let r = multipath::remove(&Root::default(), &lab.name, &o).expect("forced remove");
    assert_eq!(r.outcome, Removed::Now);
    assert!(t0.elapsed() < Duration::from_secs(20), "{:?}", t0.elapsed());
    assert!(!lab.present(&ctl, &lab.name));
    assert!(!lab.present(&ctl, &lab.part));
    // The writer finished (with an error for its lost data), nothing hangs.
    let w = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("writer finished");
    eprintln!("writer: {w:?}");
}

/// How a stand-in on multipathd's abstract socket behaves.
#[derive(Clone, Copy)]
enum StandIn {
    /// Runs as root, reads each command and never answers: a multipathd that hangs.
    Silent,
    /// Listens as uid 65534 and answers `ok` to every command, doing nothing: anyone in the
    /// network namespace can bind the name.
    NotRootSaysOk,
}

/// Starts a stand-in for multipathd in this process. It lives until the test process ends
/// (each VM test is a process of its own); no multipathd runs in these tests.
fn stand_in(how: StandIn) {
    use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
    use std::io::Read;
    use std::os::unix::net::UnixListener;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let fd = rustix::net::socket_with(
            AddressFamily::UNIX,
            SocketType::STREAM,
            SocketFlags::CLOEXEC,
            None,
        )
        .unwrap();
        let addr = SocketAddrUnix::new_abstract_name(multipath::MULTIPATHD_SOCKET).unwrap();
        rustix::net::bind(&fd, &addr).expect("bind multipathd's socket name");
        if let StandIn::NotRootSaysOk = how {
            // The kernel records the listener's credentials at listen(2); only this thread
            // drops root.
            rustix::thread::set_thread_uid(rustix::process::Uid::from_raw(65534)).unwrap();
        }
        rustix::net::listen(&fd, 8).unwrap();
        tx.send(()).unwrap();
        let listener = UnixListener::from(fd);
        let mut held = Vec::new();
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut len = [0u8; size_of::<usize>()];
            if conn.read_exact(&mut len).is_err() {
                continue;
            }
            let mut cmd = vec![0u8; usize::from_ne_bytes(len).min(4096)];
            if conn.read_exact(&mut cmd).is_err() {
                continue;
            }
            eprintln!(
                "stand-in multipathd got {:?}",
                String::from_utf8_lossy(&cmd)
            );
            if let StandIn::NotRootSaysOk = how {
                let reply = b"ok\n\0";
                let _ = conn.write_all(&reply.len().to_ne_bytes());
                let _ = conn.write_all(reply);
            }
            held.push(conn);
        }
    });
    rx.recv_timeout(Duration::from_secs(10))
        .expect("the stand-in listens");
}

/// A multipathd that never answers costs the removal half its time, not all of it: the map
/// is then removed through device-mapper, and the report says why multipathd was passed over.
#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn mpath_remove_falls_back_when_multipathd_does_not_answer() {
    require_vm();
    let lab = Lab::build("silent", true);
    let ctl = Control::open(&Root::default()).unwrap();
    stand_in(StandIn::Silent);
    let r = multipath::remove(&Root::default(), &lab.name, &opts(20)).expect("remove");
    assert_eq!(r.outcome, Removed::Now);
    assert!(!r.via_multipathd);
    let why = r
        .multipathd_skipped
        .expect("says why multipathd did not do it");
    assert!(
        why.contains("timed out") && why.contains(&format!("del map {}", lab.name)),
        "{why}"
    );
    assert!(!lab.present(&ctl, &lab.name), "map gone");
    assert!(!lab.present(&ctl, &lab.part), "partition map gone");
}

/// A listener on multipathd's name that is not root answers `ok` to `del map` and does
/// nothing. Trusting it would report the map removed while it stays; it is not trusted.
#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn mpath_remove_does_not_trust_a_multipathd_that_is_not_root() {
    require_vm();
    let lab = Lab::build("notroot", true);
    let ctl = Control::open(&Root::default()).unwrap();
    stand_in(StandIn::NotRootSaysOk);
    let r = multipath::remove(&Root::default(), &lab.name, &opts(20)).expect("remove");
    assert_eq!(r.outcome, Removed::Now);
    assert!(!r.via_multipathd, "{r:?}");
    let why = r
        .multipathd_skipped
        .expect("says why multipathd was not asked");
    assert!(
        why.contains("uid 65534") && why.contains("not trusted"),
        "{why}"
    );
    assert!(!lab.present(&ctl, &lab.name), "map gone");
    assert!(!lab.present(&ctl, &lab.part), "partition map gone");
}

/// A removal killed between its suspend and its remove leaves the map suspended: every I/O
/// to it waits, and it cannot be suspended again. The next removal resumes it first, says so,
/// and removes it.
#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn mpath_remove_resumes_a_map_left_suspended() {
    require_vm();
    let lab = Lab::build("suspended", true);
    let ctl = Control::open(&Root::default()).unwrap();
    let id = DevId::Name(&lab.name);
    let how = lunkit::dm::Suspend {
        noflush: false,
        skip_lockfs: true,
    };
    assert!(ctl.suspend(&id, how).unwrap().suspended());
    let r = multipath::remove(&Root::default(), &lab.name, &opts(30)).expect("remove");
    assert_eq!(r.outcome, Removed::Now);
    assert_eq!(r.resumed, std::slice::from_ref(&lab.name));
    assert!(!lab.present(&ctl, &lab.name), "map gone");
    assert!(!lab.present(&ctl, &lab.part), "partition map gone");
}

/// multipathd reloads a map (a path came or went, a resize) with one `DM_DEV_SUSPEND` that
/// suspends it, swaps in the new table and resumes it. A take-down that found the map
/// suspended in that moment and resumed it got `EINVAL` (the kernel's `dm_resume` of a map
/// no longer suspended): a full local run's CSI unstage failed with "resume-map mpatha (dm-0):
/// DM_DEV_SUSPEND ...: Invalid argument". Here a thread stands in for multipathd, reloading
/// the map with its own table over and over, while this one:
/// - resumes it where it finds it suspended: the library's `resume_if_suspended`, and the
///   look-then-resume it replaced. The old way must meet the race (so the race is real
///   here), and the library's call must never fail meanwhile;
/// - suspends it with a flush as a removal does (`suspend_unless_suspended`), which must
///   never fail and must see the stand-in's suspensions (its flush did not happen then);
/// - removes it with `multipath::remove` while the reloads go on: no failure, no hang, the
///   map gone within the remove's deadline.
#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn resume_suspend_and_remove_survive_another_reload() {
    require_vm();
    let lab = Lab::build("reload-race", false);
    // Each resume sends a change uevent, and udev's rules would probe the map thousands of
    // times; the race is between the two callers alone.
    let _udev = udev::Stopped::new().expect("stop udevd");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reloader = {
        let (name, stop) = (lab.name.clone(), stop.clone());
        std::thread::spawn(move || {
            let ctl = Control::open(&Root::default()).unwrap();
            let id = DevId::Name(&name);
            let table = ctl.table(&id).unwrap();
            let mut cycles = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // multipathd's reload: the table loaded, then one resume that suspends the
                // map, swaps the table in and resumes it. The map removed ends it.
                match ctl.load(&id, &table) {
                    Err(e) if e.is_gone() => break,
                    r => drop(r.expect("the stand-in's load")),
                }
                // This thread's resume meets the race from its side; it is not under test.
                match ctl.resume(&id) {
                    Err(e) if e.is_gone() => break,
                    Err(e) if e.errno() != Some(libc::EINVAL) => panic!("{e}"),
                    _ => cycles += 1,
                }
            }
            cycles
        })
    };
    let ctl = Control::open(&Root::default()).unwrap();
    let id = DevId::Name(&lab.name);
    let fail = |what: String| halt(&stop, what);
    let deadline = Instant::now() + Duration::from_secs(60);
    let (mut old_failed, mut calls, mut resumed) = (0, 0, 0);
    while old_failed < 3 || calls < 2000 {
        if Instant::now() >= deadline {
            fail(format!(
                "the old way met the race {old_failed} times in {calls} rounds within 60 s"
            ));
        }
        // The old way: look, then resume.
        if ctl.info(&id).unwrap().suspended() {
            match ctl.resume(&id) {
                Err(e) if e.errno() == Some(libc::EINVAL) => old_failed += 1,
                r => drop(r.unwrap()),
            }
        }
        // The library's.
        match ctl.resume_if_suspended(&id) {
            Ok(Some(_)) => resumed += 1,
            Ok(None) => {}
            Err(e) => fail(format!(
                "resume_if_suspended failed after {calls} calls: {e}"
            )),
        }
        calls += 1;
    }
    eprintln!(
        "resume: {calls} calls ({resumed} resumed the map), the old way failed {old_failed} times"
    );

    let how = lunkit::dm::Suspend {
        noflush: false,
        skip_lockfs: true,
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let (mut ours, mut theirs) = (0, 0);
    while theirs < 3 || ours < 200 {
        if Instant::now() >= deadline {
            fail(format!(
                "the stand-in's suspension seen {theirs} times in {ours} suspends within 60 s"
            ));
        }
        match ctl.suspend_unless_suspended(&id, how) {
            Ok(true) => {
                ours += 1;
                if let Err(e) = ctl.resume_if_suspended(&id) {
                    fail(format!("resume after the suspend failed: {e}"));
                }
            }
            Ok(false) => theirs += 1,
            Err(e) => fail(format!(
                "suspend_unless_suspended failed after {ours} suspends: {e}"
            )),
        }
    }
    eprintln!("suspend: {ours} suspended here, {theirs} found suspended by the stand-in");

    let started = Instant::now();
    match multipath::remove(&Root::default(), &lab.name, &opts(30)) {
        Ok(r) => assert_eq!(r.outcome, Removed::Now),
        Err(e) => fail(format!("remove during the reloads: {e}")),
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let cycles = reloader.join().unwrap();
    eprintln!(
        "removed in {:?}; the stand-in made {cycles} reloads",
        started.elapsed()
    );
    assert!(!lab.present(&ctl, &lab.name), "map gone");
}

/// Stops the stand-in of a race test, then fails the test with `what`.
fn halt(stop: &std::sync::atomic::AtomicBool, what: String) -> ! {
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    panic!("{what}");
}

/// Issue 33: the in-use check opens every bound loop device to ask what backs it, and that
/// open waits while a partition scan of the loop device holds it. Here the scan is the one
/// made when `losetup -P` binds a loop device to a linear map the test has suspended (by
/// losetup, or by udev's probe opening the new device first): the scan's read waits on the
/// map, and with it every open of the loop device. The test waits until a task is in the
/// scan (its kernel stack), not for a time. A check of
/// any device (here the one under the map) returns at its deadline with that loop device
/// unchecked, not whenever the map resumes.
#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn an_in_use_check_whose_loop_device_cannot_be_opened_ends_at_its_deadline() {
    require_vm();
    cmd::run("modprobe", &["loop"]).unwrap();
    let file = "/tmp/lunkit-loop-stuck.img";
    std::fs::File::create(file)
        .unwrap()
        .set_len(8 << 20)
        .unwrap();
    let under = cmd::run("losetup", &["-f", "--show", file]).unwrap();
    let under = under.trim().to_owned();
    let name = "lunkit-loop-stuck";
    let table = format!("0 {} linear {under} 0", (8 << 20) / 512);
    cmd::run("dmsetup", &["create", name, "--table", &table]).unwrap();
    let _ = udev::settle(Duration::from_secs(30));
    let root = Root::default();
    let ctl = Control::open(&root).unwrap();
    let dm = ctl.info(&DevId::Name(name)).unwrap().kernel_name();
    cmd::run("dmsetup", &["suspend", name]).unwrap();
    // Nothing of the map in the page cache (udev's probe read its start), and the loop
    // device reading it directly: the scan's reads reach the suspended map.
    cmd::run("blockdev", &["--flushbufs", &format!("/dev/{dm}")]).unwrap();

    // Bound at once; its partition scan then waits on the suspended map, holding the disk.
    let binding = std::process::Command::new("losetup")
        .args([
            "-f",
            "--show",
            "-P",
            "--direct-io=on",
            &format!("/dev/{dm}"),
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // losetup's own scan, or one udev's probe started by opening the new device first: the
    // scanner holds the disk's open mutex (`bdev_disk_changed` runs under it).
    let scanning = || in_kernel_function("bdev_disk_changed");
    let waited = support::wait::until_true(
        "a partition scan of the new loop device to wait on the map",
        Duration::from_secs(60),
        scanning,
    );
    // The loop device under the map: the map is its holder, a user found without any open
    // (an open of the suspended map would wait too), but the loop devices are asked first.
    let checked = waited.as_ref().ok().map(|()| {
        let under = under.trim_start_matches("/dev/");
        let node = lunkit::block::by_name(&root, under).unwrap().unwrap();
        let scope = lunkit::block::UsageScope {
            own: &[],
            ignore_openers: &[],
        };
        let deadline = Instant::now() + Duration::from_secs(3);
        lunkit::block::usage(&root, &[node], &scope, deadline)
    });

    cmd::run("dmsetup", &["resume", name]).unwrap();
    let bound = binding.wait_with_output().unwrap();
    let lo = String::from_utf8_lossy(&bound.stdout).trim().to_owned();
    cmd::run_ignoring_failure("losetup", &["-d", &lo]);
    cmd::run_ignoring_failure("dmsetup", &["remove", "--retry", name]);
    cmd::run_ignoring_failure("losetup", &["-d", &under]);
    let _ = std::fs::remove_file(file);

    waited.unwrap();
    let usage = checked.unwrap().expect("the check reports");
    assert_eq!(usage.holders, vec![dm], "{usage:?}");
    let lo_name = lo.trim_start_matches("/dev/");
    assert!(
        usage
            .unchecked
            .iter()
            .any(|u| u.what.contains(lo_name) && u.reason.contains("LOOP_GET_STATUS64")),
        "{usage:?}"
    );
}

/// Some task of the guest is in kernel function `name` (`/proc/PID/task/TID/stack`).
fn in_kernel_function(name: &str) -> bool {
    let tasks = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|p| {
            p.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .flat_map(|p| {
            std::fs::read_dir(p.path().join("task"))
                .into_iter()
                .flatten()
                .flatten()
        });
    tasks
        .into_iter()
        .any(|t| std::fs::read_to_string(t.path().join("stack")).is_ok_and(|s| s.contains(name)))
}

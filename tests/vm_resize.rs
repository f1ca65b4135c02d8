//! VM tests for online resize (issue 16): an LIO LUN on a growable backstore (iblock on a
//! loop device, `lio_grow`) behind two iSCSI portals, a 2-path multipath map over it, grown
//! under a mounted ext4 with and without multipathd; the refusals; a size the array never
//! reached.
//!
//! Run by `cargo xtask test` inside the QEMU guest (ignored on the host).

// The tests run the lunkit CLI, mkfs, mount, resize2fs and iscsiadm; the fixtures build the lab.
#![allow(clippy::disallowed_methods)]

use lunkit_lab as support;

use std::fs;
use std::io::Write;
use std::process::Output;
use std::time::Duration;

use serde_json::Value;
use support::cli::{describe, lunkit, random};
use support::iscsi::{self, Session};
use support::lio_grow::GrowTarget;
use support::multipath::{self, Map, Multipathd};
use support::{cmd, require_vm, sysfs, udev};

const IQN: &str = "iqn.2003-01.org.linux-iscsi.lunkit:grow";
const PORTALS: [&str; 2] = ["127.0.0.1:3260", "127.0.0.2:3260"];
const MIB: u64 = 1 << 20;
const MOUNT: &str = "/run/lunkit-resize-mnt";

/// `lunkit resize <args> --json`: exit code and document.
fn resize(args: &[&str]) -> (Option<i32>, Value, Output) {
    let mut all = vec!["resize", "--json"];
    all.extend_from_slice(args);
    let out = lunkit(&all);
    let doc = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("resize {args:?}: no JSON ({e}): {}", describe(&out)));
    (out.status.code(), doc, out)
}

/// A block device's size in bytes, from sysfs.
fn size(name: &str) -> u64 {
    sysfs::attr(format!("/sys/class/block/{name}/size"))
        .and_then(|s| s.parse::<u64>().ok())
        .map(|s| s * 512)
        .unwrap_or_else(|| panic!("no size for {name}"))
}

/// The growable target, two manual-scan sessions with LUN 0 scanned on both, and a map over
/// them built by multipathd. Dropping it tears everything down (unmount, maps, sessions,
/// iscsid if it started it, target).
struct Lab {
    target: Option<GrowTarget>,
    sessions: Vec<Session>,
    disks: Vec<String>,
    map: Map,
    multipathd: Option<Multipathd>,
    started_iscsid: bool,
}

impl Lab {
    fn build(size: u64) -> Lab {
        let target = GrowTarget::create(IQN, &PORTALS, size).expect("create the growable target");
        let started_iscsid = iscsi::ensure_iscsid().expect("iscsid");
        let mut lab = Lab {
            target: Some(target),
            sessions: Vec::new(),
            disks: Vec::new(),
            map: Map {
                name: String::new(),
                dm: String::new(),
                uuid: String::new(),
                paths: Vec::new(),
            },
            multipathd: None,
            started_iscsid,
        };
        for portal in PORTALS {
            iscsi::discover(portal).expect("discovery");
            lab.sessions.push(iscsi::login(IQN, portal).expect("login"));
        }
        for s in &lab.sessions {
            lab.disks.push(iscsi::scan_lun(s, 0).expect("scan LUN 0"));
        }
        lab.disks.sort();
        lab.multipathd = Some(Multipathd::start(multipath::DEFAULT_CONF).expect("multipathd"));
        lab.map = multipath::wait_maps(1, 2).expect("the map with both paths")[0].clone();
        udev::settle(Duration::from_secs(30)).expect("udev settle");
        lab
    }

    fn target(&self) -> &GrowTarget {
        self.target.as_ref().expect("the target lives until drop")
    }

    fn mapper(&self) -> String {
        format!("/dev/mapper/{}", self.map.name)
    }

    /// Stops multipathd and leaves its map in place: a node without the daemon.
    fn stop_multipathd_keeping_the_map(&mut self) {
        let mpd = self.multipathd.take().expect("multipathd runs");
        mpd.stop_keeping_maps().expect("multipathd exits");
        assert!(
            fs::metadata(self.mapper()).is_ok(),
            "{} went away with multipathd",
            self.mapper()
        );
    }

    /// Every device's size: the map's, then the paths'.
    fn sizes(&self) -> (u64, Vec<u64>) {
        (
            size(&self.map.dm),
            self.disks.iter().map(|d| size(d)).collect(),
        )
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        cmd::run_ignoring_failure("umount", &[MOUNT]);
        let _ = fs::remove_dir(MOUNT);
        match self.multipathd.take() {
            Some(mpd) => {
                let _ = mpd.stop();
            }
            None => {
                let _ = multipath::flush_all();
            }
        }
        iscsi::logout_all();
        if self.started_iscsid {
            let _ = iscsi::stop_iscsid();
        }
        if let Some(t) = self.target.take() {
            let _ = t.teardown();
        }
    }
}

/// Blocks of the filesystem mounted at `dir`, in bytes (`statfs`).
fn fs_bytes(dir: &str) -> u64 {
    let out = cmd::run("stat", &["-f", "-c", "%b %S", dir]).expect("stat -f");
    let mut it = out.split_whitespace().map(|v| v.parse::<u64>().unwrap());
    it.next().unwrap() * it.next().unwrap()
}

/// ext4 on the map, mounted, with 8 MiB of data written and synced; returns the data.
fn mount_with_data(lab: &Lab) -> Vec<u8> {
    cmd::run("mkfs.ext4", &["-q", "-F", &lab.mapper()]).expect("mkfs.ext4");
    fs::create_dir_all(MOUNT).unwrap();
    cmd::run("mount", &[&lab.mapper(), MOUNT]).expect("mount");
    let data = random(8 << 20, 16);
    let mut f = fs::File::create(format!("{MOUNT}/data")).unwrap();
    f.write_all(&data).unwrap();
    f.sync_all().unwrap();
    data
}

/// Grows the LUN from 64 to 128 MiB under a mounted ext4 and resizes, then to 160 MiB and
/// again, grows the filesystem and checks the data; then resizes again (nothing changes) and with the size already reached
/// (nothing is rescanned).
fn grow_online(with_multipathd: bool) {
    require_vm();
    let mut lab = Lab::build(64 * MIB);
    let data = mount_with_data(&lab);
    let fs_before = fs_bytes(MOUNT);
    if !with_multipathd {
        lab.stop_multipathd_keeping_the_map();
    }
    lab.target().grow(128 * MIB).expect("grow the LUN");
    // Nothing on the initiator knows yet: the paths learn it from their rescan.
    assert_eq!(lab.sizes(), (64 * MIB, vec![64 * MIB; 2]));

    let want = (128 * MIB).to_string();
    let (code, doc, out) = resize(&[&lab.mapper(), "--expect-size", &want]);
    assert_eq!(code, Some(0), "resize: {}", describe(&out));
    let r = &doc["result"];
    let by = if with_multipathd {
        "multipathd"
    } else {
        "table-reload"
    };
    assert_eq!(r["map"]["by"], by, "{doc}");
    assert_eq!(r["map"]["before"], 64 * MIB, "{doc}");
    assert_eq!(r["map"]["after"], 128 * MIB, "{doc}");
    assert_eq!(r["changed"], true, "{doc}");
    let paths = r["paths"].as_array().expect("paths");
    assert_eq!(paths.len(), 2, "{doc}");
    for p in paths {
        assert_eq!(p["before"], 64 * MIB, "{doc}");
        assert_eq!(p["after"], 128 * MIB, "{doc}");
    }
    // What the kernel says, not only what lunkit reports.
    assert_eq!(lab.sizes(), (128 * MIB, vec![128 * MIB; 2]));
    let table = cmd::run("dmsetup", &["table", &lab.map.name]).expect("dmsetup table");
    assert!(
        table.starts_with(&format!("0 {} multipath ", 128 * MIB / 512)),
        "{table}"
    );
    assert!(
        multipath::maps()
            .iter()
            .any(|m| m.name == lab.map.name && m.paths == lab.disks),
        "the map lost a path: {:?}",
        multipath::maps()
    );

    // Grown again on the array; the text output, as an operator sees it.
    lab.target().grow(160 * MIB).expect("grow the LUN again");
    let out = lunkit(&["resize", &lab.mapper()]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("lunkit resize {}:\n{text}", lab.mapper());
    let map_line = format!("{} ({})", lab.map.name, lab.map.dm);
    assert!(
        text.lines().any(|l| l.starts_with(&map_line)
            && l.ends_with(&format!("-> {:>16} bytes ({by})", 160 * MIB))),
        "{text}"
    );
    assert_eq!(lab.sizes(), (160 * MIB, vec![160 * MIB; 2]));

    cmd::run("resize2fs", &[&lab.mapper()]).expect("resize2fs");
    let fs_after = fs_bytes(MOUNT);
    assert!(
        fs_after > fs_before + 80 * MIB,
        "the filesystem did not grow: {fs_before} -> {fs_after} bytes"
    );
    fs::write("/proc/sys/vm/drop_caches", "3").unwrap();
    assert!(
        fs::read(format!("{MOUNT}/data")).unwrap() == data,
        "the data written before the resize differs"
    );

    // Again, the array unchanged: the paths are rescanned, nothing changes.
    let (code, doc, out) = resize(&[&lab.mapper()]);
    assert_eq!(code, Some(0), "second resize: {}", describe(&out));
    assert_eq!(doc["result"]["changed"], false, "{doc}");
    assert_eq!(doc["result"]["rescanned"], true, "{doc}");
    assert_eq!(doc["result"]["map"]["by"], "unchanged", "{doc}");
    // The size already reached (exactly, or more than asked for): nothing is written.
    for want in [160 * MIB, 128 * MIB] {
        let (code, doc, out) = resize(&[
            "--wwid",
            &lab.map.uuid["mpath-".len()..],
            "--expect-size",
            &want.to_string(),
        ]);
        assert_eq!(code, Some(0), "resize to {want}: {}", describe(&out));
        assert_eq!(doc["result"]["rescanned"], false, "{doc}");
        assert_eq!(doc["result"]["size"], 160 * MIB, "{doc}");
    }
    assert_eq!(lab.sizes(), (160 * MIB, vec![160 * MIB; 2]));
}

#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn a_mounted_volume_grows_online_through_multipathd() {
    grow_online(true);
}

#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn a_mounted_volume_grows_online_without_multipathd() {
    grow_online(false);
}

#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn a_path_down_or_a_shrunk_volume_is_refused_and_the_map_untouched() {
    require_vm();
    let lab = Lab::build(64 * MIB);
    lab.target().grow(96 * MIB).expect("grow the LUN");

    // One path offline: refused before anything is rescanned.
    let down = &lab.map.paths[0];
    let hctl = sysfs::resolve(format!("/sys/class/block/{down}/device"))
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .expect("the path's H:C:T:L");
    let state = format!("/sys/class/scsi_device/{hctl}/device/state");
    fs::write(&state, "offline\n").unwrap();
    let (code, doc, out) = resize(&[&lab.mapper()]);
    // Read before the path is set running again: the kernel rescans a device that comes
    // back from offline (`store_state_field`), and that path then learns the new size.
    let sizes = lab.sizes();
    fs::write(&state, "running\n").unwrap();
    assert_eq!(code, Some(1), "{}", describe(&out));
    let err = doc["error"].as_str().unwrap_or_default();
    assert!(err.contains(&hctl) && err.contains("offline"), "{err}");
    // Not even the running path was rescanned: it still reports the old size.
    assert_eq!(sizes, (64 * MIB, vec![64 * MIB; 2]));

    // The volume shrank on the array: the paths learn it, the map is never shrunk.
    lab.target().grow(32 * MIB).expect("shrink the LUN");
    let (code, doc, out) = resize(&[&lab.mapper()]);
    assert_eq!(code, Some(1), "{}", describe(&out));
    let err = doc["error"].as_str().unwrap_or_default();
    assert!(err.contains("shrank"), "{err}");
    let (map, paths) = lab.sizes();
    assert_eq!(map, 64 * MIB, "the map was shrunk");
    assert_eq!(paths, vec![32 * MIB; 2]);
    // Back to the map's size so that teardown's flush has a whole device under the map.
    lab.target().grow(64 * MIB).expect("grow the LUN back");
    let (code, _, out) = resize(&[&lab.mapper(), "--expect-size", &(64 * MIB).to_string()]);
    assert_eq!(code, Some(0), "{}", describe(&out));
}

#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn an_expected_size_the_array_never_reached_fails_at_the_deadline_naming_each_path() {
    require_vm();
    let lab = Lab::build(64 * MIB);
    let want = (128 * MIB).to_string();
    // 10 s, not 3: on a slow host the rescan of both paths alone took 2.9 s of 3, and the
    // deadline then passed in the rescan, not in the wait for the size this test is about.
    let (code, doc, out) = resize(&[&lab.mapper(), "--expect-size", &want, "--timeout", "10"]);
    assert_eq!(code, Some(5), "{}", describe(&out));
    let err = doc["error"].as_str().unwrap_or_default();
    for d in &lab.disks {
        assert!(err.contains(&format!("({d}) {} bytes", 64 * MIB)), "{err}");
    }
    assert_eq!(lab.sizes(), (64 * MIB, vec![64 * MIB; 2]));
}

/// A dm device made with `dmsetup create`, resumed and removed on drop.
struct Dm(String);

impl Dm {
    fn create(name: &str, uuid: Option<&str>, table: &str) -> Dm {
        let mut args = vec!["create", name, "--table", table];
        if let Some(u) = uuid {
            args.extend(["--uuid", u]);
        }
        cmd::run("dmsetup", &args).expect("dmsetup create");
        Dm(name.to_owned())
    }

    /// `MAJ:MIN`.
    fn number(&self) -> String {
        let out = cmd::run(
            "dmsetup",
            &["info", "-c", "--noheadings", "-o", "major,minor", &self.0],
        );
        out.expect("dmsetup info").trim().to_owned()
    }

    fn kernel_name(&self) -> String {
        let minor = self.number().rsplit_once(':').unwrap().1.to_owned();
        format!("dm-{minor}")
    }
}

impl Drop for Dm {
    fn drop(&mut self) {
        cmd::run_ignoring_failure("dmsetup", &["resume", &self.0]);
        cmd::run_ignoring_failure("dmsetup", &["remove", "--retry", &self.0]);
    }
}

/// A loop device over a new file of `bytes` in /tmp, detached (and the file removed) on drop.
struct Loop {
    dev: String,
    file: String,
}

impl Loop {
    fn new(tag: &str, bytes: u64) -> Loop {
        cmd::run("modprobe", &["loop"]).expect("modprobe loop");
        let file = format!("/tmp/lunkit-{tag}.img");
        fs::File::create(&file).unwrap().set_len(bytes).unwrap();
        let dev = cmd::run("losetup", &["-f", "--show", &file]).expect("losetup");
        Loop {
            dev: dev.trim().to_owned(),
            file,
        }
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        cmd::run_ignoring_failure("losetup", &["-d", &self.dev]);
        let _ = fs::remove_file(&self.file);
    }
}

/// Without multipathd, a grow loads the new table before it suspends, and suspends without
/// flushing or freezing; a suspend that waits for I/O in flight on a path past the deadline
/// is `Timeout`, with the grown table withdrawn, and the map comes back with its old table
/// once that I/O completes. The path is a linear map the test suspends, so the read sent
/// through the map stays in flight on it for as long as the test wants (a bio-based
/// multipath map, whose I/O to the path is in flight until the path completes it).
#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn a_grow_whose_suspend_waits_on_a_path_times_out_and_keeps_the_old_table() {
    use lunkit::dm::{Control, DevId};
    use lunkit::multipath::{GrownBy, grow};
    use lunkit::{ErrorKind, Root};
    use std::time::Instant;

    require_vm();
    cmd::run("modprobe", &["dm_multipath"]).expect("modprobe dm_multipath");
    let lo = Loop::new("grow-stuck", 16 * MIB);
    let path = Dm::create(
        "lunkit-stuck-path",
        None,
        &format!("0 {} linear {} 0", 16 * MIB / 512, lo.dev),
    );
    let table = format!(
        "0 {} multipath 2 queue_mode bio 0 1 1 round-robin 0 1 1 {} 1",
        8 * MIB / 512,
        path.number()
    );
    let map = Dm::create("lunkit-stuck", Some("mpath-lunkit-stuck"), &table);
    let node = format!("/dev/{}", map.kernel_name());
    let root = Root::default();
    let ctl = Control::open(&root).unwrap();
    let id = DevId::Name("lunkit-stuck");
    let live_sectors = |ctl: &Control| ctl.table(&id).unwrap()[0].length;

    // A read through the map, held on the suspended path.
    cmd::run("dmsetup", &["suspend", &path.0]).expect("suspend the path");
    let reader = support::child::Running::spawn(std::process::Command::new("dd").args([
        &format!("if={node}"),
        "of=/dev/null",
        "bs=4096",
        "count=1",
        "iflag=direct",
    ]))
    .unwrap();
    let inflight = format!("/sys/block/{}/inflight", map.kernel_name());
    support::wait::until_true(
        "the read to be in flight on the map",
        Duration::from_secs(60),
        || sysfs::attr(&inflight).is_some_and(|s| s.split_whitespace().any(|n| n != "0")),
    )
    .unwrap();

    let deadline = Instant::now() + Duration::from_secs(2);
    let err = grow(&root, "lunkit-stuck", 16 * MIB, false, deadline).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    assert!(err.to_string().contains("lunkit-stuck"), "{err}");
    // Still waiting in its suspend: the old table is live, and no grown one waits for it.
    let info = ctl.info(&id).unwrap();
    assert!(!info.inactive_table(), "the grown table was left loaded");
    assert_eq!(live_sectors(&ctl), 8 * MIB / 512);

    // The path completes the read: the suspend returns and the map resumes, old table.
    cmd::run("dmsetup", &["resume", &path.0]).expect("resume the path");
    let read = reader.wait(Duration::from_secs(60));
    assert_eq!(read.code(), Some(0), "{}", read.describe());
    // A grow now waits for that suspend's thread (one per map), and then grows.
    let by = grow(
        &root,
        "lunkit-stuck",
        16 * MIB,
        false,
        Instant::now() + Duration::from_secs(60),
    );
    assert_eq!(by.unwrap(), GrownBy::TableReload);
    let info = ctl.info(&id).unwrap();
    assert!(!info.suspended() && !info.inactive_table(), "{info:?}");
    assert_eq!(live_sectors(&ctl), 16 * MIB / 512);
    assert_eq!(size(&map.kernel_name()), 16 * MIB);
}

//! Path safety on the host (issue 7): names and addresses that could lead out of sysfs are
//! rejected with `Error::Invalid` before any file is opened, and in a `Root::new(dir)` tree a
//! symlink that points outside `dir` is not followed out of it.
//!
//! "Before any file is opened" is shown by asking against a root that does not exist, or one
//! where the file the bad name would reach does exist: either way the answer must be
//! `Invalid`, not `NotFound`, `Ok(None)` or a device.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::time::Duration;

use lunkit::block::sysfs as block;
use lunkit::dm::DevId;
use lunkit::dm::buffer::{Request, check_name, check_uuid, write_request};
use lunkit::fc::sysfs as fc;
use lunkit::id::IscsiName;
use lunkit::iscsi::IscsiLun;
use lunkit::iscsi::sysfs as iscsi;
use lunkit::nvme::sysfs as nvme;
use lunkit::scsi::sysfs as scsi;
use lunkit::{Error, Hctl, Root, ScanOptions, Topology, Wwid, Wwn};

mod common;
use common::{Scratch, copy_fixture};

// ---------------------------------------------------------------------------------------
// Scratch trees
// ---------------------------------------------------------------------------------------

/// What a reader would find if it followed a link out of the root: every attribute any
/// sysfs reader reads, with values no fixture has.
const MARK: &str = "ESCAPED-FROM-ROOT";

fn write_outside_device(dir: &Path) {
    fs::create_dir_all(dir.join("holders/dm-99")).unwrap();
    fs::create_dir_all(dir.join("slaves/sdq")).unwrap();
    fs::create_dir_all(dir.join("block/sdq")).unwrap();
    fs::create_dir_all(dir.join("nvme9n1")).unwrap();
    for (name, value) in [
        ("dev", "3917:39170"),
        ("size", "4242"),
        ("ro", "1"),
        ("proc_name", MARK),
        ("state", MARK),
        ("vendor", MARK),
        ("model", MARK),
        ("wwid", "naa.0bad0bad0bad0bad"),
        ("port_name", "0x0bad0bad0bad0bad"),
        ("node_name", "0x0bad0bad0bad0bad"),
        ("port_state", "Online"),
        ("roles", "FCP Target"),
        ("scsi_target_id", "0"),
        ("targetname", MARK),
        ("target_id", "0"),
        ("transport", MARK),
        ("scan", ""),
    ] {
        fs::write(dir.join(name), format!("{value}\n")).unwrap();
    }
    fs::write(dir.join("block/sdq/dev"), "3917:39171\n").unwrap();
    fs::create_dir_all(dir.join("device")).unwrap();
    fs::write(dir.join("device/vendor"), format!("{MARK}\n")).unwrap();
}

/// A scratch copy of `fixture` at `<scratch>/root`, and a directory at `<scratch>/outside`
/// that looks like a device to any reader that gets there.
fn tree_with_outside(fixture: &str, tag: &str) -> (Scratch, PathBuf, PathBuf) {
    let s = Scratch::new(tag);
    let root = s.path().join("root");
    let outside = s.path().join("outside");
    copy_fixture(fixture, &root);
    write_outside_device(&outside);
    (s, root, outside)
}

/// Links `root/<rel>` to the outside directory twice over: by absolute path, and by a
/// relative path that climbs out of the root with `..`.
fn link_out(root: &Path, outside: &Path, class_dir: &str, abs_name: &str, rel_name: &str) {
    let dir = root.join(class_dir);
    fs::create_dir_all(&dir).unwrap();
    symlink(outside, dir.join(abs_name)).unwrap();
    // From root/<class_dir>/, one `..` per component gets back to root, one more leaves it.
    let depth = Path::new(class_dir).components().count() + 1;
    let up = "../".repeat(depth);
    symlink(format!("{up}outside"), dir.join(rel_name)).unwrap();
    // Both really do lead outside, so the readers below are being tested, not the setup.
    for name in [abs_name, rel_name] {
        assert_eq!(
            fs::canonicalize(dir.join(name)).unwrap(),
            fs::canonicalize(outside).unwrap()
        );
    }
}

fn assert_invalid<T: std::fmt::Debug>(r: lunkit::Result<T>, what: &str) {
    match r {
        Err(Error::Invalid { .. }) => {}
        other => panic!("{what:?}: expected Error::Invalid, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------
// Names and addresses
// ---------------------------------------------------------------------------------------

/// Names that are not one plain path component.
fn bad_names() -> Vec<String> {
    vec![
        String::new(),
        ".".into(),
        "..".into(),
        "../sda".into(),
        "sda/..".into(),
        "sda/../../../etc".into(),
        "/etc/passwd".into(),
        "sd/a".into(),
        "sda\0".into(),
        "a\0/../b".into(),
        "x".repeat(256),
        "é".repeat(128),
    ]
}

#[test]
fn block_device_names_with_path_tricks_are_invalid() {
    let nowhere = Root::new("/nonexistent/lunkit-path-safety");
    for name in bad_names() {
        assert_invalid(block::device(&nowhere, &name), &name);
    }
    // The check comes before the lookup: `sys/block/../evil` exists here, and is still refused.
    let s = Scratch::new("blockname");
    fs::create_dir_all(s.path().join("sys/block")).unwrap();
    fs::create_dir_all(s.path().join("sys/evil")).unwrap();
    fs::write(s.path().join("sys/evil/dev"), "8:0\n").unwrap();
    let root = Root::new(s.path());
    assert_invalid(block::device(&root, "../evil"), "../evil");
    // Plain names up to NAME_MAX are names; they just are not there.
    assert_eq!(block::device(&root, &"x".repeat(255)).unwrap(), None);
    assert_eq!(block::device(&root, "sda").unwrap(), None);
    assert_eq!(block::device(&root, "..sda").unwrap(), None);
}

#[test]
fn hctl_out_of_range_or_malformed_is_invalid() {
    for bad in [
        "",
        ":::",
        "1:2:3",
        "1:2:3:4:5",
        "4294967296:0:0:0",
        "0:4294967296:0:0",
        "0:0:4294967296:0",
        "0:0:0:18446744073709551616",
        "99999999999999999999999:0:0:0",
        "-1:0:0:0",
        "0:-0:0:0",
        "+1:0:0:0",
        "0x1:0:0:0",
        "1e3:0:0:0",
        " 1:2:3:4",
        "1:2:3:4 ",
        "1 :2:3:4",
        "1:2:3:4\n",
        "1:2:3:4\0",
        "1:2:3:4/../5",
        "1:2:3:..",
        "\u{ff11}:2:3:4",
        "1:2:3:4:",
    ] {
        match bad.parse::<Hctl>() {
            Err(Error::Invalid { kind, .. }) => assert_eq!(kind, "H:C:T:L", "{bad:?}"),
            other => panic!("{bad:?}: expected Error::Invalid, got {other:?}"),
        }
    }
    let max = "4294967295:4294967295:4294967295:18446744073709551615";
    assert_eq!(max.parse::<Hctl>().unwrap().to_string(), max);
}

#[test]
fn wwids_and_wwns_that_could_name_paths_are_invalid() {
    for bad in [
        "../../etc/passwd",
        "naa.60014/05",
        "t10./../x",
        "36001405\n",
        "3600\0",
        "naa.6001405abc\t",
    ] {
        assert_invalid(bad.parse::<Wwid>(), bad);
    }
    assert_invalid("x".repeat(260).parse::<Wwid>(), "260 bytes");
    for bad in [
        "50:01:43:80:02:a3:c4:d6/",
        "../5001438002a3c4d6",
        "5001438002a3c4d6\0",
        " 0x5001438002a3c4d6",
        "0x5001438002a3c4d6\n",
    ] {
        assert_invalid(bad.parse::<Wwn>(), bad);
    }
}

#[test]
fn device_mapper_names_with_path_tricks_are_invalid() {
    for name in bad_names() {
        assert_invalid(check_name(&name), &name);
    }
    assert_invalid(check_name(&"m".repeat(128)), "128 bytes");
    check_name(&"m".repeat(127)).unwrap();
    assert_invalid(check_uuid(""), "empty uuid");
    assert_invalid(check_uuid("mpath-36001405\0"), "uuid with NUL");
    assert_invalid(check_uuid(&"u".repeat(129)), "129-byte uuid");
    // A request naming a bad map is refused while it is built, before any ioctl.
    let mut buf = vec![0u8; 16 * 1024];
    for name in ["a/b", "..", "mpath\0a"] {
        let req = Request {
            id: Some(DevId::Name(name)),
            ..Request::default()
        };
        assert_invalid(write_request(&mut buf, &req), name);
    }
}

#[test]
fn iscsi_target_names_with_path_tricks_are_invalid_before_sysfs_is_read() {
    let nowhere = Root::new("/nonexistent/lunkit-path-safety");
    let mut opts = ScanOptions::default();
    opts.timeout = Duration::from_millis(10);
    let long = format!("iqn.2003-01.org.example:{}", "x".repeat(200));
    for bad in [
        "",
        "iqn.2003-01.org.example/../x",
        "../../etc",
        "iqn.2003-01.org.example: x",
        "iqn.2003-01.org.example:\0",
        long.as_str(),
    ] {
        assert_invalid(lunkit::iscsi::check_target_name(bad), bad);
        // A scan takes an IscsiName: the name is refused where it is parsed, so no scan
        // can be asked with it.
        assert_invalid(bad.parse::<IscsiName>(), bad);
    }
    // A good name gets past the check and then finds no sysfs at all.
    let err = lunkit::iscsi::scan(
        &nowhere,
        &IscsiLun::new("iqn.2003-01.org.example:x".parse().unwrap(), 0),
        &opts,
    )
    .unwrap_err();
    assert!(matches!(err, Error::NotFound { .. }), "{err}");
}

#[test]
fn scan_of_the_largest_address_is_not_found_and_writes_nothing() {
    let s = Scratch::new("maxscan");
    copy_fixture("fc", s.path());
    let before = list_tree(s.path());
    let mut opts = ScanOptions::default();
    opts.timeout = Duration::from_millis(10);
    let max = Hctl::new(u32::MAX, u32::MAX, u32::MAX, u64::MAX);
    let err = lunkit::scsi::scan(&Root::new(s.path()), max, &opts).unwrap_err();
    assert!(matches!(err, Error::NotFound { .. }), "{err}");
    assert!(err.to_string().contains("host4294967295"), "{err}");
    assert_eq!(list_tree(s.path()), before, "the scan created no file");
}

fn list_tree(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            out.push(e.path());
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            }
        }
    }
    out.sort();
    out
}

// ---------------------------------------------------------------------------------------
// Symlinks out of the root
// ---------------------------------------------------------------------------------------

#[test]
fn class_entries_leading_outside_the_root_are_not_read() {
    for fixture in ["fc", "iscsi-multipath"] {
        let (_s, root_dir, outside) = tree_with_outside(fixture, &format!("class-{fixture}"));
        for (class, abs, rel) in [
            ("sys/block", "sdz", "sdy"),
            ("sys/class/scsi_host", "host42", "host43"),
            ("sys/class/scsi_device", "42:0:0:0", "43:0:0:0"),
            ("sys/class/fc_host", "host42", "host43"),
            ("sys/class/fc_remote_ports", "rport-42:0-0", "rport-43:0-0"),
            ("sys/class/iscsi_session", "session42", "session43"),
            (
                "sys/class/iscsi_connection",
                "connection1:9",
                "connection2:9",
            ),
            ("sys/class/nvme", "nvme42", "nvme43"),
        ] {
            link_out(&root_dir, &outside, class, abs, rel);
        }
        let root = Root::new(&root_dir);
        let topo = Topology::read(&root).unwrap();
        let shown = format!("{topo:?}");
        assert!(
            !shown.contains(MARK),
            "{fixture}: read outside the root: {shown}"
        );
        assert!(
            !shown.contains("39170"),
            "{fixture}: outside dev numbers: {shown}"
        );
        assert!(
            !topo
                .block_devices
                .iter()
                .any(|b| b.name == "sdz" || b.name == "sdy"),
            "{fixture}"
        );
        assert!(!topo.scsi_hosts.iter().any(|h| h.number >= 42), "{fixture}");
        assert!(!topo.scsi_devices.iter().any(|d| d.hctl.host >= 42));
        assert!(!topo.fc_hosts.iter().any(|h| h.host >= 42));
        assert!(!topo.fc_rports.iter().any(|r| r.host >= 42));
        assert!(!topo.iscsi_sessions.iter().any(|s| s.sid >= 42));
        assert!(
            topo.iscsi_sessions
                .iter()
                .flat_map(|s| &s.connections)
                .all(|c| !c.name.ends_with(":9"))
        );
        assert!(topo.nvme_controllers.is_empty());

        // Asked for by name, an escaping entry is simply not there.
        assert_eq!(block::device(&root, "sdz").unwrap(), None);
        assert_eq!(block::device(&root, "sdy").unwrap(), None);
        assert_eq!(scsi::device(&root, Hctl::new(42, 0, 0, 0)).unwrap(), None);
        assert_eq!(scsi::device(&root, Hctl::new(43, 0, 0, 0)).unwrap(), None);
        // The individual readers agree with the topology.
        assert!(scsi::hosts(&root).unwrap().iter().all(|h| h.number < 42));
        assert!(fc::hosts(&root).unwrap().iter().all(|h| h.host < 42));
        assert!(fc::remote_ports(&root).unwrap().iter().all(|r| r.host < 42));
        assert!(iscsi::sessions(&root).unwrap().iter().all(|s| s.sid < 42));
        assert!(nvme::controllers(&root).unwrap().is_empty());
    }
}

#[test]
fn links_inside_a_device_leading_outside_are_not_followed() {
    let (_s, root_dir, outside) = tree_with_outside("fc", "attrs");
    let root = Root::new(&root_dir);
    let sdc = fs::canonicalize(root_dir.join("sys/block/sdc")).unwrap();
    let before = block::device(&root, "sdc").unwrap().unwrap();
    assert_eq!(before.size_bytes, Some(20971520 * 512));
    assert_eq!(before.holders, ["dm-0"]);

    // An attribute that is a link out of the root, a `holders/` that is one, and a `dm/`.
    fs::remove_file(sdc.join("size")).unwrap();
    symlink(outside.join("size"), sdc.join("size")).unwrap();
    fs::remove_file(sdc.join("ro")).unwrap();
    symlink(
        "../".repeat(20) + outside.to_str().unwrap() + "/ro",
        sdc.join("ro"),
    )
    .unwrap();
    fs::remove_dir_all(sdc.join("holders")).unwrap();
    symlink(outside.join("holders"), sdc.join("holders")).unwrap();
    symlink(&outside, sdc.join("dm")).unwrap();
    // A "partition" that is a link to a directory with a `partition` file, beside a real one.
    fs::write(outside.join("partition"), "1\n").unwrap();
    symlink(&outside, sdc.join("sdc1")).unwrap();
    fs::create_dir(sdc.join("sdc2")).unwrap();
    fs::write(sdc.join("sdc2/partition"), "2\n").unwrap();

    let after = block::device(&root, "sdc").unwrap().unwrap();
    assert_eq!(after.size_bytes, None, "size is a link out of the root");
    assert_eq!(after.read_only, None, "ro is a link out of the root");
    assert!(after.holders.is_empty(), "{:?}", after.holders);
    assert_eq!(after.dm, None);
    assert_eq!(after.partitions, ["sdc2"]);
    assert_eq!(after.dev, before.dev, "the rest of the device still reads");

    // A SCSI device's `block/` that leads out of the root names no disk.
    let dev_dir = fs::canonicalize(root_dir.join("sys/class/scsi_device/5:0:0:0/device")).unwrap();
    fs::remove_dir_all(dev_dir.join("block")).unwrap();
    symlink(outside.join("block"), dev_dir.join("block")).unwrap();
    fs::remove_file(dev_dir.join("vendor")).unwrap();
    symlink(outside.join("vendor"), dev_dir.join("vendor")).unwrap();
    let d = scsi::device(&root, Hctl::new(5, 0, 0, 0)).unwrap().unwrap();
    assert_eq!(d.block, None);
    assert_eq!(d.vendor, None);
    assert_eq!(d.state.as_deref(), Some("running"));
}

#[test]
fn a_root_reached_through_a_symlink_still_reads_its_own_tree() {
    let s = Scratch::new("rootlink");
    copy_fixture("fc", &s.path().join("real"));
    symlink(s.path().join("real"), s.path().join("link")).unwrap();
    let direct = Topology::read(&Root::new(s.path().join("real"))).unwrap();
    let linked = Topology::read(&Root::new(s.path().join("link"))).unwrap();
    assert_eq!(direct, linked);
    assert_eq!(linked.scsi_devices.len(), 2);
    assert_eq!(linked.block_devices.len(), 4);
}

#[test]
fn scan_does_not_write_through_an_attribute_link_leading_outside() {
    let (_s, root_dir, outside) = tree_with_outside("fc", "scanattr");
    let scan = root_dir.join("sys/class/scsi_host/host5/scan");
    fs::remove_file(&scan).unwrap();
    symlink(outside.join("scan"), &scan).unwrap();
    let mut opts = ScanOptions::default();
    opts.timeout = Duration::from_millis(10);
    let err = lunkit::scsi::scan(&Root::new(&root_dir), Hctl::new(5, 0, 0, 3), &opts).unwrap_err();
    assert!(
        matches!(err, Error::Io { ref path, .. } if path.ends_with("host5/scan")),
        "{err:?}"
    );
    assert_eq!(fs::read_to_string(outside.join("scan")).unwrap(), "\n");
}

/// The scan writes `hostN/scan` below `class/scsi_host/hostN`, a symlink in real sysfs; when
/// that link leads out of the root the write must not follow it: `src/scsi/add.rs` confines the host
/// directory as the sysfs readers do.
#[test]
fn scan_does_not_write_through_a_host_link_leading_outside() {
    let (_s, root_dir, outside) = tree_with_outside("fc", "scanhost");
    link_out(
        &root_dir,
        &outside,
        "sys/class/scsi_host",
        "host42",
        "host43",
    );
    let mut opts = ScanOptions::default();
    opts.timeout = Duration::from_millis(10);
    for host in [42, 43] {
        let r = lunkit::scsi::scan(&Root::new(&root_dir), Hctl::new(host, 0, 0, 3), &opts);
        assert!(r.is_err());
        assert_eq!(fs::read_to_string(outside.join("scan")).unwrap(), "\n");
    }
}

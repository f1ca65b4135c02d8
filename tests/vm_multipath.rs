//! VM tests for `lunkit multipath remove` (issue 4) on maps that multipathd built from two
//! iSCSI sessions: removal through multipathd that stays removed, every way to name a map,
//! a mounted filesystem and an open fd (refused, map and data untouched), deferred removal,
//! and a map that does not exist. All through the CLI, checking exit codes.
//!
//! Run by `cargo xtask test` inside the QEMU guest (ignored on the host).

// The tests run the lunkit CLI, mkfs and mount; the fixtures build the lab with real tools.
#![allow(clippy::disallowed_methods)]

use lunkit_lab as support;

use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::cli::lunkit;
use support::lab::{IscsiLab, LabConfig};
use support::multipath::Map;
use support::{cmd, require_vm, sysfs, wait};

fn describe(o: &Output) -> String {
    format!(
        "exit {:?}; stdout: {}; stderr: {}; multipathd log:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout).trim(),
        String::from_utf8_lossy(&o.stderr).trim(),
        support::multipath::log()
    )
}

/// `lunkit multipath remove MAP --timeout 30 --json [extra...]`.
fn remove(map: &str, extra: &[&str]) -> Output {
    let mut args = vec!["multipath", "remove", map, "--timeout", "30", "--json"];
    args.extend_from_slice(extra);
    lunkit(&args)
}

/// A removal that must succeed: its JSON report.
fn remove_ok(map: &str, extra: &[&str]) -> Value {
    let t0 = Instant::now();
    let out = remove(map, extra);
    assert_eq!(
        out.status.code(),
        Some(0),
        "remove {map}: {}",
        describe(&out)
    );
    eprintln!("remove {map} {extra:?}: {:?}", t0.elapsed());
    serde_json::from_slice(&out.stdout).expect("JSON report")
}

/// A removal that must be refused with `code`.
fn remove_refused(map: &str, extra: &[&str], code: i32) -> String {
    let out = remove(map, extra);
    assert_eq!(
        out.status.code(),
        Some(code),
        "remove {map}: {}",
        describe(&out)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `dm-N` of every device-mapper device whose uuid is `uuid` (ground truth from sysfs).
fn dm_with_uuid(uuid: &str) -> Vec<String> {
    sysfs::names("/sys/block")
        .into_iter()
        .filter(|n| n.starts_with("dm-"))
        .filter(|n| sysfs::attr(format!("/sys/block/{n}/dm/uuid")).as_deref() == Some(uuid))
        .collect()
}

fn present(map: &Map) -> bool {
    !dm_with_uuid(&map.uuid).is_empty()
}

fn lab(luns: Vec<u32>) -> IscsiLab {
    let lab = IscsiLab::build(LabConfig {
        scan: luns.clone(),
        ..LabConfig::default()
    })
    .expect("build the iSCSI multipath lab");
    assert_eq!(lab.maps.len(), luns.len(), "{:?}", lab.maps);
    for m in &lab.maps {
        assert_eq!(m.paths.len(), 2, "{m:?}");
    }
    lab
}

/// Waits for `dm-N` to leave sysfs.
fn wait_gone(dm: &str, timeout: Duration) {
    let dir = format!("/sys/block/{dm}");
    wait::until_true(&format!("{dm} to disappear"), timeout, || {
        !Path::new(&dir).exists()
    })
    .unwrap_or_else(|e| panic!("{e}; multipathd log:\n{}", support::multipath::log()));
}

#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn multipath_remove_via_multipathd_stays_removed() {
    require_vm();
    let lab = lab(vec![0, 1, 2, 3]);
    // Four maps, four ways to name one: name, /dev/mapper/NAME, WWID, a path device.
    let m = &lab.maps;
    let mapper = format!("/dev/mapper/{}", m[1].name);
    wait::until_true(
        &format!("{mapper} from udev"),
        Duration::from_secs(20),
        || Path::new(&mapper).exists(),
    )
    .expect("udev links /dev/mapper/NAME");
    let wwid = m[2].uuid.strip_prefix("mpath-").unwrap().to_owned();
    let path_dev = format!("/dev/{}", m[3].paths[0]);
    let specs = [m[0].name.clone(), mapper, wwid, path_dev];
    for (map, spec) in m.iter().zip(&specs) {
        assert!(present(map), "{map:?}");
        let doc = remove_ok(spec, &[]);
        assert_eq!(doc["map"], map.name.as_str(), "{doc}");
        assert_eq!(doc["kernel_name"], map.dm.as_str(), "{doc}");
        assert_eq!(doc["outcome"], "removed", "{doc}");
        assert_eq!(doc["via_multipathd"], true, "{doc}");
        assert!(
            !present(map),
            "{map:?} still there: {:?}",
            dm_with_uuid(&map.uuid)
        );
        assert!(!Path::new(&format!("/sys/block/{}", map.dm)).exists());
    }
    // multipathd does not recreate them.
    std::thread::sleep(Duration::from_secs(5));
    for map in m {
        assert!(
            !present(map),
            "{} recreated as {:?}; multipathd log:\n{}",
            map.name,
            dm_with_uuid(&map.uuid),
            support::multipath::log()
        );
    }
    // Gone means "no such map" now, by name and by WWID.
    remove_refused(&m[0].name, &[], 3);
    remove_refused(m[2].uuid.strip_prefix("mpath-").unwrap(), &[], 3);
}

/// Unmounts on drop (declared after the lab, so it runs before the lab's teardown).
struct Mounted(String);

impl Drop for Mounted {
    fn drop(&mut self) {
        cmd::run_ignoring_failure("umount", &[&self.0]);
        let _ = std::fs::remove_dir(&self.0);
    }
}

#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn multipath_remove_refuses_mounted_filesystem() {
    require_vm();
    let lab = lab(vec![0]);
    let map = &lab.maps[0];
    let node = format!("/dev/{}", map.dm);
    cmd::run("mkfs.ext4", &["-q", "-F", &node]).expect("mkfs.ext4 on the map");
    let mnt = "/tmp/lunkit-mpath-mnt".to_owned();
    std::fs::create_dir_all(&mnt).unwrap();
    cmd::run("mount", &[&node, &mnt]).expect("mount the map");
    let mounted = Mounted(mnt.clone());
    let file = format!("{mnt}/data");
    let data = b"written before the refused removal\n";
    std::fs::write(&file, data).unwrap();
    cmd::run("sync", &[]).unwrap();

    let t0 = Instant::now();
    let err = remove_refused(&map.name, &[], 4);
    eprintln!("refused in {:?}: {}", t0.elapsed(), err.trim());
    assert!(err.contains(&mnt), "names the mount point: {err}");
    assert!(present(map), "map still there");
    assert_eq!(
        sysfs::attr(format!("/sys/block/{}/dm/suspended", map.dm)).as_deref(),
        Some("0")
    );
    assert_eq!(std::fs::read(&file).unwrap(), data);
    // Still writable: the map was not suspended or failed.
    std::fs::write(format!("{mnt}/after"), b"x").unwrap();
    cmd::run("sync", &[]).unwrap();

    // The data is on the map, not only in the page cache: read it back after a remount.
    cmd::run("umount", &[&mnt]).expect("umount");
    cmd::run("mount", &[&node, &mnt]).expect("mount the map again");
    assert_eq!(std::fs::read(&file).unwrap(), data);
    assert_eq!(std::fs::read(format!("{mnt}/after")).unwrap(), b"x");
    cmd::run("umount", &[&mnt]).expect("umount");
    drop(mounted);
    let doc = remove_ok(&map.name, &[]);
    assert_eq!(doc["outcome"], "removed", "{doc}");
    assert_eq!(doc["via_multipathd"], true, "{doc}");
    assert!(!present(map));
}

#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn multipath_remove_open_fd_refused_then_deferred() {
    require_vm();
    let lab = lab(vec![0]);
    let map = &lab.maps[0];
    let node = format!("/dev/{}", map.dm);
    let fd = std::fs::File::open(&node).expect("open the map");

    let err = remove_refused(&map.name, &[], 4);
    assert!(err.contains("open count"), "{err}");
    assert!(present(map), "map untouched");
    assert_eq!(
        sysfs::attr(format!("/sys/block/{}/dm/suspended", map.dm)).as_deref(),
        Some("0")
    );
    assert_eq!(
        sysfs::names(format!("/sys/block/{}/slaves", map.dm)),
        map.paths
    );

    let doc = remove_ok(&node, &["--deferred"]);
    assert_eq!(doc["outcome"], "deferred", "{doc}");
    // multipathd's flush cannot defer: the library marks the map itself.
    assert_eq!(doc["via_multipathd"], false, "{doc}");
    assert_eq!(doc["map"], map.name.as_str(), "{doc}");
    // Still there while the fd is open.
    std::thread::sleep(Duration::from_millis(500));
    assert!(present(map), "deferred: the map waits for its last close");
    // It keeps serving its holder meanwhile: not suspended (a suspended map would block every
    // opener, and its last close would never come) and still readable through the open fd.
    assert_eq!(
        sysfs::attr(format!("/sys/block/{}/dm/suspended", map.dm)).as_deref(),
        Some("0"),
        "a deferred map must not be left suspended"
    );
    {
        use std::io::Read;
        let mut first = [0u8; 4096];
        (&fd)
            .read_exact(&mut first)
            .expect("the holder can still read");
    }
    drop(fd);
    let t0 = Instant::now();
    wait_gone(&map.dm, Duration::from_secs(20));
    eprintln!("gone {:?} after the last close", t0.elapsed());
    assert!(!present(map));
}

#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn multipath_remove_unknown_map_exits_3() {
    require_vm();
    cmd::run("modprobe", &["dm_mod"]).expect("modprobe dm_mod");
    let err = remove_refused("lunkit-no-such-map", &[], 3);
    assert!(err.contains("lunkit-no-such-map"), "{err}");
    remove_refused("36001405000000000000000000000dead", &[], 3);
    remove_refused("dm-4095", &[], 3);
}

//! VM tests: `lunkit list --json` against ground truth read from sysfs with plain std::fs
//! (not through the lunkit library), on scsi_debug and on the iSCSI multipath lab.
//!
//! Run by `cargo xtask test` inside the QEMU guest (ignored on the host).

// The tests run the lunkit CLI; the fixtures build the lab with real tools.
#![allow(clippy::disallowed_methods)]

use lunkit_lab as support;

use std::collections::BTreeSet;
use std::process::Command;

use serde_json::Value;
use support::lab::{IscsiLab, LabConfig};
use support::scsi_debug::ScsiDebug;
use support::{iscsi, multipath, require_vm, sysfs};

/// `$LUNKIT_BIN list --json`, parsed, with its schema version checked.
fn lunkit_list() -> Value {
    let bin = std::env::var("LUNKIT_BIN").expect("LUNKIT_BIN is set by cargo xtask test");
    let out = Command::new(&bin)
        .args(["list", "--json"])
        .output()
        .expect("run lunkit");
    assert!(
        out.status.success(),
        "lunkit list --json failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_slice(&out.stdout).expect("lunkit list --json prints JSON");
    assert_eq!(doc["version"], 1, "schema version");
    doc
}

fn array<'a>(doc: &'a Value, key: &str) -> &'a Vec<Value> {
    doc[key]
        .as_array()
        .unwrap_or_else(|| panic!("{key} is not an array in {doc}"))
}

fn opt_str(v: &Value) -> Option<String> {
    v.as_str().map(str::to_owned)
}

/// What the tests compare per SCSI device: hctl, state, wwid, block, sg.
type DeviceRow = (
    String,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
);

/// What the tests compare per iSCSI session: sid, target, host, portal.
type SessionRow = (u64, Option<String>, Option<u64>, Option<String>);

fn devices_from_json(doc: &Value) -> Vec<DeviceRow> {
    array(doc, "scsi_devices")
        .iter()
        .map(|d| {
            (
                d["hctl"].as_str().expect("hctl is a string").to_owned(),
                opt_str(&d["state"]),
                opt_str(&d["wwid"]),
                opt_str(&d["block"]),
                opt_str(&d["sg"]),
            )
        })
        .collect()
}

fn devices_from_sysfs() -> Vec<DeviceRow> {
    sysfs::names("/sys/class/scsi_device")
        .into_iter()
        .map(|hctl| {
            let dev = format!("/sys/class/scsi_device/{hctl}/device");
            (
                hctl.clone(),
                sysfs::attr(format!("{dev}/state")),
                sysfs::attr(format!("{dev}/wwid")),
                sysfs::names(format!("{dev}/block")).into_iter().next(),
                sysfs::names(format!("{dev}/scsi_generic"))
                    .into_iter()
                    .next(),
            )
        })
        .collect()
}

fn hctl_key(hctl: &str) -> Vec<u64> {
    hctl.split(':')
        .map(|n| n.parse().expect("numeric H:C:T:L"))
        .collect()
}

/// Devices: same set as sysfs, and in numeric H:C:T:L order as the schema promises.
fn check_devices(doc: &Value) {
    let listed = devices_from_json(doc);
    let keys: Vec<Vec<u64>> = listed.iter().map(|d| hctl_key(&d.0)).collect();
    assert!(
        keys.is_sorted(),
        "scsi_devices not sorted by H:C:T:L: {listed:?}"
    );
    let listed: BTreeSet<DeviceRow> = listed.into_iter().collect();
    let truth: BTreeSet<DeviceRow> = devices_from_sysfs().into_iter().collect();
    assert_eq!(
        listed, truth,
        "scsi_devices (hctl, state, wwid, block, sg) differ from sysfs"
    );
}

/// Block devices: every disk sysfs has, with its dev_t, size and holders.
fn check_block_devices(doc: &Value, disks: &[String]) {
    let listed = array(doc, "block_devices");
    for disk in disks {
        let entry = listed
            .iter()
            .find(|b| b["name"] == disk.as_str())
            .unwrap_or_else(|| panic!("block device {disk} missing from {listed:?}"));
        let dev = sysfs::attr(format!("/sys/block/{disk}/dev")).expect("dev attribute");
        let (major, minor) = dev.split_once(':').expect("MAJ:MIN");
        assert_eq!(entry["major"].as_u64(), major.parse().ok(), "{disk} major");
        assert_eq!(entry["minor"].as_u64(), minor.parse().ok(), "{disk} minor");
        let sectors: u64 = sysfs::attr(format!("/sys/block/{disk}/size"))
            .expect("size")
            .parse()
            .expect("number");
        assert_eq!(
            entry["size_bytes"].as_u64(),
            Some(sectors * 512),
            "{disk} size"
        );
        let holders: Vec<&str> = entry["holders"]
            .as_array()
            .expect("holders")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert_eq!(
            holders,
            sysfs::names(format!("/sys/block/{disk}/holders")),
            "{disk} holders"
        );
    }
}

#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn list_scsi_debug_two_hosts_four_luns() {
    require_vm();
    let sd = ScsiDebug::load(
        &[("add_host", "2"), ("num_tgts", "1"), ("max_luns", "4")],
        8,
    )
    .expect("load scsi_debug");
    assert_eq!(sd.hosts.len(), 2, "scsi_debug hosts: {:?}", sd.hosts);
    assert_eq!(
        sd.devices().len(),
        8,
        "2 hosts x 4 LUNs: {:?}",
        sd.devices()
    );

    let doc = lunkit_list();
    let hosts = array(&doc, "scsi_hosts");
    let numbers: Vec<u64> = hosts.iter().filter_map(|h| h["host"].as_u64()).collect();
    assert!(numbers.is_sorted(), "scsi_hosts not sorted: {numbers:?}");
    let truth: Vec<u64> = sysfs::names("/sys/class/scsi_host")
        .iter()
        .filter_map(|h| sysfs::number_after(h, "host"))
        .map(u64::from)
        .collect();
    assert_eq!(
        numbers.iter().copied().collect::<BTreeSet<_>>(),
        truth.into_iter().collect(),
        "scsi_hosts"
    );
    for &h in &sd.hosts {
        let host = hosts
            .iter()
            .find(|x| x["host"] == h)
            .expect("scsi_debug host listed");
        assert_eq!(host["name"], format!("host{h}"));
        assert_eq!(host["proc_name"], "scsi_debug", "host{h}");
        assert_eq!(host["transport"], "other", "host{h}");
    }
    check_devices(&doc);
    check_block_devices(&doc, &sd.disks());
    assert!(
        array(&doc, "iscsi_sessions").is_empty(),
        "no iSCSI sessions expected"
    );
    sd.unload().expect("unload scsi_debug");
}

#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn list_iscsi_two_portals_with_multipath() {
    require_vm();
    let lab = IscsiLab::build(LabConfig::default()).expect("build the iSCSI lab");
    // Manual scan: of the 8 LUNs only the two scanned ones exist, on both sessions.
    assert_eq!(
        lab.devices().len(),
        4,
        "LUNs 0 and 1 on two sessions: {:?}",
        lab.devices()
    );
    assert_eq!(lab.maps.len(), 2, "{:?}", lab.maps);

    let doc = lunkit_list();
    check_devices(&doc);
    let disks: Vec<String> = lab.maps.iter().flat_map(|m| m.paths.clone()).collect();
    check_block_devices(&doc, &disks);

    // Sessions: sid, target, host and portal.
    let listed: Vec<SessionRow> = array(&doc, "iscsi_sessions")
        .iter()
        .map(|s| {
            (
                s["sid"].as_u64().expect("sid"),
                opt_str(&s["target"]),
                s["host"].as_u64(),
                opt_str(&s["portal"]),
            )
        })
        .collect();
    let truth: Vec<SessionRow> = iscsi::sessions()
        .into_iter()
        .map(|s| {
            (
                u64::from(s.sid),
                Some(s.target),
                Some(u64::from(s.host)),
                Some(s.portal),
            )
        })
        .collect();
    assert_eq!(listed, truth, "iscsi_sessions (sorted by sid)");
    for s in array(&doc, "iscsi_sessions") {
        assert_eq!(s["state"], "LOGGED_IN", "{s}");
        let host = s["host"].as_u64().expect("host");
        let h = array(&doc, "scsi_hosts")
            .iter()
            .find(|h| h["host"] == host)
            .expect("session host listed");
        assert_eq!(h["transport"], "iscsi", "{h}");
        assert_eq!(h["proc_name"], "iscsi_tcp", "{h}");
    }

    // Multipath maps: name, dm, uuid, paths; the WWID is the uuid without `mpath-`, and the
    // paths' sysfs wwid is the same NAA (`naa.X` in sysfs is `3X` in multipath).
    let maps = array(&doc, "multipath_maps");
    let listed: Vec<(String, String, String, Vec<String>)> = maps
        .iter()
        .map(|m| {
            let paths = m["paths"]
                .as_array()
                .expect("paths")
                .iter()
                .filter_map(opt_str)
                .collect();
            (
                opt_str(&m["name"]).expect("map name"),
                opt_str(&m["dm"]).expect("dm"),
                opt_str(&m["uuid"]).expect("uuid"),
                paths,
            )
        })
        .collect();
    let truth: Vec<(String, String, String, Vec<String>)> = multipath::maps()
        .into_iter()
        .map(|m| (m.name, m.dm, m.uuid, m.paths))
        .collect();
    assert_eq!(listed, truth, "multipath_maps");
    for m in maps {
        let wwid = m["wwid"].as_str().expect("wwid");
        assert_eq!(m["uuid"], format!("mpath-{wwid}"), "{m}");
        for path in m["paths"]
            .as_array()
            .expect("paths")
            .iter()
            .filter_map(Value::as_str)
        {
            let naa = sysfs::attr(format!("/sys/block/{path}/device/wwid")).expect("path wwid");
            assert_eq!(
                naa.strip_prefix("naa.").map(|n| format!("3{n}")).as_deref(),
                Some(wwid),
                "{path} of {m}"
            );
        }
    }
    let dm: Vec<(String, Vec<String>)> = array(&doc, "dm_devices")
        .iter()
        .map(|d| {
            (
                opt_str(&d["dm"]).expect("dm"),
                d["slaves"]
                    .as_array()
                    .expect("slaves")
                    .iter()
                    .filter_map(opt_str)
                    .collect(),
            )
        })
        .collect();
    for map in &lab.maps {
        assert!(
            dm.contains(&(map.dm.clone(), map.paths.clone())),
            "dm_devices lacks {map:?}: {dm:?}"
        );
    }
    lab.teardown().expect("tear the lab down");
}

//! VM tests of the FC scan, attach and detach on a real FC transport (issue 13): software FCoE
//! over a veth pair in VN2VN mode with LIO's tcm_fc as the target (`support::fcoe`), so the
//! `fc_host`, the `fc_remote_ports` entry and the SCSI target below it are the kernel's.
//!
//! Run by `cargo xtask test` inside the QEMU guest (ignored on the host).

// The tests run the lunkit CLI; the fixture builds the lab with real tools.
#![allow(clippy::disallowed_methods)]

use lunkit_lab as support;

use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::process::Output;
use std::time::Duration;

use serde_json::Value;
use support::cli::{describe, lunkit};
use support::fcoe::{self, FcoeConfig, FcoeLab};
use support::multipath::{self, Multipathd};
use support::{require_vm, sysfs, wait};

/// `lunkit <args>` whose last argument is `--json`: exit code and document.
fn json(args: &[&str]) -> (Option<i32>, Value, Output) {
    let out = lunkit(args);
    let doc = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{args:?}: no JSON ({e}): {}", describe(&out)));
    (out.status.code(), doc, out)
}

fn lab() -> FcoeLab {
    FcoeLab::build(FcoeConfig::default()).expect("build the FCoE lab")
}

/// `(hctl, outcome)` of every path of a scan or attach report.
fn outcomes(doc: &Value) -> Vec<(String, String)> {
    doc["paths"]
        .as_array()
        .unwrap_or_else(|| panic!("no paths[]: {doc}"))
        .iter()
        .map(|p| {
            (
                p["hctl"].as_str().unwrap_or_default().to_owned(),
                p["outcome"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

/// `lunkit attach --fc-wwpn WWPNS --lun LUN --min-paths 2 --wait-map --json` through the
/// lab's initiator ports, which must find the LUN at exactly `hctls`, both with the LUN's
/// WWID, and return multipathd's map over the two disks: the document and the map's `dm-N`.
///
/// The initiators are named because with several target ports the lab's target-side local
/// ports log in to each other too (VN2VN logs every port into every other), and one may see
/// another as an FCP target: a path no array would offer, which lunkit rightly scans.
fn attach_on_two_paths(
    lab: &FcoeLab,
    wwpns: &str,
    lun: u32,
    hctls: [String; 2],
) -> (Value, String) {
    let lun_text = lun.to_string();
    let initiators: Vec<String> = lab
        .initiators
        .iter()
        .map(|p| fcoe::wwn_sysfs(p.wwpn))
        .collect();
    let mut args = vec![
        "attach",
        "--fc-wwpn",
        wwpns,
        "--lun",
        &lun_text,
        "--min-paths",
        "2",
        "--wait-map",
        "--timeout",
        "300",
    ];
    for i in &initiators {
        args.extend(["--initiator", i.as_str()]);
    }
    args.push("--json");
    let (code, doc, out) = json(&args);
    assert_eq!(code, Some(0), "{}", describe(&out));
    let mut got = outcomes(&doc);
    got.sort();
    let mut want: Vec<(String, String)> =
        hctls.into_iter().map(|h| (h, "found".to_owned())).collect();
    want.sort();
    assert_eq!(got, want, "{doc}");
    let devices = doc["devices"].as_array().expect("devices[]");
    assert_eq!(devices.len(), 2, "{doc}");
    assert!(
        devices
            .iter()
            .all(|d| d["wwid"] == fcoe::wwid(lun).as_str()),
        "{doc}"
    );
    let mut disks: Vec<String> = devices
        .iter()
        .map(|d| d["name"].as_str().expect("name").to_owned())
        .collect();
    disks.sort();
    let dm = doc["map"]["dm"]
        .as_str()
        .unwrap_or_else(|| panic!("no map in {doc}"))
        .to_owned();
    assert_eq!(
        sysfs::names(format!("/sys/block/{dm}/slaves")),
        disks,
        "{doc}"
    );
    (doc, dm)
}

/// `lunkit detach --fc-wwpn WWPNS --lun LUN --json`, which must succeed.
fn detach_fc(wwpns: &str, lun: &str) {
    let (code, doc, out) = json(&[
        "detach",
        "--fc-wwpn",
        wwpns,
        "--lun",
        lun,
        "--timeout",
        "120",
        "--json",
    ]);
    assert_eq!(code, Some(0), "LUN {lun}: {}", describe(&out));
    assert_eq!(doc["ok"], true, "{doc}");
}

/// No SCSI device is left on the lab's initiators, map `dm` and every multipath map are gone;
/// then multipathd and the lab go.
fn assert_map_and_paths_gone_then_tear_down(lab: FcoeLab, dm: &str, mpd: Multipathd) {
    assert!(lab.devices().is_empty(), "{:?}", lab.devices());
    assert!(
        !std::path::Path::new(&format!("/sys/block/{dm}")).exists(),
        "map {dm} is still there"
    );
    assert_eq!(multipath::maps(), [], "multipath maps left");
    mpd.stop().expect("stop multipathd");
    lab.teardown().expect("tear down");
}

/// The one entry of `doc[key]` whose `field` is `value`.
fn entry<'a>(doc: &'a Value, key: &str, field: &str, value: &Value) -> &'a Value {
    let all = doc[key]
        .as_array()
        .unwrap_or_else(|| panic!("no {key}[]: {doc}"));
    let found: Vec<&Value> = all.iter().filter(|e| &e[field] == value).collect();
    assert_eq!(found.len(), 1, "{key}[] with {field} = {value}: {all:?}");
    found[0]
}

#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn list_shows_the_kernel_made_fc_host_and_target_port() {
    require_vm();
    let lab = lab();
    let host = lab.initiator().host;
    let rport = lab
        .rport()
        .expect("the initiator's remote port to the target");
    let dir = format!("/sys/class/fc_remote_ports/{rport}");
    let target_id = lab.scsi_target_id().expect("a bound SCSI target id");

    let (code, doc, out) = json(&["list", "--json"]);
    assert_eq!(code, Some(0), "{}", describe(&out));

    let h = entry(&doc, "scsi_hosts", "host", &host.into());
    assert_eq!(h["transport"], "fc", "{h}");
    assert_eq!(h["proc_name"], "fcoe", "{h}");

    let fc = entry(&doc, "fc_hosts", "host", &host.into());
    assert_eq!(fc["port_name"], lab.initiator_wwpn().as_str(), "{fc}");
    let fc_dir = format!("/sys/class/fc_host/host{host}");
    for attr in ["node_name", "port_id", "port_state", "speed"] {
        let want = sysfs::attr(format!("{fc_dir}/{attr}")).expect(attr);
        assert_eq!(fc[attr], want.as_str(), "{attr}: {fc}");
    }
    assert_eq!(fc["port_state"], "Online", "{fc}");

    let r = entry(&doc, "fc_rports", "name", &rport.as_str().into());
    assert_eq!(r["host"], host, "{r}");
    assert_eq!(r["channel"], 0, "{r}");
    assert_eq!(r["port_name"], lab.target_wwpn().as_str(), "{r}");
    for attr in ["node_name", "port_id", "port_state"] {
        let want = sysfs::attr(format!("{dir}/{attr}")).expect(attr);
        assert_eq!(r[attr], want.as_str(), "{attr}: {r}");
    }
    assert_eq!(r["port_state"], "Online", "{r}");
    assert_eq!(r["scsi_target_id"], target_id, "{r}");
    // The kernel prints "FCP Target, FCP Initiator" (tcm_fc's port also initiates).
    let roles: Vec<&str> = r["roles"]
        .as_array()
        .unwrap_or_else(|| panic!("roles: {r}"))
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let want: Vec<String> = sysfs::attr(format!("{dir}/roles"))
        .expect("roles")
        .split(',')
        .map(|s| s.trim().to_owned())
        .collect();
    assert_eq!(roles, want, "{r}");
    assert!(roles.contains(&"FCP Target"), "{r}");
    // scsi_mod.scan=manual: no SCSI target below the port until a LUN is scanned.
    assert_eq!(r["target"], Value::Null, "{r}");

    // The other direction: the target's own port sees the initiator, which is no target.
    let back = entry(
        &doc,
        "fc_rports",
        "port_name",
        &lab.initiator_wwpn().as_str().into(),
    );
    assert_eq!(back["host"], lab.target().host, "{back}");
    assert_eq!(
        back["roles"],
        serde_json::json!(["FCP Initiator"]),
        "{back}"
    );
    assert_eq!(back["scsi_target_id"], Value::Null, "{back}");

    // The text form names the port, its WWPN and role under the host.
    let out = lunkit(&["list"]);
    assert!(out.status.success(), "{}", describe(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.contains(&rport))
        .unwrap_or_else(|| panic!("{rport} not listed:\n{text}"));
    assert!(
        line.contains(&lab.target_wwpn()) && line.contains("FCP Target") && line.contains("Online"),
        "{line}"
    );
    lab.teardown().expect("tear down");
}

#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn scan_fc_brings_exactly_the_one_lun_with_its_wwid() {
    require_vm();
    let lab = lab();
    let host = lab.initiator().host;
    let rport = lab.rport().expect("remote port");
    let t = lab.scsi_target_id().expect("target id");
    assert!(lab.devices().is_empty(), "manual scan: no LUN after login");
    let wwpn = lab.target_wwpn();

    // Only through the target's own local port: no remote port of it leads there.
    let out = lunkit(&[
        "scan",
        "fc",
        "--wwpn",
        &wwpn,
        "--initiator",
        &fcoe::wwn_sysfs(lab.target().wwpn),
        "--lun",
        "2",
        "--timeout",
        "30",
    ]);
    assert_eq!(out.status.code(), Some(3), "{}", describe(&out));
    assert!(lab.devices().is_empty(), "{:?}", lab.devices());

    let (code, doc, out) = json(&[
        "scan",
        "fc",
        "--wwpn",
        &wwpn,
        "--initiator",
        &lab.initiator_wwpn(),
        "--lun",
        "2",
        "--timeout",
        "60",
        "--json",
    ]);
    assert_eq!(code, Some(0), "{}", describe(&out));
    let hctl = format!("{host}:0:{t}:2");
    assert_eq!(
        outcomes(&doc),
        [(hctl.clone(), "found".to_owned())],
        "{doc}"
    );
    let path = &doc["paths"][0];
    assert_eq!(path["via"], format!("host{host} {rport}").as_str(), "{doc}");
    let devices = doc["devices"].as_array().expect("devices[]");
    assert_eq!(devices.len(), 1, "{doc}");
    let dev = &devices[0];
    assert_eq!(dev["hctl"], hctl.as_str(), "{doc}");
    assert_eq!(dev["wwid"], fcoe::wwid(2).as_str(), "{doc}");
    let sys = format!("/sys/class/scsi_device/{hctl}/device");
    assert_eq!(
        sysfs::attr(format!("{sys}/wwid")).as_deref(),
        Some(fcoe::wwid(2).as_str()),
        "the kernel's wwid"
    );
    let disk = sysfs::names(format!("{sys}/block"));
    assert_eq!(
        dev["name"],
        disk.first().map_or("", String::as_str),
        "{doc}"
    );
    assert_eq!(path["device"], dev["name"], "{doc}");

    // Exactly that LUN: none of the target's other LUNs (0, 1, 3) came with it.
    assert_eq!(lab.devices(), std::slice::from_ref(&hctl));

    // Now the port has its SCSI target, and list says so.
    let (_, doc, _) = json(&["list", "--json"]);
    let r = entry(&doc, "fc_rports", "name", &rport.as_str().into());
    assert_eq!(r["target"], format!("{host}:0:{t}").as_str(), "{r}");
    let d = entry(&doc, "scsi_devices", "hctl", &hctl.as_str().into());
    assert_eq!(d["wwid"], fcoe::wwid(2).as_str(), "{d}");
    assert_eq!(d["vendor"], "LIO-ORG", "{d}");

    // The same scan again finds the present LUN (rescanned), still only that one.
    let (code, doc, out) = json(&[
        "scan",
        "fc",
        "--wwpn",
        &wwpn,
        "--lun",
        "2",
        "--timeout",
        "60",
        "--json",
    ]);
    assert_eq!(code, Some(0), "{}", describe(&out));
    assert_eq!(
        outcomes(&doc),
        [(hctl.clone(), "found".to_owned())],
        "{doc}"
    );
    assert_eq!(lab.devices(), [hctl]);
    lab.teardown().expect("tear down");
}

#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn attach_and_detach_by_fc_address_leave_no_device() {
    require_vm();
    let lab = lab();
    let host = lab.initiator().host;
    let t = lab.scsi_target_id().expect("target id");
    let wwpn = lab.target_wwpn();
    let hctl = format!("{host}:0:{t}:1");

    let (code, doc, out) = json(&[
        "attach",
        "--fc-wwpn",
        &wwpn,
        "--lun",
        "1",
        "--expect-wwid",
        &fcoe::wwid(1),
        "--timeout",
        "60",
        "--json",
    ]);
    assert_eq!(code, Some(0), "{}", describe(&out));
    assert_eq!(
        outcomes(&doc),
        [(hctl.clone(), "found".to_owned())],
        "{doc}"
    );
    assert_eq!(doc["devices"][0]["wwid"], fcoe::wwid(1).as_str(), "{doc}");
    assert_eq!(lab.devices(), std::slice::from_ref(&hctl));
    let name = doc["devices"][0]["name"]
        .as_str()
        .expect("device name")
        .to_owned();

    // Data goes over the FC transport to the target's backing file.
    let data: Vec<u8> = (0..64 * 1024u32).map(|i| (i * 7 + 3) as u8).collect();
    let offset = 1 << 20;
    {
        let mut disk = fs::OpenOptions::new()
            .write(true)
            .open(format!("/dev/{name}"))
            .expect("open the disk");
        disk.seek(SeekFrom::Start(offset)).unwrap();
        disk.write_all(&data).expect("write through FCoE");
        disk.sync_all().expect("fsync the disk");
    }
    let mut back = vec![0u8; data.len()];
    {
        // Closed again before the teardown unmounts the target's tmpfs.
        let mut image = fs::File::open(lab.image(1)).expect("open the backing file");
        image.seek(SeekFrom::Start(offset)).unwrap();
        image.read_exact(&mut back).expect("read the backing file");
    }
    assert!(
        back == data,
        "the target's file does not hold what was written"
    );

    let (code, doc, out) = json(&[
        "detach",
        "--fc-wwpn",
        &wwpn,
        "--lun",
        "1",
        "--timeout",
        "60",
        "--json",
    ]);
    assert_eq!(code, Some(0), "{}", describe(&out));
    assert_eq!(doc["ok"], true, "{doc}");
    let deleted: Vec<&Value> = doc["steps"]
        .as_array()
        .expect("steps[]")
        .iter()
        .filter(|s| s["step"] == "delete-path")
        .collect();
    assert_eq!(deleted.len(), 1, "{doc}");
    assert_eq!(deleted[0]["outcome"], "done", "{doc}");
    assert!(
        deleted[0]["target"]
            .as_str()
            .is_some_and(|s| s.contains(&hctl)),
        "{doc}"
    );
    assert!(lab.devices().is_empty(), "{:?}", lab.devices());
    assert!(
        !std::path::Path::new(&format!("/sys/block/{name}")).exists(),
        "{name} is still there"
    );
    // The port and its login stay: only the LUN went.
    assert_eq!(lab.scsi_target_id(), Some(t));

    // A second detach finds nothing and succeeds.
    let (code, doc, out) = json(&[
        "detach",
        "--fc-wwpn",
        &wwpn,
        "--lun",
        "1",
        "--timeout",
        "60",
        "--json",
    ]);
    assert_eq!(code, Some(0), "{}", describe(&out));
    assert_eq!(doc["ok"], true, "{doc}");
    assert!(lab.devices().is_empty(), "{:?}", lab.devices());
    lab.teardown().expect("tear down");
}

#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn a_lun_the_target_does_not_export_is_not_reported() {
    require_vm();
    let lab = lab();
    let host = lab.initiator().host;
    let t = lab.scsi_target_id().expect("target id");
    let wwpn = lab.target_wwpn();
    assert!(!lab.config.luns.contains(&9));

    let scan = [
        "scan",
        "fc",
        "--wwpn",
        &wwpn,
        "--lun",
        "9",
        "--timeout",
        "30",
    ];
    let attach = [
        "attach",
        "--fc-wwpn",
        &wwpn,
        "--lun",
        "9",
        "--timeout",
        "30",
    ];
    for args in [&scan[..], &attach[..]] {
        let out = lunkit(args);
        assert_eq!(out.status.code(), Some(3), "{args:?}: {}", describe(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!("LUN 9 behind host{host} channel 0 target {t}"))
                && err.contains("the target did not report it"),
            "{args:?}: {err}"
        );
        assert!(lab.devices().is_empty(), "{:?}", lab.devices());
    }
    lab.teardown().expect("tear down");
}

/// Two initiator ports (two FC hosts) on the bridge: one LUN, two real FC paths. `--initiator`
/// keeps a scan to one port; `attach --wait-map` writes both scans at once and returns the
/// map multipathd built over both; `detach` by FC address takes map and paths away.
#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn attach_through_two_fc_ports_scans_both_at_once_and_detach_takes_the_map() {
    require_vm();
    let lab = FcoeLab::build(FcoeConfig {
        initiators: 2,
        ..FcoeConfig::default()
    })
    .expect("build the FCoE lab with two initiator ports");
    let wwpn = lab.target_wwpn();
    let [a, b] = [&lab.initiators[0], &lab.initiators[1]];
    let addr = |port: &fcoe::LocalPort, lun: u32| {
        let t = lab.scsi_target_id_of(port).expect("target id");
        format!("{}:0:{t}:{lun}", port.host)
    };
    let mpd = Multipathd::start(multipath::DEFAULT_CONF).expect("start multipathd");

    // Through port b only: one path, on b's host.
    let (code, doc, out) = json(&[
        "scan",
        "fc",
        "--wwpn",
        &wwpn,
        "--initiator",
        &fcoe::wwn_sysfs(b.wwpn),
        "--lun",
        "3",
        "--timeout",
        "60",
        "--json",
    ]);
    assert_eq!(code, Some(0), "{}", describe(&out));
    assert_eq!(outcomes(&doc), [(addr(b, 3), "found".to_owned())], "{doc}");
    assert_eq!(lab.devices(), [addr(b, 3)]);

    // Both ports at once, and the map over both.
    let (doc, dm) = attach_on_two_paths(&lab, &wwpn, 2, [addr(a, 2), addr(b, 2)]);
    let paths = doc["paths"].as_array().expect("paths[]");
    let at = |p: &Value, k: &str| p[k].as_u64().unwrap_or_else(|| panic!("no {k} in {p}"));
    let last_start = paths.iter().map(|p| at(p, "write_start_us")).max().unwrap();
    let first_end = paths.iter().map(|p| at(p, "write_end_us")).min().unwrap();
    assert!(
        last_start < first_end,
        "the scan writes did not overlap: {doc}"
    );
    assert_eq!(
        sysfs::attr(format!("/sys/block/{dm}/dm/uuid")),
        Some(format!("mpath-3{}", &fcoe::wwid(2)["naa.".len()..])),
    );

    for lun in ["2", "3"] {
        detach_fc(&wwpn, lun);
    }
    assert_map_and_paths_gone_then_tear_down(lab, &dm, mpd);
}

/// An array's two controller ports: one initiator port sees the target through two target
/// WWPNs (two remote ports, two SCSI targets), each exporting the same LUNs. `attach` naming
/// both ports brings the LUN in through both at once, says which port each path came
/// through, and multipathd maps the two; a port the fabric does not show is just not a path.
/// `detach` naming one of the ports takes the whole volume: both paths and the map.
#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn attach_through_two_target_ports_and_detach_by_one_of_them() {
    require_vm();
    let lab = FcoeLab::build(FcoeConfig {
        targets: 2,
        ..FcoeConfig::default()
    })
    .expect("build the FCoE lab with two target ports");
    let port = lab.initiator();
    let [t1, t2] = [&lab.targets[0], &lab.targets[1]];
    let addr = |target: &fcoe::LocalPort, lun: u32| {
        let t = lab.scsi_target_id_via(port, target).expect("target id");
        format!("{}:0:{t}:{lun}", port.host)
    };
    assert_ne!(addr(t1, 1), addr(t2, 1), "two SCSI targets behind one host");
    let mpd = Multipathd::start(multipath::DEFAULT_CONF).expect("start multipathd");

    // Both ports, plus one nobody has: it is no path, and no error.
    let absent = "0x20000000c9abcdef";
    let list = format!("{},{absent}", lab.target_wwpns().join(","));
    let (doc, dm) = attach_on_two_paths(&lab, &list, 1, [addr(t1, 1), addr(t2, 1)]);
    for (target, hctl) in [(t1, addr(t1, 1)), (t2, addr(t2, 1))] {
        let path = entry(&doc, "paths", "hctl", &Value::from(hctl));
        let via = path["via"].as_str().expect("via");
        assert!(
            via.ends_with(&format!("({})", fcoe::wwn_sysfs(target.wwpn))),
            "the path does not name its target port: {path}"
        );
    }
    assert_eq!(
        lab.devices(),
        {
            let mut v = vec![addr(t1, 1), addr(t2, 1)];
            v.sort();
            v
        },
        "exactly LUN 1, through each port"
    );

    detach_fc(&fcoe::wwn_sysfs(t2.wwpn), "1");
    assert_map_and_paths_gone_then_tear_down(lab, &dm, mpd);
}

/// Two initiator ports, one of them with its link down: its remote port is Blocked, so a scan
/// skips it (never writes to it) and the LUN still comes through the other port; with
/// `--min-paths 2` that is too few (exit 3, the skipped port named). Once the link is back
/// and the port logged in again, both paths come, and detach takes both.
#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn a_blocked_fc_port_is_skipped_and_the_lun_comes_through_the_other() {
    require_vm();
    let lab = FcoeLab::build(FcoeConfig {
        initiators: 2,
        ..FcoeConfig::default()
    })
    .expect("build the FCoE lab with two initiator ports");
    let wwpn = lab.target_wwpn();
    let [a, b] = [&lab.initiators[0], &lab.initiators[1]];
    let addr = |port: &fcoe::LocalPort| {
        let t = lab.scsi_target_id_of(port).expect("target id");
        format!("{}:0:{t}:1", port.host)
    };
    let (at_a, at_b) = (addr(a), addr(b));
    let rport_b = lab.rport_of(b).expect("b's remote port");

    // Blocked for as long as the test takes: with the default dev_loss_tmo (60 s) the kernel
    // would remove the port meanwhile, a timer racing TCG.
    fs::write(
        format!("/sys/class/fc_remote_ports/{rport_b}/dev_loss_tmo"),
        "600",
    )
    .expect("set dev_loss_tmo");
    lab.set_link(b, false).expect("take b's link down");
    wait::until_true(
        "b's remote port to be Blocked",
        Duration::from_secs(60),
        || lab.rport_state_of(b).as_deref() == Some("Blocked"),
    )
    .expect("Blocked");

    let (code, doc, out) = json(&[
        "scan",
        "fc",
        "--wwpn",
        &wwpn,
        "--lun",
        "1",
        "--timeout",
        "60",
        "--json",
    ]);
    assert_eq!(code, Some(0), "{}", describe(&out));
    let mut got = outcomes(&doc);
    got.sort();
    let mut want = vec![
        (at_a.clone(), "found".to_owned()),
        (at_b.clone(), "skipped".to_owned()),
    ];
    want.sort();
    assert_eq!(got, want, "{doc}");
    let skipped = doc["paths"]
        .as_array()
        .expect("paths[]")
        .iter()
        .find(|p| p["outcome"] == "skipped")
        .expect("the skipped path");
    assert_eq!(
        skipped["via"],
        format!("host{} {rport_b}", b.host).as_str(),
        "{doc}"
    );
    assert!(
        skipped["detail"]
            .as_str()
            .is_some_and(|d| d.contains("Blocked")),
        "{doc}"
    );
    assert_eq!(lab.devices(), std::slice::from_ref(&at_a));

    let out = lunkit(&[
        "attach",
        "--fc-wwpn",
        &wwpn,
        "--lun",
        "1",
        "--min-paths",
        "2",
        "--timeout",
        "60",
    ]);
    assert_eq!(out.status.code(), Some(3), "{}", describe(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("1 of 2 path(s) came, 2 wanted"), "{err}");
    assert!(
        err.contains(&format!(
            "{at_b} via host{} {rport_b}: skipped: port state Blocked",
            b.host
        )),
        "{err}"
    );
    assert_eq!(lab.devices(), std::slice::from_ref(&at_a));

    lab.set_link(b, true).expect("bring b's link up");
    wait::until_true(
        "b's remote port to be Online again",
        Duration::from_secs(120),
        || lab.rport_state_of(b).as_deref() == Some("Online"),
    )
    .expect("Online");
    let at_b = addr(b);
    let (code, doc, out) = json(&[
        "attach",
        "--fc-wwpn",
        &wwpn,
        "--lun",
        "1",
        "--min-paths",
        "2",
        "--expect-wwid",
        &fcoe::wwid(1),
        "--timeout",
        "60",
        "--json",
    ]);
    assert_eq!(code, Some(0), "{}", describe(&out));
    let mut got = outcomes(&doc);
    got.sort();
    let mut want = vec![
        (at_a.clone(), "found".to_owned()),
        (at_b.clone(), "found".to_owned()),
    ];
    want.sort();
    assert_eq!(got, want, "{doc}");
    let mut both = vec![at_a, at_b];
    both.sort();
    assert_eq!(lab.devices(), both);

    let (code, doc, out) = json(&[
        "detach",
        "--fc-wwpn",
        &wwpn,
        "--lun",
        "1",
        "--timeout",
        "60",
        "--json",
    ]);
    assert_eq!(code, Some(0), "{}", describe(&out));
    assert_eq!(doc["ok"], true, "{doc}");
    assert!(lab.devices().is_empty(), "{:?}", lab.devices());
    lab.teardown().expect("tear down");
}

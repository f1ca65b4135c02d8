//! VM tests for single-LUN scans (issue 3): iSCSI through two portals, a LUN the target lacks,
//! a reused LUN number (wrong WWID), scsi_debug with manual scanning, and a scan from a network
//! namespace where no uevent arrives.
//!
//! Run by `cargo xtask test` inside the QEMU guest (ignored on the host).

// The tests run the lunkit CLI; the fixtures build the lab with real tools.
#![allow(clippy::disallowed_methods)]

use lunkit_lab as support;

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::cli::lunkit;
use support::lab::{IscsiLab, LabConfig};
use support::lio::LioConfig;
use support::lio_split::SplitTarget;
use support::scsi_debug::ScsiDebug;
use support::{cmd, iscsi, multipath, require_vm, sysfs};

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// H:C:T:L of every SCSI device whose host is one of `hosts`.
fn devices_on(hosts: &[u32]) -> Vec<String> {
    sysfs::names("/sys/class/scsi_device")
        .into_iter()
        .filter(|h| hosts.iter().any(|n| h.starts_with(&format!("{n}:"))))
        .collect()
}

#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn iscsi_scan_of_one_lun_through_two_portals() {
    require_vm();
    let lab = IscsiLab::build(LabConfig {
        target: LioConfig {
            luns: 16,
            ..LioConfig::default()
        },
        scan: vec![],
        multipath: None,
    })
    .expect("build the iSCSI lab");
    let iqn = lab.config.target.iqn.clone();
    let hosts: Vec<u32> = lab.sessions.iter().map(|s| s.host).collect();
    assert_eq!(hosts.len(), 2);
    assert!(
        devices_on(&hosts).is_empty(),
        "manual scan: no LUN after login"
    );

    // LUN 7: exactly two paths, one WWID, and nothing else of the target appears.
    let out = lunkit(&[
        "scan",
        "iscsi",
        "--target",
        &iqn,
        "--lun",
        "7",
        "--timeout",
        "60",
        "--json",
    ]);
    assert!(out.status.success(), "scan failed: {}", stderr(&out));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    let devs = doc["devices"].as_array().unwrap();
    assert_eq!(devs.len(), 2, "{doc}");
    let mut hctls: Vec<String> = devs
        .iter()
        .map(|d| d["hctl"].as_str().unwrap().to_owned())
        .collect();
    hctls.sort();
    let mut want: Vec<String> = hosts.iter().map(|h| format!("{h}:0:0:7")).collect();
    want.sort();
    assert_eq!(hctls, want);
    assert_eq!(devs[0]["wwid"], devs[1]["wwid"]);
    assert!(devs[0]["wwid"].as_str().unwrap().starts_with("naa."));
    for d in devs {
        let name = d["name"].as_str().unwrap();
        assert!(std::path::Path::new(&format!("/dev/{name}")).exists());
        assert_eq!(
            sysfs::attr(format!("/sys/block/{name}/dev")).unwrap(),
            format!("{}:{}", d["major"], d["minor"])
        );
    }
    let mut present = devices_on(&hosts);
    present.sort();
    assert_eq!(present, want, "only LUN 7 was brought in");

    // A second scan of the same LUN rescans and returns the same paths.
    let again = lunkit(&["scan", "iscsi", "--target", &iqn, "--lun", "7", "--json"]);
    assert!(again.status.success(), "{}", stderr(&again));
    let doc2: Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(doc2["devices"].as_array().unwrap().len(), 2);

    // LUN 99 does not exist: exit 3, long before the 60 s timeout.
    let t0 = Instant::now();
    let out = lunkit(&[
        "scan",
        "iscsi",
        "--target",
        &iqn,
        "--lun",
        "99",
        "--timeout",
        "60",
    ]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(
        t0.elapsed() < Duration::from_secs(30),
        "took {:?}",
        t0.elapsed()
    );
    assert!(stderr(&out).contains("LUN 99"), "{}", stderr(&out));

    // A reused LUN number must not be handed out as the old volume.
    // A well-formed NAA designator (32 hex digits) of no LUN here.
    let wrong = "naa.6001405deadbeef00000000000000000";
    let out = lunkit(&[
        "scan",
        "iscsi",
        "--target",
        &iqn,
        "--lun",
        "3",
        "--expect-wwid",
        wrong,
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let msg = stderr(&out);
    assert!(
        msg.contains(wrong) && msg.contains("has WWID naa."),
        "{msg}"
    );
    assert!(out.stdout.is_empty(), "no device returned");

    // Sessions to another target are never touched: scanning a target with no session fails.
    let out = lunkit(&[
        "scan",
        "iscsi",
        "--target",
        "iqn.2003-01.org.example:none",
        "--lun",
        "0",
    ]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));

    lab.teardown().expect("tear the lab down");
}

/// Sets `scsi_mod.scan` (writable at runtime) and restores it on drop, so scsi_debug's hosts
/// come up without their LUNs.
struct ManualScan(String);

impl ManualScan {
    fn enable() -> Self {
        let p = "/sys/module/scsi_mod/parameters/scan";
        let old = sysfs::attr(p).unwrap_or_else(|| "async".into());
        std::fs::write(p, "manual").expect("set scsi_mod.scan=manual");
        ManualScan(old)
    }
}

impl Drop for ManualScan {
    fn drop(&mut self) {
        let _ = std::fs::write("/sys/module/scsi_mod/parameters/scan", &self.0);
    }
}

#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn scsi_debug_generic_scan_of_one_lun_among_many() {
    require_vm();
    let manual = ManualScan::enable();
    let sd = ScsiDebug::load(
        &[("add_host", "1"), ("num_tgts", "1"), ("max_luns", "8")],
        0,
    )
    .expect("load scsi_debug");
    let host = sd.hosts[0];
    assert!(
        sd.devices().is_empty(),
        "manual scan: no LUN yet, got {:?}",
        sd.devices()
    );

    let hctl = format!("{host}:0:0:5");
    let out = lunkit(&["scan", "hctl", &hctl, "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["devices"][0]["hctl"], hctl.as_str());
    assert_eq!(
        sd.devices(),
        std::slice::from_ref(&hctl),
        "exactly one LUN among eight"
    );

    // The safety net: in a fresh network namespace no uevent arrives, the sysfs re-checks
    // still see the disk.
    let hctl2 = format!("{host}:0:0:2");
    let bin = std::env::var("LUNKIT_BIN").unwrap();
    let out = Command::new("unshare")
        .args([
            "--net",
            &bin,
            "scan",
            "hctl",
            &hctl2,
            "--timeout",
            "60",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "scan in a netns: {}", stderr(&out));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["devices"][0]["hctl"], hctl2.as_str());
    let mut devs = sd.devices();
    devs.sort();
    assert_eq!(devs, [hctl2, hctl]);

    // Out of range for the host (max_luns=8): the kernel refuses, lunkit says so.
    let out = lunkit(&["scan", "hctl", &format!("{host}:0:0:4000")]);
    assert_ne!(out.status.code(), Some(0));

    sd.unload().expect("unload scsi_debug");
    drop(manual);
}

#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn scan_waits_for_udev_or_reports_it_missing() {
    require_vm();
    support::udev::ensure_running().expect("udevd");
    let manual = ManualScan::enable();
    let sd = ScsiDebug::load(
        &[("add_host", "1"), ("num_tgts", "1"), ("max_luns", "4")],
        0,
    )
    .expect("load scsi_debug");
    let host = sd.hosts[0];

    // With udevd: the scan returns once udevd has made the device's links.
    let out = lunkit(&[
        "scan",
        "hctl",
        &format!("{host}:0:0:1"),
        "--wait-udev",
        "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    let dev = &doc["devices"][0];
    assert_eq!(dev["udev"]["state"], "processed", "{doc}");
    let links = dev["udev"]["links"].as_array().unwrap();
    assert!(
        links
            .iter()
            .any(|l| l.as_str().unwrap().starts_with("/dev/disk/by-id/")),
        "{doc}"
    );
    for l in links {
        let target = std::fs::canonicalize(l.as_str().unwrap()).expect("link exists");
        assert_eq!(
            target,
            std::path::Path::new(dev["path"].as_str().unwrap()),
            "{l}"
        );
    }

    // Without udevd: reported at once, not waited for.
    support::udev::stop().expect("stop udevd");
    let t0 = Instant::now();
    let out = lunkit(&[
        "scan",
        "hctl",
        &format!("{host}:0:0:2"),
        "--wait-udev",
        "--json",
        "--timeout",
        "60",
    ]);
    let took = t0.elapsed();
    support::udev::ensure_running().expect("restart udevd for the tests after this one");
    assert!(out.status.success(), "{}", stderr(&out));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["devices"][0]["udev"]["state"], "not running", "{doc}");
    assert!(took < Duration::from_secs(30), "took {took:?}");

    sd.unload().expect("unload scsi_debug");
    drop(manual);
}

/// The path outcomes of a `scan --json` or `attach --json` document: `(hctl, outcome)`.
fn outcomes(doc: &Value) -> Vec<(String, String)> {
    doc["paths"]
        .as_array()
        .unwrap_or_else(|| panic!("no paths[] in {doc}"))
        .iter()
        .map(|p| {
            (
                p["hctl"].as_str().unwrap_or("-").to_owned(),
                p["outcome"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// A LUN masked on one path (LIO: TPG 1 exports it, TPG 2 of the same target does not) comes
/// on the other: one path found, one not reported, exit 0; `--min-paths 2` is exit 3 and
/// names both paths.
#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn a_lun_masked_on_one_path_comes_on_the_other() {
    require_vm();
    let lab = IscsiLab::build(LabConfig {
        target: LioConfig {
            luns: 1,
            ..LioConfig::default()
        },
        scan: vec![],
        multipath: None,
    })
    .expect("build the iSCSI lab");
    let split = SplitTarget::create(
        "iqn.2003-01.org.linux-iscsi.lunkit:split",
        "127.0.0.1:3260",
        "127.0.0.2:3260",
        lab.config.target.lun_size,
    )
    .expect("build the split target");
    for portal in [&split.seeing, &split.blind] {
        iscsi::discover(portal).expect("discovery");
    }
    let seeing = iscsi::login(&split.iqn, &split.seeing).expect("login through TPG 1");
    let blind = iscsi::login(&split.iqn, &split.blind).expect("login through TPG 2");
    let lun = support::lio_split::LUN.to_string();
    let (found_at, masked_at) = (
        format!("{}:0:0:{lun}", seeing.host),
        format!("{}:0:0:{lun}", blind.host),
    );

    let out = lunkit(&[
        "scan",
        "iscsi",
        "--target",
        &split.iqn,
        "--lun",
        &lun,
        "--timeout",
        "60",
        "--json",
    ]);
    assert!(out.status.success(), "scan failed: {}", stderr(&out));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut got = outcomes(&doc);
    got.sort();
    let mut want = vec![
        (found_at.clone(), "found".to_owned()),
        (masked_at.clone(), "not-reported".to_owned()),
    ];
    want.sort();
    assert_eq!(got, want, "{doc}");
    assert_eq!(devices_on(&[seeing.host, blind.host]), [found_at.as_str()]);

    // Both paths wanted: not found (exit 3), each path named with its outcome.
    let out = lunkit(&[
        "attach",
        "--iscsi-target",
        &split.iqn,
        "--lun",
        &lun,
        "--min-paths",
        "2",
        "--timeout",
        "60",
    ]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("1 of 2 path(s) came, 2 wanted"), "{err}");
    assert!(
        err.contains(&format!("{masked_at} via session{} ", blind.sid))
            && err.contains("not reported by the target"),
        "{err}"
    );

    let out = lunkit(&["delete", &found_at]);
    assert!(out.status.success(), "{}", stderr(&out));
    for portal in [&split.seeing, &split.blind] {
        cmd::run(
            "iscsiadm",
            &["-m", "node", "-T", &split.iqn, "-p", portal, "--logout"],
        )
        .expect("log out of the split target");
    }
    cmd::run(
        "iscsiadm",
        &["-m", "node", "-T", &split.iqn, "-o", "delete"],
    )
    .expect("delete the split target's node records");
    split.teardown().expect("remove the split target");
    lab.teardown().expect("tear the lab down");
}

/// `attach --wait-map` on a 2-path volume with udevd and multipathd running: both scan
/// writes are in flight at once (their timestamps overlap), and it returns the map that
/// multipathd built with both paths. Then attach and detach twice more in one `lunkit batch`
/// process, as a resident caller runs them.
#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn attach_scans_both_paths_at_once_and_waits_for_the_map() {
    require_vm();
    let lab = IscsiLab::build(LabConfig {
        target: LioConfig {
            luns: 4,
            ..LioConfig::default()
        },
        scan: vec![],
        multipath: Some(multipath::DEFAULT_CONF),
    })
    .expect("build the iSCSI lab");
    let iqn = lab.config.target.iqn.clone();
    let out = lunkit(&[
        "attach",
        "--iscsi-target",
        &iqn,
        "--lun",
        "2",
        "--wait-map",
        "--timeout",
        "120",
        "--json",
    ]);
    assert!(out.status.success(), "attach failed: {}", stderr(&out));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    eprintln!("attach --wait-map: {doc}");
    let paths = doc["paths"].as_array().unwrap();
    assert_eq!(paths.len(), 2, "{doc}");
    assert!(paths.iter().all(|p| p["outcome"] == "found"), "{doc}");
    let at = |p: &Value, k: &str| p[k].as_u64().unwrap_or_else(|| panic!("no {k} in {p}"));
    let last_start = paths.iter().map(|p| at(p, "write_start_us")).max().unwrap();
    let first_end = paths.iter().map(|p| at(p, "write_end_us")).min().unwrap();
    assert!(
        last_start < first_end,
        "the scan writes did not overlap: {doc}"
    );

    let map = doc["map"]["dm"]
        .as_str()
        .unwrap_or_else(|| panic!("no map in {doc}"));
    let mut slaves = sysfs::names(format!("/sys/block/{map}/slaves"));
    slaves.sort();
    let mut disks: Vec<String> = doc["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap().to_owned())
        .collect();
    disks.sort();
    assert_eq!(slaves, disks, "the map {map} holds both paths");
    assert_eq!(
        sysfs::attr(format!("/sys/block/{map}/dm/name")).unwrap(),
        doc["map"]["name"].as_str().unwrap()
    );

    let out = lunkit(&["detach", "--iscsi-target", &iqn, "--lun", "2"]);
    assert!(out.status.success(), "detach failed: {}", stderr(&out));

    // The same in one `lunkit batch` process, twice over, as a program linking the library
    // runs one operation after another (the bench's resident rows): each attach finds both
    // paths and the map, each detach leaves nothing.
    let line = |verb: &str| {
        if verb == "attach" {
            format!("attach --iscsi-target {iqn} --lun 3 --wait-map --timeout 120 --json")
        } else {
            format!("detach --iscsi-target {iqn} --lun 3 --timeout 60 --json")
        }
    };
    let input: String = ["attach", "detach", "attach", "detach"]
        .iter()
        .map(|v| line(v) + "\n")
        .collect();
    let out = support::cli::lunkit_with_input(&["batch"], &input);
    assert!(out.status.success(), "lunkit batch: {}", stderr(&out));
    let stdout = String::from_utf8(out.stdout.clone()).unwrap();
    let mut runs: Vec<(Value, &str)> = Vec::new();
    let mut text = String::new();
    for l in stdout.lines() {
        match l.strip_prefix("lunkit-batch: exit ") {
            Some(code) => runs.push((
                serde_json::from_str(&std::mem::take(&mut text))
                    .unwrap_or_else(|e| panic!("{e}: {stdout}")),
                code,
            )),
            None => text += l,
        }
    }
    assert_eq!(runs.len(), 4, "{stdout}");
    for (i, (doc, code)) in runs.iter().enumerate() {
        assert_eq!(*code, "0", "command {i}: {doc}\n{}", stderr(&out));
        if i % 2 == 0 {
            let found = doc["paths"].as_array().unwrap();
            assert!(
                found.len() == 2 && found.iter().all(|p| p["outcome"] == "found"),
                "attach {i}: {doc}"
            );
            assert!(doc["map"]["dm"].is_string(), "attach {i}: {doc}");
        } else {
            // Each detach took the map and both paths down itself in one round, and found
            // nothing left. A round before it may only have waited for an opener to let go
            // (CI once found `multipath -u`, which udev runs on each changed disk, on a path).
            assert_eq!(doc["ok"], true, "detach {i}: {doc}");
            let mut waits = 0;
            for s in doc["steps"].as_array().unwrap() {
                if s["outcome"] != "failed" {
                    continue;
                }
                let waited = s["step"] == "check-in-use"
                    && s["detail"]
                        .as_str()
                        .is_some_and(|d| d.ends_with("(waiting for it to close)"));
                assert!(waited, "detach {i}: a step failed: {s}\n{doc}");
                waits += 1;
            }
            assert_eq!(doc["rounds"], 1 + waits, "detach {i}: {doc}");
            let done = |step: &str| {
                doc["steps"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter(|s| s["step"] == step && s["outcome"] == "done")
                    .count()
            };
            assert_eq!(
                (done("remove-map"), done("delete-path"), done("verify")),
                (1, 2, 1),
                "detach {i}: {doc}"
            );
        }
    }
    let hosts: Vec<u32> = lab.sessions.iter().map(|s| s.host).collect();
    assert!(
        devices_on(&hosts).iter().all(|h| !h.ends_with(":3")),
        "LUN 3 left after the batch: {:?}",
        devices_on(&hosts)
    );
    lab.teardown().expect("tear the lab down");
}

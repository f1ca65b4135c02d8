//! VM test of the CSI node plugin's fencing (`fencing: scsi-pr`, issue 56 item 4, as one node
//! can show it): a foreign initiator (its own open-iscsi interface and initiator name, on a
//! third portal of the same LIO target, as another node would be) holds a *Write Exclusive,
//! Registrants Only* reservation of the LUN. A stage with `fencingPreempt: never` is refused
//! naming its key and leaves nothing; the default stage (two paths, a multipath map)
//! preempts and aborts it: `sg_persist` on each path shows this node's key on both and the
//! reservation held by it, LIO shows the foreign key gone. Unstage releases and unregisters:
//! LIO has no registration and no reservation left.
//!
//! Run by `cargo xtask test` inside the QEMU guest (ignored on the host); the plugin binary
//! comes from `LUNKIT_CSI_BIN`.

// The lab is built with iscsiadm; sg_persist is the peer the results are checked against.
#![allow(clippy::disallowed_methods)]

use lunkit_lab as support;

mod csi_plugin;

use std::collections::HashMap;
use std::fs;
use std::time::{Duration, Instant};

use csi_plugin::{Plugin, Ready};
use lunkit::pr::{self, Key, ReservationType};
use lunkit::{Root, block};
use lunkit_csi::proto::volume_capability::{
    AccessMode, AccessType, BlockVolume, access_mode::Mode,
};
use lunkit_csi::proto::*;
use lunkit_csi::{Client, Code};
use support::cli::{describe, lunkit};
use support::iscsi;
use support::lio::{LioConfig, LioTarget};
use support::multipath::{self, Multipathd};
use support::{cmd, require_vm, sysfs, wait};

const BASE: &str = "/tmp/lunkit-csi-fence";
const IQN: &str = "iqn.2003-01.org.linux-iscsi.lunkit:csi-fence";
/// The volume's two portals.
const PORTALS: [&str; 2] = ["127.0.0.1:3260", "127.0.0.2:3260"];
/// The other node's portal: not the volume's, so the plugin's scan never goes through its
/// session (one kernel would take its path for the volume's).
const FOREIGN_PORTAL: &str = "127.0.0.3:3260";
const FOREIGN_IFACE: &str = "lunkit-fence-other";
const FOREIGN_NAME: &str = "iqn.2026-12.org.lunkit:other-node";
const FOREIGN_KEY: Key = Key(0x0ded_beef_0000_0056);
/// LIO's view of LUN 0's persistent reservations (configfs).
const LIO_PR: &str = "/sys/kernel/config/target/core/fileio_0/lun0/pr";
/// Where LIO keeps APTPL metadata: the kernel's REGISTER asks for APTPL (as in `vm_pr`).
const APTPL_DIRS: [&str; 2] = ["/etc/target/pr", "/var/target/pr"];

/// The target, iscsid, the other node's session holding the reservation (its disk deleted
/// again, so that multipathd never sees it), multipathd and the plugin.
struct Lab {
    plugin: Option<Plugin>,
    multipathd: Option<Multipathd>,
    started_iscsid: bool,
    target: Option<LioTarget>,
}

impl Lab {
    fn build() -> Lab {
        let _ = fs::remove_dir_all(BASE);
        fs::create_dir_all(BASE).unwrap();
        for d in APTPL_DIRS {
            fs::create_dir_all(d).unwrap();
        }
        let mut portals: Vec<String> = PORTALS.iter().map(|p| (*p).to_owned()).collect();
        portals.push(FOREIGN_PORTAL.into());
        let target = LioTarget::create(LioConfig {
            iqn: IQN.into(),
            luns: 1,
            lun_size: 32 << 20,
            portals,
        })
        .expect("the LIO target");
        let mut lab = Lab {
            plugin: None,
            multipathd: None,
            started_iscsid: false,
            target: Some(target),
        };
        lab.started_iscsid = iscsi::ensure_iscsid().expect("iscsid");
        foreign_reserves();
        lab.multipathd = Some(Multipathd::start(multipath::DEFAULT_CONF).expect("multipathd"));
        let mut plugin = Plugin::binary();
        plugin.args(["--root", "/"]);
        let limit = Duration::from_secs(120);
        lab.plugin = Some(Plugin::start(plugin, BASE, &[], Ready::Probe, limit));
        lab
    }

    fn client(&self) -> Client {
        self.plugin.as_ref().expect("the plugin runs").client()
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        drop(self.plugin.take());
        if let Some(m) = self.multipathd.take() {
            let _ = m.stop();
        }
        iscsi::logout_all();
        let iface = ["-m", "iface", "-I", FOREIGN_IFACE, "-o", "delete"];
        cmd::run_ignoring_failure("iscsiadm", &iface);
        if self.started_iscsid {
            let _ = iscsi::stop_iscsid();
        }
        if let Some(t) = self.target.take() {
            let _ = t.teardown();
        }
        let _ = fs::remove_dir_all(BASE);
    }
}

/// The other node: logs in through [`FOREIGN_PORTAL`] as [`FOREIGN_NAME`], registers
/// [`FOREIGN_KEY`] and reserves the LUN (WERO) through its disk, then deletes that disk (the
/// session, and so its registration and reservation, stay).
fn foreign_reserves() {
    let iscsiadm = |args: &[&str]| cmd::run("iscsiadm", args).expect("iscsiadm");
    iscsiadm(&["-m", "iface", "-I", FOREIGN_IFACE, "-o", "new"]);
    let set = [
        "-o",
        "update",
        "-n",
        "iface.initiatorname",
        "-v",
        FOREIGN_NAME,
    ];
    iscsiadm(&[&["-m", "iface", "-I", FOREIGN_IFACE][..], &set].concat());
    iscsiadm(&[
        "-m",
        "discovery",
        "-t",
        "st",
        "-p",
        FOREIGN_PORTAL,
        "-I",
        FOREIGN_IFACE,
    ]);
    let node = [
        "-m",
        "node",
        "-T",
        IQN,
        "-p",
        FOREIGN_PORTAL,
        "-I",
        FOREIGN_IFACE,
    ];
    iscsiadm(&[&node[..], &["--login"]].concat());
    let session = wait::until("the other node's session", Duration::from_secs(30), || {
        Ok(iscsi::sessions()
            .into_iter()
            .find(|s| s.target == IQN && s.portal == FOREIGN_PORTAL))
    })
    .expect("the other node's session");
    let disk = iscsi::scan_lun(&session, 0).expect("LUN 0 through the other node's session");
    let node = block::by_name(&Root::default(), &disk).unwrap().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    pr::register(&node, FOREIGN_KEY, deadline).expect("the other node registers");
    let wero = ReservationType::WriteExclusiveRegistrantsOnly;
    pr::reserve(&node, FOREIGN_KEY, wero, deadline).expect("the other node reserves");
    fs::write(format!("/sys/block/{disk}/device/delete"), "1").unwrap();
    wait::until_true("its disk to go", Duration::from_secs(30), || {
        !std::path::Path::new(&format!("/sys/block/{disk}")).exists()
    })
    .unwrap();
    assert_eq!(lio_keys(), [FOREIGN_KEY.get()], "LIO: the other node's key");
    assert!(lio_holder().contains(FOREIGN_NAME), "{}", lio_holder());
}

/// The keys LIO has registered, one per I_T nexus.
fn lio_keys() -> Vec<u64> {
    sysfs::attr(format!("{LIO_PR}/res_pr_registered_i_pts"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split("Key: 0x").nth(1)?.split_whitespace().next())
        .map(|h| u64::from_str_radix(h, 16).unwrap())
        .collect()
}

/// LIO's reservation holder: `SPC-3 Reservation: iSCSI Initiator: NAME,i,ISID`, or `No SPC-3
/// Reservation holder`.
fn lio_holder() -> String {
    sysfs::attr(format!("{LIO_PR}/res_holder")).unwrap_or_default()
}

/// The sessions to [`IQN`] on the default interface (the plugin's), by portal.
fn our_sessions() -> Vec<String> {
    let mut v: Vec<String> = iscsi::sessions()
        .into_iter()
        .filter(|s| s.target == IQN && s.portal != FOREIGN_PORTAL)
        .map(|s| s.portal)
        .collect();
    v.sort();
    v
}

/// Nothing of the plugin's stage is on the node: no session of its own, no map, no disk of
/// the LUN, no record.
fn assert_nothing_staged() {
    assert_eq!(our_sessions(), Vec::<String>::new(), "sessions left");
    assert_eq!(multipath::maps(), Vec::new(), "maps left");
    let disks: Vec<String> = sysfs::names("/sys/class/scsi_device")
        .into_iter()
        .filter(|d| {
            sysfs::attr(format!("/sys/class/scsi_device/{d}/device/vendor"))
                .is_some_and(|v| v.trim() == "LIO-ORG")
        })
        .collect();
    assert_eq!(disks, Vec::<String>::new(), "LIO disks left");
    let records = sysfs::names(format!("{BASE}/state/volumes"));
    assert!(records.is_empty(), "stage records left: {records:?}");
}

fn stage_req(more: &[(&str, &str)]) -> NodeStageVolumeRequest {
    let staging = format!("{BASE}/staging/pv-fence");
    fs::create_dir_all(&staging).unwrap();
    let attrs: HashMap<String, String> = [
        ("targetPortal", PORTALS[0]),
        ("portals", &format!("[\"{}\"]", PORTALS[1])),
        ("iqn", IQN),
        ("lun", "0"),
        ("fencing", "scsi-pr"),
    ]
    .iter()
    .chain(more)
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect();
    NodeStageVolumeRequest {
        volume_id: "pv-fence".into(),
        staging_target_path: staging,
        volume_capability: Some(VolumeCapability {
            access_type: Some(AccessType::Block(BlockVolume {})),
            access_mode: Some(AccessMode {
                mode: Mode::SingleNodeWriter as i32,
            }),
        }),
        volume_context: attrs,
        ..Default::default()
    }
}

/// `sg_persist -n -i -k DEV`: the generation and the keys.
fn sg_keys(dev: &str) -> (u32, Vec<u64>) {
    let out = cmd::run("sg_persist", &["-n", "-i", "-k", dev]).unwrap();
    let generation = out
        .split("PR generation=0x")
        .nth(1)
        .and_then(|r| {
            u32::from_str_radix(r.split(|c: char| !c.is_ascii_hexdigit()).next()?, 16).ok()
        })
        .unwrap_or_else(|| panic!("no generation in {out}"));
    let keys = out
        .lines()
        .filter_map(|l| l.trim().strip_prefix("0x"))
        .map(|h| u64::from_str_radix(h, 16).unwrap())
        .collect();
    (generation, keys)
}

/// `sg_persist -n -i -r DEV`: the holder's key and the type line.
fn sg_reservation(dev: &str) -> (Option<u64>, String) {
    let out = cmd::run("sg_persist", &["-n", "-i", "-r", dev]).unwrap();
    let key = out
        .lines()
        .find_map(|l| l.trim().strip_prefix("Key=0x"))
        .map(|h| u64::from_str_radix(h, 16).unwrap());
    (key, out)
}

#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn a_fenced_stage_refuses_or_preempts_another_nodes_reservation_and_unstage_releases() {
    require_vm();
    let lab = Lab::build();
    let ours = Key::for_node(&Root::default()).expect("this node's key");
    let mut c = lab.client();

    // fencingPreempt: never: refused naming the other node's key; nothing left of the stage.
    let refused = c
        .node_stage_volume(stage_req(&[("fencingPreempt", "never")]))
        .expect_err("a stage under another node's reservation with fencingPreempt: never");
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    let msg = refused.message();
    assert!(msg.contains(&FOREIGN_KEY.to_string()), "{msg}");
    assert!(msg.contains("fencingPreempt is never"), "{msg}");
    assert!(msg.contains("/dev/sd"), "names the device: {msg}");
    assert_nothing_staged();
    assert_eq!(lio_keys(), [FOREIGN_KEY.get()], "only the other node's key");
    assert!(lio_holder().contains(FOREIGN_NAME), "{}", lio_holder());

    // The default (always): preempted and aborted; ours on both paths, ours holds.
    let stage = stage_req(&[]);
    c.node_stage_volume(stage.clone()).expect("stage");
    let maps = multipath::maps();
    assert_eq!(maps.len(), 1, "one map: {maps:?}");
    assert_eq!(maps[0].paths.len(), 2, "both paths: {maps:?}");
    let mut generation = None;
    for p in &maps[0].paths {
        let dev = format!("/dev/{p}");
        let (g, keys) = sg_keys(&dev);
        assert_eq!(
            keys,
            [ours.get(), ours.get()],
            "{dev}: our key, once per path"
        );
        generation = Some(g);
        let (holder, out) = sg_reservation(&dev);
        assert_eq!(holder, Some(ours.get()), "{dev}: {out}");
        assert!(out.contains("Write Exclusive, registrants only"), "{out}");
    }
    assert_eq!(
        lio_keys(),
        [ours.get(), ours.get()],
        "the other key is gone"
    );
    assert!(!lio_holder().contains(FOREIGN_NAME), "{}", lio_holder());
    // A stage again finds it held: no request sent (the generation is the same).
    c.node_stage_volume(stage.clone()).expect("stage again");
    let dev = format!("/dev/{}", maps[0].paths[0]);
    assert_eq!(
        Some(sg_keys(&dev).0),
        generation,
        "nothing registered again"
    );

    // `lunkit pr show` on the map lists our key per path and the holder; --json matches.
    let mapper = format!("/dev/mapper/{}", maps[0].name);
    let key = ours.to_string();
    let out = lunkit(&["pr", "show", &mapper]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    for p in &maps[0].paths {
        let line = text
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{p} ")));
        let want =
            format!("keys {key} {key}, reserved by {key} (write-exclusive-registrants-only)");
        assert!(line.is_some_and(|l| l.contains(&want)), "{p}: {text}");
    }
    let out = lunkit(&["pr", "show", &mapper, "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let paths = doc["paths"].as_array().expect("paths[]");
    let mut names: Vec<&str> = paths.iter().filter_map(|p| p["path"].as_str()).collect();
    names.sort_unstable();
    let mut want = maps[0].paths.iter().map(String::as_str).collect::<Vec<_>>();
    want.sort_unstable();
    assert_eq!(names, want, "{doc}");
    for p in paths {
        assert_eq!(p["keys"], serde_json::json!([key, key]), "{doc}");
        assert_eq!(p["reservation"]["key"], key.as_str(), "{doc}");
        assert_eq!(
            p["reservation"]["type"], "write-exclusive-registrants-only",
            "{doc}"
        );
    }
    // Every path of the map carries our key (a REGISTER probe per path: after the
    // generation check).
    let map_node = block::resolve(&Root::default(), &mapper).unwrap().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let missing = pr::unregistered_paths(&Root::default(), &map_node, ours, deadline).unwrap();
    assert!(missing.is_empty(), "{missing:?}");
    c.node_unstage_volume(NodeUnstageVolumeRequest {
        volume_id: stage.volume_id.clone(),
        staging_target_path: stage.staging_target_path.clone(),
    })
    .expect("unstage");
    assert_eq!(lio_keys(), Vec::<u64>::new(), "registrations left");
    assert!(
        lio_holder().contains("No SPC-3 Reservation holder"),
        "{}",
        lio_holder()
    );
    assert_nothing_staged();
    drop(c);
    drop(lab);
}

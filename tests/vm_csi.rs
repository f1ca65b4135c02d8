//! VM tests of the CSI node plugin (`lunkit-csi`, issue 17): a CSI client speaking gRPC over
//! the plugin's Unix socket plays kubelet's sequence on an LIO target with two portals and
//! multipathd running: stage, publish to two pods, write, unpublish both, unstage, for a raw
//! block volume and for a filesystem volume. The plugin logs in and out itself. After each,
//! the data is checked in the target's backing file and nothing is left on the node.
//!
//! Run by `cargo xtask test` inside the QEMU guest (ignored on the host); the plugin binary
//! comes from `LUNKIT_CSI_BIN`.

// The tests start the plugin and read the lab with the fixtures' tools.
#![allow(clippy::disallowed_methods)]

use lunkit_lab as support;

use std::collections::HashMap;
use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use lunkit_csi::proto::volume_capability::{
    AccessMode, AccessType, BlockVolume, MountVolume, access_mode::Mode,
};
use lunkit_csi::proto::*;
use lunkit_csi::{Client, Code};
use support::child::Running;
use support::iscsi;
use support::lio::{LioConfig, LioTarget};
use support::multipath::{self, Multipathd};
use support::{cmd, require_vm, wait};

const IQN: &str = "iqn.2003-01.org.linux-iscsi.lunkit:csi";
const PORTALS: [&str; 2] = ["127.0.0.1:3260", "127.0.0.2:3260"];
const BASE: &str = "/tmp/lunkit-csi-vm";
const LUN_SIZE: u64 = 32 << 20;

/// The target (two LUNs, two portals), iscsid, multipathd and the plugin; no session: the
/// plugin logs in. Dropping it tears everything down in the safe order.
struct Lab {
    plugin: Option<Running>,
    multipathd: Option<Multipathd>,
    started_iscsid: bool,
    target: Option<LioTarget>,
}

impl Lab {
    fn build() -> Lab {
        let _ = fs::remove_dir_all(BASE);
        fs::create_dir_all(BASE).unwrap();
        let target = LioTarget::create(LioConfig {
            iqn: IQN.into(),
            luns: 2,
            lun_size: LUN_SIZE,
            portals: PORTALS.iter().map(|p| (*p).to_owned()).collect(),
        })
        .expect("the LIO target");
        let mut lab = Lab {
            plugin: None,
            multipathd: None,
            started_iscsid: false,
            target: Some(target),
        };
        lab.started_iscsid = iscsi::ensure_iscsid().expect("iscsid");
        lab.multipathd = Some(Multipathd::start(multipath::DEFAULT_CONF).expect("multipathd"));
        let bin =
            std::env::var("LUNKIT_CSI_BIN").expect("LUNKIT_CSI_BIN is set by cargo xtask test");
        let plugin = Running::spawn(Command::new(bin).args([
            "--endpoint",
            &format!("unix://{BASE}/csi.sock"),
            "--nodeid",
            "vm",
            "--state-dir",
            &format!("{BASE}/state"),
            // multipathd builds a map slowly under TCG; the plugin's own deadline, not the test's.
            "--timeout",
            "600",
        ]))
        .expect("start lunkit-csi");
        lab.plugin = Some(plugin);
        wait::until_true("the plugin's socket", Duration::from_secs(30), || {
            Path::new(BASE).join("csi.sock").exists()
        })
        .expect("the plugin listens");
        lab
    }

    fn client(&self) -> Client {
        Client::connect(&Path::new(BASE).join("csi.sock")).expect("connect to the plugin")
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if let Some(p) = self.plugin.take() {
            // SIGTERM: the plugin stops serving and exits on its own.
            cmd::run_ignoring_failure("kill", &["-TERM", &p.pid().to_string()]);
            let limit = p.elapsed() + Duration::from_secs(30);
            let done = p.wait(limit);
            eprintln!("lunkit-csi: {}", done.describe());
        }
        // Whatever a failed test left mounted under BASE, innermost first.
        let mut left: Vec<String> = fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split(' ').nth(4).map(str::to_owned))
            .filter(|m| m.starts_with(BASE))
            .collect();
        left.sort_by_key(|m| std::cmp::Reverse(m.len()));
        for m in left {
            cmd::run_ignoring_failure("umount", &[&m]);
        }
        match self.multipathd.take() {
            Some(m) => {
                let _ = m.stop();
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
        let _ = fs::remove_dir_all(BASE);
    }
}

fn capability(block: bool, mode: Mode) -> Option<VolumeCapability> {
    Some(VolumeCapability {
        access_type: Some(if block {
            AccessType::Block(BlockVolume {})
        } else {
            AccessType::Mount(MountVolume {
                fs_type: "ext4".into(),
                ..Default::default()
            })
        }),
        access_mode: Some(AccessMode { mode: mode as i32 }),
    })
}

/// csi-driver-iscsi's attributes: the first portal, the others as a JSON list.
fn attributes(lun: u32) -> HashMap<String, String> {
    HashMap::from([
        ("targetPortal".to_owned(), PORTALS[0].to_owned()),
        ("portals".to_owned(), format!("[\"{}\"]", PORTALS[1])),
        ("iqn".to_owned(), IQN.to_owned()),
        ("lun".to_owned(), lun.to_string()),
    ])
}

/// Deterministic bytes (xorshift), different per seed.
fn random(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn backing_file(lun: u32) -> PathBuf {
    PathBuf::from(format!("/tmp/lunkit-lio/lun{lun}.img"))
}

/// The sessions to our target, as `portal` strings.
fn our_sessions() -> Vec<String> {
    let mut v: Vec<String> = iscsi::sessions()
        .into_iter()
        .filter(|s| s.target == IQN)
        .map(|s| s.portal)
        .collect();
    v.sort();
    v
}

/// Nothing of the volume is left on the node: no session, no map, no SCSI disk of the
/// target, no stage record, nothing mounted under BASE.
fn assert_node_clean() {
    assert_eq!(our_sessions(), Vec::<String>::new(), "sessions left");
    assert_eq!(multipath::maps(), Vec::new(), "multipath maps left");
    let lio_disks: Vec<String> = support::sysfs::names("/sys/class/scsi_device")
        .into_iter()
        .filter(|d| {
            support::sysfs::attr(format!("/sys/class/scsi_device/{d}/device/vendor"))
                .is_some_and(|v| v.trim() == "LIO-ORG")
        })
        .collect();
    assert_eq!(lio_disks, Vec::<String>::new(), "LIO SCSI devices left");
    let records: Vec<_> = fs::read_dir(format!("{BASE}/state/volumes"))
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(records.is_empty(), "stage records left: {records:?}");
    let mounts = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let ours: Vec<&str> = mounts.lines().filter(|l| l.contains(BASE)).collect();
    assert!(ours.is_empty(), "mounts left: {ours:?}");
}

fn stage_req(id: &str, lun: u32, block: bool) -> NodeStageVolumeRequest {
    let staging = format!("{BASE}/plugins/staging/{id}");
    fs::create_dir_all(&staging).unwrap();
    NodeStageVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging,
        volume_capability: capability(block, Mode::SingleNodeWriter),
        volume_context: attributes(lun),
        ..Default::default()
    }
}

fn publish_req(
    stage: &NodeStageVolumeRequest,
    pod: &str,
    readonly: bool,
) -> NodePublishVolumeRequest {
    let pod_dir = format!("{BASE}/pods/{pod}/volumes");
    fs::create_dir_all(&pod_dir).unwrap();
    NodePublishVolumeRequest {
        volume_id: stage.volume_id.clone(),
        staging_target_path: stage.staging_target_path.clone(),
        target_path: format!("{pod_dir}/{}", stage.volume_id),
        volume_capability: stage.volume_capability.clone(),
        readonly,
        volume_context: stage.volume_context.clone(),
        ..Default::default()
    }
}

fn unpublish(c: &mut Client, p: &NodePublishVolumeRequest) {
    let req = NodeUnpublishVolumeRequest {
        volume_id: p.volume_id.clone(),
        target_path: p.target_path.clone(),
    };
    c.node_unpublish_volume(req.clone()).expect("unpublish");
    c.node_unpublish_volume(req)
        .expect("unpublish again (idempotent)");
    assert!(
        !Path::new(&p.target_path).exists(),
        "{} left",
        p.target_path
    );
}

fn unstage_req(s: &NodeStageVolumeRequest) -> NodeUnstageVolumeRequest {
    NodeUnstageVolumeRequest {
        volume_id: s.volume_id.clone(),
        staging_target_path: s.staging_target_path.clone(),
    }
}

/// The multipath map over both paths exists (the plugin logged in through both portals and
/// waited for multipathd's map).
fn assert_staged_on_both_paths() {
    assert_eq!(our_sessions(), PORTALS.to_vec(), "one session per portal");
    let maps = multipath::maps();
    assert_eq!(maps.len(), 1, "one map: {maps:?}");
    assert_eq!(maps[0].paths.len(), 2, "both paths in the map: {maps:?}");
}

#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn block_volume_through_kubelets_sequence() {
    require_vm();
    let lab = Lab::build();
    let mut c = lab.client();
    let info = c
        .get_plugin_info(GetPluginInfoRequest {})
        .expect("plugin info");
    assert_eq!(info.name, "csi.lunkit.invalid");

    let stage = stage_req("pv-block", 0, true);
    c.node_stage_volume(stage.clone()).expect("stage");
    assert_staged_on_both_paths();
    c.node_stage_volume(stage.clone())
        .expect("stage again (idempotent)");
    assert_staged_on_both_paths();

    let a = publish_req(&stage, "a", false);
    let b = publish_req(&stage, "b", false);
    for p in [&a, &b] {
        c.node_publish_volume(p.clone()).expect("publish");
        c.node_publish_volume(p.clone())
            .expect("publish again (idempotent)");
    }

    // Pod a writes through its bind mount of the device node and syncs.
    let data = random(256 << 10, 17);
    let offset = 4 << 20;
    {
        let mut f = fs::OpenOptions::new()
            .write(true)
            .open(&a.target_path)
            .expect("open pod a's device");
        f.seek(SeekFrom::Start(offset)).unwrap();
        f.write_all(&data).expect("write through pod a");
        f.sync_all().unwrap();
    }
    // Pod b reads it back through its own bind mount.
    {
        let mut f = fs::File::open(&b.target_path).expect("open pod b's device");
        f.seek(SeekFrom::Start(offset)).unwrap();
        let mut back = vec![0u8; data.len()];
        f.read_exact(&mut back).unwrap();
        assert!(back == data, "pod b reads what pod a wrote");
    }

    let stats = c
        .node_get_volume_stats(NodeGetVolumeStatsRequest {
            volume_id: stage.volume_id.clone(),
            volume_path: a.target_path.clone(),
            staging_target_path: stage.staging_target_path.clone(),
        })
        .expect("stats");
    assert_eq!(stats.usage.len(), 1);
    assert_eq!(
        stats.usage[0].total, LUN_SIZE as i64,
        "capacity of the block volume"
    );
    let cond = stats.volume_condition.expect("a condition");
    assert!(!cond.abnormal, "condition: {}", cond.message);

    // Still published: unstage must refuse and remove nothing.
    let e = c
        .node_unstage_volume(unstage_req(&stage))
        .expect_err("unstage while published");
    assert_eq!(e.code(), Code::FailedPrecondition, "{}", e.message());
    assert!(e.message().contains("pv-block"), "{}", e.message());
    assert_staged_on_both_paths();

    unpublish(&mut c, &a);
    unpublish(&mut c, &b);
    c.node_unstage_volume(unstage_req(&stage)).expect("unstage");
    c.node_unstage_volume(unstage_req(&stage))
        .expect("unstage again (idempotent)");
    assert_node_clean();

    let mut image = fs::File::open(backing_file(0)).unwrap();
    image.seek(SeekFrom::Start(offset)).unwrap();
    let mut on_target = vec![0u8; data.len()];
    image.read_exact(&mut on_target).unwrap();
    assert!(
        on_target == data,
        "the target's backing file holds what pod a wrote"
    );
    drop(lab);
}

#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn filesystem_volume_through_kubelets_sequence() {
    require_vm();
    let lab = Lab::build();
    let mut c = lab.client();

    let stage = stage_req("pv-fs", 1, false);
    c.node_stage_volume(stage.clone()).expect("stage");
    assert_staged_on_both_paths();
    let blkid = cmd::run(
        "blkid",
        &["-p", "-o", "value", "-s", "TYPE", &multipath_dev()],
    )
    .expect("blkid");
    assert_eq!(blkid.trim(), "ext4", "the blank LUN was formatted");
    c.node_stage_volume(stage.clone())
        .expect("stage again (idempotent)");

    let a = publish_req(&stage, "a", false);
    let b = publish_req(&stage, "b", true);
    for p in [&a, &b] {
        c.node_publish_volume(p.clone()).expect("publish");
        c.node_publish_volume(p.clone())
            .expect("publish again (idempotent)");
    }
    let data = random(192 << 10, 23);
    {
        let mut f =
            fs::File::create(Path::new(&a.target_path).join("data")).expect("create in pod a");
        f.write_all(&data).unwrap();
        f.sync_all().unwrap();
    }
    assert!(
        fs::read(Path::new(&b.target_path).join("data")).unwrap() == data,
        "pod b sees pod a's file"
    );
    let ro = fs::File::create(Path::new(&b.target_path).join("nope"));
    assert_eq!(
        ro.map(drop).map_err(|e| e.raw_os_error()),
        Err(Some(libc::EROFS)),
        "pod b's publish is read-only"
    );

    let stats = c
        .node_get_volume_stats(NodeGetVolumeStatsRequest {
            volume_id: stage.volume_id.clone(),
            volume_path: a.target_path.clone(),
            staging_target_path: String::new(),
        })
        .expect("stats");
    let bytes = stats
        .usage
        .iter()
        .find(|u| u.unit == volume_usage::Unit::Bytes as i32)
        .expect("bytes");
    let inodes = stats
        .usage
        .iter()
        .find(|u| u.unit == volume_usage::Unit::Inodes as i32)
        .expect("inodes");
    assert!(
        bytes.total > 0 && bytes.total <= LUN_SIZE as i64,
        "{bytes:?}"
    );
    assert!(bytes.used >= data.len() as i64, "{bytes:?}");
    assert!(inodes.used > 0 && inodes.total > inodes.used, "{inodes:?}");

    // Published in two pods: unstage refuses, nothing removed, the staging mount stays.
    let e = c
        .node_unstage_volume(unstage_req(&stage))
        .expect_err("unstage while published");
    assert_eq!(e.code(), Code::FailedPrecondition, "{}", e.message());
    assert!(e.message().contains("still published"), "{}", e.message());
    assert_staged_on_both_paths();
    assert!(fs::read(Path::new(&a.target_path).join("data")).unwrap() == data);

    unpublish(&mut c, &a);
    unpublish(&mut c, &b);
    c.node_unstage_volume(unstage_req(&stage)).expect("unstage");
    c.node_unstage_volume(unstage_req(&stage))
        .expect("unstage again (idempotent)");
    assert_node_clean();

    // ext4 put the file's blocks somewhere on the LUN: find them, block-aligned, in the image.
    let image = fs::read(backing_file(1)).unwrap();
    let found = (0..image.len().saturating_sub(data.len()))
        .step_by(1024)
        .any(|off| image[off..off + data.len()] == data[..]);
    assert!(
        found,
        "the target's backing file holds the file pod a wrote"
    );
    drop(lab);
}

/// The one multipath map's device node.
fn multipath_dev() -> String {
    let maps = multipath::maps();
    format!("/dev/mapper/{}", maps[0].name)
}

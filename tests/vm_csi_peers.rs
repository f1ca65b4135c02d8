//! VM tests of the CSI node plugin with the peers' PVs as they are (issue 37): the volume
//! attributes of kubernetes-csi's csi-driver-iscsi example PV (`examples/pv.yaml`: one portal,
//! `discovery`, `discoveryCHAPAuth`) and csi-driver-nvmf's (`examples/kubernetes/*/pv.yaml`:
//! `deviceID`, with its own `hostNqn`/`hostId`, and `deviceEUI`), staged and unstaged by a CSI
//! client over the plugin's socket, against the lab's LIO and nvmet targets with two portals.
//!
//! Run by `cargo xtask test` inside the QEMU guest (ignored on the host); the plugin binary
//! comes from `LUNKIT_CSI_BIN`.

// The tests start the plugin and read the lab with the fixtures' tools.
#![allow(clippy::disallowed_methods)]

use lunkit_lab as support;

mod csi_plugin;

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use csi_plugin::{Plugin, Ready};
use lunkit_csi::proto::volume_capability::{
    AccessMode, AccessType, BlockVolume, access_mode::Mode,
};
use lunkit_csi::proto::*;
use lunkit_csi::{Client, Code};
use support::iscsi;
use support::lio::{LioConfig, LioTarget};
use support::multipath::{self, Multipathd};
use support::nvmet;
use support::{cmd, require_vm};

const IQN: &str = "iqn.2003-01.org.linux-iscsi.lunkit:csi-peers";
const PORTALS: [&str; 2] = ["127.0.0.1:3260", "127.0.0.2:3260"];
const NVME_NQN: &str = "nqn.2022-08.org.test-nvmf.example";
/// The node's own NVMe host identity, in `/etc/nvme`.
const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:6c1d8a70-1c9e-4d5e-9a40-3b4c5d6e7f81";
const HOSTID: &str = "6c1d8a70-1c9e-4d5e-9a40-3b4c5d6e7f81";
/// A volume's own (`hostNqn`, `hostId`).
const VOLUME_HOSTNQN: &str = "nqn.2014-08.org.example:host-of-pv-nvmf";
const VOLUME_HOSTID: &str = "0f8fad5b-d9cb-469f-a165-70867728950e";
const BASE: &str = "/tmp/lunkit-csi-peers";
const LUN_SIZE: u64 = 32 << 20;
const DISCOVERY_AUTH: &str = "/sys/kernel/config/target/iscsi/discovery_auth";
const DISCOVERY_USER: &str = "lunkit-discovery";
const DISCOVERY_SECRET: &str = "disc-s3cret-5e7a";

/// A target (LIO or nvmet), iscsid and multipathd for iSCSI, and the plugin; no session: the
/// plugin logs in. Dropping it tears everything down in the safe order.
struct Lab {
    plugin: Option<Plugin>,
    multipathd: Option<Multipathd>,
    started_iscsid: bool,
    target: Option<LioTarget>,
    nvmet: Option<nvmet::Target>,
    made_etc_nvme: bool,
    discovery_auth: bool,
}

impl Lab {
    fn empty() -> Lab {
        let _ = fs::remove_dir_all(BASE);
        fs::create_dir_all(BASE).unwrap();
        Lab {
            plugin: None,
            multipathd: None,
            started_iscsid: false,
            target: None,
            nvmet: None,
            made_etc_nvme: false,
            discovery_auth: false,
        }
    }

    /// One 32 MiB LUN behind both portals, target [`IQN`], which answers SendTargets only
    /// to an initiator that authenticates as [`DISCOVERY_USER`]; iscsid, multipathd.
    fn build_iscsi() -> Lab {
        let mut lab = Lab::empty();
        lab.target = Some(
            LioTarget::create(LioConfig {
                iqn: IQN.into(),
                luns: 1,
                lun_size: LUN_SIZE,
                portals: PORTALS.iter().map(|p| (*p).to_owned()).collect(),
            })
            .expect("the LIO target"),
        );
        lab.discovery_auth = true;
        for (attr, value) in [
            ("userid", DISCOVERY_USER),
            ("password", DISCOVERY_SECRET),
            ("enforce_discovery_auth", "1"),
        ] {
            fs::write(format!("{DISCOVERY_AUTH}/{attr}"), value)
                .unwrap_or_else(|e| panic!("{DISCOVERY_AUTH}/{attr}: {e}"));
        }
        lab.started_iscsid = iscsi::ensure_iscsid().expect("iscsid");
        lab.multipathd = Some(Multipathd::start(multipath::DEFAULT_CONF).expect("multipathd"));
        lab.start_plugin();
        lab
    }

    /// An nvmet subsystem [`NVME_NQN`] with one 32 MiB namespace on the two lab ports, and
    /// this node's host identity in `/etc/nvme`.
    fn build_nvme() -> Lab {
        let mut lab = Lab::empty();
        lab.made_etc_nvme = !Path::new("/etc/nvme").exists();
        fs::create_dir_all("/etc/nvme").unwrap();
        fs::write("/etc/nvme/hostnqn", format!("{HOSTNQN}\n")).unwrap();
        fs::write("/etc/nvme/hostid", format!("{HOSTID}\n")).unwrap();
        lab.nvmet = Some(
            nvmet::Target::builder()
                .nqn(NVME_NQN)
                .namespace(LUN_SIZE)
                .build()
                .expect("the nvmet target"),
        );
        lab.start_plugin();
        lab
    }

    /// Starts the plugin and waits until it answers a probe.
    fn start_plugin(&mut self) {
        let limit = Duration::from_secs(60);
        self.plugin = Some(Plugin::start(
            Plugin::binary(),
            BASE,
            &[],
            Ready::Probe,
            limit,
        ));
    }

    fn client(&self) -> Client {
        self.plugin.as_ref().expect("the plugin runs").client()
    }

    /// The persistent discovery controller the plugin says it follows the service on, once
    /// it says so (within `limit`).
    fn following(&self, limit: Duration) -> String {
        let plugin = self.plugin.as_ref().expect("the plugin runs");
        let said = "on persistent discovery controller ";
        support::wait::until("the plugin to follow the discovery service", limit, || {
            Ok(plugin
                .log()
                .lines()
                .find_map(|l| l.split_once(said).map(|(_, c)| c.trim().to_owned())))
        })
        .unwrap()
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        // The plugin first (SIGTERM), then whatever a failed test left mounted.
        drop(self.plugin.take());
        csi_plugin::unmount_under(BASE, false);
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
        if self.discovery_auth {
            for (attr, value) in [
                ("enforce_discovery_auth", "0"),
                ("userid", "NULL"),
                ("password", "NULL"),
            ] {
                let _ = fs::write(format!("{DISCOVERY_AUTH}/{attr}"), value);
            }
        }
        if let Some(t) = self.target.take() {
            let _ = t.teardown();
        }
        if let Some(t) = self.nvmet.take() {
            // A follower's persistent discovery controller, when the test failed before
            // the unstage that deletes it.
            for c in nvme_controllers()
                .into_iter()
                .chain(discovery_controllers())
            {
                let _ = fs::write(format!("/sys/class/nvme/{c}/delete_controller"), "1");
            }
            let _ = t.teardown();
        }
        if self.made_etc_nvme {
            let _ = fs::remove_dir_all("/etc/nvme");
        }
        let _ = fs::remove_dir_all(BASE);
    }
}

fn block_capability() -> Option<VolumeCapability> {
    Some(VolumeCapability {
        access_type: Some(AccessType::Block(BlockVolume {})),
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    })
}

fn stage_req(id: &str, attrs: &[(&str, &str)]) -> NodeStageVolumeRequest {
    let staging = format!("{BASE}/plugins/staging/{id}");
    fs::create_dir_all(&staging).unwrap();
    NodeStageVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging,
        volume_capability: block_capability(),
        volume_context: attrs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        ..Default::default()
    }
}

fn unstage_req(s: &NodeStageVolumeRequest) -> NodeUnstageVolumeRequest {
    NodeUnstageVolumeRequest {
        volume_id: s.volume_id.clone(),
        staging_target_path: s.staging_target_path.clone(),
    }
}

/// Publishes `stage`'s raw-block volume to a pod, checks the pod's device is a block device of
/// `size` bytes, and unpublishes it.
fn publish_and_unpublish(c: &mut Client, stage: &NodeStageVolumeRequest, size: u64) {
    let pod_dir = format!("{BASE}/pods/a/volumes");
    fs::create_dir_all(&pod_dir).unwrap();
    let target = format!("{pod_dir}/{}", stage.volume_id);
    c.node_publish_volume(NodePublishVolumeRequest {
        volume_id: stage.volume_id.clone(),
        staging_target_path: stage.staging_target_path.clone(),
        target_path: target.clone(),
        volume_capability: stage.volume_capability.clone(),
        volume_context: stage.volume_context.clone(),
        ..Default::default()
    })
    .expect("publish");
    let got =
        cmd::run("blockdev", &["--getsize64", &target]).expect("blockdev on the pod's device");
    assert_eq!(
        got.trim(),
        size.to_string(),
        "the pod's device is the volume"
    );
    c.node_unpublish_volume(NodeUnpublishVolumeRequest {
        volume_id: stage.volume_id.clone(),
        target_path: target.clone(),
    })
    .expect("unpublish");
    assert!(!Path::new(&target).exists(), "{target} left");
}

/// The portals of the sessions to [`IQN`], sorted.
fn our_sessions() -> Vec<String> {
    let mut v: Vec<String> = iscsi::sessions()
        .into_iter()
        .filter(|s| s.target == IQN)
        .map(|s| s.portal)
        .collect();
    v.sort();
    v
}

/// Every file under `/etc/iscsi` that holds `secret`.
fn files_holding(secret: &str) -> Vec<PathBuf> {
    fn walk(dir: &Path, secret: &str, out: &mut Vec<PathBuf>) {
        for e in fs::read_dir(dir).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, secret, out);
            } else if fs::read_to_string(&p).is_ok_and(|t| t.contains(secret)) {
                out.push(p);
            }
        }
    }
    let mut out = Vec::new();
    walk(Path::new("/etc/iscsi"), secret, &mut out);
    out
}

fn stage_records() -> Vec<String> {
    fs::read_dir(format!("{BASE}/state/volumes"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| fs::read_to_string(e.path()).ok())
                .collect()
        })
        .unwrap_or_default()
}

fn node_initiator_name() -> String {
    fs::read_to_string("/etc/iscsi/initiatorname.iscsi")
        .expect("/etc/iscsi/initiatorname.iscsi")
        .lines()
        .find_map(|l| l.trim().strip_prefix("InitiatorName=").map(str::to_owned))
        .expect("an InitiatorName= line")
}

/// csi-driver-iscsi's example PV as it is (one `targetPortal`, `portals: "[]"`, `discovery`,
/// `discoveryCHAPAuth`), against a target whose SendTargets answers only with discovery CHAP
/// and that has a second portal the PV does not name: another `initiatorName` than the node's
/// is refused with nothing done; a wrong discovery secret fails the stage with no session and
/// no record; the right one finds both portals from the one named, logs in to both (one
/// multipath map over two paths), and leaves no discovery record and no file with the
/// secret; unstage logs out of both and leaves nothing. Then the same without discovery CHAP.
#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn csi_driver_iscsi_example_pv_discovers_both_portals_with_discovery_chap() {
    require_vm();
    let lab = Lab::build_iscsi();
    let mut c = lab.client();
    let me = node_initiator_name();
    let attrs = [
        ("targetPortal", PORTALS[0]),
        ("portals", "[]"),
        ("iqn", IQN),
        ("lun", "0"),
        ("iscsiInterface", "default"),
        ("discovery", "true"),
        ("discoveryCHAPAuth", "true"),
        ("sessionCHAPAuth", "false"),
        ("initiatorName", me.as_str()),
    ];
    let secrets = |password: &str| {
        HashMap::from([
            (
                "discovery.sendtargets.auth.username".to_owned(),
                DISCOVERY_USER.to_owned(),
            ),
            (
                "discovery.sendtargets.auth.password".to_owned(),
                password.to_owned(),
            ),
        ])
    };

    // Another initiator name: refused before anything is done.
    let mut other = stage_req("pv-other-initiator", &attrs);
    other.volume_context.insert(
        "initiatorName".into(),
        "iqn.2016-04.com.example:not-this-node".into(),
    );
    other.secrets = secrets(DISCOVERY_SECRET);
    let e = c
        .node_stage_volume(other)
        .expect_err("another initiator name");
    assert_eq!(e.code(), Code::FailedPrecondition, "{}", e.message());
    assert!(
        e.message().contains(&me),
        "names the node's name: {}",
        e.message()
    );
    assert_eq!(our_sessions(), Vec::<String>::new());
    assert!(stage_records().is_empty(), "no stage record");

    // A wrong discovery secret: the discovery fails on the one portal, nothing is left.
    let mut stage = stage_req("pv-iscsi-example", &attrs);
    stage.secrets = secrets("wr0ng-s3cret-5e7a");
    let e = c
        .node_stage_volume(stage.clone())
        .expect_err("a wrong discovery secret");
    eprintln!("wrong discovery secret: {:?}: {}", e.code(), e.message());
    assert!(
        matches!(e.code(), Code::PermissionDenied | Code::Internal),
        "{:?}: {}",
        e.code(),
        e.message()
    );
    assert!(
        e.message().contains("SendTargets discovery") && !e.message().contains("wr0ng"),
        "{}",
        e.message()
    );
    assert_eq!(our_sessions(), Vec::<String>::new(), "no session");
    assert!(stage_records().is_empty(), "no stage record");
    assert_eq!(files_holding("wr0ng-s3cret-5e7a"), Vec::<PathBuf>::new());

    // The right one: both portals from the one named.
    stage.secrets = secrets(DISCOVERY_SECRET);
    c.node_stage_volume(stage.clone()).expect("stage");
    assert_eq!(
        our_sessions(),
        PORTALS.to_vec(),
        "a session through each portal"
    );
    let maps = multipath::maps();
    assert_eq!(maps.len(), 1, "one map: {maps:?}");
    assert_eq!(maps[0].paths.len(), 2, "both paths in the map: {maps:?}");
    let records = stage_records();
    assert_eq!(records.len(), 1, "{records:?}");
    let record: serde_json::Value = serde_json::from_str(&records[0]).unwrap();
    assert_eq!(
        record["target"]["discovered"],
        serde_json::json!(["127.0.0.2:3260"]),
        "the discovered portal is recorded: {record}"
    );
    assert_eq!(
        files_holding(DISCOVERY_SECRET),
        Vec::<PathBuf>::new(),
        "the discovery record with the secret is gone"
    );
    c.node_stage_volume(stage.clone())
        .expect("stage again (idempotent)");
    publish_and_unpublish(&mut c, &stage, LUN_SIZE);

    c.node_unstage_volume(unstage_req(&stage)).expect("unstage");
    c.node_unstage_volume(unstage_req(&stage))
        .expect("unstage again (idempotent)");
    assert_eq!(our_sessions(), Vec::<String>::new(), "sessions left");
    assert_eq!(multipath::maps(), Vec::new(), "maps left");
    assert!(
        !Path::new("/etc/iscsi/nodes").join(IQN).exists()
            || fs::read_dir(Path::new("/etc/iscsi/nodes").join(IQN))
                .unwrap()
                .next()
                .is_none(),
        "node records left"
    );
    assert!(stage_records().is_empty(), "stage records left");

    // Without discovery CHAP (the target no longer asks for it): iscsiadm's plain discovery
    // mode, the same two portals, no record of any kind left after unstage.
    fs::write(format!("{DISCOVERY_AUTH}/enforce_discovery_auth"), "0").unwrap();
    let mut plain = stage_req("pv-iscsi-plain-discovery", &attrs);
    plain
        .volume_context
        .insert("discoveryCHAPAuth".into(), "false".into());
    c.node_stage_volume(plain.clone())
        .expect("stage with plain discovery");
    assert_eq!(
        our_sessions(),
        PORTALS.to_vec(),
        "a session through each portal"
    );
    c.node_unstage_volume(unstage_req(&plain)).expect("unstage");
    assert_eq!(our_sessions(), Vec::<String>::new(), "sessions left");
    let send_targets: Vec<_> = fs::read_dir("/etc/iscsi/send_targets")
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(
        send_targets.is_empty(),
        "discovery records left: {send_targets:?}"
    );
    drop(lab);
}

fn nvme_controllers() -> Vec<String> {
    support::sysfs::names("/sys/class/nvme")
        .into_iter()
        .filter(|c| {
            support::sysfs::attr(format!("/sys/class/nvme/{c}/subsysnqn")).as_deref()
                == Some(NVME_NQN)
        })
        .collect()
}

/// `attr` of every controller of [`NVME_NQN`], sorted.
fn controllers_attr(attr: &str) -> Vec<String> {
    let mut v: Vec<String> = nvme_controllers()
        .into_iter()
        .filter_map(|c| support::sysfs::attr(format!("/sys/class/nvme/{c}/{attr}")))
        .map(|a| a.trim().to_owned())
        .collect();
    v.sort();
    v
}

/// csi-driver-nvmf's example PVs as they are: `deviceID: uuid.<UUID>` with the volume's own
/// `hostNqn` and `hostId` (the controller presents them, not the node's), then `deviceEUI`
/// naming the namespace's NGUID (the kernel shows it as `uuid.…`, which has precedence)
/// as the node; each stages, is published as a raw block device of the namespace's size,
/// and unstages leaving no controller.
#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn csi_driver_nvmf_example_pvs_by_device_id_with_their_own_host_identity() {
    require_vm();
    let lab = Lab::build_nvme();
    let mut c = lab.client();
    let ns = lab.nvmet.as_ref().unwrap().namespace(1).unwrap().clone();
    let base = [
        ("targetTrAddr", "127.0.0.1"),
        ("targetTrPort", "4420"),
        ("targetTrType", "tcp"),
        ("nqn", NVME_NQN),
    ];

    let device_id = format!("uuid.{}", ns.uuid);
    let mut attrs = base.to_vec();
    attrs.extend([
        ("deviceID", device_id.as_str()),
        ("hostNqn", VOLUME_HOSTNQN),
        ("hostId", VOLUME_HOSTID),
    ]);
    let stage = stage_req("pv-nvmf-device-id", &attrs);
    c.node_stage_volume(stage.clone())
        .expect("stage by deviceID");
    assert_eq!(
        nvme_controllers().len(),
        1,
        "one controller: the PV names one port"
    );
    assert_eq!(
        controllers_attr("hostnqn"),
        [VOLUME_HOSTNQN],
        "the volume's host NQN"
    );
    assert_eq!(
        controllers_attr("hostid"),
        [VOLUME_HOSTID],
        "the volume's host id"
    );
    publish_and_unpublish(&mut c, &stage, LUN_SIZE);
    c.node_unstage_volume(unstage_req(&stage)).expect("unstage");
    assert_eq!(nvme_controllers(), Vec::<String>::new(), "controllers left");
    assert!(stage_records().is_empty(), "stage records left");

    let eui: String = ns.nguid.chars().filter(|c| *c != '-').collect();
    let mut attrs = base.to_vec();
    attrs.push(("deviceEUI", eui.as_str()));
    let stage = stage_req("pv-nvmf-device-eui", &attrs);
    c.node_stage_volume(stage.clone())
        .expect("stage by deviceEUI");
    assert_eq!(
        controllers_attr("hostnqn"),
        [HOSTNQN],
        "the node's host NQN"
    );
    publish_and_unpublish(&mut c, &stage, LUN_SIZE);
    c.node_unstage_volume(unstage_req(&stage)).expect("unstage");
    assert_eq!(nvme_controllers(), Vec::<String>::new(), "controllers left");
    assert!(stage_records().is_empty(), "stage records left");
    drop(lab);
}

/// The node's controllers of any subsystem to the discovery NQN.
fn discovery_controllers() -> Vec<String> {
    support::sysfs::names("/sys/class/nvme")
        .into_iter()
        .filter(|c| {
            support::sysfs::attr(format!("/sys/class/nvme/{c}/subsysnqn")).as_deref()
                == Some("nqn.2014-08.org.nvmexpress.discovery")
        })
        .collect()
}

/// lunkit's own `discoveryAddrs` (issue 35, items 3 and 6): a PV that names no port, only
/// the discovery service on the first one, whose log refers to the second (nvmet lists a
/// port's own subsystems only). Stage connects both ports and records the address.
///
/// The plugin then follows that service on a persistent discovery controller: a third port
/// the array adds reaches the staged volume, and goes again when the array takes it back,
/// with no call made. Unstage leaves no controller, and the discovery controller goes with
/// the last volume that names the service.
#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn a_pv_with_only_a_discovery_address_is_staged_on_every_port_it_lists() {
    require_vm();
    let mut lab = Lab::build_nvme();
    lab.nvmet
        .as_mut()
        .unwrap()
        .add_referral(1, "to-2", "127.0.0.2", "4420")
        .unwrap();
    let mut c = lab.client();
    let attrs = [
        ("nqn", NVME_NQN),
        ("nsid", "1"),
        ("discoveryAddrs", "127.0.0.1:4420"),
    ];
    let stage = stage_req("pv-nvme-discovery", &attrs);
    c.node_stage_volume(stage.clone())
        .expect("stage through discovery");
    assert_eq!(addresses(), ["127.0.0.1", "127.0.0.2"], "both ports");
    let records = stage_records();
    assert!(
        records.len() == 1 && records[0].contains("127.0.0.1:4420"),
        "the record keeps the discovery address: {records:?}"
    );
    // The plugin follows the service from its own thread: a bound on the wait, not a check
    // of how fast. Its controller counts once the follower read the log through it (it
    // says so), so that the port below comes as a change of the log, not in that read.
    let minute = Duration::from_secs(60);
    let ours = lab.following(minute);
    assert_eq!(
        discovery_controllers(),
        std::slice::from_ref(&ours),
        "one discovery controller"
    );
    let target = lab.nvmet.as_mut().unwrap();
    target
        .add_port(nvmet::PortConfig::new(3, "127.0.0.3", "4420"))
        .unwrap();
    target.add_referral(1, "to-3", "127.0.0.3", "4420").unwrap();
    support::wait::until_true("the third port's path, with no call", minute, || {
        addresses() == ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
    })
    .unwrap();
    publish_and_unpublish(&mut c, &stage, LUN_SIZE);
    target.remove_referral(1, "to-3").unwrap();
    support::wait::until_true("the third port's path gone, with no call", minute, || {
        addresses() == ["127.0.0.1", "127.0.0.2"]
    })
    .unwrap();
    target.remove_port(3).unwrap();
    // A plugin killed and started again takes the controller it made (its marker), not a
    // second one, and still deletes it with the last volume. Asked once it says it follows:
    // before, the follower's read of the log connects the referral's port for a moment.
    lab.plugin.take().expect("the plugin runs").stop("KILL");
    lab.start_plugin();
    assert_eq!(lab.following(minute), ours, "the controller it made, taken");
    assert_eq!(discovery_controllers(), [ours], "no second controller");
    let mut c = lab.client();
    c.node_unstage_volume(unstage_req(&stage)).expect("unstage");
    assert_eq!(nvme_controllers(), Vec::<String>::new(), "controllers left");
    assert!(stage_records().is_empty(), "stage records left");
    support::wait::until_true(
        "the discovery controller gone with the volume",
        minute,
        || discovery_controllers().is_empty(),
    )
    .unwrap();
    assert_eq!(
        nvme_controllers(),
        Vec::<String>::new(),
        "no path connected again after the unstage"
    );
    drop(lab);
}

/// The address (`traddr`) of every controller of [`NVME_NQN`], sorted.
fn addresses() -> Vec<String> {
    let mut v: Vec<String> = controllers_attr("address")
        .iter()
        .map(|a| {
            a.split(',')
                .find_map(|kv| kv.strip_prefix("traddr="))
                .unwrap_or_default()
                .to_owned()
        })
        .collect();
    v.sort();
    v
}

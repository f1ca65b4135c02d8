use super::*;
use crate::block::sysfs::{BlockDevice, DmInfo};
use crate::nvme::sysfs::{NvmeController, NvmeSubsystem};
use crate::scsi::sysfs::ScsiDevice;

const WWID: &str = "naa.6001405aaaaaaaaaaaaaaaaaaaaaaaaa";
const OTHER: &str = "naa.6001405bbbbbbbbbbbbbbbbbbbbbbbbb";

fn disk(hctl: &str, name: &str, state: &str, wwid: &str) -> ScsiDevice {
    ScsiDevice {
        hctl: hctl.parse().unwrap(),
        state: Some(state.into()),
        vendor: None,
        model: None,
        rev: None,
        device_type: Some(0),
        wwid: Some(wwid.into()),
        block: Some(name.into()),
        sg: None,
    }
}

fn block(name: &str, slaves: &[&str], map: Option<(&str, &str)>) -> BlockDevice {
    BlockDevice {
        name: name.into(),
        dev: None,
        size_bytes: None,
        read_only: None,
        holders: vec![],
        slaves: slaves.iter().map(|s| (*s).into()).collect(),
        partitions: vec![],
        dm: map.map(|(n, u)| DmInfo {
            name: Some(n.into()),
            uuid: Some(u.into()),
            suspended: Some(false),
        }),
    }
}

fn controller(name: &str, state: &str, transport: &str) -> NvmeController {
    NvmeController {
        name: name.into(),
        transport: Some(transport.into()),
        address: None,
        state: Some(state.into()),
        parsed_state: Some(CtrlState::parse(state)),
        subsysnqn: Some("nqn.2014-08.org.lunkit:a".into()),
        model: None,
        serial: None,
        namespaces: vec![],
        cntlid: None,
        hostnqn: None,
        hostid: None,
    }
}

fn topology() -> Topology {
    Topology {
        scsi_hosts: vec![],
        scsi_devices: vec![],
        block_devices: vec![],
        iscsi_sessions: vec![],
        fc_hosts: vec![],
        fc_rports: vec![],
        nvme_controllers: vec![],
        nvme_subsystems: vec![],
        nvme_namespaces: vec![],
    }
}

fn kinds(t: &Topology) -> Vec<(Kind, Vec<String>)> {
    classify(t)
        .into_iter()
        .map(|f| (f.kind, f.objects))
        .collect()
}

#[test]
fn a_healthy_node_has_no_findings() {
    let mut t = topology();
    let uuid = format!("mpath-3{}", &WWID[4..]);
    t.scsi_devices = vec![
        disk("2:0:0:1", "sda", "running", WWID),
        disk("3:0:0:1", "sdb", "blocked", WWID),
    ];
    t.block_devices = vec![block("dm-0", &["sda", "sdb"], Some(("mpatha", &uuid)))];
    t.nvme_controllers = vec![controller("nvme0", "live", "tcp")];
    // Blocked is a transport recovering, not a device given up on.
    assert_eq!(kinds(&t), vec![]);
}

#[test]
fn down_devices_remapped_paths_and_dead_maps_are_named() {
    let mut t = topology();
    let uuid = format!("mpath-3{}", &WWID[4..]);
    t.scsi_devices = vec![
        disk("2:0:0:1", "sda", "offline", WWID),
        disk("3:0:0:1", "sdb", "transport-offline", WWID),
        disk("3:0:0:2", "sdc", "running", OTHER),
    ];
    t.block_devices = vec![
        block("dm-0", &["sda", "sdb"], Some(("mpatha", &uuid))),
        block("dm-1", &["sdc"], Some(("mpathb", &uuid))),
        block(
            "dm-2",
            &[],
            Some(("mpathc", "mpath-3600140500000000000000000000000c")),
        ),
        block("dm-3", &[], Some(("vg-lv", "LVM-abc"))),
    ];
    let found = classify(&t);
    let got: Vec<(Kind, Vec<String>)> = found.iter().map(|f| (f.kind, f.objects.clone())).collect();
    let s = |v: &[&str]| v.iter().map(|x| (*x).to_owned()).collect::<Vec<_>>();
    assert_eq!(
        got,
        vec![
            (Kind::ScsiDeviceDown, s(&["2:0:0:1", "sda"])),
            (Kind::ScsiDeviceDown, s(&["3:0:0:1", "sdb"])),
            (Kind::MapPathsDown, s(&["mpatha", "dm-0"])),
            (Kind::RemappedPath, s(&["mpathb", "sdc"])),
            (Kind::MapWithoutPaths, s(&["mpathc", "dm-2"])),
        ]
    );
    let remapped = &found[3];
    assert!(remapped.why.contains("re-mapped"), "{}", remapped.why);
    // What decides whether it may go: the map's users, not the path's.
    assert_eq!(remapped.devices, ["dm-1"]);
    assert_eq!(found[0].devices, ["sda"]);
    // The identity a fix checks again before its write: the path's own WWID for a path
    // (the foreign one, for a re-mapped path), the map's for a map.
    assert_eq!(found[0].identity.as_deref(), Some(WWID));
    let wwid = |w: &str| w.parse::<crate::id::Wwid>().unwrap();
    assert_eq!(remapped.identity.as_deref().map(wwid), Some(wwid(OTHER)));
    assert_eq!(found[2].identity.as_deref(), Some(&uuid[6..]));
}

#[test]
fn a_fabrics_controller_not_live_is_found_with_its_subsystems_devices() {
    let mut t = topology();
    t.nvme_controllers = vec![
        controller("nvme0", "live", "tcp"),
        controller("nvme1", "connecting", "tcp"),
        controller("nvme2", "resetting", "pcie"),
    ];
    t.nvme_subsystems = vec![NvmeSubsystem {
        name: "nvme-subsys0".into(),
        nqn: Some("nqn.2014-08.org.lunkit:a".into()),
        model: None,
        serial: None,
        iopolicy: None,
        controllers: vec!["nvme0".into(), "nvme1".into()],
        namespaces: vec!["nvme0n1".into()],
    }];
    let found = classify(&t);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].kind, Kind::NvmeControllerDown);
    assert_eq!(found[0].objects, ["nvme1"]);
    assert_eq!(found[0].devices, ["nvme0n1"]);
    assert!(found[0].why.contains("connecting"), "{}", found[0].why);
}

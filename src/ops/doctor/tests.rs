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
        object: None,
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
    // Blocked is a transport recovering, not a device given up on: a recoverable state,
    // which examine holds to the grace.
    let s = |v: &[&str]| v.iter().map(|x| (*x).to_owned()).collect::<Vec<_>>();
    assert_eq!(
        kinds(&t),
        vec![(Kind::ScsiDeviceBlocked, s(&["3:0:0:1", "sdb"]))]
    );
    assert!(Kind::ScsiDeviceBlocked.recoverable() && Kind::NvmeControllerDown.recoverable());
    t.scsi_devices[1].state = Some("running".into());
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

/// A node under `dir` whose boot clock reads `secs`, with a lock directory.
fn clock(dir: &std::path::Path, secs: u64) -> (Root, DoctorOptions) {
    std::fs::create_dir_all(dir.join("proc")).unwrap();
    std::fs::write(dir.join("proc/uptime"), format!("{secs}.00 0.00\n")).unwrap();
    let root = Root::new(dir);
    let opts = DoctorOptions::new(&root);
    (root, opts)
}

#[test]
fn a_recoverable_state_is_pending_until_it_has_lasted_the_grace() {
    let dir = std::env::temp_dir().join(format!("lunkit-doctor-grace-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut t = topology();
    t.scsi_devices = vec![
        disk("2:0:0:1", "sda", "offline", WWID),
        disk("3:0:0:1", "sdb", "blocked", WWID),
    ];
    t.nvme_controllers = vec![controller("nvme1", "connecting", "tcp")];
    let look = |secs, grace| {
        let (root, mut opts) = clock(&dir, secs);
        opts.grace = Duration::from_secs(grace);
        let mut seen = seen::Seen::load(&root, opts.lock_dir.as_deref()).unwrap();
        let (found, pending) = settle(classify(&t), &mut seen, opts.grace);
        seen.save().unwrap();
        let names = |v: &[Finding]| -> Vec<(Kind, Option<u64>)> {
            v.iter()
                .map(|f| (f.kind, f.since.map(|d| d.as_secs())))
                .collect()
        };
        (names(&found), names(&pending))
    };
    // First seen: the offline device is a finding at once, the others pending.
    let (found, pending) = look(1000, 120);
    assert_eq!(found, [(Kind::ScsiDeviceDown, None)]);
    assert_eq!(
        pending,
        [
            (Kind::ScsiDeviceBlocked, Some(0)),
            (Kind::NvmeControllerDown, Some(0))
        ]
    );
    let (found, pending) = look(1119, 120);
    assert_eq!((found.len(), pending.len()), (1, 2));
    // Past the grace: findings, with how long they were seen.
    let (found, pending) = look(1120, 120);
    assert_eq!(
        found,
        [
            (Kind::ScsiDeviceDown, None),
            (Kind::ScsiDeviceBlocked, Some(120)),
            (Kind::NvmeControllerDown, Some(120))
        ]
    );
    assert!(pending.is_empty());
    // A grace of zero: at once, whatever was seen before.
    std::fs::remove_dir_all(&dir).unwrap();
    let (found, _) = look(5, 0);
    assert_eq!(found.len(), 3);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_fabrics_subsystems_devices_are_its_heads_and_its_controllers_own_namespaces() {
    let mut t = topology();
    let mut c1 = controller("nvme1", "live", "tcp");
    c1.namespaces = vec!["nvme1c1n1".into()];
    let mut c2 = controller("nvme2", "live", "tcp");
    c2.namespaces = vec!["nvme2n1".into()];
    t.nvme_controllers = vec![c1, c2];
    let s = NvmeSubsystem {
        name: "nvme-subsys1".into(),
        nqn: Some("nqn.2014-08.org.lunkit:a".into()),
        model: None,
        serial: None,
        iopolicy: None,
        controllers: vec!["nvme1".into(), "nvme2".into()],
        namespaces: vec!["nvme1n1".into()],
    };
    t.nvme_subsystems = vec![s.clone()];
    assert_eq!(subsystems::devices(&t, &s), ["nvme1n1", "nvme2n1"]);
}

use super::*;
use crate::block::sysfs::{BlockDevice, DmInfo};
use crate::ops::doctor::fix::considered;
use crate::scsi::sysfs::ScsiDevice;

const WWID: &str = "naa.6001405aaaaaaaaaaaaaaaaaaaaaaaaa";

fn device(hctl: &str, block: Option<&str>, state: &str, device_type: u8) -> ScsiDevice {
    ScsiDevice {
        hctl: hctl.parse().unwrap(),
        state: Some(state.into()),
        vendor: None,
        model: None,
        rev: None,
        device_type: Some(device_type),
        wwid: Some(WWID.into()),
        block: block.map(Into::into),
        sg: None,
    }
}

fn map(dm: &str, name: &str, slaves: &[&str]) -> BlockDevice {
    BlockDevice {
        name: dm.into(),
        dev: None,
        size_bytes: None,
        read_only: None,
        holders: vec![],
        slaves: slaves.iter().map(|s| (*s).into()).collect(),
        partitions: vec![],
        dm: Some(DmInfo {
            name: Some(name.into()),
            uuid: Some(format!("mpath-3{}", &WWID[4..])),
            suspended: Some(false),
        }),
    }
}

fn topology(devices: Vec<ScsiDevice>, blocks: Vec<BlockDevice>) -> Topology {
    Topology {
        scsi_hosts: vec![],
        scsi_devices: devices,
        block_devices: blocks,
        iscsi_sessions: vec![],
        fc_hosts: vec![],
        fc_rports: vec![],
        nvme_controllers: vec![],
        nvme_subsystems: vec![],
        nvme_namespaces: vec![],
    }
}

/// TEST UNIT READY's answer with fixed-format sense `key`, `asc`/`ascq`.
fn answer(key: u8, asc: u8, ascq: u8) -> TurStatus {
    let mut sense = [0u8; 18];
    sense[0] = 0x70;
    sense[2] = key;
    sense[7] = 10;
    sense[12] = asc;
    sense[13] = ascq;
    TurStatus::from_reply(0x02, 0, 0x08, &sense)
}

#[test]
fn only_running_disks_with_a_block_device_are_asked() {
    let t = topology(
        vec![
            device("2:0:0:1", Some("sda"), "running", 0),
            device("3:0:0:1", Some("sdb"), "running", 0),
            device("4:0:0:1", Some("sdc"), "offline", 0),
            device("4:0:0:2", Some("sdd"), "blocked", 0),
            device("4:0:0:3", None, "running", 0),
            device("4:0:0:4", Some("sr0"), "running", 5),
        ],
        vec![map("dm-0", "mpatha", &["sdb"])],
    );
    let got = candidates(&t);
    let asked: Vec<(&str, Option<&str>)> = got
        .iter()
        .map(|c| (c.disk.as_str(), c.map.as_ref().map(|m| m.0.as_str())))
        .collect();
    assert_eq!(asked, [("sda", None), ("sdb", Some("mpatha"))]);
    assert_eq!(got[1].map.as_ref().unwrap().1, "dm-0");
    assert_eq!(got[0].wwid.as_deref(), Some(WWID));
}

#[test]
fn only_logical_unit_not_supported_is_a_finding() {
    let t = topology(
        vec![
            device("2:0:0:1", Some("sda"), "running", 0),
            device("3:0:0:7", Some("sdb"), "running", 0),
        ],
        vec![map("dm-0", "mpatha", &["sdb"])],
    );
    let c = candidates(&t);
    let gone = answer(0x05, 0x25, 0x00);

    let alone = finding(&c[0], &gone).unwrap();
    assert_eq!(alone.kind, Kind::LunGone);
    assert_eq!(alone.objects, ["2:0:0:1", "sda"]);
    assert_eq!(alone.devices, ["sda"]);
    assert_eq!(alone.identity.as_deref(), Some(WWID));
    assert!(
        alone
            .why
            .contains("LOGICAL UNIT NOT SUPPORTED (ILLEGAL REQUEST 25/00)"),
        "{}",
        alone.why
    );
    assert!(
        alone.why.ends_with("no longer serves LUN 1"),
        "{}",
        alone.why
    );

    // A map's path: the map named, and its device checked with the path's.
    let path = finding(&c[1], &gone).unwrap();
    assert_eq!(path.objects, ["3:0:0:7", "sdb", "mpatha"]);
    assert_eq!(path.devices, ["sdb", "dm-0"]);
    assert!(path.why.ends_with("LUN 7"), "{}", path.why);

    for other in [
        TurStatus::Ready,
        answer(0x05, 0x24, 0x00),
        answer(0x06, 0x3f, 0x0e),
        answer(0x02, 0x04, 0x01),
        TurStatus::from_reply(0x02, 0, 0x08, &[]),
        TurStatus::from_reply(0x08, 0, 0, &[]),
        TurStatus::from_reply(0x02, 0x01, 0x08, &[0x70, 0, 0x05]),
    ] {
        assert_eq!(finding(&c[0], &other), None, "{other:?}");
    }
}

#[test]
fn lun_gone_is_a_kind_fixed_by_default() {
    assert_eq!("lun-gone".parse::<Kind>().unwrap(), Kind::LunGone);
    assert_eq!(Kind::LunGone.to_string(), "lun-gone");
    assert!(Kind::ALL.contains(&Kind::LunGone));
    assert!(!Kind::LunGone.opt_in());
    let err = "lun-gon".parse::<Kind>().unwrap_err().to_string();
    assert!(err.contains("lun-gone"), "{err}");

    let t = topology(vec![device("2:0:0:1", Some("sda"), "running", 0)], vec![]);
    let f = finding(&candidates(&t)[0], &answer(0x05, 0x25, 0x00)).unwrap();
    assert_eq!(considered(&f, &[]), None);
    assert_eq!(considered(&f, &[Kind::LunGone]), None);
    assert_eq!(
        considered(&f, &[Kind::ScsiDeviceDown]),
        Some(FixOutcome::NotSelected { opt_in: false })
    );
}

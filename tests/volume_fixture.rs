//! Finding a volume's devices (`ops::volume`) on the sysfs tree captured from the VM lab: two
//! iSCSI sessions, LUNs 0 and 1 on each, a multipath map per LUN (tests/fixtures/iscsi-multipath).

mod common;

use std::path::Path;

use common::Scratch;
use lunkit::ops::volume::{self, Identity, VolumeSpec};
use lunkit::{ErrorKind, Hctl, Root};

const IQN: &str = "iqn.2003-01.org.linux-iscsi.lunkit:lab";
const LUN0: &str = "naa.60014055e7a100000000000000000000";
const LUN1: &str = "naa.60014055e7a100000010000000000000";

fn root() -> Root {
    Root::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/iscsi-multipath"))
}

fn hctls(v: &[&str]) -> Vec<Hctl> {
    v.iter().map(|s| s.parse().unwrap()).collect()
}

fn identify(spec: VolumeSpec) -> Identity {
    volume::identify(&root(), &spec).unwrap()
}

#[test]
fn every_name_of_a_volume_finds_the_same_devices() {
    let by_wwid = identify(VolumeSpec::Wwid(LUN1.parse().unwrap()));
    let by_mpath_wwid = identify(VolumeSpec::Wwid(
        "360014055e7a100000010000000000000".parse().unwrap(),
    ));
    assert_eq!(by_wwid.key(), by_mpath_wwid.key());
    let specs = [
        VolumeSpec::Iscsi {
            target: IQN.parse().unwrap(),
            lun: 1,
        },
        VolumeSpec::Device("6:0:0:1".into()),
        VolumeSpec::Device("7:0:0:1".into()),
        VolumeSpec::Wwid(LUN1.parse().unwrap()),
    ];
    let want = volume::locate(&root(), &by_wwid).unwrap();
    assert_eq!(want.maps.len(), 1, "{want:?}");
    assert_eq!(
        want.paths.iter().map(|p| p.hctl).collect::<Vec<_>>(),
        hctls(&["6:0:0:1", "7:0:0:1"])
    );
    // Each path's identity, from what the look read once, is what a fresh look at its
    // address reads: its scsi_device and disk objects, and its WWID.
    for p in &want.paths {
        assert_eq!(
            p.identity,
            lunkit::scsi::PathIdentity::of(&root(), p.hctl),
            "{p:?}"
        );
        let i = &p.identity;
        assert!(i.device.is_some() && i.disk.is_some(), "{p:?}");
        assert_eq!(i.wwid, Some(LUN1.parse().unwrap()), "{p:?}");
    }
    for spec in specs {
        let id = identify(spec.clone());
        assert_eq!(id.key(), by_wwid.key(), "{spec}");
        let got = volume::locate(&root(), &id).unwrap();
        assert_eq!(got.maps, want.maps, "{spec}");
        assert_eq!(got.paths, want.paths, "{spec}");
        assert!(got.strangers.is_empty(), "{spec}");
    }
}

#[test]
fn a_map_name_and_its_kernel_name_name_the_volume() {
    let by_wwid = identify(VolumeSpec::Wwid(LUN0.parse().unwrap()));
    let state = volume::locate(&root(), &by_wwid).unwrap();
    let map = &state.maps[0];
    assert_eq!(map.name, "mpatha");
    for spec in ["mpatha", map.node.name.as_str()] {
        let id = identify(VolumeSpec::Device(spec.into()));
        assert_eq!(id.key(), by_wwid.key(), "{spec}");
    }
    // The volume's paths are both sessions' LUN 0, with their disks.
    for p in &state.paths {
        assert_eq!(p.hctl.lun, 0);
        assert!(p.disk.is_some(), "{p}");
    }
    assert_eq!(state.own_dm(), std::slice::from_ref(&map.node.name));
}

#[test]
fn nothing_there_is_an_empty_volume_and_bad_names_are_invalid() {
    for spec in ["9:0:0:3", "sdzz", "no-such-map", "/dev/sdzz"] {
        let id = identify(VolumeSpec::Device(spec.into()));
        assert!(volume::locate(&root(), &id).unwrap().is_empty(), "{spec}");
    }
    let id = identify(VolumeSpec::Iscsi {
        target: "iqn.2000-01.example:none".parse().unwrap(),
        lun: 0,
    });
    assert!(volume::locate(&root(), &id).unwrap().is_empty());
    for bad in ["../sda", "a/b", "1:2:3", "1:2:3:4:5", "-1:0:0:0", "\0"] {
        let e = volume::identify(&root(), &VolumeSpec::Device(bad.into())).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Invalid, "{bad:?}: {e}");
    }
    // An iSCSI spec takes an IscsiName: a bad one is refused where it is parsed.
    let e = "bad name".parse::<lunkit::id::IscsiName>().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
}

#[test]
fn a_device_at_the_address_with_another_wwid_is_left_alone() {
    // LUN 1's addresses, but the caller's volume is LUN 0: a reused LUN number.
    let id = Identity {
        wwid: Some(LUN0.parse().unwrap()),
        addresses: hctls(&["6:0:0:1"]),
    };
    let state = volume::locate(&root(), &id).unwrap();
    assert_eq!(state.strangers, hctls(&["6:0:0:1"]));
    assert!(state.paths.iter().all(|p| p.hctl.lun == 0), "{state:?}");
}

/// The fixture with 7:0:0:1 (a path of LUN 1's map) reporting no WWID: its VPD read failed,
/// or another LUN was scanned at the address and has not been identified yet.
/// `tag` names the scratch copy: one per test, as the tests of a binary run side by side.
fn without_wwid_of_7_0_0_1(tag: &str) -> Scratch {
    let s = Scratch::with_fixture("iscsi-multipath", tag);
    std::fs::remove_file(
        s.path()
            .join("sys/devices/platform/host7/session2/target7:0:0/7:0:0:1/wwid"),
    )
    .unwrap();
    s
}

#[test]
fn a_device_without_a_wwid_at_the_address_is_not_counted_in() {
    // The caller's volume is LUN 0, and has a WWID; the device at the address it names has
    // none. It may be anything: it must not become a path to delete.
    let s = without_wwid_of_7_0_0_1("volume-no-wwid-lun0");
    let id = Identity {
        wwid: Some(LUN0.parse().unwrap()),
        addresses: hctls(&["7:0:0:1"]),
    };
    let state = volume::locate(&Root::new(s.path()), &id).unwrap();
    assert_eq!(state.strangers, hctls(&["7:0:0:1"]), "{state:?}");
    assert!(
        state.paths.iter().all(|p| p.hctl.lun == 0),
        "a device of unknown identity counted in: {state:?}"
    );
}

#[test]
fn a_path_of_the_volumes_map_without_a_wwid_is_still_its_path() {
    // LUN 1's map holds 7:0:0:1: that proves it is LUN 1's path, WWID or not.
    let s = without_wwid_of_7_0_0_1("volume-no-wwid-lun1");
    let id = Identity {
        wwid: Some(LUN1.parse().unwrap()),
        addresses: hctls(&["6:0:0:1", "7:0:0:1"]),
    };
    let state = volume::locate(&Root::new(s.path()), &id).unwrap();
    let found: Vec<Hctl> = state.paths.iter().map(|p| p.hctl).collect();
    assert_eq!(found, hctls(&["6:0:0:1", "7:0:0:1"]), "{state:?}");
    assert!(state.strangers.is_empty(), "{state:?}");
    assert_eq!(state.maps.len(), 1, "{state:?}");
    // What its delete will hold it to: its objects, and no WWID.
    let p = &state.paths[1];
    assert!(
        p.identity.device.is_some() && p.identity.disk.is_some(),
        "{p:?}"
    );
    assert_eq!(p.identity.wwid, None);
    assert_eq!(
        state.paths[0].identity.wwid,
        Some(LUN1.parse().unwrap()),
        "{state:?}"
    );
}

#[test]
fn a_timeout_too_long_for_a_clock_does_not_panic() {
    // `Instant + Duration::MAX` panics; a detach must saturate its deadline instead.
    let mut opts = lunkit::ops::DetachOptions::new(&root());
    opts.timeout = std::time::Duration::MAX;
    opts.lock_dir = None;
    let report =
        lunkit::ops::detach(&root(), &VolumeSpec::Device("9:0:0:3".into()), &opts).unwrap();
    assert_eq!(report.rounds, 0);
}

#[test]
fn a_failed_step_names_the_step_and_the_device() {
    // The fixture has no /dev/mapper/control: the check of the map cannot read it. The
    // error says which step failed on what, not only the file.
    let mut opts = lunkit::ops::DetachOptions::new(&root());
    opts.timeout = std::time::Duration::from_millis(300);
    opts.lock_dir = None;
    let err =
        lunkit::ops::detach(&root(), &VolumeSpec::Device("mpatha".into()), &opts).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.starts_with("check-in-use ")
            && msg.contains("map mpatha")
            && msg.contains("mapper/control"),
        "{msg}"
    );
    // Its kind is the cause's: a missing file.
    assert_eq!(err.kind(), ErrorKind::NotFound, "{msg}");
}

/// A multipath map whose every path is gone (a logout, a delete behind lunkit's back) is
/// nowhere at the target and LUN any more. With no WWID remembered for that name, a detach by
/// it cannot tell whether the map is the volume's, and must not answer "nothing left"
/// (issue 12 item 8): it refuses, naming the map and how to take it away.
#[test]
fn a_map_left_without_paths_is_not_reported_as_nothing_left() {
    let s = Scratch::with_fixture("iscsi-multipath", "orphan-map");
    let root = Root::new(s.path());
    let mut opts = lunkit::ops::DetachOptions::new(&root);
    opts.lock_dir = Some(s.path().join("locks"));
    let spec = VolumeSpec::Iscsi {
        target: IQN.parse().unwrap(),
        lun: 5,
    };
    // Every map has its paths: nothing at LUN 5 is nothing left.
    let report = lunkit::ops::detach(&root, &spec, &opts).unwrap();
    assert_eq!(report.rounds, 0);

    // LUN 1's map loses both paths.
    for slave in ["sdb", "sdd"] {
        std::fs::remove_file(s.path().join("sys/block/dm-1/slaves").join(slave)).unwrap();
    }
    assert_eq!(
        volume::orphan_maps(&root).unwrap(),
        [lunkit::ops::OrphanMap {
            name: "mpathb".into(),
            dm: "dm-1".into(),
            wwid: "360014055e7a100000010000000000000".into(),
        }]
    );
    let e = lunkit::ops::detach(&root, &spec, &opts).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unverified, "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("map mpathb (dm-1, WWID 360014055e7a100000010000000000000)")
            && msg.contains("detach it by its WWID"),
        "{msg}"
    );
}

/// The fixture with 7:0:0:0 (sdc, a path of LUN 0's map mpatha) reporting another WWID:
/// the array re-mapped LUN 0 on that path and the device was rescanned while multipathd
/// still had it in mpatha.
const REMAPPED: &str = "naa.60014055e7a1000000000000000000ff";

fn with_7_0_0_0_remapped(tag: &str) -> Scratch {
    let s = Scratch::with_fixture("iscsi-multipath", tag);
    std::fs::write(
        s.path()
            .join("sys/devices/platform/host7/session2/target7:0:0/7:0:0:0/wwid"),
        format!("{REMAPPED}\n"),
    )
    .unwrap();
    s
}

#[test]
fn a_map_named_for_another_wwid_is_not_the_volumes() {
    // Volume B is the LUN now at 7:0:0:0. Its path sits in mpatha, named for LUN 0 (A): the
    // map, and A's own path sda (6:0:0:0), are not B's to take down.
    let s = with_7_0_0_0_remapped("foreign-map-b");
    let root = Root::new(s.path());
    let b = Identity {
        wwid: Some(REMAPPED.parse().unwrap()),
        addresses: Vec::new(),
    };
    let state = volume::locate(&root, &b).unwrap();
    assert!(state.maps.is_empty(), "{state:?}");
    assert_eq!(
        state.paths.iter().map(|p| p.hctl).collect::<Vec<_>>(),
        hctls(&["7:0:0:0"])
    );
    assert_eq!(state.foreign_maps.len(), 1, "{state:?}");
    let m = &state.foreign_maps[0];
    assert_eq!(m.name, "mpatha");
    assert_eq!(m.wwid.as_deref(), Some("360014055e7a100000000000000000000"));
    assert_eq!(m.paths.len(), 2, "{m:?}");

    // A detach of B refuses, naming the map and what each path reports; nothing is touched
    // (the fixture has no device-mapper control node: a removal would fail differently).
    let mut opts = lunkit::ops::DetachOptions::new(&root);
    opts.lock_dir = None;
    let e = lunkit::ops::detach(&root, &VolumeSpec::Wwid(REMAPPED.parse().unwrap()), &opts)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Busy, "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("map mpatha (dm-0, named for WWID 360014055e7a100000000000000000000)")
            && msg.contains("reporting 360014055e7a1000000000000000000ff"),
        "{msg}"
    );
}

#[test]
fn a_map_whose_paths_report_two_wwids_is_no_volumes_map() {
    // Volume A (LUN 0) by its WWID: mpatha is named for it, but holds B's path too. It is
    // reported, not A's map; A's path is sda alone, and B's path is not A's.
    let s = with_7_0_0_0_remapped("foreign-map-a");
    let root = Root::new(s.path());
    let a = identify(VolumeSpec::Wwid(LUN0.parse().unwrap()));
    let state = volume::locate(&root, &a).unwrap();
    assert!(state.maps.is_empty(), "{state:?}");
    assert_eq!(
        state.paths.iter().map(|p| p.hctl).collect::<Vec<_>>(),
        hctls(&["6:0:0:0"])
    );
    assert_eq!(
        state
            .foreign_maps
            .iter()
            .map(|m| m.name.as_str())
            .collect::<Vec<_>>(),
        ["mpatha"]
    );
    assert!(!state.is_empty());
    // LUN 1's volume, whose map is its alone, is found as before.
    let lun1 = identify(VolumeSpec::Wwid(LUN1.parse().unwrap()));
    let other = volume::locate(&root, &lun1).unwrap();
    assert_eq!(other.maps.len(), 1, "{other:?}");
    assert!(other.foreign_maps.is_empty(), "{other:?}");
}

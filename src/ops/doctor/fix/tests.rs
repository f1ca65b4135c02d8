use super::*;
use crate::block::{MountKind, MountNamespace, MountUse, Opener};

const WWID: &str = "naa.6001405aaaaaaaaaaaaaaaaaaaaaaaaa";

fn finding(kind: Kind) -> Finding {
    Finding {
        kind,
        objects: vec!["2:0:0:1".into(), "sdc".into()],
        why: String::new(),
        identity: Some(WWID.into()),
        devices: vec!["sdc".into()],
        usage: None,
        since: None,
        queues: None,
    }
}

#[test]
fn kinds_parse_by_their_names_and_nothing_else() {
    for k in Kind::ALL {
        assert_eq!(k.as_str().parse::<Kind>().unwrap(), k);
    }
    let e = "scsi-down".parse::<Kind>().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid);
    assert!(e.to_string().contains("map-paths-down"), "{e}");
}

#[test]
fn no_kind_asked_fixes_the_safe_kinds_only() {
    for k in Kind::ALL {
        let o = considered(&finding(k), &[]);
        match k {
            Kind::IdleSession
            | Kind::NvmeControllerDown
            | Kind::MapPathsDown
            | Kind::ScsiDeviceBlocked
            | Kind::IdleSubsystem
            | Kind::RemappedAddress => {
                assert_eq!(o, Some(FixOutcome::NotSelected { opt_in: true }), "{k}")
            }
            _ => assert_eq!(o, None, "{k}"),
        }
    }
}

#[test]
fn named_kinds_limit_the_fix_and_opt_in_kinds_need_their_name() {
    let kinds = [Kind::NvmeControllerDown];
    assert_eq!(considered(&finding(Kind::NvmeControllerDown), &kinds), None);
    assert_eq!(
        considered(&finding(Kind::ScsiDeviceDown), &kinds),
        Some(FixOutcome::NotSelected { opt_in: false })
    );
    // Asked for, a session is still left: the library cannot log it out.
    let o = considered(&finding(Kind::IdleSession), &[Kind::IdleSession]).unwrap();
    assert_eq!(o.as_str(), "unsupported");
    assert!(o.is_left() && o.to_string().contains("iscsiadm"), "{o}");
    // Nor is a re-mapped address: its devices may be a new volume.
    let o = considered(&finding(Kind::RemappedAddress), &[Kind::RemappedAddress]).unwrap();
    assert!(
        o.as_str() == "unsupported" && o.to_string().contains("--wwid"),
        "{o}"
    );
}

#[test]
fn anything_using_the_devices_leaves_the_finding_and_names_the_user() {
    assert_eq!(verdict(&Usage::default()), None);
    let mut u = Usage::default();
    u.openers.push(Opener {
        pid: 4242,
        comm: "postgres".into(),
        device: "sdc".into(),
        read_only: false,
    });
    let o = verdict(&u).unwrap();
    assert_eq!(o.as_str(), "in-use");
    assert!(o.to_string().contains("4242"), "{o}");
    let mut u = Usage::default();
    u.mounts.push(MountUse {
        device: "sdc".into(),
        mount_point: "/var/lib/kubelet/pods/x".into(),
        kind: MountKind::Filesystem,
        namespace: MountNamespace {
            inode: None,
            pid: None,
        },
    });
    assert!(
        verdict(&u)
            .unwrap()
            .to_string()
            .contains("/var/lib/kubelet")
    );
    // A holder (a map on the disk) is a user too.
    let mut u = Usage::default();
    u.holders.push("dm-3".into());
    assert!(verdict(&u).is_some());
}

#[test]
fn a_refusal_underneath_is_in_use_and_a_replaced_device_a_change() {
    let busy = Error::Busy {
        device: "mpatha (dm-0)".into(),
        reason: "mounted on /mnt".into(),
        usage: None,
    };
    assert_eq!(outcome_of(busy).as_str(), "in-use");
    let replaced = Error::Replaced {
        device: "SCSI device 2:0:0:1".into(),
        reason: "its WWID is x now".into(),
    };
    assert_eq!(outcome_of(replaced).as_str(), "changed");
    let other = Error::Internal { what: "x".into() };
    assert_eq!(outcome_of(other).as_str(), "failed");
}

#[test]
fn the_wwid_is_compared_as_a_wwid_not_as_a_string() {
    let now: Wwid = WWID.parse().unwrap();
    assert_eq!(wwid_changed(Some(WWID), Some(&now)), None);
    // The multipath spelling of the same WWID.
    let multipath = "36001405aaaaaaaaaaaaaaaaaaaaaaaaa";
    assert_eq!(wwid_changed(Some(multipath), Some(&now)), None);
    let other: Wwid = "naa.6001405bbbbbbbbbbbbbbbbbbbbbbbbb".parse().unwrap();
    let why = wwid_changed(Some(WWID), Some(&other)).unwrap();
    assert!(why.contains("bbbb") && why.contains(WWID), "{why}");
    assert!(wwid_changed(Some(WWID), None).unwrap().contains("none now"));
    assert!(wwid_changed(None, Some(&now)).unwrap().contains("was none"));
    assert_eq!(wwid_changed(None, None), None);
}

#[test]
fn maps_are_fixed_before_the_devices_that_go_with_them() {
    let mut v = Kind::ALL.to_vec();
    v.sort_by_key(|k| rank(*k));
    assert_eq!(&v[..2], [Kind::MapWithoutPaths, Kind::MapPathsDown]);
}

#[test]
fn only_fixed_and_gone_findings_are_not_left() {
    assert!(!FixOutcome::Fixed("deleted".into()).is_left());
    assert!(!FixOutcome::Gone.is_left());
    assert!(FixOutcome::Changed("x".into()).is_left());
    assert!(FixOutcome::NotSelected { opt_in: false }.is_left());
    assert!(FixOutcome::Failed("x".into()).is_left());
}

use super::*;
use crate::id::Wwn;

#[test]
fn a_remembered_wwid_is_recalled_by_the_same_name_only() {
    let dir = std::env::temp_dir().join(format!("lunkit-names-{}", std::process::id()));
    let a = VolumeSpec::Iscsi {
        target: "iqn.2003-01.org.example:t1".parse().unwrap(),
        lun: 1,
    };
    let b = VolumeSpec::Iscsi {
        target: "iqn.2003-01.org.example:t1".parse().unwrap(),
        lun: 2,
    };
    let w: Wwid = "naa.6001405abcdef0123456789abcdef012".parse().unwrap();
    assert_eq!(recall(&dir, &a), None);
    remember(&dir, &a, &w).unwrap();
    assert_eq!(recall(&dir, &a), Some(w.clone()));
    assert_eq!(recall(&dir, &b), None);
    // A device or a WWID names no address: nothing is kept for it.
    let dev = VolumeSpec::Device("/dev/sdc".into());
    remember(&dir, &dev, &w).unwrap();
    assert_eq!(recall(&dir, &dev), None);
    // A newer record replaces the older.
    let w2: Wwid = "naa.6001405abcdef0123456789abcdef099".parse().unwrap();
    remember(&dir, &a, &w2).unwrap();
    assert_eq!(recall(&dir, &a), Some(w2));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_retired_record_is_still_recalled_but_no_longer_listed() {
    let dir = std::env::temp_dir().join(format!("lunkit-names-retire-{}", std::process::id()));
    let a = VolumeSpec::Iscsi {
        target: "iqn.2003-01.org.example:t1".parse().unwrap(),
        lun: 1,
    };
    let (w, other): (Wwid, Wwid) = (
        "naa.6001405abcdef0123456789abcdef012".parse().unwrap(),
        "naa.6001405abcdef0123456789abcdef099".parse().unwrap(),
    );
    remember(&dir, &a, &w).unwrap();
    // Another volume's WWID retires nothing.
    retire(&dir, &a, &other).unwrap();
    assert_eq!(recorded(&dir).unwrap().len(), 1);
    retire(&dir, &a, &w).unwrap();
    assert_eq!(recall(&dir, &a), Some(w.clone()), "a retry recalls it");
    assert!(
        recorded(&dir).unwrap().is_empty(),
        "history, not a leftover"
    );
    // Attached again: live again.
    remember(&dir, &a, &w).unwrap();
    assert_eq!(recorded(&dir).unwrap().len(), 1);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn an_fc_volume_is_recalled_through_any_of_its_target_ports_that_agree() {
    let dir = std::env::temp_dir().join(format!("lunkit-names-fc-{}", std::process::id()));
    let (p1, p2, p3) = (Wwn(0x500a0981_88a8b1c1), Wwn(0x500a0982_88a8b1c1), Wwn(7));
    let fc = |wwpns: &[Wwn], lun| VolumeSpec::Fc {
        wwpns: wwpns.to_vec(),
        lun,
    };
    let w: Wwid = "naa.6001405abcdef0123456789abcdef012".parse().unwrap();
    remember(&dir, &fc(&[p1, p2], 3), &w).unwrap();
    // Either port alone, or both, name it; another LUN or port does not.
    assert_eq!(recall(&dir, &fc(&[p2], 3)), Some(w.clone()));
    assert_eq!(recall(&dir, &fc(&[p1, p2], 3)), Some(w.clone()));
    assert_eq!(recall(&dir, &fc(&[p1, p3], 3)), Some(w.clone()));
    assert_eq!(recall(&dir, &fc(&[p1], 4)), None);
    assert_eq!(recall(&dir, &fc(&[p3], 3)), None);
    // Port 2's LUN 3 remembered as another volume since: the two disagree, so nothing.
    let other: Wwid = "naa.6001405abcdef0123456789abcdef099".parse().unwrap();
    remember(&dir, &fc(&[p2], 3), &other).unwrap();
    assert_eq!(recall(&dir, &fc(&[p1, p2], 3)), None);
    assert_eq!(recall(&dir, &fc(&[p2], 3)), Some(other));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn records_written_at_once_for_one_target_each_keep_their_own_wwid() {
    let dir = std::env::temp_dir().join(format!("lunkit-names-race-{}", std::process::id()));
    let spec = |lun| VolumeSpec::Iscsi {
        target: "iqn.2003-01.org.example.array:tgt.1".parse().unwrap(),
        lun,
    };
    let wwid = |lun: u64| -> Wwid {
        format!("naa.6001405abcdef0123456789abc{lun:06x}")
            .parse()
            .unwrap()
    };
    std::thread::scope(|s| {
        for lun in 0..16u64 {
            let dir = &dir;
            s.spawn(move || {
                for _ in 0..50 {
                    remember(dir, &spec(lun), &wwid(lun)).unwrap();
                }
            });
        }
    });
    for lun in 0..16u64 {
        assert_eq!(recall(&dir, &spec(lun)), Some(wwid(lun)), "LUN {lun}");
    }
    // No temporary file is left beside the records.
    let left: Vec<_> = std::fs::read_dir(dir.join("names"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.contains(".tmp-"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

fn spec(nqn: &Nqn, namespace: NamespaceSelector) -> VolumeSpec {
    VolumeSpec::Nvme {
        nqn: nqn.clone(),
        namespace,
    }
}

#[test]
fn every_mark_of_a_subsystem_is_found_and_no_other_subsystems() {
    let dir = std::env::temp_dir().join(format!("lunkit-nvme-marks-{}", std::process::id()));
    let a: Nqn = "nqn.2014-08.org.example:a".parse().unwrap();
    // An NQN that reads as `a` followed by a namespace suffix.
    let b: Nqn = "nqn.2014-08.org.example:a-ns-1".parse().unwrap();
    let g: NamespaceSelector =
        NamespaceSelector::Nguid("0123456789abcdef0123456789abcdef".parse().unwrap());
    assert_eq!(marked(&dir, &a).unwrap(), Vec::new(), "no directory yet");
    mark_attached(&dir, &spec(&a, NamespaceSelector::Id(2))).unwrap();
    let u: NamespaceSelector =
        NamespaceSelector::Uuid("6c1d8a70-1c9e-4d5e-9a40-3b4c5d6e7f80".parse().unwrap());
    mark_attached(&dir, &spec(&a, g)).unwrap();
    let e = NamespaceSelector::Eui64("0025385b71b0e7a1".parse().unwrap());
    mark_attached(&dir, &spec(&a, e)).unwrap();
    mark_attached(&dir, &spec(&b, NamespaceSelector::Id(5))).unwrap();
    mark_attached(&dir, &spec(&b, u)).unwrap();
    std::fs::write(dir.join("attached").join("stray"), "").unwrap();

    let mut of_a = marked(&dir, &a).unwrap();
    of_a.sort_by_key(ToString::to_string);
    assert_eq!(of_a, vec![NamespaceSelector::Id(2), e, g]);
    let mut of_b = marked(&dir, &b).unwrap();
    of_b.sort_by_key(ToString::to_string);
    assert_eq!(of_b, vec![NamespaceSelector::Id(5), u]);

    unmark_attached(&dir, &spec(&a, g)).unwrap();
    unmark_attached(&dir, &spec(&a, e)).unwrap();
    assert_eq!(marked(&dir, &a).unwrap(), vec![NamespaceSelector::Id(2)]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn every_spelt_name_parses_back_to_its_spec() {
    let nqn: Nqn = "nqn.2014-08.org.example:a-ns-1_x-uuid-2".parse().unwrap();
    let specs = [
        VolumeSpec::Iscsi {
            target: "iqn.2003-01.org.example:t-lun-1".parse().unwrap(),
            lun: 7,
        },
        VolumeSpec::Fc {
            wwpns: vec![Wwn(0x500a0981_88a8b1c1)],
            lun: 3,
        },
        spec(&nqn, NamespaceSelector::Id(2)),
        spec(
            &nqn,
            NamespaceSelector::Nguid("0123456789abcdef0123456789abcdef".parse().unwrap()),
        ),
        spec(
            &nqn,
            NamespaceSelector::Eui64("0025385b71b0e7a1".parse().unwrap()),
        ),
        spec(
            &nqn,
            NamespaceSelector::Uuid("6c1d8a70-1c9e-4d5e-9a40-3b4c5d6e7f80".parse().unwrap()),
        ),
    ];
    for s in specs {
        let name = spelt(&s).remove(0);
        assert_eq!(parse_name(&name), Some(s), "{name}");
    }
}

#[test]
fn a_name_not_spelt_here_is_none_never_a_panic() {
    let t = "iscsi-iqn.2003-01.org.example:t1-lun-";
    for name in [
        "",
        "stray",
        "iscsi-",
        "iscsi--lun-1",
        "iscsi-iqn.2003-01.org.example:t1",
        &format!("{t}x"),
        &format!("{t}1.tmp-123-4"),
        &format!("{t}+1"),
        &format!("{t}01"),
        "iscsi-iqn.x%2-lun-1",
        "iscsi-iqn.x%-lun-1",
        "iscsi-iqn.x%zz-lun-1",
        "iscsi-iqn.x%2f-lun-1",
        "iscsi-iqn.x%61-lun-1",
        "iscsi-iqn.x%FF-lun-1",
        "iscsi-%C3%A9%E2-lun-1",
        "fc-0x500a098188a8b1c1-lun-",
        "fc-500a098188a8b1c1-lun-1",
        "fc-0x500a098188a8b1c1-lun-18446744073709551616",
        "nvme-nqn.2014-08.org.example:a",
        "nvme-nqn.2014-08.org.example:a-ns-0x1",
        "nvme-nqn.2014-08.org.example:a-ns-1.tmp-1-2",
        "nvme-nqn.2014-08.org.example:a-nguid-0123",
        "nvme--ns-1",
        "nvme-%-ns-1",
        "iscsi-\u{1F600}-lun-1",
        // Printable and short, but no iqn./eui./naa. name: no record lunkit writes.
        "iscsi-target1-lun-1",
    ] {
        assert_eq!(parse_name(name), None, "{name:?}");
    }
}

#[test]
fn records_and_marks_are_listed_and_a_record_forgotten_only_while_unchanged() {
    let dir = std::env::temp_dir().join(format!("lunkit-names-list-{}", std::process::id()));
    let a = VolumeSpec::Iscsi {
        target: "iqn.2003-01.org.example:t1".parse().unwrap(),
        lun: 1,
    };
    let nqn: Nqn = "nqn.2014-08.org.example:a".parse().unwrap();
    let n = spec(&nqn, NamespaceSelector::Id(4));
    let w: Wwid = "naa.6001405abcdef0123456789abcdef012".parse().unwrap();
    let w2: Wwid = "naa.6001405abcdef0123456789abcdef099".parse().unwrap();
    assert!(recorded(&dir).unwrap().is_empty(), "no directory yet");
    assert!(attach_marks(&dir).unwrap().is_empty());
    remember(&dir, &a, &w).unwrap();
    remember(&dir, &n, &w2).unwrap();
    mark_attached(&dir, &n).unwrap();
    let names = dir.join("names");
    std::fs::write(names.join("stray"), "x").unwrap();
    std::fs::write(names.join("iscsi-iqn.x-lun-1.tmp-1-2"), "x").unwrap();
    std::fs::write(names.join("fc-0x0000000000000007-lun-2"), "naa.zz\n").unwrap();
    let found = recorded(&dir).unwrap();
    let got: Vec<_> = found
        .iter()
        .map(|(n, w)| (n.spec.clone(), w.clone()))
        .collect();
    let fc = VolumeSpec::Fc {
        wwpns: vec![Wwn(7)],
        lun: 2,
    };
    assert_eq!(
        got,
        vec![
            (fc, None),
            (a.clone(), Some(w.clone())),
            (n.clone(), Some(w2.clone()))
        ]
    );
    let marks = attach_marks(&dir).unwrap();
    assert_eq!(marks.len(), 1);
    assert_eq!(marks[0].spec, n);
    // Rewritten since it was read: left.
    assert!(!forget(&dir, &a, &w2).unwrap());
    assert_eq!(recall(&dir, &a), Some(w.clone()));
    assert!(forget(&dir, &a, &w).unwrap());
    assert_eq!(recall(&dir, &a), None);
    assert!(!forget(&dir, &a, &w).unwrap(), "gone already");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_name_cannot_leave_the_directory() {
    assert_eq!(encode("iqn.x:a/../b c"), "iqn.x:a%2F..%2Fb%20c");
}

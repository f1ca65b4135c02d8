use super::{named_check, named_selector};
use lunkit::ops::NamespaceSelector;

fn namespace() -> lunkit::NvmeNamespace {
    lunkit::NvmeNamespace {
        name: "nvme0n1".into(),
        nsid: Some(1),
        wwid: Some("uuid.58668891-c3e4-45d0-b90e-824525c16080".into()),
        uuid: Some("58668891-c3e4-45d0-b90e-824525c16080".into()),
        nguid: Some("00000000-0000-0000-0042-aa42aa42aa42".into()),
        eui: Some("00 00 00 00 00 00 00 00".into()),
        size_bytes: None,
        paths: Vec::new(),
    }
}

/// Whether `ns` is the namespace the attributes name, as the library's `namespace_device`
/// checks it against [`named_check`]: every selector, and every WWID (case aside).
fn names_namespace(uuid: Option<&str>, wwid: Option<&str>, ns: &lunkit::NvmeNamespace) -> bool {
    named_check(uuid, wwid, None).is_some_and(|c| {
        c.also.iter().all(|s| s.matches(ns))
            && c.wwids.iter().all(|w| {
                ns.wwid
                    .as_deref()
                    .is_some_and(|k| k.eq_ignore_ascii_case(w))
            })
    })
}

#[test]
fn a_namespace_is_named_by_its_uuid_its_wwid_or_its_nguid() {
    let ns = namespace();
    let uuid = "58668891-c3e4-45d0-b90e-824525c16080";
    assert!(names_namespace(Some(uuid), None, &ns));
    assert!(names_namespace(None, Some(&format!("uuid.{uuid}")), &ns));
    // The kernel's wwid is the UUID form, and the NGUID still names it (deviceEUI).
    assert!(names_namespace(
        None,
        Some("eui.00000000000000000042aa42aa42aa42"),
        &ns
    ));
    assert!(!names_namespace(
        None,
        Some("eui.00000000000000000042aa42aa42aa43"),
        &ns
    ));
    // An all-zero EUI-64 is "not reported", never an identity.
    assert!(!names_namespace(None, Some("eui.0000000000000000"), &ns));
    assert!(!names_namespace(
        Some("58668891-c3e4-45d0-b90e-824525c16081"),
        None,
        &ns
    ));
    assert!(names_namespace(None, None, &ns));
    // An identity lunkit cannot select by names no namespace.
    assert_eq!(named_check(None, Some("nvme.1b36-00"), None), None);
    assert!(!names_namespace(Some("not-a-uuid"), None, &ns));
}

#[test]
fn the_check_carries_the_whole_kernel_name_and_the_wwid_the_stage_saw() {
    let synthesized = "nvme.1b36-6465616462656566-51454d55-00000002";
    let check = named_check(None, Some(synthesized), Some("eui.0025385b71b0e7a1")).unwrap();
    assert_eq!(check.also, vec![NamespaceSelector::Id(2)]);
    assert_eq!(check.wwids, vec![synthesized, "eui.0025385b71b0e7a1"]);
    // A UUID names the namespace by itself; the stage's WWID is still checked.
    let uuid = "58668891-c3e4-45d0-b90e-824525c16080";
    let check = named_check(Some(uuid), Some("eui.0025385b71b0e7a1"), Some("uuid.x")).unwrap();
    assert_eq!(
        check.also,
        vec![NamespaceSelector::Uuid(uuid.parse().unwrap())]
    );
    assert_eq!(check.wwids, vec!["uuid.x"]);
    // Nothing named: only the WWID the stage saw.
    let check = named_check(None, None, Some("uuid.x")).unwrap();
    assert!(check.also.is_empty());
}

#[test]
fn each_identity_form_is_a_lunkit_selector() {
    let ns = namespace();
    let uuid = "58668891-c3e4-45d0-b90e-824525c16080";
    assert_eq!(
        named_selector(Some(uuid), None),
        Some(NamespaceSelector::Uuid(uuid.parse().unwrap()))
    );
    assert_eq!(
        named_selector(None, Some("eui.00000000000000000042aa42aa42aa42")),
        Some(NamespaceSelector::Nguid(
            "00000000000000000042aa42aa42aa42".parse().unwrap()
        ))
    );
    // An EUI-64 is found by the namespace's `eui`, even though its `wwid` is the UUID.
    let mut with_eui = namespace();
    with_eui.eui = Some("00 25 38 5b 71 b0 e7 a1".into());
    let eui = named_selector(None, Some("eui.0025385b71b0e7a1")).unwrap();
    assert_eq!(
        eui,
        NamespaceSelector::Eui64("0025385b71b0e7a1".parse().unwrap())
    );
    assert!(eui.matches(&with_eui) && !eui.matches(&ns));
    assert!(names_namespace(
        None,
        Some("eui.0025385b71b0e7a1"),
        &with_eui
    ));
    // The kernel's own name for a namespace without ids carries its nsid; the rest of it
    // (vendor, serial, model) is checked against the namespace's `wwid`.
    let synthesized = "nvme.1b36-6465616462656566-51454d55-00000002";
    assert_eq!(
        named_selector(None, Some(synthesized)),
        Some(NamespaceSelector::Id(2))
    );
    let mut plain = namespace();
    plain.nsid = Some(2);
    plain.wwid = Some(synthesized.into());
    assert!(names_namespace(None, Some(synthesized), &plain));
    plain.wwid = Some("nvme.1b36-6465616462656567-51454d55-00000002".into());
    assert!(
        !names_namespace(None, Some(synthesized), &plain),
        "another subsystem's namespace 2"
    );
    assert_eq!(named_selector(None, Some("nvme.1b36-00")), None);
    assert_eq!(named_selector(None, None), None);
}

//! The stage record's layout, names and reads.

use super::*;

fn record(id: &str) -> Record {
    Record {
        version: RECORD_VERSION,
        volume_id: id.into(),
        staging_path: "/var/lib/kubelet/plugins/staging/pv".into(),
        phase: Phase::Attaching,
        target: Target::Iscsi {
            iqn: "iqn.2003-01.org.linux-iscsi.lunkit:lab".into(),
            portals: vec!["127.0.0.1:3260".into(), "127.0.0.2:3260".into()],
            iface: None,
            lun: 3,
            discovered: Vec::new(),
            fence: None,
        },
        access: Access::Mount {
            fs_type: "ext4".into(),
        },
        wwid: None,
        expected_wwid: None,
        device: None,
        map: false,
        published: Vec::new(),
    }
}

#[test]
fn two_records_name_one_volume_by_a_known_wwid_or_an_nvme_namespace() {
    let w = "36001405a1b2c3d4e5f60718293a4b5c6";
    let (mut a, mut b) = (record("pv-a"), record("pv-b"));
    assert!(!a.same_volume_as(&b), "no identity known: not the same");
    a.wwid = Some(w.into());
    b.expected_wwid = Some(w.into());
    assert!(a.same_volume_as(&b) && b.same_volume_as(&a));
    assert!(
        !a.same_volume_as(&a.clone()),
        "a record is not another volume"
    );
    b.expected_wwid = Some("36001405ffffffffffffffffffffffff0".into());
    assert!(!a.same_volume_as(&b));
    let nvme = |nsid| Target::Nvme {
        nqn: "nqn.2014-08.org.lunkit:csi".into(),
        portals: vec!["127.0.0.1:4420".into()],
        discovery: Vec::new(),
        nsid,
        device_uuid: None,
        device_wwid: None,
        host_nqn: None,
        host_id: None,
        dhchap: Dhchap::None,
    };
    let (mut c, mut d) = (record("pv-c"), record("pv-d"));
    (c.target, d.target) = (nvme(Some(1)), nvme(Some(1)));
    assert!(c.same_volume_as(&d));
    d.target = nvme(Some(2));
    assert!(!c.same_volume_as(&d));
    d.target = nvme(None);
    assert!(
        !c.same_volume_as(&d),
        "a namespace not found yet names none"
    );
}

#[test]
fn the_state_directories_are_made_owner_only_whatever_they_were() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    fs::create_dir_all(state.join("volumes")).unwrap();
    for d in [&state, &state.join("volumes")] {
        fs::set_permissions(d, fs::Permissions::from_mode(0o755)).unwrap();
    }
    Store::open(&state).unwrap();
    for d in [&state, &state.join("volumes")] {
        let mode = fs::metadata(d).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o700, "{}", d.display());
    }
}

#[test]
fn a_record_of_an_earlier_layout_without_the_identity_fields_loads() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let mut v = serde_json::to_value(record("pv-1")).unwrap();
    let o = v.as_object_mut().unwrap();
    o.remove("expected_wwid");
    o.remove("map");
    fs::write(store.path("pv-1"), serde_json::to_vec(&v).unwrap()).unwrap();
    assert_eq!(store.load("pv-1").unwrap(), Some(record("pv-1")));
}

#[test]
fn an_nvme_record_keeps_its_discovery_addresses_and_one_from_before_them_loads() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let mut r = record("pv-n");
    let nvme = |discovery: Vec<String>| Target::Nvme {
        nqn: "nqn.2014-08.org.lunkit:csi".into(),
        portals: Vec::new(),
        discovery,
        nsid: Some(1),
        device_uuid: None,
        device_wwid: None,
        host_nqn: None,
        host_id: None,
        dhchap: Dhchap::None,
    };
    r.target = nvme(vec!["192.0.2.10:8009".into()]);
    store.save(&r).unwrap();
    assert_eq!(store.load("pv-n").unwrap(), Some(r.clone()));
    // Written before `discovery` existed: no key, no addresses.
    r.target = nvme(Vec::new());
    let mut v = serde_json::to_value(&r).unwrap();
    assert!(v["target"].get("discovery").is_none(), "{v}");
    v["target"].as_object_mut().unwrap().remove("discovery");
    fs::write(store.path("pv-n"), serde_json::to_vec(&v).unwrap()).unwrap();
    assert_eq!(store.load("pv-n").unwrap(), Some(r));
}

#[test]
fn a_record_round_trips_and_is_replaced_whole() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(store.load("pv-1").unwrap(), None);
    let mut r = record("pv-1");
    store.save(&r).unwrap();
    assert_eq!(store.load("pv-1").unwrap(), Some(r.clone()));
    r.phase = Phase::Staged;
    r.wwid = Some("36001405a1b2c3d4e5f60718293a4b5c6".into());
    r.device = Some("/dev/dm-0".into());
    store.save(&r).unwrap();
    assert_eq!(store.load("pv-1").unwrap(), Some(r.clone()));
    assert_eq!(store.all().unwrap(), vec![r]);
    let names: Vec<_> = fs::read_dir(dir.path().join("volumes"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 1, "no temporary file left: {names:?}");
    store.remove("pv-1").unwrap();
    store.remove("pv-1").unwrap();
    assert_eq!(store.load("pv-1").unwrap(), None);
}

#[test]
fn a_record_of_another_volume_or_torn_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    store.save(&record("pv-1")).unwrap();
    fs::copy(store.path("pv-1"), store.path("pv-2")).unwrap();
    let e = store.load("pv-2").unwrap_err().to_string();
    assert!(e.contains("is of volume \"pv-1\""), "{e}");
    fs::write(store.path("pv-3"), b"{\"version\": 1, \"volu").unwrap();
    let e = store.load("pv-3").unwrap_err().to_string();
    assert!(e.contains("does not parse"), "{e}");
}

#[test]
fn file_names_stay_in_the_directory_and_differ_per_id() {
    let a = file_name("../../etc/passwd");
    assert!(!a.contains('/'), "{a}");
    assert!(a.starts_with("....etcpasswd-"), "{a}");
    assert_ne!(file_name("pv/1"), file_name("pv1"));
    assert_ne!(file_name(&"x".repeat(100)), file_name(&"x".repeat(101)));
    assert!(file_name(&"x".repeat(1000)).len() < 100);
}

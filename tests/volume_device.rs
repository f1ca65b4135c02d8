//! `ops::volume::device`: a volume's one device on the node, found by its identity, on the
//! sysfs tree captured from the VM lab (tests/fixtures/iscsi-multipath: two iSCSI sessions,
//! LUNs 0 and 1 on each, a map per LUN) and on a small NVMe tree built here.

mod common;

use std::fs;
use std::path::Path;

use common::Scratch;
use lunkit::ops::volume::{self, NamespaceCheck, NamespaceSelector, VolumeDevice, VolumeSpec};
use lunkit::{Nqn, Root};

const LUN0: &str = "naa.60014055e7a100000000000000000000";
const LUN1: &str = "naa.60014055e7a100000010000000000000";

fn wwid(w: &str) -> VolumeSpec {
    VolumeSpec::Wwid(w.parse().unwrap())
}

fn names(v: &VolumeDevice) -> Vec<String> {
    match v {
        VolumeDevice::Paths(p) => p.iter().map(|p| p.hctl.to_string()).collect(),
        VolumeDevice::Namespaces(n) => n.iter().map(|n| n.name.clone()).collect(),
        VolumeDevice::Mixed(m) => m.iter().map(|m| m.name.clone()).collect(),
        other => other.node().map(|n| n.name.clone()).into_iter().collect(),
    }
}

/// The fixture with LUN 1's map gone (its paths no longer held by dm-1): multipathd has not
/// built it, or will not.
fn without_lun1_map(tag: &str) -> Scratch {
    let s = Scratch::with_fixture("iscsi-multipath", tag);
    for p in [
        "host6/session1/target6:0:0/6:0:0:1/block/sdb",
        "host7/session2/target7:0:0/7:0:0:1/block/sdd",
    ] {
        let holder = s
            .path()
            .join("sys/devices/platform")
            .join(p)
            .join("holders/dm-1");
        fs::remove_file(holder).unwrap();
    }
    for link in [
        "sys/block/dm-1",
        "sys/class/block/dm-1",
        "sys/dev/block/254:1",
    ] {
        fs::remove_file(s.path().join(link)).unwrap();
    }
    fs::remove_dir_all(s.path().join("sys/devices/virtual/block/dm-1")).unwrap();
    s
}

#[test]
fn a_scsi_volume_with_a_map_is_its_map_by_any_name() {
    let root =
        Root::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/iscsi-multipath"));
    for spec in [
        wwid(LUN1),
        wwid("360014055e7a100000010000000000000"),
        VolumeSpec::Device("7:0:0:1".into()),
    ] {
        let found = volume::device(&root, &spec).unwrap();
        let VolumeDevice::Map(m) = &found else {
            panic!("{spec}: {found:?}")
        };
        assert_eq!(
            (m.name.as_str(), m.node.name.as_str()),
            ("mpathb", "dm-1"),
            "{spec}"
        );
        assert_eq!(found.path(), Some(root.dev("dm-1").as_path()), "{spec}");
    }
    let gone = volume::device(&root, &wwid("naa.60014055e7a1000000000000000000ee")).unwrap();
    assert_eq!(gone, VolumeDevice::Absent);
    assert!(!gone.is_present() && gone.path().is_none());
}

#[test]
fn paths_without_a_map_are_said_to_be_several_never_one_picked() {
    let s = without_lun1_map("device-no-map");
    let found = volume::device(&Root::new(s.path()), &wwid(LUN1)).unwrap();
    assert!(matches!(found, VolumeDevice::Paths(_)), "{found:?}");
    assert_eq!(names(&found), ["6:0:0:1", "7:0:0:1"]);
    assert!(found.is_present() && found.node().is_none());
}

#[test]
fn one_path_without_a_map_is_that_path() {
    // 7:0:0:1 reports another WWID now: LUN 1 has one path left, sdb.
    let s = without_lun1_map("device-one-path");
    fs::write(
        s.path()
            .join("sys/devices/platform/host7/session2/target7:0:0/7:0:0:1/wwid"),
        "naa.60014055e7a1000000000000000000ff\n",
    )
    .unwrap();
    let root = Root::new(s.path());
    let found = volume::device(&root, &wwid(LUN1)).unwrap();
    assert!(matches!(found, VolumeDevice::Path(_)), "{found:?}");
    assert_eq!(found.path(), Some(root.dev("sdb").as_path()));
}

#[test]
fn a_map_shared_with_another_volume_is_no_device_of_either() {
    // sdc (7:0:0:0, in mpatha) reports another WWID: mpatha serves two volumes.
    let s = Scratch::with_fixture("iscsi-multipath", "device-mixed");
    fs::write(
        s.path()
            .join("sys/devices/platform/host7/session2/target7:0:0/7:0:0:0/wwid"),
        "naa.60014055e7a1000000000000000000ff\n",
    )
    .unwrap();
    let root = Root::new(s.path());
    for w in [LUN0, "naa.60014055e7a1000000000000000000ff"] {
        let found = volume::device(&root, &wwid(w)).unwrap();
        assert!(matches!(found, VolumeDevice::Mixed(_)), "{w}: {found:?}");
        assert_eq!(names(&found), ["mpatha"], "{w}");
        assert!(found.is_present() && found.path().is_none(), "{w}");
    }
}

const NQN: &str = "nqn.2014-08.org.lunkit:lab";
const UUID: &str = "6c1d8a70-1c9e-4d5e-9a40-3b4c5d6e7f80";
const MADE_UP: &str = "nvme.0000-3132-6c756e6b6974-00000002";

/// A node with subsystem [`NQN`] over two controllers: namespace 1 (a head, `nvme0n1`,
/// reporting a UUID) and namespace 2 (`nvme0n2`, reporting nothing: the kernel makes up its
/// WWID); and subsystem `…:other` reached by two controllers without native multipath, both
/// showing its namespace 1 with the same UUID (`nvme3n1`, `nvme4n1`).
fn nvme_tree(dir: &Path) {
    let w = |rel: &str, text: &str| {
        let p = dir.join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, format!("{text}\n")).unwrap();
    };
    let other = format!("{NQN}:other");
    for (c, nqn) in [(0, NQN), (1, NQN), (3, other.as_str()), (4, other.as_str())] {
        let d = format!("sys/class/nvme/nvme{c}");
        w(&format!("{d}/transport"), "tcp");
        w(&format!("{d}/state"), "live");
        w(&format!("{d}/subsysnqn"), nqn);
    }
    for c in [3, 4] {
        fs::create_dir_all(dir.join(format!("sys/class/nvme/nvme{c}/nvme{c}n1"))).unwrap();
    }
    let s = "sys/class/nvme-subsystem/nvme-subsys0";
    w(&format!("{s}/subsysnqn"), NQN);
    for e in ["nvme0", "nvme1", "nvme0n1", "nvme0n2"] {
        fs::create_dir_all(dir.join(s).join(e)).unwrap();
    }
    w("sys/class/nvme-subsystem/nvme-subsys3/subsysnqn", &other);
    let ns = [
        ("nvme0n1", 1, format!("uuid.{UUID}"), Some(UUID), "259:0"),
        ("nvme0n2", 2, MADE_UP.to_owned(), None, "259:1"),
        ("nvme3n1", 1, format!("uuid.{UUID}"), Some(UUID), "259:2"),
        ("nvme4n1", 1, format!("uuid.{UUID}"), Some(UUID), "259:3"),
    ];
    for (name, nsid, wwid, uuid, dev) in ns {
        let b = format!("sys/class/block/{name}");
        w(&format!("{b}/nsid"), &nsid.to_string());
        w(&format!("{b}/wwid"), &wwid);
        w(
            &format!("{b}/uuid"),
            uuid.unwrap_or("00000000-0000-0000-0000-000000000000"),
        );
        w(&format!("{b}/dev"), dev);
    }
}

#[test]
fn an_nvme_namespace_is_its_head_by_id_or_by_its_own_identity() {
    let s = Scratch::new("device-nvme");
    nvme_tree(s.path());
    let root = Root::new(s.path());
    let nqn: Nqn = NQN.parse().unwrap();
    let spec = |namespace: NamespaceSelector| VolumeSpec::Nvme {
        nqn: nqn.clone(),
        namespace,
    };
    let uuid = NamespaceSelector::Uuid(UUID.parse().unwrap());
    for sel in [NamespaceSelector::Id(1), uuid] {
        let found = volume::device(&root, &spec(sel)).unwrap();
        assert_eq!(
            found,
            VolumeDevice::Namespace(lunkit::block::by_name(&root, "nvme0n1").unwrap().unwrap()),
            "{sel}"
        );
        assert_eq!(found.path(), Some(root.dev("nvme0n1").as_path()));
    }
    // A record that knows the id and the UUID checks both: the id with another UUID (a
    // namespace re-created under the same id) is not the volume.
    let both = NamespaceCheck {
        also: vec![uuid],
        wwids: vec![format!("UUID.{}", UUID.to_uppercase())],
    };
    let found = volume::namespace_device(&root, &nqn, &NamespaceSelector::Id(1), &both).unwrap();
    assert_eq!(names(&found), ["nvme0n1"]);
    let found = volume::namespace_device(&root, &nqn, &NamespaceSelector::Id(2), &both).unwrap();
    assert_eq!(found, VolumeDevice::Absent);
    // The kernel's made-up WWID selects its id, and is checked whole.
    let sel = NamespaceSelector::from_kernel_wwid(MADE_UP).unwrap();
    assert_eq!(sel, NamespaceSelector::Id(2));
    let whole = |w: &str| NamespaceCheck {
        also: vec![],
        wwids: vec![w.into()],
    };
    let found = volume::namespace_device(&root, &nqn, &sel, &whole(MADE_UP)).unwrap();
    assert_eq!(names(&found), ["nvme0n2"]);
    let other_serial = "nvme.0000-3133-6c756e6b6974-00000002";
    let found = volume::namespace_device(&root, &nqn, &sel, &whole(other_serial)).unwrap();
    assert_eq!(found, VolumeDevice::Absent);
    // Another subsystem's namespace with the same id is not this one's.
    let elsewhere: Nqn = format!("{NQN}:nothing").parse().unwrap();
    let found = volume::device(
        &root,
        &VolumeSpec::Nvme {
            nqn: elsewhere,
            namespace: uuid,
        },
    )
    .unwrap();
    assert_eq!(found, VolumeDevice::Absent);
}

#[test]
fn namespaces_without_a_head_are_said_to_be_several() {
    let s = Scratch::new("device-nvme-nohead");
    nvme_tree(s.path());
    let root = Root::new(s.path());
    let spec = VolumeSpec::Nvme {
        nqn: format!("{NQN}:other").parse().unwrap(),
        namespace: NamespaceSelector::Uuid(UUID.parse().unwrap()),
    };
    let found = volume::device(&root, &spec).unwrap();
    assert!(matches!(found, VolumeDevice::Namespaces(_)), "{found:?}");
    assert_eq!(names(&found), ["nvme3n1", "nvme4n1"]);
    assert!(found.node().is_none());
}

#[test]
fn a_kernel_wwid_names_the_selector_lunkit_matches() {
    let from = NamespaceSelector::from_kernel_wwid;
    assert_eq!(
        from(&format!("uuid.{UUID}")),
        Some(NamespaceSelector::Uuid(UUID.parse().unwrap()))
    );
    assert!(matches!(
        from("eui.0123456789abcdef0123456789abcdef"),
        Some(NamespaceSelector::Nguid(_))
    ));
    assert!(matches!(
        from("eui.0123456789abcdef"),
        Some(NamespaceSelector::Eui64(_))
    ));
    assert_eq!(from("nvme.0000-31-32-0000000g"), None);
    assert_eq!(from("naa.6001405"), None);
}

#[test]
fn a_resize_hands_over_the_device_as_an_attach_does() {
    // The fixture's sizes agree and no size is asked for: one rescan of each path (a write
    // to its `rescan` file here), and the map, already of the paths' size, is left alone.
    let s = Scratch::with_fixture("iscsi-multipath", "device-resize");
    let root = Root::new(s.path());
    let mut opts = lunkit::ops::ResizeOptions::new(&root);
    opts.lock_dir = None;
    opts.use_multipathd = false;
    let resized = lunkit::ops::resize(&root, &wwid(LUN1), &opts).unwrap();
    assert_eq!(resized.device(), Some(root.dev("dm-1").as_path()));
    // Without the map, its one path left.
    let s = without_lun1_map("device-resize-path");
    fs::write(
        s.path()
            .join("sys/devices/platform/host7/session2/target7:0:0/7:0:0:1/wwid"),
        "naa.60014055e7a1000000000000000000ff\n",
    )
    .unwrap();
    let root = Root::new(s.path());
    let resized = lunkit::ops::resize(&root, &wwid(LUN1), &opts).unwrap();
    assert_eq!(resized.device(), Some(root.dev("sdb").as_path()));
}

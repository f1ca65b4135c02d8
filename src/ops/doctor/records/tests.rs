use super::*;
use crate::block::sysfs::{BlockDevice, DmInfo};
use crate::id::Wwn;
use crate::iscsi::sysfs::IscsiSession;
use crate::nvme::sysfs::{NvmeController, NvmeNamespace, NvmeSubsystem};
use crate::scsi::sysfs::ScsiDevice;

const IQN: &str = "iqn.2003-01.org.lunkit:t1";
const NQN: &str = "nqn.2014-08.org.lunkit:a";
const OLD: &str = "naa.6001405aaaaaaaaaaaaaaaaaaaaaaaaa";
const NEW: &str = "naa.6001405bbbbbbbbbbbbbbbbbbbbbbbbb";

fn empty() -> Topology {
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

fn session(host: u32) -> IscsiSession {
    IscsiSession {
        sid: host,
        target: Some(IQN.into()),
        tpgt: None,
        state: Some("LOGGED_IN".into()),
        host: Some(host),
        target_id: Some(0),
        initiator: None,
        connections: vec![],
    }
}

fn disk(hctl: &str, name: &str, wwid: &str) -> ScsiDevice {
    ScsiDevice {
        hctl: hctl.parse().unwrap(),
        state: Some("running".into()),
        vendor: None,
        model: None,
        rev: None,
        device_type: Some(0),
        wwid: Some(wwid.into()),
        block: Some(name.into()),
        sg: None,
    }
}

fn map(dm: &str, wwid: &str, slaves: &[&str]) -> BlockDevice {
    BlockDevice {
        name: dm.into(),
        dev: None,
        size_bytes: None,
        read_only: None,
        holders: vec![],
        slaves: slaves.iter().map(|s| (*s).into()).collect(),
        partitions: vec![],
        dm: Some(DmInfo {
            name: Some("mpatha".into()),
            uuid: Some(format!("mpath-3{}", &wwid[4..])),
            suspended: Some(false),
        }),
    }
}

fn iscsi(lun: u64) -> VolumeSpec {
    VolumeSpec::Iscsi {
        target: IQN.parse().unwrap(),
        lun,
    }
}

fn nvme(nsid: u32) -> VolumeSpec {
    VolumeSpec::Nvme {
        nqn: NQN.parse().unwrap(),
        namespace: NamespaceSelector::Id(nsid),
    }
}

fn named(spec: &VolumeSpec) -> Named {
    Named {
        file: format!("file-of-{spec}"),
        spec: spec.clone(),
    }
}

fn records(names: &[(VolumeSpec, &str)], marks: &[VolumeSpec]) -> Records {
    Records {
        names: names
            .iter()
            .map(|(s, w)| (named(s), w.parse().unwrap()))
            .collect(),
        marks: marks.iter().map(named).collect(),
    }
}

fn kinds(found: &[Finding]) -> Vec<Kind> {
    found.iter().map(|f| f.kind).collect()
}

#[test]
fn a_record_whose_volume_is_anywhere_on_the_node_is_not_stale() {
    let r = records(&[(iscsi(1), OLD)], &[]);
    // Nothing at all: stale, named by its file and volume, identified by the WWID.
    let found = classify(&empty(), &r);
    assert_eq!(kinds(&found), [Kind::StaleNameRecord]);
    assert_eq!(
        found[0].objects,
        [format!("file-of-{}", iscsi(1)), iscsi(1).to_string()]
    );
    assert_eq!(found[0].identity.as_deref(), Some(OLD));
    assert!(found[0].devices.is_empty());
    assert!(found[0].why.contains(OLD), "{}", found[0].why);

    // The session gone but a map of the WWID left: the record is how a detach by the
    // address finds that map.
    let mut t = empty();
    t.block_devices = vec![map("dm-0", OLD, &[])];
    assert_eq!(kinds(&classify(&t, &r)), []);

    // A path of it elsewhere (another host, another LUN number): not stale.
    let mut t = empty();
    t.scsi_devices = vec![disk("5:0:0:9", "sdz", OLD)];
    assert_eq!(kinds(&classify(&t, &r)), []);

    // Its own path at the address, in the multipath spelling of the record: healthy.
    let mut t = empty();
    t.iscsi_sessions = vec![session(2)];
    t.scsi_devices = vec![disk("2:0:0:1", "sda", OLD)];
    let r3 = records(&[(iscsi(1), &format!("3{}", &OLD[4..]))], &[]);
    assert_eq!(kinds(&classify(&t, &r3)), []);

    // Another LUN of the same session, of another volume: says nothing of LUN 1.
    let mut t = empty();
    t.iscsi_sessions = vec![session(2)];
    t.scsi_devices = vec![disk("2:0:0:2", "sdb", NEW)];
    assert_eq!(kinds(&classify(&t, &r)), [Kind::StaleNameRecord]);
}

#[test]
fn an_address_holding_another_wwid_is_a_remapped_address_naming_both() {
    let r = records(&[(iscsi(1), OLD)], &[]);
    let mut t = empty();
    t.iscsi_sessions = vec![session(2), session(3)];
    t.scsi_devices = vec![disk("2:0:0:1", "sdc", NEW), disk("3:0:0:1", "sdd", NEW)];
    let found = classify(&t, &r);
    assert_eq!(kinds(&found), [Kind::RemappedAddress]);
    let f = &found[0];
    assert_eq!(f.identity.as_deref(), Some(OLD));
    assert_eq!(f.devices, ["sdc", "sdd"]);
    assert_eq!(&f.objects[2..], ["sdc", "sdd"]);
    assert!(f.why.contains(OLD) && f.why.contains(NEW), "{}", f.why);
    assert!(!f.why.contains("still on the node"), "{}", f.why);

    // The old volume's map lingers without paths: said, so that it is detached by WWID.
    t.block_devices = vec![map("dm-4", OLD, &[])];
    let found = classify(&t, &r);
    assert_eq!(kinds(&found), [Kind::RemappedAddress]);
    assert!(found[0].why.contains("mpatha"), "{}", found[0].why);
}

#[test]
fn an_fc_record_is_looked_up_through_its_target_port() {
    use crate::fc::sysfs::FcRemotePort;
    let port = Wwn(0x500a0981_88a8b1c1);
    let spec = VolumeSpec::Fc {
        wwpns: vec![port],
        lun: 3,
    };
    let r = records(&[(spec, OLD)], &[]);
    let rport = |name: Wwn| FcRemotePort {
        name: "rport-4:0-1".into(),
        host: 4,
        channel: 0,
        number: 1,
        port_name: Some(name),
        node_name: None,
        port_id: None,
        roles: vec!["FCP Target".into()],
        scsi_target_id: Some(2),
        port_state: Some("Online".into()),
        parsed_port_state: None,
        target: None,
    };
    let mut t = empty();
    t.fc_rports = vec![rport(port)];
    t.scsi_devices = vec![disk("4:0:2:3", "sde", NEW)];
    assert_eq!(kinds(&classify(&t, &r)), [Kind::RemappedAddress]);
    // The same address through another port is not this record's.
    t.fc_rports = vec![rport(Wwn(7))];
    assert_eq!(kinds(&classify(&t, &r)), [Kind::StaleNameRecord]);
}

fn subsystem(namespaces: &[&str]) -> NvmeSubsystem {
    NvmeSubsystem {
        name: "nvme-subsys0".into(),
        nqn: Some(NQN.into()),
        model: None,
        serial: None,
        iopolicy: None,
        controllers: vec!["nvme0".into()],
        namespaces: namespaces.iter().map(|n| (*n).into()).collect(),
    }
}

fn namespace(name: &str, nsid: u32, wwid: &str) -> NvmeNamespace {
    NvmeNamespace {
        name: name.into(),
        nsid: Some(nsid),
        wwid: Some(wwid.into()),
        uuid: None,
        nguid: None,
        eui: None,
        size_bytes: None,
        paths: vec![],
    }
}

fn controller(nqn: &str) -> NvmeController {
    NvmeController {
        name: "nvme0".into(),
        transport: Some("tcp".into()),
        address: None,
        state: Some("live".into()),
        parsed_state: None,
        subsysnqn: Some(nqn.into()),
        model: None,
        serial: None,
        namespaces: vec![],
        cntlid: None,
        hostnqn: None,
        hostid: None,
        object: None,
    }
}

#[test]
fn a_mark_is_stale_when_no_controller_of_its_subsystem_serves_the_namespace() {
    let r = records(&[], &[nvme(1), nvme(2)]);
    let mut t = empty();
    t.nvme_controllers = vec![controller(NQN)];
    t.nvme_subsystems = vec![subsystem(&["nvme0n1"])];
    t.nvme_namespaces = vec![namespace("nvme0n1", 1, "eui.0000000000000001")];
    let found = classify(&t, &r);
    assert_eq!(kinds(&found), [Kind::StaleAttachMark]);
    assert_eq!(found[0].objects[1], nvme(2).to_string());
    assert_eq!(found[0].identity.as_deref(), Some(NQN));
    assert!(found[0].why.contains("nvme0"), "{}", found[0].why);

    // A namespace 2 of another subsystem is not this mark's.
    t.nvme_namespaces
        .push(namespace("nvme1n2", 2, "eui.0000000000000002"));
    t.nvme_controllers.push(NvmeController {
        name: "nvme1".into(),
        namespaces: vec!["nvme1n2".into()],
        ..controller("nqn.2014-08.org.lunkit:b")
    });
    assert_eq!(kinds(&classify(&t, &r)), [Kind::StaleAttachMark]);

    // Served by a controller's own device (no native multipath): not stale.
    t.nvme_controllers[0].namespaces = vec!["nvme0n2".into()];
    t.nvme_namespaces
        .push(namespace("nvme0n2", 2, "eui.0000000000000003"));
    assert_eq!(kinds(&classify(&t, &r)), []);
}

#[test]
fn an_nvme_record_of_an_id_given_to_another_namespace_is_a_remapped_address() {
    let r = records(&[(nvme(1), "eui.00000000000000aa")], &[]);
    let mut t = empty();
    t.nvme_controllers = vec![controller(NQN)];
    t.nvme_subsystems = vec![subsystem(&["nvme0n1"])];
    t.nvme_namespaces = vec![namespace("nvme0n1", 1, "eui.00000000000000bb")];
    let found = classify(&t, &r);
    assert_eq!(kinds(&found), [Kind::RemappedAddress]);
    assert_eq!(found[0].devices, ["nvme0n1"]);
    t.nvme_namespaces = vec![namespace("nvme0n1", 1, "eui.00000000000000aa")];
    assert_eq!(kinds(&classify(&t, &r)), []);
    t.nvme_namespaces.clear();
    assert_eq!(kinds(&classify(&t, &r)), [Kind::StaleNameRecord]);
}

#[test]
fn a_stale_record_is_removed_under_its_lock_and_a_changed_one_left() {
    let dir = std::env::temp_dir().join(format!("lunkit-doctor-records-{}", std::process::id()));
    let root_dir = dir.join("root");
    std::fs::create_dir_all(root_dir.join("sys")).unwrap();
    let root = Root::new(&root_dir);
    let locks = dir.join("locks");
    let old: Wwid = OLD.parse().unwrap();
    crate::ops::names::remember(&locks, &iscsi(1), &old).unwrap();
    let found = classify(&Topology::read(&root).unwrap(), &read(&locks).unwrap());
    assert_eq!(kinds(&found), [Kind::StaleNameRecord]);
    let deadline = crate::wait::deadline_after(std::time::Duration::from_secs(5));
    // Rewritten by an attach since it was found: another finding now, left.
    let new: Wwid = NEW.parse().unwrap();
    crate::ops::names::remember(&locks, &iscsi(1), &new).unwrap();
    let got = fix(&root, &found[0], Some(&locks), false, deadline).unwrap();
    assert!(matches!(got, FixOutcome::Changed(_)), "{got:?}");
    crate::ops::names::remember(&locks, &iscsi(1), &old).unwrap();
    let got = fix(&root, &found[0], Some(&locks), false, deadline).unwrap();
    assert!(matches!(got, FixOutcome::Fixed(_)), "{got:?}");
    assert_eq!(crate::ops::names::recall(&locks, &iscsi(1)), None);
    let got = fix(&root, &found[0], Some(&locks), false, deadline).unwrap();
    assert_eq!(got, FixOutcome::Gone);
    // Its lock was taken as an attach takes it: by the recorded WWID.
    assert!(crate::ops::lock::file_path(&locks, &old.to_multipath()).exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_mark_of_a_subsystem_still_on_the_node_is_left_by_a_plain_fix() {
    let r = records(&[], &[nvme(1)]);
    let mut t = empty();
    t.nvme_controllers = vec![controller(NQN)];
    let found = classify(&t, &r);
    assert_eq!(kinds(&found), [Kind::StaleAttachMark]);
    assert!(Kind::StaleAttachMark.recoverable());
    // Its namespace may be hidden for a moment: the subsystem's controller is still here.
    assert!(subsystem_on_node(&t, &found[0]));
    // Another subsystem's controller is not its.
    t.nvme_controllers = vec![controller("nqn.2014-08.org.lunkit:b")];
    assert!(!subsystem_on_node(&t, &found[0]));
    t.nvme_controllers.clear();
    assert!(!subsystem_on_node(&t, &found[0]));
}

//! The topology model on the hand-built FC tree (tests/fixtures/fc, see make_fc.py there).

use std::path::PathBuf;

mod common;

use lunkit::{Hctl, Root, Topology, Transport, Wwn};

fn fc_root() -> Root {
    Root::new(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fc"))
}

#[test]
fn hosts_carry_their_transport() {
    let t = Topology::read(&fc_root()).unwrap();
    let hosts: Vec<_> = t
        .scsi_hosts
        .iter()
        .map(|h| (h.number, h.transport))
        .collect();
    assert_eq!(
        hosts,
        [(5, Transport::Fc), (6, Transport::Fc), (7, Transport::Fc)]
    );
    assert_eq!(t.scsi_hosts[0].proc_name.as_deref(), Some("qla2xxx"));
    let fc: Vec<_> = t
        .fc_hosts
        .iter()
        .map(|h| (h.host, h.port_name, h.port_state.as_deref()))
        .collect();
    assert_eq!(
        fc,
        [
            (5, Some(Wwn(0x21000024ff3a0001)), Some("Online")),
            (6, Some(Wwn(0x21000024ff3a0002)), Some("Online")),
            (7, Some(Wwn(0x21000024ff3a0003)), Some("Linkdown")),
        ]
    );
}

#[test]
fn remote_ports_have_roles_target_ids_and_targets() {
    let t = Topology::read(&fc_root()).unwrap();
    let names: Vec<_> = t.fc_rports.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(
        names,
        ["rport-5:0-0", "rport-5:0-1", "rport-5:0-2", "rport-6:0-0"]
    );

    let r0 = &t.fc_rports[0];
    assert_eq!((r0.host, r0.channel, r0.number), (5, 0, 0));
    assert_eq!(r0.port_name, Some(Wwn(0x500a098188a8b1c1)));
    assert!(r0.is_fcp_target());
    assert_eq!(r0.scsi_target_id, Some(0));
    assert_eq!(r0.target, Some((5, 0, 0)));

    let initiator = &t.fc_rports[1];
    assert_eq!(initiator.roles, ["FCP Initiator"]);
    assert!(!initiator.is_fcp_target());
    assert_eq!(initiator.scsi_target_id, None, "-1 means no target id");
    assert_eq!(initiator.target, None);

    let blocked = &t.fc_rports[2];
    assert_eq!(blocked.port_state.as_deref(), Some("Blocked"));
    assert_eq!(blocked.scsi_target_id, Some(1));
    assert_eq!(
        blocked.target, None,
        "no SCSI target was ever created below it"
    );
}

#[test]
fn luns_block_devices_and_multipath_map() {
    let t = Topology::read(&fc_root()).unwrap();
    let devs: Vec<_> = t
        .scsi_devices
        .iter()
        .map(|d| {
            (
                d.hctl,
                d.block.as_deref(),
                d.sg.as_deref(),
                d.wwid.as_deref(),
            )
        })
        .collect();
    let wwid = Some("naa.600a098038303053453f463045727a41");
    assert_eq!(
        devs,
        [
            (Hctl::new(5, 0, 0, 0), Some("sdc"), Some("sg2"), wwid),
            (Hctl::new(6, 0, 0, 0), Some("sdd"), Some("sg3"), wwid),
        ]
    );
    let d = &t.scsi_devices[0];
    assert_eq!(
        d.vendor.as_deref(),
        Some("NETAPP"),
        "INQUIRY padding is trimmed"
    );
    assert_eq!(d.model.as_deref(), Some("LUN C-Mode"));
    assert_eq!(d.device_type, Some(0));

    let sdc = t.block("sdc").unwrap();
    assert_eq!(sdc.dev.unwrap().to_string(), "8:32");
    assert_eq!(sdc.size_bytes, Some(20971520 * 512));
    assert_eq!(sdc.read_only, Some(false));
    assert_eq!(sdc.holders, ["dm-0"]);

    let maps: Vec<_> = t.multipath_maps().collect();
    assert_eq!(
        maps.len(),
        1,
        "the partition map is not a multipath map: {maps:?}"
    );
    let m = &maps[0];
    assert_eq!(m.name, Some("mpathb"));
    assert_eq!(m.dm, "dm-0");
    assert_eq!(m.wwid, "3600a098038303053453f463045727a41");
    assert_eq!(m.paths, ["sdc", "sdd"]);

    let dms: Vec<_> = t.dm_devices().map(|d| (d.dm, d.name, d.uuid)).collect();
    assert_eq!(
        dms,
        [
            (
                "dm-0",
                Some("mpathb"),
                Some("mpath-3600a098038303053453f463045727a41")
            ),
            (
                "dm-1",
                Some("mpathb1"),
                Some("part1-mpath-3600a098038303053453f463045727a41")
            ),
        ]
    );
    assert!(t.iscsi_sessions.is_empty());
    assert!(t.nvme_controllers.is_empty());
}

#[test]
fn missing_root_is_not_an_empty_node() {
    let err = Topology::read(&Root::new("/nonexistent/lunkit-root")).unwrap_err();
    assert_eq!(err.kind(), lunkit::ErrorKind::NotFound);
    assert!(
        err.to_string().contains("/nonexistent/lunkit-root/sys"),
        "{err}"
    );
}

/// A remote port the FC transport keeps past `dev_loss_tmo` (`Not Present`, bound by WWPN):
/// the kernel sets its node name and port id to `-1` and its roles to `unknown`. Those are
/// placeholders, not a port's values: they read as unknown, the port name (its binding)
/// stays.
#[test]
fn a_not_present_ports_placeholders_read_as_unknown() {
    let dir = common::Scratch::with_fixture("fc", "topology-fc-not-present");
    let rport = dir.path().join("sys/class/fc_remote_ports/rport-6:0-0");
    for (attr, value) in [
        ("port_state", "Not Present"),
        ("roles", "unknown"),
        ("node_name", "0xffffffffffffffff"),
        ("port_id", "0xffffffff"),
    ] {
        std::fs::write(rport.join(attr), format!("{value}\n")).unwrap();
    }
    let t = Topology::read(&Root::new(dir.path())).unwrap();
    let r = t
        .fc_rports
        .iter()
        .find(|r| r.name == "rport-6:0-0")
        .unwrap();
    assert_eq!(r.port_state.as_deref(), Some("Not Present"));
    assert_eq!(r.roles, Vec::<String>::new());
    assert!(!r.is_fcp_target());
    assert_eq!(r.node_name, None);
    assert_eq!(r.port_id, None);
    assert_eq!(r.port_name, Some(Wwn(0x500a098188a8b1c1)));
}

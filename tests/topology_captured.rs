//! The topology model on sysfs trees captured from a real 6.1 kernel in the VM lab
//! (tests/fixtures/*/README.md says how each was made).

use std::path::PathBuf;

use lunkit::{Hctl, Root, Topology, Transport};

mod common;
use common::Scratch;

fn root(name: &str) -> Root {
    Root::new(
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(name),
    )
}

#[test]
fn iscsi_sessions_hosts_and_portals() {
    let t = Topology::read(&root("iscsi-multipath")).unwrap();
    let s: Vec<_> = t
        .iscsi_sessions
        .iter()
        .map(|s| {
            (
                s.sid,
                s.host,
                s.target_id,
                s.portal(),
                s.state.as_deref(),
                s.tpgt,
            )
        })
        .collect();
    assert_eq!(
        s,
        [
            (
                1,
                Some(6),
                Some(0),
                Some("127.0.0.1:3260".to_owned()),
                Some("LOGGED_IN"),
                Some(1)
            ),
            (
                2,
                Some(7),
                Some(0),
                Some("127.0.0.2:3260".to_owned()),
                Some("LOGGED_IN"),
                Some(1)
            ),
        ]
    );
    for sess in &t.iscsi_sessions {
        assert_eq!(
            sess.target.as_deref(),
            Some("iqn.2003-01.org.linux-iscsi.lunkit:lab")
        );
        assert_eq!(sess.connections.len(), 1);
        let c = &sess.connections[0];
        assert_eq!(c.name, format!("connection{}:0", sess.sid));
        assert_eq!(c.persistent_port, Some(3260));
        assert_eq!(c.port, Some(3260), "live connection has its socket peer");
    }
    let iscsi_hosts: Vec<_> = t
        .scsi_hosts
        .iter()
        .filter(|h| h.transport == Transport::Iscsi)
        .map(|h| (h.number, h.proc_name.as_deref()))
        .collect();
    assert_eq!(
        iscsi_hosts,
        [(6, Some("iscsi_tcp")), (7, Some("iscsi_tcp"))]
    );
}

/// multipathd builds maps in parallel, so `mpatha` may well be dm-1: the maps are listed by
/// name all the same (a CI run failed on exactly this before they were).
#[test]
fn multipath_maps_are_in_name_order_whatever_their_dm_numbers() {
    let s = Scratch::with_fixture("iscsi-multipath", "topology-swapped-maps");
    let dm = |n: &str| {
        s.path()
            .join(format!("sys/devices/virtual/block/{n}/dm/name"))
    };
    std::fs::write(dm("dm-0"), "mpathb\n").unwrap();
    std::fs::write(dm("dm-1"), "mpatha\n").unwrap();
    let t = Topology::read(&Root::new(s.path())).unwrap();
    let maps: Vec<_> = t
        .multipath_maps()
        .map(|m| (m.name, m.dm, m.paths.to_vec()))
        .collect();
    assert_eq!(
        maps,
        [
            (
                Some("mpatha"),
                "dm-1",
                vec!["sdb".to_owned(), "sdd".to_owned()]
            ),
            (
                Some("mpathb"),
                "dm-0",
                vec!["sda".to_owned(), "sdc".to_owned()]
            ),
        ]
    );
}

#[test]
fn multipath_maps_group_the_two_sessions_paths() {
    let t = Topology::read(&root("iscsi-multipath")).unwrap();
    let maps: Vec<_> = t
        .multipath_maps()
        .map(|m| (m.name, m.dm, m.paths.to_vec()))
        .collect();
    assert_eq!(
        maps,
        [
            (
                Some("mpatha"),
                "dm-0",
                vec!["sda".to_owned(), "sdc".to_owned()]
            ),
            (
                Some("mpathb"),
                "dm-1",
                vec!["sdb".to_owned(), "sdd".to_owned()]
            ),
        ]
    );
    // The map's WWID is the multipath form of its paths' sysfs WWID.
    for m in t.multipath_maps() {
        for p in m.paths {
            let dev = t
                .scsi_devices
                .iter()
                .find(|d| d.block.as_deref() == Some(p.as_str()))
                .unwrap();
            let w: lunkit::Wwid = dev.wwid.as_deref().unwrap().parse().unwrap();
            assert_eq!(w.to_multipath(), m.wwid, "{p}");
        }
        assert_eq!(t.block(m.dm).unwrap().holders, Vec::<String>::new());
    }
    assert_eq!(t.block("sda").unwrap().holders, ["dm-0"]);
    let lio: Vec<_> = t
        .scsi_devices
        .iter()
        .filter(|d| d.vendor.as_deref() == Some("LIO-ORG"))
        .map(|d| (d.hctl, d.block.as_deref().unwrap()))
        .collect();
    assert_eq!(
        lio,
        [
            (Hctl::new(6, 0, 0, 0), "sda"),
            (Hctl::new(6, 0, 0, 1), "sdb"),
            (Hctl::new(7, 0, 0, 0), "sdc"),
            (Hctl::new(7, 0, 0, 1), "sdd"),
        ]
    );
}

#[test]
fn scsi_debug_two_hosts_four_luns() {
    let t = Topology::read(&root("scsi-debug")).unwrap();
    let dbg: Vec<_> = t
        .scsi_hosts
        .iter()
        .filter(|h| h.proc_name.as_deref() == Some("scsi_debug"))
        .map(|h| h.number)
        .collect();
    assert_eq!(dbg.len(), 2);
    for h in dbg {
        let luns: Vec<u64> = t.devices_on_host(h).map(|d| d.hctl.lun).collect();
        assert_eq!(luns, [0, 1, 2, 3], "host{h}");
        for d in t.devices_on_host(h) {
            assert_eq!(d.state.as_deref(), Some("running"));
            assert!(
                d.wwid.as_deref().is_some_and(|w| w.starts_with("naa.")),
                "{:?}",
                d.wwid
            );
            let b = t.block(d.block.as_deref().unwrap()).unwrap();
            assert_eq!(b.size_bytes, Some(8 << 20));
            assert_eq!(b.dev.unwrap().major, 8);
        }
    }
    assert_eq!(t.multipath_maps().count(), 0);
    assert!(t.iscsi_sessions.is_empty());
}

#[test]
fn sessions_to_one_target_leave_the_others_out() {
    let s = Scratch::with_fixture("iscsi-multipath", "topology-sessions-to");
    let session2 = s
        .path()
        .join("sys/devices/platform/host7/session2/iscsi_session/session2");
    std::fs::write(
        session2.join("targetname"),
        "iqn.2003-01.org.example:other\n",
    )
    .unwrap();
    let root = Root::new(s.path());
    let sids = |target: &str| -> Vec<(u32, Option<String>, usize)> {
        lunkit::iscsi::sysfs::sessions_to(&root, &target.parse().unwrap())
            .unwrap()
            .into_iter()
            .map(|s| (s.sid, s.portal(), s.connections.len()))
            .collect()
    };
    assert_eq!(
        sids("iqn.2003-01.org.linux-iscsi.lunkit:lab"),
        [(1, Some("127.0.0.1:3260".to_owned()), 1)]
    );
    assert_eq!(
        sids("iqn.2003-01.org.example:other"),
        [(2, Some("127.0.0.2:3260".to_owned()), 1)]
    );
    assert!(sids("iqn.2003-01.org.example:none").is_empty());
    // The full read agrees with the filtered ones.
    let all = lunkit::iscsi::sysfs::sessions(&root).unwrap();
    assert_eq!(all.len(), 2);
    assert_eq!(
        all[1].target.as_deref(),
        Some("iqn.2003-01.org.example:other")
    );
}

/// The lean read a scan makes before its writes agrees with the full session read, and the
/// portal it reads later is the session's own.
#[test]
fn session_paths_agree_with_the_full_sessions() {
    use lunkit::iscsi::sysfs::{Portals, paths_to, portal_of, sessions};
    let r = root("iscsi-multipath");
    let iqn = &"iqn.2003-01.org.linux-iscsi.lunkit:lab".parse().unwrap();
    let full = sessions(&r).unwrap();
    assert_eq!(full.len(), 2);
    let every: Vec<String> = full.iter().filter_map(|s| s.portal()).collect();
    assert_eq!(every.len(), 2);
    for portals in [Portals::Any, Portals::Only(&every)] {
        let lean = paths_to(&r, iqn, portals).unwrap();
        assert_eq!(lean.len(), full.len());
        for (l, f) in lean.iter().zip(&full) {
            assert_eq!(
                (
                    l.sid,
                    l.host,
                    l.target_id,
                    l.state.as_ref().map(|s| s.as_str())
                ),
                (f.sid, f.host, f.target_id, f.state.as_deref())
            );
            assert_eq!(l.state, Some(lunkit::iscsi::sysfs::IscsiState::LoggedIn));
            let want = match portals {
                Portals::Any => None,
                Portals::Only(_) => f.portal(),
            };
            assert_eq!(l.portal, want, "session{}", l.sid);
            assert_eq!(portal_of(&r, l.sid), f.portal());
        }
    }
    // Only the sessions through the portals asked for; none through a portal no session has.
    let second = &every[1..];
    let through: Vec<u32> = paths_to(&r, iqn, Portals::Only(second))
        .unwrap()
        .iter()
        .map(|s| s.sid)
        .collect();
    assert_eq!(through, [full[1].sid]);
    let nowhere = ["192.0.2.9:3260".to_owned()];
    assert!(
        paths_to(&r, iqn, Portals::Only(&nowhere))
            .unwrap()
            .is_empty()
    );
    assert!(
        paths_to(
            &r,
            &"iqn.2003-01.org.example:other".parse().unwrap(),
            Portals::Only(&every),
        )
        .unwrap()
        .is_empty()
    );
    assert_eq!(portal_of(&r, 9), None);
}

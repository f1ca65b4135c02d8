//! FC, iSCSI and generic scans on writable copies of the fixture trees: the scan string lands
//! in exactly the hosts that lead to the target, and nothing else is written.

use std::fs;
use std::path::Path;
use std::time::Duration;

use lunkit::fc::FcLun;
use lunkit::iscsi::IscsiLun;
use lunkit::{Error, ErrorKind, Hctl, PathOutcome, Root, ScanOptions, Wwn};

mod common;
use common::Scratch;

fn scan_file(root: &Path, host: u32) -> String {
    fs::read_to_string(root.join(format!("sys/class/scsi_host/host{host}/scan"))).unwrap()
}

fn quick() -> ScanOptions {
    let mut o = ScanOptions::default();
    o.timeout = Duration::from_millis(200);
    o
}

fn fc(wwpn: Wwn, initiators: &[Wwn], lun: u64, wildcard: bool) -> FcLun {
    FcLun {
        wwpns: vec![wwpn],
        initiators: initiators.to_vec(),
        lun,
        wildcard,
    }
}

fn iscsi(target: &str, portals: &[&str], lun: u64) -> IscsiLun {
    IscsiLun {
        portals: portals.iter().map(ToString::to_string).collect(),
        ..IscsiLun::new(target.parse().unwrap(), lun)
    }
}

const TARGET: Wwn = Wwn(0x500a098188a8b1c1);

#[test]
fn fc_scan_writes_only_to_hosts_with_matching_online_target_ports() {
    let dir = Scratch::with_fixture("fc", "scan-fc-match");
    let root = Root::new(dir.path());
    // LUN 3 does not exist in the tree, so after the writes the scan reports it missing on
    // both paths: every path is scanned, a missing one does not stop the others.
    let err = lunkit::fc::scan(&root, &fc(TARGET, &[], 3, false), &quick()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    let Error::MissingPaths { found, paths, .. } = &err else {
        panic!("{err:?}")
    };
    assert_eq!(*found, 0);
    let outcomes: Vec<_> = paths
        .iter()
        .map(|p| (p.via.as_str(), p.hctl, p.outcome.as_str()))
        .collect();
    assert_eq!(
        outcomes,
        [
            (
                "host5 rport-5:0-0",
                Some(Hctl::new(5, 0, 0, 3)),
                "not-reported"
            ),
            (
                "host6 rport-6:0-0",
                Some(Hctl::new(6, 0, 0, 3)),
                "not-reported"
            ),
        ]
    );
    assert!(
        err.to_string()
            .contains("LUN 3 of FC target 0x500a098188a8b1c1: 0 of 2 path(s) came"),
        "{err}"
    );
    assert_eq!(scan_file(dir.path(), 5), "0 0 3");
    assert_eq!(scan_file(dir.path(), 6), "0 0 3");
    assert_eq!(
        scan_file(dir.path(), 7),
        "",
        "Linkdown host without rports is never written"
    );
}

#[test]
fn fc_scan_honours_initiator_filter_and_port_state() {
    let dir = Scratch::with_fixture("fc", "scan-fc-filter");
    let root = Root::new(dir.path());
    let host6 = Wwn(0x21000024ff3a0002);
    let err = lunkit::fc::scan(&root, &fc(TARGET, &[host6], 3, false), &quick()).unwrap_err();
    assert!(matches!(err, Error::NotFound { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("LUN 3 behind host6 channel 0 target 0"),
        "one path scanned, so its own error: {err}"
    );
    assert_eq!(
        scan_file(dir.path(), 5),
        "",
        "host5 is not among the initiators"
    );
    assert_eq!(scan_file(dir.path(), 6), "0 0 3");

    // rport-5:0-2 leads to this WWPN but is Blocked: the kernel would skip it, so do we.
    let blocked = Wwn(0x500a098188a8b1c2);
    // Nothing is written, and the error names the path and why it was not scanned.
    let err = lunkit::fc::scan(&root, &fc(blocked, &[], 0, false), &quick()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    assert!(
        err.to_string()
            .contains("5:0:1:0 via host5 rport-5:0-2: skipped: port state Blocked"),
        "{err}"
    );
    // An initiator-only rport is never a scan target.
    let err =
        lunkit::fc::scan(&root, &fc(Wwn(0x10000090fa3b0001), &[], 0, false), &quick()).unwrap_err();
    assert!(matches!(err, Error::NotFound { .. }));
    assert_eq!(scan_file(dir.path(), 5), "");
}

#[test]
fn fc_scan_through_several_target_ports_covers_each_and_names_which() {
    let dir = Scratch::with_fixture("fc", "scan-fc-ports");
    let root = Root::new(dir.path());
    // The array's second port is Blocked behind host5: skipped, listed, never written.
    let second = Wwn(0x500a098188a8b1c2);
    let lun = FcLun::new(vec![second, TARGET, TARGET], 3);
    let err = lunkit::fc::scan(&root, &lun, &quick()).unwrap_err();
    let Error::MissingPaths { what, paths, .. } = &err else {
        panic!("{err:?}")
    };
    assert_eq!(
        what, "LUN 3 of FC target 0x500a098188a8b1c1, 0x500a098188a8b1c2",
        "each port once, in order"
    );
    let outcomes: Vec<_> = paths
        .iter()
        .map(|p| (p.via.as_str(), p.hctl, p.outcome.as_str()))
        .collect();
    assert_eq!(
        outcomes,
        [
            (
                "host5 rport-5:0-0 (0x500a098188a8b1c1)",
                Some(Hctl::new(5, 0, 0, 3)),
                "not-reported"
            ),
            (
                "host5 rport-5:0-2 (0x500a098188a8b1c2)",
                Some(Hctl::new(5, 0, 1, 3)),
                "skipped"
            ),
            (
                "host6 rport-6:0-0 (0x500a098188a8b1c1)",
                Some(Hctl::new(6, 0, 0, 3)),
                "not-reported"
            ),
        ]
    );
    assert_eq!(
        scan_file(dir.path(), 5),
        "0 0 3",
        "only the Online port's target"
    );
    assert_eq!(scan_file(dir.path(), 6), "0 0 3");

    // No port named at all is a usage error before anything is read or written.
    let dir = Scratch::with_fixture("fc", "scan-fc-noports");
    let root = Root::new(dir.path());
    let err = lunkit::fc::scan(&root, &FcLun::new(Vec::new(), 3), &quick()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Invalid, "{err}");
    assert!(
        err.to_string().contains("at least one target port"),
        "{err}"
    );
    assert_eq!(scan_file(dir.path(), 5), "");
    assert_eq!(scan_file(dir.path(), 6), "");
}

#[test]
fn fc_wildcard_only_when_asked() {
    let dir = Scratch::with_fixture("fc", "scan-fc-wild");
    let root = Root::new(dir.path());
    let _ = lunkit::fc::scan(&root, &fc(TARGET, &[], 3, true), &quick()).unwrap_err();
    assert_eq!(scan_file(dir.path(), 5), "- - 3");
    assert_eq!(scan_file(dir.path(), 6), "- - 3");
}

#[test]
fn present_lun_is_rescanned_and_identified() {
    let dir = Scratch::with_fixture("fc", "scan-present");
    let root = Root::new(dir.path());
    // Stand-ins for the device nodes devtmpfs would have made.
    fs::create_dir_all(dir.path().join("dev")).unwrap();
    fs::write(dir.path().join("dev/sdc"), "").unwrap();
    fs::write(dir.path().join("dev/sdd"), "").unwrap();

    let report = lunkit::fc::scan(&root, &fc(TARGET, &[], 0, false), &quick()).unwrap();
    let paths: Vec<_> = report.devices().collect();
    let got: Vec<_> = paths
        .iter()
        .map(|p| (p.hctl, p.name.as_str(), p.dev.to_string()))
        .collect();
    assert_eq!(
        got,
        [
            (Hctl::new(5, 0, 0, 0), "sdc", "8:32".to_owned()),
            (Hctl::new(6, 0, 0, 0), "sdd", "8:48".to_owned())
        ]
    );
    assert_eq!(paths[0].dev_path, dir.path().join("dev/sdc"));
    assert_eq!(
        paths[0].wwid.as_ref().unwrap().to_multipath(),
        "3600a098038303053453f463045727a41"
    );
    let rescan = dir
        .path()
        .join("sys/class/scsi_device/5:0:0:0/device/rescan");
    assert_eq!(fs::read_to_string(rescan).unwrap(), "1");
    assert_eq!(
        scan_file(dir.path(), 5),
        "",
        "a present LUN is rescanned, not scanned"
    );

    // The expected WWID in either form is accepted; another one is rejected by name.
    let mut ok = quick();
    ok.expect_wwid = Some("3600a098038303053453f463045727a41".parse().unwrap());
    lunkit::scsi::scan(&root, Hctl::new(5, 0, 0, 0), &ok).unwrap();
    let mut wrong = quick();
    wrong.expect_wwid = Some("naa.600a098038303053453f463045727a42".parse().unwrap());
    // sdc is a path of map dm-0 (…41): a leftover of that volume, refused as it is.
    let rescan = dir
        .path()
        .join("sys/class/scsi_device/5:0:0:0/device/rescan");
    fs::write(&rescan, "").unwrap();
    let err = lunkit::scsi::scan(&root, Hctl::new(5, 0, 0, 0), &wrong).unwrap_err();
    let msg = err.to_string();
    assert_eq!(err.kind(), ErrorKind::Busy, "{msg}");
    assert!(
        msg.contains("5:0:0:0")
            && msg.contains("multipath map dm-0 is stacked on sdc")
            && msg.contains("naa.600a098038303053453f463045727a42")
            && msg.contains("naa.600a098038303053453f463045727a41")
            && msg.contains("not rescanned"),
        "{msg}"
    );
    assert_eq!(
        fs::read_to_string(&rescan).unwrap(),
        "",
        "a leftover path of another volume is not rescanned"
    );

    // Once nothing holds it, a stale path is rescanned, and its WWID decides.
    let holders = dir.path().join("sys/class/block/sdc/holders");
    fs::remove_file(holders.join("dm-0")).unwrap();
    let err = lunkit::scsi::scan(&root, Hctl::new(5, 0, 0, 0), &wrong).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::WwidMismatch { .. }), "{msg}");
    assert!(
        msg.contains("naa.600a098038303053453f463045727a42")
            && msg.contains("naa.600a098038303053453f463045727a41"),
        "{msg}"
    );
    assert_eq!(fs::read_to_string(&rescan).unwrap(), "1");
}

/// A path whose LUN was re-mapped while its map still holds it reports the new volume's WWID
/// (after the rescan, or already, when something else rescanned it): it is not handed out as
/// the new volume's path, whether or not the caller names the volume it expects.
#[test]
fn a_held_path_that_reports_another_volume_is_not_handed_out() {
    let dir = Scratch::with_fixture("fc", "scan-remapped");
    let root = Root::new(dir.path());
    fs::create_dir_all(dir.path().join("dev")).unwrap();
    fs::write(dir.path().join("dev/sdc"), "").unwrap();
    let other = "naa.600a098038303053453f463045727a42";
    fs::write(
        dir.path().join("sys/class/scsi_device/5:0:0:0/device/wwid"),
        format!("{other}\n"),
    )
    .unwrap();
    for expect in [None, Some(other.parse().unwrap())] {
        let mut opts = quick();
        opts.expect_wwid = expect;
        let err = lunkit::scsi::scan(&root, Hctl::new(5, 0, 0, 0), &opts).unwrap_err();
        let msg = err.to_string();
        assert_eq!(err.kind(), ErrorKind::Busy, "{msg}");
        assert!(
            msg.contains("multipath map dm-0 is stacked on sdc")
                && msg.contains("naa.600a098038303053453f463045727a41"),
            "{msg}"
        );
    }
}

#[test]
fn missing_node_times_out_naming_the_device() {
    let dir = Scratch::with_fixture("fc", "scan-timeout");
    let root = Root::new(dir.path());
    let err = lunkit::scsi::scan(&root, Hctl::new(5, 0, 0, 0), &quick()).unwrap_err();
    assert!(matches!(err, Error::Timeout { .. }), "{err}");
    assert!(err.to_string().contains("block device of 5:0:0:0"), "{err}");
    let err = lunkit::scsi::scan(&root, Hctl::new(9, 0, 0, 0), &quick()).unwrap_err();
    assert!(err.to_string().contains("SCSI host9 not found"), "{err}");
}

#[test]
fn iscsi_scan_writes_to_every_session_of_the_target_only() {
    let dir = Scratch::with_fixture("iscsi-multipath", "scan-iscsi");
    let root = Root::new(dir.path());
    let iqn = "iqn.2003-01.org.linux-iscsi.lunkit:lab";
    let scan_files = |d: &Path| -> Vec<String> { (0..=7).map(|h| scan_file(d, h)).collect() };

    let err = lunkit::iscsi::scan(&root, &iscsi(iqn, &[], 7), &quick()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    // The portals, read while the writes were in flight, name the paths.
    for via in ["session1 (127.0.0.1:3260)", "session2 (127.0.0.2:3260)"] {
        assert!(err.to_string().contains(via), "{err}");
    }
    assert_eq!(scan_files(dir.path())[6], "0 0 7");
    assert_eq!(scan_files(dir.path())[7], "0 0 7");
    assert!(
        scan_files(dir.path())[..6].iter().all(String::is_empty),
        "non-iSCSI hosts untouched"
    );

    // Restricted to the second portal, only session2's host (host7) is scanned.
    let dir2 = Scratch::with_fixture("iscsi-multipath", "scan-iscsi-portal");
    let root2 = Root::new(dir2.path());
    let _ = lunkit::iscsi::scan(&root2, &iscsi(iqn, &["127.0.0.2:3260"], 7), &quick()).unwrap_err();
    let f = scan_files(dir2.path());
    assert_eq!((f[6].as_str(), f[7].as_str()), ("", "0 0 7"));

    // Restricted to an iface: session2 logged in through another iface ("other") is
    // someone else's session and is not scanned; session1's iface is "default".
    let dir4 = Scratch::with_fixture("iscsi-multipath", "scan-iscsi-iface");
    let root4 = Root::new(dir4.path());
    let iface2 = "sys/devices/platform/host7/session2/iscsi_session/session2/ifacename";
    fs::write(dir4.path().join(iface2), "other\n").unwrap();
    let only = |iface: &str| IscsiLun {
        ifaces: vec![iface.to_owned()],
        ..iscsi(iqn, &[], 7)
    };
    let err = lunkit::iscsi::scan(&root4, &only("default"), &quick()).unwrap_err();
    assert!(!err.to_string().contains("host7"), "{err}");
    let f = scan_files(dir4.path());
    assert_eq!((f[6].as_str(), f[7].as_str()), ("0 0 7", ""));
    // No session on the iface asked: nothing written, and the login to make names it.
    let err = lunkit::iscsi::scan(&root4, &only("iface9"), &quick()).unwrap_err();
    assert!(
        err.to_string().contains(" on iface iface9; ") && err.to_string().contains("-I iface9"),
        "{err}"
    );
    assert_eq!(scan_files(dir4.path())[7], "");

    // Another target, a malformed name: nothing written.
    let dir3 = Scratch::with_fixture("iscsi-multipath", "scan-iscsi-other");
    let root3 = Root::new(dir3.path());
    let err = lunkit::iscsi::scan(
        &root3,
        &iscsi("iqn.2003-01.org.example:other", &[], 0),
        &quick(),
    )
    .unwrap_err();
    // One sentence that says how to log in (no portal asked: `PORTAL` stands for it).
    let msg = err.to_string();
    assert!(
        msg.starts_with("no logged-in iSCSI session to iqn.2003-01.org.example:other; ")
            && msg
                .contains("`iscsiadm -m node -T iqn.2003-01.org.example:other -p PORTAL --login`"),
        "{msg}"
    );
    // A malformed name cannot reach a scan: the IscsiLun takes a parsed name.
    let err = "iqn../../x y".parse::<lunkit::id::IscsiName>().unwrap_err();
    assert!(matches!(err, Error::Invalid { .. }), "{err}");
    assert!(scan_files(dir3.path()).iter().all(String::is_empty));
}

/// The FC node of the parallel-scan issue: the target is target 0 behind host3, target 2
/// behind host4, and Blocked behind host5; LUN 3 is present behind host4 only.
#[test]
fn fc_scan_goes_through_every_port_and_reports_each() {
    let dir = Scratch::with_fixture("fc-three-hbas", "scan-fc-three");
    let root = Root::new(dir.path());
    fs::create_dir_all(dir.path().join("dev")).unwrap();
    fs::write(dir.path().join("dev/sdf"), "").unwrap();

    let report = lunkit::fc::scan(&root, &fc(TARGET, &[], 3, false), &quick()).unwrap();
    assert_eq!(scan_file(dir.path(), 3), "0 0 3");
    // Present behind host4: rescanned, not scanned.
    assert_eq!(scan_file(dir.path(), 4), "");
    let rescan = dir
        .path()
        .join("sys/class/scsi_device/4:0:2:3/device/rescan");
    assert_eq!(fs::read_to_string(rescan).unwrap(), "1");
    assert_eq!(
        scan_file(dir.path(), 5),
        "",
        "a Blocked port is never written"
    );
    let outcomes: Vec<_> = report
        .paths
        .iter()
        .map(|p| (p.via.as_str(), p.hctl, p.outcome.to_string()))
        .collect();
    assert_eq!(
        outcomes,
        [
            (
                "host3 rport-3:0-0",
                Some(Hctl::new(3, 0, 0, 3)),
                "not reported by the target".to_owned()
            ),
            (
                "host4 rport-4:0-2",
                Some(Hctl::new(4, 0, 2, 3)),
                "found sdf".to_owned()
            ),
            (
                "host5 rport-5:0-1",
                Some(Hctl::new(5, 0, 1, 3)),
                "skipped: port state Blocked".to_owned()
            ),
        ]
    );
    let t = report.paths[1].timing;
    assert!(
        t.write_start <= t.write_end && t.write_end <= t.ready,
        "{t:?}"
    );
    assert!(report.paths[2].timing.write_start.is_none());
    assert_eq!(
        report.wwid().map(|w| w.to_multipath()).as_deref(),
        Some("3600a098038303053453f463045727a41")
    );

    // Two paths wanted, one came: not found (exit 3), with every path's outcome.
    let mut two = quick();
    two.min_paths = 2;
    let err = lunkit::fc::scan(&root, &fc(TARGET, &[], 3, false), &two).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    let msg = err.to_string();
    for part in [
        "1 of 3 path(s) came, 2 wanted",
        "3:0:0:3 via host3 rport-3:0-0: not reported by the target",
        "4:0:2:3 via host4 rport-4:0-2: found sdf",
        "5:0:1:3 via host5 rport-5:0-1: skipped: port state Blocked",
    ] {
        assert!(msg.contains(part), "{part:?} not in {msg}");
    }
}

/// Every port to the target Blocked (here: only host5's initiator allowed): nothing is
/// written, and the error still names the path and why it was skipped, instead of "no
/// online port".
#[test]
fn a_target_reached_only_through_blocked_ports_names_them() {
    let dir = Scratch::with_fixture("fc-three-hbas", "scan-fc-blocked");
    let root = Root::new(dir.path());
    let host5: Wwn = "0x21000024ff3a0051".parse().unwrap();
    let err = lunkit::fc::scan(&root, &fc(TARGET, &[host5], 3, false), &quick()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    let Error::MissingPaths {
        found,
        wanted,
        paths,
        ..
    } = &err
    else {
        panic!("not MissingPaths: {err:?}");
    };
    assert_eq!((*found, *wanted), (0, 1));
    assert_eq!(paths.len(), 1, "{err}");
    assert_eq!(paths[0].via, "host5 rport-5:0-1");
    assert_eq!(paths[0].outcome.to_string(), "skipped: port state Blocked");
    for host in [3, 4, 5] {
        assert_eq!(scan_file(dir.path(), host), "", "host{host} was written");
    }
}

#[test]
fn a_path_whose_wwid_differs_fails_the_scan_naming_it() {
    let dir = Scratch::with_fixture("fc", "scan-fc-mixed");
    let root = Root::new(dir.path());
    fs::create_dir_all(dir.path().join("dev")).unwrap();
    fs::write(dir.path().join("dev/sdc"), "").unwrap();
    fs::write(dir.path().join("dev/sdd"), "").unwrap();
    // The LUN behind host6 is now another volume (a LUN number reused on one path), and no
    // map holds its disk (held, it would be refused on its own: the test below).
    fs::remove_file(dir.path().join("sys/class/block/sdd/holders/dm-0")).unwrap();
    let wwid = dir.path().join("sys/class/scsi_device/6:0:0:0/device/wwid");
    fs::write(&wwid, "naa.600a098038303053453f463045727a99\n").unwrap();
    let err = lunkit::fc::scan(&root, &fc(TARGET, &[], 0, false), &quick()).unwrap_err();
    let Error::WwidMismatch {
        device,
        expected,
        reference,
        actual,
        new_paths,
    } = &err
    else {
        panic!("{err:?}")
    };
    assert_eq!(device, "sdd (6:0:0:0)");
    let wwid = |s: &str| Some(s.parse::<lunkit::Wwid>().unwrap());
    assert_eq!(*expected, wwid("naa.600a098038303053453f463045727a41"));
    assert_eq!(reference.as_deref(), Some("sdc (5:0:0:0)"));
    assert_eq!(*actual, wwid("naa.600a098038303053453f463045727a99"));
    // Both devices were there before the scan (it rescanned them): none is the scan's own.
    assert!(new_paths.is_empty(), "{new_paths:?}");
    assert_eq!(err.kind(), ErrorKind::WwidMismatch);
    assert_eq!(
        err.to_string(),
        "sdd (6:0:0:0) has WWID naa.600a098038303053453f463045727a99, expected \
         naa.600a098038303053453f463045727a41, as on sdc (5:0:0:0)"
    );
}

#[test]
fn a_path_that_does_not_open_times_out_while_the_others_come() {
    let dir = Scratch::with_fixture("fc", "scan-fc-one-slow");
    let root = Root::new(dir.path());
    // sdc's node exists, sdd's does not (its probe never finishes).
    fs::create_dir_all(dir.path().join("dev")).unwrap();
    fs::write(dir.path().join("dev/sdc"), "").unwrap();
    let report = lunkit::fc::scan(&root, &fc(TARGET, &[], 0, false), &quick()).unwrap();
    let outcomes: Vec<&str> = report.paths.iter().map(|p| p.outcome.as_str()).collect();
    assert_eq!(outcomes, ["found", "timed-out"]);
    assert!(matches!(
        report.paths[1].outcome,
        PathOutcome::TimedOut(Error::Timeout { .. })
    ));
    let mut two = quick();
    two.min_paths = 2;
    let err = lunkit::fc::scan(&root, &fc(TARGET, &[], 0, false), &two).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    assert!(
        err.to_string()
            .contains("6:0:0:0 via host6 rport-6:0-0: timed out"),
        "{err}"
    );
}

/// An attach holds the volume's lock, the one detach and resize take (issue 33 item 4):
/// while another operation holds it, the attach writes nothing and times out naming the
/// lock; named by address alone, it takes the key a detach by that name would take (the
/// WWID of the devices there).
#[test]
fn attach_waits_for_the_volume_lock_a_detach_holds() {
    let dir = Scratch::with_fixture("fc", "attach-lock");
    let root = Root::new(dir.path());
    fs::create_dir_all(dir.path().join("dev")).unwrap();
    fs::write(dir.path().join("dev/sdc"), "").unwrap();
    fs::write(dir.path().join("dev/sdd"), "").unwrap();
    let locks = dir.path().join("locks");
    let key = "3600a098038303053453f463045727a41";
    let held = lunkit::ops::lock::lock(
        key,
        Some(&locks),
        std::time::Instant::now() + Duration::from_secs(5),
    )
    .unwrap();

    let spec = lunkit::ops::VolumeSpec::Fc {
        wwpns: vec![TARGET],
        lun: 0,
    };
    let mut opts = lunkit::ops::AttachOptions::new(&root);
    opts.lock_dir = Some(locks.clone());
    opts.scan = quick();
    let rescan = dir
        .path()
        .join("sys/class/scsi_device/5:0:0:0/device/rescan");
    for expect in [None, Some(key.parse().unwrap())] {
        opts.scan.expect_wwid = expect;
        let e = lunkit::ops::attach(&root, &spec, &opts).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
        assert!(e.to_string().contains(key), "{e}");
        assert_eq!(
            fs::read_to_string(&rescan).unwrap(),
            "",
            "nothing is written while the lock is held"
        );
    }
    drop(held);
    let attached = lunkit::ops::attach(&root, &spec, &opts).unwrap();
    let scsi = attached.scsi().expect("an FC LUN is a SCSI attachment");
    assert_eq!(scsi.devices().count(), 2);
    assert!(attached.nvme().is_none());
    assert_eq!(fs::read_to_string(&rescan).unwrap(), "1");
}

//! FC, iSCSI and generic scans on writable copies of the fixture trees: the scan string lands
//! in exactly the hosts that lead to the target, and nothing else is written.

use std::fs;
use std::path::Path;
use std::time::Duration;

use lunkit::{Error, Hctl, Root, ScanOptions, Wwn};

mod common;
use common::Scratch;

fn scan_file(root: &Path, host: u32) -> String {
    fs::read_to_string(root.join(format!("sys/class/scsi_host/host{host}/scan"))).unwrap()
}

fn quick() -> ScanOptions {
    ScanOptions {
        timeout: Duration::from_millis(200),
        expect_wwid: None,
    }
}

const TARGET: Wwn = Wwn(0x500a098188a8b1c1);

#[test]
fn fc_scan_writes_only_to_hosts_with_matching_online_target_ports() {
    let dir = Scratch::with_fixture("fc", "scan-fc-match");
    let root = Root::new(dir.path());
    // LUN 3 does not exist in the tree, so after the writes the scan reports it missing.
    let err = lunkit::fc::scan(&root, TARGET, &[], 3, false, &quick()).unwrap_err();
    assert!(matches!(err, Error::NotFound { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("LUN 3 behind host5 channel 0 target 0"),
        "{err}"
    );
    assert_eq!(scan_file(dir.path(), 5), "0 0 3");
    // The first missing LUN stops the scan before host6 is written: one error, no half-state.
    assert_eq!(scan_file(dir.path(), 6), "");
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
    let err = lunkit::fc::scan(&root, TARGET, &[host6], 3, false, &quick()).unwrap_err();
    assert!(matches!(err, Error::NotFound { .. }), "{err}");
    assert_eq!(
        scan_file(dir.path(), 5),
        "",
        "host5 is not among the initiators"
    );
    assert_eq!(scan_file(dir.path(), 6), "0 0 3");

    // rport-5:0-2 leads to this WWPN but is Blocked: the kernel would skip it, so do we.
    let blocked = Wwn(0x500a098188a8b1c2);
    let err = lunkit::fc::scan(&root, blocked, &[], 0, false, &quick()).unwrap_err();
    assert!(
        err.to_string()
            .contains("online FC target port 0x500a098188a8b1c2"),
        "{err}"
    );
    // An initiator-only rport is never a scan target.
    let err =
        lunkit::fc::scan(&root, Wwn(0x10000090fa3b0001), &[], 0, false, &quick()).unwrap_err();
    assert!(matches!(err, Error::NotFound { .. }));
    assert_eq!(scan_file(dir.path(), 5), "");
}

#[test]
fn fc_wildcard_only_when_asked() {
    let dir = Scratch::with_fixture("fc", "scan-fc-wild");
    let root = Root::new(dir.path());
    let _ = lunkit::fc::scan(&root, TARGET, &[], 3, true, &quick()).unwrap_err();
    assert_eq!(scan_file(dir.path(), 5), "- - 3");
}

#[test]
fn present_lun_is_rescanned_and_identified() {
    let dir = Scratch::with_fixture("fc", "scan-present");
    let root = Root::new(dir.path());
    // Stand-ins for the device nodes devtmpfs would have made.
    fs::create_dir_all(dir.path().join("dev")).unwrap();
    fs::write(dir.path().join("dev/sdc"), "").unwrap();
    fs::write(dir.path().join("dev/sdd"), "").unwrap();

    let paths = lunkit::fc::scan(&root, TARGET, &[], 0, false, &quick()).unwrap();
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
    let ok = ScanOptions {
        expect_wwid: Some("3600a098038303053453f463045727a41".parse().unwrap()),
        ..quick()
    };
    lunkit::scsi::scan(&root, Hctl::new(5, 0, 0, 0), &ok).unwrap();
    let wrong = ScanOptions {
        expect_wwid: Some("naa.600a098038303053453f463045727a42".parse().unwrap()),
        ..quick()
    };
    let err = lunkit::scsi::scan(&root, Hctl::new(5, 0, 0, 0), &wrong).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::WwidMismatch { .. }));
    assert!(
        msg.contains("naa.600a098038303053453f463045727a42")
            && msg.contains("naa.600a098038303053453f463045727a41"),
        "{msg}"
    );
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

    let err = lunkit::iscsi::scan(&root, iqn, &[], 7, &quick()).unwrap_err();
    assert!(matches!(err, Error::NotFound { .. }), "{err}");
    assert_eq!(scan_files(dir.path())[6], "0 0 7");
    assert!(
        scan_files(dir.path())[..6].iter().all(String::is_empty),
        "non-iSCSI hosts untouched"
    );

    // Restricted to the second portal, only session2's host (host7) is scanned.
    let dir2 = Scratch::with_fixture("iscsi-multipath", "scan-iscsi-portal");
    let root2 = Root::new(dir2.path());
    let _ = lunkit::iscsi::scan(&root2, iqn, &["127.0.0.2:3260".into()], 7, &quick()).unwrap_err();
    let f = scan_files(dir2.path());
    assert_eq!((f[6].as_str(), f[7].as_str()), ("", "0 0 7"));

    // Another target, a malformed name: nothing written.
    let dir3 = Scratch::with_fixture("iscsi-multipath", "scan-iscsi-other");
    let root3 = Root::new(dir3.path());
    let err =
        lunkit::iscsi::scan(&root3, "iqn.2003-01.org.example:other", &[], 0, &quick()).unwrap_err();
    assert!(
        err.to_string()
            .contains("logged-in iSCSI session to iqn.2003-01.org.example:other"),
        "{err}"
    );
    let err = lunkit::iscsi::scan(&root3, "iqn../../x y", &[], 0, &quick()).unwrap_err();
    assert!(matches!(err, Error::Invalid { .. }), "{err}");
    assert!(scan_files(dir3.path()).iter().all(String::is_empty));
}

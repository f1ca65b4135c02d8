//! The WWID check of a scan, and what it says a caller brought onto the node.

use std::path::PathBuf;

use super::*;
use crate::id::DevNum;

fn scan(hctl: &str) -> Candidate {
    Candidate::Scan {
        via: "session1".into(),
        target: ScanTarget::exact(hctl.parse().unwrap()),
    }
}

fn found(hctl: &str, name: &str, wwid: &str) -> PathScan {
    PathScan {
        via: "session1".into(),
        hctl: Some(hctl.parse().unwrap()),
        outcome: PathOutcome::Found(PathDevice {
            hctl: hctl.parse().unwrap(),
            name: name.into(),
            dev_path: PathBuf::from(format!("/dev/{name}")),
            dev: DevNum { major: 8, minor: 0 },
            wwid: Some(wwid.parse().unwrap()),
        }),
        timing: PathTiming::default(),
    }
}

#[test]
fn only_the_devices_a_write_made_are_new() {
    let candidates = [
        scan("6:0:0:1"),
        scan("7:0:0:1"),
        scan("8:0:0:1"),
        Candidate::Skip {
            via: "session4".into(),
            hctl: Some("9:0:0:1".parse().unwrap()),
            why: "in recovery".into(),
        },
        scan("10:0:0:1"),
    ];
    let t = PathTiming::default();
    let triggered: Vec<Written> = vec![
        Some((Ok(Triggered::Added), t)),
        Some((Ok(Triggered::Present), t)),
        Some((Ok(Triggered::NotReported), t)),
        None,
        Some((
            Err(Error::Internal {
                what: "write".into(),
            }),
            t,
        )),
    ];
    let want: Vec<Hctl> = vec!["6:0:0:1".parse().unwrap()];
    assert_eq!(added(&candidates, &triggered), want);
}

#[test]
fn a_mismatch_is_its_own_kind_and_names_what_the_scan_brought() {
    let report = ScanReport {
        paths: vec![
            found("6:0:0:1", "sdb", "naa.600140500000000000000000000000aa"),
            found("7:0:0:1", "sdd", "naa.600140500000000000000000000000bb"),
        ],
        elapsed: Duration::ZERO,
    };
    let new: Vec<Hctl> = vec!["7:0:0:1".parse().unwrap()];
    let e = check_wwids(&report, None, new.clone()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::WwidMismatch, "{e}");
    assert_eq!(e.new_paths(), new.as_slice());
    let bb: Wwid = "naa.600140500000000000000000000000bb".parse().unwrap();
    assert_eq!(e.mismatched_wwid(), Some(&bb));
    assert_eq!(e.seen_wwid(), Some(&bb));
    // Through the step of a workflow, the same.
    let step = Error::Step {
        step: "scan",
        target: "LUN 1".into(),
        source: Box::new(e),
    };
    assert_eq!(step.kind(), ErrorKind::WwidMismatch);
    assert_eq!(step.new_paths(), new.as_slice());
    assert_eq!(step.mismatched_wwid(), Some(&bb));
    // The expected WWID on every path: no error.
    let aa: Wwid = "naa.600140500000000000000000000000aa".parse().unwrap();
    let one = ScanReport {
        paths: vec![found("6:0:0:1", "sdb", aa.as_sysfs())],
        elapsed: Duration::ZERO,
    };
    assert!(check_wwids(&one, Some(&aa), Vec::new()).is_ok());
}

#[test]
fn a_map_wait_that_failed_keeps_its_kind_and_says_the_wwid() {
    let wwid: Wwid = "naa.600140500000000000000000000000aa".parse().unwrap();
    let timeout = Error::Timeout {
        what: "multipath map".into(),
        waited: Duration::from_secs(1),
    };
    let text = timeout.to_string();
    let e = Error::MapWait {
        wwid: wwid.clone(),
        paths: vec!["sdb".into()],
        source: Box::new(timeout),
    };
    assert_eq!(e.kind(), ErrorKind::Timeout);
    assert_eq!(e.to_string(), text);
    assert_eq!(e.seen_wwid(), Some(&wwid));
    assert_eq!(e.mismatched_wwid(), None);
}

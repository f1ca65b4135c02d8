//! The node's leftovers, looked for in the background with lunkit's doctor
//! ([`lunkit::ops::doctor::examine`]): phantom disks, maps without paths, idle sessions, NVMe
//! controllers that are not live. Each examination sets the metrics' counts by kind
//! ([`crate::metrics::Metrics::examined`]), and each finding is logged once, when it first
//! shows (again only if it went and came back), so that a node's log is not a finding a
//! minute.
//!
//! Read only: the plugin never cleans up what it finds (that is `lunkit doctor --fix`, an
//! operator's call), and it skips the in-use check (a walk of every process), which only
//! matters for a fix.

use std::collections::BTreeSet;
use std::time::Duration;

use lunkit::Root;
use lunkit::ops::doctor::{self, DoctorOptions, Finding};

use crate::log;
use crate::metrics;

/// A finding's identity across examinations: its kind and objects.
fn key(f: &Finding) -> String {
    format!("{} {}", f.kind, f.objects.join(","))
}

/// The findings of `found` not in `seen` (to be logged), and the keys to remember for the
/// next examination: those of `found`, so that one that went and came back is new again.
pub fn news<'a>(
    seen: &BTreeSet<String>,
    found: &'a [Finding],
) -> (Vec<&'a Finding>, BTreeSet<String>) {
    let new = found.iter().filter(|f| !seen.contains(&key(f))).collect();
    (new, found.iter().map(key).collect())
}

/// Examines the node under `root` every `every`, on a thread of its own, for as long as
/// the process runs; a recoverable state counts once it has lasted `grace`.
///
/// # Errors
///
/// The thread could not be started.
pub fn spawn(
    root: Root,
    every: Duration,
    grace: Duration,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("lunkit-csi-doctor".into())
        .spawn(move || {
            let mut seen = BTreeSet::new();
            loop {
                seen = examine_once(&root, grace, &seen);
                std::thread::sleep(every);
            }
        })
}

/// One examination: the metrics set, the new findings logged; the keys to remember.
fn examine_once(root: &Root, grace: Duration, seen: &BTreeSet<String>) -> BTreeSet<String> {
    let mut opts = DoctorOptions::new(root);
    opts.check_use = false;
    opts.grace = grace;
    match doctor::examine(root, &opts) {
        Ok(exam) => {
            metrics::global().examined(Some(&exam.findings));
            let (new, keys) = news(seen, &exam.findings);
            for f in new {
                log::finding(f.kind.as_str(), &f.objects.join(","), &f.why);
            }
            keys
        }
        Err(e) => {
            metrics::global().examined(None);
            log::note(
                log::Level::Warn,
                &format!("examining the node for leftovers: {e}"),
            );
            seen.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lunkit::ops::doctor::Kind;

    fn finding(kind: Kind, object: &str) -> Finding {
        Finding {
            kind,
            objects: vec![object.to_owned()],
            why: "because".into(),
            identity: None,
            devices: vec![],
            usage: None,
            since: None,
            queues: None,
        }
    }

    #[test]
    fn a_finding_is_new_once_and_again_only_after_it_went() {
        let a = finding(Kind::NvmeControllerDown, "nvme0");
        let b = finding(Kind::IdleSession, "session3");
        let (new, seen) = news(&BTreeSet::new(), std::slice::from_ref(&a));
        assert_eq!(new, [&a]);
        let both = [a.clone(), b.clone()];
        let (new, seen) = news(&seen, &both);
        assert_eq!(new, [&b], "a was logged already");
        let (new, seen) = news(&seen, std::slice::from_ref(&b));
        assert!(new.is_empty());
        let (new, _) = news(&seen, &both);
        assert_eq!(new, [&a], "a went and came back");
        // The same objects under another kind are another finding.
        let other = finding(Kind::ScsiDeviceDown, "nvme0");
        let (new, _) = news(&[key(&a)].into(), std::slice::from_ref(&other));
        assert_eq!(new, [&other]);
    }
}

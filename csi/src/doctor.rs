//! The node's leftovers, looked for in the background with lunkit's doctor
//! ([`lunkit::ops::doctor::examine`]: phantom disks, maps without paths, idle sessions, NVMe
//! controllers that are not live) and the plugin's own ([`crate::stale`]: stage records
//! whose volume is gone, published paths whose device is gone), in one examination. Each examination sets the metrics' counts by kind
//! ([`crate::metrics::Metrics::examined`]), and each finding is logged once, when it first
//! shows (again only if it went and came back), so that a node's log is not a finding a
//! minute.
//!
//! Read only: the plugin never cleans up what it finds (that is `lunkit doctor --fix`, an
//! operator's call), and it skips the in-use check (a walk of every process), which only
//! matters for a fix.

use std::collections::BTreeSet;
use std::time::Duration;

use lunkit::ops::doctor::{self, DoctorOptions};

use crate::error::Result;
use crate::log;
use crate::metrics;
use crate::node::NodeService;
use crate::stale::{self, Found};

/// A finding's identity across examinations: its kind and objects.
fn key(f: &Found) -> String {
    format!("{} {}", f.kind, f.objects)
}

/// The findings of `found` not in `seen` (to be logged), and the keys to remember for the
/// next examination: those of `found`, so that one that went and came back is new again.
pub fn news<'a>(seen: &BTreeSet<String>, found: &'a [Found]) -> (Vec<&'a Found>, BTreeSet<String>) {
    let new = found.iter().filter(|f| !seen.contains(&key(f))).collect();
    (new, found.iter().map(key).collect())
}

/// A finding of lunkit's doctor as the plugin counts and logs it.
pub fn of_lunkit(f: &doctor::Finding) -> Found {
    Found {
        kind: f.kind.as_str(),
        objects: f.objects.join(","),
        why: f.why.clone(),
    }
}

/// Examines the node of `node` (its root, and its stage records: [`crate::stale`]) every
/// `every`, on a thread of its own, for as long as the process runs; a state the kernel may
/// still recover from counts once it has lasted `grace`.
///
/// # Errors
///
/// The thread could not be started.
pub fn spawn(
    node: NodeService,
    every: Duration,
    grace: Duration,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("lunkit-csi-doctor".into())
        .spawn(move || {
            let mut seen = BTreeSet::new();
            loop {
                seen = examine_once(&node, grace, &seen);
                std::thread::sleep(every);
            }
        })
}

/// Everything one examination finds: lunkit's doctor's findings, then the plugin's own.
fn examine(node: &NodeService, grace: Duration) -> Result<Vec<Found>> {
    let root = node.root();
    let mut opts = DoctorOptions::new(root);
    opts.check_use = false;
    opts.grace = grace;
    let exam = doctor::examine(root, &opts)
        .map_err(|e| crate::error::Error::lunkit("lunkit's examination", e))?;
    let mut found: Vec<Found> = exam.findings.iter().map(of_lunkit).collect();
    let table = crate::mounts::table()?;
    found.extend(stale::examine(
        root,
        node.store(),
        &table,
        node.settle(),
        &|id| node.in_progress(id),
    )?);
    Ok(found)
}

/// One examination: the metrics set, the new findings logged; the keys to remember.
fn examine_once(node: &NodeService, grace: Duration, seen: &BTreeSet<String>) -> BTreeSet<String> {
    match examine(node, grace) {
        Ok(found) => {
            let kinds: Vec<&'static str> = found.iter().map(|f| f.kind).collect();
            metrics::global().examined(Some(&kinds));
            let (new, keys) = news(seen, &found);
            for f in new {
                log::finding(f.kind, &f.objects, &f.why);
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
    use lunkit::ops::doctor::{Finding, Kind};

    fn finding(kind: Kind, object: &str) -> Found {
        of_lunkit(&Finding {
            kind,
            objects: vec![object.to_owned()],
            why: "because".into(),
            identity: None,
            devices: vec![],
            usage: None,
            since: None,
            queues: None,
        })
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

    #[test]
    fn the_plugins_own_findings_are_new_once_like_lunkits() {
        let stale = Found {
            kind: stale::STALE_STAGE_RECORD,
            objects: "pv-1,/staging/pv-1".into(),
            why: "gone".into(),
        };
        let gone = Found {
            kind: stale::PUBLISHED_PATH_GONE,
            objects: "pv-1,/target/pv-1".into(),
            why: "gone".into(),
        };
        let lunkits = finding(Kind::IdleSession, "session1");
        let all = [lunkits.clone(), stale.clone(), gone.clone()];
        let (new, seen) = news(&BTreeSet::new(), &all);
        assert_eq!(new, [&lunkits, &stale, &gone]);
        let (new, seen) = news(&seen, &all);
        assert!(new.is_empty(), "each logged once: {new:?}");
        let (new, _) = news(&seen, std::slice::from_ref(&lunkits));
        assert!(new.is_empty());
    }
}

//! The NVMe detach: the namespace checked unused and flushed, then the subsystem's
//! controllers that no other namespace needs deleted side by side.

use std::path::Path;
use std::time::Instant;

use crate::block::{self, BlockNode};
use crate::error::{Error, Result};
use crate::id::Nqn;
use crate::nvme::{self as fabrics_nvme};
use crate::root::Root;
use crate::sysfs::nvme::{NvmeController, NvmeNamespace};
use crate::uevent::{Monitor, Uevent};
use crate::wait;

use super::{
    NamespaceDevice, by_id, check_selector, lock_key, namespace_devices, selected,
    subsystem_lock_key, unmark,
};
use crate::ops::lock;
use crate::ops::names;
use crate::ops::options::DetachOptions;
use crate::ops::report::{DetachReport, Outcome, Step, StepKind};
use crate::ops::spec::{Identity, NamespaceSelector, VolumeSpec};
use crate::ops::steps::{StepLog, step_error};

/// The controllers (of `controllers`, subsystem `nqn`'s) that a namespace other than the one
/// `own` names still needs, each with that namespace: those a namespace marked attached in
/// `lock_dir` goes through, or one in use (or that could not be checked completely: doubt
/// keeps them). A marked namespace that is not on the node now (the array took it away for
/// a while, or its id is not known here) needs all of them, since which ones it comes back
/// through is not known. A mark counts whatever the namespace was attached by.
fn needed_by_others(
    root: &Root,
    nqn: &Nqn,
    own: &[NamespaceSelector],
    lock_dir: Option<&Path>,
    controllers: &[NvmeController],
    deadline: Instant,
) -> Result<Vec<(String, String)>> {
    let mut marks: Vec<NamespaceSelector> = match lock_dir {
        Some(dir) => names::marked(dir, nqn)?,
        None => Vec::new(),
    };
    marks.retain(|m| !own.contains(m));
    let mut on_node = vec![false; marks.len()];
    let mut needed = Vec::new();
    for (ns, other) in fabrics_nvme::namespace_devices(root, nqn)? {
        if own.iter().any(|o| o.matches(&ns)) {
            continue;
        }
        let mut is_marked = false;
        for (m, seen) in marks.iter().zip(&mut on_node) {
            if m.matches(&ns) {
                (*seen, is_marked) = (true, true);
            }
        }
        let used = !is_marked && {
            let u = block::usage(
                root,
                std::slice::from_ref(&other.node),
                &fabrics_nvme::usage_scope(),
                deadline,
            )?;
            u.has_users() || !u.unchecked.is_empty()
        };
        if is_marked || used {
            for c in &other.controllers {
                needed.push((c.clone(), other.node.name.clone()));
            }
        }
    }
    for (m, _) in marks.iter().zip(&on_node).filter(|(_, seen)| !**seen) {
        for c in controllers {
            needed.push((c.name.clone(), format!("{m} (not on the node now)")));
        }
    }
    Ok(needed)
}

/// Every selector that names the namespace being detached: the one given, and its id and
/// NGUID as sysfs shows them in `found`. A mark under any of them is its own.
fn own_selectors(
    namespace: &NamespaceSelector,
    found: &[(NvmeNamespace, NamespaceDevice)],
) -> Vec<NamespaceSelector> {
    let mut own = vec![*namespace];
    for (ns, _) in found {
        own.extend(ns.nsid.map(NamespaceSelector::Id));
        own.extend(
            ns.nguid
                .as_deref()
                .and_then(|g| g.parse().ok())
                .map(NamespaceSelector::Nguid),
        );
    }
    own
}

/// [`super::detach_with`] of [`VolumeSpec::Nvme`].
pub(in crate::ops) fn detach(
    root: &Root,
    spec: &VolumeSpec,
    nqn: &Nqn,
    namespace: &NamespaceSelector,
    opts: &DetachOptions,
    on_step: &mut dyn FnMut(&Step),
) -> Result<DetachReport> {
    check_selector(namespace)?;
    let start = Instant::now();
    let deadline = wait::deadline_from(start, opts.timeout);
    let mut s = StepLog::new(on_step);
    let name = spec.to_string();
    // The WWID its device reports, if one is on the node: what the namespace must still be
    // once the locks are held.
    let mut seen = None;
    let identity = s.run(StepKind::Identify, &name, || {
        seen = namespace_devices(root, nqn, namespace)?
            .first()
            .and_then(|d| d.wwid.clone());
        let wwid = seen.clone().or_else(|| {
            opts.lock_dir
                .as_deref()
                .and_then(|dir| names::recall(dir, spec))
        });
        Ok((
            Identity {
                wwid,
                addresses: Vec::new(),
            },
            Outcome::Done,
        ))
    })?;
    let key = match &identity.wwid {
        Some(w) => w.to_multipath(),
        None => lock_key(nqn, namespace),
    };
    let _lock = s.run(StepKind::Lock, &key, || {
        lock::lock(&key, opts.lock_dir.as_deref(), deadline).map(|l| (l, Outcome::Done))
    })?;
    // Everything from here on is decided under the subsystem's lock as well: whether the
    // namespace is in use, and which controllers another namespace needs. Taking it can take
    // long (an attach of another namespace holds it through its connects), and what was
    // looked at before it is stale by then: a mount may have come, another namespace may
    // have been attached. An attach marks its namespace before it lets go, so no attach is
    // half-way while this decides.
    let subsys_key = subsystem_lock_key(nqn);
    let _subsys = s.run(StepKind::Lock, &subsys_key, || {
        lock::lock(&subsys_key, opts.lock_dir.as_deref(), deadline).map(|l| (l, Outcome::Done))
    })?;
    let report = |s: StepLog<'_>| DetachReport {
        identity: identity.clone(),
        steps: s.into_steps(),
        rounds: 1,
        duration: start.elapsed(),
    };

    // Looked at again under the locks: an attach may have finished meanwhile, and the id may
    // name another namespace now (unmapped and another mapped in its place).
    let found = selected(root, nqn, namespace)?;
    if let (Some(was), Some((_, d))) = (&seen, found.first()) {
        if d.wwid.as_ref() != Some(was) {
            return Err(Error::WwidMismatch {
                device: format!(
                    "{} ({spec}, changed while waiting for its locks)",
                    d.node.name
                ),
                expected: Some(was.clone()),
                reference: None,
                actual: d.wwid.clone(),
            });
        }
    }
    let canonical = by_id(nqn, &found);
    let own = own_selectors(namespace, &found);
    let devices: Vec<NamespaceDevice> = found.into_iter().map(|(_, d)| d).collect();
    if devices.is_empty() {
        s.record_since(
            StepKind::Verify,
            "nothing of the volume is on the node",
            Outcome::Done,
            Instant::now(),
        );
        unmark(opts.lock_dir.as_deref(), spec);
        return Ok(DetachReport {
            rounds: 0,
            ..report(s)
        });
    }
    let nodes: Vec<BlockNode> = devices.iter().map(|d| d.node.clone()).collect();
    let target = nodes
        .iter()
        .map(|n| n.name.as_str())
        .collect::<Vec<_>>()
        .join(", ");

    // In use?
    let t0 = Instant::now();
    let usage = fabrics_nvme::in_use(root, &nodes, deadline)?;
    match usage.refusal(&target) {
        Some(refusal) if !opts.force => {
            s.record_since(
                StepKind::CheckInUse,
                &target,
                Outcome::Failed(refusal.to_string()),
                t0,
            );
            return Err(refusal);
        }
        Some(refusal) => s.record_since(
            StepKind::CheckInUse,
            &target,
            Outcome::Skipped(format!("forced: {refusal}")),
            t0,
        ),
        None => s.record_since(StepKind::CheckInUse, &target, Outcome::Done, t0),
    }

    // Flush through a live controller. With none live but one reconnecting, I/O to the
    // namespace queues until a path comes back, and what waits there (a flush, a writer's
    // last close writing back, whose descriptor /proc no longer shows) would fail if the
    // controllers went: the detach waits for a path until its deadline, as for a SCSI map
    // no path can serve, and `force` goes on. With none reconnecting, the kernel has failed
    // what was queued already and there is nothing to flush into.
    let ours: Vec<String> = devices.iter().flat_map(|d| d.controllers.clone()).collect();
    let states = || -> Result<(bool, Vec<String>)> {
        let mut live = false;
        let mut reconnecting = Vec::new();
        for c in fabrics_nvme::controllers_of(root, nqn)? {
            if !ours.contains(&c.name) {
                continue;
            }
            match c.state.as_deref() {
                Some("live") => live = true,
                Some("connecting" | "resetting" | "new") => reconnecting.push(c.name),
                _ => {}
            }
        }
        Ok((live, reconnecting))
    };
    let (mut live, reconnecting) = states()?;
    if !live && !reconnecting.is_empty() && !opts.force {
        let t0 = Instant::now();
        let mut monitor = Monitor::open().ok();
        let what = || {
            format!(
                "a live controller for {target}: none is (the kernel is reconnecting {}), and \
                 I/O to it queues until one is, so data may be waiting in it; waiting for a \
                 path to flush it (force takes it away and fails what waits)",
                reconnecting.join(", ")
            )
        };
        let relevant = |_: &Uevent| true;
        let waited = wait::until(monitor.as_mut(), deadline, &what, &relevant, || {
            let (l, r) = states()?;
            Ok((l || r.is_empty()).then_some(l))
        });
        match waited {
            Ok(l) => live = l,
            Err(e) => {
                s.record_since(
                    StepKind::FlushNamespace,
                    &target,
                    Outcome::Failed(e.to_string()),
                    t0,
                );
                return Err(e);
            }
        }
    }
    for node in &nodes {
        let t0 = Instant::now();
        if !live {
            let why = if reconnecting.is_empty() {
                "no controller is live or reconnecting: the kernel failed what was queued, \
                 there is nowhere to flush to"
                    .to_owned()
            } else {
                "forced: no controller is live; what waits in it is failed".to_owned()
            };
            s.record_since(
                StepKind::FlushNamespace,
                &node.name,
                Outcome::Skipped(why),
                t0,
            );
            continue;
        }
        match block::flush(node, deadline) {
            Ok(()) => s.record_since(StepKind::FlushNamespace, &node.name, Outcome::Done, t0),
            Err(e) if opts.force => s.record_since(
                StepKind::FlushNamespace,
                &node.name,
                Outcome::Skipped(format!("forced: {e}")),
                t0,
            ),
            Err(e) => {
                s.record_since(
                    StepKind::FlushNamespace,
                    &node.name,
                    Outcome::Failed(e.to_string()),
                    t0,
                );
                return Err(step_error(StepKind::FlushNamespace, &node.name, e));
            }
        }
    }

    // Which controllers another namespace still needs.
    let t0 = Instant::now();
    let controllers = fabrics_nvme::controllers_of(root, nqn)?;
    let needed = needed_by_others(
        root,
        nqn,
        &own,
        opts.lock_dir.as_deref(),
        &controllers,
        deadline,
    )?;
    let mut deleted_ours = true;
    let mut delete = Vec::new();
    for c in &controllers {
        let users: Vec<&str> = needed
            .iter()
            .filter(|(n, _)| *n == c.name)
            .map(|(_, ns)| ns.as_str())
            .collect();
        if users.is_empty() {
            delete.push(c);
            continue;
        }
        deleted_ours &= !ours.contains(&c.name);
        s.record_since(
            StepKind::DeleteController,
            &c.name,
            Outcome::Skipped(format!(
                "kept: it also serves {}, attached or in use",
                users.join(", ")
            )),
            t0,
        );
    }
    // Side by side: each write returns once its controller is torn down, which the kernel
    // does for each on its own. Every one decided on is attempted; the first failure is the
    // detach's.
    let deleted: Vec<(&str, Instant, Result<()>)> = std::thread::scope(|scope| {
        let workers: Vec<_> = delete
            .iter()
            .map(|&c| {
                let t1 = Instant::now();
                let w = scope.spawn(move || fabrics_nvme::delete_controller(root, c, deadline));
                (c.name.as_str(), t1, w)
            })
            .collect();
        workers
            .into_iter()
            .map(|(name, t1, w)| {
                let r = w.join().unwrap_or_else(|_| {
                    Err(Error::Internal {
                        what: format!("the worker deleting controller {name} panicked"),
                    })
                });
                (name, t1, r)
            })
            .collect()
    });
    let mut failed = None;
    for (name, t1, r) in deleted {
        match r {
            Ok(()) => s.record_since(StepKind::DeleteController, name, Outcome::Done, t1),
            Err(e) => {
                s.record_since(
                    StepKind::DeleteController,
                    name,
                    Outcome::Failed(e.to_string()),
                    t1,
                );
                failed.get_or_insert(step_error(StepKind::DeleteController, name, e));
            }
        }
    }
    if let Some(e) = failed {
        return Err(e);
    }

    // Verify.
    let t0 = Instant::now();
    if deleted_ours {
        let mut monitor = Monitor::open().ok();
        let what = || format!("{spec} to be taken off the node (left: {target})");
        let relevant = |_: &Uevent| true;
        let gone = wait::until(monitor.as_mut(), deadline, &what, &relevant, || {
            Ok(namespace_devices(root, nqn, namespace)?
                .is_empty()
                .then_some(()))
        });
        if let Err(e) = gone {
            s.record_since(
                StepKind::Verify,
                &target,
                Outcome::Failed(e.to_string()),
                t0,
            );
            return Err(e);
        }
        s.record_since(
            StepKind::Verify,
            "no device of the volume is left",
            Outcome::Done,
            t0,
        );
    } else {
        s.record_since(
            StepKind::Verify,
            &target,
            Outcome::Skipped(
                "stays on the node while its controllers serve the subsystem's other \
                 namespaces (the array must unmap it to take it away)"
                    .to_owned(),
            ),
            t0,
        );
    }
    unmark(opts.lock_dir.as_deref(), spec);
    if let Some(c) = &canonical {
        unmark(opts.lock_dir.as_deref(), c);
    }
    Ok(report(s))
}

//! The NVMe detach: the namespace checked unused and flushed, then the subsystem's
//! controllers that no other namespace needs deleted side by side.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::block::{self, BlockNode};
use crate::error::{Error, Result};
use crate::helper;
use crate::id::{Eui64, Nqn, Uuid, Wwid};
use crate::nvme::sysfs::{CtrlState, NvmeController, NvmeNamespace};
use crate::nvme::{self as fabrics_nvme};
use crate::root::Root;
use crate::uevent::{Subscription, Uevent};
use crate::wait;

use super::{
    NamespaceDevice, by_id, check_selector, lock_key, namespace_devices, selected,
    subsystem_lock_key, unmark,
};
use crate::ops::lock::{self, VolumeLock};
use crate::ops::names;
use crate::ops::options::DetachOptions;
use crate::ops::report::{DetachReport, Outcome, Step, StepKind};
use crate::ops::spec::{Identity, NamespaceSelector, VolumeSpec};
use crate::ops::steps::StepLog;

/// One NVMe detach in progress: what it works on and where its steps go. Its phases are
/// methods, in the order [`detach`] runs them, as for a SCSI detach's rounds.
struct Run<'a> {
    root: &'a Root,
    spec: &'a VolumeSpec,
    nqn: &'a Nqn,
    namespace: &'a NamespaceSelector,
    opts: &'a DetachOptions,
    deadline: Instant,
    log: StepLog<'a>,
}

/// The namespace as it is under the locks.
struct Found {
    /// The namespace named by its id, when sysfs shows one: marks are kept under it too.
    canonical: Option<VolumeSpec>,
    /// Every selector that names it ([`own_selectors`]).
    own: Vec<NamespaceSelector>,
    /// Its block devices.
    devices: Vec<NamespaceDevice>,
}

/// [`crate::ops::detach_with`] of [`VolumeSpec::Nvme`].
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
    let mut run = Run {
        root,
        spec,
        nqn,
        namespace,
        opts,
        deadline: wait::deadline_from(start, opts.timeout),
        log: StepLog::new(on_step),
    };
    // Held until the end: the controllers are deleted or kept under both.
    let (identity, seen, _locks) = run.identify_and_lock()?;
    let found = run.look_again(seen.as_ref())?;
    let rounds = if found.devices.is_empty() {
        run.log.record(
            StepKind::Verify,
            "nothing of the volume is on the node",
            Outcome::Done,
            Duration::ZERO,
        );
        0
    } else {
        run.take_down(&found)?;
        1
    };
    unmark(opts.lock_dir.as_deref(), spec, identity.wwid.as_ref());
    if let Some(c) = &found.canonical {
        unmark(opts.lock_dir.as_deref(), c, identity.wwid.as_ref());
    }
    Ok(DetachReport {
        identity,
        steps: run.log.into_steps(),
        rounds,
        duration: start.elapsed(),
    })
}

impl Run<'_> {
    /// The `identify` and `lock` steps: the namespace's identity (the WWID its device reports,
    /// or the one remembered for its name), the volume's lock under it, then the subsystem's.
    /// Also returns the WWID seen on the node, which the namespace must still have once the
    /// locks are held.
    fn identify_and_lock(&mut self) -> Result<(Identity, Option<Wwid>, [VolumeLock; 2])> {
        let (root, spec, nqn, namespace) = (self.root, self.spec, self.nqn, self.namespace);
        let (lock_dir, deadline) = (self.opts.lock_dir.as_deref(), self.deadline);
        let mut seen = None;
        let identity = self.log.run(StepKind::Identify, &spec.to_string(), || {
            seen = namespace_devices(root, nqn, namespace)?
                .first()
                .and_then(|d| d.wwid.clone());
            let wwid = seen
                .clone()
                .or_else(|| lock_dir.and_then(|dir| names::recall(dir, spec)));
            let id = Identity {
                wwid,
                addresses: Vec::new(),
            };
            Ok((id, Outcome::Done))
        })?;
        let key = match &identity.wwid {
            Some(w) => w.to_multipath(),
            None => lock_key(nqn, namespace),
        };
        let volume = self.log.run(StepKind::Lock, &key, || {
            lock::lock(&key, lock_dir, deadline).map(|l| (l, Outcome::Done))
        })?;
        // Everything from here on is decided under the subsystem's lock as well: whether the
        // namespace is in use, and which controllers another namespace needs. Taking it can
        // take long (an attach of another namespace holds it through its connects), and what
        // was looked at before it is stale by then: a mount may have come, another namespace
        // may have been attached. An attach marks its namespace before it lets go, so no
        // attach is half-way while this decides.
        let subsys_key = subsystem_lock_key(nqn);
        let subsystem = self.log.run(StepKind::Lock, &subsys_key, || {
            lock::lock(&subsys_key, lock_dir, deadline).map(|l| (l, Outcome::Done))
        })?;
        Ok((identity, seen, [volume, subsystem]))
    }

    /// The namespace looked at again under the locks: an attach may have finished meanwhile,
    /// and the id may name another namespace now (unmapped and another mapped in its place),
    /// which is [`Error::WwidMismatch`] against `seen`.
    fn look_again(&self, seen: Option<&Wwid>) -> Result<Found> {
        let found = selected(self.root, self.nqn, self.namespace)?;
        if let (Some(was), Some((_, d))) = (seen, found.first()) {
            if d.wwid.as_ref() != Some(was) {
                return Err(Error::WwidMismatch {
                    device: format!(
                        "{} ({}, changed while waiting for its locks)",
                        d.node.name, self.spec
                    ),
                    expected: Some(was.clone()),
                    reference: None,
                    actual: d.wwid.clone(),
                    new_paths: Vec::new(),
                });
            }
        }
        Ok(Found {
            canonical: by_id(self.nqn, &found),
            own: own_selectors(self.namespace, &found),
            devices: found.into_iter().map(|(_, d)| d).collect(),
        })
    }

    /// Every step after the locks, for a namespace that is on the node.
    fn take_down(&mut self, found: &Found) -> Result<()> {
        let nodes: Vec<BlockNode> = found.devices.iter().map(|d| d.node.clone()).collect();
        let target = nodes
            .iter()
            .map(|n| n.name.as_str())
            .collect::<Vec<_>>()
            .join(", ");
        // Claimed from the check to the last delete: a mount or an LVM activation in
        // between fails with EBUSY instead of losing its device.
        let claims = self.check_in_use(&nodes, &target)?;
        let ours: Vec<String> = found
            .devices
            .iter()
            .flat_map(|d| d.controllers.clone())
            .collect();
        let (live, reconnecting) = self.wait_for_live(&ours, &target)?;
        self.flush(&nodes, live, &reconnecting)?;
        let (delete, deleted_ours, siblings) = self.controllers_to_delete(&found.own, &ours)?;
        self.delete_controllers(&delete)?;
        // Let go before the wait for the devices to leave: an open head stays until closed.
        drop((claims, siblings));
        self.verify(deleted_ours, &target)
    }

    /// The `check-in-use` step: refused when something uses the namespace, unless forced;
    /// else its devices claimed (`O_EXCL`) before the step is done, held by the caller until
    /// the controllers are deleted. A claim refused with `EBUSY` means a user came after the
    /// check: the check runs again, and names it.
    fn check_in_use(&mut self, nodes: &[BlockNode], target: &str) -> Result<Vec<block::Claim>> {
        loop {
            let t0 = Instant::now();
            let usage = fabrics_nvme::in_use(self.root, nodes, self.deadline)?;
            let refused = usage.refusal(target);
            if let Some(refusal) = refused {
                if !self.opts.force {
                    let failed = Outcome::Failed(refusal.to_string());
                    self.log
                        .record_since(StepKind::CheckInUse, target, failed, t0);
                    return Err(refusal);
                }
                let forced = Outcome::Skipped(format!("forced: {refusal}"));
                self.log
                    .record_since(StepKind::CheckInUse, target, forced, t0);
                return Ok(Vec::new());
            }
            match claim_all(nodes, self.deadline) {
                Ok(claims) => {
                    self.log
                        .record_since(StepKind::CheckInUse, target, Outcome::Done, t0);
                    return Ok(claims);
                }
                Err(e) if e.errno() == Some(libc::EBUSY) && Instant::now() < self.deadline => {}
                Err(e) => {
                    let failed = Outcome::Failed(e.to_string());
                    self.log
                        .record_since(StepKind::CheckInUse, target, failed, t0);
                    return Err(e);
                }
            }
        }
    }

    /// Whether a controller of `ours` is live, and which are reconnecting.
    fn controller_states(&self, ours: &[String]) -> Result<(bool, Vec<String>)> {
        let mut live = false;
        let mut reconnecting = Vec::new();
        for c in fabrics_nvme::controllers_of(self.root, self.nqn)? {
            if !ours.contains(&c.name) {
                continue;
            }
            match c.parsed_state {
                Some(CtrlState::Live) => live = true,
                Some(s) if s.is_reconnecting() => reconnecting.push(c.name),
                _ => {}
            }
        }
        Ok((live, reconnecting))
    }

    /// Whether there is a live controller to flush through, waiting for one while none is
    /// live but one reconnects. I/O to the namespace then queues until a path comes back, and
    /// what waits there (a flush, a writer's last close writing back, whose descriptor /proc
    /// no longer shows) would fail if the controllers went: the detach waits for a path until
    /// its deadline, as for a SCSI map no path can serve, and `force` goes on. With none
    /// reconnecting, the kernel has failed what was queued already and there is nothing to
    /// flush into. Also returns the controllers that were reconnecting.
    fn wait_for_live(&mut self, ours: &[String], target: &str) -> Result<(bool, Vec<String>)> {
        let (live, reconnecting) = self.controller_states(ours)?;
        if live || reconnecting.is_empty() || self.opts.force {
            return Ok((live, reconnecting));
        }
        let t0 = Instant::now();
        let mut monitor = Subscription::open().ok();
        let what = || {
            format!(
                "a live controller for {target}: none is (the kernel is reconnecting {}), and \
                 I/O to it queues until one is, so data may be waiting in it; waiting for a \
                 path to flush it (force takes it away and fails what waits)",
                reconnecting.join(", ")
            )
        };
        let relevant = |_: &Uevent| true;
        let waited = wait::until(monitor.as_mut(), self.deadline, &what, &relevant, || {
            let (l, r) = self.controller_states(ours)?;
            Ok((l || r.is_empty()).then_some(l))
        });
        match waited {
            Ok(live) => Ok((live, reconnecting)),
            Err(e) => {
                let failed = Outcome::Failed(e.to_string());
                self.log
                    .record_since(StepKind::FlushNamespace, target, failed, t0);
                Err(e)
            }
        }
    }

    /// The `flush-namespace` steps: every device flushed through a live controller, or passed
    /// over with none live (the kernel failed what was queued, or `force` fails it).
    fn flush(&mut self, nodes: &[BlockNode], live: bool, reconnecting: &[String]) -> Result<()> {
        for node in nodes {
            if !live {
                let why = if reconnecting.is_empty() {
                    "no controller is live or reconnecting: the kernel failed what was queued, \
                     there is nowhere to flush to"
                } else {
                    "forced: no controller is live; what waits in it is failed"
                };
                let skipped = Outcome::Skipped(why.to_owned());
                self.log.record(
                    StepKind::FlushNamespace,
                    &node.name,
                    skipped,
                    Duration::ZERO,
                );
                continue;
            }
            let deadline = self.deadline;
            self.log
                .run(
                    StepKind::FlushNamespace,
                    &node.name,
                    || match block::flush(node, deadline) {
                        Ok(()) => Ok(((), Outcome::Done)),
                        Err(e) if self.opts.force => {
                            Ok(((), Outcome::Skipped(format!("forced: {e}"))))
                        }
                        Err(e) => Err(e),
                    },
                )?;
        }
        Ok(())
    }

    /// Which controllers of the subsystem to delete: those no other namespace needs
    /// ([`needed_by_others`]); each kept one is recorded as a skipped `delete-controller`.
    /// Also says whether every one of `ours` (the namespace's own) goes.
    fn controllers_to_delete(
        &mut self,
        own: &[NamespaceSelector],
        ours: &[String],
    ) -> Result<(Vec<NvmeController>, bool, Vec<block::Claim>)> {
        let t0 = Instant::now();
        let controllers = fabrics_nvme::controllers_of(self.root, self.nqn)?;
        let lock_dir = self.opts.lock_dir.as_deref();
        let needed = needed_by_others(
            self.root,
            self.nqn,
            own,
            lock_dir,
            &controllers,
            self.deadline,
        )?;
        let (claims, came) = claim_siblings(self.root, self.nqn, own, &needed, self.deadline)?;
        let needed: Vec<(String, String)> = needed.into_iter().chain(came).collect();
        let mut deleted_ours = true;
        let mut delete = Vec::new();
        for c in controllers {
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
            let kept = format!(
                "kept: it also serves {}, attached or in use",
                users.join(", ")
            );
            self.log.record_since(
                StepKind::DeleteController,
                &c.name,
                Outcome::Skipped(kept),
                t0,
            );
        }
        Ok((delete, deleted_ours, claims))
    }

    /// The `delete-controller` steps, side by side: each write returns once its controller
    /// is torn down, which the kernel does for each on its own. Every one decided on is
    /// attempted; the first failure is the detach's.
    fn delete_controllers(&mut self, delete: &[NvmeController]) -> Result<()> {
        let t0 = Instant::now();
        let (root, deadline) = (self.root, self.deadline);
        let deleted = helper::fan_out("lunkit-nvme-delete", delete, |c| {
            fabrics_nvme::delete_controller(root, c, deadline)
        });
        let mut failed = None;
        for (c, r) in delete.iter().zip(deleted) {
            match r {
                Ok(()) => {
                    self.log
                        .record_since(StepKind::DeleteController, &c.name, Outcome::Done, t0)
                }
                Err(e) => {
                    let e = self.log.fail(StepKind::DeleteController, &c.name, e, t0);
                    failed.get_or_insert(e);
                }
            }
        }
        failed.map_or(Ok(()), Err)
    }

    /// The `verify` step: with the namespace's own controllers deleted, wait until none of its
    /// devices is left; with one kept, say that it stays.
    fn verify(&mut self, deleted_ours: bool, target: &str) -> Result<()> {
        let t0 = Instant::now();
        if !deleted_ours {
            let stays = Outcome::Skipped(
                "stays on the node while its controllers serve the subsystem's other \
                 namespaces (the array must unmap it to take it away)"
                    .to_owned(),
            );
            self.log.record_since(StepKind::Verify, target, stays, t0);
            return Ok(());
        }
        let (root, nqn, namespace) = (self.root, self.nqn, self.namespace);
        let mut monitor = Subscription::open().ok();
        let what = || format!("{} to be taken off the node (left: {target})", self.spec);
        let relevant = |_: &Uevent| true;
        let gone = wait::until(monitor.as_mut(), self.deadline, &what, &relevant, || {
            Ok(namespace_devices(root, nqn, namespace)?
                .is_empty()
                .then_some(()))
        });
        if let Err(e) = gone {
            let failed = Outcome::Failed(e.to_string());
            self.log.record_since(StepKind::Verify, target, failed, t0);
            return Err(e);
        }
        let left = "no device of the volume is left";
        self.log
            .record_since(StepKind::Verify, left, Outcome::Done, t0);
        Ok(())
    }
}

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

/// A controller another namespace needs, with that namespace (for the step's message).
type Needed = (String, String);

/// Claims every device of `nodes` (`O_EXCL`); the first refusal is the error. A device that
/// does not open (gone, or its open not returning) cannot be mounted either, and goes
/// without a claim.
fn claim_all(nodes: &[BlockNode], deadline: Instant) -> Result<Vec<block::Claim>> {
    let mut claims = Vec::new();
    for n in nodes {
        claims.extend(block::try_claim(n, deadline)?);
    }
    Ok(claims)
}

/// Claims the subsystem's other namespaces that nobody needs (`needed` names none of their
/// controllers), which go with the controllers about to be deleted: nothing may start using
/// them between that decision and the delete. One whose claim is refused (`EBUSY`: a user
/// came since the check) needs its controllers after all: returned as more `needed` pairs.
fn claim_siblings(
    root: &Root,
    nqn: &Nqn,
    own: &[NamespaceSelector],
    needed: &[(String, String)],
    deadline: Instant,
) -> Result<(Vec<block::Claim>, Vec<Needed>)> {
    let (mut claims, mut came) = (Vec::new(), Vec::new());
    for (ns, other) in fabrics_nvme::namespace_devices(root, nqn)? {
        let kept = |c: &String| needed.iter().any(|(n, _)| n == c);
        if own.iter().any(|o| o.matches(&ns)) || other.controllers.iter().any(kept) {
            continue;
        }
        match block::try_claim(&other.node, deadline) {
            Ok(c) => claims.extend(c),
            Err(e) if e.errno() == Some(libc::EBUSY) => {
                let why = format!("{} (in use since the check)", other.node.name);
                came.extend(other.controllers.iter().map(|c| (c.clone(), why.clone())));
            }
            Err(e) => return Err(e),
        }
    }
    Ok((claims, came))
}

/// Every selector that names the namespace being detached: the one given, and its id, NGUID,
/// EUI-64 and UUID as sysfs shows them in `found`. A mark under any of them is its own.
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
        own.extend(
            ns.eui
                .as_deref()
                .and_then(|e| e.parse::<Eui64>().ok())
                .filter(|e| e.bytes() != [0; 8])
                .map(NamespaceSelector::Eui64),
        );
        own.extend(
            ns.uuid
                .as_deref()
                .and_then(|u| u.parse::<Uuid>().ok())
                .filter(|u| u.bytes() != [0; 16])
                .map(NamespaceSelector::Uuid),
        );
    }
    own
}

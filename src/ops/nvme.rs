//! An NVMe over Fabrics namespace as a volume: attach and detach of
//! [`VolumeSpec::Nvme`], reached through [`super::attach()`] and
//! [`super::detach()`] with the same options, locks, reports and exit codes as a SCSI LUN.
//!
//! **Attach** connects every portal given ([`AttachOptions::portals`], `addr:port`) that is
//! not connected yet, all at once, then waits (uevents, with sysfs re-checks) until the
//! namespace's block device is there with a path through every live controller of the
//! subsystem. With native multipath (`CONFIG_NVME_MULTIPATH`, on in distribution kernels) that
//! device is the head `nvme<S>n<N>`; without it, each controller has its own. Its identity is
//! the kernel's `wwid` (NGUID, EUI-64 or UUID), checked against
//! [`ScanOptions::expect_wwid`](crate::ScanOptions::expect_wwid).
//!
//! The namespace is named by id or by NGUID ([`NamespaceSelector`]). Whichever it was, an
//! attach is remembered (the WWID hint, the "attached" mark) under its id as well, since the
//! id is what a detach of another namespace of the subsystem looks for.
//!
//! **Detach** checks that nothing uses the namespace ([`crate::block::usage`]: mounts in any
//! mount namespace, kubelet's loop devices and bind mounts, holders, open descriptors),
//! flushes it, and then deletes the subsystem's controllers (`delete_controller`) that no
//! other namespace still needs, side by side. A controller serves every namespace of its
//! subsystem at once and the host cannot drop one namespace from it, so while another
//! namespace of the subsystem is attached through lunkit (marked in the lock directory) or in use, the
//! controllers it goes through stay, and so does this namespace's device until the array
//! unmaps it: the report says so. A marked namespace that is not on the node at that moment
//! keeps every controller of the subsystem.
//!
//! With no controller live but one reconnecting (the target unreachable), I/O to the
//! namespace queues until a path comes back, and a writer's last close may be waiting there
//! where `/proc` no longer shows it: the detach waits for a path until its deadline, as for a
//! SCSI map no path can serve, and `force` takes the namespace away, failing what waits.
//! Attach and detach of one subsystem decide which controllers are needed under one lock
//! ([`subsystem_lock_key`]). A detach takes it before it looks at anything it decides on (is
//! the namespace still the one identified, is it in use, which namespaces are marked), and
//! holds it until the controllers are deleted or kept: a wait for the lock never leaves it
//! acting on what it saw before. A controller is deleted only while it is still the one that
//! was listed (same subsystem and controller id): its name may have been reused.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Instant;

use super::attach::{AttachOptions, Attachment};
use super::detach::{DetachOptions, DetachReport, Outcome, Step, StepKind};
use super::resize::{NamespaceSize, NvmeResize, ResizeOptions, Resized};
use super::volume::{Identity, NamespaceSelector, VolumeSpec};
use super::{lock, names};
use crate::block::{self, BlockNode};
use crate::error::{Error, ResizeFailure, Result};
use crate::id::Nqn;
pub use crate::nvme::NamespaceDevice;
use crate::nvme::{self as fabrics_nvme, ConnectOptions, Connected, Host};
use crate::root::Root;
use crate::sysfs::nvme::{NvmeController, NvmeNamespace};
use crate::uevent::{Action, Monitor, Uevent};
use crate::wait;

/// The block devices of the selected namespace of subsystem `nqn` on the node: its
/// native-multipath head, or each controller's own device without native multipath. Empty
/// when it is not there.
pub fn namespace_devices(
    root: &Root,
    nqn: &Nqn,
    namespace: &NamespaceSelector,
) -> Result<Vec<NamespaceDevice>> {
    Ok(selected(root, nqn, namespace)?
        .into_iter()
        .map(|(_, d)| d)
        .collect())
}

/// [`namespace_devices`] with what sysfs says of each namespace (its id, for one).
fn selected(
    root: &Root,
    nqn: &Nqn,
    namespace: &NamespaceSelector,
) -> Result<Vec<(NvmeNamespace, NamespaceDevice)>> {
    Ok(fabrics_nvme::namespace_devices(root, nqn)?
        .into_iter()
        .filter(|(ns, _)| namespace.matches(ns))
        .collect())
}

/// The spec naming the namespace by its id, once the node has it: the name its hints and
/// marks are kept under, whether the caller named it by id or by NGUID, so that a detach of
/// another namespace of the subsystem sees it either way.
fn by_id(nqn: &Nqn, found: &[(NvmeNamespace, NamespaceDevice)]) -> Option<VolumeSpec> {
    let nsid = found.iter().find_map(|(ns, _)| ns.nsid)?;
    Some(VolumeSpec::Nvme {
        nqn: nqn.clone(),
        namespace: NamespaceSelector::Id(nsid),
    })
}

/// What an NVMe attach did, in [`Attachment::nvme`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvmeAttachment {
    /// The namespace's block devices (one head under native multipath).
    pub devices: Vec<BlockNode>,
    /// The controllers through which the namespace came.
    pub controllers: Vec<String>,
    /// Every portal asked for, with how its connect went.
    pub portals: Vec<PortalConnect>,
}

/// One portal's connect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortalConnect {
    /// `addr:port`.
    pub portal: String,
    /// The controller made or found, or why there is none.
    pub result: std::result::Result<Connected, String>,
}

impl std::fmt::Display for PortalConnect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.result {
            Ok(c) if c.existing => {
                write!(f, "{}: {} (already connected)", self.portal, c.controller)
            }
            Ok(c) => write!(f, "{}: {} (connected)", self.portal, c.controller),
            Err(e) => write!(f, "{}: failed: {e}", self.portal),
        }
    }
}

/// Parses a portal, `addr:port` or `[v6addr]:port`.
fn portal(s: &str) -> Result<SocketAddr> {
    s.parse().map_err(|_| {
        Error::invalid(
            "NVMe portal",
            s,
            "expected ADDR:PORT with an IP address (IPv6 in brackets)",
        )
    })
}

/// [`super::attach()`] of [`VolumeSpec::Nvme`].
pub(super) fn attach(
    root: &Root,
    spec: &VolumeSpec,
    nqn: &Nqn,
    namespace: &NamespaceSelector,
    opts: &AttachOptions,
) -> Result<Attachment> {
    check_selector(namespace)?;
    let start = Instant::now();
    let deadline = wait::deadline_from(start, opts.scan.timeout);
    // Held until this namespace is marked attached: a detach of another namespace of the
    // subsystem decides which controllers are needed under the same lock.
    let _subsys = lock::lock(&subsystem_lock_key(nqn), opts.lock_dir.as_deref(), deadline)?;
    let portals: Vec<SocketAddr> = opts
        .portals
        .iter()
        .map(|p| portal(p))
        .collect::<Result<_>>()?;
    let host = match &opts.nvme_host {
        Some(h) => Some(h.clone()),
        None if portals.is_empty() => None,
        None => Some(Host::from_node(root)?),
    };
    // Subscribed before any connect, so the namespace's `add` cannot slip past.
    let mut monitor = Monitor::open().ok();
    let connects: Vec<PortalConnect> = std::thread::scope(|s| {
        let workers: Vec<_> = portals
            .iter()
            .map(|&p| {
                let mut o = ConnectOptions::new(p.ip(), p.port(), nqn.clone());
                o.host = host.clone();
                o.timeout = deadline.saturating_duration_since(Instant::now());
                (p, s.spawn(move || fabrics_nvme::connect(root, &o)))
            })
            .collect();
        workers
            .into_iter()
            .map(|(p, w)| PortalConnect {
                portal: p.to_string(),
                result: match w.join() {
                    Ok(r) => r.map_err(|e| e.to_string()),
                    Err(_) => Err("the connect worker panicked".to_owned()),
                },
            })
            .collect()
    });
    let what = || {
        let said: Vec<String> = connects.iter().map(ToString::to_string).collect();
        format!(
            "{spec} on every live controller of the subsystem{}",
            if said.is_empty() {
                String::new()
            } else {
                format!(" (portals: {})", said.join("; "))
            }
        )
    };
    let relevant = |ev: &Uevent| {
        matches!(
            ev.subsystem.as_deref(),
            Some("block" | "nvme" | "nvme-subsystem")
        )
    };
    let min = opts.scan.min_paths.max(1);
    // Every live controller's path, then at the deadline whatever came if it is enough.
    let found = wait::until(monitor.as_mut(), deadline, &what, &relevant, || {
        let devices = selected(root, nqn, namespace)?;
        let live: Vec<String> = fabrics_nvme::controllers_of(root, nqn)?
            .into_iter()
            .filter(|c| c.state.as_deref() == Some("live"))
            .map(|c| c.name)
            .collect();
        let reached: Vec<&String> = devices.iter().flat_map(|(_, d)| &d.controllers).collect();
        let complete = !live.is_empty() && live.iter().all(|c| reached.contains(&c));
        Ok((complete && reached.len() >= min).then_some(devices))
    });
    let devices = match found {
        Ok(d) => d,
        Err(Error::Timeout { what, waited }) => {
            let devices = selected(root, nqn, namespace)?;
            let reached = devices
                .iter()
                .map(|(_, d)| d.controllers.len())
                .sum::<usize>();
            if devices.is_empty() || reached < min {
                let e = if devices.is_empty() && connects.iter().all(|c| c.result.is_err()) {
                    Error::NotFound { what: what.clone() }
                } else {
                    Error::Timeout { what, waited }
                };
                return Err(e);
            }
            devices
        }
        Err(e) => return Err(e),
    };
    let canonical = by_id(nqn, &devices);
    let devices: Vec<NamespaceDevice> = devices.into_iter().map(|(_, d)| d).collect();
    let wwid = devices.first().and_then(|d| d.wwid.clone());
    if let Some(expected) = &opts.scan.expect_wwid {
        if let Some(d) = devices.iter().find(|d| d.wwid.as_ref() != Some(expected)) {
            return Err(Error::WwidMismatch {
                device: format!("{} ({spec})", d.node.name),
                expected: Some(expected.clone()),
                reference: None,
                actual: d.wwid.clone(),
            });
        }
    }
    if let Some(dir) = &opts.lock_dir {
        // Hints for a later detach; failing to write them does not undo the attach.
        let canonical = canonical.as_ref().unwrap_or(spec);
        if let Some(w) = &wwid {
            let _ = names::remember(dir, spec, w);
            if canonical != spec {
                let _ = names::remember(dir, canonical, w);
            }
        }
        let _ = names::mark_attached(dir, canonical);
    }
    let mut controllers: Vec<String> = devices.iter().flat_map(|d| d.controllers.clone()).collect();
    controllers.sort();
    controllers.dedup();
    Ok(Attachment {
        wwid,
        paths: Vec::new(),
        map: None,
        nvme: Some(NvmeAttachment {
            devices: devices.into_iter().map(|d| d.node).collect(),
            controllers,
            portals: connects,
        }),
        scan_elapsed: start.elapsed(),
        elapsed: start.elapsed(),
    })
}

/// Records steps of an NVMe detach, as [`super::detach_with`] does for SCSI.
struct Steps<'a> {
    steps: Vec<Step>,
    on_step: &'a mut dyn FnMut(&Step),
}

impl Steps<'_> {
    fn record(&mut self, kind: StepKind, target: &str, outcome: Outcome, since: Instant) {
        let step = Step {
            kind,
            target: target.to_owned(),
            outcome,
            duration: since.elapsed(),
        };
        (self.on_step)(&step);
        self.steps.push(step);
    }

    /// Runs `f` as step `kind`: recorded done, or failed with the error returned.
    fn run<T>(&mut self, kind: StepKind, target: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let t0 = Instant::now();
        match f() {
            Ok(v) => {
                self.record(kind, target, Outcome::Done, t0);
                Ok(v)
            }
            Err(e) => {
                self.record(kind, target, Outcome::Failed(e.to_string()), t0);
                Err(e)
            }
        }
    }
}

/// [`super::detach_with`] of [`VolumeSpec::Nvme`].
pub(super) fn detach(
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
    let mut s = Steps {
        steps: Vec::new(),
        on_step,
    };
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
        Ok(Identity {
            wwid,
            addresses: Vec::new(),
        })
    })?;
    let key = match &identity.wwid {
        Some(w) => w.to_multipath(),
        None => lock_key(nqn, namespace),
    };
    let _lock = s.run(StepKind::Lock, &key, || {
        lock::lock(&key, opts.lock_dir.as_deref(), deadline)
    })?;
    // Everything from here on is decided under the subsystem's lock as well: whether the
    // namespace is in use, and which controllers another namespace needs. Taking it can take
    // long (an attach of another namespace holds it through its connects), and what was
    // looked at before it is stale by then: a mount may have come, another namespace may
    // have been attached. An attach marks its namespace before it lets go, so no attach is
    // half-way while this decides.
    let subsys_key = subsystem_lock_key(nqn);
    let _subsys = s.run(StepKind::Lock, &subsys_key, || {
        lock::lock(&subsys_key, opts.lock_dir.as_deref(), deadline)
    })?;
    let report = |s: Steps<'_>| DetachReport {
        identity: identity.clone(),
        steps: s.steps,
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
        s.record(
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
            s.record(
                StepKind::CheckInUse,
                &target,
                Outcome::Failed(refusal.to_string()),
                t0,
            );
            return Err(refusal);
        }
        Some(refusal) => s.record(
            StepKind::CheckInUse,
            &target,
            Outcome::Skipped(format!("forced: {refusal}")),
            t0,
        ),
        None => s.record(StepKind::CheckInUse, &target, Outcome::Done, t0),
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
                s.record(
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
            s.record(
                StepKind::FlushNamespace,
                &node.name,
                Outcome::Skipped(why),
                t0,
            );
            continue;
        }
        match block::flush(node, deadline) {
            Ok(()) => s.record(StepKind::FlushNamespace, &node.name, Outcome::Done, t0),
            Err(e) if opts.force => s.record(
                StepKind::FlushNamespace,
                &node.name,
                Outcome::Skipped(format!("forced: {e}")),
                t0,
            ),
            Err(e) => {
                s.record(
                    StepKind::FlushNamespace,
                    &node.name,
                    Outcome::Failed(e.to_string()),
                    t0,
                );
                return Err(super::detach::step_error(
                    StepKind::FlushNamespace,
                    &node.name,
                    e,
                ));
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
        s.record(
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
            Ok(()) => s.record(StepKind::DeleteController, name, Outcome::Done, t1),
            Err(e) => {
                s.record(
                    StepKind::DeleteController,
                    name,
                    Outcome::Failed(e.to_string()),
                    t1,
                );
                failed.get_or_insert(super::detach::step_error(
                    StepKind::DeleteController,
                    name,
                    e,
                ));
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
            s.record(
                StepKind::Verify,
                &target,
                Outcome::Failed(e.to_string()),
                t0,
            );
            return Err(e);
        }
        s.record(
            StepKind::Verify,
            "no device of the volume is left",
            Outcome::Done,
            t0,
        );
    } else {
        s.record(
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

/// The lock of a namespace whose WWID is not known (nothing of it on the node).
fn lock_key(nqn: &Nqn, namespace: &NamespaceSelector) -> String {
    match namespace {
        NamespaceSelector::Id(nsid) => format!("nvme-{nqn}-ns-{nsid}"),
        NamespaceSelector::Nguid(g) => format!("nvme-{nqn}-nguid-{g}"),
    }
}

/// The lock key under which attach and detach of any namespace of subsystem `nqn` decide
/// which of its controllers are needed: an attach holds it from its connects until its
/// namespace is marked attached, a detach from before its in-use check until its controllers
/// are deleted or kept. [`lock::file_path`] names its file in a lock directory; whoever holds
/// an exclusive `flock(2)` on that file holds both off.
pub fn subsystem_lock_key(nqn: &Nqn) -> String {
    format!("nvme-subsys-{nqn}")
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

/// Namespace ids are 1 to 0xFFFFFFFE: 0 is none and 0xFFFFFFFF means every namespace.
fn check_selector(namespace: &NamespaceSelector) -> Result<()> {
    let NamespaceSelector::Id(nsid) = *namespace else {
        return Ok(());
    };
    if nsid == 0 || nsid == u32::MAX {
        return Err(Error::invalid(
            "namespace id",
            &nsid.to_string(),
            "must be 1 to 4294967294",
        ));
    }
    Ok(())
}

fn unmark(dir: Option<&Path>, spec: &VolumeSpec) {
    // A stale mark keeps another namespace's detach from deleting controllers, never loses
    // data; failing to remove it does not fail the detach.
    if let Some(dir) = dir {
        let _ = names::unmark_attached(dir, spec);
    }
}

/// [`super::resize()`] of [`VolumeSpec::Nvme`]: the namespace's devices brought to the size
/// its controllers report.
///
/// 1. Identified and locked as a detach of it would be (same key), so the two never
///    interleave.
/// 2. Every controller of the subsystem must be `live`: one that is reconnecting cannot be
///    asked, and would bring its own view of the size when it comes back
///    ([`ResizeFailure::PathDown`]).
/// 3. Each controller is asked what the namespace is (Identify Namespace), all at once. With
///    [`ResizeOptions::expect_size`] they are asked again every
///    [`super::resize::RESCAN_INTERVAL`] (or when the namespace changes) until each reports
///    at least that much. They must agree
///    ([`ResizeFailure::SizesDiffer`]), and the namespace must not have shrunk below its
///    device ([`ResizeFailure::Shrunk`]).
/// 4. Devices that already have that size are left alone: nothing is written. Otherwise
///    every controller is told to rescan (`rescan_controller`) and the wait (uevents: the
///    kernel's `change` of the device, with sysfs re-checks) lasts until every device has
///    it.
pub(super) fn resize(
    root: &Root,
    spec: &VolumeSpec,
    nqn: &Nqn,
    namespace: &NamespaceSelector,
    opts: &ResizeOptions,
) -> Result<Resized> {
    check_selector(namespace)?;
    let start = Instant::now();
    let deadline = wait::deadline_from(start, opts.timeout);
    let absent = || Error::NotFound {
        what: format!("{spec} on the node"),
    };
    let first = selected(root, nqn, namespace)?;
    let key = match first.iter().find_map(|(_, d)| d.wwid.as_ref()) {
        Some(w) => w.to_multipath(),
        None => lock_key(nqn, namespace),
    };
    let _lock = lock::lock(&key, opts.lock_dir.as_deref(), deadline)?;
    // Looked at again under the lock.
    let found = selected(root, nqn, namespace)?;
    let wwid = found.iter().find_map(|(_, d)| d.wwid.clone());
    let nsid = found
        .iter()
        .find_map(|(ns, _)| ns.nsid)
        .ok_or_else(absent)?;
    let volume = found
        .iter()
        .map(|(_, d)| d.node.name.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    let refuse = |reason| Error::Resize {
        volume: volume.clone(),
        reason,
    };
    let controllers = fabrics_nvme::controllers_of(root, nqn)?;
    if let Some(c) = controllers
        .iter()
        .find(|c| c.state.as_deref() != Some("live"))
    {
        return Err(refuse(ResizeFailure::PathDown {
            path: format!("controller {}", c.name),
            state: c
                .state
                .clone()
                .unwrap_or_else(|| "in an unknown state".to_owned()),
        }));
    }
    let mut devices = found
        .iter()
        .map(|(_, d)| {
            let before = super::resize::size_of(root, &d.node.name)?;
            Ok(NamespaceSize {
                device: d.node.name.clone(),
                before,
                after: before,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let names: Vec<&str> = controllers.iter().map(|c| c.name.as_str()).collect();

    // What the controllers say the namespace is, until each says enough.
    let rescan_start = Instant::now();
    let mut monitor = Monitor::open().ok();
    let mut reported = identify_all(root, &names, nsid, deadline)?;
    if let Some(expect) = opts.expect_size {
        let mut asked = Instant::now();
        let what = || {
            format!(
                "every controller of {spec} to report at least {expect} bytes (they report {}); \
                 has the namespace grown on the array?",
                sizes(&reported)
            )
        };
        let relevant = |ev: &Uevent| matches!(ev.subsystem.as_deref(), Some("block" | "nvme"));
        let mut latest = reported.clone();
        wait::until(monitor.as_mut(), deadline, &what, &relevant, || {
            if latest.iter().all(|(_, s)| *s >= expect) {
                return Ok(Some(()));
            }
            if asked.elapsed() >= super::resize::RESCAN_INTERVAL {
                latest = identify_all(root, &names, nsid, deadline)?;
                asked = Instant::now();
            }
            Ok(None)
        })
        .map_err(|e| match e {
            // Name what they last said, not what they said first.
            Error::Timeout { waited, .. } => Error::Timeout {
                what: format!(
                    "every controller of {spec} to report at least {expect} bytes (they \
                     report {}); has the namespace grown on the array?",
                    sizes(&latest)
                ),
                waited,
            },
            e => e,
        })?;
        reported = latest;
    }
    let size = reported.first().map_or(0, |(_, s)| *s);
    if reported.iter().any(|(_, s)| *s != size) {
        return Err(refuse(ResizeFailure::SizesDiffer {
            sizes: reported
                .iter()
                .map(|(c, s)| (format!("controller {c}"), *s))
                .collect(),
        }));
    }
    if let Some(d) = devices.iter().find(|d| d.before > size) {
        return Err(refuse(ResizeFailure::Shrunk {
            device: d.device.clone(),
            from: d.before,
            to: size,
        }));
    }
    let rescanned = devices.iter().any(|d| d.before != size);
    if rescanned {
        fabrics_nvme::rescan(
            root,
            nqn,
            deadline.saturating_duration_since(Instant::now()),
        )?;
        let what = || {
            let now: Vec<String> = devices
                .iter()
                .map(|d| match super::resize::size_of(root, &d.device) {
                    Ok(s) => format!("{} {s} bytes", d.device),
                    Err(_) => format!("{} gone", d.device),
                })
                .collect();
            format!(
                "{} bytes on {} after the controllers' rescan (now: {})",
                size,
                volume,
                now.join(", ")
            )
        };
        // `set_capacity_and_notify` sends the device's `change` (RESIZE=1).
        let relevant = |ev: &Uevent| {
            ev.action == Action::Change
                && ev
                    .devname
                    .as_deref()
                    .is_some_and(|n| devices.iter().any(|d| d.device == n))
        };
        wait::until(monitor.as_mut(), deadline, &what, &relevant, || {
            for d in &devices {
                if super::resize::size_of(root, &d.device)? != size {
                    return Ok(None);
                }
            }
            Ok(Some(()))
        })?;
    }
    for d in &mut devices {
        d.after = super::resize::size_of(root, &d.device)?;
    }
    let rescan_elapsed = rescan_start.elapsed();
    Ok(Resized {
        wwid,
        paths: Vec::new(),
        map: None,
        nvme: Some(NvmeResize { devices, reported }),
        rescanned,
        rescan_elapsed,
        map_elapsed: std::time::Duration::ZERO,
        elapsed: start.elapsed(),
    })
}

/// Identify Namespace `nsid` through every controller in `names` at once: each one's answer
/// in bytes, in the order given. The first failure is the result, as a step naming the
/// controller.
fn identify_all(
    root: &Root,
    names: &[&str],
    nsid: u32,
    deadline: Instant,
) -> Result<Vec<(String, u64)>> {
    let answers: Vec<(String, Result<u64>)> = std::thread::scope(|s| {
        let workers: Vec<_> = names
            .iter()
            .map(|&c| {
                let w = s.spawn(move || {
                    let id = fabrics_nvme::identify_namespace(root, c, nsid, deadline)?;
                    id.size_bytes().ok_or_else(|| Error::Invalid {
                        kind: "Identify Namespace data",
                        input: format!("{} blocks of {} bytes", id.blocks, id.block_bytes),
                        reason: "the namespace's size does not fit in 64 bits",
                    })
                });
                (c, w)
            })
            .collect();
        workers
            .into_iter()
            .map(|(c, w)| {
                let r = w.join().unwrap_or_else(|_| {
                    Err(Error::Internal {
                        what: format!("the worker identifying through {c} panicked"),
                    })
                });
                (c.to_owned(), r)
            })
            .collect()
    });
    answers
        .into_iter()
        .map(|(c, r)| {
            r.map(|s| (c.clone(), s)).map_err(|e| Error::Step {
                step: "identify",
                target: format!("controller {c}"),
                source: Box::new(e),
            })
        })
        .collect()
}

/// `nvme0 67108864 bytes, nvme1 67108864 bytes`, for messages.
fn sizes(reported: &[(String, u64)]) -> String {
    reported
        .iter()
        .map(|(c, s)| format!("{c} {s} bytes"))
        .collect::<Vec<_>>()
        .join(", ")
}

//! Taking a volume off the node: what a CSI driver's NodeUnstage does after the unmount.
//!
//! One round is: check nobody uses the volume, flush the multipath map, remove it (the
//! `multipath -f` sequence of [`crate::multipath::remove`]), then flush and delete every path
//! (in parallel: each delete waits for its own SYNCHRONIZE CACHE). Rounds repeat, each starting
//! from a fresh look at sysfs, until nothing of the volume is left or the deadline passes: a
//! map that multipathd re-creates, a path that reappears or a removal that races with udev is
//! taken down by the next round. Every step boundary is a valid state to stop and start again
//! from, so a detach killed halfway is finished by the next one; a map it left suspended
//! (killed between the removal's suspend and remove) is resumed first (`resume-map`).
//!
//! # When no path can serve the map
//!
//! With the target unreachable, every path is blocked (the transport is recovering) or
//! failed, and a map that queues I/O holds whatever is sent to it. udev probes the map on
//! every change (blkid), and such a probe's read then blocks and keeps the map open.
//! `multipath -f` refuses such a map ("map in use") until multipathd's `no_path_retry` runs
//! out and fails the queue. A detach tells the cases apart instead:
//!
//! - a user holds it (a mount, a loop device, a holder, any process that is not a verified
//!   udev worker with the map open read-only): refused, as any volume in use (an opener
//!   that lets go within [`OPENER_GRACE`](crate::block::OPENER_GRACE) is waited for);
//! - nothing has it open: its last close wrote back what it could, so it has nothing to
//!   write. The detach disables queueing (`disable-queueing`), deletes the paths, and removes
//!   the map unflushed;
//! - udev's read-only probes, or something `/proc` does not show (a writer's last close
//!   writing back, a partition map held the same way), have it open: data may be cached in
//!   it, since a writer that closed while a probe held the map did not write back (its close
//!   was not the last). Only a path can take that data, so the detach waits, round after
//!   round, for one to come back (the probe's read then ends too), and then flushes as
//!   usual. At the deadline it fails with [`Error::Timeout`] naming the map and its probes;
//!   nothing was changed. `force` fails the queued I/O instead: deletes the paths (which
//!   fails the reads a blocked path holds), then removes the map, and what it cached is
//!   lost.
//!
//! Someone else may fail the queue while the detach waits: multipathd turns queueing off
//! when the map's `no_path_retry` runs out (LIO's default is 12 checker intervals, about
//! 60 s), and what waited in the map fails with EIO. The map then closes with still no
//! path; the detach takes it down as one that nothing had open, and its `flush-map` step
//! says that the writes which waited in it are lost, since they were.
//!
//! A udev worker counts as one only when `/proc` confirms it (root, udevd's executable or
//! udevd as parent; see [`crate::block::UsageScope::ignore_openers`]), not by its command name.

use std::fmt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::volume::{self, Identity, VolumeSpec};
use super::{lock, names};
use crate::error::{Error, Result};
use crate::root::Root;
use crate::wait;

mod in_use;
mod run;

use run::Run;

/// Default time a detach may take.
pub const DEFAULT_DETACH_TIMEOUT: Duration = Duration::from_secs(60);

/// How [`detach`] behaves. Made with [`DetachOptions::new`], which puts the lock files under
/// the root; then set what differs:
///
/// ```
/// let root = lunkit::Root::default();
/// let mut opts = lunkit::ops::DetachOptions::new(&root);
/// opts.timeout = std::time::Duration::from_secs(20);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DetachOptions {
    /// How long the whole detach may take, lock wait included.
    pub timeout: Duration,
    /// Go on past refusals and errors: a volume in use is taken away anyway (its I/O fails),
    /// queued I/O of a map no path can serve is failed (and what it held is lost), a flush
    /// that fails is passed over. Every step skipped this way is in the report.
    pub force: bool,
    /// Where the cross-process lock files go; `None` locks within this process only.
    pub lock_dir: Option<PathBuf>,
    /// Ask multipathd to remove the map when it runs (so it does not re-create it).
    pub use_multipathd: bool,
}

impl DetachOptions {
    /// The defaults for `root`: 60 s, not forced, locks in `<root>/run/lunkit/locks`,
    /// multipathd used when it runs.
    pub fn new(root: &Root) -> DetachOptions {
        DetachOptions {
            timeout: DEFAULT_DETACH_TIMEOUT,
            force: false,
            lock_dir: Some(root.run("lunkit/locks")),
            use_multipathd: true,
        }
    }
}

/// A step of a detach.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StepKind {
    /// Turn the caller's name for the volume into its identity.
    Identify,
    /// Take the volume's lock.
    Lock,
    /// Resume a map of the volume found suspended. A suspended map holds every I/O sent to
    /// it, a flush's included, until it is resumed; a detach or a table reload killed between
    /// its suspend and its resume leaves one so.
    ResumeMap,
    /// Check that nothing uses the volume.
    CheckInUse,
    /// Make a map that no path can serve fail its I/O instead of queueing it (multipathd's
    /// `disablequeueing`, dm's `fail_if_no_path`), so readers stuck on it let go.
    DisableQueueing,
    /// Flush the multipath map.
    FlushMap,
    /// Remove the multipath map.
    RemoveMap,
    /// Flush a path's disk.
    FlushPath,
    /// Delete a path's SCSI device.
    DeletePath,
    /// Flush an NVMe namespace's device.
    FlushNamespace,
    /// Delete an NVMe controller (`delete_controller`).
    DeleteController,
    /// Check that nothing of the volume is left.
    Verify,
}

impl StepKind {
    /// Its name in reports: `check-in-use`, `remove-map`...
    pub fn as_str(self) -> &'static str {
        match self {
            StepKind::Identify => "identify",
            StepKind::Lock => "lock",
            StepKind::ResumeMap => "resume-map",
            StepKind::CheckInUse => "check-in-use",
            StepKind::DisableQueueing => "disable-queueing",
            StepKind::FlushMap => "flush-map",
            StepKind::RemoveMap => "remove-map",
            StepKind::FlushPath => "flush-path",
            StepKind::DeletePath => "delete-path",
            StepKind::FlushNamespace => "flush-namespace",
            StepKind::DeleteController => "delete-controller",
            StepKind::Verify => "verify",
        }
    }
}

/// How a step ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// It did its work.
    Done,
    /// There was nothing to do: already gone.
    AlreadyGone,
    /// It failed or refused and the detach went on (forced, or the failure cannot lose data);
    /// the text says why.
    Skipped(String),
    /// It failed; the detach retries or ends with the error.
    Failed(String),
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Done => f.write_str("done"),
            Outcome::AlreadyGone => f.write_str("already gone"),
            Outcome::Skipped(why) => write!(f, "skipped: {why}"),
            Outcome::Failed(why) => write!(f, "failed: {why}"),
        }
    }
}

/// One step as it happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// What it was.
    pub kind: StepKind,
    /// What it acted on (`mpatha (dm-0)`, `7:0:0:1 (sdc)`).
    pub target: String,
    /// How it ended.
    pub outcome: Outcome,
    /// How long it took.
    pub duration: Duration,
}

/// What [`detach`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DetachReport {
    /// The volume's identity.
    pub identity: Identity,
    /// Every step, in order.
    pub steps: Vec<Step>,
    /// How many take-down rounds ran (0: there was nothing to take down).
    pub rounds: u32,
    /// The whole detach.
    pub duration: Duration,
}

/// Takes the volume `spec` off the node (see the module docs), with the default step sink.
pub fn detach(root: &Root, spec: &VolumeSpec, opts: &DetachOptions) -> Result<DetachReport> {
    detach_with(root, spec, opts, &mut |_| {})
}

/// [`detach`], calling `on_step` as each step ends (for progress output, and so that a
/// caller who gets an error still knows what was done).
pub fn detach_with(
    root: &Root,
    spec: &VolumeSpec,
    opts: &DetachOptions,
    on_step: &mut dyn FnMut(&Step),
) -> Result<DetachReport> {
    if let VolumeSpec::Nvme { nqn, namespace } = spec {
        return super::nvme::detach(root, spec, nqn, namespace, opts, on_step);
    }
    let start = Instant::now();
    let deadline = crate::wait::deadline_from(start, opts.timeout);
    let mut run = Run {
        root,
        opts,
        deadline,
        steps: Vec::new(),
        on_step,
        waited_on: Vec::new(),
        failed_while_waiting: Vec::new(),
    };
    let identity = run.step(StepKind::Identify, &spec.to_string(), || {
        names::identify(root, spec, opts.lock_dir.as_deref()).map(|i| (i, Outcome::Done))
    })?;
    let key = identity.key();
    let _lock = run.step(StepKind::Lock, &key, || {
        lock::lock(&key, opts.lock_dir.as_deref(), deadline).map(|l| (l, Outcome::Done))
    })?;

    let mut rounds = 0;
    let mut backoff = wait::Backoff::new(Duration::from_millis(20), Duration::from_millis(500));
    let mut busy_since: Option<Instant> = None;
    loop {
        let state = volume::locate(root, &identity)?;
        if let Err(e) = state.refuse_foreign_maps(&spec.to_string()) {
            // Not even forced: the map is another volume's as much as this one's.
            run.record(
                StepKind::CheckInUse,
                &state.describe(),
                Outcome::Failed(e.to_string()),
                Duration::ZERO,
            );
            return Err(e);
        }
        if state.is_empty() && rounds == 0 && identity.wwid.is_none() && spec.is_address() {
            // Nothing at the address, and no WWID to look further with: a map whose paths
            // are all gone may be this volume's, and "nothing left" would leave it behind.
            let orphans = volume::orphan_maps(root)?;
            if !orphans.is_empty() {
                let list: Vec<String> = orphans.iter().map(ToString::to_string).collect();
                let e = Error::Unverified {
                    device: spec.to_string(),
                    reason: format!(
                        "no device is at its address and its WWID is not known (none was \
                         remembered by an attach or detach of this name), but {} with no \
                         path left {} on the node and may be its: detach it by its WWID",
                        list.join(", "),
                        if orphans.len() == 1 { "is" } else { "are" }
                    ),
                    usage: None,
                };
                run.record(
                    StepKind::Verify,
                    &spec.to_string(),
                    Outcome::Failed(e.to_string()),
                    Duration::ZERO,
                );
                return Err(e);
            }
        }
        if state.is_empty() {
            let what = if rounds == 0 {
                "nothing of the volume is on the node".to_owned()
            } else {
                "no map or path of the volume is left".to_owned()
            };
            run.record(StepKind::Verify, &what, Outcome::Done, Duration::ZERO);
            return Ok(DetachReport {
                identity,
                steps: run.steps,
                rounds,
                duration: start.elapsed(),
            });
        }
        rounds += 1;
        // `None`: the round went through but the deadline came before the next look.
        let (again, err) = match run.round(&state, &mut busy_since) {
            // Look again: multipathd may have re-created the map, a path may have come back.
            Ok(()) if Instant::now() < deadline => continue,
            Ok(()) => (false, None),
            Err(Stop::Again(e)) => (true, Some(e)),
            Err(Stop::Fail(e)) => (false, Some(e)),
        };
        let now = Instant::now();
        if !again || now >= deadline {
            let last = match err {
                None => String::new(),
                Some(Error::Timeout { what, .. }) => format!("; last wait: {what}"),
                Some(e) => return Err(e),
            };
            let left = volume::locate(root, &identity)
                .map(|s| s.describe())
                .unwrap_or_default();
            return Err(Error::Timeout {
                what: format!("{spec} to be taken off the node (left: {left}{last})"),
                waited: start.elapsed(),
            });
        }
        backoff.sleep(deadline);
    }
}

/// Why a round ended early.
enum Stop {
    /// Another round may succeed: something was busy for a moment, or vanished under our feet.
    /// The error is what the caller gets if no time is left for one.
    Again(Error),
    /// Another round would not help: the volume is in use, or something is broken.
    Fail(Error),
}

impl From<Error> for Stop {
    fn from(e: Error) -> Stop {
        if retryable(&e) {
            Stop::Again(e)
        } else {
            Stop::Fail(e)
        }
    }
}

/// Kernel and lookup errors after which another round may succeed. A refusal because the
/// volume is in use is not one of them; the two waits that are
/// ([`OPENER_GRACE`](crate::block::OPENER_GRACE), a map open for a moment) say so with
/// [`Stop::Again`] themselves.
fn retryable(e: &Error) -> bool {
    match e {
        Error::Busy { .. } | Error::Unverified { .. } => false,
        Error::Step { source, .. } => retryable(source),
        Error::Ioctl { .. } | Error::Io { .. } => matches!(
            e.errno(),
            Some(libc::EBUSY | libc::ENXIO | libc::ENODEV | libc::ENOENT | libc::EAGAIN)
        ),
        Error::NotFound { .. } | Error::Replaced { .. } => true,
        _ => false,
    }
}

/// `e` as the error of step `kind` on `target`, so that the caller learns which step failed
/// on what. Refusals (which name the device and say why) and timeouts (which name what was
/// awaited, and which [`detach_with`] completes with what is left) stay as they are.
pub(in crate::ops) fn step_error(kind: StepKind, target: &str, e: Error) -> Error {
    match e {
        Error::Busy { .. }
        | Error::Unverified { .. }
        | Error::Timeout { .. }
        | Error::Step { .. } => e,
        e => Error::Step {
            step: kind.as_str(),
            target: target.to_owned(),
            source: Box::new(e),
        },
    }
}

//! The SCSI detach, in rounds until nothing of the volume is left. What it does is told at
//! [`crate::ops::detach_with()`].

use std::time::{Duration, Instant};

use super::identify::identify_named;
use super::locate::{self, VolumeState};
use crate::error::{Error, Result};
use crate::ops::BeforeRemoval;
use crate::ops::lock;
use crate::ops::options::DetachOptions;
use crate::ops::report::{DetachReport, Outcome, Step, StepKind};
use crate::ops::spec::VolumeSpec;
use crate::ops::steps::StepLog;
use crate::root::Root;
use crate::wait;

mod in_use;
mod run;

use run::Run;

/// Takes the volume `spec`, named by SCSI, off the node (see the module docs), calling
/// `on_step` as each step ends.
pub(in crate::ops) fn detach(
    root: &Root,
    spec: &VolumeSpec,
    opts: &DetachOptions,
    on_step: &mut dyn FnMut(&Step),
    before_removal: Option<&mut BeforeRemoval<'_>>,
) -> Result<DetachReport> {
    let start = Instant::now();
    let deadline = crate::wait::deadline_from(start, opts.timeout);
    let mut run = Run {
        root,
        opts,
        deadline,
        log: StepLog::new(on_step),
        before_removal: before_removal.map(shorten),
        waited_on: Vec::new(),
        failed_while_waiting: Vec::new(),
    };
    // Said at once: detaches begun together share one walk over the processes in their
    // first checks, which starts as soon as they hold their locks (below).
    let mut first = Some(crate::block::intend_check(root));
    let identity = run.log.run(StepKind::Identify, &spec.to_string(), || {
        identify_named(root, spec, opts.lock_dir.as_deref(), deadline).map(|i| (i, Outcome::Done))
    })?;
    let key = identity.key();
    let _lock = run.log.run(StepKind::Lock, &key, || {
        lock::lock(&key, opts.lock_dir.as_deref(), deadline).map(|l| (l, Outcome::Done))
    })?;

    let mut rounds = 0;
    let mut backoff = wait::Backoff::new(Duration::from_millis(20), Duration::from_millis(500));
    let mut busy_since: Option<Instant> = None;
    loop {
        // The first round's walk runs while the volume is located: it reads every process's
        // devices, whichever they are. A later round's starts at its check, as little
        // before the deletes as it can.
        let intent = match first.take() {
            Some(i) => i.begin(root, deadline),
            None => crate::block::intend_check(root),
        };
        let state = locate::locate_until(root, &identity, deadline)?;
        run.refuse_others(&state, spec, rounds == 0 && identity.wwid.is_none())?;
        if state.is_empty() {
            let what = if rounds == 0 {
                "nothing of the volume is on the node".to_owned()
            } else {
                "no map or path of the volume is left".to_owned()
            };
            run.log
                .record(StepKind::Verify, &what, Outcome::Done, Duration::ZERO);
            if let (Some(dir), Some(w)) = (opts.lock_dir.as_deref(), identity.wwid.as_ref()) {
                // The address's record is history now; failing to say so loses nothing.
                let _ = crate::ops::names::retire(dir, spec, w);
            }
            return Ok(DetachReport {
                identity,
                steps: run.log.into_steps(),
                rounds,
                duration: start.elapsed(),
            });
        }
        rounds += 1;
        // `None`: the round went through but the deadline came before the next look.
        let (again, err) = match run.round(&state, &mut busy_since, intent) {
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
            let left = locate::locate(root, &identity)
                .map(|s| s.describe())
                .unwrap_or_default();
            return Err(Error::Timeout {
                what: format!(
                    "{spec} to be taken off the node (left: {left}{last}): run the detach \
                     again, which goes on from what is left, or give it a longer deadline"
                ),
                waited: start.elapsed(),
            });
        }
        backoff.sleep(deadline);
    }
}

/// The caller's step as [`Run`] keeps it: a trait object may be held for less than it lives.
fn shorten<'s>(step: &'s mut BeforeRemoval<'_>) -> &'s mut BeforeRemoval<'s> {
    step
}

impl Run<'_> {
    /// Refuses a map of `state` that is another volume's too, and, on a first look with no
    /// WWID (`blind`), a map whose paths are all gone at the address `spec` names.
    fn refuse_others(&mut self, state: &VolumeState, spec: &VolumeSpec, blind: bool) -> Result<()> {
        if let Err(e) = state.refuse_foreign_maps(&spec.to_string()) {
            // Not even forced: the map is another volume's as much as this one's.
            let failed = Outcome::Failed(e.to_string());
            self.log.record(
                StepKind::CheckInUse,
                &state.describe(),
                failed,
                Duration::ZERO,
            );
            return Err(e);
        }
        if state.is_empty() && blind && spec.is_address() {
            // Nothing at the address, and no WWID to look further with: a map whose paths
            // are all gone may be this volume's, and "nothing left" would leave it behind.
            if let Err(e) = refuse_orphans(self.root, spec) {
                let failed = Outcome::Failed(e.to_string());
                self.log
                    .record(StepKind::Verify, &spec.to_string(), failed, Duration::ZERO);
                return Err(e);
            }
        }
        Ok(())
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

/// For a volume named by an address with nothing there and no WWID to look further with:
/// [`Error::Unverified`] when a multipath map with no path left is on the node, which may be
/// this volume's, and "nothing left" would leave it behind.
fn refuse_orphans(root: &Root, spec: &VolumeSpec) -> Result<()> {
    let orphans = locate::orphan_maps(root)?;
    if orphans.is_empty() {
        return Ok(());
    }
    let list: Vec<String> = orphans.iter().map(ToString::to_string).collect();
    Err(Error::Unverified {
        device: spec.to_string(),
        reason: format!(
            "no device is at its address and its WWID is not known (none was \
             remembered by an attach or detach of this name), but {} with no \
             path left {} on the node and may be its: detach it by its WWID",
            list.join(", "),
            if orphans.len() == 1 { "is" } else { "are" }
        ),
        usage: None,
    })
}

//! The one step recorder of the workflows that report steps (every detach, SCSI or NVMe):
//! [`StepLog`] times each step, hands it to the caller's sink as it ends and keeps it for the
//! report; [`step_error`] says which step failed on what.

use std::time::{Duration, Instant};

use crate::error::{Error, Result};

use super::report::{Outcome, Step, StepKind};

/// `e` as the error of step `kind` on `target`, so that the caller learns which step failed
/// on what. Refusals (which name the device and say why) and timeouts (which name what was
/// awaited, and which [`detach_with`](super::detach_with) completes with what is left) stay as they are.
pub(crate) fn step_error(kind: StepKind, target: &str, e: Error) -> Error {
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

/// The steps of one workflow: each recorded as it ends, handed to the caller's sink then (for
/// progress output, and so that a caller who gets an error still knows what was done) and
/// kept for the report.
pub(crate) struct StepLog<'a> {
    steps: Vec<Step>,
    on_step: &'a mut dyn FnMut(&Step),
}

impl<'a> StepLog<'a> {
    /// An empty log whose steps go to `on_step` as they end.
    pub(crate) fn new(on_step: &'a mut dyn FnMut(&Step)) -> StepLog<'a> {
        StepLog {
            steps: Vec::new(),
            on_step,
        }
    }

    /// Records a step that took `duration`.
    pub(crate) fn record(
        &mut self,
        kind: StepKind,
        target: &str,
        outcome: Outcome,
        duration: Duration,
    ) {
        let step = Step {
            kind,
            target: target.to_owned(),
            outcome,
            duration,
        };
        (self.on_step)(&step);
        self.steps.push(step);
    }

    /// Records a step that began at `since` and ends now.
    pub(crate) fn record_since(
        &mut self,
        kind: StepKind,
        target: &str,
        outcome: Outcome,
        since: Instant,
    ) {
        self.record(kind, target, outcome, since.elapsed());
    }

    /// Runs `f` as one step, which says how it ended; an error is recorded as `Failed` and
    /// returned as [`step_error`] makes it.
    pub(crate) fn run<T>(
        &mut self,
        kind: StepKind,
        target: &str,
        f: impl FnOnce() -> Result<(T, Outcome)>,
    ) -> Result<T> {
        let t0 = Instant::now();
        match f() {
            Ok((v, outcome)) => {
                self.record_since(kind, target, outcome, t0);
                Ok(v)
            }
            Err(e) => Err(self.fail(kind, target, e, t0)),
        }
    }

    /// Like [`StepLog::run`], but with `force` a failure is recorded as `Skipped` and the
    /// workflow goes on.
    pub(crate) fn run_or_force(
        &mut self,
        force: bool,
        kind: StepKind,
        target: &str,
        f: impl FnOnce() -> Result<Outcome>,
    ) -> Result<()> {
        let t0 = Instant::now();
        let outcome = match f() {
            Ok(o) => o,
            Err(e) if force => Outcome::Skipped(format!("forced past: {e}")),
            Err(e) => return Err(self.fail(kind, target, e, t0)),
        };
        self.record_since(kind, target, outcome, t0);
        Ok(())
    }

    /// Records a step begun at `since` as failed with `e`, and returns `e` as the step's
    /// error ([`step_error`]).
    pub(crate) fn fail(&mut self, kind: StepKind, target: &str, e: Error, since: Instant) -> Error {
        self.record_since(kind, target, Outcome::Failed(e.to_string()), since);
        step_error(kind, target, e)
    }

    /// Every step, in order, for the report.
    pub(crate) fn into_steps(self) -> Vec<Step> {
        self.steps
    }
}

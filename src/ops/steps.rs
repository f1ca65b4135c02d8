//! The one step recorder of the workflows that report steps (every detach, SCSI or NVMe):
//! [`StepLog`] times each step, hands it to the caller's sink as it ends and keeps it for the
//! report; [`step_error`] says which step failed on what.
//!
//! Each step carries when it began, counted from the log's creation at the start of the
//! workflow, as well as how long it took: steps that ran side by side (a volume's paths,
//! deleted at once) overlap in the report, and what no step covers shows as the gaps
//! between them.

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
    /// When the workflow began: every step's [`Step::start`] counts from here.
    origin: Instant,
    steps: Vec<Step>,
    on_step: &'a mut dyn FnMut(&Step),
}

impl<'a> StepLog<'a> {
    /// An empty log whose steps go to `on_step` as they end; its steps' start offsets count
    /// from now.
    pub(crate) fn new(on_step: &'a mut dyn FnMut(&Step)) -> StepLog<'a> {
        StepLog {
            origin: Instant::now(),
            steps: Vec::new(),
            on_step,
        }
    }

    /// Records a step that took `duration` and ends now.
    pub(crate) fn record(
        &mut self,
        kind: StepKind,
        target: &str,
        outcome: Outcome,
        duration: Duration,
    ) {
        let began = Instant::now().checked_sub(duration).unwrap_or(self.origin);
        self.record_span(kind, target, outcome, began, duration);
    }

    /// Records a step that began at `since` and ends now.
    pub(crate) fn record_since(
        &mut self,
        kind: StepKind,
        target: &str,
        outcome: Outcome,
        since: Instant,
    ) {
        self.record_span(kind, target, outcome, since, since.elapsed());
    }

    /// Records a step that began at `began` and took `duration`: one that ran on a helper
    /// thread beside others and is recorded after they all ended.
    pub(crate) fn record_span(
        &mut self,
        kind: StepKind,
        target: &str,
        outcome: Outcome,
        began: Instant,
        duration: Duration,
    ) {
        let step = Step {
            kind,
            target: target.to_owned(),
            outcome,
            start: began.saturating_duration_since(self.origin),
            duration,
        };
        (self.on_step)(&step);
        self.steps.push(step);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_side_by_side_keep_their_own_starts() {
        let mut seen = Vec::new();
        let mut sink = |s: &Step| seen.push(s.start);
        let mut log = StepLog::new(&mut sink);
        let origin = log.origin;
        let ms = Duration::from_millis;
        // Two paths' deletes on helpers, recorded after both ended: each keeps the start it
        // had, so they overlap instead of following each other.
        log.record_span(
            StepKind::DeletePath,
            "sdc",
            Outcome::Done,
            origin + ms(40),
            ms(30),
        );
        log.record_span(
            StepKind::DeletePath,
            "sdd",
            Outcome::Done,
            origin + ms(42),
            ms(25),
        );
        // A step begun before the log (cannot happen, but must not underflow) starts at 0.
        let before = origin.checked_sub(ms(1)).unwrap_or(origin);
        log.record_span(StepKind::Identify, "x", Outcome::Done, before, ms(1));
        log.record_since(StepKind::Verify, "x", Outcome::Done, origin + ms(5));
        let steps = log.into_steps();
        let starts: Vec<Duration> = steps.iter().map(|s| s.start).collect();
        assert_eq!(starts, [ms(40), ms(42), Duration::ZERO, ms(5)]);
        assert_eq!(steps[1].duration, ms(25));
        // The caller's sink saw the same starts, as each step ended.
        assert_eq!(seen, starts);
    }
}

//! One run of a costly read for every caller that asked while it had not started yet.
//!
//! The in-use check's walk over every process (`/proc/*/fd`, `maps`) costs about as much on
//! its own as the rest of a detach. A CSI plugin draining a node detaches tens of volumes at
//! once; each walk of its own would read the same processes again, side by side. A walk is
//! only valid for a check if it *started after* the check asked (a process that opened the
//! device before the ask must be seen), so a check may not take a walk already under way,
//! but it may take any walk that starts after it asked, however many others share it.
//!
//! [`Shared::ask`] records that point. [`Ticket::take`] then waits for a run that started
//! after it, or starts one itself when none is running: callers that ask while a run is
//! under way all share the next one. A caller that starts a run at once, to overlap it with
//! its own work ([`Shared::lead`]), publishes its result with [`Lead::publish`].

use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

/// Runs of one read shared among callers (see the module).
pub(crate) struct Shared<T> {
    state: Mutex<State<T>>,
    /// Signalled whenever a run ends.
    ended: Condvar,
}

struct State<T> {
    /// How many runs have started; run `n` is the `n`th.
    started: u64,
    /// The run under way, if any.
    running: Option<u64>,
    /// The newest run that ended, and its result (`None`: it failed or was given up).
    last: Option<(u64, Option<Arc<T>>)>,
    /// Callers that said they will ask soon ([`Shared::intend`]) and have not yet.
    intents: usize,
}

/// A caller's place: any run numbered above `after` started after it asked.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ticket {
    after: u64,
}

/// A run this caller started and must publish; dropped unpublished, it ends as failed, and
/// the callers waiting for it run their own.
pub(crate) struct Lead<'a, T> {
    shared: &'a Shared<T>,
    run: u64,
    published: bool,
}

/// A caller's word that it will ask soon (see [`Shared::gather`]); kept until it asks, or
/// dropped when it no longer will.
pub(crate) struct Intent<T: 'static> {
    shared: &'static Shared<T>,
}

impl<T> Drop for Intent<T> {
    fn drop(&mut self) {
        let mut s = self.shared.lock();
        s.intents = s.intents.saturating_sub(1);
        drop(s);
        self.shared.ended.notify_all();
    }
}

/// What [`Ticket::take`] got.
pub(crate) enum Taken<T> {
    /// A run that started after the ask, perhaps another caller's.
    Shared(Arc<T>),
    /// This caller's own run failed.
    Failed,
    /// The deadline passed while another caller's run was under way.
    TimedOut,
}

/// The [`Shared`] reads of one kind, one per tree they read (`/proc`, `/sys`, or a
/// fixture's): a `static` of this type, given to [`keyed`].
pub(crate) type Registry<T> = Mutex<Vec<(PathBuf, &'static Shared<T>)>>;

/// The [`Shared`] of `registry` for the tree at `key`, made the first time it is asked for
/// and kept for the life of the process (one per distinct tree a process ever reads: one,
/// or two with a fixture).
pub(crate) fn keyed<T: Send + Sync>(
    registry: &'static Registry<T>,
    key: &Path,
) -> &'static Shared<T> {
    let mut all = registry.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((_, s)) = all.iter().find(|(p, _)| p == key) {
        return s;
    }
    let s: &'static Shared<T> = Box::leak(Box::new(Shared::new()));
    all.push((key.to_path_buf(), s));
    s
}

impl<T> Shared<T> {
    pub(crate) const fn new() -> Shared<T> {
        Shared {
            state: Mutex::new(State {
                started: 0,
                running: None,
                last: None,
                intents: 0,
            }),
            ended: Condvar::new(),
        }
    }

    /// A consistent state survives a panic elsewhere (each change is made whole under the
    /// lock), so a poisoned lock is used as is.
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Marks the point after which a run is good for this caller.
    pub(crate) fn ask(&self) -> Ticket {
        Ticket {
            after: self.lock().started,
        }
    }

    /// Says that the caller will ask soon: a caller about to lead a run waits for it a
    /// little ([`Shared::gather`]), so that callers that began together share one run.
    pub(crate) fn intend(&'static self) -> Intent<T> {
        self.lock().intents += 1;
        Intent { shared: self }
    }

    /// Waits until every caller that said it will ask ([`Shared::intend`]) has asked or
    /// given up, a run is under way, or `until`, whichever comes first: then a run led now
    /// serves every caller that began with this one, where leading at once would serve
    /// this one alone and make the others wait for it and then for a run of their own.
    pub(crate) fn gather(&self, until: Instant) {
        let mut s = self.lock();
        while s.intents > 0 && s.running.is_none() {
            let now = Instant::now();
            if now >= until {
                return;
            }
            s = self
                .ended
                .wait_timeout(s, until - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Starts a run now if none is under way: the caller runs it and publishes what it
    /// found for everyone who asked before. `None` while another run is under way (then
    /// [`Shared::ask`] and [`Ticket::take`]).
    pub(crate) fn lead(&self) -> Option<Lead<'_, T>> {
        let mut s = self.lock();
        if s.running.is_some() {
            return None;
        }
        Some(Shared::start(self, &mut s))
    }

    /// Starts run number `started + 1`, under the lock `s` of `shared`.
    fn start<'a>(shared: &'a Shared<T>, s: &mut State<T>) -> Lead<'a, T> {
        s.started += 1;
        s.running = Some(s.started);
        Lead {
            shared,
            run: s.started,
            published: false,
        }
    }

    /// Ends run `run` with `result` and wakes every caller waiting on the state.
    fn end(&self, run: u64, result: Option<Arc<T>>) {
        let mut s = self.lock();
        if s.running == Some(run) {
            s.running = None;
        }
        if s.last.as_ref().is_none_or(|(n, _)| *n < run) {
            s.last = Some((run, result));
        }
        drop(s);
        self.ended.notify_all();
    }
}

impl Ticket {
    /// A run that started after this ticket was asked: the newest ended one if it is such a
    /// run, else the one under way once it ends, else one this caller runs here (`run`,
    /// whose `None` is a failure). A run under way that started before the ask is waited
    /// out first. Waits at most until `deadline` for other callers' runs; a run of its own
    /// is not cut short (`run` has the deadline too).
    pub(crate) fn take<T>(
        self,
        shared: &Shared<T>,
        deadline: Instant,
        run: impl FnOnce() -> Option<T>,
    ) -> Taken<T> {
        let mut s = shared.lock();
        loop {
            if let Some((n, Some(found))) = &s.last {
                if *n > self.after {
                    return Taken::Shared(Arc::clone(found));
                }
            }
            // Nothing under way (the one meant for this caller failed, or none was started
            // since it asked): its own run, started under this lock so that callers asking
            // from now on wait for it rather than start another.
            if s.running.is_none() {
                break;
            }
            let now = Instant::now();
            if now >= deadline {
                return Taken::TimedOut;
            }
            s = shared
                .ended
                .wait_timeout(s, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        let lead = Shared::start(shared, &mut s);
        drop(s);
        match lead.publish(run()) {
            Some(found) => Taken::Shared(found),
            None => Taken::Failed,
        }
    }
}

impl<T> Lead<'_, T> {
    /// Ends the run with `found` and wakes those waiting for it.
    pub(crate) fn share(self, found: T) -> Arc<T> {
        let found = Arc::new(found);
        self.finish(Some(Arc::clone(&found)));
        found
    }

    fn finish(mut self, result: Option<Arc<T>>) {
        self.published = true;
        self.shared.end(self.run, result);
    }

    /// Ends the run with `result` (`None`: it failed) and wakes those waiting for it.
    pub(crate) fn publish(self, result: Option<T>) -> Option<Arc<T>> {
        let result = result.map(Arc::new);
        self.finish(result.clone());
        result
    }
}

impl<T> Drop for Lead<'_, T> {
    fn drop(&mut self) {
        if !self.published {
            self.shared.end(self.run, None);
        }
    }
}

#[cfg(test)]
mod tests;

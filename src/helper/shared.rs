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
    /// Callers that said they will ask soon ([`Shared::intend`], or promised ahead by
    /// [`Shared::promise`]) and have not yet.
    intents: usize,
    /// Of `intents`, those promised ahead that no caller has claimed yet.
    promised: usize,
    /// Promises alive, and the latest time one of them lets a gather wait until.
    promises: usize,
    gather_until: Option<Instant>,
    /// The `after` of every ticket asked and not yet taken or given up: who still wants a
    /// run numbered above it.
    open: Vec<u64>,
}

/// A caller's place: any run numbered above `after` started after it asked. Taken
/// ([`Ticket::take`]) or given up ([`Shared::give_up`]), never just dropped: a run another
/// caller leads goes on for the tickets still open ([`Shared::wanted`]).
#[derive(Debug)]
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

/// Places promised ahead to callers not started yet ([`Shared::promise`]); dropped, the
/// places nobody claimed are withdrawn.
pub(crate) struct Promise<T: 'static> {
    shared: &'static Shared<T>,
    count: usize,
}

impl<T> Drop for Promise<T> {
    fn drop(&mut self) {
        let mut s = self.shared.lock();
        // The places left unclaimed are withdrawn, as many of them as this promise made
        // (another promise's stay).
        let unclaimed = s.promised.min(self.count);
        s.promised -= unclaimed;
        s.intents = s.intents.saturating_sub(unclaimed);
        s.promises = s.promises.saturating_sub(1);
        if s.promises == 0 {
            s.gather_until = None;
        }
        drop(s);
        self.shared.ended.notify_all();
    }
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
                promised: 0,
                promises: 0,
                gather_until: None,
                open: Vec::new(),
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
        let mut s = self.lock();
        let after = s.started;
        s.open.push(after);
        Ticket { after }
    }

    /// Gives up `ticket` without taking a run (the caller needs none after all).
    pub(crate) fn give_up(&self, ticket: Ticket) {
        self.lock().close(&ticket);
    }

    /// Whether a ticket still open wants run `run` (asked before it started).
    pub(crate) fn wanted(&self, run: u64) -> bool {
        self.lock().open.iter().any(|after| *after < run)
    }

    /// How many runs have started.
    pub(crate) fn started(&self) -> u64 {
        self.lock().started
    }

    /// Says that the caller will ask soon: a caller about to lead a run waits for it a
    /// little ([`Shared::gather`]), so that callers that began together share one run. A
    /// place promised ahead ([`Shared::promise`]) is claimed rather than a new one said.
    pub(crate) fn intend(&'static self) -> Intent<T> {
        let mut s = self.lock();
        if s.promised > 0 {
            s.promised -= 1;
        } else {
            s.intents += 1;
        }
        Intent { shared: self }
    }

    /// Says ahead, for `count` callers not started yet, that they will ask: a gather then
    /// waits for them too, until `until` at most, and each claims its place as it says it
    /// ([`Shared::intend`]). For a batch whose callers start together but may reach their
    /// `intend` only after another of them has asked and led.
    pub(crate) fn promise(&'static self, count: usize, until: Instant) -> Promise<T> {
        let mut s = self.lock();
        s.intents += count;
        s.promised += count;
        s.promises += 1;
        s.gather_until = Some(s.gather_until.map_or(until, |u| u.max(until)));
        Promise {
            shared: self,
            count,
        }
    }

    /// Waits until every caller that said it will ask ([`Shared::intend`]) has asked or
    /// given up, a run is under way, or `until`, whichever comes first: then a run led now
    /// serves every caller that began with this one, where leading at once would serve
    /// this one alone and make the others wait for it and then for a run of their own.
    /// A promise alive ([`Shared::promise`]) may let it wait longer, until its own time,
    /// but never past `deadline`.
    pub(crate) fn gather(&self, until: Instant, deadline: Instant) {
        let mut s = self.lock();
        while s.intents > 0 && s.running.is_none() {
            let until = s.gather_until.map_or(until, |u| u.max(until)).min(deadline);
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
                    let found = Arc::clone(found);
                    s.close(&self);
                    return Taken::Shared(found);
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
                s.close(&self);
                return Taken::TimedOut;
            }
            s = shared
                .ended
                .wait_timeout(s, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        let lead = Shared::start(shared, &mut s);
        s.close(&self);
        drop(s);
        match lead.publish(run()) {
            Some(found) => Taken::Shared(found),
            None => Taken::Failed,
        }
    }
}

impl<T> State<T> {
    /// `ticket` is taken or given up: it no longer wants a run.
    fn close(&mut self, ticket: &Ticket) {
        if let Some(i) = self.open.iter().position(|a| *a == ticket.after) {
            self.open.swap_remove(i);
        }
    }
}

impl<T> Lead<'_, T> {
    /// Which run this is (the `n`th started, see [`Shared::started`]).
    pub(crate) fn run(&self) -> u64 {
        self.run
    }

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

//! Helper threads for kernel calls that cannot be interrupted, bounded by the caller's
//! deadline: at most one per operation and device, and none that counts as a user.
//!
//! A `scan`, `rescan` or `delete` write waits inside the SCSI midlayer for as long as its
//! commands time out and are retried; `open(2)` of a disk waits while a partition scan holds
//! it; `fsync` on a dead transport waits for the error handler. None of these can be
//! interrupted, so [`bounded`] runs them on a helper thread and returns
//! [`Error::Timeout`] at the deadline, leaving the thread to finish on its own.
//!
//! Two things would go wrong in a long-lived caller (a CSI node plugin retries a failed
//! detach every few seconds) if that were all:
//!
//! - every retry would park another thread in the same stuck call, without bound. So a
//!   helper owns its [`Subject`] (the operation and the device) until its kernel call
//!   returns, and a later call on the same subject waits for it, within its own deadline,
//!   instead of starting another: [`Error::Timeout`] then names the earlier call and how long
//!   it has been blocked;
//! - a stuck flush keeps the disk open, and the next in-use check would find this very
//!   process holding it (`open by pid <self>`) and refuse. So a helper registers each
//!   descriptor it opens ([`hold`]), and [`held`] tells the check which of this process's
//!   descriptors are its own helpers' ([`crate::block::usage`] lists them apart).

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError, mpsc};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::id::DevNum;

mod shared;
pub(crate) use shared::{Intent, Lead, Promise, Registry, Shared, Taken, Ticket, keyed};

/// How long [`bounded`] waits for its helper thread even when the deadline has passed, so
/// that a quick call (the usual case) still reports.
const MIN_WAIT: Duration = Duration::from_millis(10);

/// What a helper does and to what. Two helpers with equal subjects never run at once.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Subject {
    op: &'static str,
    on: String,
}

impl Subject {
    /// Operation `op` (`"flush"`, `"open"`…) on the block device `dev`.
    pub(crate) fn device(op: &'static str, dev: DevNum) -> Subject {
        Subject {
            op,
            on: dev.to_string(),
        }
    }

    /// Operation `op` on the character device `dev` (an NVMe controller's `/dev/nvmeN`).
    pub(crate) fn char_device(op: &'static str, dev: DevNum) -> Subject {
        Subject {
            op,
            on: format!("char {dev}"),
        }
    }

    /// A share of this process's own work (`op`: the `/proc` walk), not a kernel call: each
    /// is a subject of its own, so no share waits for another.
    pub(crate) fn share(op: &'static str) -> Subject {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        Subject {
            op,
            on: format!(
                "share {}",
                NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            ),
        }
    }

    /// A write of `value` to the sysfs attribute `path` (`delete`, `rescan`, a host's
    /// `scan`): the same write again is the same subject, a scan of another LUN is not.
    pub(crate) fn write(path: &std::path::Path, value: &str) -> Subject {
        Subject {
            op: "write",
            on: format!("{value:?} to {}", path.display()),
        }
    }
}

/// The subjects whose helper is still in its call, with when it started.
static BUSY: Mutex<BTreeMap<Subject, Instant>> = Mutex::new(BTreeMap::new());
/// Signalled whenever a helper gives its subject up.
static FREED: Condvar = Condvar::new();
/// Descriptors helpers hold open, with the device each is open on.
static HELD: Mutex<Vec<(RawFd, DevNum)>> = Mutex::new(Vec::new());

/// A panic in another thread while it held the lock leaves the data consistent here (every
/// critical section is a single insert or remove), so a poisoned lock is used as is.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Runs `f` on a helper thread that owns `subject`, and waits for it until `deadline`.
///
/// - If an earlier helper still owns `subject`, this first waits for it to finish; at the
///   deadline it returns [`Error::Timeout`] naming that earlier call, without running `f`.
/// - Past the deadline it returns [`Error::Timeout`] naming `what`; the thread finishes on
///   its own, drops its result (closing what it opened) and frees the subject.
pub(crate) fn bounded<T: Send + 'static>(
    subject: Subject,
    deadline: Instant,
    what: &dyn Fn() -> String,
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    start(subject, deadline, what, f)?.wait(deadline, what)
}

/// A call [`start`]ed on a helper thread.
pub(crate) struct Pending<T> {
    rx: mpsc::Receiver<(Result<T>, Instant)>,
    started: Instant,
}

/// [`bounded`] in two halves: hands `f` to a helper thread and returns at once, so that a
/// caller can have several calls in flight (one path's scan write each) and then
/// [`Pending::wait`] for each. Waiting for `subject` to be free is as in [`bounded`].
pub(crate) fn start<T: Send + 'static>(
    subject: Subject,
    deadline: Instant,
    what: &dyn Fn() -> String,
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<Pending<T>> {
    let started = Instant::now();
    let until = deadline.max(crate::wait::deadline_from(started, MIN_WAIT));
    {
        let mut busy = lock(&BUSY);
        while let Some(&since) = busy.get(&subject) {
            let now = Instant::now();
            if now >= until {
                return Err(Error::Timeout {
                    what: format!(
                        "{}: an earlier call is still blocked in the kernel (for {:.1?} now), \
                         and only one runs at a time",
                        what(),
                        now - since
                    ),
                    waited: now - started,
                });
            }
            busy = FREED
                .wait_timeout(busy, until - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        busy.insert(subject.clone(), started);
    }
    hand_over(subject, started, f)
}

/// [`start`] for a caller that checks again later: `None` at once, instead of a wait, while
/// an earlier call still owns `subject`. A scan re-checks its paths on every uevent, so one
/// path whose open from an earlier call is stuck must not hold up the others' opens.
pub(crate) fn try_start<T: Send + 'static>(
    subject: Subject,
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<Option<Pending<T>>> {
    let started = Instant::now();
    {
        let mut busy = lock(&BUSY);
        if busy.contains_key(&subject) {
            return Ok(None);
        }
        busy.insert(subject.clone(), started);
    }
    hand_over(subject, started, f).map(Some)
}

/// Runs `f` on a helper thread that owns `subject`, already marked busy by the caller.
fn hand_over<T: Send + 'static>(
    subject: Subject,
    started: Instant,
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<Pending<T>> {
    let owner = Owner(subject);
    let (tx, rx) = mpsc::channel();
    // If no thread takes it, the job, and with it `owner`, is dropped: the subject is freed.
    run(Box::new(move || {
        let result = f();
        // Free the subject before the caller can see the result: a caller that goes on to
        // the same subject at once (a scan re-checking a disk whose open failed) must find
        // it free, or `try_start` passes over it until the next re-check.
        drop(owner);
        let _ = tx.send((result, Instant::now()));
    }))
    .map_err(|e| Error::io("(helper thread)", e))?;
    Ok(Pending { rx, started })
}

impl<T> Pending<T> {
    /// The call's result, once it returns, or [`Error::Timeout`] naming `what` at `deadline`
    /// (given at least a short grace after the call started, so that a quick call reports).
    pub(crate) fn wait(self, deadline: Instant, what: &dyn Fn() -> String) -> Result<T> {
        self.wait_timed(deadline, what).map(|(v, _)| v)
    }

    /// [`Pending::wait`], with when the call returned on its thread (which the caller may
    /// learn later, having waited for other calls first).
    pub(crate) fn wait_timed(
        self,
        deadline: Instant,
        what: &dyn Fn() -> String,
    ) -> Result<(T, Instant)> {
        let until = deadline.max(crate::wait::deadline_from(self.started, MIN_WAIT));
        // A call that waited for an earlier one still gets the short grace to report.
        match self.rx.recv_timeout(
            until
                .saturating_duration_since(Instant::now())
                .max(MIN_WAIT),
        ) {
            Ok((result, at)) => result.map(|v| (v, at)),
            Err(_) => Err(Error::Timeout {
                what: what(),
                waited: self.started.elapsed(),
            }),
        }
    }
}

/// One call for a helper thread.
type Job = Box<dyn FnOnce() + Send>;

/// The helper threads that run calls one after another: started ahead of need by
/// [`prewarm`], they take calls from one queue and exit after [`IDLE_FOR`] without one.
struct Pool {
    /// Calls handed over and not yet taken.
    jobs: std::collections::VecDeque<Job>,
    /// Threads waiting for a call.
    idle: usize,
    /// Threads [`prewarm`] started that are not waiting yet.
    starting: usize,
}

static POOL: Mutex<Pool> = Mutex::new(Pool {
    jobs: std::collections::VecDeque::new(),
    idle: 0,
    starting: 0,
});
/// Signalled when a call is queued.
static QUEUED: Condvar = Condvar::new();
/// How long a pool thread waits for another call before it exits. A long-lived caller (a CSI
/// node plugin) works in bursts: a pod's volumes staged one after another, a node drained, a
/// failed detach retried every few seconds. A parked thread costs its stack mapping and
/// nothing else, while starting one sits on the next call's critical path: tens of
/// microseconds on a real CPU, 1.5-4 ms under TCG, where a one-path scan's write waited that
/// long for its thread once the pool had emptied after 1 s idle. Tests use a short life, to
/// see threads go.
#[cfg(not(test))]
const IDLE_FOR: Duration = Duration::from_secs(60);
#[cfg(test)]
const IDLE_FOR: Duration = Duration::from_secs(1);

/// Runs `job` on a pool thread when one is waiting or starting and not spoken for (a call
/// never waits behind another), else on a new thread of its own. A starting thread takes it
/// as soon as it runs: the caller starts no thread while [`prewarm`]'s are on their way.
fn run(job: Job) -> std::io::Result<()> {
    {
        let mut pool = lock(&POOL);
        if pool.idle + pool.starting > pool.jobs.len() {
            pool.jobs.push_back(job);
            QUEUED.notify_one();
            return Ok(());
        }
    }
    std::thread::Builder::new()
        .name("lunkit-helper".into())
        .spawn(job)
        .map(drop)
}

/// Has at least `n` pool threads waiting or starting, starting the missing ones from one new
/// thread, so that the caller pays for one start whatever `n` is. Call it ahead of the calls
/// that need them, where the caller would wait anyway (for a kernel call, for a daemon):
/// starting a thread takes milliseconds on a slow or emulated machine, and the calls it would
/// delay are on the critical path.
pub(crate) fn prewarm(n: usize) {
    let missing = {
        let mut pool = lock(&POOL);
        let missing = n.saturating_sub(pool.idle + pool.starting);
        pool.starting += missing;
        missing
    };
    if missing == 0 {
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("lunkit-helper".into())
        .spawn(move || {
            for started in 1..missing {
                if spawn_worker().is_err() {
                    // Those not started will never take a call.
                    lock(&POOL).starting -= missing - started;
                    break;
                }
            }
            worker();
        });
    if spawned.is_err() {
        lock(&POOL).starting -= missing;
    }
}

/// Starts a pool thread.
fn spawn_worker() -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("lunkit-helper".into())
        .spawn(worker)
        .map(drop)
}

/// A pool thread's life: take queued calls and run them; exit once none came for
/// [`IDLE_FOR`]. Counted as starting until it first looks at the queue.
fn worker() {
    let mut pool = lock(&POOL);
    pool.starting -= 1;
    loop {
        if let Some(job) = pool.jobs.pop_front() {
            drop(pool);
            job();
            pool = lock(&POOL);
            continue;
        }
        pool.idle += 1;
        let (p, waited) = QUEUED
            .wait_timeout(pool, IDLE_FOR)
            .unwrap_or_else(PoisonError::into_inner);
        pool = p;
        pool.idle -= 1;
        if waited.timed_out() && pool.jobs.is_empty() {
            return;
        }
    }
}

/// How many pool threads wait for a call now.
#[cfg(test)]
fn idle_count() -> usize {
    lock(&POOL).idle
}

/// A helper's claim on its subject, given up when the helper's call has returned.
struct Owner(Subject);

impl Drop for Owner {
    fn drop(&mut self) {
        lock(&BUSY).remove(&self.0);
        FREED.notify_all();
    }
}

/// Registers `fd`, open on `dev`, as a helper's until the returned guard drops. Drop the
/// guard before the descriptor (declare it after), so that its number is never registered
/// while closed and possibly reused.
pub(crate) fn hold(fd: BorrowedFd<'_>, dev: DevNum) -> Held {
    let entry = (fd.as_raw_fd(), dev);
    lock(&HELD).push(entry);
    Held(entry)
}

/// See [`hold`].
#[must_use = "the descriptor is registered only while this lives"]
pub(crate) struct Held((RawFd, DevNum));

impl Drop for Held {
    fn drop(&mut self) {
        let mut held = lock(&HELD);
        if let Some(i) = held.iter().position(|e| *e == self.0) {
            held.swap_remove(i);
        }
    }
}

/// The descriptors of this process that helpers hold open now, with their devices.
pub(crate) fn held() -> Vec<(RawFd, DevNum)> {
    lock(&HELD).clone()
}

/// Runs `work` on every item of `items` side by side and returns each item's result, in
/// order: the one fan-out of the workflows (a volume's paths deleted or rescanned, an NVMe
/// subsystem's controllers connected, identified or deleted).
///
/// Every item but the last gets a scoped thread named `name`; the calling thread does the
/// last itself, since it would only wait otherwise. A worker that could not be started, or
/// whose `work` panicked (the calling thread's included), gives [`Error::Internal`] (or the
/// spawn's [`Error::Io`]) for its item, never a panic here. Each `work` must bound itself by the caller's deadline: this waits for every
/// worker (they are scoped), so it is meant for calls that already run under one, or that
/// hand their blocking part to [`bounded`].
pub(crate) fn fan_out<I: Sync, T: Send>(
    name: &str,
    items: &[I],
    work: impl Fn(&I) -> Result<T> + Sync,
) -> Vec<Result<T>> {
    let Some((last, others)) = items.split_last() else {
        return Vec::new();
    };
    let work = &work;
    std::thread::scope(|s| {
        let workers: Vec<_> = others
            .iter()
            .map(|item| {
                std::thread::Builder::new()
                    .name(name.to_owned())
                    .spawn_scoped(s, move || work(item))
            })
            .collect();
        let here = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work(last)))
            .unwrap_or_else(|_| panicked(name));
        workers
            .into_iter()
            .map(|w| match w {
                Ok(h) => h.join().unwrap_or_else(|_| panicked(name)),
                Err(e) => Err(Error::io(format!("({name} worker thread)"), e)),
            })
            .chain([here])
            .collect()
    })
}

/// What [`fan_out`] gives for an item whose work panicked.
fn panicked<T>(name: &str) -> Result<T> {
    Err(Error::Internal {
        what: format!("a {name} worker panicked"),
    })
}

#[cfg(test)]
mod tests;

//! Waiting for the kernel: uevents as the fast path, sysfs re-checks as the safety net.
//!
//! A waiter subscribes to uevents before the caller acts, then alternates between checking
//! the condition in sysfs and sleeping on the uevent socket. A relevant event wakes it at once;
//! without one it re-checks on a backoff that starts at 2 ms and doubles to 100 ms, because
//! uevents never reach a non-initial network namespace and are dropped on queue overflow. Every
//! wait ends in the value, the check's own error, or [`Error::Timeout`] naming what it waited for.

use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::uevent::{Receive, Received, Uevent};

/// First re-check interval.
const BACKOFF_START: Duration = Duration::from_millis(2);
/// Longest interval between re-checks.
const BACKOFF_MAX: Duration = Duration::from_millis(100);

/// The instant `timeout` after `start`, never panicking: a timeout too long for [`Instant`]
/// (`Duration::MAX`, `1e19` seconds) waits as long as one can, about a century.
///
/// `Instant + Duration` panics on overflow, and timeouts come from users; every deadline in
/// lunkit is made here.
pub fn deadline_from(start: Instant, timeout: Duration) -> Instant {
    /// Longer than any wait can matter, short enough for every clock to represent.
    const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
    start
        .checked_add(timeout)
        .or_else(|| start.checked_add(CENTURY))
        .unwrap_or(start)
}

/// [`deadline_from`] now.
pub fn deadline_after(timeout: Duration) -> Instant {
    deadline_from(Instant::now(), timeout)
}

/// The pause between tries of something that fails for a moment (a busy map, a held lock, a
/// round of detach): it doubles from `first` up to `max` and never runs past a deadline.
/// Every retry loop in lunkit sleeps through one, so they all back off the same way.
#[derive(Debug, Clone)]
pub struct Backoff {
    next: Duration,
    max: Duration,
}

impl Backoff {
    /// Pauses of `first`, then twice as long each time, up to `max`.
    pub const fn new(first: Duration, max: Duration) -> Backoff {
        Backoff { next: first, max }
    }

    /// When to wake from the next pause, starting at `now`: never after `deadline`.
    pub fn wake(&mut self, now: Instant, deadline: Instant) -> Instant {
        let wake = deadline_from(now, self.next).min(deadline);
        self.next = (self.next * 2).min(self.max);
        wake
    }

    /// Sleeps the next pause, cut short at `deadline`.
    pub fn sleep(&mut self, deadline: Instant) {
        let now = Instant::now();
        std::thread::sleep(self.wake(now, deadline).saturating_duration_since(now));
    }
}

/// Waits until `check` returns `Some`, or `deadline` passes.
///
/// `monitor` should have been opened before the action whose effect is awaited; `None` (the
/// socket could not be opened, e.g. under a seccomp profile) falls back to re-checks alone.
/// `relevant` says which uevents may have changed the answer. `what` names the condition in
/// the timeout error.
pub fn until<T, M: Receive + ?Sized>(
    mut monitor: Option<&mut M>,
    deadline: Instant,
    what: &dyn Fn() -> String,
    relevant: &dyn Fn(&Uevent) -> bool,
    check: impl FnMut() -> Result<Option<T>>,
) -> Result<T> {
    let mut sleep = |wake: Instant| -> Result<()> {
        match monitor.as_deref_mut() {
            Some(m) => loop {
                match m.recv(Some(wake))? {
                    Received::Event(ev) if relevant(&ev) => return Ok(()),
                    Received::Event(_) => continue,
                    Received::Overflow | Received::TimedOut => return Ok(()),
                }
            },
            None => {
                std::thread::sleep(wake.saturating_duration_since(Instant::now()));
                Ok(())
            }
        }
    };
    until_with(deadline, what, &mut sleep, check)
}

/// Waits until `check` returns `Some`, or `deadline` passes, re-checking on the backoff
/// alone: for conditions no uevent announces (a lock released, a map no longer busy).
pub fn until_polled<T>(
    deadline: Instant,
    what: &dyn Fn() -> String,
    check: impl FnMut() -> Result<Option<T>>,
) -> Result<T> {
    let mut sleep = |wake: Instant| -> Result<()> {
        std::thread::sleep(wake.saturating_duration_since(Instant::now()));
        Ok(())
    };
    until_with(deadline, what, &mut sleep, check)
}

/// The loop behind [`until`], for waits whose wake-up source is not the kernel's uevent
/// socket: `sleep(wake)` returns at `wake` at the latest, earlier when something happened
/// that may have changed the answer. The re-check backoff and the deadline are the same.
pub fn until_with<T>(
    deadline: Instant,
    what: &dyn Fn() -> String,
    sleep: &mut dyn FnMut(Instant) -> Result<()>,
    mut check: impl FnMut() -> Result<Option<T>>,
) -> Result<T> {
    let start = Instant::now();
    let mut backoff = Backoff::new(BACKOFF_START, BACKOFF_MAX);
    loop {
        if let Some(v) = check()? {
            return Ok(v);
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(Error::Timeout {
                what: what(),
                waited: now - start,
            });
        }
        sleep(backoff.wake(now, deadline))?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_its_cap_and_stops_at_the_deadline() {
        let t0 = Instant::now();
        let far = t0 + Duration::from_secs(60);
        let mut b = Backoff::new(Duration::from_millis(20), Duration::from_millis(100));
        let pauses: Vec<u128> = (0..5).map(|_| (b.wake(t0, far) - t0).as_millis()).collect();
        assert_eq!(pauses, [20, 40, 80, 100, 100]);
        let near = t0 + Duration::from_millis(30);
        assert_eq!(b.wake(t0, near), near);
        // A deadline already passed is not slept past either.
        assert_eq!(b.wake(near, t0), t0);
    }

    #[test]
    fn returns_as_soon_as_the_check_holds() {
        let mut n = 0;
        let v = until_polled(
            Instant::now() + Duration::from_secs(5),
            &|| "x".into(),
            || {
                n += 1;
                Ok((n == 3).then_some(n))
            },
        )
        .unwrap();
        assert_eq!(v, 3);
    }

    #[test]
    fn times_out_naming_the_condition() {
        let t0 = Instant::now();
        let err = until_polled::<()>(
            t0 + Duration::from_millis(50),
            &|| "block device of 2:0:0:7".into(),
            || Ok(None),
        )
        .unwrap_err();
        match err {
            Error::Timeout { what, waited } => {
                assert_eq!(what, "block device of 2:0:0:7");
                assert!(waited >= Duration::from_millis(50));
            }
            e => panic!("{e}"),
        }
    }

    #[test]
    fn check_errors_end_the_wait() {
        let err = until_polled::<()>(
            Instant::now() + Duration::from_secs(5),
            &|| "x".into(),
            || {
                Err(Error::NotFound {
                    what: "SCSI device 9:0:0:0".into(),
                })
            },
        )
        .unwrap_err();
        assert!(matches!(err, Error::NotFound { .. }));
    }

    #[test]
    fn deadlines_of_huge_timeouts_do_not_panic() {
        let t0 = Instant::now();
        assert!(deadline_from(t0, Duration::MAX) > t0 + Duration::from_secs(86_400 * 365));
        assert!(deadline_from(t0, Duration::from_secs_f64(1e19)) > t0);
        assert_eq!(
            deadline_from(t0, Duration::from_secs(5)),
            t0 + Duration::from_secs(5)
        );
    }
}

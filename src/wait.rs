//! Waiting for the kernel: uevents as the fast path, sysfs re-checks as the safety net.
//!
//! A waiter subscribes to uevents before the caller acts, then alternates between checking
//! the condition in sysfs and sleeping on the uevent socket. A relevant event wakes it at once;
//! without one it re-checks on a backoff that starts at 2 ms and doubles to 100 ms, because
//! uevents never reach a non-initial network namespace and are dropped on queue overflow. Every
//! wait ends in the value, the check's own error, or [`Error::Timeout`] naming what it waited for.

use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::uevent::{Monitor, Received, Uevent};

/// First re-check interval.
const BACKOFF_START: Duration = Duration::from_millis(2);
/// Longest interval between re-checks.
const BACKOFF_MAX: Duration = Duration::from_millis(100);

/// Waits until `check` returns `Some`, or `deadline` passes.
///
/// `monitor` should have been opened before the action whose effect is awaited; `None` (the
/// socket could not be opened, e.g. under a seccomp profile) falls back to re-checks alone.
/// `relevant` says which uevents may have changed the answer. `what` names the condition in
/// the timeout error.
pub fn until<T>(
    mut monitor: Option<&mut Monitor>,
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
    let mut backoff = BACKOFF_START;
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
        let wake = (now + backoff).min(deadline);
        backoff = (backoff * 2).min(BACKOFF_MAX);
        sleep(wake)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn returns_as_soon_as_the_check_holds() {
        let mut n = 0;
        let v = until(
            None,
            Instant::now() + Duration::from_secs(5),
            &|| "x".into(),
            &|_| true,
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
        let err = until::<()>(
            None,
            t0 + Duration::from_millis(50),
            &|| "block device of 2:0:0:7".into(),
            &|_| true,
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
        let err = until::<()>(
            None,
            Instant::now() + Duration::from_secs(5),
            &|| "x".into(),
            &|_| true,
            || {
                Err(Error::NotFound {
                    what: "SCSI device 9:0:0:0".into(),
                })
            },
        )
        .unwrap_err();
        assert!(matches!(err, Error::NotFound { .. }));
    }
}

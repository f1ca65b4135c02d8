//! Polling with a deadline: the lab waits on the kernel and daemons, and every wait must end.

use std::time::{Duration, Instant};

use super::Result;

/// Polls `probe` with a short growing backoff until it returns `Some`, fails after `timeout`
/// with `what` and the last state `probe` described (through `Err` it can stop early).
pub fn until<T>(
    what: &str,
    timeout: Duration,
    mut probe: impl FnMut() -> Result<Option<T>>,
) -> Result<T> {
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_millis(10);
    loop {
        if let Some(v) = probe()? {
            return Ok(v);
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(format!("timed out after {timeout:?} waiting for {what}").into());
        }
        std::thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(Duration::from_millis(200));
    }
}

/// [`until`] for a condition without a value.
pub fn until_true(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) -> Result<()> {
    until(what, timeout, || Ok(cond().then_some(())))
}

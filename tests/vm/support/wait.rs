//! Polling with a deadline: the lab waits on the kernel and daemons, and every wait must end.

use std::time::{Duration, Instant};

use super::Result;

/// Polls `probe` with a short growing backoff until it returns `Some`, fails after `timeout`
/// with `what` and the last state `probe` described (through `Err` it can stop early).
pub fn until<T>(
    what: &str,
    timeout: Duration,
    probe: impl FnMut() -> Result<Option<T>>,
) -> Result<T> {
    until_progressing(what, timeout, timeout, || (), probe)
}

/// [`until`] for a condition without a value.
pub fn until_true(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) -> Result<()> {
    until(what, timeout, || Ok(cond().then_some(())))
}

/// [`until`] for a wait on other programs' work, bounded by their progress rather than by one
/// fixed time: it fails when `activity` has not changed for `stall`, and in any case after
/// `cap`. A daemon that is slow because the machine is busy (TCG, a burst of devices) gets the
/// time it needs; one that is stuck is reported after `stall`.
pub fn until_progressing<T, A: PartialEq>(
    what: &str,
    stall: Duration,
    cap: Duration,
    mut activity: impl FnMut() -> A,
    mut probe: impl FnMut() -> Result<Option<T>>,
) -> Result<T> {
    let start = Instant::now();
    let deadline = start + cap;
    let mut last = activity();
    let mut since = start;
    let mut pause = Duration::from_millis(10);
    loop {
        if let Some(v) = probe()? {
            return Ok(v);
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(format!("timed out after {cap:?} waiting for {what}").into());
        }
        let seen = activity();
        if seen != last {
            (last, since) = (seen, now);
        }
        if now - since >= stall {
            return Err(format!(
                "gave up waiting for {what} after {:?}: nothing progressed for {stall:?}",
                now - start
            )
            .into());
        }
        std::thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(Duration::from_millis(200));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stall_ends_the_wait_and_progress_extends_it() {
        let ms = Duration::from_millis;
        let e = until_progressing("x", ms(30), ms(5000), || 0, || Ok(None::<()>)).unwrap_err();
        assert!(e.to_string().contains("nothing progressed"), "{e}");

        // Activity that keeps changing outlives the stall time, and the probe gets its turn.
        let mut tick = 0u32;
        let mut polls = 0u32;
        let got = until_progressing(
            "y",
            ms(30),
            ms(60_000),
            || {
                tick += 1;
                tick
            },
            || {
                polls += 1;
                Ok((polls == 6).then_some(polls))
            },
        )
        .unwrap();
        assert_eq!(got, 6);

        let e =
            until_progressing("z", ms(5000), ms(30), Instant::now, || Ok(None::<()>)).unwrap_err();
        assert!(e.to_string().contains("timed out after"), "{e}");
    }
}

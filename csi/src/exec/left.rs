//! The children [`run_on`](super::run_on) left at their deadline still in the kernel, by
//! device, until their reaper thread has reaped them: see the module page of
//! [`exec`](super).

use std::path::PathBuf;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use lunkit::DevNum;
use lunkit::block::BlockNode;

use super::Program;
use crate::error::{Error, Result};

/// A program [`run_on`](super::run_on) a device, killed at its deadline and not yet exited: stuck in the
/// kernel (`D` state) with the device open, as a `blkid` or `mkfs` on a map that queues I/O
/// with no path is.
#[derive(Debug, Clone)]
pub struct Abandoned {
    /// Its process id.
    pub pid: u32,
    /// What it is.
    pub program: Program,
    /// The device it was run on.
    pub device: PathBuf,
    /// That device's number.
    pub dev: DevNum,
    /// When it was killed.
    pub since: Instant,
}

impl Abandoned {
    pub(super) fn new(pid: u32, program: Program, device: &BlockNode) -> Abandoned {
        Abandoned {
            pid,
            program,
            device: device.path.clone(),
            dev: device.dev,
            since: Instant::now(),
        }
    }
}

impl std::fmt::Display for Abandoned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the plugin's {} (pid {}) on {} ({}) was killed at its deadline {:.1}s ago and has not exited (stuck in the kernel, holding the device open)",
            self.program.name(),
            self.pid,
            self.device.display(),
            self.dev,
            self.since.elapsed().as_secs_f64()
        )
    }
}

/// The children [`run_on`](super::run_on) left at their deadline that have not exited yet.
static LEFT: Mutex<Vec<Abandoned>> = Mutex::new(Vec::new());
/// Signalled whenever one of [`LEFT`] is reaped.
static ENDED: Condvar = Condvar::new();

/// Every section under the lock is one push or retain: a poisoned lock is used as is.
fn lock_left() -> MutexGuard<'static, Vec<Abandoned>> {
    LEFT.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Lists `a` until [`forget`] of its pid.
pub(super) fn register(a: Abandoned) {
    lock_left().push(a);
}

/// Forgets the child `pid`, reaped, and wakes [`wait_abandoned`].
pub(super) fn forget(pid: u32) {
    lock_left().retain(|a| a.pid != pid);
    ENDED.notify_all();
}

/// Whether any child [`run_on`](super::run_on) a device is left stuck now.
pub fn any_abandoned() -> bool {
    !lock_left().is_empty()
}

/// The plugin's children left stuck on device `dev` ([`Abandoned`]), oldest first.
pub fn abandoned(dev: DevNum) -> Vec<Abandoned> {
    lock_left()
        .iter()
        .filter(|a| a.dev == dev)
        .cloned()
        .collect()
}

/// Waits until none of the plugin's children left stuck on `device` ([`Abandoned`]) is
/// there, at most until `deadline`; then [`Error::DeadlineExceeded`] naming each. An
/// unstage calls it before it checks the device for users, so that the plugin's own
/// `blkid` or `mkfs` is waited for and named as such, never reported as a user.
pub fn wait_abandoned(device: &BlockNode, deadline: Instant) -> Result<()> {
    let mut left = lock_left();
    loop {
        let stuck: Vec<String> = left
            .iter()
            .filter(|a| a.dev == device.dev)
            .map(ToString::to_string)
            .collect();
        if stuck.is_empty() {
            return Ok(());
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(Error::DeadlineExceeded(format!(
                "{}; {} is not taken away while it does (it ends when its I/O completes or fails)",
                stuck.join("; "),
                device.path.display()
            )));
        }
        left = ENDED
            .wait_timeout(left, deadline - now)
            .unwrap_or_else(PoisonError::into_inner)
            .0;
    }
}

//! udevd in the guest. virtme-ng's init already starts `systemd-udevd`, so usually there is
//! nothing to do; multipathd needs it (it reads path WWIDs from the udev database). Tests of
//! lunkit without udev (docs/DESIGN.md, "udev is optional") can [`stop`] it.

use std::path::Path;
use std::time::Duration;

use super::{Result, cmd, wait};

const CONTROL: &str = "/run/udev/control";

/// Whether udevd is listening (the same check lunkit makes: its control socket exists).
pub fn running() -> bool {
    Path::new(CONTROL).exists()
}

/// Starts udevd unless it already runs; starting a second one would fight over the socket.
pub fn ensure_running() -> Result<()> {
    if running() {
        return Ok(());
    }
    cmd::run("/lib/systemd/systemd-udevd", &["--daemon"])?;
    wait::until_true("udevd's control socket", Duration::from_secs(10), running)?;
    cmd::run("udevadm", &["trigger", "--action=add"])?;
    settle(Duration::from_secs(30))
}

/// Waits until udevd has processed the queued events: fails once `timeout` passed in which
/// udevd recorded nothing new (its database under `/run/udev/data` did not change), or
/// after 10 minutes in all.
///
/// Not one fixed deadline: under TCG, a guest beside other guests on a loaded host took more
/// than 30 s over a lab's burst of devices while udevd was working all along, and a
/// fixed `udevadm settle --timeout=30` failed two tests that way.
///
/// A settle when the kernel has sent no uevent since the last one that succeeded in this
/// process (`/sys/kernel/uevent_seqnum` unchanged) has nothing to wait for and runs no
/// `udevadm` (a process costs 0.1 to 1 s under TCG).
pub fn settle(timeout: Duration) -> Result<()> {
    let seqnum = uevent_seqnum();
    if seqnum.is_some() && seqnum == *SETTLED_AT.lock().unwrap_or_else(|e| e.into_inner()) {
        return Ok(());
    }
    let once = timeout.min(Duration::from_secs(5)).as_secs().max(1);
    wait::until_progressing(
        "udev's queue to empty",
        timeout,
        Duration::from_secs(600),
        newest_record,
        || {
            let empty = cmd::run("udevadm", &["settle", &format!("--timeout={once}")]).is_ok();
            Ok(empty.then_some(()))
        },
    )?;
    *SETTLED_AT.lock().unwrap_or_else(|e| e.into_inner()) = seqnum;
    Ok(())
}

/// The kernel's uevent sequence number when the last [`settle`] began that succeeded: every
/// event up to it has been handled.
static SETTLED_AT: std::sync::Mutex<Option<u64>> = std::sync::Mutex::new(None);

/// The number of the last uevent the kernel sent (`/sys/kernel/uevent_seqnum`).
pub fn uevent_seqnum() -> Option<u64> {
    std::fs::read_to_string("/sys/kernel/uevent_seqnum")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The newest change to udevd's database: it writes a device's record as it finishes each
/// event.
fn newest_record() -> Option<std::time::SystemTime> {
    std::fs::read_dir("/run/udev/data")
        .ok()?
        .flatten()
        .filter_map(|e| e.metadata().ok()?.modified().ok())
        .max()
}

/// Stops udevd and waits until it is gone. Its control socket file can outlive it, and lunkit
/// takes that file as "udevd runs", so a stale one is removed.
pub fn stop() -> Result<()> {
    cmd::run_ignoring_failure("udevadm", &["control", "--exit"]);
    let gone = || !cmd::process_running("systemd-udevd");
    // `--exit` lets udevd finish its queue first, which a guest sharing a busy host's cores
    // can take past half a minute: then it is told with a signal.
    if wait::until_true("udevd to exit", Duration::from_secs(30), gone).is_err() {
        cmd::run_ignoring_failure("pkill", &["-TERM", "-x", "systemd-udevd"]);
        wait::until_true("udevd to exit on SIGTERM", Duration::from_secs(30), gone)?;
    }
    match std::fs::remove_file(CONTROL) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(format!("remove {CONTROL}: {e}").into())
        }
        _ => Ok(()),
    }
}

/// udevd stopped for a test, started again on drop (the next test may need it).
#[derive(Debug)]
pub struct Stopped;

impl Stopped {
    /// Stops udevd (see [`stop`]).
    pub fn new() -> Result<Stopped> {
        stop()?;
        Ok(Stopped)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        if let Err(e) = ensure_running() {
            eprintln!("restarting udevd: {e}");
        }
    }
}

/// A property udevd recorded for the block device numbered `dev` (`major:minor`, as sysfs's
/// `dev` attribute spells it): the `E:KEY=value` line of `/run/udev/data/b<dev>`. `None` when
/// udevd has no record of the device or the record no such key. multipath-tools takes a
/// path's WWID from `ID_SERIAL` here.
pub fn property(dev: impl std::fmt::Display, key: &str) -> Option<String> {
    let db = std::fs::read_to_string(format!("/run/udev/data/b{dev}")).ok()?;
    db.lines()
        .filter_map(|l| l.strip_prefix("E:"))
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
        .map(str::to_owned)
}

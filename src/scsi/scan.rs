//! Bringing one LUN in on every path at once, with an outcome for each path (the module docs
//! of [`crate::scsi`] say how).

use std::fmt;
use std::time::{Duration, Instant};

use crate::error::{Error, ErrorKind, Result};
use crate::id::Hctl;
use crate::id::Wwid;
use crate::root::Root;
use crate::scsi::{self, PathDevice, ScanTarget, Triggered};
use crate::uevent::{Subscription, Uevent};
use crate::wait;

/// Default time a scan waits for its block devices.
pub const DEFAULT_SCAN_TIMEOUT: Duration = Duration::from_secs(30);

/// How a scan behaves. The default: 30 s, any WWID, one path.
///
/// ```
/// let mut opts = lunkit::ScanOptions::default();
/// opts.timeout = std::time::Duration::from_secs(10);
/// opts.min_paths = 2;
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ScanOptions {
    /// How long to wait for every path's block device to appear and open.
    pub timeout: Duration,
    /// The WWID the volume must have; a path with another one is rejected with
    /// [`Error::WwidMismatch`] (a reused LUN number is not the old volume).
    pub expect_wwid: Option<Wwid>,
    /// How many paths must come for the scan to succeed (default 1). Fewer is
    /// [`Error::MissingPaths`], with every path's outcome.
    pub min_paths: usize,
}

impl Default for ScanOptions {
    fn default() -> Self {
        ScanOptions {
            timeout: DEFAULT_SCAN_TIMEOUT,
            expect_wwid: None,
            min_paths: 1,
        }
    }
}

/// What became of one path.
#[derive(Debug)]
#[non_exhaustive]
pub enum PathOutcome {
    /// The LUN came: its block device exists and opens.
    Found(PathDevice),
    /// The target did not report the LUN on this path (masked, or not mapped to this
    /// initiator or portal): the kernel made no SCSI device for it.
    NotReported,
    /// The deadline passed first: the [`Error::Timeout`] names what was still awaited, the
    /// scan write (the device is not answering) or the disk (not yet probed, or not opening).
    TimedOut(Error),
    /// The scan failed on this path (the write's errno, or the device vanished meanwhile).
    Failed(Error),
    /// Not scanned: the transport says this path cannot reach the LUN now (why).
    Skipped(String),
}

impl PathOutcome {
    /// A short stable name: `found`, `not-reported`, `timed-out`, `failed`, `skipped`.
    pub fn as_str(&self) -> &'static str {
        match self {
            PathOutcome::Found(_) => "found",
            PathOutcome::NotReported => "not-reported",
            PathOutcome::TimedOut(_) => "timed-out",
            PathOutcome::Failed(_) => "failed",
            PathOutcome::Skipped(_) => "skipped",
        }
    }
}

impl fmt::Display for PathOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PathOutcome::Found(p) => write!(f, "found {}", p.name),
            PathOutcome::NotReported => f.write_str("not reported by the target"),
            PathOutcome::TimedOut(e) => write!(f, "{e}"),
            PathOutcome::Failed(e) => write!(f, "failed: {e}"),
            PathOutcome::Skipped(why) => write!(f, "skipped: {why}"),
        }
    }
}

/// When things happened on one path, as offsets from the call that scanned it (before the
/// transport's paths were read): `write_start` of the first path is what the library did
/// before the kernel had anything to do.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PathTiming {
    /// The scan (or rescan) write began.
    pub write_start: Option<Duration>,
    /// The write returned (absent when it was still blocked at the deadline).
    pub write_end: Option<Duration>,
    /// The block device was seen to open.
    pub ready: Option<Duration>,
}

/// One path of a scan and its outcome.
#[derive(Debug)]
pub struct PathScan {
    /// The path as its transport names it: `session3 (10.0.0.1:3260)`, `host5 rport-5:0-0`,
    /// or `host5` for an address scan.
    pub via: String,
    /// The address the LUN has, or would have, on this path.
    pub hctl: Option<Hctl>,
    /// What became of it.
    pub outcome: PathOutcome,
    /// When its write and its device came.
    pub timing: PathTiming,
}

impl PathScan {
    /// The path device, when the LUN came on this path.
    pub fn device(&self) -> Option<&PathDevice> {
        match &self.outcome {
            PathOutcome::Found(p) => Some(p),
            _ => None,
        }
    }
}

impl fmt::Display for PathScan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.hctl {
            Some(h) => write!(f, "{h} via {}: {}", self.via, self.outcome),
            None => write!(f, "{}: {}", self.via, self.outcome),
        }
    }
}

/// Every path of a scan, in the order the transport listed them.
#[derive(Debug)]
pub struct ScanReport {
    /// One entry per path, scanned or skipped.
    pub paths: Vec<PathScan>,
    /// How long the scan took, from the call (before the transport's paths were read) to the
    /// last outcome.
    pub elapsed: Duration,
}

impl ScanReport {
    /// The path devices that came, in path order.
    pub fn devices(&self) -> impl Iterator<Item = &PathDevice> {
        self.paths.iter().filter_map(PathScan::device)
    }

    /// The path devices that came, taken out of the report.
    pub fn into_devices(self) -> Vec<PathDevice> {
        self.paths
            .into_iter()
            .filter_map(|p| match p.outcome {
                PathOutcome::Found(d) => Some(d),
                _ => None,
            })
            .collect()
    }

    /// The volume's WWID, as its paths report it (they agree, or the scan failed).
    pub fn wwid(&self) -> Option<&Wwid> {
        self.devices().find_map(|p| p.wwid.as_ref())
    }
}

/// The paths' outcomes as one line: `6:0:0:3 via session1 (…): found sdc; …`.
pub(crate) fn describe_paths(paths: &[PathScan]) -> String {
    let v: Vec<String> = paths.iter().map(ToString::to_string).collect();
    v.join("; ")
}

/// A path a transport offers to a scan.
#[derive(Debug, Clone)]
pub(crate) enum Candidate {
    /// Scan it: write `target.request` to its host.
    Scan {
        /// The path's name ([`PathScan::via`]).
        via: String,
        /// What to write where.
        target: ScanTarget,
    },
    /// Known, but not scannable now.
    Skip {
        /// The path's name.
        via: String,
        /// The LUN's address on it, when the path has a SCSI target.
        hctl: Option<Hctl>,
        /// Why it is not scanned.
        why: String,
    },
}

impl Candidate {
    fn via_mut(&mut self) -> &mut String {
        match self {
            Candidate::Scan { via, .. } | Candidate::Skip { via, .. } => via,
        }
    }
}

/// Completes the candidates' names ([`PathScan::via`]) where that costs reads of its own (an
/// iSCSI session's portal), given each name in turn. [`scan_paths`] asks once every write is
/// in flight, so those reads happen while the kernel probes, off the scan's critical path.
pub(crate) type Namer<'a> = &'a dyn Fn(usize) -> Option<String>;

/// A [`Namer`] for transports whose candidates come named.
pub(crate) fn named(_: usize) -> Option<String> {
    None
}

fn complete_names(candidates: &mut [Candidate], namer: Namer<'_>) {
    for (i, c) in candidates.iter_mut().enumerate() {
        if let Some(more) = namer(i) {
            let via = c.via_mut();
            via.push(' ');
            via.push_str(&more);
        }
    }
}

/// Scans `lun` (named `what` in errors: `LUN 3 of iSCSI target iqn…`) through every
/// candidate at once and waits for every path until the deadline, [`ScanOptions::timeout`]
/// after `start`: when the transport's call began, so that reading its paths counts against
/// the caller's timeout and in the timings.
///
/// Errors: `none()` when there is no candidate at all (the transport's "no logged-in
/// session" or "no online port"), [`Error::MissingPaths`] listing the skipped paths when
/// there are candidates but none can be scanned; [`Error::WwidMismatch`] when a path's WWID differs from the expected one or from
/// the other paths', naming that path; [`Error::MissingPaths`] when fewer than
/// [`ScanOptions::min_paths`] came (with a single scanned path, that path's own error
/// instead: not reported is [`Error::NotFound`], a timeout is [`Error::Timeout`]);
/// [`Error::Busy`] or [`Error::Unverified`] for the whole volume when a device at the LUN's
/// address is (or may be) still used as another volume, before any path is waited for.
pub(crate) fn scan_paths(
    root: &Root,
    what: &str,
    start: Instant,
    mut candidates: Vec<Candidate>,
    namer: Namer<'_>,
    none: &dyn Fn() -> Error,
    opts: &ScanOptions,
) -> Result<ScanReport> {
    let scans = candidates
        .iter()
        .filter(|c| matches!(c, Candidate::Scan { .. }))
        .count();
    if scans == 0 {
        return Err(nothing_to_scan(what, candidates, namer, none, opts));
    }
    let deadline = wait::deadline_from(start, opts.timeout);
    // Subscribe before acting so no block device's `add` can slip past.
    let mut monitor = Subscription::open().ok();
    crate::helper::prewarm(scans);
    let started = start_writes(
        root,
        &candidates,
        start,
        opts.expect_wwid.as_ref(),
        deadline,
    );
    complete_names(&mut candidates, namer);
    let triggered = finish_writes(started, start, deadline);
    let triggered = refuse_if_held_as_another(what, triggered)?;
    let new_paths = added(&candidates, &triggered);
    let (mut paths, pending) = outcomes(candidates, triggered);
    wait_ready(root, monitor.as_mut(), &mut paths, pending, start, deadline)?;
    let report = ScanReport {
        paths,
        elapsed: start.elapsed(),
    };
    check_wwids(&report, opts.expect_wwid.as_ref(), new_paths)?;
    let found = report.devices().count();
    if found >= opts.min_paths.max(1) {
        return Ok(report);
    }
    Err(too_few(what, report, opts.min_paths.max(1)))
}

/// Nothing to write to, before any wait: the transport's own "no session/port" error
/// (`none`) when it knows no path at all; when it knows paths but none can be scanned now
/// (every FC port Blocked, every session in recovery), [`Error::MissingPaths`] with each of
/// them and why, so that the caller sees which paths exist and what keeps them out.
fn nothing_to_scan(
    what: &str,
    mut candidates: Vec<Candidate>,
    namer: Namer<'_>,
    none: &dyn Fn() -> Error,
    opts: &ScanOptions,
) -> Error {
    if candidates.is_empty() {
        return none();
    }
    complete_names(&mut candidates, namer);
    let paths = candidates
        .into_iter()
        .filter_map(|c| match c {
            Candidate::Skip { via, hctl, why } => Some(PathScan {
                via,
                hctl,
                outcome: PathOutcome::Skipped(why),
                timing: PathTiming::default(),
            }),
            Candidate::Scan { .. } => None,
        })
        .collect();
    Error::MissingPaths {
        what: what.to_owned(),
        found: 0,
        wanted: opts.min_paths.max(1),
        paths,
    }
}

/// A path's write in flight, and when it began (from the transport's call).
type Started = Option<(Result<scsi::TriggerPending>, Duration)>;

/// Every write at once: each path's checks here, its write handed to a helper thread
/// (`helper::start`); `None` for a skipped candidate.
fn start_writes(
    root: &Root,
    candidates: &[Candidate],
    start: Instant,
    expect: Option<&Wwid>,
    deadline: Instant,
) -> Vec<Started> {
    candidates
        .iter()
        .map(|c| match c {
            Candidate::Scan { target, .. } => {
                let write_start = start.elapsed();
                Some((
                    scsi::trigger_start(root, target, expect, deadline),
                    write_start,
                ))
            }
            Candidate::Skip { .. } => None,
        })
        .collect()
}

/// A path's write and what it found, with its timings; `None` for a skipped candidate.
type Written = Option<(Result<Triggered>, PathTiming)>;

/// Each write waited for. A write stuck in the kernel is left to its helper at the deadline
/// (see `helper::bounded`), so this returns on time.
fn finish_writes(started: Vec<Started>, start: Instant, deadline: Instant) -> Vec<Written> {
    started
        .into_iter()
        .map(|s| {
            s.map(|(pending, write_start)| {
                let result = pending.and_then(|p| p.finish(deadline));
                let write_end = match &result {
                    Ok((_, at)) => Some(at.saturating_duration_since(start)),
                    Err(e) if e.kind() == ErrorKind::Timeout => None,
                    Err(_) => Some(start.elapsed()),
                };
                let timing = PathTiming {
                    write_start: Some(write_start),
                    write_end,
                    ready: None,
                };
                (result.map(|(t, _)| t), timing)
            })
        })
        .collect()
}

/// Every path with what its write found, and the indices of those whose device is present,
/// which wait for their disk to open (until then `TimedOut`).
fn outcomes(candidates: Vec<Candidate>, triggered: Vec<Written>) -> (Vec<PathScan>, Vec<usize>) {
    let mut paths: Vec<PathScan> = Vec::with_capacity(candidates.len());
    let mut pending: Vec<usize> = Vec::new();
    for (c, t) in candidates.into_iter().zip(triggered) {
        let (via, hctl, outcome, timing) = match (c, t) {
            (Candidate::Skip { via, hctl, why }, _) => {
                (via, hctl, PathOutcome::Skipped(why), PathTiming::default())
            }
            (Candidate::Scan { via, target }, Some((result, timing))) => {
                let outcome = match result {
                    Ok(Triggered::Present | Triggered::Added) => {
                        pending.push(paths.len());
                        // Until its disk opens, below; what a path still pending ends as.
                        PathOutcome::TimedOut(disk_timeout(target.hctl, Duration::ZERO))
                    }
                    Ok(Triggered::NotReported) => PathOutcome::NotReported,
                    Err(e) if e.kind() == ErrorKind::Timeout => PathOutcome::TimedOut(e),
                    Err(e) => PathOutcome::Failed(e),
                };
                (via, Some(target.hctl), outcome, timing)
            }
            (Candidate::Scan { via, target }, None) => {
                let e = Error::Internal {
                    what: format!("no scan worker result for {}", target.hctl),
                };
                (
                    via,
                    Some(target.hctl),
                    PathOutcome::Failed(e),
                    PathTiming::default(),
                )
            }
        };
        paths.push(PathScan {
            via,
            hctl,
            outcome,
            timing,
        });
    }
    (paths, pending)
}

/// A path whose device another volume still uses at this LUN number (its write refused as
/// [`ErrorKind::Busy`] or [`ErrorKind::Unverified`]: only the identity checks of
/// `scsi::trigger_start` refuse so) refuses the whole volume, before any path is waited for
/// or handed out: the other paths would give the new volume a second writer, the old user
/// writing through its stale path into the same LUN.
fn refuse_if_held_as_another(what: &str, triggered: Vec<Written>) -> Result<Vec<Written>> {
    let is_held = |t: &Written| matches!(t, Some((Err(e), _)) if matches!(e.kind(), ErrorKind::Busy | ErrorKind::Unverified));
    if !triggered.iter().any(is_held) {
        return Ok(triggered);
    }
    let held: Vec<Error> = triggered
        .into_iter()
        .filter(is_held)
        .filter_map(|t| t.and_then(|(r, _)| r.err()))
        .collect();
    Err(scsi::add::whole_volume_refusal(what, held))
}

/// The `sd` probes run asynchronously after the writes: waits for every pending path's disk
/// to appear and open. A path still pending at the deadline stays `TimedOut`. Each open
/// runs on a helper thread: those are started now, while the kernel probes.
fn wait_ready(
    root: &Root,
    monitor: Option<&mut Subscription>,
    paths: &mut [PathScan],
    mut pending: Vec<usize>,
    start: Instant,
    deadline: Instant,
) -> Result<()> {
    crate::helper::prewarm(pending.len());
    if pending.is_empty() {
        return Ok(());
    }
    let names: Vec<String> = pending
        .iter()
        .filter_map(|&i| paths[i].hctl.map(|h| h.to_string()))
        .collect();
    let what = || format!("block device of {} to appear and open", names.join(", "));
    // A disk of a pending path, not any disk: with many attaches at once, every other
    // volume's disks would wake each of them for a re-check that cannot succeed.
    let relevant = |ev: &Uevent| {
        ev.subsystem.as_deref() == Some("block") && names.iter().any(|n| ev.is_at_or_below(n))
    };
    let waited = wait::until(monitor, deadline, &what, &relevant, || {
        // Every pending path's open first, then each waited for: the opens overlap.
        let opening: Vec<(usize, Result<Option<scsi::ReadyPending>>)> = pending
            .iter()
            .filter_map(|&i| paths[i].hctl.map(|h| (i, scsi::ready_start(root, h))))
            .collect();
        pending.clear();
        for (i, started) in opening {
            match started.and_then(|o| o.map_or(Ok(None), |o| o.finish(deadline))) {
                Ok(Some((dev, opened))) => {
                    paths[i].outcome = PathOutcome::Found(dev);
                    // When its own open returned, not when it was waited for here.
                    paths[i].timing.ready = Some(opened.saturating_duration_since(start));
                }
                Ok(None) => pending.push(i),
                // The open was still blocked at the deadline: stays `TimedOut`.
                Err(e) if e.kind() == ErrorKind::Timeout => pending.push(i),
                Err(e) => paths[i].outcome = PathOutcome::Failed(e),
            }
        }
        Ok(pending.is_empty().then_some(()))
    });
    match waited {
        Ok(()) => Ok(()),
        Err(Error::Timeout { waited, .. }) => {
            for i in pending {
                if let Some(h) = paths[i].hctl {
                    paths[i].outcome = PathOutcome::TimedOut(disk_timeout(h, waited));
                }
            }
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// The timeout of a path whose disk did not come.
fn disk_timeout(hctl: Hctl, waited: Duration) -> Error {
    Error::Timeout {
        what: format!("block device of {hctl} to appear and open"),
        waited,
    }
}

/// Every path that came must carry the expected WWID, or, with none expected, the same one
/// as the first path that came. `new_paths` (the addresses this scan added) go into the
/// error.
fn check_wwids(report: &ScanReport, expect: Option<&Wwid>, new_paths: Vec<Hctl>) -> Result<()> {
    let mut devices = report.devices();
    let (reference, from) = match expect {
        Some(w) => (Some(w.clone()), None),
        None => match devices.next() {
            Some(first) => (first.wwid.clone(), Some(first)),
            None => return Ok(()),
        },
    };
    for p in devices {
        if p.wwid == reference {
            continue;
        }
        return Err(Error::WwidMismatch {
            device: format!("{} ({})", p.name, p.hctl),
            expected: reference,
            reference: from.map(|first| format!("{} ({})", first.name, first.hctl)),
            actual: p.wwid.clone(),
            new_paths,
        });
    }
    Ok(())
}

/// The error for a scan where fewer than `wanted` paths came.
fn too_few(what: &str, mut report: ScanReport, wanted: usize) -> Error {
    let scanned: Vec<usize> = (0..report.paths.len())
        .filter(|&i| !matches!(report.paths[i].outcome, PathOutcome::Skipped(_)))
        .collect();
    // One path scanned and it did not come: that path's own error says it best, and keeps
    // the messages of a single-address scan.
    if let ([i], 1) = (scanned.as_slice(), wanted) {
        let p = report.paths.swap_remove(*i);
        return match (p.outcome, p.hctl) {
            (PathOutcome::Failed(e) | PathOutcome::TimedOut(e), _) => e,
            (PathOutcome::NotReported, Some(h)) => Error::NotFound {
                what: format!(
                    "LUN {} behind host{} channel {} target {} not found (the target did not report it)",
                    h.lun, h.host, h.channel, h.target
                ),
            },
            (outcome, _) => Error::Internal {
                what: format!(
                    "scan of {what} through {}: {outcome} counted as missing",
                    p.via
                ),
            },
        };
    }
    Error::MissingPaths {
        what: what.to_owned(),
        found: report.devices().count(),
        wanted,
        paths: report.paths,
    }
}

/// The addresses whose SCSI device this scan's write made (not there before it): what a
/// caller refused for a WWID takes back, and nothing else.
fn added(candidates: &[Candidate], triggered: &[Written]) -> Vec<Hctl> {
    candidates
        .iter()
        .zip(triggered)
        .filter_map(|(c, t)| match (c, t) {
            (Candidate::Scan { target, .. }, Some((Ok(Triggered::Added), _))) => Some(target.hctl),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
#[path = "scan_tests.rs"]
mod tests;

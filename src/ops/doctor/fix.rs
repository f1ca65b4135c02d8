//! `doctor --fix`: each finding cleaned up as far as the detach rules allow, or left, with
//! the reason. The rules are the detach's, and so is the machinery: the in-use check runs
//! again right before each write, the identity the finding recorded (WWID, subsystem NQN)
//! is compared with what is there at the moment of the write, and every step has a deadline.
//!
//! - `scsi-device-down`: the device is deleted (`delete`). Its disk is not flushed: the kernel
//!   refuses every open of an offline device (`sd_open`), so a cache-flush could not be sent,
//!   and the in-use check found nothing that had it open.
//! - `remapped-path`: the path (never the map) is deleted; its map had I/O through it, which
//!   multipath retries on another path.
//! - `map-without-paths`, `map-paths-down`: the volume is detached by the map's WWID
//!   ([`crate::ops::detach()`]): queueing turned off only for a map nothing has open, its
//!   paths deleted, the map removed; a map still open waits for a path (nothing queued in it
//!   is dropped) until the deadline.
//! - `scsi-device-blocked` (opt-in): deleted as a down device is, if still blocked at the
//!   write (the kernel fails the commands of a blocked device it removes).
//! - `nvme-controller-down` (opt-in): the controller is deleted (`delete_controller`), under
//!   the subsystem's lock, unless lunkit marked a namespace of the subsystem attached.
//! - `idle-subsystem` (opt-in): each of its controllers is deleted, under the same lock and
//!   with the same mark check.
//! - `lun-gone`: the disk (never a map) is deleted if it still answers LOGICAL UNIT NOT
//!   SUPPORTED after the in-use check (a map's path checked with its map); not flushed,
//!   since nothing can reach a LUN the array no longer serves.
//! - `idle-session` (opt-in): left; the library has no iSCSI logout of its own (see
//!   [`NO_LOGOUT`]).
//! - `stale-name-record`, `stale-attach-mark`: the file is removed, under the volume's lock
//!   (and an NVMe subsystem's) that attach and detach take, once the node and the lock
//!   directory read again under it still show it stale with the same content. The lock
//!   directory is [`FixOptions::lock_dir`], which must be the examination's. An attach
//!   mark whose subsystem still has a controller on the node is left unless the kind is
//!   named (`not-selected`, opt-in).
//! - `remapped-address` (opt-in): left; no device is deleted for it, since the devices at
//!   the address may be a new volume someone attached: detach a lingering map of the
//!   recorded volume by its WWID; the next attach or detach at that address rewrites the
//!   record.
//!
//! ```no_run
//! use lunkit::Root;
//! use lunkit::ops::doctor::{self, DoctorOptions, FixOptions};
//!
//! let root = Root::default();
//! let found = doctor::examine(&root, &DoctorOptions::new(&root))?;
//! let fixes = doctor::fix(&root, &found, &FixOptions::new(&root))?;
//! for (f, o) in found.findings.iter().zip(&fixes.outcomes) {
//!     println!("{}: {} -> {o}", f.kind, f.objects.join(" "));
//! }
//! # Ok::<(), lunkit::Error>(())
//! ```

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::{Duration, Instant};

use super::records::REMAPPED;
use super::{Examination, Finding, Kind, classify, usage};
use crate::block::{self, Usage};
use crate::error::{Error, ErrorKind, Result};
use crate::id::{Hctl, Wwid};
use crate::ops::options::DetachOptions;
use crate::ops::report::{DetachReport, Outcome, StepKind};
use crate::ops::spec::VolumeSpec;
use crate::root::Root;
use crate::scsi::sysfs::ScsiState;
use crate::scsi::{self, Deleted, PathIdentity};
use crate::topology::Topology;

/// Why an `idle-session` finding is left even when asked for.
pub const NO_LOGOUT: &str = "lunkit's library has no iSCSI logout of its own (it speaks no \
     iSCSI netlink and never runs iscsiadm): log the session out with `iscsiadm -m session \
     -r SID -u`";

impl Kind {
    /// Every kind, in report order.
    pub const ALL: [Kind; 12] = [
        Kind::ScsiDeviceDown,
        Kind::ScsiDeviceBlocked,
        Kind::RemappedPath,
        Kind::MapWithoutPaths,
        Kind::MapPathsDown,
        Kind::IdleSession,
        Kind::NvmeControllerDown,
        Kind::IdleSubsystem,
        Kind::StaleNameRecord,
        Kind::RemappedAddress,
        Kind::StaleAttachMark,
        Kind::LunGone,
    ];

    /// The kinds `--fix` without a list cleans up: each takes away only what no path can use
    /// any more. Logging out a session and deleting a controller are asked for by name, and
    /// so is a map whose paths are all down: they may be `transport-offline` for an outage
    /// the kernel recovers from by itself (a session's `replacement_timeout` is seconds),
    /// and the map then serves a staged volume again. For the same reason a
    /// `scsi-device-down` finding is cleaned up by default only when the device is
    /// `offline` (the error handler gave up on it); a `transport-offline` one only when the
    /// kind is named. A stale name record or attach mark is a file of lunkit's own that
    /// names nothing on the node: removing it takes no device away. An attach mark whose
    /// subsystem still has a controller on the node is removed by default only when the
    /// kind is named: its namespace may be hidden for a moment, and the mark keeps the
    /// controllers it needs through a sibling's detach.
    pub const SAFE: [Kind; 6] = [
        Kind::ScsiDeviceDown,
        Kind::RemappedPath,
        Kind::MapWithoutPaths,
        Kind::StaleNameRecord,
        Kind::StaleAttachMark,
        Kind::LunGone,
    ];

    /// Whether a fix of this kind is only made when asked for by name.
    pub fn opt_in(self) -> bool {
        !Kind::SAFE.contains(&self)
    }
}

impl FromStr for Kind {
    type Err = Error;

    /// A kind by its name ([`Kind::as_str`]).
    fn from_str(s: &str) -> Result<Kind> {
        Kind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| {
                Error::invalid(
                    "doctor finding kind",
                    s,
                    "expected scsi-device-down, scsi-device-blocked, remapped-path, \
                     map-without-paths, map-paths-down, idle-session, nvme-controller-down, \
                     idle-subsystem, stale-name-record, remapped-address, stale-attach-mark \
                     or lun-gone",
                )
            })
    }
}

/// How [`fix`] behaves.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct FixOptions {
    /// The kinds to clean up; empty: [`Kind::SAFE`].
    pub kinds: Vec<Kind>,
    /// How long each finding's fix may take: its checks, writes and waits.
    pub timeout: Duration,
    /// Where the detach's cross-process lock files go (a map's removal is a detach).
    pub lock_dir: Option<PathBuf>,
    /// Ask multipathd to remove a map when it runs (so it does not re-create it).
    pub use_multipathd: bool,
}

impl FixOptions {
    /// The defaults for `root`: the safe kinds, 30 s a finding, locks as a detach takes them.
    pub fn new(root: &Root) -> FixOptions {
        let detach = DetachOptions::new(root);
        FixOptions {
            kinds: Vec::new(),
            timeout: Duration::from_secs(30),
            lock_dir: detach.lock_dir,
            use_multipathd: detach.use_multipathd,
        }
    }
}

/// What [`fix`] did with one finding.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum FixOutcome {
    /// Cleaned up: what was done.
    Fixed(String),
    /// Already gone when looked at again (taken away with its map, or by someone else).
    Gone,
    /// Left: something uses it, or the in-use check could not look everywhere (who, as a
    /// detach's refusal says it).
    InUse(String),
    /// Left: it is not what was found any more (another device at the address, a path that
    /// came back): why.
    Changed(String),
    /// Left: its kind was not asked for. `opt_in`: only naming it asks for it.
    NotSelected {
        /// The kind is not among [`Kind::SAFE`].
        opt_in: bool,
    },
    /// Left: lunkit cannot clean it up itself: why, and what can.
    Unsupported(String),
    /// Left: the attempt failed (the error).
    Failed(String),
}

impl FixOutcome {
    /// Its name in JSON: `fixed`, `gone`, `in-use`, `changed`, `not-selected`,
    /// `unsupported`, `failed`.
    pub fn as_str(&self) -> &'static str {
        match self {
            FixOutcome::Fixed(_) => "fixed",
            FixOutcome::Gone => "gone",
            FixOutcome::InUse(_) => "in-use",
            FixOutcome::Changed(_) => "changed",
            FixOutcome::NotSelected { .. } => "not-selected",
            FixOutcome::Unsupported(_) => "unsupported",
            FixOutcome::Failed(_) => "failed",
        }
    }

    /// Whether the finding is still on the node.
    pub fn is_left(&self) -> bool {
        !matches!(self, FixOutcome::Fixed(_) | FixOutcome::Gone)
    }

    /// The detail: what was done, or why it was left (`None` for [`FixOutcome::Gone`]).
    pub fn detail(&self) -> Option<String> {
        match self {
            FixOutcome::Gone => None,
            FixOutcome::NotSelected { opt_in: true } => {
                Some("an opt-in kind: name it (`--fix KIND`) to have it cleaned up".into())
            }
            FixOutcome::NotSelected { opt_in: false } => {
                Some("its kind was not among those asked for".into())
            }
            FixOutcome::Fixed(s)
            | FixOutcome::InUse(s)
            | FixOutcome::Changed(s)
            | FixOutcome::Unsupported(s)
            | FixOutcome::Failed(s) => Some(s.clone()),
        }
    }
}

impl fmt::Display for FixOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self, self.detail()) {
            (FixOutcome::Gone, _) => f.write_str("gone already"),
            (FixOutcome::Fixed(s), _) => write!(f, "fixed: {s}"),
            (_, Some(d)) => write!(f, "left ({}): {d}", self.as_str()),
            (_, None) => write!(f, "left ({})", self.as_str()),
        }
    }
}

/// What [`fix`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fixes {
    /// One outcome per finding of the examination, in its order.
    pub outcomes: Vec<FixOutcome>,
    /// How long it took.
    pub elapsed: Duration,
}

/// Cleans up what `found` ([`super::examine`]) reports, as far as the detach rules allow
/// (see the module docs), and says for each finding what it did or why it left it. Maps are
/// taken first: their paths' own findings are then gone.
///
/// # Errors
///
/// Those of [`Topology::read`] (the fresh look a map's removal is checked against, read
/// when one is to be removed). A
/// finding whose fix fails is [`FixOutcome::Failed`], and the others are still tried.
pub fn fix(root: &Root, found: &Examination, opts: &FixOptions) -> Result<Fixes> {
    let start = Instant::now();
    // Only a map's removal needs the fresh look (read once, only then).
    let maps = |f: &&Finding| rank(f.kind) == 0 && considered(f, &opts.kinds).is_none();
    let now = match found.findings.iter().any(|f| maps(&f)) {
        true => Some(Topology::read(root)?),
        false => None,
    };
    let mut order: Vec<usize> = (0..found.findings.len()).collect();
    order.sort_by_key(|&i| rank(found.findings[i].kind));
    let mut outcomes = vec![FixOutcome::Gone; found.findings.len()];
    for i in order {
        let f = &found.findings[i];
        outcomes[i] = considered(f, &opts.kinds).unwrap_or_else(|| {
            let deadline = crate::wait::deadline_after(opts.timeout);
            act(root, f, now.as_ref(), opts, deadline).unwrap_or_else(outcome_of)
        });
    }
    Ok(Fixes {
        outcomes,
        elapsed: start.elapsed(),
    })
}

/// Maps first, then the paths and devices that may have gone with them.
fn rank(kind: Kind) -> u8 {
    match kind {
        Kind::MapWithoutPaths | Kind::MapPathsDown => 0,
        _ => 1,
    }
}

/// Why `f` is not for this fix, before anything is looked at: its kind was not asked for
/// (`kinds` empty asks for [`Kind::SAFE`]), or lunkit cannot fix it. `None`: go on.
pub fn considered(f: &Finding, kinds: &[Kind]) -> Option<FixOutcome> {
    let asked = if kinds.is_empty() {
        !f.kind.opt_in()
    } else {
        kinds.contains(&f.kind)
    };
    if !asked {
        return Some(FixOutcome::NotSelected {
            opt_in: f.kind.opt_in(),
        });
    }
    match f.kind {
        Kind::IdleSession => Some(FixOutcome::Unsupported(NO_LOGOUT.into())),
        Kind::RemappedAddress => Some(FixOutcome::Unsupported(REMAPPED.into())),
        _ => None,
    }
}

/// What the in-use check found decides: [`FixOutcome::InUse`] when something uses the
/// devices or the check could not look everywhere; `None`: nothing does, go on.
pub fn verdict(usage: &Usage) -> Option<FixOutcome> {
    (!usage.is_empty()).then(|| FixOutcome::InUse(usage.to_string()))
}

/// A refusal by the machinery underneath is the same verdict; another device at the
/// address is a change; the rest failed.
fn outcome_of(e: Error) -> FixOutcome {
    match (e.kind(), &e) {
        (ErrorKind::Busy | ErrorKind::Unverified, _) => FixOutcome::InUse(e.to_string()),
        (_, Error::Replaced { .. }) => FixOutcome::Changed(e.to_string()),
        _ => FixOutcome::Failed(e.to_string()),
    }
}

fn act(
    root: &Root,
    f: &Finding,
    now: Option<&Topology>,
    opts: &FixOptions,
    deadline: Instant,
) -> Result<FixOutcome> {
    match f.kind {
        Kind::ScsiDeviceDown | Kind::ScsiDeviceBlocked => {
            let named = opts.kinds.contains(&f.kind);
            scsi_device(root, f, named, deadline)
        }
        Kind::RemappedPath => remapped_path(root, f, deadline),
        Kind::MapWithoutPaths | Kind::MapPathsDown => match now {
            Some(now) => map(root, f, now, opts, deadline),
            None => Err(Error::Internal {
                what: "a map's fix without the fresh look".into(),
            }),
        },
        Kind::NvmeControllerDown => nvme::controller(root, f, opts, deadline),
        Kind::IdleSubsystem => nvme::subsystem(root, f, opts, deadline),
        Kind::IdleSession => Ok(FixOutcome::Unsupported(NO_LOGOUT.into())),
        Kind::RemappedAddress => Ok(FixOutcome::Unsupported(REMAPPED.into())),
        Kind::StaleNameRecord | Kind::StaleAttachMark => {
            let named = opts.kinds.contains(&f.kind);
            super::records::fix(root, f, opts.lock_dir.as_deref(), named, deadline)
        }
        Kind::LunGone => super::lun_gone::fix(root, f, deadline),
    }
}

/// The finding's `i`th object.
fn object(f: &Finding, i: usize) -> Result<&str> {
    f.objects
        .get(i)
        .map(String::as_str)
        .ok_or_else(|| Error::Internal {
            what: format!("{} finding without its objects: {:?}", f.kind, f.objects),
        })
}

/// Why the WWID a device reports `now` is not the one `found` recorded; `None` when it is.
/// Both are compared as WWIDs (sysfs and multipath spellings of one are the same).
pub fn wwid_changed(found: Option<&str>, now: Option<&Wwid>) -> Option<String> {
    let found_wwid = found.and_then(|w| w.parse::<Wwid>().ok());
    if found_wwid.as_ref() == now {
        return None;
    }
    let show = |w: Option<String>| w.unwrap_or_else(|| "none".into());
    Some(format!(
        "its WWID is {} now, was {}",
        show(now.map(ToString::to_string)),
        show(found.map(str::to_owned))
    ))
}

/// Deletes a SCSI device that is down: identity recorded, checked against the finding,
/// the in-use check, its state again, then the identity-checked `delete` write. A
/// `transport-offline` device comes back by itself when its session or port recovers: it
/// is deleted only when the kind was `named`.
fn scsi_device(root: &Root, f: &Finding, named: bool, deadline: Instant) -> Result<FixOutcome> {
    let hctl: Hctl = object(f, 0)?.parse()?;
    let expect = PathIdentity::of(root, hctl);
    if expect.device.is_none() {
        return Ok(FixOutcome::Gone);
    }
    if let Some(why) = wwid_changed(f.identity.as_deref(), expect.wwid.as_ref()) {
        return Ok(FixOutcome::Changed(why));
    }
    if let Some(left) = still_down(root, f.kind, hctl, named) {
        return Ok(left);
    }
    if let Some(left) = verdict(&usage(root, &f.devices, &[], deadline)?) {
        return Ok(left);
    }
    // Again after the in-use check, which takes a while: a device that came back may have
    // found a user since.
    if let Some(left) = still_down(root, f.kind, hctl, named) {
        return Ok(left);
    }
    // No flush, and no claim: the kernel refuses every open of an offline device, so neither
    // a cache flush nor a new user can reach it between the check and the write. A blocked
    // device would hold a flush until its transport came back; the kernel fails its
    // commands once it is being removed, and nothing has it open.
    Ok(match scsi::remove_device(root, hctl, &expect, deadline)? {
        Deleted::Now => FixOutcome::Fixed(format!(
            "deleted SCSI device {} (not flushed: a {} device takes no command)",
            f.objects.join(" "),
            match f.kind {
                Kind::ScsiDeviceBlocked => "blocked",
                _ => "down",
            }
        )),
        Deleted::AlreadyGone => FixOutcome::Gone,
    })
}

/// `None` while the device at `hctl` is as a finding of `kind` found it: `offline`, or
/// `transport-offline` and its kind `named`; blocked for a blocked device. Else why it is
/// left.
fn still_down(root: &Root, kind: Kind, hctl: Hctl, named: bool) -> Option<FixOutcome> {
    let blocked = kind == Kind::ScsiDeviceBlocked;
    match scsi::sysfs::state(root, hctl) {
        Some(ScsiState::Blocked | ScsiState::CreatedBlocked) if blocked => None,
        Some(ScsiState::Offline) if !blocked => None,
        Some(ScsiState::TransportOffline) if named && !blocked => None,
        Some(ScsiState::TransportOffline) if !blocked => {
            Some(FixOutcome::NotSelected { opt_in: true })
        }
        state => {
            let state = state
                .as_ref()
                .map_or("in an unknown state", ScsiState::as_str);
            Some(FixOutcome::Changed(format!("it is {state} now")))
        }
    }
}

/// Deletes a path whose WWID is not its map's, never the map: the map and the path are
/// checked together (the map as the path's own holder, its users as the path's).
fn remapped_path(root: &Root, f: &Finding, deadline: Instant) -> Result<FixOutcome> {
    let (map, path) = (object(f, 0)?, object(f, 1)?);
    let Some(node) = block::by_name(root, path)? else {
        return Ok(FixOutcome::Gone);
    };
    let Some(hctl) = block::scsi_address(root, &node) else {
        return Ok(FixOutcome::Changed(format!(
            "{path} is not a SCSI disk now"
        )));
    };
    let expect = PathIdentity::of(root, hctl);
    if let Some(why) = wwid_changed(f.identity.as_deref(), expect.wwid.as_ref()) {
        return Ok(FixOutcome::Changed(why));
    }
    let mut devices = vec![path.to_owned()];
    devices.extend(f.devices.iter().cloned());
    if let Some(left) = verdict(&usage(root, &devices, &f.devices, deadline)?) {
        return Ok(left);
    }
    // Not flushed: the map holds the disk exclusively, so everything written to it came
    // through the map, whose I/O on this path multipath retries on another when it fails.
    Ok(match scsi::remove_device(root, hctl, &expect, deadline)? {
        Deleted::Now => FixOutcome::Fixed(format!(
            "deleted path {path} ({hctl}) of map {map}; the map is left"
        )),
        Deleted::AlreadyGone => FixOutcome::Gone,
    })
}

/// Takes a map no path serves off the node: a detach by its WWID, if the fresh look `now`
/// still shows the same finding (a path that came back makes it a volume someone may want).
fn map(
    root: &Root,
    f: &Finding,
    now: &Topology,
    opts: &FixOptions,
    deadline: Instant,
) -> Result<FixOutcome> {
    let wwid = f.identity.as_deref().unwrap_or_default();
    if !now.multipath_maps().any(|m| m.wwid == wwid) {
        return Ok(FixOutcome::Gone);
    }
    let same = |n: &Finding| n.kind == f.kind && n.objects == f.objects && n.identity == f.identity;
    if !classify(now).iter().any(same) {
        return Ok(FixOutcome::Changed(
            "a fresh look does not find it so: a path came back, or it changed".into(),
        ));
    }
    if let Some(left) = verdict(&usage(root, &f.devices, &[], deadline)?) {
        return Ok(left);
    }
    let mut d = DetachOptions::new(root);
    d.timeout = deadline.saturating_duration_since(Instant::now());
    d.lock_dir.clone_from(&opts.lock_dir);
    d.use_multipathd = opts.use_multipathd;
    let report = crate::ops::detach(root, &VolumeSpec::Wwid(wwid.parse()?), &d)?;
    Ok(match report.rounds {
        0 => FixOutcome::Gone,
        _ => FixOutcome::Fixed(summary(wwid, &report)),
    })
}

/// The steps of a detach that changed something, in a line.
fn summary(wwid: &str, report: &DetachReport) -> String {
    let done: Vec<String> = report
        .steps
        .iter()
        .filter(|s| s.outcome == Outcome::Done)
        .filter(|s| {
            !matches!(
                s.kind,
                StepKind::Identify | StepKind::Lock | StepKind::Verify
            )
        })
        .filter(|s| s.kind != StepKind::CheckInUse)
        .map(|s| format!("{} {}", s.kind.as_str(), s.target))
        .collect();
    format!("detached volume {wwid}: {}", done.join(", "))
}

mod nvme;

#[cfg(test)]
mod tests;

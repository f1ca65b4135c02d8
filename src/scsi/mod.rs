//! SCSI devices: bring one LUN in (on one path, or on every path at once), rescan it, take it
//! out, ask it whether its LUN is still served ([`sg_io`]); and their sysfs views ([`sysfs`]).
//!
//! ## One path
//!
//! A scan writes `"C T L"` to `/sys/class/scsi_host/hostN/scan` (never wildcards unless asked:
//! whole-target scans create unwanted disks, uevent storms and phantom LUNs). The kernel creates
//! the `scsi_device` before the write returns, or not at all when the target does not report the
//! LUN, so a missing LUN fails at once with [`Error::NotFound`]. The `sd` probe that creates the
//! block device runs asynchronously after the write; that is what the scan waits for, on uevents
//! with sysfs re-checks as the safety net (see [`crate::wait`]).
//!
//! ## Every path at once
//!
//! A scan write returns only after that path's INQUIRYs, and on a sick path it waits out their
//! timeouts, so writing one path after another costs N times one and lets a slow path hold up
//! the healthy ones. [`crate::iscsi::scan`], [`crate::fc::scan`] and [`scan_report`] give every
//! path its own worker for its write (each bounded by the deadline), start all writes together,
//! and wait for every path's block device on one uevent subscription, opened before the first
//! write, until the deadline.
//!
//! A path that does not come does not cost the volume its other paths: each ends as
//! [`PathOutcome::Found`], [`PathOutcome::NotReported`], [`PathOutcome::TimedOut`],
//! [`PathOutcome::Failed`] or, when the transport says it cannot be scanned now (an FC port
//! that is Blocked, an iSCSI session in recovery), [`PathOutcome::Skipped`]. The scan succeeds
//! when [`ScanOptions::min_paths`] paths came and they all carry one WWID: a mixed volume is
//! never handed out.

use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::error::{Error, Result};
use crate::helper::{self, Subject};
use crate::id::DevNum;
use crate::id::Hctl;
use crate::id::Wwid;
use crate::root::Root;
use scan::Candidate;

pub(crate) mod add;
mod delete;
pub(crate) mod scan;
pub mod sg_io;
pub mod sysfs;
pub mod vpd;
mod wwids;

pub(crate) use add::{ReadyPending, TriggerPending, ready_start, remapped, trigger_start};
pub(crate) use delete::remove_device;
pub use delete::{
    DEFAULT_DELETE_TIMEOUT, DeleteOptions, Deleted, PATH_MANAGERS, PathIdentity, delete,
};
pub(crate) use wwids::wwids;

pub use scan::{DEFAULT_SCAN_TIMEOUT, PathOutcome, PathScan, PathTiming, ScanOptions, ScanReport};

/// One path to a LUN: the SCSI device and the disk `sd` made of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathDevice {
    /// Its SCSI address.
    pub hctl: Hctl,
    /// Kernel name of the disk (`sdc`).
    pub name: String,
    /// Its device node (`<root>/dev/sdc`).
    pub dev_path: PathBuf,
    /// Its device number.
    pub dev: DevNum,
    /// Its WWID, absent when the LUN has no VPD page 0x83.
    pub wwid: Option<Wwid>,
}

/// What to write where: the LUN expected at `hctl`, brought in by writing `request` to
/// `hostN/scan`. `request` is `"C T L"`, or `"- - L"` for a wildcard scan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ScanTarget {
    pub hctl: Hctl,
    pub request: String,
}

impl ScanTarget {
    pub(crate) fn exact(hctl: Hctl) -> Self {
        ScanTarget {
            request: format!("{} {} {}", hctl.channel, hctl.target, hctl.lun),
            hctl,
        }
    }
}

/// What a scan write found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Triggered {
    /// The SCSI device was there before and was rescanned.
    Present,
    /// The SCSI device was made by this write.
    Added,
    /// The target did not report the LUN: the kernel made no SCSI device.
    NotReported,
}

/// Scans the LUN at `hctl` and waits until its block device exists and its `/dev` node opens.
///
/// A LUN that is already present is rescanned (its `rescan` attribute: capacity and VPD are
/// re-read) and returned after the same checks. A LUN the target does not report is
/// [`Error::NotFound`]; one whose disk does not open in time is [`Error::Timeout`].
pub fn scan(root: &Root, hctl: Hctl, opts: &ScanOptions) -> Result<PathDevice> {
    scan_report(root, hctl, opts)?
        .into_devices()
        .pop()
        .ok_or_else(|| Error::Internal {
            what: format!("scan of {hctl} succeeded without a device"),
        })
}

/// [`scan`], with the path's outcome and timing as a [`ScanReport`].
pub fn scan_report(root: &Root, hctl: Hctl, opts: &ScanOptions) -> Result<ScanReport> {
    let start = Instant::now();
    let candidate = Candidate::Scan {
        via: format!("host{}", hctl.host),
        target: ScanTarget::exact(hctl),
    };
    // One candidate, always scanned: `none` is never called.
    let none = || Error::Internal {
        what: format!("scan of {hctl} without a path"),
    };
    crate::scsi::scan::scan_paths(
        root,
        &format!("LUN {hctl}"),
        start,
        vec![candidate],
        &crate::scsi::scan::named,
        &none,
        opts,
    )
}

/// Writes `1` to the `rescan` attribute of the device at `hctl`: the midlayer re-reads its
/// VPD pages and `sd` its capacity (READ CAPACITY), synchronously, so the disk's `size` is
/// current when this returns. Bounded by `deadline` like every SCSI write.
///
/// [`Error::NotFound`] when no device is at `hctl` (or its directory leads out of the root).
pub fn rescan(root: &Root, hctl: Hctl, deadline: Instant) -> Result<()> {
    let dir = crate::sysfs::Confine::new(root)
        .dir(&sysfs::device_dir(root, hctl))
        .filter(|d| d.is_dir())
        .ok_or_else(|| Error::NotFound {
            what: format!("SCSI device {hctl} not found"),
        })?;
    write_within(dir.join("rescan"), "1", deadline)
}

/// Writes a SCSI sysfs attribute whose store can block for as long as the midlayer waits on
/// the device (`scan` waits out INQUIRY timeouts, `rescan` and `delete` every command's),
/// giving up at `deadline`.
pub(crate) fn write_within(path: PathBuf, value: &str, deadline: Instant) -> Result<()> {
    let what = || format!("write to {} (the device is not answering)", path.display());
    write_start(&path, value, deadline)?.wait(deadline, &what)
}

/// [`write_within`]'s write, handed to a helper thread without waiting for it.
pub(crate) fn write_start(
    path: &Path,
    value: &str,
    deadline: Instant,
) -> Result<helper::Pending<()>> {
    let what = || format!("write to {} (the device is not answering)", path.display());
    let (p, value) = (path.to_owned(), value.to_owned());
    helper::start(Subject::write(path, &value), deadline, &what, move || {
        crate::sysfs::write_attr(&p, &value)
    })
}

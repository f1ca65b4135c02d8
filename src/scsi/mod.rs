//! SCSI devices: bring one LUN in (on one path, or on every path at once), rescan it, take it
//! out; and their sysfs views ([`sysfs`]).
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
use std::time::{Duration, Instant};

use rustix::fs::{Mode, OFlags};

use crate::block::{self, UsageScope};
use crate::error::{Error, Result};
use crate::helper::{self, Subject};
use crate::id::DevNum;
use crate::id::Hctl;
use crate::id::Wwid;
use crate::root::Root;
use crate::sysfs::{attr, attr_parse};
use crate::uevent::{Action, Monitor, Uevent};
use crate::wait;
use scan::Candidate;

pub(crate) mod scan;
pub mod sysfs;

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
    /// The SCSI device exists now (made by this write, or already there and rescanned).
    Present,
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

/// A scan (or rescan) write in flight on a helper thread ([`trigger_start`]), and what to
/// check once it returned.
pub(crate) struct TriggerPending {
    write: helper::Pending<()>,
    /// The attribute written, for a timeout's message.
    path: PathBuf,
    dev_dir: PathBuf,
    /// `Some` for a rescan of a present device: whose it was before.
    rescanned: Option<Present>,
    /// For the in-use check after a rescan.
    root: Root,
}

/// Starts the scan (or rescan) write for one target; [`TriggerPending::finish`] then says
/// whether the SCSI device now exists. The checks run here, the write on a helper thread, so
/// that one thread can have every path's write in flight at once.
///
/// A device already present may be a leftover path of another volume: the array re-mapped
/// its LUN number while its disk still sits in that volume's multipath map, under a mount,
/// in a pod (a bind mount of its node, kubelet's loop device) or open in some process, in
/// any mount namespace (os-brick's CVE-2023-2088). Whose it is comes from sysfs
/// ([`Present`]); when that is not the volume asked for, the same in-use check a detach
/// makes ([`block::usage`]) decides, and [`Error::Busy`] refuses a device in use, naming
/// its user:
/// - without a rescan, when it belongs to another volume than `expect`;
/// - after the rescan (in `finish`), when it now reports another WWID than the volume it
///   belonged to.
///
/// A device nobody uses may be rescanned and handed out as what it reports now: its last
/// close dropped whatever the old LUN left in its page cache.
pub(crate) fn trigger_start(
    root: &Root,
    t: &ScanTarget,
    expect: Option<&Wwid>,
    deadline: Instant,
) -> Result<TriggerPending> {
    let h = t.hctl;
    // Class entries are symlinks: below a --root they must not lead the write out of it.
    let confine = crate::sysfs::Confine::new(root);
    let dev_dir = sysfs::device_dir(root, h);
    if dev_dir.exists() {
        let Some(dev_dir) = confine.dir(&dev_dir) else {
            return Err(Error::NotFound {
                what: format!("SCSI device {h} below {}", root.path().display()),
            });
        };
        let mut present = Present::read(root, h, &dev_dir)?;
        if let Some(expect) = expect.filter(|e| present.owner.as_ref() != Some(*e)) {
            present.refuse_if_used(
                root,
                &format!(
                    "it is a path of volume {} ({}), not of {expect}: a leftover of another \
                     volume, left as it is (not rescanned); detach that volume first",
                    show(&present.owner),
                    present.by
                ),
                deadline,
            )?;
        }
        // Already present: `rescan` is synchronous and re-reads VPD pages and capacity.
        let path = dev_dir.join("rescan");
        return Ok(TriggerPending {
            write: write_start(&path, "1", deadline)?,
            path,
            dev_dir,
            rescanned: Some(present),
            root: root.clone(),
        });
    }
    let host_dir = confine
        .dir(&sysfs::host_dir(root, h.host))
        .filter(|d| d.is_dir())
        .ok_or_else(|| Error::NotFound {
            what: format!("SCSI host{}", h.host),
        })?;
    let path = host_dir.join("scan");
    Ok(TriggerPending {
        write: write_start(&path, &t.request, deadline)?,
        path,
        dev_dir,
        rescanned: None,
        root: root.clone(),
    })
}

impl TriggerPending {
    /// Waits for the write until `deadline`, then says whether the SCSI device exists now,
    /// and when the write returned.
    pub(crate) fn finish(self, deadline: Instant) -> Result<(Triggered, Instant)> {
        let path = &self.path;
        let what = || format!("write to {} (the device is not answering)", path.display());
        let ((), at) = self.write.wait_timed(deadline, &what)?;
        let Some(mut present) = self.rescanned else {
            // The scsi_device is added before the write returns, or never: nothing to wait
            // for.
            let found = if self.dev_dir.exists() {
                Triggered::Present
            } else {
                Triggered::NotReported
            };
            return Ok((found, at));
        };
        let now: Option<Wwid> = attr_parse(&self.dev_dir, "wwid");
        if now != present.owner && !present.checked {
            present.refuse_if_used(
                &self.root,
                &format!(
                    "it reports WWID {} since its rescan, but was a path of volume {} ({}): \
                     the LUN was re-mapped under a device still in use, and is not handed \
                     out as the new volume; detach the old one first",
                    show(&now),
                    show(&present.owner),
                    present.by
                ),
                deadline,
            )?;
        }
        Ok((Triggered::Present, at))
    }
}

/// A WWID for messages, `unknown` when there is none.
fn show(w: &Option<Wwid>) -> String {
    w.as_ref().map_or("unknown".to_owned(), Wwid::to_string)
}

/// A SCSI device found present before its rescan, and whose it is.
struct Present {
    hctl: Hctl,
    /// Its disk, when `sd` has one for it.
    disk: Option<block::BlockNode>,
    /// The volume it is a path of: the WWID of the multipath map stacked on its disk (or on
    /// a partition of it) when there is one, else the WWID the device reported before
    /// anything was rescanned.
    owner: Option<Wwid>,
    /// Where `owner` comes from, for messages: `multipath map dm-0 is stacked on sdc`, `its
    /// own VPD`.
    by: String,
    /// The in-use check ran and found nothing (no need to run it twice).
    checked: bool,
}

impl Present {
    /// Reads whose the device at `dev_dir` (its `device` directory) is, from sysfs alone.
    fn read(root: &Root, hctl: Hctl, dev_dir: &Path) -> Result<Present> {
        let own: Option<Wwid> = attr_parse(dev_dir, "wwid");
        let mut present = Present {
            hctl,
            disk: None,
            owner: own,
            by: "by the WWID it reports".to_owned(),
            checked: false,
        };
        let Some(disk) = crate::sysfs::sub_entries(dev_dir, "block")?
            .into_iter()
            .next()
        else {
            return Ok(present);
        };
        crate::sysfs::check_component("block device name", &disk)?;
        let mut family = vec![disk.clone()];
        family.extend(crate::block::sysfs::partitions(root, &disk)?);
        'family: for name in &family {
            for h in crate::block::sysfs::holders(root, name)? {
                crate::sysfs::check_component("holder name", &h)?;
                let map_wwid: Option<Wwid> = crate::block::sysfs::dm_uuid(root, &h)
                    .and_then(|u| crate::multipath::uuid_wwid(&u).and_then(|w| w.parse().ok()));
                if map_wwid.is_some() {
                    present.owner = map_wwid;
                    present.by = format!("multipath map {h} is stacked on {name}");
                    break 'family;
                }
            }
        }
        present.disk = block::by_name(root, &disk)?;
        Ok(present)
    }

    /// [`Error::Busy`] (or [`Error::Unverified`]) when anything uses the device's disk, by
    /// the detach's check ([`block::usage`]; multipathd's and udev's own opens do not
    /// count), its message `why` followed by who uses it. Notes that the check found
    /// nothing.
    fn refuse_if_used(&mut self, root: &Root, why: &str, deadline: Instant) -> Result<()> {
        let Some(disk) = &self.disk else {
            self.checked = true;
            return Ok(());
        };
        let scope = UsageScope {
            own: &[],
            ignore_openers: PATH_MANAGERS,
        };
        let usage = block::usage(root, std::slice::from_ref(disk), &scope, deadline)?;
        let device = format!("SCSI device {}", self.hctl);
        if usage.has_users() {
            return Err(Error::Busy {
                device,
                reason: format!("{why}. In use: {}", busy_reason(root, &usage)),
                usage: Some(Box::new(usage)),
            });
        }
        if !usage.unchecked.is_empty() {
            return Err(Error::Unverified {
                device,
                reason: format!("{why}. Whether it is in use is not known: {usage}"),
                usage: Some(Box::new(usage)),
            });
        }
        self.checked = true;
        Ok(())
    }
}

/// The path device at `hctl` once `sd` has bound it and its node opens: `None` while it has
/// no disk yet (or an open of it from an earlier call is still blocked), else the disk's
/// open handed to a helper thread, for [`ReadyPending::finish`]. In two halves so that a
/// scan opens every path's disk at once: an open can wait while the kernel still probes the
/// disk, and the paths' probes run side by side.
pub(crate) fn ready_start(root: &Root, hctl: Hctl) -> Result<Option<ReadyPending>> {
    let dir = sysfs::device_dir(root, hctl);
    if !dir.exists() {
        // It existed after the scan write; vanishing means someone deleted it meanwhile.
        return Err(Error::NotFound {
            what: format!("SCSI device {hctl} (removed while waiting for it)"),
        });
    }
    let Some(dir) = crate::sysfs::Confine::new(root).dir(&dir) else {
        return Err(Error::NotFound {
            what: format!("SCSI device {hctl} below {}", root.path().display()),
        });
    };
    let Some(name) = crate::sysfs::sub_entries(&dir, "block")?.into_iter().next() else {
        return Ok(None);
    };
    crate::sysfs::check_component("block device name", &name)?;
    let Some(dev) = attr_parse::<DevNum>(&dir.join("block").join(&name), "dev") else {
        return Ok(None);
    };
    let dev_path = root.dev(&name);
    // devtmpfs creates the node before the `add` uevent; opening it proves the disk is
    // usable (the probe has finished and the queue accepts opens).
    // The node exists from the start of the probe, and an open waits while the probe holds
    // the disk (reading its partition table, which a failing LUN can stretch to minutes).
    let node = dev_path.clone();
    // Not a wait for an earlier open still blocked on this disk: the scan checks again on
    // the next uevent or backoff, and its other paths' opens go ahead meanwhile.
    let Some(open) = helper::try_start(Subject::device("open", dev), move || {
        Ok(rustix::fs::open(
            &node,
            OFlags::RDONLY | OFlags::NONBLOCK | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .is_ok())
    })?
    else {
        return Ok(None);
    };
    Ok(Some(ReadyPending {
        open,
        dir,
        device: PathDevice {
            hctl,
            name,
            dev_path,
            dev,
            wwid: None,
        },
    }))
}

/// What a path's readiness open waits for, for its timeout.
fn opening(dev_path: &Path) -> impl Fn() -> String + '_ {
    move || {
        format!(
            "{} to open (the kernel is still probing it)",
            dev_path.display()
        )
    }
}

/// A path's disk being opened on a helper thread ([`ready_start`]).
pub(crate) struct ReadyPending {
    open: helper::Pending<bool>,
    /// The SCSI device's sysfs directory, for its WWID once the disk opened.
    dir: PathBuf,
    device: PathDevice,
}

impl ReadyPending {
    /// The path device, with when its open returned, once it did; `None` when the open
    /// failed (the disk is not usable yet); [`Error::Timeout`] when it was still blocked at
    /// `deadline`.
    pub(crate) fn finish(self, deadline: Instant) -> Result<Option<(PathDevice, Instant)>> {
        let (opened, at) = self
            .open
            .wait_timed(deadline, &opening(&self.device.dev_path))?;
        if !opened {
            return Ok(None);
        }
        let device = PathDevice {
            wwid: attr(&self.dir, "wwid").and_then(|w| w.parse().ok()),
            ..self.device
        };
        Ok(Some((device, at)))
    }
}

// ---------------------------------------------------------------------------------------
// Taking one SCSI device out
// ---------------------------------------------------------------------------------------

/// Command names whose open file descriptors on a device do not make it busy. multipathd
/// keeps every path open for its checkers and closes it when the path's `remove` event comes.
/// udev's workers open each new or changed disk read-only to probe it (blkid, scsi_id) and
/// close it when done; under load that takes seconds, and deleting the disk under them only
/// fails their reads. `kpartx` is one of udev's probes too: multipath-tools' `kpartx.rules`
/// runs it on every change of a map, and it opens the map read-only for its partition table
/// (with the target down it sits in that read as blkid does). Only one a udev worker started
/// counts (see [`crate::block::UsageScope::ignore_openers`]).
pub const PATH_MANAGERS: &[&str] = &[
    "multipathd",
    "(udev-worker)",
    "systemd-udevd",
    "udevd",
    "kpartx",
];

/// How [`delete`] behaves. The default: 30 s, not forced.
///
/// ```
/// let mut opts = lunkit::scsi::DeleteOptions::default();
/// opts.timeout = std::time::Duration::from_secs(10);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeleteOptions {
    /// How long the check, the flush and the removal may take, counted from the call.
    pub timeout: Duration,
    /// Delete even when the device is in use or its flush fails. In-flight and later I/O to
    /// it fails; a mounted filesystem on it is shut down by the kernel.
    pub force: bool,
}

impl Default for DeleteOptions {
    fn default() -> Self {
        DeleteOptions {
            timeout: DEFAULT_DELETE_TIMEOUT,
            force: false,
        }
    }
}

/// Default time a [`delete`] may take.
pub const DEFAULT_DELETE_TIMEOUT: Duration = Duration::from_secs(30);

/// What [`delete`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deleted {
    /// The device was deleted by this call.
    Now,
    /// There was no device at that address (already deleted, or never there).
    AlreadyGone,
}

/// Takes the SCSI device at `hctl` off the node: refuses when it is in use (mounted, held by
/// a multipath map or anything else, swap, open), flushes its disk ([`block::flush`]), writes
/// `delete`, and waits until the scsi_device and its disk are gone from sysfs.
///
/// A device that is not there is success ([`Deleted::AlreadyGone`]), so a retry after a
/// partial cleanup completes it. The kernel itself checks nothing before deleting (a path
/// under a live multipath map fails, and if it was the last one with `queue_if_no_path` I/O
/// hangs), which is why the check is here: take the map down first.
pub fn delete(root: &Root, hctl: Hctl, opts: &DeleteOptions) -> Result<Deleted> {
    let deadline = wait::deadline_after(opts.timeout);
    if !sysfs::device_dir(root, hctl).exists() {
        return Ok(Deleted::AlreadyGone);
    }
    // Before the checks: the delete goes ahead only if the device it writes to is the one
    // they were about.
    let expect = PathIdentity::of(root, hctl);
    let node = block::of_scsi_device(root, hctl)?;
    // Held from the check to the delete: nothing can mount the disk or stack on it between.
    let mut _claim = None;
    if let Some(node) = &node {
        if !opts.force {
            let scope = UsageScope {
                own: &[],
                ignore_openers: PATH_MANAGERS,
            };
            let usage = block::usage(root, std::slice::from_ref(node), &scope, deadline)?;
            match usage.refusal(&format!("{node} ({hctl})")) {
                Some(Error::Busy {
                    device,
                    usage: found,
                    ..
                }) => {
                    return Err(Error::Busy {
                        device,
                        reason: busy_reason(root, &usage),
                        usage: found,
                    });
                }
                Some(e) => return Err(e),
                None => {}
            }
            _claim = claim_for_delete(node, deadline)?;
        }
        match block::flush(node, deadline) {
            Ok(()) => {}
            Err(_) if opts.force => {}
            Err(e) => return Err(e),
        }
    }
    remove_device(root, hctl, &expect, deadline)
}

/// Claims a disk about to be deleted ([`block::try_claim`]): `EBUSY` (something took it
/// since the in-use check) refuses the delete.
fn claim_for_delete(node: &block::BlockNode, deadline: Instant) -> Result<Option<block::Claim>> {
    block::try_claim(node, deadline).map_err(|_| Error::Busy {
        device: node.to_string(),
        reason: "something claimed it exclusively (a mount, a device stacked on it) after \
                 the in-use check found it free"
            .into(),
        usage: None,
    })
}

/// The usage message, pointing at the map when a multipath map holds the path.
fn busy_reason(root: &Root, usage: &block::Usage) -> String {
    let mut reason = usage.to_string();
    for h in &usage.holders {
        if crate::block::sysfs::dm_uuid(root, h)
            .is_some_and(|u| crate::multipath::uuid_wwid(&u).is_some())
        {
            let name = crate::block::sysfs::dm_name(root, h).unwrap_or_else(|| h.clone());
            reason.push_str(&format!(
                "; it is a path of multipath map {name} ({h}): take the map down first, or \
                 detach the whole volume"
            ));
        }
    }
    reason
}

/// Which device a path was when it was checked: what its delete must still find at its
/// address to go ahead.
///
/// A LUN deleted and scanned again at the same H:C:T:L (re-mapped on the target meanwhile)
/// often gets the same disk name and device number back, and may be another volume. Its
/// sysfs objects are new ([`crate::sysfs::ObjectId`]), and its WWID tells the volumes apart.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PathIdentity {
    /// The scsi_device's sysfs directory (`…/target7:0:0/7:0:0:1`).
    pub device: Option<crate::sysfs::ObjectId>,
    /// Its disk's sysfs directory (`…/7:0:0:1/block/sdc`); `None` when it had no disk.
    pub disk: Option<crate::sysfs::ObjectId>,
    /// The WWID it reported; `None` when none could be read.
    pub wwid: Option<Wwid>,
}

impl PathIdentity {
    /// What the device at `hctl` is now.
    pub fn of(root: &Root, hctl: Hctl) -> PathIdentity {
        let disk = sysfs::disk(root, hctl).ok().flatten();
        PathIdentity::with(root, hctl, disk.as_deref(), sysfs::wwid(root, hctl))
    }

    /// The identity of the device at `hctl`, whose disk (`block/` entry) and WWID the caller
    /// has just read: only the sysfs objects are looked at.
    pub(crate) fn with(
        root: &Root,
        hctl: Hctl,
        disk: Option<&str>,
        wwid: Option<Wwid>,
    ) -> PathIdentity {
        let dir = sysfs::device_dir(root, hctl);
        PathIdentity {
            device: crate::sysfs::object_id(&dir),
            disk: disk.and_then(|name| crate::sysfs::object_id(&dir.join("block").join(name))),
            wwid,
        }
    }

    /// Why `now` is not the device `self` recorded; `None` when it still is. A disk that went
    /// away while its scsi_device stayed is the same device (`sd` was unbound); a disk that
    /// came or changed is not.
    fn differs(&self, now: &PathIdentity) -> Option<String> {
        if self.device.is_some() && now.device != self.device {
            return Some("its scsi_device was removed and another created at the address".into());
        }
        if now.disk.is_some() && now.disk != self.disk {
            return Some("it has another disk than the one that was checked".into());
        }
        if now.wwid != self.wwid {
            let show = |w: &Option<Wwid>| w.as_ref().map_or("none".to_owned(), Wwid::to_string);
            return Some(format!(
                "its WWID is {} now, was {}",
                show(&now.wwid),
                show(&self.wwid)
            ));
        }
        None
    }
}

/// Writes `delete` for the device at `hctl`, if it is still the device `expect` recorded, and
/// waits until that scsi_device and its disk are gone. No in-use checks and no flush: the
/// caller has done them, on the device `expect` describes.
///
/// [`Error::Replaced`] when the device at `hctl` is not that one any more: the caller's checks
/// were about another device, so nothing is written.
pub(crate) fn remove_device(
    root: &Root,
    hctl: Hctl,
    expect: &PathIdentity,
    deadline: Instant,
) -> Result<Deleted> {
    let dir = crate::sysfs::Confine::new(root)
        .dir(&sysfs::device_dir(root, hctl))
        .ok_or_else(|| Error::NotFound {
            what: format!("SCSI device {hctl} below {}", root.path().display()),
        })?;
    // Open first, check second, write third: the write then reaches the object that was
    // checked, or fails with ENODEV if it was removed after the check (crate::sysfs::AttrWriter).
    let writer = match crate::sysfs::AttrWriter::open(&dir.join("delete")) {
        Ok(w) => w,
        // Gone since the caller looked.
        Err(e) if e.is_gone() && !dir.exists() => {
            return Ok(Deleted::AlreadyGone);
        }
        Err(e) => return Err(e),
    };
    let now = PathIdentity::of(root, hctl);
    if now.device.is_none() {
        return Ok(Deleted::AlreadyGone);
    }
    if let Some(why) = expect.differs(&now) {
        return Err(Error::Replaced {
            device: format!("SCSI device {hctl}"),
            reason: why,
        });
    }
    // Subscribe before acting, so the remove events cannot slip past.
    let mut monitor = Monitor::open().ok();
    let what = || {
        format!(
            "write to {} (the device is not answering)",
            dir.join("delete").display()
        )
    };
    let subject = Subject::write(&dir.join("delete"), "1");
    match helper::bounded(subject, deadline, &what, move || writer.write("1")) {
        Ok(()) => {}
        // ENODEV: removed after the check, by someone else's delete (under way or done);
        // wait for it like for ours. A device created since is another object.
        Err(e) if e.errno() == Some(libc::ENODEV) => {}
        Err(e) => return Err(e),
    }
    // Wait for this object to go, not for the name: a scan can put a new device at the same
    // address, with the same disk name, before this looks. Its disk lies below it and goes
    // first (`sd` is unbound in the scsi_device's removal).
    let what = || format!("removal of SCSI device {hctl}");
    let relevant = |ev: &Uevent| ev.action == Action::Remove;
    wait::until(monitor.as_mut(), deadline, &what, &relevant, || {
        Ok((crate::sysfs::object_id(&dir) != now.device).then_some(()))
    })?;
    Ok(Deleted::Now)
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
            what: format!("SCSI device {hctl}"),
        })?;
    write_within(dir.join("rescan"), "1", deadline)
}

/// Writes a SCSI sysfs attribute whose store can block for as long as the midlayer waits on
/// the device (`scan` waits out INQUIRY timeouts, `rescan` and `delete` every command's),
/// giving up at `deadline`.
fn write_within(path: PathBuf, value: &str, deadline: Instant) -> Result<()> {
    let what = || format!("write to {} (the device is not answering)", path.display());
    write_start(&path, value, deadline)?.wait(deadline, &what)
}

/// [`write_within`]'s write, handed to a helper thread without waiting for it.
fn write_start(path: &Path, value: &str, deadline: Instant) -> Result<helper::Pending<()>> {
    let what = || format!("write to {} (the device is not answering)", path.display());
    let (p, value) = (path.to_owned(), value.to_owned());
    helper::start(Subject::write(path, &value), deadline, &what, move || {
        crate::sysfs::write_attr(&p, &value)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(device: u64, disk: Option<u64>, wwid: Option<&str>) -> PathIdentity {
        let obj = |ino| crate::sysfs::ObjectId { dev: 22, ino };
        PathIdentity {
            device: Some(obj(device)),
            disk: disk.map(obj),
            wwid: wwid.map(|w| w.parse().unwrap()),
        }
    }

    const A: &str = "naa.60014055e7a100000010000000000000";
    const B: &str = "naa.60014055e7a100000020000000000000";

    #[test]
    fn the_same_objects_and_wwid_are_the_same_device() {
        assert_eq!(
            id(1, Some(2), Some(A)).differs(&id(1, Some(2), Some(A))),
            None
        );
        // `sd` unbound since the check: its disk went, the device stayed.
        assert_eq!(id(1, Some(2), Some(A)).differs(&id(1, None, Some(A))), None);
    }

    #[test]
    fn a_new_object_at_the_address_is_another_device() {
        let why = id(1, Some(2), Some(A)).differs(&id(3, Some(2), Some(A)));
        assert!(why.unwrap().contains("another created"));
        let why = id(1, Some(2), Some(A)).differs(&id(1, Some(4), Some(A)));
        assert!(why.unwrap().contains("another disk"));
        // A disk that came since a check that saw none was not checked.
        let why = id(1, None, Some(A)).differs(&id(1, Some(4), Some(A)));
        assert!(why.unwrap().contains("another disk"));
    }

    #[test]
    fn a_changed_wwid_is_another_volume() {
        let why = id(1, Some(2), Some(A))
            .differs(&id(1, Some(2), Some(B)))
            .unwrap();
        assert!(why.contains(B) && why.contains(A), "{why}");
        let why = id(1, Some(2), None)
            .differs(&id(1, Some(2), Some(B)))
            .unwrap();
        assert!(why.contains("was none"), "{why}");
    }
}

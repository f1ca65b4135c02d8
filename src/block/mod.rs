//! Block devices: naming one, flushing it, its size, and who is using it.
//!
//! A device is always identified by its number: a `/dev` path is `stat`ed, a kernel name is
//! looked up in `/sys/class/block/NAME/dev`, an H:C:T:L goes through its scsi_device, and the
//! node that is finally opened must have that number (`fstat`), so a stale or planted node is
//! never flushed in the device's place.
//!
//! [`usage()`] answers "may this be taken away?" the way the kernel would be surprised by:
//! mounts matched by device number in `/proc/self/mountinfo` (bind mounts included), devices
//! stacked on top (`holders/`, followed up the stack), active swap, processes holding it open
//! (`/proc/PID/fd`) or mapping it (`/proc/PID/maps`), and an `O_EXCL` open probe that
//! catches any other exclusive claim.
//!
//! The in-use check is `in_use.rs` and what it reports `usage.rs`, their items re-exported
//! here; `process.rs` and `processes.rs` are its `/proc` walk, `maps.rs` its `/proc/PID/maps`
//! parser, `loopdev.rs` the bound loop devices. `ends.rs` reads both ends of a device under a
//! deadline ([`read_ends`]). [`mountinfo`] parses mount tables and
//! [`sysfs`] is the typed view of `/sys/block`.

use std::fmt;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::time::Instant;

use rustix::fs::{FileType, Mode, OFlags};

use crate::error::{Error, Result};
use crate::helper::{self, Subject};
use crate::id::DevNum;
use crate::id::Hctl;
use crate::root::Root;

mod ends;
mod in_use;
mod loopdev;
mod maps;
pub mod mountinfo;
mod process;
mod processes;
mod swaps_loops;
pub mod sysfs;
mod usage;
mod walks;

pub use ends::{Ends, read_ends};
pub use in_use::*;
pub use usage::*;
pub use walks::{CheckGathering, gather_checks, walks_started};
pub(crate) use walks::{CheckIntent, intend_check};

/// [`usage()`] as a take-down judges it: devices held only by open descriptors are looked at
/// again until those let go or [`OPENER_GRACE`] has passed (within `deadline`), so that
/// udev's probe of a new or changed device is not taken for a user. For a check before an
/// action outside a SCSI detach (which keeps its own grace across its rounds): the NVMe
/// take-down's.
pub(crate) fn usage_after_grace(
    root: &Root,
    devices: &[BlockNode],
    scope: &UsageScope<'_>,
    deadline: Instant,
) -> Result<Usage> {
    let grace = crate::wait::deadline_after(OPENER_GRACE).min(deadline);
    let mut backoff = crate::wait::Backoff::new(
        std::time::Duration::from_millis(20),
        std::time::Duration::from_millis(200),
    );
    loop {
        let found = usage(root, devices, scope, deadline)?;
        if found.only_openers() && Instant::now() < grace {
            backoff.sleep(grace);
            continue;
        }
        return Ok(found);
    }
}

/// A block device found on the node: a whole disk, a partition or a dm device.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockNode {
    /// Kernel name (`sdc`, `sdc1`, `dm-0`).
    pub name: String,
    /// Device number.
    pub dev: DevNum,
    /// Its devtmpfs node (`<root>/dev/sdc`).
    pub path: PathBuf,
}

impl fmt::Display for BlockNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "/dev/{}", self.name)
    }
}

/// The block device named by `spec`: a `/dev/...` path (symlinks such as `/dev/mapper/NAME`
/// or `/dev/disk/by-id/...` are followed, but not out of the root), a kernel name (`sdc`,
/// `dm-0`), or an H:C:T:L (the disk `sd` made of that SCSI device).
///
/// `Ok(None)` when the name is well-formed but no such device exists now (a path that does
/// not exist, a node whose number the kernel no longer knows, an H:C:T:L without a device).
/// A malformed name or a path that is not a block device node is [`Error::Invalid`].
pub fn resolve(root: &Root, spec: &str) -> Result<Option<BlockNode>> {
    if spec.contains('\0') {
        return Err(Error::invalid("block device", spec, "contains NUL"));
    }
    if spec.starts_with('/') {
        let Some(dev) = stat_node(root, spec)? else {
            return Ok(None);
        };
        return by_number(root, dev);
    }
    if spec.contains(':') {
        let hctl: Hctl = spec.parse()?;
        return of_scsi_device(root, hctl);
    }
    by_name(root, spec)
}

/// The disk of the SCSI device at `hctl`; `None` if there is no such device or `sd` has not
/// bound it.
pub fn of_scsi_device(root: &Root, hctl: Hctl) -> Result<Option<BlockNode>> {
    match crate::scsi::sysfs::disk(root, hctl)? {
        Some(name) => by_name(root, &name),
        None => Ok(None),
    }
}

/// The SCSI address of a disk (`/sys/class/block/NAME/device` links to its scsi_device);
/// `None` for partitions, dm devices and non-SCSI disks.
pub fn scsi_address(root: &Root, node: &BlockNode) -> Option<Hctl> {
    sysfs::scsi_address(root, &node.name)
}

/// The block device with kernel name `name`, `None` if absent.
pub fn by_name(root: &Root, name: &str) -> Result<Option<BlockNode>> {
    crate::sysfs::check_component("block device name", name)?;
    Ok(sysfs::number(root, name).map(|dev| BlockNode {
        name: name.to_owned(),
        dev,
        path: root.dev(name),
    }))
}

/// The block device with number `dev`, `None` if the kernel has none.
pub fn by_number(root: &Root, dev: DevNum) -> Result<Option<BlockNode>> {
    let Some(name) = sysfs::name_of_number(root, dev) else {
        return Ok(None);
    };
    crate::sysfs::check_component("block device name", &name)?;
    Ok(Some(BlockNode {
        path: root.dev(&name),
        name,
        dev,
    }))
}

/// `stat` of a node below the root: its device number, `None` if it does not exist.
fn stat_node(root: &Root, spec: &str) -> Result<Option<DevNum>> {
    // The caller's name is checked, not the joined path: a root given as `a/../b` is the
    // caller's own choice, and the canonical check below keeps the node inside it.
    if std::path::Path::new(spec)
        .components()
        .any(|c| c == std::path::Component::ParentDir)
    {
        return Err(Error::invalid("block device", spec, "contains '..'"));
    }
    let path = root.path().join(spec.trim_start_matches('/'));
    // Symlinks (by-id, mapper) are fine, as long as they stay inside the root.
    let real = match std::fs::canonicalize(&path) {
        Ok(p) => p,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(&path, e)),
    };
    let top = std::fs::canonicalize(root.path()).map_err(|e| Error::io(root.path(), e))?;
    if !real.starts_with(&top) {
        return Err(Error::invalid(
            "block device",
            spec,
            "resolves to a path outside the root",
        ));
    }
    let st = rustix::fs::stat(&real).map_err(|e| Error::io(&real, e.into()))?;
    match block_number(&st) {
        Some(dev) => Ok(Some(dev)),
        None => Err(Error::invalid(
            "block device",
            spec,
            "not a block device node",
        )),
    }
}

/// The device number of what `st` describes, if it is a block device.
fn block_number(st: &rustix::fs::Stat) -> Option<DevNum> {
    (FileType::from_raw_mode(st.st_mode) == FileType::BlockDevice).then(|| DevNum {
        major: rustix::fs::major(st.st_rdev),
        minor: rustix::fs::minor(st.st_rdev),
    })
}

/// Opens the node read-only and checks it is the device it claims to be.
///
/// Read-only on purpose: udev watches disks for a close after a write and answers with a
/// synthetic `change` event, which would make multipathd re-create a map being taken down.
pub(crate) fn open_checked(node: &BlockNode, extra: OFlags) -> Result<OwnedFd> {
    let fd = rustix::fs::open(
        &node.path,
        OFlags::RDONLY | OFlags::CLOEXEC | extra,
        Mode::empty(),
    )
    .map_err(|e| Error::io(&node.path, e.into()))?;
    let st = rustix::fs::fstat(&fd).map_err(|e| Error::io(&node.path, e.into()))?;
    if block_number(&st) != Some(node.dev) {
        return Err(Error::Invalid {
            kind: "device node",
            input: node.path.display().to_string(),
            reason: "is not the device the kernel names (stale or foreign node)",
        });
    }
    Ok(fd)
}

/// An exclusive claim on a block device: an `O_EXCL` open (`bd_prepare_to_claim` in the
/// kernel), held until dropped. While it is held the kernel refuses every other exclusive
/// open of the device with `EBUSY`: a mount, a device-mapper table over it (LVM, a multipath
/// map), md, swapon. Plain opens still work, so the holder can flush it through another
/// descriptor. A take-down holds one on a device from its last in-use check to its delete,
/// so that nothing can start using it in between.
#[derive(Debug)]
pub struct Claim {
    node: BlockNode,
    _fd: OwnedFd,
}

impl Claim {
    /// The device claimed.
    pub fn node(&self) -> &BlockNode {
        &self.node
    }
}

/// Claims `node` exclusively ([`Claim`]): `open(2)` with `O_EXCL`, read-only, on a helper
/// thread bounded by `deadline` (the open waits while a partition scan holds the disk).
/// A device something else holds exclusively (mounted, stacked on, swapped on) fails with
/// [`Error::Io`] carrying `EBUSY`, naming the device.
pub fn claim(node: &BlockNode, deadline: Instant) -> Result<Claim> {
    let what = || format!("exclusive open of {node} (the device is not completing its open)");
    let subject = Subject::device("claim", node.dev);
    let claimed = node.clone();
    let fd = helper::bounded(subject, deadline, &what, move || {
        open_checked(&claimed, OFlags::EXCL)
    })?;
    Ok(Claim {
        node: node.clone(),
        _fd: fd,
    })
}

/// [`claim`], where only a refusal is an error: `Err` (`EBUSY`) when something else holds
/// the device exclusively, `Ok(None)` when the device does not open (an offline SCSI disk,
/// which `sd_open` refuses with `ENXIO`; one gone; one whose open did not return by the
/// deadline). Such a device cannot be mounted or stacked on either, and a take-down goes on
/// without a claim.
pub fn try_claim(node: &BlockNode, deadline: Instant) -> Result<Option<Claim>> {
    match claim(node, deadline) {
        Ok(c) => Ok(Some(c)),
        Err(e) if e.errno() == Some(libc::EBUSY) => Err(e),
        Err(_) => Ok(None),
    }
}

/// Writes everything cached for the device to it and drops its clean cache:
///
/// 1. `fsync(2)`: writes back the device's page cache and sends the device a cache flush
///    (SYNCHRONIZE CACHE), so the data is on stable storage, not just in the array's cache;
/// 2. `ioctl(BLKFLSBUF)`: writes back again (or syncs the filesystem mounted on it) and
///    invalidates the page cache, so nothing stale is served if the LUN comes back.
///
/// Both block until the I/O completes, which on a dead transport can take as long as the
/// SCSI error handler wants, and so can the `open(2)` before them: it waits for the disk's
/// open mutex, which a partition scan (`BLKRRPART`, sd's probe, a change of media) holds
/// through its reads. All three run on a helper thread, and if `deadline` passes first this
/// returns [`Error::Timeout`] and leaves the thread to finish on its own (it closes what it
/// opened); the caller is never held past its deadline.
pub fn flush(node: &BlockNode, deadline: Instant) -> Result<()> {
    let what = || format!("flush of {node} (the device is not completing its open or writes)");
    let subject = Subject::device("flush", node.dev);
    let node = node.clone();
    helper::bounded(subject, deadline, &what, move || {
        let fd = open_checked(&node, OFlags::empty())?;
        let _held = helper::hold(fd.as_fd(), node.dev);
        let path = &node.path;
        rustix::fs::fsync(&fd).map_err(|e| Error::io(path, e.into()))?;
        crate::ioctl::blkflsbuf(&fd).map_err(|source| Error::Ioctl {
            op: "BLKFLSBUF",
            target: path.display().to_string(),
            source,
        })
    })
}

/// The device's size in bytes (`BLKGETSIZE64`).
pub fn size(node: &BlockNode) -> Result<u64> {
    let fd = open_checked(node, OFlags::NONBLOCK)?;
    crate::ioctl::blkgetsize64(&fd).map_err(|source| Error::Ioctl {
        op: "BLKGETSIZE64",
        target: node.to_string(),
        source,
    })
}

/// [`size`] bounded by `deadline`: the `open(2)` waits for the disk's open mutex, which a
/// partition scan holds through its reads (a scan on a path that stopped answering holds it
/// until the SCSI error handler gives up), so the call runs on a helper thread, as
/// [`flush`] does, and a caller that must answer in time (a CSI plugin's stats or expand)
/// gets [`Error::Timeout`] instead of waiting with it. A second call while the first is
/// still blocked waits for that one, within its own deadline, and starts no other thread.
pub fn size_within(node: &BlockNode, deadline: Instant) -> Result<u64> {
    let what = || format!("size of {node} (the device is not completing its open)");
    let subject = Subject::device("size", node.dev);
    let node = node.clone();
    helper::bounded(subject, deadline, &what, move || {
        let fd = open_checked(&node, OFlags::NONBLOCK)?;
        let _held = helper::hold(fd.as_fd(), node.dev);
        crate::ioctl::blkgetsize64(&fd).map_err(|source| Error::Ioctl {
            op: "BLKGETSIZE64",
            target: node.to_string(),
            source,
        })
    })
}

/// The device's logical block size in bytes (`BLKSSZGET`).
pub fn logical_block_size(node: &BlockNode) -> Result<u32> {
    let fd = open_checked(node, OFlags::NONBLOCK)?;
    crate::ioctl::blksszget(&fd).map_err(|source| Error::Ioctl {
        op: "BLKSSZGET",
        target: node.to_string(),
        source,
    })
}

//! Block devices: naming one, flushing it, its size, and who is using it.
//!
//! A device is always identified by its number: a `/dev` path is `stat`ed, a kernel name is
//! looked up in `/sys/class/block/NAME/dev`, an H:C:T:L goes through its scsi_device, and the
//! node that is finally opened must have that number (`fstat`), so a stale or planted node is
//! never flushed in the device's place.
//!
//! [`usage`] answers "may this be taken away?" the way the kernel would be surprised by:
//! mounts matched by device number in `/proc/self/mountinfo` (bind mounts included), devices
//! stacked on top (`holders/`, followed up the stack), active swap, processes holding it open
//! (`/proc/PID/fd`), and an `O_EXCL` open probe that catches any other exclusive claim.

use std::collections::BTreeSet;
use std::fmt;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Instant;

use rustix::fs::{FileType, Mode, OFlags};

use crate::error::{Error, Result};
use crate::hctl::Hctl;
use crate::mountinfo;
use crate::root::Root;
use crate::sysfs::block::DevNum;
use crate::sysfs::{self, attr_parse, entries};

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
    let dir = root
        .sys("class/scsi_device")
        .join(hctl.to_string())
        .join("device");
    match sysfs::sub_entries(&dir, "block")?.into_iter().next() {
        Some(name) => by_name(root, &name),
        None => Ok(None),
    }
}

/// The SCSI address of a disk (`/sys/class/block/NAME/device` links to its scsi_device);
/// `None` for partitions, dm devices and non-SCSI disks.
pub fn scsi_address(root: &Root, node: &BlockNode) -> Option<Hctl> {
    let link = root.sys("class/block").join(&node.name).join("device");
    sysfs::resolve(root, &link)
        .as_deref()
        .and_then(sysfs::file_name)
        .and_then(|n| n.parse().ok())
}

/// The block device with kernel name `name`, `None` if absent.
pub fn by_name(root: &Root, name: &str) -> Result<Option<BlockNode>> {
    sysfs::check_component("block device name", name)?;
    let dir = root.sys("class/block").join(name);
    Ok(attr_parse::<DevNum>(&dir, "dev").map(|dev| BlockNode {
        name: name.to_owned(),
        dev,
        path: root.dev(name),
    }))
}

/// The block device with number `dev`, `None` if the kernel has none.
pub fn by_number(root: &Root, dev: DevNum) -> Result<Option<BlockNode>> {
    let link = root.sys(format!("dev/block/{dev}"));
    let Some(real) = sysfs::resolve(root, &link) else {
        return Ok(None);
    };
    let Some(name) = sysfs::file_name(&real) else {
        return Ok(None);
    };
    sysfs::check_component("block device name", name)?;
    Ok(Some(BlockNode {
        name: name.to_owned(),
        dev,
        path: root.dev(name),
    }))
}

/// `stat` of a node below the root: its device number, `None` if it does not exist.
fn stat_node(root: &Root, spec: &str) -> Result<Option<DevNum>> {
    let path = root.path().join(spec.trim_start_matches('/'));
    if path
        .components()
        .any(|c| c == std::path::Component::ParentDir)
    {
        return Err(Error::invalid("block device", spec, "contains '..'"));
    }
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
fn open_checked(node: &BlockNode, extra: OFlags) -> Result<OwnedFd> {
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

/// Writes everything cached for the device to it and drops its clean cache:
///
/// 1. `fsync(2)`: writes back the device's page cache and sends the device a cache flush
///    (SYNCHRONIZE CACHE), so the data is on stable storage, not just in the array's cache;
/// 2. `ioctl(BLKFLSBUF)`: writes back again (or syncs the filesystem mounted on it) and
///    invalidates the page cache, so nothing stale is served if the LUN comes back.
///
/// Both block until the I/O completes, which on a dead transport can take as long as the
/// SCSI error handler wants. They run on a helper thread, and if `deadline` passes first this
/// returns [`Error::Timeout`] and leaves the thread to finish on its own; the caller is never
/// held past its deadline.
pub fn flush(node: &BlockNode, deadline: Instant) -> Result<()> {
    let fd = open_checked(node, OFlags::empty())?;
    let path = node.path.clone();
    let what = || format!("flush of {node} (the device is not completing writes)");
    crate::wait::bounded(deadline, &what, move || {
        rustix::fs::fsync(&fd).map_err(|e| Error::io(&path, e.into()))?;
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

/// The device's logical block size in bytes (`BLKSSZGET`).
pub fn logical_block_size(node: &BlockNode) -> Result<u32> {
    let fd = open_checked(node, OFlags::NONBLOCK)?;
    crate::ioctl::blksszget(&fd).map_err(|source| Error::Ioctl {
        op: "BLKSSZGET",
        target: node.to_string(),
        source,
    })
}

// ---------------------------------------------------------------------------------------
// Who is using a device
// ---------------------------------------------------------------------------------------

/// Who uses a set of devices. Empty means nothing the kernel or this node knows of would
/// notice the devices going away.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Usage {
    /// Filesystems mounted from the devices, their partitions or anything stacked on them.
    pub mounts: Vec<MountUse>,
    /// Devices stacked on them that are not part of the volume (LVM, md, a foreign dm map).
    pub holders: Vec<String>,
    /// Active swap areas on them.
    pub swaps: Vec<String>,
    /// Processes holding one of them open.
    pub openers: Vec<Opener>,
    /// Open file descriptors of the processes [`UsageScope::ignore_openers`] names (udev's
    /// probes, multipathd): not users, but listed so that a caller can tell whether they
    /// explain a device's whole open count.
    pub managers: Vec<Opener>,
    /// Devices an `O_EXCL` open finds claimed, where nothing above explains the claim.
    pub claimed: Vec<String>,
}

/// A mount of one of the devices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountUse {
    /// The device the filesystem is on (`sdc1`, `dm-0`).
    pub device: String,
    /// Where it is mounted.
    pub mount_point: PathBuf,
}

/// A process with one of the devices open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opener {
    /// Its pid.
    pub pid: u32,
    /// Its command name (`/proc/PID/comm`).
    pub comm: String,
    /// The device it has open.
    pub device: String,
    /// The descriptor was opened read-only (`O_RDONLY` in `/proc/PID/fdinfo/FD`): it cannot
    /// have written anything. `false` when it is writable or its mode could not be read.
    pub read_only: bool,
}

impl Usage {
    /// Nothing uses the devices.
    pub fn is_empty(&self) -> bool {
        self.mounts.is_empty()
            && self.holders.is_empty()
            && self.swaps.is_empty()
            && self.openers.is_empty()
            && self.claimed.is_empty()
    }

    /// Only processes hold the devices open: a state that may pass on its own (udev's
    /// probes open every new disk for a moment), unlike a mount or a holder.
    pub fn only_openers(&self) -> bool {
        !self.openers.is_empty()
            && self.mounts.is_empty()
            && self.holders.is_empty()
            && self.swaps.is_empty()
            && self.claimed.is_empty()
    }
}

impl fmt::Display for Usage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        for m in &self.mounts {
            parts.push(format!(
                "{} mounted at {}",
                m.device,
                mountinfo::show(&m.mount_point)
            ));
        }
        if !self.holders.is_empty() {
            parts.push(format!("held by {}", self.holders.join(" ")));
        }
        for s in &self.swaps {
            parts.push(format!("active swap on {s}"));
        }
        for o in &self.openers {
            parts.push(format!("{} open by pid {} ({})", o.device, o.pid, o.comm));
        }
        for c in &self.claimed {
            parts.push(format!("{c} claimed exclusively (O_EXCL open gives EBUSY)"));
        }
        if parts.is_empty() {
            f.write_str("not in use")
        } else {
            f.write_str(&parts.join("; "))
        }
    }
}

/// How long a device held only by open file descriptors (no mount, holder or swap) is given
/// to let go before a take-down refuses: udev's probes open every new or changed disk and map
/// for a moment, and under load that moment lasts seconds.
pub const OPENER_GRACE: std::time::Duration = std::time::Duration::from_secs(3);

/// What [`usage`] should not count as a user.
#[derive(Debug, Clone, Default)]
pub struct UsageScope<'a> {
    /// Kernel names of devices that belong to the volume being taken down (its multipath map
    /// and partition maps): holders among them are not users, but their own users are.
    pub own: &'a [String],
    /// Command names whose open file descriptors do not count: the daemon that manages the
    /// devices and lets go of them when they are removed (`multipathd` checks every path).
    pub ignore_openers: &'a [&'a str],
}

/// Who uses `devices`, their partitions, and whatever is stacked on them (followed up through
/// `holders/`). Reads sysfs, `/proc/self/mountinfo`, `/proc/swaps` and `/proc/*/fd`; issues
/// one `O_EXCL` open on each device at the top of a stack.
///
/// Process file descriptors of other users are visible only to root; without root that part
/// of the check sees only the caller's own processes.
pub fn usage(root: &Root, devices: &[BlockNode], scope: &UsageScope<'_>) -> Result<Usage> {
    let mut usage = Usage::default();
    // Every device whose users count: the devices, their partitions, and foreign stacks on
    // them; plus the volume's own devices, whose mounts and openers count too.
    let mut family: BTreeSet<BlockNode> = BTreeSet::new();
    let mut todo: Vec<BlockNode> = devices.to_vec();
    for own in scope.own {
        if let Some(n) = by_name(root, own)? {
            todo.push(n);
        }
    }
    let mut foreign_holders = BTreeSet::new();
    while let Some(n) = todo.pop() {
        if family.len() > 4096 || !family.insert(n.clone()) {
            continue;
        }
        let dir = root.sys("class/block").join(&n.name);
        for sub in entries(&dir)? {
            if sub.starts_with(&n.name) && dir.join(&sub).join("partition").exists() {
                if let Some(p) = by_name(root, &sub)? {
                    todo.push(p);
                }
            }
        }
        for h in sysfs::sub_entries(&dir, "holders")? {
            if !scope.own.contains(&h) {
                foreign_holders.insert(h.clone());
            }
            if let Some(hn) = by_name(root, &h)? {
                todo.push(hn);
            }
        }
    }
    usage.holders = foreign_holders.into_iter().collect();
    let numbers: Vec<DevNum> = family.iter().map(|n| n.dev).collect();
    let name_of = |d: DevNum| {
        family
            .iter()
            .find(|n| n.dev == d)
            .map_or_else(|| d.to_string(), |n| n.name.clone())
    };

    for m in mountinfo::on_devices(&mountinfo::read(root)?, &numbers) {
        usage.mounts.push(MountUse {
            device: name_of(m.dev),
            mount_point: m.mount_point.clone(),
        });
    }
    for s in swaps(root)? {
        if let Some(d) = node_number(root, &s) {
            if numbers.contains(&d) {
                usage.swaps.push(name_of(d));
            }
        }
    }
    for o in openers(root, &numbers)? {
        let opener = Opener {
            pid: o.pid,
            device: name_of(o.dev),
            read_only: o.read_only,
            comm: o.comm,
        };
        if scope.ignore_openers.contains(&opener.comm.as_str()) {
            usage.managers.push(opener);
        } else {
            usage.openers.push(opener);
        }
    }
    // The probe explains nothing by itself, so only ask it about devices nothing above
    // accounts for: tops of stacks that are not mounted or swap.
    for n in &family {
        let top = sysfs::sub_entries(&root.sys("class/block").join(&n.name), "holders")?.is_empty();
        let explained = usage.mounts.iter().any(|m| m.device == n.name)
            || usage.swaps.contains(&n.name)
            || usage.holders.contains(&n.name);
        if top && !explained && is_claimed(n) {
            usage.claimed.push(n.name.clone());
        }
    }
    Ok(usage)
}

/// Whether an `O_EXCL` open of the node fails with `EBUSY`: a filesystem, swap, dm, md or
/// another exclusive opener has claimed it. A node that cannot be opened for another reason
/// says nothing.
fn is_claimed(node: &BlockNode) -> bool {
    matches!(
        open_checked(node, OFlags::EXCL | OFlags::NONBLOCK),
        Err(Error::Io { ref source, .. }) if source.raw_os_error() == Some(libc::EBUSY)
    )
}

/// The device number of a node path as written in `/proc/swaps`, looked up below the root.
fn node_number(root: &Root, path: &Path) -> Option<DevNum> {
    let p = root.path().join(path.strip_prefix("/").unwrap_or(path));
    block_number(&rustix::fs::stat(&p).ok()?)
}

/// The active swap areas in `<root>/proc/swaps`. An absent file (no swap support) is none.
fn swaps(root: &Root) -> Result<Vec<PathBuf>> {
    let path = root.proc("swaps");
    match std::fs::read(&path) {
        Ok(text) => Ok(parse_swaps(&text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(Error::io(&path, e)),
    }
}

/// The file names in `/proc/swaps` text: the first column after the header, with the same
/// octal escapes as mountinfo.
pub fn parse_swaps(text: &[u8]) -> Vec<PathBuf> {
    use std::os::unix::ffi::OsStringExt;
    text.split(|&b| b == b'\n')
        .skip(1)
        .filter_map(|l| {
            l.split(|&b| b == b' ' || b == b'\t')
                .find(|f| !f.is_empty())
        })
        .map(|f| PathBuf::from(std::ffi::OsString::from_vec(mountinfo::unescape(f))))
        .collect()
}

/// One open file descriptor of a block device, as `/proc/PID/fd` and `fdinfo` show it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct OpenFd {
    pid: u32,
    comm: String,
    dev: DevNum,
    read_only: bool,
}

/// Every descriptor that has one of `numbers` open, from `/proc/*/fd`. Processes that vanish
/// or whose fds cannot be read (another user's, without root) are skipped.
///
/// This walk is the costliest part of an in-use check (one `stat` per open file on the
/// node), so it looks up each fd relative to its process's `fd/` directory rather than by
/// full path, and splits the processes between threads when there are CPUs for them.
fn openers(root: &Root, numbers: &[DevNum]) -> Result<Vec<OpenFd>> {
    let proc_dir = root.proc("");
    let proc_fd = rustix::fs::open(
        &proc_dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| Error::io(&proc_dir, e.into()))?;
    let pids: Vec<u32> = std::fs::read_dir(&proc_dir)
        .map_err(|e| Error::io(&proc_dir, e))?
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(crate::hctl::decimal::<u32>))
        .collect();
    let threads = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .clamp(1, OPENER_THREADS_MAX)
        .min(pids.len().div_ceil(OPENER_PIDS_PER_THREAD).max(1));
    let mut out: Vec<OpenFd> = if threads == 1 {
        openers_among(&proc_fd, &pids, numbers)
    } else {
        let proc_fd = &proc_fd;
        std::thread::scope(|s| {
            let workers: Vec<_> = pids
                .chunks(pids.len().div_ceil(threads))
                .map(|chunk| s.spawn(move || openers_among(proc_fd, chunk, numbers)))
                .collect();
            workers
                .into_iter()
                // A worker only reads; if one panicked, its processes count as unreadable.
                .flat_map(|w| w.join().unwrap_or_default())
                .collect()
        })
    };
    // One entry per process, device and mode: descriptors dup'ed from one open share one
    // open count, so counting each would explain more of a device's opens than it should.
    out.sort();
    out.dedup();
    Ok(out)
}

/// At most this many threads walk `/proc` for [`openers`].
const OPENER_THREADS_MAX: usize = 4;
/// Below this many processes per thread another thread costs more than it saves.
const OPENER_PIDS_PER_THREAD: usize = 64;

/// [`openers`] for the processes `pids`, with `/proc` open as `proc_fd`.
fn openers_among(proc_fd: &OwnedFd, pids: &[u32], numbers: &[DevNum]) -> Vec<OpenFd> {
    let mut out = Vec::new();
    for &pid in pids {
        let Ok(fd_dir) = rustix::fs::openat(
            proc_fd,
            format!("{pid}/fd"),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        ) else {
            continue;
        };
        // `Dir::new` reads through this very fd (`read_from` would open another).
        let Ok(mut dir) = rustix::fs::Dir::new(fd_dir) else {
            continue;
        };
        let mut fds = Vec::new();
        while let Some(Ok(entry)) = dir.read() {
            if !entry.file_name().to_bytes().starts_with(b".") {
                fds.push(entry.file_name().to_owned());
            }
        }
        let Ok(fd_dir) = dir.fd() else {
            continue;
        };
        let mut comm: Option<String> = None;
        for name in &fds {
            let Some(d) = open_block_device(fd_dir, name) else {
                continue;
            };
            if !numbers.contains(&d) {
                continue;
            }
            let comm = comm
                .get_or_insert_with(|| process_comm(proc_fd, pid))
                .clone();
            out.push(OpenFd {
                pid,
                comm,
                dev: d,
                read_only: opened_read_only(proc_fd, pid, name),
            });
        }
    }
    out
}

/// The block device an entry of a `/proc/PID/fd` directory refers to, if it is one.
///
/// `statx` follows the magic link to the open file itself, asking for its type and device
/// number only, with `AT_STATX_DONT_SYNC`: a file open on NFS, CIFS or FUSE would otherwise
/// cost a round trip to its server, and a process may hold thousands. Where `statx` is
/// refused (old seccomp profiles), plain `stat` does the same job, slower.
fn open_block_device(fd_dir: BorrowedFd<'_>, name: &std::ffi::CStr) -> Option<DevNum> {
    use rustix::fs::{AtFlags, StatxFlags};
    match rustix::fs::statx(fd_dir, name, AtFlags::STATX_DONT_SYNC, StatxFlags::TYPE) {
        Ok(st) => (FileType::from_raw_mode(st.stx_mode.into()) == FileType::BlockDevice).then_some(
            DevNum {
                major: st.stx_rdev_major,
                minor: st.stx_rdev_minor,
            },
        ),
        Err(rustix::io::Errno::NOSYS | rustix::io::Errno::PERM) => {
            block_number(&rustix::fs::statat(fd_dir, name, AtFlags::empty()).ok()?)
        }
        Err(_) => None,
    }
}

/// Whether descriptor `fd` of `pid` was opened read-only: the access mode in the octal
/// `flags:` line of `/proc/PID/fdinfo/FD`. Unreadable counts as writable.
fn opened_read_only(proc_fd: &OwnedFd, pid: u32, fd: &std::ffi::CStr) -> bool {
    let path = format!("{pid}/fdinfo/{}", fd.to_string_lossy());
    let Ok(file) = rustix::fs::openat(
        proc_fd,
        path,
        OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    ) else {
        return false;
    };
    let mut buf = [0u8; 256];
    let n = rustix::io::read(&file, &mut buf).unwrap_or(0);
    fdinfo_access_mode(&buf[..n]) == Some(libc::O_RDONLY)
}

/// The access mode (`O_RDONLY`, `O_WRONLY`, `O_RDWR`) in `fdinfo` text: its `flags:` line
/// holds the open flags in octal.
fn fdinfo_access_mode(text: &[u8]) -> Option<i32> {
    let text = std::str::from_utf8(text).ok()?;
    let flags = text.lines().find_map(|l| l.strip_prefix("flags:"))?.trim();
    let flags = i32::from_str_radix(flags, 8).ok()?;
    Some(flags & libc::O_ACCMODE)
}

/// `/proc/PID/comm` without its newline; empty when the process is gone.
fn process_comm(proc_fd: &OwnedFd, pid: u32) -> String {
    let Ok(fd) = rustix::fs::openat(
        proc_fd,
        format!("{pid}/comm"),
        OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    ) else {
        return String::new();
    };
    let mut buf = [0u8; 64];
    let n = rustix::io::read(&fd, &mut buf).unwrap_or(0);
    String::from_utf8_lossy(&buf[..n]).trim_end().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn swaps_parse_with_escapes() {
        let text = b"Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n\
/dev/sdc2                               partition\t1048572\t\t0\t\t-2\n\
/swap\\040file                           file\t\t1024\t\t0\t\t-3\n";
        assert_eq!(
            parse_swaps(text),
            [PathBuf::from("/dev/sdc2"), PathBuf::from("/swap file")]
        );
        assert!(parse_swaps(b"Filename Type Size Used Priority\n").is_empty());
        assert!(parse_swaps(b"").is_empty());
    }

    #[test]
    fn usage_message_names_every_user() {
        let u = Usage {
            mounts: vec![MountUse {
                device: "sdc1".into(),
                mount_point: "/mnt/a b".into(),
            }],
            holders: vec!["dm-3".into()],
            swaps: vec!["sdc2".into()],
            openers: vec![Opener {
                pid: 42,
                comm: "dd".into(),
                device: "sdc".into(),
                read_only: false,
            }],
            managers: vec![Opener {
                pid: 7,
                comm: "(udev-worker)".into(),
                device: "sdc".into(),
                read_only: true,
            }],
            claimed: vec![],
        };
        assert_eq!(
            u.to_string(),
            "sdc1 mounted at /mnt/a b; held by dm-3; active swap on sdc2; sdc open by pid 42 (dd)"
        );
        assert!(!u.is_empty());
        assert!(!u.only_openers());
        assert_eq!(Usage::default().to_string(), "not in use");
    }

    #[test]
    fn fdinfo_access_modes() {
        let ro = b"pos:\t0\nflags:\t0100000\nmnt_id:\t22\nino:\t5\n";
        assert_eq!(fdinfo_access_mode(ro), Some(libc::O_RDONLY));
        assert_eq!(
            fdinfo_access_mode(b"pos:\t0\nflags:\t02100002\n"),
            Some(libc::O_RDWR)
        );
        assert_eq!(fdinfo_access_mode(b"flags:\t01\n"), Some(libc::O_WRONLY));
        assert_eq!(fdinfo_access_mode(b"pos:\t0\n"), None);
        assert_eq!(fdinfo_access_mode(b"flags:\t9z\n"), None);
        assert_eq!(fdinfo_access_mode(b"flags:\t0\xff\n"), None);
    }
}

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
use std::os::fd::{AsFd, BorrowedFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::time::Instant;

use rustix::fs::{FileType, Mode, OFlags};

use crate::error::{Error, Result};
use crate::hctl::Hctl;
use crate::helper::{self, Subject};
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
    /// Filesystems mounted from the devices, their partitions or anything stacked on them,
    /// and bind mounts of their device nodes, in every mount namespace found.
    pub mounts: Vec<MountUse>,
    /// Loop devices whose backing file is one of the devices' nodes (through any path or
    /// bind mount: kubelet's raw-block "descriptor lock"), or a file on a filesystem on one.
    pub loops: Vec<LoopUse>,
    /// Devices stacked on them that are not part of the volume (LVM, md, a foreign dm map).
    pub holders: Vec<String>,
    /// Active swap areas on them.
    pub swaps: Vec<String>,
    /// Processes holding one of them open.
    pub openers: Vec<Opener>,
    /// Open file descriptors of path managers (see [`UsageScope::ignore_openers`]): any of
    /// theirs on a path device (multipathd's checkers, udev's probes), and only read-only
    /// ones (udev's probes) on a map or partition. Not users, but listed so that a caller
    /// can tell whether they explain a device's whole open count.
    pub managers: Vec<Opener>,
    /// Descriptors of this process's own helper threads: a flush or probe an earlier call
    /// gave up waiting for, still in its kernel call (see [`flush`]). Not users: the step
    /// that needs the device waits for them, within its deadline.
    pub helpers: Vec<Opener>,
    /// Devices an `O_EXCL` open finds claimed, where nothing above explains the claim.
    pub claimed: Vec<String>,
    /// What could not be looked at (a process whose fds or mount table could not be read, a
    /// loop device whose backing could not be read): the check is partial, so the devices
    /// cannot be called unused.
    pub unchecked: Vec<Unchecked>,
    /// Mount table lines that did not parse and were passed over (see
    /// [`mountinfo::parse_table`]); one whose device field names one of the devices is in
    /// `unchecked` as well.
    pub mountinfo_skipped: usize,
}

/// How a device is mounted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MountKind {
    /// A filesystem on the device.
    Filesystem,
    /// The device's node itself, bind-mounted onto a file (how kubelet publishes a raw
    /// block volume into a pod).
    DeviceNode,
}

/// The mount namespace a mount was found in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MountNamespace {
    /// Its `ns/mnt` inode, when it could be read.
    pub inode: Option<u64>,
    /// A process in it whose table was read; `None` for this process's own.
    pub pid: Option<u32>,
}

impl fmt::Display for MountNamespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.pid {
            Some(pid) => write!(f, "mount namespace of pid {pid}")?,
            None => f.write_str("this process's mount namespace")?,
        }
        if let Some(i) = self.inode {
            write!(f, " mnt:[{i}]")?;
        }
        Ok(())
    }
}

/// A mount of one of the devices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountUse {
    /// The device mounted (`sdc1`, `dm-0`).
    pub device: String,
    /// Where it is mounted, as its namespace sees it.
    pub mount_point: PathBuf,
    /// A filesystem, or a bind mount of the node.
    pub kind: MountKind,
    /// Where the mount was seen.
    pub namespace: MountNamespace,
}

impl fmt::Display for MountUse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let at = mountinfo::show(&self.mount_point);
        match self.kind {
            MountKind::Filesystem => write!(f, "{} mounted at {at}", self.device)?,
            MountKind::DeviceNode => {
                write!(f, "node /dev/{} bind-mounted at {at}", self.device)?;
            }
        }
        write!(f, " ({})", self.namespace)
    }
}

/// A loop device backed by one of the devices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoopUse {
    /// The loop device (`loop0`).
    pub loop_device: String,
    /// Its backing file as sysfs names it (the binder's path: a bind mount of the node, the
    /// node itself, or a file on a filesystem on the device).
    pub backing_file: PathBuf,
    /// The device behind it (`dm-0`).
    pub device: String,
}

/// Something the check could not look at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unchecked {
    /// What: `pid 42`, `loop3`, `mount table of pid 1`.
    pub what: String,
    /// Why, with the errno.
    pub reason: String,
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
    /// Nothing uses the devices, and everything that could use them was looked at.
    pub fn is_empty(&self) -> bool {
        !self.has_users() && self.unchecked.is_empty()
    }

    /// A user was found: a mount, loop device, holder, swap, opener or exclusive claim.
    pub fn has_users(&self) -> bool {
        !(self.mounts.is_empty()
            && self.loops.is_empty()
            && self.holders.is_empty()
            && self.swaps.is_empty()
            && self.openers.is_empty()
            && self.claimed.is_empty())
    }

    /// Only processes hold the devices open: a state that may pass on its own (udev's
    /// probes open every new disk for a moment), unlike a mount or a holder.
    pub fn only_openers(&self) -> bool {
        !self.openers.is_empty()
            && self.mounts.is_empty()
            && self.loops.is_empty()
            && self.holders.is_empty()
            && self.swaps.is_empty()
            && self.claimed.is_empty()
            && self.unchecked.is_empty()
    }

    /// The refusal to take `device` away, or `None` when nothing uses it:
    /// [`Error::Busy`] when a user was found, [`Error::Unverified`] when none was but the
    /// check could not look everywhere.
    pub fn refusal(&self, device: &str) -> Option<Error> {
        if self.has_users() {
            Some(Error::Busy {
                device: device.to_owned(),
                reason: self.to_string(),
            })
        } else if !self.unchecked.is_empty() {
            Some(Error::Unverified {
                device: device.to_owned(),
                reason: self.to_string(),
            })
        } else {
            None
        }
    }
}

impl fmt::Display for Usage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        for m in &self.mounts {
            parts.push(m.to_string());
        }
        for l in &self.loops {
            parts.push(format!(
                "loop device {} is backed by {} (backing file {})",
                l.loop_device,
                l.device,
                mountinfo::show(&l.backing_file)
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
        for u in &self.unchecked {
            parts.push(format!("could not check {}: {}", u.what, u.reason));
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
    /// Command names whose open file descriptors on a *path device* (a SCSI disk among the
    /// devices asked about), and whose read-only ones on a map or partition, do not count:
    /// the daemon that manages paths and lets go of them when they are removed
    /// (`multipathd` checks every path), and udev's probes. A map's removal still fails
    /// while a probe holds it, so such a probe delays a take-down but never lets one lose
    /// data.
    ///
    /// A command name is whatever a process sets (`PR_SET_NAME`), so it is not enough: the
    /// process must also run as root and be one of [`MANAGER_EXES`] (`/proc/PID/exe`), or be
    /// a child of udevd (a worker forked from it).
    pub ignore_openers: &'a [&'a str],
}

/// Executables (`/proc/PID/exe` file names) whose processes may be path managers. On
/// current systemd `systemd-udevd` is a link to `udevadm`, which is what `exe` shows.
pub const MANAGER_EXES: &[&str] = &["multipathd", "systemd-udevd", "udevd", "udevadm"];

/// Executables of udevd, whose children (its workers) may be path managers.
const UDEVD_EXES: &[&str] = &["systemd-udevd", "udevd", "udevadm"];

/// The devices asked about, their partitions and everything stacked on them.
struct Family {
    nodes: Vec<BlockNode>,
}

impl Family {
    fn numbers(&self) -> Vec<DevNum> {
        self.nodes.iter().map(|n| n.dev).collect()
    }

    fn name_of(&self, d: DevNum) -> String {
        self.nodes
            .iter()
            .find(|n| n.dev == d)
            .map_or_else(|| d.to_string(), |n| n.name.clone())
    }

    /// The family member a devtmpfs bind mount's root (`/dm-0`, `/mapper/mpatha`) is the
    /// node of: by name, or failing that by the number of the node at that path below the
    /// root's `/dev` (a node udev or dm created under another name).
    fn of_node(&self, root: &Root, node: &Path) -> Option<String> {
        let rel = node.strip_prefix("/").unwrap_or(node);
        if let Some(n) = self.nodes.iter().find(|n| Path::new(&n.name) == rel) {
            return Some(n.name.clone());
        }
        let st = rustix::fs::stat(root.dev(rel)).ok()?;
        let d = block_number(&st)?;
        self.nodes
            .iter()
            .find(|n| n.dev == d)
            .map(|n| n.name.clone())
    }

    /// The family's mounts in one mount table, into `usage`.
    fn mounts_in(
        &self,
        root: &Root,
        table: &mountinfo::MountTable,
        ns: MountNamespace,
        usage: &mut Usage,
    ) {
        let numbers = self.numbers();
        for m in &table.mounts {
            let found = if numbers.contains(&m.dev) {
                Some((self.name_of(m.dev), MountKind::Filesystem))
            } else {
                m.device_node()
                    .and_then(|node| self.of_node(root, node))
                    .map(|name| (name, MountKind::DeviceNode))
            };
            if let Some((device, kind)) = found {
                let u = MountUse {
                    device,
                    mount_point: m.mount_point.clone(),
                    kind,
                    namespace: ns,
                };
                if !usage.mounts.contains(&u) {
                    usage.mounts.push(u);
                }
            }
        }
        usage.mountinfo_skipped += table.skipped.len();
        for line in &table.skipped {
            if let Some(d) = line.dev.filter(|d| numbers.contains(d)) {
                usage.unchecked.push(Unchecked {
                    what: format!("line {} of the mount table ({ns})", line.number),
                    reason: format!(
                        "it is a mount of {} and did not parse: {}",
                        self.name_of(d),
                        line.reason
                    ),
                });
            }
        }
    }
}

/// The mount namespaces whose tables were read, so that each is read once.
///
/// A namespace is known by its `ns/mnt` inode. Where that link cannot be read (it needs
/// ptrace access to the process, which root without `CAP_SYS_PTRACE` lacks for processes
/// with more capabilities, pid 1 among them), the table itself still can be, and its first
/// line names the namespace's root mount, whose id no other namespace shares.
#[derive(Debug, Default)]
struct SeenNamespaces {
    inodes: std::collections::HashSet<u64>,
    root_mounts: std::collections::HashSet<u32>,
}

impl SeenNamespaces {
    /// Claims namespace `inode` for reading; `false` if it was claimed before.
    fn claim_inode(&mut self, inode: u64) -> bool {
        self.inodes.insert(inode)
    }

    /// Claims a table just read by its root mount; `false` if that namespace was read
    /// before (through another process whose `ns/mnt` could not be read, or could).
    fn claim_table(&mut self, table: &mountinfo::MountTable) -> bool {
        table
            .mounts
            .first()
            .is_none_or(|m| self.root_mounts.insert(m.id))
    }
}

/// Locks `seen`; a poisoned lock only means another worker panicked, and the sets are still
/// valid.
fn lock_seen(seen: &std::sync::Mutex<SeenNamespaces>) -> std::sync::MutexGuard<'_, SeenNamespaces> {
    seen.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The inode of `<root>/proc/<who>/ns/mnt` (`mnt:[4026531841]`): equal inodes, one mount
/// namespace. `Err` with the errno when the link cannot be read.
fn mnt_ns(proc_fd: BorrowedFd<'_>, who: &str) -> std::result::Result<u64, rustix::io::Errno> {
    let link = rustix::fs::readlinkat(proc_fd, format!("{who}/ns/mnt"), Vec::new())?;
    link.to_bytes()
        .strip_prefix(b"mnt:[")
        .and_then(|r| r.strip_suffix(b"]"))
        .and_then(|n| std::str::from_utf8(n).ok())
        .and_then(crate::hctl::decimal::<u64>)
        .ok_or(rustix::io::Errno::INVAL)
}

/// Whether an errno on a `/proc/PID/...` file means the process is gone (not a gap in the
/// check).
fn process_gone(e: rustix::io::Errno) -> bool {
    matches!(e, rustix::io::Errno::NOENT | rustix::io::Errno::SRCH)
}

/// Who uses `devices`, their partitions, and whatever is stacked on them (followed up through
/// `holders/`), cheapest and most exact checks first:
///
/// 1. sysfs: `holders/` (stacked devices);
/// 2. the mount tables of the host (`<root>/proc/1/mountinfo`) and of this process: mounts
///    by device number, and bind mounts of the devices' nodes (devtmpfs, by mount root);
/// 3. `/proc/swaps`;
/// 4. bound loop devices backed by the devices (`LOOP_GET_STATUS64`);
///
/// and, only when none of those found a user (a refusal needs one reason, not all):
///
/// 5. every process (`/proc/*`, split between threads): its open fds (`fd/`, or each
///    thread's `task/*/fd/` when the main thread has exited), and the mount table of every
///    mount namespace not read yet (deduplicated by `ns/mnt` inode);
/// 6. one `O_EXCL` open on each device at the top of a stack that nothing above explains,
///    given until `deadline` (an open waits while a partition scan holds the disk).
///
/// A process whose fds or mount table cannot be read (`EACCES` without root or
/// `CAP_SYS_PTRACE`) lands in [`Usage::unchecked`]: the answer is then "could not check",
/// never "not in use".
pub fn usage(
    root: &Root,
    devices: &[BlockNode],
    scope: &UsageScope<'_>,
    deadline: Instant,
) -> Result<Usage> {
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
    let family = Family {
        nodes: family.into_iter().collect(),
    };
    let numbers = family.numbers();
    // The devices the path-manager rule applies to: SCSI disks asked about, not maps (a
    // `dm/` directory) nor partitions.
    let paths: Vec<DevNum> = devices
        .iter()
        .filter(|n| {
            let dir = root.sys("class/block").join(&n.name);
            !dir.join("dm").exists() && !dir.join("partition").exists()
        })
        .map(|n| n.dev)
        .collect();

    let proc_dir = root.proc("");
    let proc_fd = rustix::fs::open(
        &proc_dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| Error::io(&proc_dir, e.into()))?;
    if let Some(u) = foreign_pid_namespace(&proc_fd, &proc_dir) {
        usage.unchecked.push(u);
    }

    // The host's mount table, then this process's if it is another namespace.
    let seen = std::sync::Mutex::new(SeenNamespaces::default());
    let host_ns = mnt_ns(proc_fd.as_fd(), "1").ok();
    if let Some(i) = host_ns {
        lock_seen(&seen).claim_inode(i);
    }
    match mountinfo::read_of(root, 1) {
        Ok(table) => {
            lock_seen(&seen).claim_table(&table);
            let ns = MountNamespace {
                inode: host_ns,
                pid: Some(1),
            };
            family.mounts_in(root, &table, ns, &mut usage);
        }
        // A tree without pid 1 (a fixture): this process's table stands for it.
        Err(e) if e.is_gone() => {}
        Err(e) => usage.unchecked.push(Unchecked {
            what: "the mount table of pid 1".into(),
            reason: e.to_string(),
        }),
    }
    let self_ns = mnt_ns(proc_fd.as_fd(), "self").ok();
    if self_ns.is_none_or(|i| lock_seen(&seen).claim_inode(i)) {
        let table = mountinfo::read(root)?;
        if lock_seen(&seen).claim_table(&table) {
            let ns = MountNamespace {
                inode: self_ns,
                pid: None,
            };
            family.mounts_in(root, &table, ns, &mut usage);
        }
    }
    for s in swaps(root)? {
        if let Some(d) = node_number(root, &s) {
            if numbers.contains(&d) {
                usage.swaps.push(family.name_of(d));
            }
        }
    }
    for lo in crate::loopdev::bound(root)? {
        match crate::loopdev::backing(root, &lo) {
            Ok(Some(b)) => {
                if let Some(d) = b.uses_any(&numbers) {
                    usage.loops.push(LoopUse {
                        loop_device: lo.node.name.clone(),
                        backing_file: lo.backing_file.clone(),
                        device: family.name_of(d),
                    });
                }
            }
            Ok(None) => {}
            Err(e) => usage.unchecked.push(Unchecked {
                what: format!("loop device {}", lo.node.name),
                reason: format!("its backing {}: {e}", lo.backing_file.display()),
            }),
        }
    }
    if usage.has_users() {
        return Ok(usage);
    }

    let scan = scan_processes(root, &proc_fd, &family, &seen)?;
    usage.unchecked.extend(scan.unchecked);
    usage.mountinfo_skipped += scan.usage.mountinfo_skipped;
    for m in scan.usage.mounts {
        if !usage.mounts.contains(&m) {
            usage.mounts.push(m);
        }
    }
    usage.unchecked.extend(scan.usage.unchecked);
    usage.helpers = scan
        .helpers
        .into_iter()
        .map(|o| Opener {
            pid: o.pid,
            device: family.name_of(o.dev),
            read_only: o.read_only,
            comm: o.comm,
        })
        .collect();
    for o in scan.openers {
        let on_path = paths.contains(&o.dev);
        let opener = Opener {
            pid: o.pid,
            device: family.name_of(o.dev),
            read_only: o.read_only,
            comm: o.comm,
        };
        // On a path a manager's descriptor is not a use: multipathd checks every path, and
        // udev probes it. On a map or a partition only a read-only one is (udev's blkid), and
        // it is listed, not ignored: the map's removal still waits for it to close, and a map
        // no path can serve is not taken down while it is open (ops::detach).
        if (on_path || opener.read_only)
            && scope.ignore_openers.contains(&opener.comm.as_str())
            && is_path_manager(&proc_fd, opener.pid)
        {
            usage.managers.push(opener);
        } else {
            usage.openers.push(opener);
        }
    }
    // The probe explains nothing by itself, so only ask it about devices nothing above
    // accounts for: tops of stacks that are not mounted or swap.
    for n in &family.nodes {
        let top = sysfs::sub_entries(&root.sys("class/block").join(&n.name), "holders")?.is_empty();
        let explained = usage.mounts.iter().any(|m| m.device == n.name)
            || usage.swaps.contains(&n.name)
            || usage.holders.contains(&n.name);
        if top && !explained && is_claimed(n, deadline)? {
            usage.claimed.push(n.name.clone());
        }
    }
    Ok(usage)
}

/// The inode number of the initial pid namespace's `ns/pid` link (`PROC_PID_INIT_INO` in the
/// kernel's `proc_ns.h`): fixed, so pid 1 of the host's `/proc` always shows `pid:[4026531836]`.
const HOST_PID_NS: &[u8] = b"pid:[4026531836]";

/// [`Unchecked`] when the procfs at `proc_dir` belongs to a pid namespace other than the
/// host's (a node plugin's container without `hostPID`): its pid 1 is not the host's init,
/// so the processes and mount namespaces outside it, kubelet's and the pods', are not seen
/// and the check cannot call anything unused. `None` when it is the host's, or when that
/// cannot be told (`ns/pid` unreadable without ptrace access, or absent in a fixture).
fn foreign_pid_namespace(proc_fd: &OwnedFd, proc_dir: &Path) -> Option<Unchecked> {
    let link = rustix::fs::readlinkat(proc_fd, "1/ns/pid", Vec::new()).ok()?;
    (link.as_bytes() != HOST_PID_NS).then(|| Unchecked {
        what: "the processes outside this pid namespace".into(),
        reason: format!(
            "pid 1 of {} is in {}, not the host's pid namespace: give the check the host's \
             /proc (hostPID, or the host's root with --root)",
            proc_dir.display(),
            link.to_string_lossy()
        ),
    })
}

/// Whether process `pid`, found with a path open under a path manager's command name, is
/// one: it runs as root (real and effective uid 0 in `status`), and its executable is one
/// of [`MANAGER_EXES`] or its parent's is udevd's (a worker udevd forked). A command name
/// alone is set by any process with `PR_SET_NAME`.
fn is_path_manager(proc_fd: &OwnedFd, pid: u32) -> bool {
    let Some(status) = read_small(proc_fd, &format!("{pid}/status")) else {
        return false;
    };
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.split_whitespace().collect::<Vec<_>>())
    };
    let root_uid = field("Uid:").is_some_and(|u| u.len() >= 2 && u[0] == "0" && u[1] == "0");
    if !root_uid {
        return false;
    }
    if exe_name(proc_fd, pid).is_some_and(|e| MANAGER_EXES.contains(&e.as_str())) {
        return true;
    }
    field("PPid:")
        .and_then(|p| p.first().and_then(|p| crate::hctl::decimal::<u32>(p)))
        .and_then(|ppid| exe_name(proc_fd, ppid))
        .is_some_and(|e| UDEVD_EXES.contains(&e.as_str()))
}

/// The file name of `/proc/PID/exe`, without the ` (deleted)` the kernel appends when the
/// binary was replaced (a package upgrade).
fn exe_name(proc_fd: &OwnedFd, pid: u32) -> Option<String> {
    let link = rustix::fs::readlinkat(proc_fd, format!("{pid}/exe"), Vec::new()).ok()?;
    let link = link.to_string_lossy();
    let link = link.strip_suffix(" (deleted)").unwrap_or(&link);
    Path::new(link)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
}

/// A small `/proc` file (`status`, `stat`, `comm`) below `proc_fd`, as text.
fn read_small(proc_fd: &OwnedFd, path: &str) -> Option<String> {
    let fd = rustix::fs::openat(
        proc_fd,
        path,
        OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    let mut buf = vec![0u8; 4096];
    let mut len = 0;
    while len < buf.len() {
        match rustix::io::read(&fd, &mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(_) => return None,
        }
    }
    buf.truncate(len);
    Some(String::from_utf8_lossy(&buf).into_owned())
}

/// Whether an `O_EXCL` open of the node fails with `EBUSY`: a filesystem, swap, dm, md or
/// another exclusive opener has claimed it. A node that cannot be opened for another reason
/// says nothing. The open runs on a helper thread until `deadline` ([`Error::Timeout`]
/// then): it waits while a partition scan holds the disk, for as long as the scan's reads
/// take.
fn is_claimed(node: &BlockNode, deadline: Instant) -> Result<bool> {
    let what = || format!("O_EXCL probe of {node} (its open is waiting for the disk)");
    let probe = node.clone();
    helper::bounded(
        Subject::device("O_EXCL probe", node.dev),
        deadline,
        &what,
        move || match open_checked(&probe, OFlags::EXCL | OFlags::NONBLOCK) {
            Ok(fd) => {
                let _held = helper::hold(fd.as_fd(), probe.dev);
                Ok(false)
            }
            Err(Error::Io { source, .. }) => Ok(source.raw_os_error() == Some(libc::EBUSY)),
            Err(_) => Ok(false),
        },
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

/// What the walk over the processes found.
#[derive(Default)]
struct ProcScan {
    openers: Vec<OpenFd>,
    /// This process's descriptors that its helpers hold ([`helper::held`]).
    helpers: Vec<OpenFd>,
    /// Mounts (and unreadable lines) in the namespaces not read before the walk.
    usage: Usage,
    unchecked: Vec<Unchecked>,
}

/// Every descriptor that has one of the family's devices open (from `/proc/*/fd`), and the
/// family's mounts in every mount namespace not in `seen_ns`. Processes that vanish are
/// skipped; those that cannot be read are [`Unchecked`].
///
/// This walk is the costliest part of an in-use check (one `stat` per open file on the
/// node), so it looks up each fd relative to its process's `fd/` directory rather than by
/// full path, and splits the processes between threads when there are CPUs for them.
fn scan_processes(
    root: &Root,
    proc_fd: &OwnedFd,
    family: &Family,
    seen: &std::sync::Mutex<SeenNamespaces>,
) -> Result<ProcScan> {
    let proc_dir = root.proc("");
    let pids: Vec<u32> = std::fs::read_dir(&proc_dir)
        .map_err(|e| Error::io(&proc_dir, e))?
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(crate::hctl::decimal::<u32>))
        .collect();
    let threads = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .clamp(1, OPENER_THREADS_MAX)
        .min(pids.len().div_ceil(OPENER_PIDS_PER_THREAD).max(1));
    let numbers = family.numbers();
    // This process as the root's /proc numbers it (another pid namespace's procfs gives
    // another number), and what its helpers hold open.
    let own_pid = rustix::fs::readlinkat(proc_fd, "self", Vec::new())
        .ok()
        .and_then(|p| p.to_str().ok().and_then(crate::hctl::decimal::<u32>));
    let held = helper::held();
    let ctx = ScanCtx {
        root,
        proc_fd,
        family,
        numbers: &numbers,
        seen,
        own: own_pid.map(|pid| (pid, held.as_slice())),
    };
    let mut scans: Vec<ProcScan> = if threads == 1 {
        vec![ctx.among(&pids)]
    } else {
        let ctx = &ctx;
        std::thread::scope(|s| {
            let workers: Vec<_> = pids
                .chunks(pids.len().div_ceil(threads))
                .map(|chunk| (chunk, s.spawn(move || ctx.among(chunk))))
                .collect();
            workers
                .into_iter()
                .map(|(chunk, w)| {
                    w.join().unwrap_or_else(|_| ProcScan {
                        unchecked: vec![Unchecked {
                            what: format!(
                                "pids {}..={}",
                                chunk.first().unwrap_or(&0),
                                chunk.last().unwrap_or(&0)
                            ),
                            reason: "the thread reading them panicked".into(),
                        }],
                        ..ProcScan::default()
                    })
                })
                .collect()
        })
    };
    let mut out = scans.pop().unwrap_or_default();
    for s in scans {
        out.openers.extend(s.openers);
        out.helpers.extend(s.helpers);
        out.unchecked.extend(s.unchecked);
        out.usage.mounts.extend(s.usage.mounts);
        out.usage.unchecked.extend(s.usage.unchecked);
        out.usage.mountinfo_skipped += s.usage.mountinfo_skipped;
    }
    // One entry per process, device and mode: descriptors dup'ed from one open share one
    // open count, so counting each would explain more of a device's opens than it should.
    out.openers.sort();
    out.openers.dedup();
    Ok(out)
}

/// At most this many threads walk `/proc` for [`scan_processes`].
const OPENER_THREADS_MAX: usize = 4;
/// Below this many processes per thread another thread costs more than it saves.
const OPENER_PIDS_PER_THREAD: usize = 64;

/// What each worker of [`scan_processes`] shares.
struct ScanCtx<'a> {
    root: &'a Root,
    proc_fd: &'a OwnedFd,
    family: &'a Family,
    numbers: &'a [DevNum],
    /// Mount namespaces whose table was read (or is being read by another worker).
    seen: &'a std::sync::Mutex<SeenNamespaces>,
    /// This process's pid, with the descriptors its helper threads hold and their devices.
    own: Option<(u32, &'a [(RawFd, DevNum)])>,
}

impl ScanCtx<'_> {
    /// [`scan_processes`] for the processes `pids`.
    fn among(&self, pids: &[u32]) -> ProcScan {
        let mut out = ProcScan::default();
        for &pid in pids {
            self.namespace_of(pid, &mut out);
            self.fds_of(pid, &mut out);
        }
        out
    }

    /// Reads the mount table of `pid`'s namespace if no other process's was.
    fn namespace_of(&self, pid: u32, out: &mut ProcScan) {
        let inode = match mnt_ns(self.proc_fd.as_fd(), &pid.to_string()) {
            Ok(i) => Some(i),
            // Gone, or a tree without namespace links (a fixture): nothing to read.
            Err(e) if process_gone(e) => return,
            // Not allowed to see which namespace: read its table, which may be allowed.
            Err(_) => None,
        };
        if let Some(i) = inode {
            if !lock_seen(self.seen).claim_inode(i) {
                return;
            }
        }
        match mountinfo::read_of(self.root, pid) {
            Ok(table) => {
                if !lock_seen(self.seen).claim_table(&table) {
                    return;
                }
                let ns = MountNamespace {
                    inode,
                    pid: Some(pid),
                };
                self.family.mounts_in(self.root, &table, ns, &mut out.usage);
            }
            Err(e) if e.is_gone() => {
                // It exited meanwhile: let another process of the namespace read it.
                if let Some(i) = inode {
                    lock_seen(self.seen).inodes.remove(&i);
                }
            }
            Err(e) => out.unchecked.push(Unchecked {
                what: format!("pid {pid}"),
                reason: format!("its mount table: {e}"),
            }),
        }
    }

    /// The open fds of `pid` on the family's devices: `fd/`, or, when that is empty because
    /// the main thread has exited (a zombie leader), every other thread's `task/TID/fd/`.
    fn fds_of(&self, pid: u32, out: &mut ProcScan) {
        let base = pid.to_string();
        let found = match self.fd_dir(&base, pid, out) {
            Some(n) => n,
            None => return,
        };
        if found > 0 {
            return;
        }
        let leader_exited = read_small(self.proc_fd, &format!("{pid}/stat"))
            .and_then(|s| s.rsplit_once(") ").and_then(|(_, r)| r.chars().next()))
            .is_some_and(|state| state == 'Z');
        if !leader_exited {
            return;
        }
        let Ok(tasks) = std::fs::read_dir(self.root.proc(format!("{pid}/task"))) else {
            return;
        };
        for t in tasks.flatten() {
            let tid = t.file_name();
            let Some(tid) = tid.to_str().filter(|t| *t != base) else {
                continue;
            };
            self.fd_dir(&format!("{pid}/task/{tid}"), pid, out);
        }
    }

    /// Scans `<dir>/fd/` (`dir` is `PID` or `PID/task/TID`) for the family's devices, into
    /// `out`. The number of fds it holds, `None` when the process is gone or unreadable.
    fn fd_dir(&self, dir: &str, pid: u32, out: &mut ProcScan) -> Option<usize> {
        let unreadable = |e: rustix::io::Errno, out: &mut ProcScan| {
            if !process_gone(e) {
                out.unchecked.push(Unchecked {
                    what: format!("pid {pid}"),
                    reason: format!("its open files ({dir}/fd): {e}"),
                });
            }
        };
        let fd_dir = match rustix::fs::openat(
            self.proc_fd,
            format!("{dir}/fd"),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(e) => {
                unreadable(e, out);
                return None;
            }
        };
        // `Dir::new` reads through this very fd (`read_from` would open another).
        let mut d = match rustix::fs::Dir::new(fd_dir) {
            Ok(d) => d,
            Err(e) => {
                unreadable(e, out);
                return None;
            }
        };
        let mut fds = Vec::new();
        while let Some(entry) = d.read() {
            match entry {
                Ok(entry) => {
                    if !entry.file_name().to_bytes().starts_with(b".") {
                        fds.push(entry.file_name().to_owned());
                    }
                }
                Err(e) => {
                    unreadable(e, out);
                    return None;
                }
            }
        }
        let Ok(fd_dir) = d.fd() else {
            return None;
        };
        let mut comm: Option<String> = None;
        for name in &fds {
            let dev = match open_block_device(fd_dir, name) {
                Ok(Some(dev)) => dev,
                Ok(None) => continue,
                // Closed meanwhile, or the process is gone.
                Err(e) if process_gone(e) => continue,
                Err(e) => {
                    out.unchecked.push(Unchecked {
                        what: format!("pid {pid}"),
                        reason: format!("its open file {dir}/fd/{}: {e}", name.to_string_lossy()),
                    });
                    continue;
                }
            };
            if !self.numbers.contains(&dev) {
                continue;
            }
            let comm = comm
                .get_or_insert_with(|| process_comm(self.proc_fd, pid))
                .clone();
            let fd = OpenFd {
                pid,
                comm,
                dev,
                read_only: opened_read_only(self.proc_fd, dir, name),
            };
            if self.is_helpers(pid, name, dev) {
                out.helpers.push(fd);
            } else {
                out.openers.push(fd);
            }
        }
        Some(fds.len())
    }
}

impl ScanCtx<'_> {
    /// Whether descriptor `name` of `pid`, open on `dev`, is one a helper thread of this
    /// process holds. The number could have been closed and reused since [`helper::held`]
    /// was read, so the device must match too.
    fn is_helpers(&self, pid: u32, name: &std::ffi::CStr, dev: DevNum) -> bool {
        let Some((own, held)) = self.own else {
            return false;
        };
        let fd = name.to_str().ok().and_then(crate::hctl::decimal::<RawFd>);
        own == pid && fd.is_some_and(|fd| held.contains(&(fd, dev)))
    }
}

/// The block device an entry of a `/proc/PID/fd` directory refers to, if it is one; the
/// errno when the entry cannot be looked at (`EACCES` without ptrace access to the process).
///
/// `statx` follows the magic link to the open file itself, asking for its type and device
/// number only, with `AT_STATX_DONT_SYNC`: a file open on NFS, CIFS or FUSE would otherwise
/// cost a round trip to its server, and a process may hold thousands. Where `statx` is
/// refused (old seccomp profiles), plain `stat` does the same job, slower.
fn open_block_device(
    fd_dir: BorrowedFd<'_>,
    name: &std::ffi::CStr,
) -> std::result::Result<Option<DevNum>, rustix::io::Errno> {
    use rustix::fs::{AtFlags, StatxFlags};
    match rustix::fs::statx(fd_dir, name, AtFlags::STATX_DONT_SYNC, StatxFlags::TYPE) {
        Ok(st) => Ok(
            (FileType::from_raw_mode(st.stx_mode.into()) == FileType::BlockDevice).then_some(
                DevNum {
                    major: st.stx_rdev_major,
                    minor: st.stx_rdev_minor,
                },
            ),
        ),
        Err(rustix::io::Errno::NOSYS | rustix::io::Errno::PERM) => Ok(block_number(
            &rustix::fs::statat(fd_dir, name, AtFlags::empty())?,
        )),
        Err(e) => Err(e),
    }
}

/// Whether descriptor `fd` of `dir` (`PID` or `PID/task/TID`) was opened read-only: the
/// access mode in the octal `flags:` line of `fdinfo/FD`. Unreadable counts as writable.
fn opened_read_only(proc_fd: &OwnedFd, dir: &str, fd: &std::ffi::CStr) -> bool {
    let path = format!("{dir}/fdinfo/{}", fd.to_string_lossy());
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
    fn a_proc_of_another_pid_namespace_is_said() {
        let dir = std::env::temp_dir().join(format!("lunkit-pidns-{}", std::process::id()));
        let ns = dir.join("1/ns");
        std::fs::create_dir_all(&ns).unwrap();
        let open = || {
            rustix::fs::open(
                &dir,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .unwrap()
        };
        // No link to read (a fixture, or no ptrace access): nothing can be said.
        assert_eq!(foreign_pid_namespace(&open(), &dir), None);
        std::os::unix::fs::symlink("pid:[4026531836]", ns.join("pid")).unwrap();
        assert_eq!(foreign_pid_namespace(&open(), &dir), None);
        std::fs::remove_file(ns.join("pid")).unwrap();
        std::os::unix::fs::symlink("pid:[4026532301]", ns.join("pid")).unwrap();
        let u = foreign_pid_namespace(&open(), &dir).expect("another pid namespace");
        assert!(u.reason.contains("pid:[4026532301]"), "{u:?}");
        assert!(u.reason.contains("hostPID"), "{u:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn usage_message_names_every_user() {
        let u = Usage {
            mounts: vec![
                MountUse {
                    device: "sdc1".into(),
                    mount_point: "/mnt/a b".into(),
                    kind: MountKind::Filesystem,
                    namespace: MountNamespace {
                        inode: Some(4026531840),
                        pid: Some(1),
                    },
                },
                MountUse {
                    device: "sdc".into(),
                    mount_point: "/var/lib/kubelet/pods/p/volumeDevices/kubernetes.io~csi/pv"
                        .into(),
                    kind: MountKind::DeviceNode,
                    namespace: MountNamespace {
                        inode: None,
                        pid: None,
                    },
                },
            ],
            loops: vec![LoopUse {
                loop_device: "loop0".into(),
                backing_file: "/var/lib/kubelet/plugins/x/dev/p".into(),
                device: "sdc".into(),
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
            helpers: vec![Opener {
                pid: 9,
                comm: "csi-node".into(),
                device: "sdc".into(),
                read_only: true,
            }],
            claimed: vec![],
            unchecked: vec![Unchecked {
                what: "pid 77".into(),
                reason: "its open files (77/fd): Permission denied".into(),
            }],
            mountinfo_skipped: 0,
        };
        assert_eq!(
            u.to_string(),
            "sdc1 mounted at /mnt/a b (mount namespace of pid 1 mnt:[4026531840]); \
             node /dev/sdc bind-mounted at /var/lib/kubelet/pods/p/volumeDevices/kubernetes.io~csi/pv \
             (this process's mount namespace); \
             loop device loop0 is backed by sdc (backing file /var/lib/kubelet/plugins/x/dev/p); \
             held by dm-3; active swap on sdc2; sdc open by pid 42 (dd); \
             could not check pid 77: its open files (77/fd): Permission denied"
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

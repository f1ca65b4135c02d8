//! Loop devices: which are bound, and what backs them.
//!
//! A loop device holds its backing file open for as long as it is bound, and when that file
//! is a block device node the device is open too: kubelet's raw-block "descriptor lock" is a
//! loop device on a bind mount of the volume's node. Such a loop makes no `holders/` link,
//! takes no `O_EXCL` claim and, once `losetup` has exited, shows in no process's fds. Only the
//! loop device itself knows:
//!
//! - `/sys/block/loopN/loop/backing_file`: the backing file's path, as the kernel's `d_path`
//!   prints it (relative to the binder's mount namespace; for messages only);
//! - `LOOP_GET_STATUS64`: the backing file's filesystem device (`lo_device`), inode
//!   (`lo_inode`) and, for a device node, the device it is (`lo_rdevice`). Exact, whatever
//!   path or bind mount the node was opened through.
//!
//! The `loop/` directory exists only while a file is bound, so listing needs no ioctl; the
//! ioctl, and the open before it, run under the caller's deadline ([`backing`]).

use std::os::fd::AsFd;
use std::path::PathBuf;
use std::time::Instant;

use rustix::fs::{FileType, OFlags};

use crate::block::{self, BlockNode};
use crate::error::{Error, Result};
use crate::helper::{self, Subject};
use crate::id::DevNum;
use crate::root::Root;
use crate::sysfs;

/// A bound loop device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoopDevice {
    /// The loop device (`loop0`).
    pub node: BlockNode,
    /// Its backing file as `loop/backing_file` names it (`/dev/dm-0`,
    /// `/var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices/pv/dev/<podUID>`).
    pub backing_file: PathBuf,
}

/// What backs a loop device, by number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backing {
    /// The device of the filesystem the backing file is on (`0:5` for a devtmpfs node).
    pub fs_dev: DevNum,
    /// The backing file's inode on it.
    pub inode: u64,
    /// When the backing file is a block device node: the device it is.
    pub block_dev: Option<DevNum>,
}

impl Backing {
    /// The loop device reads and writes one of `numbers`: its backing file is that device's
    /// node, or a file on a filesystem on it.
    pub fn uses_any(&self, numbers: &[DevNum]) -> Option<DevNum> {
        self.block_dev
            .filter(|d| numbers.contains(d))
            .or_else(|| numbers.contains(&self.fs_dev).then_some(self.fs_dev))
    }
}

/// The loop devices that have a backing file bound (`<root>/sys/class/block/loopN/loop/`).
pub fn bound(root: &Root) -> Result<Vec<LoopDevice>> {
    let mut out = Vec::new();
    for name in crate::block::sysfs::names(root)? {
        // `loopN` only: partitions of a loop device (`loop0p1`) have no `loop/` directory.
        if !name
            .strip_prefix("loop")
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        {
            continue;
        }
        // Unbound between the listing and this read: not bound.
        let Some(file) = crate::block::sysfs::loop_backing_file(root, &name) else {
            continue;
        };
        sysfs::check_component("loop device name", &name)?;
        let Some(node) = block::by_name(root, &name)? else {
            continue;
        };
        out.push(LoopDevice {
            node,
            backing_file: PathBuf::from(file),
        });
    }
    Ok(out)
}

/// What backs `lo`, from `LOOP_GET_STATUS64` on its node (`/dev/loopN`). `Ok(None)` when it
/// was unbound meanwhile (`ENXIO`).
///
/// Both the open and the ioctl can wait: the open for the disk's open mutex, which a
/// partition scan holds through its reads (of a backing device that does not answer, for
/// as long as it does not), the ioctl for the loop device's own lock while it is being
/// bound or unbound. So they run on a helper thread (whose descriptor does not count as a
/// user), and at `deadline` this is [`Error::Timeout`] naming the loop device, the thread
/// left to finish on its own.
///
/// Where the node cannot be opened (a fixture tree has no `/dev` nodes), the backing file
/// named in sysfs is `stat`ed below the root instead; that is exact for a node path such as
/// `/dev/dm-0` and for files visible in this mount namespace.
pub fn backing(root: &Root, lo: &LoopDevice, deadline: Instant) -> Result<Option<Backing>> {
    let what = || {
        format!(
            "LOOP_GET_STATUS64 on {} (its open or the ioctl did not return)",
            lo.node
        )
    };
    let node = lo.node.clone();
    let status = helper::bounded(
        Subject::device("loop-status", lo.node.dev),
        deadline,
        &what,
        move || status(&node),
    )?;
    match status {
        Status::NoNode => backing_by_path(root, lo),
        Status::Unbound => Ok(None),
        Status::Bound(b) => Ok(Some(b)),
    }
}

/// What `LOOP_GET_STATUS64` told of a loop device.
enum Status {
    /// Its node is not there to open.
    NoNode,
    /// No file is bound (`ENXIO`).
    Unbound,
    Bound(Backing),
}

/// Opens `node` and asks `LOOP_GET_STATUS64`: the blocking half of [`backing`].
fn status(node: &BlockNode) -> Result<Status> {
    let fd = match block::open_checked(node, OFlags::NONBLOCK) {
        Ok(fd) => fd,
        Err(e) if e.errno() == Some(libc::ENOENT) => return Ok(Status::NoNode),
        Err(e) => return Err(e),
    };
    let _held = helper::hold(fd.as_fd(), node.dev);
    match crate::ioctl::loop_get_status64(&fd) {
        Ok(info) => {
            let dev = |raw: u64| DevNum {
                major: rustix::fs::major(raw),
                minor: rustix::fs::minor(raw),
            };
            Ok(Status::Bound(Backing {
                fs_dev: dev(info.lo_device),
                inode: info.lo_inode,
                // `lo_rdevice` is the backing file's `st_rdev`: 0 for a regular file.
                block_dev: (info.lo_rdevice != 0).then(|| dev(info.lo_rdevice)),
            }))
        }
        Err(e) if e.raw_os_error() == Some(libc::ENXIO) => Ok(Status::Unbound),
        Err(source) => Err(Error::Ioctl {
            op: "LOOP_GET_STATUS64",
            target: node.to_string(),
            source,
        }),
    }
}

/// [`backing`] from a `stat` of the backing file's path below the root.
fn backing_by_path(root: &Root, lo: &LoopDevice) -> Result<Option<Backing>> {
    let rel = lo
        .backing_file
        .strip_prefix("/")
        .unwrap_or(&lo.backing_file);
    let path = root.path().join(rel);
    let st = rustix::fs::stat(&path).map_err(|e| Error::io(&path, e.into()))?;
    let block = FileType::from_raw_mode(st.st_mode) == FileType::BlockDevice;
    Ok(Some(Backing {
        fs_dev: DevNum {
            major: rustix::fs::major(st.st_dev),
            minor: rustix::fs::minor(st.st_dev),
        },
        inode: st.st_ino,
        block_dev: block.then(|| DevNum {
            major: rustix::fs::major(st.st_rdev),
            minor: rustix::fs::minor(st.st_rdev),
        }),
    }))
}

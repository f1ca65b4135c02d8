//! One process as `/proc` shows it: its mount namespace, whether it is a path manager, its
//! command name, the access mode of one of its descriptors, small files of its directory; and
//! the mount namespaces whose tables were read already.

use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::Path;

use rustix::fs::{Mode, OFlags};

use super::mountinfo;

use super::in_use::{MANAGER_EXES, UDEVD_EXES};

/// The mount namespaces whose tables were read, so that each is read once.
///
/// A namespace is known by its `ns/mnt` inode. Where that link cannot be read (it needs
/// ptrace access to the process, which root without `CAP_SYS_PTRACE` lacks for processes
/// with more capabilities, pid 1 among them), the table itself still can be, and its first
/// line names the namespace's root mount, whose id no other namespace shares.
#[derive(Debug, Default)]
pub(super) struct SeenNamespaces {
    pub(super) inodes: std::collections::HashSet<u64>,
    root_mounts: std::collections::HashSet<u32>,
}

impl SeenNamespaces {
    /// Claims namespace `inode` for reading; `false` if it was claimed before.
    pub(super) fn claim_inode(&mut self, inode: u64) -> bool {
        self.inodes.insert(inode)
    }

    /// Claims a table just read by its root mount; `false` if that namespace was read
    /// before (through another process whose `ns/mnt` could not be read, or could).
    pub(super) fn claim_table(&mut self, table: &mountinfo::MountTable) -> bool {
        table
            .mounts
            .first()
            .is_none_or(|m| self.root_mounts.insert(m.id))
    }
}

/// Locks `seen`; a poisoned lock only means another worker panicked, and the sets are still
/// valid.
pub(super) fn lock_seen(
    seen: &std::sync::Mutex<SeenNamespaces>,
) -> std::sync::MutexGuard<'_, SeenNamespaces> {
    seen.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The inode of `<root>/proc/<who>/ns/mnt` (`mnt:[4026531841]`): equal inodes, one mount
/// namespace. `Err` with the errno when the link cannot be read.
pub(super) fn mnt_ns(
    proc_fd: BorrowedFd<'_>,
    who: &str,
) -> std::result::Result<u64, rustix::io::Errno> {
    let link = rustix::fs::readlinkat(proc_fd, format!("{who}/ns/mnt"), Vec::new())?;
    link.to_bytes()
        .strip_prefix(b"mnt:[")
        .and_then(|r| r.strip_suffix(b"]"))
        .and_then(|n| std::str::from_utf8(n).ok())
        .and_then(crate::id::decimal::<u64>)
        .ok_or(rustix::io::Errno::INVAL)
}

/// How a process's `ns/mnt` link read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum NsLink {
    /// It names a namespace.
    Read,
    /// It is not there: the process has left its namespaces (it is exiting, or a zombie
    /// leader), or is gone, or the tree has no such links.
    Absent,
    /// It is there but may not be read (no ptrace access to the process).
    Unreadable,
}

/// Whether process `pid` has an executable (`/proc/PID/exe`, readlinkat(2)): `Some(false)`
/// when the link is absent (`ENOENT`: a kernel thread, or a process past dropping its
/// memory), `None` when it cannot be read for another reason (no ptrace access, gone).
pub(super) fn has_exe(proc_fd: BorrowedFd<'_>, pid: u32) -> Option<bool> {
    match rustix::fs::readlinkat(proc_fd, format!("{pid}/exe"), Vec::new()) {
        Ok(_) => Some(true),
        Err(rustix::io::Errno::NOENT) => Some(false),
        Err(_) => None,
    }
}

/// Whether an errno on a `/proc/PID/...` file means the process is gone (not a gap in the
/// check).
pub(super) fn process_gone(e: rustix::io::Errno) -> bool {
    matches!(e, rustix::io::Errno::NOENT | rustix::io::Errno::SRCH)
}

/// Whether process `pid`, found with a path open under a path manager's command name, is
/// one: it runs as root (real and effective uid 0 in `status`), and its executable is one
/// of [`MANAGER_EXES`] or its parent's is udevd's (a worker udevd forked). A command name
/// alone is set by any process with `PR_SET_NAME`.
pub(super) fn is_path_manager(proc_fd: &OwnedFd, pid: u32) -> bool {
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
        .and_then(|p| p.first().and_then(|p| crate::id::decimal::<u32>(p)))
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
pub(super) fn read_small(proc_fd: &OwnedFd, path: &str) -> Option<String> {
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

/// Whether descriptor `fd` of `dir` (`PID` or `PID/task/TID`) was opened read-only: the
/// access mode in the octal `flags:` line of `fdinfo/FD`. Unreadable counts as writable.
pub(super) fn opened_read_only(proc_fd: &OwnedFd, dir: &str, fd: &std::ffi::CStr) -> bool {
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
pub(super) fn fdinfo_access_mode(text: &[u8]) -> Option<i32> {
    let text = std::str::from_utf8(text).ok()?;
    let flags = text.lines().find_map(|l| l.strip_prefix("flags:"))?.trim();
    let flags = i32::from_str_radix(flags, 8).ok()?;
    Some(flags & libc::O_ACCMODE)
}

/// `/proc/PID/comm` without its newline; empty when the process is gone.
pub(super) fn process_comm(proc_fd: &OwnedFd, pid: u32) -> String {
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

//! Who has a block device open, and which mount namespaces there are: the `/proc` walk
//! behind step 5 of [`usage`](super::usage()), split between threads.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use rustix::fs::{FileType, Mode, OFlags};

use super::mountinfo;
use crate::error::{Error, Result};
use crate::helper;
use crate::id::DevNum;
use crate::root::Root;

use super::block_number;
use super::usage::*;

/// The mount namespaces whose tables were read, so that each is read once.
///
/// A namespace is known by its `ns/mnt` inode. Where that link cannot be read (it needs
/// ptrace access to the process, which root without `CAP_SYS_PTRACE` lacks for processes
/// with more capabilities, pid 1 among them), the table itself still can be, and its first
/// line names the namespace's root mount, whose id no other namespace shares.
#[derive(Debug, Default)]
pub(super) struct SeenNamespaces {
    inodes: std::collections::HashSet<u64>,
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
enum NsLink {
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
fn has_exe(proc_fd: BorrowedFd<'_>, pid: u32) -> Option<bool> {
    match rustix::fs::readlinkat(proc_fd, format!("{pid}/exe"), Vec::new()) {
        Ok(_) => Some(true),
        Err(rustix::io::Errno::NOENT) => Some(false),
        Err(_) => None,
    }
}

/// Whether an errno on a `/proc/PID/...` file means the process is gone (not a gap in the
/// check).
fn process_gone(e: rustix::io::Errno) -> bool {
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

/// One open file descriptor of a block device, as `/proc/PID/fd` and `fdinfo` show it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct OpenFd {
    pub(super) pid: u32,
    pub(super) comm: String,
    pub(super) dev: DevNum,
    pub(super) read_only: bool,
}

/// What the walk over the processes found.
#[derive(Default)]
pub(super) struct ProcScan {
    pub(super) openers: Vec<OpenFd>,
    /// Processes with a device mapped (`read_only`: no shared writable mapping).
    pub(super) mapped: Vec<OpenFd>,
    /// This process's descriptors that its helpers hold ([`helper::held`]).
    pub(super) helpers: Vec<OpenFd>,
    /// Mounts (and unreadable lines) in the namespaces not read before the walk.
    pub(super) usage: Usage,
    pub(super) unchecked: Vec<Unchecked>,
}

/// A descriptor of a block device the walk saw, matched against the family at the end.
struct Sighting {
    pid: u32,
    /// `PID`, or `PID/task/TID` for a thread of a zombie leader.
    dir: String,
    fd: std::ffi::CString,
    dev: DevNum,
}

/// What a share of the walk saw: every block device's descriptors and every mount table it
/// read, not yet matched against a family, so that the walk can start before the devices
/// are known.
#[derive(Default)]
struct Sightings {
    fds: Vec<Sighting>,
    /// Block devices mapped, by pid.
    mapped: Vec<(u32, super::maps::Mapped)>,
    /// Which mapped files are block devices, as this share found them.
    kinds: super::maps::FileKinds,
    tables: Vec<(mountinfo::MountTable, MountNamespace)>,
    unchecked: Vec<Unchecked>,
}

/// The walk over the processes: every descriptor that has one of the family's devices open
/// (from `/proc/*/fd`), and the family's mounts in every mount namespace not claimed in
/// `seen` before it started. Processes that vanish are skipped; those that cannot be read
/// are [`Unchecked`].
///
/// This walk is the costliest part of an in-use check (one `stat` per open file on the
/// node), so it looks up each fd relative to its process's `fd/` directory rather than by
/// full path, splits the processes between threads when there are CPUs for them, and runs
/// while the caller reads the mount tables ([`Walk::start`], [`Walk::finish`]).
pub(super) struct Walk {
    ctx: Arc<ScanCtx>,
    /// The shares on helper threads; an `Err` is one that could not be handed to a thread.
    others: Vec<Result<helper::Pending<Sightings>>>,
}

impl Walk {
    /// Lists the processes and starts the walk's other shares on helper threads (a detach
    /// starts them ahead); [`Walk::finish`] takes this thread's share, gathers the rest and
    /// matches what they saw against the family. The namespaces already claimed in `seen`
    /// are not read.
    pub(super) fn start(
        root: &Root,
        proc_fd: &Arc<OwnedFd>,
        seen: &Arc<Mutex<SeenNamespaces>>,
        deadline: Instant,
    ) -> Result<Walk> {
        let proc_dir = root.proc("");
        let pids: Vec<u32> = std::fs::read_dir(&proc_dir)
            .map_err(|e| Error::io(&proc_dir, e))?
            .flatten()
            .filter_map(|e| e.file_name().to_str().and_then(crate::id::decimal::<u32>))
            .collect();
        let threads = std::thread::available_parallelism()
            .map_or(1, usize::from)
            .clamp(1, OPENER_THREADS_MAX)
            .min(pids.len().div_ceil(OPENER_PIDS_PER_THREAD).max(1));
        let ctx = Arc::new(ScanCtx {
            root: root.clone(),
            proc_fd: Arc::clone(proc_fd),
            seen: Arc::clone(seen),
            held: helper::held(),
            pids,
            next: AtomicUsize::new(0),
        });
        // Each share takes the next processes as it goes, so one that drew kernel threads
        // (nothing to read) goes on to the costly processes with the rest, and a share
        // whose thread never ran leaves its processes to the others.
        let others = (1..threads)
            .map(|_| {
                let ctx = Arc::clone(&ctx);
                helper::start(
                    helper::Subject::share("proc walk"),
                    deadline,
                    &share_name,
                    move || Ok(ctx.work_caught()),
                )
            })
            .collect();
        Ok(Walk { ctx, others })
    }

    /// Takes this thread's share of the walk, waits for the others within `deadline`, and
    /// returns what of `family` they found: its devices' descriptors (this process's
    /// helpers' apart) and its mounts in the namespaces the walk read.
    pub(super) fn finish(mut self, family: &Family, deadline: Instant) -> Result<ProcScan> {
        let mut all = self.ctx.work();
        // Once this share is done, the others have at most their last few processes left:
        // they get that long even past the caller's deadline (a check made at its deadline,
        // as a removal's last look is), and a share stuck in the kernel longer is a timeout.
        let until = deadline.max(Instant::now() + SHARE_GRACE);
        for share in std::mem::take(&mut self.others) {
            // Not handed over (no thread could be had): the shares that ran read its
            // processes.
            let Ok(share) = share else {
                continue;
            };
            let s = share.wait(until, &share_name)?;
            all.fds.extend(s.fds);
            all.mapped.extend(s.mapped);
            all.tables.extend(s.tables);
            all.unchecked.extend(s.unchecked);
        }
        let ctx = &self.ctx;
        let mut out = ProcScan {
            unchecked: all.unchecked,
            ..ProcScan::default()
        };
        for (table, ns) in &all.tables {
            family.mounts_in(&ctx.root, table, *ns, &mut out.usage);
        }
        // This process as the root's /proc numbers it (another pid namespace's procfs gives
        // another number), and what its helpers held open while the walk ran: a helper may
        // have opened a descriptor the walk saw after it started, or closed one since.
        let own_pid = rustix::fs::readlinkat(&*ctx.proc_fd, "self", Vec::new())
            .ok()
            .and_then(|p| p.to_str().ok().and_then(crate::id::decimal::<u32>));
        let mut held = helper::held();
        held.extend_from_slice(&ctx.held);
        let numbers = family.numbers();
        let mut comms = std::collections::HashMap::new();
        for s in all.fds.iter().filter(|s| numbers.contains(&s.dev)) {
            // Closed since the walk saw it (udev's probe, typically), or the number reused:
            // not a user now, and its `fdinfo` would describe something else.
            if !still_open(ctx.proc_fd.as_fd(), s) {
                continue;
            }
            let comm: &String = comms
                .entry(s.pid)
                .or_insert_with(|| process_comm(&ctx.proc_fd, s.pid));
            let fd = OpenFd {
                pid: s.pid,
                comm: comm.clone(),
                dev: s.dev,
                read_only: opened_read_only(&ctx.proc_fd, &s.dir, &s.fd),
            };
            if own_pid == Some(s.pid) && is_helpers(&held, &s.fd, s.dev) {
                out.helpers.push(fd);
            } else {
                out.openers.push(fd);
            }
        }
        for (pid, m) in all.mapped.iter().filter(|(_, m)| numbers.contains(&m.dev)) {
            let comm: &String = comms
                .entry(*pid)
                .or_insert_with(|| process_comm(&ctx.proc_fd, *pid));
            out.mapped.push(OpenFd {
                pid: *pid,
                comm: comm.clone(),
                dev: m.dev,
                read_only: !m.writable,
            });
        }
        // One entry per process, device and mode: descriptors dup'ed from one open share one
        // open count, so counting each would explain more of a device's opens than it
        // should.
        out.openers.sort();
        out.openers.dedup();
        Ok(out)
    }
}

/// A walk given up (the check found a user before it): the shares still running take no
/// more processes.
impl Drop for Walk {
    fn drop(&mut self) {
        self.ctx.next.store(self.ctx.pids.len(), Ordering::Relaxed);
    }
}

/// How long the other shares of a walk may still take once the calling thread's share is
/// done, whatever the deadline: each has at most [`PIDS_PER_TAKE`] processes left.
const SHARE_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

/// What a share of the walk is, in a timeout's message.
fn share_name() -> String {
    "the /proc walk's share on a helper thread".to_owned()
}

/// At most this many threads walk `/proc` for [`Walk`].
const OPENER_THREADS_MAX: usize = 4;
/// Below this many processes per thread another thread costs more than it saves.
const OPENER_PIDS_PER_THREAD: usize = 64;
/// How many processes a share of the walk takes at a time.
const PIDS_PER_TAKE: usize = 4;

/// What the shares of [`Walk`] hold in common.
struct ScanCtx {
    root: Root,
    proc_fd: Arc<OwnedFd>,
    /// Mount namespaces whose table was read (or is being read by another share).
    seen: Arc<Mutex<SeenNamespaces>>,
    /// The descriptors this process's helpers held when the walk started, with their devices.
    held: Vec<(RawFd, DevNum)>,
    /// Every process, in `/proc` order.
    pids: Vec<u32>,
    /// The index in `pids` of the next processes to take.
    next: AtomicUsize,
}

impl ScanCtx {
    /// One share of the walk: takes [`PIDS_PER_TAKE`] processes at a time until none are
    /// left.
    /// [`ScanCtx::work`] on a helper thread: a panic there becomes a gap in the check
    /// ([`Unchecked`]), as it would on the calling thread, not a share that never reports.
    fn work_caught(&self) -> Sightings {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.work())).unwrap_or_else(
            |_| Sightings {
                unchecked: vec![Unchecked {
                    what: "a share of the processes".into(),
                    reason: "the thread reading them panicked".into(),
                }],
                ..Sightings::default()
            },
        )
    }

    fn work(&self) -> Sightings {
        let mut out = Sightings::default();
        loop {
            let from = self.next.fetch_add(PIDS_PER_TAKE, Ordering::Relaxed);
            let to = from.saturating_add(PIDS_PER_TAKE).min(self.pids.len());
            match self.pids.get(from..to) {
                Some(some) if !some.is_empty() => self.among(some, &mut out),
                _ => return out,
            }
        }
    }
}

impl ScanCtx {
    /// [`Walk`] for the processes `pids`, into `out`.
    ///
    /// Most entries of `/proc` are kernel threads (on a small node, nine in ten), and a
    /// kernel thread has no descriptors to look at. One is told apart by two links that are
    /// read anyway or cost one call: its `exe` is absent (it has no memory map) while its
    /// `ns/mnt` is there. A process whose leader exited (a zombie leader, whose threads
    /// still hold descriptors) has lost both, and a live process has both. The only other
    /// task with `exe` gone and `ns/mnt` there is one inside `exit()`, between dropping its
    /// memory and closing its files: it issues no more I/O, and what it wrote is in the
    /// device's cache, which the detach flushes before any delete.
    fn among(&self, pids: &[u32], out: &mut Sightings) {
        for &pid in pids {
            let ns = self.namespace_of(pid, out);
            match (has_exe(self.proc_fd.as_fd(), pid), ns) {
                // A live process: its leader's `fd/` is the whole process's table, and its
                // memory map may hold a device whose descriptor it closed.
                (Some(true), _) => {
                    self.fds_of(pid, false, out);
                    self.maps_of(pid, out);
                }
                // A kernel thread: nothing to look at.
                (Some(false), NsLink::Read) => {}
                // A zombie leader, a process going or gone, or one whose links cannot be
                // read: the full look.
                _ => {
                    self.fds_of(pid, true, out);
                }
            }
        }
    }

    /// Reads the mount table of `pid`'s namespace if no other process's was, and says how
    /// its `ns/mnt` link read.
    fn namespace_of(&self, pid: u32, out: &mut Sightings) -> NsLink {
        let inode = match mnt_ns(self.proc_fd.as_fd(), &pid.to_string()) {
            Ok(i) => Some(i),
            // Gone, or a tree without namespace links (a fixture): nothing to read.
            Err(e) if process_gone(e) => return NsLink::Absent,
            // Not allowed to see which namespace: read its table, which may be allowed.
            Err(_) => None,
        };
        let link = if inode.is_some() {
            NsLink::Read
        } else {
            NsLink::Unreadable
        };
        // pid 1's table is the host's, which the check reads itself (claimed before the walk
        // started only when its `ns/mnt` could be read).
        if pid == 1 {
            return link;
        }
        if let Some(i) = inode {
            if !lock_seen(&self.seen).claim_inode(i) {
                return link;
            }
        }
        match mountinfo::read_of(&self.root, pid) {
            Ok(table) => {
                if !lock_seen(&self.seen).claim_table(&table) {
                    return link;
                }
                let ns = MountNamespace {
                    inode,
                    pid: Some(pid),
                };
                out.tables.push((table, ns));
            }
            Err(e) if e.is_gone() => {
                // It exited meanwhile: let another process of the namespace read it.
                if let Some(i) = inode {
                    lock_seen(&self.seen).inodes.remove(&i);
                }
            }
            Err(e) => out.unchecked.push(Unchecked {
                what: format!("pid {pid}"),
                reason: format!("its mount table: {e}"),
            }),
        }
        link
    }

    /// The block devices `pid` has memory-mapped ([`super::maps`]), into `out`.
    fn maps_of(&self, pid: u32, out: &mut Sightings) {
        match super::maps::mapped_devices(&self.proc_fd, pid, &mut out.kinds) {
            Ok(found) => out.mapped.extend(found.into_iter().map(|m| (pid, m))),
            Err(e) if process_gone(e) => {}
            Err(e) => out.unchecked.push(Unchecked {
                what: format!("pid {pid}"),
                reason: format!("its memory mappings ({pid}/maps, map_files): {e}"),
            }),
        }
    }

    /// The open fds of `pid` on the family's devices: `fd/`, or, when that is empty because
    /// the main thread has exited (a zombie leader; only looked for when `maybe_zombie`),
    /// every other thread's `task/TID/fd/`.
    fn fds_of(&self, pid: u32, maybe_zombie: bool, out: &mut Sightings) {
        let base = pid.to_string();
        let found = match self.fd_dir(&base, pid, out) {
            Some(n) => n,
            None => return,
        };
        if found > 0 || !maybe_zombie {
            return;
        }
        let leader_exited = read_small(&self.proc_fd, &format!("{pid}/stat"))
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
    fn fd_dir(&self, dir: &str, pid: u32, out: &mut Sightings) -> Option<usize> {
        let unreadable = |e: rustix::io::Errno, out: &mut Sightings| {
            if !process_gone(e) {
                out.unchecked.push(Unchecked {
                    what: format!("pid {pid}"),
                    reason: format!("its open files ({dir}/fd): {e}"),
                });
            }
        };
        let fd_dir = match rustix::fs::openat(
            &*self.proc_fd,
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
            out.fds.push(Sighting {
                pid,
                dir: dir.to_owned(),
                fd: name.clone(),
                dev,
            });
        }
        Some(fds.len())
    }
}

/// Whether the descriptor the walk saw is still open on the same device.
fn still_open(proc_fd: BorrowedFd<'_>, s: &Sighting) -> bool {
    let mut path = format!("{}/fd/", s.dir).into_bytes();
    path.extend_from_slice(s.fd.to_bytes());
    let Ok(path) = std::ffi::CString::new(path) else {
        return false;
    };
    matches!(open_block_device(proc_fd, &path), Ok(Some(dev)) if dev == s.dev)
}

/// Whether descriptor `name` of this process, open on `dev`, is one a helper thread holds
/// (`held`, from [`helper::held`]). The number could have been closed and reused since, so
/// the device must match too.
fn is_helpers(held: &[(RawFd, DevNum)], name: &std::ffi::CStr, dev: DevNum) -> bool {
    let fd = name.to_str().ok().and_then(crate::id::decimal::<RawFd>);
    fd.is_some_and(|fd| held.contains(&(fd, dev)))
}

/// The block device an entry of a `/proc/PID/fd` directory refers to, if it is one; the
/// errno when the entry cannot be looked at (`EACCES` without ptrace access to the process).
///
/// `statx` follows the magic link to the open file itself, asking for its type and device
/// number only, with `AT_STATX_DONT_SYNC`: a file open on NFS, CIFS or FUSE would otherwise
/// cost a round trip to its server, and a process may hold thousands. Where `statx` is
/// refused (old seccomp profiles), plain `stat` does the same job, slower.
pub(super) fn open_block_device(
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
pub(super) fn fdinfo_access_mode(text: &[u8]) -> Option<i32> {
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
    use std::os::fd::AsRawFd;

    /// A descriptor the walk saw counts only while it is still open on the same device:
    /// one closed before the walk is matched (udev's probe) is not a user.
    #[test]
    fn a_sighting_counts_only_while_its_descriptor_is_open() {
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipped: needs root to open a block device");
            return;
        }
        // Any block device of this machine: its root disk, or a loop device.
        let opened = std::fs::read_dir("/sys/block")
            .unwrap()
            .flatten()
            .find_map(|e| {
                let dev = Path::new("/dev").join(e.file_name());
                let f = std::fs::File::open(&dev).ok()?;
                let st = rustix::fs::fstat(&f).ok()?;
                Some((f, super::super::block_number(&st)?))
            });
        let (file, dev) = opened.expect("a block device under /sys/block that opens");
        let proc_fd = rustix::fs::open(
            "/proc",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .unwrap();
        let sighting = |dev| Sighting {
            pid: std::process::id(),
            dir: "self".into(),
            fd: std::ffi::CString::new(file.as_raw_fd().to_string()).unwrap(),
            dev,
        };
        assert!(still_open(proc_fd.as_fd(), &sighting(dev)));
        let other = DevNum {
            major: dev.major,
            minor: dev.minor + 1,
        };
        assert!(!still_open(proc_fd.as_fd(), &sighting(other)));
        let seen = sighting(dev);
        drop(file);
        assert!(!still_open(proc_fd.as_fd(), &seen));
    }
}

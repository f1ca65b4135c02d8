//! Who has a block device open, and which mount namespaces there are: the `/proc` walk
//! behind step 5 of [`usage`](super::usage()), split between threads.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd, RawFd};
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
use super::in_use::Family;
use super::process::*;
use super::usage::*;

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
    /// Lists the processes and starts the walk's other shares on helper threads;
    /// [`Walk::collect`] takes this thread's share and gathers the rest. `ahead`: the caller
    /// works on before it collects (a detach locating its volume), so that share starts on
    /// a helper too. Pid 1's mount namespace and this process's are left to each check.
    pub(super) fn start(
        root: &Root,
        proc_fd: &Arc<OwnedFd>,
        deadline: Instant,
        ahead: bool,
    ) -> Result<Walk> {
        let seen = Arc::new(Mutex::new(SeenNamespaces::default()));
        for who in ["1", "self"] {
            if let Ok(i) = mnt_ns(proc_fd.as_fd(), who) {
                lock_seen(&seen).claim_inode(i);
            }
        }
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
            seen,
            held: helper::held(),
            pids,
            next: AtomicUsize::new(0),
            kinds: super::maps::FileKinds::default(),
        });
        // Each share takes the next processes as it goes, so one that drew kernel threads
        // (nothing to read) goes on to the costly processes with the rest, and a share
        // whose thread never ran leaves its processes to the others.
        let others = (usize::from(!ahead)..threads)
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

    /// Takes this thread's share of the walk and waits for the others within `deadline`:
    /// everything the walk saw, for any number of families to be matched against
    /// ([`Collected::matched`]).
    pub(super) fn collect(mut self, deadline: Instant) -> Result<Collected> {
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
        Ok(Collected {
            ctx: Arc::clone(&self.ctx),
            all,
        })
    }
}

/// Everything one walk saw, not yet matched against a family: the checks that asked before
/// the walk started share it ([`shared`]), each matching its own devices.
pub(super) struct Collected {
    ctx: Arc<ScanCtx>,
    all: Sightings,
}

impl Collected {
    /// What of `family` the walk found: its devices' descriptors (this process's helpers'
    /// apart), still open now, and its mounts in the namespaces the walk read, but for the
    /// tables whose root mount is in `read_already` (the check read the host's and its own
    /// itself; the walk reads the host's too when pid 1's `ns/mnt` cannot be read).
    pub(super) fn matched(&self, family: &Family, read_already: &[u32]) -> ProcScan {
        let (ctx, all) = (&self.ctx, &self.all);
        let mut out = ProcScan {
            unchecked: all.unchecked.clone(),
            ..ProcScan::default()
        };
        for (table, ns) in &all.tables {
            if table
                .mounts
                .first()
                .is_none_or(|m| !read_already.contains(&m.id))
            {
                family.mounts_in(&ctx.root, table, *ns, &mut out.usage);
            }
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
        out
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
    /// Which mapped files are block devices, as any share found them.
    kinds: super::maps::FileKinds,
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
        match super::maps::mapped_devices(&self.proc_fd, pid, &self.kinds) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;
    use std::path::Path;

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

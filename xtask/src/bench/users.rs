//! A plain reading of who uses a volume, for the teardown rows' "kernel floor after a plain
//! in-use reading": what a detach that refuses a volume in use has to read, done from the
//! benchmark process with std alone (not through lunkit's code).
//!
//! The kernel keeps an open count for a device-mapper map, but none for a SCSI disk that
//! userspace can read, so a process holding a path device is found only by reading every
//! process: its descriptors (`/proc/PID/fd/*`, each followed to its file) and its memory
//! mappings (`/proc/PID/maps`, each distinct file looked at through `map_files/`, since a
//! mapping outlives its descriptor), and each mount namespace's mount table once. This does
//! that the plain way: kernel threads passed over on one `readlink`, a file mapped by many
//! processes looked at once, the processes shared out over as many threads as the guest has
//! CPUs. It is not the least the reading can cost: lunkit's walk does it faster.

use std::collections::HashSet;
use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::Result;

/// What the reading found: who holds one of the devices, as `PID: what` lines.
#[derive(Debug, Default)]
pub struct Found {
    pub users: Vec<String>,
    /// Processes read (kernel threads and processes that exited meanwhile are not).
    pub processes: usize,
    /// Distinct mapped files looked at.
    pub files: usize,
    /// Thread time in each kind of work, summed over the threads: following every
    /// descriptor, reading every `maps`, looking at each distinct mapped file.
    pub descriptors: Duration,
    pub maps: Duration,
    pub looks: Duration,
}

/// Checks that [`users`] sees what it must, on the volume's map (`devices[0]`): a descriptor
/// this process holds on it, and then a mapping of it whose descriptor is closed. Each
/// reading must name this process and nothing else: a reading that missed a user would be
/// a cheap reading of nothing.
pub fn self_check(devices: &[String]) -> Result<()> {
    let me = std::process::id();
    let map = fs::File::open(format!("/dev/{}", devices[0]))?;
    let held = users(devices)?;
    let mapping = super::sys::map_one_byte(&map)?;
    drop(map);
    let mapped = users(devices)?;
    drop(mapping);
    for (what, found) in [("descriptor", held), ("mapping", mapped)] {
        let ours = format!("{me}: {what} ");
        if found.users.len() != 1 || !found.users[0].starts_with(&ours) {
            return Err(format!(
                "the plain reading of /dev/{} with a {what} held by this process ({me}) found \
                 {:?}",
                devices[0], found.users
            )
            .into());
        }
    }
    Ok(())
}

/// The programs whose descriptor on a path is no use of it, as lunkit's check has them
/// (`lunkit::scsi::PATH_MANAGERS`): multipathd holds every path it checks, udev probes them.
const PATH_MANAGERS: &[&str] = &[
    "multipathd",
    "(udev-worker)",
    "systemd-udevd",
    "udevd",
    "kpartx",
];

/// Whether the process at `dir` (`/proc/PID`) is a path manager, by its command name.
fn is_path_manager(dir: &str) -> bool {
    fs::read_to_string(format!("{dir}/comm"))
        .is_ok_and(|c| PATH_MANAGERS.contains(&c.trim_end_matches('\n')))
}

/// Reads every process's descriptors and mappings and every mount namespace's mount table,
/// and says which of them hold one of `devices` (`/dev/NAME` kernel names: the map first,
/// then its paths).
pub fn users(devices: &[String]) -> Result<Found> {
    let mut rdevs = Vec::new();
    for d in devices {
        rdevs.push(fs::metadata(format!("/dev/{d}"))?.rdev());
    }
    let numbers: Vec<String> = devices
        .iter()
        .map(|d| fs::read_to_string(format!("/sys/class/block/{d}/dev")))
        .collect::<std::io::Result<Vec<_>>>()?
        .into_iter()
        .map(|s| format!(" {} ", s.trim()))
        .collect();
    let pids: Vec<u32> = fs::read_dir("/proc")?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    let shared = Shared {
        rdevs,
        numbers,
        next: AtomicUsize::new(0),
        files: Mutex::new(HashSet::new()),
        namespaces: Mutex::new(HashSet::new()),
        found: Mutex::new(Found::default()),
        spent: Default::default(),
    };
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                while let Some(&pid) = pids.get(shared.next.fetch_add(1, Ordering::Relaxed)) {
                    shared.read(pid);
                }
            });
        }
    });
    let mut found = shared.found.into_inner().map_err(|_| "a reader panicked")?;
    found.files = shared
        .files
        .into_inner()
        .map_err(|_| "a reader panicked")?
        .len();
    let [descriptors, maps, looks] = shared
        .spent
        .map(|ns| Duration::from_nanos(ns.load(Ordering::Relaxed)));
    (found.descriptors, found.maps, found.looks) = (descriptors, maps, looks);
    Ok(found)
}

struct Shared {
    rdevs: Vec<u64>,
    /// `" MAJ:MIN "` of each device, as a mount table names a filesystem's device.
    numbers: Vec<String>,
    next: AtomicUsize,
    /// Mapped files looked at already: (`maps`'s device field, inode).
    files: Mutex<HashSet<(String, u64)>>,
    /// Mount namespaces read already (`ns/mnt` inodes).
    namespaces: Mutex<HashSet<u64>>,
    found: Mutex<Found>,
    /// Nanoseconds of thread time per kind of work: descriptors, `maps` reads, looks.
    spent: [AtomicU64; 3],
}

/// Where [`Shared::spent`] counts.
const DESCRIPTORS: usize = 0;
const MAPS: usize = 1;
const LOOKS: usize = 2;

impl Shared {
    fn spend(&self, kind: usize, since: Instant) {
        let ns = u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.spent[kind].fetch_add(ns, Ordering::Relaxed);
    }

    fn say(&self, pid: u32, what: String) {
        if let Ok(mut f) = self.found.lock() {
            f.users.push(format!("{pid}: {what}"));
        }
    }

    fn is_ours(&self, m: &fs::Metadata) -> bool {
        m.file_type().is_block_device() && self.rdevs.contains(&m.rdev())
    }

    /// Whether `m` is one of the volume's paths (every device but the first, its map).
    fn is_path(&self, m: &fs::Metadata) -> bool {
        self.rdevs[1..].contains(&m.rdev())
    }

    /// One process; one that exits meanwhile has nothing left to find.
    fn read(&self, pid: u32) {
        let dir = format!("/proc/{pid}");
        // A kernel thread has no executable, and no descriptors or mappings either.
        if fs::read_link(format!("{dir}/exe")).is_err() {
            return;
        }
        if let Ok(mut f) = self.found.lock() {
            f.processes += 1;
        }
        let t = Instant::now();
        if let Ok(fds) = fs::read_dir(format!("{dir}/fd")) {
            for fd in fds.flatten() {
                let Ok(m) = fs::metadata(fd.path()) else {
                    continue;
                };
                if self.is_ours(&m) && !(self.is_path(&m) && is_path_manager(&dir)) {
                    self.say(pid, format!("descriptor {:?}", fd.file_name()));
                }
            }
        }
        self.spend(DESCRIPTORS, t);
        let t = Instant::now();
        let maps = fs::read_to_string(format!("{dir}/maps"));
        self.spend(MAPS, t);
        if let Ok(maps) = maps {
            for line in maps.lines() {
                self.mapping(pid, &dir, line);
            }
        }
        let Ok(ns) = fs::metadata(format!("{dir}/ns/mnt")) else {
            return;
        };
        if !self.namespaces.lock().is_ok_and(|mut n| n.insert(ns.ino())) {
            return;
        }
        if let Ok(table) = fs::read_to_string(format!("{dir}/mountinfo")) {
            for line in table.lines() {
                if self.numbers.iter().any(|n| line.contains(n.as_str())) {
                    self.say(pid, format!("mount {line}"));
                }
            }
        }
    }

    /// One line of `maps`: `START-END PERMS OFFSET MAJ:MIN INODE [PATH]`, the addresses padded
    /// to eight hex digits, which `map_files/` does not pad.
    fn mapping(&self, pid: u32, dir: &str, line: &str) {
        let mut f = line.split_whitespace();
        let (Some(range), Some(dev), Some(ino)) = (f.next(), f.nth(2), f.next()) else {
            return;
        };
        let Ok(ino) = ino.parse::<u64>() else {
            return;
        };
        let Some((start, end)) = range.split_once('-') else {
            return;
        };
        let (Ok(start), Ok(end)) = (u64::from_str_radix(start, 16), u64::from_str_radix(end, 16))
        else {
            return;
        };
        if ino == 0
            || !self
                .files
                .lock()
                .is_ok_and(|mut s| s.insert((dev.to_owned(), ino)))
        {
            return;
        }
        let link = format!("{dir}/map_files/{start:x}-{end:x}");
        let t = Instant::now();
        let looked = fs::metadata(link);
        self.spend(LOOKS, t);
        match looked {
            Ok(m) if self.is_ours(&m) => self.say(pid, format!("mapping {range}")),
            Ok(_) => {}
            // Unmapped since `maps` was read: the file is not known yet, and another
            // process that maps it looks at it.
            Err(_) => {
                if let Ok(mut s) = self.files.lock() {
                    s.remove(&(dev.to_owned(), ino));
                }
            }
        }
    }
}

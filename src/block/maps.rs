//! Block devices a process has memory-mapped: `/proc/PID/maps` lists its mappings, and
//! `/proc/PID/map_files/START-END` is a link to each mapped file, which `statx` follows to
//! tell a block device and its number. A mapping holds its file open after the descriptor
//! that made it is closed (`mmap`, then `close`): `fd/` alone misses such a user, and the
//! device's page cache is written through the mapping.

use std::collections::HashMap;
use std::ffi::CString;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Mutex;

use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;

use crate::id::DevNum;

/// One line of `/proc/PID/maps` that maps a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct MapsLine<'a> {
    /// Where it starts and ends, in hex without the leading zeros `maps` pads them with
    /// ([`MapsLine::name`]).
    pub(super) start: &'a str,
    pub(super) end: &'a str,
    /// Shared and writable (`rw-s`): writes through it reach the device.
    pub(super) writable_shared: bool,
    /// The device of the filesystem holding the mapped file (`major:minor`, hex in the
    /// line) and the file's inode: together they name the file.
    pub(super) file: FileKey,
}

/// Parses one line of `/proc/PID/maps`: `START-END PERMS OFFSET MAJ:MIN INODE [PATH]`.
/// `None` for an anonymous mapping (inode 0) or a malformed line.
pub(super) fn parse_line(line: &str) -> Option<MapsLine<'_>> {
    let mut f = line.split_ascii_whitespace();
    let range = f.next()?;
    let perms = f.next()?.as_bytes();
    let _offset = f.next()?;
    let (major, minor) = f.next()?.split_once(':')?;
    let inode = crate::id::decimal::<u64>(f.next()?)?;
    let (start, end) = range.split_once('-')?;
    let hex = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit());
    if inode == 0 || !hex(start) || !hex(end) || perms.len() != 4 {
        return None;
    }
    Some(MapsLine {
        start: unpadded(start),
        end: unpadded(end),
        writable_shared: perms[1] == b'w' && perms[3] == b's',
        file: (
            u32::from_str_radix(major, 16).ok()?,
            u32::from_str_radix(minor, 16).ok()?,
            inode,
        ),
    })
}

impl MapsLine<'_> {
    /// The name of its `map_files/` entry: `START-END` as the kernel prints it there
    /// (`%lx-%lx`), without `maps`' padding to eight digits. `map_files/` refuses a name with
    /// a leading zero (`ENOENT`), so a mapping below `0x10000000` (a non-PIE executable such
    /// as a Go program or Debian's `python3`, or any mapping of a 32-bit process) would look
    /// gone under its `maps` name.
    pub(super) fn name(&self) -> String {
        format!("{}-{}", self.start, self.end)
    }
}

/// `hex` without its leading zeros, `0` for zero.
fn unpadded(hex: &str) -> &str {
    let digits = hex.trim_start_matches('0');
    if digits.is_empty() {
        &hex[hex.len() - 1..]
    } else {
        digits
    }
}

/// A block device a process has mapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Mapped {
    pub(super) dev: DevNum,
    /// One of its mappings of it is shared and writable.
    pub(super) writable: bool,
}

/// Which mapped files are block devices, by file (see [`MapsLine::file`]): the same
/// libraries are mapped by every process, and each is looked at once per walk, whichever of
/// the walk's threads meets it first. A look is a `statx` through `map_files/`, which reaches
/// the file's filesystem (a round trip to the server on a network or 9p root), so it is the
/// walk's costliest call per file.
///
/// Held for one walk only: a file's (device, inode) pair names it while the walk runs, and
/// could name another file (a device node, say) once that one is deleted and its inode
/// number reused.
#[derive(Debug, Default)]
pub(super) struct FileKinds(Mutex<HashMap<FileKey, Option<DevNum>>>);

/// A mapped file: its filesystem's device number and its inode ([`MapsLine::file`]).
type FileKey = (u32, u32, u64);

impl FileKinds {
    /// What the walk found `file` to be, if a thread looked at it already.
    fn get(&self, file: FileKey) -> Option<Option<DevNum>> {
        self.lock().get(&file).copied()
    }

    /// Remembers what `file` is. Two threads that met it at once both looked, and agree.
    fn insert(&self, file: FileKey, dev: Option<DevNum>) {
        self.lock().insert(file, dev);
    }

    /// The map, also after a thread panicked holding it: each entry is written whole, so
    /// what it holds is still true.
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<FileKey, Option<DevNum>>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The block devices `pid` has mapped, each once (writable if any mapping of it is). The
/// errno when its `maps` or a `map_files/` entry cannot be read (`EACCES` without ptrace
/// access to it, `EPERM` without `CAP_SYS_ADMIN`, `ENOENT`/`ESRCH` once it is gone).
pub(super) fn mapped_devices(
    proc_fd: &OwnedFd,
    pid: u32,
    kinds: &FileKinds,
) -> Result<Vec<Mapped>, Errno> {
    // A range gone before its file was looked at (unmapped, or split or merged by `munmap`
    // or `mprotect` of part of it) may leave its file mapped under another range: `maps` is
    // read again. A process whose mappings still change after that (one starting, loading
    // its libraries) has the ranges that went away passed over, the others counted.
    let mut reads = 0;
    loop {
        reads += 1;
        let text = read_all(proc_fd, &format!("{pid}/maps"))?;
        let text = String::from_utf8_lossy(&text);
        let lines: Vec<MapsLine<'_>> = text.lines().filter_map(parse_line).collect();
        if kinds.look_at_new(proc_fd, pid, &lines)? || reads == MAPS_READS {
            return Ok(devices_of(&lines, kinds));
        }
    }
}

/// How many times [`mapped_devices`] reads a process's `maps` while ranges go away under it.
const MAPS_READS: usize = 3;

/// The block devices `lines` map, each once, once `kinds` knows every file of them.
fn devices_of(lines: &[MapsLine<'_>], kinds: &FileKinds) -> Vec<Mapped> {
    let mut found: Vec<Mapped> = Vec::new();
    for line in lines {
        let Some(Some(dev)) = kinds.get(line.file) else {
            continue;
        };
        match found.iter_mut().find(|m| m.dev == dev) {
            Some(m) => m.writable |= line.writable_shared,
            None => found.push(Mapped {
                dev,
                writable: line.writable_shared,
            }),
        }
    }
    found
}

/// Below this many files new to a walk in one process, they are looked at one after the
/// other; from it on, by [`LOOKERS`] threads at once.
const LOOK_ALONE_MAX: usize = 16;

/// How many threads look at one process's new files at once. A look is a `statx` that waits
/// on the file's filesystem (a round trip to the server on a network or 9p root), not on a
/// CPU: a process that maps many files the walk has not met (a node's first JVM, say) costs
/// a round trip per file one after the other, and a fraction of that side by side.
const LOOKERS: usize = 8;

impl FileKinds {
    /// Looks at each file of `lines` the walk has not met yet, through `pid`'s
    /// `map_files/` (one `statx` per file), and remembers what it is. `false` when a range
    /// was gone before its file was looked at (`ENOENT`, the process still there); any other
    /// error is the process's.
    fn look_at_new(
        &self,
        proc_fd: &OwnedFd,
        pid: u32,
        lines: &[MapsLine<'_>],
    ) -> Result<bool, Errno> {
        // Each new file with every range it is mapped at: one range gone (split, merged or
        // unmapped under the walk) is not the file gone while another still maps it.
        let mut new: Vec<Vec<&MapsLine<'_>>> = Vec::new();
        for line in lines.iter().filter(|l| self.get(l.file).is_none()) {
            match new.iter_mut().find(|n| n[0].file == line.file) {
                Some(ranges) => ranges.push(line),
                None => new.push(vec![line]),
            }
        }
        let look = |some: &[Vec<&MapsLine<'_>>]| -> Result<bool, Errno> {
            let mut all = true;
            for ranges in some {
                let mut seen = None;
                for line in ranges {
                    seen = look_at(proc_fd.as_fd(), pid, line)?;
                    if seen.is_some() {
                        break;
                    }
                }
                match seen {
                    Some(dev) => self.insert(ranges[0].file, dev),
                    None => all = false,
                }
            }
            Ok(all)
        };
        if new.len() < LOOK_ALONE_MAX {
            return look(&new);
        }
        std::thread::scope(|s| {
            let shares: Vec<_> = new
                .chunks(new.len().div_ceil(LOOKERS))
                .map(|some| s.spawn(move || look(some)))
                .collect();
            // A thread that panicked may have looked at nothing: the process is a gap.
            let mut all = true;
            for t in shares {
                all &= t.join().unwrap_or(Err(Errno::IO))?;
            }
            Ok(all)
        })
    }
}

/// What the file mapped at `range` in `pid` is (`Some(None)`: not a block device), or
/// `None` when that range is gone.
///
/// `statx` through `map_files/` asks the file's filesystem. Should it answer `ENOENT` for a
/// file while the mapping is there (a network filesystem for a file deleted on its server,
/// say), the file is looked at by the path the link names, and counts only if that path is
/// the same file (device and inode as `maps` has them). Otherwise the process is a gap
/// (`ESTALE`), never gone. (The `ENOENT` first seen here, for the lab's non-PIE `python3`,
/// was the padded name [`MapsLine::name`] now leaves out.)
fn look_at(
    proc_fd: BorrowedFd<'_>,
    pid: u32,
    line: &MapsLine<'_>,
) -> Result<Option<Option<DevNum>>, Errno> {
    let link =
        CString::new(format!("{pid}/map_files/{}", line.name())).map_err(|_| Errno::INVAL)?;
    match super::processes::open_block_device(proc_fd, &link) {
        Ok(dev) => Ok(Some(dev)),
        Err(Errno::NOENT) => match rustix::fs::readlinkat(proc_fd, link.as_c_str(), Vec::new()) {
            Ok(path) => by_path(proc_fd, pid, &path, line.file).map(Some),
            // The range went away since `maps` was read, the process still there.
            Err(Errno::NOENT) if still_there(proc_fd, pid) => Ok(None),
            Err(e) => Err(e),
        },
        Err(e) => Err(e),
    }
}

/// What the file at `path` (as process `pid`'s `map_files/` link names it: in that
/// process's root) is, if it is `file`; `ESTALE` if it is not, or cannot be looked at.
fn by_path(
    proc_fd: BorrowedFd<'_>,
    pid: u32,
    path: &std::ffi::CStr,
    file: FileKey,
) -> Result<Option<DevNum>, Errno> {
    use rustix::fs::{AtFlags, FileType, StatxFlags};
    let rel = path.to_bytes().strip_prefix(b"/").ok_or(Errno::STALE)?;
    // The link names the file in the mapping process's root (a container's, say).
    let mut at = format!("{pid}/root/").into_bytes();
    at.extend_from_slice(rel);
    let at = CString::new(at).map_err(|_| Errno::STALE)?;
    let st = rustix::fs::statx(
        proc_fd,
        at.as_c_str(),
        AtFlags::STATX_DONT_SYNC,
        StatxFlags::TYPE | StatxFlags::INO,
    )
    .map_err(|_| Errno::STALE)?;
    if (st.stx_dev_major, st.stx_dev_minor, st.stx_ino) != file {
        return Err(Errno::STALE);
    }
    let kind = FileType::from_raw_mode(st.stx_mode.into());
    Ok((kind == FileType::BlockDevice).then_some(DevNum {
        major: st.stx_rdev_major,
        minor: st.stx_rdev_minor,
    }))
}

/// Whether process `pid` still exists (its `/proc` directory is there).
fn still_there(proc_fd: BorrowedFd<'_>, pid: u32) -> bool {
    rustix::fs::statat(proc_fd, pid.to_string(), rustix::fs::AtFlags::empty()).is_ok()
}

/// The whole of a `/proc` file below `proc_fd` (a maps file has no size to ask for).
fn read_all(proc_fd: &OwnedFd, path: &str) -> Result<Vec<u8>, Errno> {
    let fd = rustix::fs::openat(
        proc_fd,
        path,
        OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let mut buf = vec![0u8; 16 * 1024];
    let mut len = 0;
    loop {
        if len == buf.len() {
            buf.resize(buf.len() * 2, 0);
        }
        match rustix::io::read(&fd, &mut buf[len..])? {
            0 => break,
            n => len += n,
        }
    }
    buf.truncate(len);
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_file_mappings_and_passes_over_the_rest() {
        let l = parse_line("7f1c2a000000-7f1c2a001000 rw-s 00000000 00:05 412   /dev/sdc").unwrap();
        assert_eq!(l.name(), "7f1c2a000000-7f1c2a001000");
        assert!(l.writable_shared);
        assert_eq!(l.file, (0, 5, 412));
        let l = parse_line("55d0c8a00000-55d0c8a28000 r--p 00000000 fe:01 1319 /usr/bin/sleep")
            .unwrap();
        assert!(!l.writable_shared);
        assert_eq!(l.file, (0xfe, 1, 1319));
        // `maps` pads an address to eight digits, `map_files/` names it without: a
        // non-PIE executable at 0x400000, and a mapping at zero.
        let l =
            parse_line("00400000-0041f000 r--p 00000000 00:15 495415 /usr/bin/python3.11").unwrap();
        assert_eq!(l.name(), "400000-41f000");
        let l = parse_line("00000000-00001000 r--s 00000000 00:05 7 /dev/sde").unwrap();
        assert_eq!(l.name(), "0-1000");
        // A private writable mapping writes nothing back.
        assert!(
            !parse_line("1000-2000 rw-p 00000000 00:05 9 /dev/sdd")
                .unwrap()
                .writable_shared
        );
        // Anonymous, heap and stack mappings have inode 0.
        assert_eq!(
            parse_line("7ffd1000-7ffd2000 rw-p 00000000 00:00 0 [stack]"),
            None
        );
        assert_eq!(parse_line("1000-2000 rw-p 00000000 00:00 0"), None);
        // Malformed lines are passed over, never a panic.
        for bad in [
            "",
            "1000-2000",
            "zz-2000 r--s 0 00:05 3",
            "1000-2000 r--s 0 0005 3",
            "1000-2000 r-s 0 00:05 3",
            "1000-2000 r--s 0 00:05 x",
            "-2000 r--s 0 00:05 3",
        ] {
            assert_eq!(parse_line(bad), None, "{bad:?}");
        }
    }
}

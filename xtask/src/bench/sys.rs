//! The system calls the benchmark needs that std does not offer, declared by hand (xtask has
//! no dependencies, and the floors must not go through lunkit's own code): a kernel-uevent
//! netlink socket for the independent listener, `wait4` for a child's peak RSS, the
//! `BLKFLSBUF` and `DM_DEV_REMOVE` ioctls for the teardown floor, `mmap` for holding a file
//! mapped, and a non-blocking connect to
//! multipathd's abstract socket for the resize floor. 64-bit Linux only, like the lab.
// xtask's one module with `unsafe` (Cargo.toml denies `unsafe_code` elsewhere).
#![allow(unsafe_code)]

use std::ffi::{c_int, c_long, c_void};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, ExitStatus};

const AF_UNIX: c_int = 1;
const AF_NETLINK: c_int = 16;
const SOCK_STREAM: c_int = 1;
const SOCK_DGRAM: c_int = 2;
const SOCK_NONBLOCK: c_int = 0o4000;
const SOCK_CLOEXEC: c_int = 0o2_000_000;
const NETLINK_KOBJECT_UEVENT: c_int = 15;
/// The kernel's uevent multicast group (udevd re-broadcasts on group 2; we want the kernel).
const KERNEL_GROUP: u32 = 1;
const SOL_SOCKET: c_int = 1;
const SO_RCVBUF: c_int = 8;
const SO_RCVBUFFORCE: c_int = 33;

#[repr(C)]
struct SockaddrNl {
    nl_family: u16,
    nl_pad: u16,
    nl_pid: u32,
    nl_groups: u32,
}

/// `struct rusage` on 64-bit Linux: two timevals, then 14 longs starting with `ru_maxrss`.
#[repr(C)]
struct Rusage {
    ru_utime: [c_long; 2],
    ru_stime: [c_long; 2],
    ru_maxrss: c_long,
    rest: [c_long; 13],
}

const _: () = assert!(size_of::<Rusage>() == 144, "64-bit Linux struct rusage");

const RLIMIT_NOFILE: c_int = 7;

#[repr(C)]
struct Rlimit {
    rlim_cur: u64,
    rlim_max: u64,
}
const _: () = assert!(size_of::<SockaddrNl>() == 12);

/// `struct sockaddr_un`: the family, then `sun_path` (an abstract name starts with a NUL).
#[repr(C)]
struct SockaddrUn {
    sun_family: u16,
    sun_path: [u8; 108],
}
const _: () = assert!(size_of::<SockaddrUn>() == 110);

/// `BLKFLSBUF`, `_IO(0x12, 97)` in <linux/fs.h>.
const BLKFLSBUF: u64 = 0x1261;
/// `DM_DEV_REMOVE`, `_IOWR(0xfd, 4, struct dm_ioctl)` in <linux/dm-ioctl.h>.
const DM_DEV_REMOVE: u64 = (3 << 30) | ((size_of::<DmIoctl>() as u64) << 16) | (0xfd << 8) | 4;

/// `struct dm_ioctl` (<linux/dm-ioctl.h>), the header of every device-mapper ioctl.
#[repr(C)]
struct DmIoctl {
    version: [u32; 3],
    data_size: u32,
    data_start: u32,
    target_count: u32,
    open_count: i32,
    flags: u32,
    event_nr: u32,
    padding: u32,
    dev: u64,
    name: [u8; 128],
    uuid: [u8; 129],
    data: [u8; 7],
}
const _: () = assert!(size_of::<DmIoctl>() == 312);

// SAFETY: these are glibc's declarations of socket(2), bind(2), connect(2), setsockopt(2),
// recvfrom(2), wait4(2), getrlimit(2), setrlimit(2), ioctl(2) and mmap(2) for 64-bit Linux, with
// the argument and struct layouts asserted above.
unsafe extern "C" {
    fn socket(domain: c_int, ty: c_int, protocol: c_int) -> c_int;
    fn bind(fd: c_int, addr: *const SockaddrNl, len: u32) -> c_int;
    fn connect(fd: c_int, addr: *const SockaddrUn, len: u32) -> c_int;
    fn setsockopt(fd: c_int, level: c_int, name: c_int, val: *const c_void, len: u32) -> c_int;
    fn recvfrom(
        fd: c_int,
        buf: *mut c_void,
        len: usize,
        flags: c_int,
        addr: *mut SockaddrNl,
        addrlen: *mut u32,
    ) -> isize;
    fn wait4(pid: c_int, status: *mut c_int, options: c_int, rusage: *mut Rusage) -> c_int;
    fn getrlimit(resource: c_int, rlim: *mut Rlimit) -> c_int;
    fn ioctl(fd: c_int, request: u64, ...) -> c_int;
    fn mmap(
        addr: *mut c_void,
        len: usize,
        prot: c_int,
        flags: c_int,
        fd: c_int,
        offset: i64,
    ) -> *mut c_void;
    fn munmap(addr: *mut c_void, len: usize) -> c_int;
    fn setrlimit(resource: c_int, rlim: *const Rlimit) -> c_int;
}

/// Raises this process's open-file limit to its hard limit; returns the new soft limit.
pub fn raise_nofile_limit() -> io::Result<u64> {
    let mut rl = Rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `rl` is valid for writes.
    if unsafe { getrlimit(RLIMIT_NOFILE, &raw mut rl) } != 0 {
        return Err(io::Error::last_os_error());
    }
    rl.rlim_cur = rl.rlim_max;
    // SAFETY: `rl` is a valid rlimit for the duration of the call.
    if unsafe { setrlimit(RLIMIT_NOFILE, &raw const rl) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(rl.rlim_cur)
}

/// A netlink socket subscribed to the kernel's uevents.
#[derive(Debug)]
pub struct UeventSocket {
    fd: OwnedFd,
}

impl UeventSocket {
    pub fn open() -> io::Result<Self> {
        // SAFETY: plain socket(2) call with constant arguments; the result is checked.
        let raw = unsafe {
            socket(
                AF_NETLINK,
                SOCK_DGRAM | SOCK_CLOEXEC,
                NETLINK_KOBJECT_UEVENT,
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a descriptor socket(2) just returned to us and nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // A burst of 512 disks is thousands of events: ask for a large queue (FORCE works as
        // root and ignores rmem_max; the plain option is the fallback).
        let size: c_int = 16 << 20;
        for opt in [SO_RCVBUFFORCE, SO_RCVBUF] {
            // SAFETY: `size` outlives the call and its length is passed.
            let rc = unsafe {
                setsockopt(
                    fd.as_raw_fd(),
                    SOL_SOCKET,
                    opt,
                    (&raw const size).cast(),
                    size_of::<c_int>() as u32,
                )
            };
            if rc == 0 {
                break;
            }
        }
        let addr = SockaddrNl {
            nl_family: AF_NETLINK as u16,
            nl_pad: 0,
            nl_pid: 0,
            nl_groups: KERNEL_GROUP,
        };
        // SAFETY: `addr` is a valid sockaddr_nl for the duration of the call.
        let rc = unsafe {
            bind(
                fd.as_raw_fd(),
                &raw const addr,
                size_of::<SockaddrNl>() as u32,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Self { fd })
    }

    /// Blocks for the next datagram; returns its length and the sender's port id (0 is the
    /// kernel). `ENOBUFS` (the queue overflowed, events were lost) comes back as an error.
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<(usize, u32)> {
        let mut addr = SockaddrNl {
            nl_family: 0,
            nl_pad: 0,
            nl_pid: 0,
            nl_groups: 0,
        };
        let mut len = size_of::<SockaddrNl>() as u32;
        // SAFETY: `buf` and `addr` are valid for writes of the lengths passed.
        let n = unsafe {
            recvfrom(
                self.fd.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                0,
                &raw mut addr,
                &raw mut len,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok((n as usize, addr.nl_pid))
    }
}

/// Connects a Unix stream socket to the abstract name `name` (without the leading NUL) without
/// blocking, and returns it in blocking mode. `Ok(None)` is `EAGAIN`: the listener's accept
/// queue is full, where a blocking connect would wait without limit; the caller tries again
/// until its deadline. No listener is `ECONNREFUSED`.
pub fn connect_abstract(name: &[u8]) -> io::Result<Option<UnixStream>> {
    let mut addr = SockaddrUn {
        sun_family: AF_UNIX as u16,
        sun_path: [0; 108],
    };
    if name.is_empty() || name.len() >= addr.sun_path.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("bad abstract socket name of {} bytes", name.len()),
        ));
    }
    addr.sun_path[1..=name.len()].copy_from_slice(name);
    // The family, the NUL and the name: an abstract name is exactly that long.
    let len = (size_of::<u16>() + 1 + name.len()) as u32;
    // SAFETY: plain socket(2) call with constant arguments; the result is checked.
    let raw = unsafe { socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a descriptor socket(2) just returned to us and nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: `addr` is a valid sockaddr_un for the duration of the call, `len` within it.
    if unsafe { connect(fd.as_raw_fd(), &raw const addr, len) } != 0 {
        let err = io::Error::last_os_error();
        return match err.kind() {
            io::ErrorKind::WouldBlock => Ok(None),
            _ => Err(err),
        };
    }
    let stream = UnixStream::from(fd);
    stream.set_nonblocking(false)?;
    Ok(Some(stream))
}

/// Waits for `child` with `wait4`, returning its exit status and peak RSS in KiB. The child
/// is reaped here: do not call `Child::wait` afterwards.
pub fn wait_rusage(child: &Child) -> io::Result<(ExitStatus, u64)> {
    let pid = child.id() as c_int;
    let mut status: c_int = 0;
    let mut ru = Rusage {
        ru_utime: [0; 2],
        ru_stime: [0; 2],
        ru_maxrss: 0,
        rest: [0; 13],
    };
    loop {
        // SAFETY: `status` and `ru` are valid for writes; `pid` is our own unreaped child.
        let rc = unsafe { wait4(pid, &raw mut status, 0, &raw mut ru) };
        if rc == pid {
            break;
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
    Ok((
        ExitStatus::from_raw(status),
        u64::try_from(ru.ru_maxrss).unwrap_or(0),
    ))
}

/// `BLKFLSBUF` on the block device at `path`: write back and drop its page cache (what
/// `blockdev --flushbufs` does).
pub fn flush_buffers(path: &str) -> io::Result<()> {
    let f = std::fs::File::open(path)?;
    // SAFETY: BLKFLSBUF takes no argument; the fd is open for the duration of the call.
    if unsafe { ioctl(f.as_raw_fd(), BLKFLSBUF, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `DM_DEV_REMOVE` of the device-mapper device `name` through /dev/mapper/control: the
/// ioctl `dmsetup remove` and `multipath -f` end with.
pub fn dm_remove(name: &str) -> io::Result<()> {
    let mut req = DmIoctl {
        version: [4, 0, 0],
        data_size: size_of::<DmIoctl>() as u32,
        data_start: size_of::<DmIoctl>() as u32,
        target_count: 0,
        open_count: 0,
        flags: 0,
        event_nr: 0,
        padding: 0,
        dev: 0,
        name: [0; 128],
        uuid: [0; 129],
        data: [0; 7],
    };
    if name.is_empty() || name.len() >= req.name.len() || name.contains('\0') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("bad dm name {name:?}"),
        ));
    }
    req.name[..name.len()].copy_from_slice(name.as_bytes());
    let control = std::fs::File::open("/dev/mapper/control")?;
    // SAFETY: `req` is a valid, initialised dm_ioctl whose data_size covers exactly it, and
    // it outlives the call; the kernel writes back into it.
    if unsafe { ioctl(control.as_raw_fd(), DM_DEV_REMOVE, &raw mut req) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `struct pr_registration` (<linux/pr.h>): `IOC_PR_REGISTER`'s argument.
#[repr(C)]
struct PrRegistration {
    old_key: u64,
    new_key: u64,
    flags: u32,
    pad: u32,
}
const _: () = assert!(size_of::<PrRegistration>() == 24);

/// `struct pr_reservation` (<linux/pr.h>): `IOC_PR_RESERVE`'s and `IOC_PR_RELEASE`'s.
#[repr(C)]
struct PrReservation {
    key: u64,
    kind: u32,
    flags: u32,
}
const _: () = assert!(size_of::<PrReservation>() == 16);

/// `struct pr_clear` (<linux/pr.h>): `IOC_PR_CLEAR`'s argument.
#[repr(C)]
struct PrClear {
    key: u64,
    flags: u32,
    pad: u32,
}
const _: () = assert!(size_of::<PrClear>() == 16);

/// `_IOW('p', nr, size)`.
const fn pr_iow(nr: u64, size: usize) -> u64 {
    (1 << 30) | ((size as u64) << 16) | ((b'p' as u64) << 8) | nr
}
const IOC_PR_REGISTER: u64 = pr_iow(200, size_of::<PrRegistration>());
const IOC_PR_RESERVE: u64 = pr_iow(201, size_of::<PrReservation>());
const IOC_PR_RELEASE: u64 = pr_iow(202, size_of::<PrReservation>());
const IOC_PR_CLEAR: u64 = pr_iow(205, size_of::<PrClear>());
/// `O_NONBLOCK` of `open(2)`: how lunkit opens a device for a reservation request.
const O_NONBLOCK: c_int = 0o4000;
/// `PR_FL_IGNORE_KEY`: REGISTER AND IGNORE EXISTING KEY.
const PR_FL_IGNORE_KEY: u32 = 1;
/// `PR_WRITE_EXCLUSIVE_REG_ONLY` of `enum pr_type`.
pub const PR_WRITE_EXCLUSIVE_REG_ONLY: u32 = 3;

/// A persistent-reservation request as the `IOC_PR_*` ioctls take it.
#[derive(Debug, Clone, Copy)]
pub enum Pr {
    /// REGISTER AND IGNORE EXISTING KEY with this key.
    RegisterIgnore(u64),
    /// REGISTER from this key to none: the registration dropped.
    Unregister(u64),
    /// RESERVE with this key and `pr_type`.
    Reserve(u64, u32),
    /// RELEASE with this key and `pr_type`.
    Release(u64, u32),
    /// CLEAR with this key: every registration and the reservation gone.
    Clear(u64),
}

/// Sends `req` to the block device at `path` (opened read-only and non-blocking, as
/// `lunkit pr` opens it). The ioctl returns the SCSI status (host byte in bits 16-23) when
/// the device refused: a CHECK CONDITION (6.1's sd passes a queued UNIT ATTENTION up) is
/// sent again, twice at most, as lunkit does, so that the floor does the same device work.
pub fn pr(path: &str, req: Pr) -> io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(O_NONBLOCK)
        .open(path)?;
    let fd = f.as_raw_fd();
    let reg = |old_key, new_key, flags| PrRegistration {
        old_key,
        new_key,
        flags,
        pad: 0,
    };
    let res = |key, kind| PrReservation {
        key,
        kind,
        flags: 0,
    };
    let issue = || match req {
        Pr::RegisterIgnore(k) => pr_ioctl(fd, IOC_PR_REGISTER, &reg(0, k, PR_FL_IGNORE_KEY)),
        Pr::Unregister(k) => pr_ioctl(fd, IOC_PR_REGISTER, &reg(k, 0, 0)),
        Pr::Reserve(k, t) => pr_ioctl(fd, IOC_PR_RESERVE, &res(k, t)),
        Pr::Release(k, t) => pr_ioctl(fd, IOC_PR_RELEASE, &res(k, t)),
        Pr::Clear(key) => pr_ioctl(
            fd,
            IOC_PR_CLEAR,
            &PrClear {
                key,
                flags: 0,
                pad: 0,
            },
        ),
    };
    let mut ret = 0;
    for _ in 0..3 {
        ret = issue();
        if ret < 0 {
            return Err(io::Error::last_os_error());
        }
        if ret != 2 {
            break;
        }
    }
    match ret {
        0 => Ok(()),
        s => Err(io::Error::other(format!(
            "{req:?} on {path}: SCSI status {:#04x}, host byte {:#04x}",
            s & 0xff,
            (s >> 16) & 0xff
        ))),
    }
}

/// One `IOC_PR_*` ioctl on `fd` with `arg`, one of the `Pr*` structs above.
fn pr_ioctl<T>(fd: c_int, request: u64, arg: &T) -> c_int {
    // SAFETY: `arg` is a valid, initialised `Pr*` struct of the size `request` encodes (the
    // callers pair them), alive for the call; the kernel only reads it.
    unsafe { ioctl(fd, request, std::ptr::from_ref(arg)) }
}

const PROT_READ: c_int = 1;
const MAP_SHARED: c_int = 1;
const MAP_FAILED: *mut c_void = !0 as *mut c_void;

/// A one-byte read-only shared mapping of a file ([`map_one_byte`]), unmapped when dropped.
pub struct Mapping(*mut c_void);

/// Maps the first byte of `file` read-only, until the [`Mapping`] is dropped: the file stays
/// in use by this process after its descriptor closes, as a mapping keeps it.
pub fn map_one_byte(file: &std::fs::File) -> io::Result<Mapping> {
    // SAFETY: a fresh read-only shared mapping of one byte at an address the kernel picks;
    // nothing in this process reads or writes it, and only `Mapping`'s drop unmaps it.
    let p = unsafe {
        mmap(
            std::ptr::null_mut(),
            1,
            PROT_READ,
            MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    if p == MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(Mapping(p))
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `self.0` is the one-byte mapping `map_one_byte` made, unmapped only here.
        unsafe { munmap(self.0, 1) };
    }
}

/// Maps the first byte of `file` read-only and never unmaps it: the mapping keeps the file
/// (and so 9p's cache of it) alive without an open descriptor, which every process's
/// `/proc/PID/fd` would show to lunkit's in-use check.
pub fn pin_mapped(file: &std::fs::File) -> io::Result<()> {
    // Intentionally leaked: never unmapped.
    std::mem::forget(map_one_byte(file)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pr_requests_are_linux_pr_h_values() {
        // <linux/pr.h> on x86-64: _IOW('p', 200, struct pr_registration) and so on.
        assert_eq!(IOC_PR_REGISTER, 0x4018_70c8);
        assert_eq!(IOC_PR_RESERVE, 0x4010_70c9);
        assert_eq!(IOC_PR_RELEASE, 0x4010_70ca);
        assert_eq!(IOC_PR_CLEAR, 0x4010_70cd);
    }
}

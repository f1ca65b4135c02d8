//! The two system calls the benchmark needs that std does not offer, declared by hand (xtask
//! has no dependencies): a kernel-uevent netlink socket for the independent listener, and
//! `wait4` for a child's peak RSS. 64-bit Linux only, like the lab.

use std::ffi::{c_int, c_long, c_void};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, ExitStatus};

const AF_NETLINK: c_int = 16;
const SOCK_DGRAM: c_int = 2;
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

// SAFETY: these are glibc's declarations of socket(2), bind(2), setsockopt(2), recvfrom(2)
// and wait4(2) for 64-bit Linux, with the argument and struct layouts asserted above.
unsafe extern "C" {
    fn socket(domain: c_int, ty: c_int, protocol: c_int) -> c_int;
    fn bind(fd: c_int, addr: *const SockaddrNl, len: u32) -> c_int;
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

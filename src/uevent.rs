//! Kernel uevents: the `NETLINK_KOBJECT_UEVENT` socket, its datagram format and a filter.
//!
//! lunkit waits for the kernel, not for udev: the monitor listens on multicast group 1, where
//! the kernel sends `ACTION@DEVPATH\0KEY=VALUE\0…` datagrams as devices come and go (group 2
//! carries udevd's re-broadcast, which does not exist without udevd). Only datagrams whose
//! sender port id is 0, the kernel, are accepted: any local process can unicast to our socket,
//! and a forged `add` must never make a scan return a device that is not there.
//!
//! Events reach only the initial network namespace and are dropped when the socket's queue
//! overflows (`ENOBUFS`), so a waiter treats them as a hint and re-checks sysfs as well.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::Instant;

use rustix::event::{PollFd, PollFlags, Timespec, poll};
use rustix::io::Errno;
use rustix::net::netlink::{self, SocketAddrNetlink};
use rustix::net::{AddressFamily, RecvFlags, SocketFlags, SocketType, recvfrom, sockopt};

use crate::error::{Error, Result};
use crate::root::Root;

mod subscription;
pub use subscription::Subscription;

/// The kernel's multicast group (udevd's re-broadcast is group 2).
pub const KERNEL_GROUP: u32 = 1;

/// Receive queue asked for: udevd uses 128 MiB; 32 MiB absorbs a 256-LUN scan storm.
const RCVBUF: usize = 32 << 20;

/// Largest kernel uevent (`UEVENT_BUFFER_SIZE` is 2048); room to spare detects truncation.
const DATAGRAM_MAX: usize = 8192;

/// What happened to the device.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Action {
    /// `add`
    Add,
    /// `remove`
    Remove,
    /// `change`
    Change,
    /// `move`
    Move,
    /// `online`
    Online,
    /// `offline`
    Offline,
    /// `bind`
    Bind,
    /// `unbind`
    Unbind,
    /// An action this version does not know.
    Other(String),
}

impl Action {
    fn parse(s: &str) -> Action {
        match s {
            "add" => Action::Add,
            "remove" => Action::Remove,
            "change" => Action::Change,
            "move" => Action::Move,
            "online" => Action::Online,
            "offline" => Action::Offline,
            "bind" => Action::Bind,
            "unbind" => Action::Unbind,
            other => Action::Other(other.to_owned()),
        }
    }

    /// The kernel's word for it.
    pub fn as_str(&self) -> &str {
        match self {
            Action::Add => "add",
            Action::Remove => "remove",
            Action::Change => "change",
            Action::Move => "move",
            Action::Online => "online",
            Action::Offline => "offline",
            Action::Bind => "bind",
            Action::Unbind => "unbind",
            Action::Other(s) => s,
        }
    }
}

/// One kernel uevent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Uevent {
    /// What happened.
    pub action: Action,
    /// The device's path below `/sys` (`/devices/platform/host2/session1/...`).
    pub devpath: String,
    /// `SUBSYSTEM` (`block`, `scsi`, `scsi_device`...).
    pub subsystem: Option<String>,
    /// `DEVTYPE` (`disk`, `partition`, `scsi_device`...).
    pub devtype: Option<String>,
    /// `DEVNAME` (`sda`, `dm-0`), relative to `/dev`.
    pub devname: Option<String>,
    /// `SEQNUM`: the kernel's event counter, compared with `/sys/kernel/uevent_seqnum`.
    pub seqnum: u64,
    /// Every `KEY=VALUE` pair, in order (including the ones above).
    pub env: Vec<(String, String)>,
}

impl Uevent {
    /// Parses a kernel-format datagram (`ACTION@DEVPATH\0KEY=VALUE\0…`).
    ///
    /// Rejects udevd's `libudev` format, a header that disagrees with its `ACTION`/`DEVPATH`
    /// keys, and a datagram without `SEQNUM`: what the kernel sends always has them.
    pub fn parse(buf: &[u8]) -> Result<Uevent> {
        const KIND: &str = "uevent";
        let bad = |why| {
            Error::invalid(
                KIND,
                &String::from_utf8_lossy(&buf[..buf.len().min(64)]),
                why,
            )
        };
        if buf.starts_with(b"libudev\0") {
            return Err(bad("udevd message, not a kernel uevent"));
        }
        let mut fields = buf.split(|&b| b == 0).filter(|f| !f.is_empty());
        let header = fields.next().ok_or_else(|| bad("empty"))?;
        let header = std::str::from_utf8(header).map_err(|_| bad("header is not UTF-8"))?;
        let (action, devpath) = header
            .split_once('@')
            .ok_or_else(|| bad("header lacks '@'"))?;
        if action.is_empty() || !devpath.starts_with('/') {
            return Err(bad("header is not ACTION@/DEVPATH"));
        }
        let mut ev = Uevent {
            action: Action::parse(action),
            devpath: devpath.to_owned(),
            subsystem: None,
            devtype: None,
            devname: None,
            seqnum: 0,
            env: Vec::new(),
        };
        let mut seqnum = None;
        for f in fields {
            let f = std::str::from_utf8(f).map_err(|_| bad("field is not UTF-8"))?;
            let (k, v) = f.split_once('=').ok_or_else(|| bad("field lacks '='"))?;
            match k {
                "ACTION" if v != action => return Err(bad("ACTION disagrees with header")),
                "DEVPATH" if v != devpath => return Err(bad("DEVPATH disagrees with header")),
                "SUBSYSTEM" => ev.subsystem = Some(v.to_owned()),
                "DEVTYPE" => ev.devtype = Some(v.to_owned()),
                "DEVNAME" => ev.devname = Some(v.to_owned()),
                "SEQNUM" => seqnum = Some(v.parse().map_err(|_| bad("SEQNUM is not a number"))?),
                _ => {}
            }
            ev.env.push((k.to_owned(), v.to_owned()));
        }
        ev.seqnum = seqnum.ok_or_else(|| bad("no SEQNUM"))?;
        Ok(ev)
    }

    /// The value of `key`, if the event carries it.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.env
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Whether the event is about the device named `name` in sysfs or one below it: `name`
    /// is a whole component of its `DEVPATH` (`6:0:0:3` is one of
    /// `/devices/…/target6:0:0/6:0:0:3/block/sdc`, `6:0:0:31` is not).
    pub fn is_at_or_below(&self, name: &str) -> bool {
        self.devpath.split('/').any(|c| c == name)
    }
}

/// Reads `/sys/kernel/uevent_seqnum`: the number of the last uevent sent. Take it before
/// acting; events with a larger `SEQNUM` happened after.
pub fn current_seqnum(root: &Root) -> Result<u64> {
    let path = root.sys("kernel/uevent_seqnum");
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
    text.trim()
        .parse()
        .map_err(|_| Error::invalid("uevent_seqnum", text.trim(), "not a number"))
}

/// What [`Monitor::recv`] got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Received {
    /// A kernel uevent.
    Event(Uevent),
    /// The receive queue overflowed (`ENOBUFS`): events were lost, re-check sysfs.
    Overflow,
    /// The deadline passed with nothing received.
    TimedOut,
}

/// Something a waiter receives kernel uevents from: a [`Monitor`], its own socket, or a
/// [`Subscription`] to the socket it shares with the process's other waits.
pub trait Receive {
    /// Waits until a kernel uevent arrives, events were lost, or `deadline` passes (`None`
    /// waits forever).
    fn recv(&mut self, deadline: Option<Instant>) -> Result<Received>;
}

impl Receive for Monitor {
    fn recv(&mut self, deadline: Option<Instant>) -> Result<Received> {
        Monitor::recv(self, deadline)
    }
}

/// A socket subscribed to the kernel's uevents.
///
/// Subscribe before acting: events sent before [`Monitor::open`] are never seen.
#[derive(Debug)]
pub struct Monitor {
    fd: OwnedFd,
    buf: Vec<u8>,
    /// Datagrams dropped because they did not come from the kernel or did not parse.
    rejected: u64,
}

impl Monitor {
    /// `socket(AF_NETLINK, SOCK_RAW|SOCK_CLOEXEC, NETLINK_KOBJECT_UEVENT)` bound to the kernel
    /// group, with a large receive queue (`SO_RCVBUFFORCE` when privileged, else `SO_RCVBUF`,
    /// which the kernel caps at `net.core.rmem_max`).
    pub fn open() -> Result<Monitor> {
        let fd = rustix::net::socket_with(
            AddressFamily::NETLINK,
            SocketType::RAW,
            SocketFlags::CLOEXEC,
            Some(netlink::KOBJECT_UEVENT),
        )
        .map_err(|e| sock_err("socket(NETLINK_KOBJECT_UEVENT)", e))?;
        if sockopt::set_socket_recv_buffer_size_force(&fd, RCVBUF).is_err() {
            // Without CAP_NET_ADMIN; the smaller queue only means earlier ENOBUFS, which the
            // waiters handle.
            let _ = sockopt::set_socket_recv_buffer_size(&fd, RCVBUF);
        }
        rustix::net::bind(&fd, &SocketAddrNetlink::new(0, KERNEL_GROUP))
            .map_err(|e| sock_err("bind(NETLINK_KOBJECT_UEVENT, group 1)", e))?;
        Ok(Monitor {
            fd,
            buf: vec![0; DATAGRAM_MAX],
            rejected: 0,
        })
    }

    /// The port id the kernel gave this socket (what a unicast sender would target).
    pub fn port_id(&self) -> Result<u32> {
        let addr = rustix::net::getsockname(&self.fd)
            .map_err(|e| sock_err("getsockname(uevent socket)", e))?;
        SocketAddrNetlink::try_from(addr)
            .map(|a| a.pid())
            .map_err(|e| sock_err("getsockname(uevent socket)", e))
    }

    /// How many datagrams were dropped as not from the kernel or malformed.
    pub fn rejected(&self) -> u64 {
        self.rejected
    }

    /// Waits until a kernel uevent arrives, the queue overflows, or `deadline` passes
    /// (`None` waits forever). Datagrams from anyone but the kernel are dropped silently.
    pub fn recv(&mut self, deadline: Option<Instant>) -> Result<Received> {
        loop {
            let timeout = match deadline {
                None => None,
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        // One last non-blocking read, so an event already queued still counts.
                        Some(Timespec {
                            tv_sec: 0,
                            tv_nsec: 0,
                        })
                    } else {
                        Some(Timespec::try_from(left).unwrap_or(Timespec {
                            tv_sec: i64::MAX,
                            tv_nsec: 0,
                        }))
                    }
                }
            };
            let mut fds = [PollFd::new(&self.fd, PollFlags::IN)];
            match poll(&mut fds, timeout.as_ref()) {
                Ok(0) => return Ok(Received::TimedOut),
                Ok(_) => {}
                Err(Errno::INTR) => continue,
                Err(e) => return Err(sock_err("poll(uevent socket)", e)),
            }
            let (got, len, from) = match recvfrom(
                &self.fd,
                &mut self.buf[..],
                RecvFlags::DONTWAIT | RecvFlags::TRUNC,
            ) {
                Ok(r) => r,
                Err(Errno::NOBUFS) => return Ok(Received::Overflow),
                Err(Errno::AGAIN | Errno::INTR) => continue,
                Err(e) => return Err(sock_err("recvfrom(uevent socket)", e)),
            };
            let from_kernel = from
                .and_then(|a| SocketAddrNetlink::try_from(a).ok())
                .is_some_and(|a| a.pid() == 0);
            // TRUNC makes `len` the datagram's real size: larger than `got` means truncated.
            if !from_kernel || len > got {
                self.rejected += 1;
                continue;
            }
            match Uevent::parse(&self.buf[..got]) {
                Ok(ev) => return Ok(Received::Event(ev)),
                Err(_) => self.rejected += 1,
            }
        }
    }
}

impl AsFd for Monitor {
    /// The socket, for callers that poll it themselves (async runtimes).
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

fn sock_err(what: &str, e: Errno) -> Error {
    Error::io(format!("<{what}>"), e.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ADD_SDA: &[u8] = b"add@/devices/platform/host2/session1/target2:0:0/2:0:0:1/block/sda\0\
ACTION=add\0DEVPATH=/devices/platform/host2/session1/target2:0:0/2:0:0:1/block/sda\0\
SUBSYSTEM=block\0MAJOR=8\0MINOR=0\0DEVNAME=sda\0DEVTYPE=disk\0DISKSEQ=9\0SEQNUM=3131\0";

    #[test]
    fn parses_kernel_datagram() {
        let ev = Uevent::parse(ADD_SDA).unwrap();
        assert_eq!(ev.action, Action::Add);
        assert!(ev.devpath.ends_with("/block/sda"));
        assert_eq!(ev.subsystem.as_deref(), Some("block"));
        assert_eq!(ev.devtype.as_deref(), Some("disk"));
        assert_eq!(ev.devname.as_deref(), Some("sda"));
        assert_eq!(ev.seqnum, 3131);
        assert_eq!(ev.get("MAJOR"), Some("8"));
        assert_eq!(ev.get("NOPE"), None);
        assert!(ev.is_at_or_below("2:0:0:1"));
        assert!(ev.is_at_or_below("sda"));
        assert!(!ev.is_at_or_below("2:0:0:10"));
        assert!(!ev.is_at_or_below("2:0:0"));
    }

    #[test]
    fn rejects_malformed_datagrams() {
        let cases: &[&[u8]] = &[
            b"",
            b"\0\0",
            b"libudev\0\xfe\xed\xca\xfe",
            b"add/devices/x\0SEQNUM=1\0",
            b"@/devices/x\0SEQNUM=1\0",
            b"add@devices/x\0SEQNUM=1\0",
            b"add@/devices/x\0ACTION=add\0",
            b"add@/devices/x\0SEQNUM=x\0",
            b"add@/devices/x\0ACTION=remove\0SEQNUM=1\0",
            b"add@/devices/x\0DEVPATH=/devices/y\0SEQNUM=1\0",
            b"add@/devices/x\0NOEQUALS\0SEQNUM=1\0",
            b"add@/devices/\xff\0SEQNUM=1\0",
        ];
        for c in cases {
            assert!(
                Uevent::parse(c).is_err(),
                "{:?}",
                String::from_utf8_lossy(c)
            );
        }
    }

    #[test]
    fn truncated_datagram_is_an_error_or_a_shorter_event() {
        for n in 0..ADD_SDA.len() {
            // Any prefix either fails (no SEQNUM yet) or parses to a consistent event.
            if let Ok(ev) = Uevent::parse(&ADD_SDA[..n]) {
                assert!(ev.devpath.starts_with("/devices/"));
            }
        }
    }
}

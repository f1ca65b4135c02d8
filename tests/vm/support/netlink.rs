//! A process's netlink sockets, from `/proc`: the port id a unicast sender must target, and
//! the kernel's per-socket counters (bytes queued, datagrams dropped on overflow).
//!
//! `/proc/net/netlink` lists every netlink socket of the reader's network namespace with its
//! protocol (`Eth`), port id (`Pid`), multicast groups, receive queue (`Rmem`), drop counter
//! (`Drops`, the socket's `sk_drops`, counted when the queue is full) and inode; a process's
//! `/proc/PID/fd/N` links read `socket:[INODE]`. Only std, like every fixture.

use std::collections::HashSet;

/// `NETLINK_KOBJECT_UEVENT`, the kernel uevent protocol.
pub const KOBJECT_UEVENT: u32 = 15;

/// One row of `/proc/net/netlink`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetlinkSocket {
    /// Netlink protocol (`15` for uevents).
    pub protocol: u32,
    /// Port id: where a unicast `sendto` must be addressed (`0` is the kernel).
    pub port: u32,
    /// Multicast group bitmap of the first 32 groups (`1` is the kernel's uevent group).
    pub groups: u32,
    /// Bytes waiting in the receive queue.
    pub rmem: u64,
    /// Datagrams the kernel dropped because the receive queue was full.
    pub drops: u64,
    /// Socket inode, as in `/proc/PID/fd/N -> socket:[INODE]`.
    pub inode: u64,
}

/// Every netlink socket of our network namespace.
pub fn all() -> Vec<NetlinkSocket> {
    let text = std::fs::read_to_string("/proc/net/netlink").unwrap_or_default();
    text.lines().skip(1).filter_map(parse_row).collect()
}

/// `sk Eth Pid Groups Rmem Wmem Dump Locks Drops Inode`
fn parse_row(line: &str) -> Option<NetlinkSocket> {
    let f: Vec<&str> = line.split_whitespace().collect();
    if f.len() < 10 {
        return None;
    }
    Some(NetlinkSocket {
        protocol: f[1].parse().ok()?,
        port: f[2].parse().ok()?,
        groups: u32::from_str_radix(f[3], 16).ok()?,
        rmem: f[4].parse().ok()?,
        drops: f[8].parse().ok()?,
        inode: f[9].parse().ok()?,
    })
}

/// Inodes of the sockets process `pid` holds open (`/proc/PID/fd/* -> socket:[N]`).
pub fn socket_inodes(pid: u32) -> HashSet<u64> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return HashSet::new();
    };
    dir.flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter_map(|t| {
            t.to_str()?
                .strip_prefix("socket:[")?
                .strip_suffix(']')?
                .parse()
                .ok()
        })
        .collect()
}

/// The netlink sockets of process `pid`.
pub fn sockets_of(pid: u32) -> Vec<NetlinkSocket> {
    let inodes = socket_inodes(pid);
    if inodes.is_empty() {
        return Vec::new();
    }
    all()
        .into_iter()
        .filter(|s| inodes.contains(&s.inode))
        .collect()
}

/// The socket of `pid` that listens to the kernel's uevents (protocol 15, bound to group 1),
/// once it is bound; `None` before that or if there is none.
pub fn uevent_listener_of(pid: u32) -> Option<NetlinkSocket> {
    sockets_of(pid)
        .into_iter()
        .find(|s| s.protocol == KOBJECT_UEVENT && s.groups & 1 != 0)
}

/// The same socket again, by inode (its counters change, its inode does not); `None` once
/// it is closed.
pub fn by_inode(inode: u64) -> Option<NetlinkSocket> {
    all().into_iter().find(|s| s.inode == inode)
}

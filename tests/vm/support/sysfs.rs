//! Plain std::fs reads of sysfs, independent of the lunkit library: the tests' ground truth.

use std::path::{Path, PathBuf};

/// An attribute's content without the trailing newline; `None` if it is absent or unreadable
/// (`wwid` fails with ENXIO when there is no VPD page 0x83).
pub fn attr(path: impl AsRef<Path>) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim_end_matches('\n').to_owned())
}

/// Names in a directory, sorted; empty if it does not exist.
pub fn names(dir: impl AsRef<Path>) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// The last component of a symlink's target (`device` -> `host6/session1` gives `session1`).
pub fn link_name(path: impl AsRef<Path>) -> Option<String> {
    let target = std::fs::read_link(path).ok()?;
    Some(target.file_name()?.to_str()?.to_owned())
}

/// The canonical path of a sysfs link.
pub fn resolve(path: impl AsRef<Path>) -> Option<PathBuf> {
    std::fs::canonicalize(path).ok()
}

/// The number after `prefix` in a name like `host6` or `session1`.
pub fn number_after(name: &str, prefix: &str) -> Option<u32> {
    name.strip_prefix(prefix)?.parse().ok()
}

/// The `LOCAL` prefixes of the kernel's routing tables (`/proc/net/fib_trie`: a leaf
/// `|-- 127.0.0.0` followed by `/8 host LOCAL`), as (network, prefix length). Read without
/// spawning `ip`; empty when unreadable.
fn local_prefixes() -> Vec<(std::net::Ipv4Addr, u32)> {
    let trie = std::fs::read_to_string("/proc/net/fib_trie").unwrap_or_default();
    let mut leaf = None;
    let mut out = Vec::new();
    for line in trie.lines().map(str::trim) {
        if let Some(a) = line.strip_prefix("|-- ") {
            leaf = a.parse().ok();
        } else if let (Some(net), Some(rest)) = (leaf, line.strip_prefix('/')) {
            let words: Vec<&str> = rest.split_whitespace().collect();
            if words.last() == Some(&"LOCAL") {
                if let Some(len) = words.first().and_then(|l| l.parse().ok()) {
                    out.push((net, len));
                }
            }
        }
    }
    out
}

/// Whether `addr` (IPv4) is an address of this host's own (`/32 host LOCAL`), as
/// `ip addr add` makes it.
pub fn local_address(addr: &str) -> bool {
    let Ok(a) = addr.parse::<std::net::Ipv4Addr>() else {
        return false;
    };
    local_prefixes().contains(&(a, 32))
}

/// Whether the kernel delivers `addr` (IPv4) locally: a `LOCAL` prefix holds it (Linux's
/// `local 127.0.0.0/8` holds all of 127/8).
pub fn delivered_locally(addr: &str) -> bool {
    let Ok(a) = addr.parse::<std::net::Ipv4Addr>() else {
        return false;
    };
    local_prefixes().into_iter().any(|(net, len)| {
        let mask = if len == 0 {
            0
        } else {
            u32::MAX << (32 - len.min(32))
        };
        u32::from(a) & mask == u32::from(net) & mask
    })
}

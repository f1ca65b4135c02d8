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

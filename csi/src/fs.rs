//! Filesystems on a staged device: probe for a signature, format only a blank device, grow a
//! mounted filesystem. The programs come from util-linux, e2fsprogs and xfsprogs.

use std::path::Path;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::exec::{self, Program};

/// The filesystem types the plugin formats and grows.
pub const SUPPORTED: &[&str] = &["ext4", "xfs"];

/// The type when the CO names none.
pub const DEFAULT_FS: &str = "ext4";

/// What a device holds, by `blkid -p` (a low-level probe, no cache).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Signature {
    /// Nothing blkid recognises: blank, safe to format.
    Blank,
    /// A filesystem (or other content) of this type.
    Filesystem(String),
    /// A partition table of this type: not formatted over.
    PartitionTable(String),
}

/// Reads `blkid -p -o export` output.
pub fn parse_probe(export: &str) -> Signature {
    let mut ty = None;
    let mut pt = None;
    for line in export.lines() {
        if let Some(v) = line.strip_prefix("TYPE=") {
            ty = Some(v.trim().to_owned());
        } else if let Some(v) = line.strip_prefix("PTTYPE=") {
            pt = Some(v.trim().to_owned());
        }
    }
    match (ty, pt) {
        (Some(t), _) => Signature::Filesystem(t),
        (None, Some(p)) => Signature::PartitionTable(p),
        (None, None) => Signature::Blank,
    }
}

/// Probes `device`.
pub fn probe(device: &Path, timeout: Duration) -> Result<Signature> {
    let dev = device.to_string_lossy();
    let args = ["-p", "-o", "export", dev.as_ref()];
    let out = exec::run(Program::Blkid, &args, timeout)?;
    match out.code {
        Some(0) => Ok(parse_probe(&out.stdout)),
        // blkid's "nothing was identified".
        Some(2) => Ok(Signature::Blank),
        _ => Err(Error::Program(out.describe(Program::Blkid, &args))),
    }
}

/// Formats the blank `device` with `fs_type`.
pub fn format(device: &Path, fs_type: &str, timeout: Duration) -> Result<()> {
    let dev = device.to_string_lossy();
    let (program, args): (Program, Vec<&str>) = match fs_type {
        // -F: the device is a whole disk, which mke2fs asks about otherwise.
        "ext4" => (Program::MkfsExt4, vec!["-q", "-F", dev.as_ref()]),
        "xfs" => (Program::MkfsXfs, vec!["-q", dev.as_ref()]),
        other => {
            return Err(Error::Unimplemented(format!(
                "filesystem type {other:?} is not supported (only {})",
                SUPPORTED.join(", ")
            )));
        }
    };
    exec::run_ok(program, &args, timeout).map(drop)
}

/// Grows the filesystem of type `fs_type` on `device`, mounted at `mount_point`, to fill the
/// device.
pub fn grow(device: &Path, mount_point: &Path, fs_type: &str, timeout: Duration) -> Result<()> {
    let dev = device.to_string_lossy();
    let mnt = mount_point.to_string_lossy();
    match fs_type {
        "ext4" | "ext3" => exec::run_ok(Program::Resize2fs, &[dev.as_ref()], timeout).map(drop),
        "xfs" => exec::run_ok(Program::XfsGrowfs, &[mnt.as_ref()], timeout).map(drop),
        other => Err(Error::Unimplemented(format!(
            "growing filesystem type {other:?} is not supported"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_blkid_export_output() {
        assert_eq!(
            parse_probe("DEVNAME=/dev/dm-0\nUUID=1234\nBLOCK_SIZE=4096\nTYPE=ext4\n"),
            Signature::Filesystem("ext4".into())
        );
        assert_eq!(
            parse_probe("DEVNAME=/dev/sdb\nPTUUID=abcd\nPTTYPE=gpt\n"),
            Signature::PartitionTable("gpt".into())
        );
        assert_eq!(parse_probe(""), Signature::Blank);
    }
}

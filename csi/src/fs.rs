//! Filesystems on a staged device: probe for a signature, format only a blank device, grow a
//! mounted filesystem. The programs come from util-linux, e2fsprogs and xfsprogs.

use std::path::Path;
use std::time::Duration;

use lunkit::block::BlockNode;

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

/// How much of each end of a device [`check_readable`] reads: where blkid looks for
/// signatures (superblocks near the start; GPT's backup header, RAID and LVM metadata near
/// the end).
pub const READ_SPAN: u64 = 1 << 20;

/// Probes `device`: first reads its start and its end ([`check_readable`]), then asks
/// `blkid -p`. blkid exits 2 both for "nothing identified" and for "could not read the
/// device", so its 2 means blank only once the reads have succeeded: a device that fails
/// reads is an error, never a blank device to format.
pub fn probe(device: &BlockNode, timeout: Duration) -> Result<Signature> {
    let deadline = std::time::Instant::now() + timeout;
    check_readable(device, timeout)?;
    let dev = device.path.to_string_lossy();
    let args = ["-p", "-o", "export", dev.as_ref()];
    let left = deadline.saturating_duration_since(std::time::Instant::now());
    let out = exec::run_on(Program::Blkid, &args, device, left)?;
    match out.code {
        Some(0) => Ok(parse_probe(&out.stdout)),
        // blkid's "nothing was identified", on a device just read whole at both ends.
        Some(2) => Ok(Signature::Blank),
        _ => Err(Error::Program(out.describe(Program::Blkid, &args))),
    }
}

/// Reads the first and the last [`READ_SPAN`] bytes of `device` (all of a smaller one),
/// within `timeout`, on lunkit's helper threads ([`lunkit::block::read_ends`]). A read that
/// fails is `INTERNAL` naming the device, the offset and the errno; one still blocked at the
/// deadline (I/O queued on a map with no path) is `DEADLINE_EXCEEDED`. The blocked read
/// goes on on its helper, which the in-use check of a later unstage lists apart from the
/// device's users (and whose map removal fails the queued I/O, which ends it); a stage
/// retried meanwhile starts no second read but waits for that one, then says it is blocked.
pub fn check_readable(device: &BlockNode, timeout: Duration) -> Result<()> {
    let shown = device.path.display();
    let deadline = std::time::Instant::now() + timeout;
    match lunkit::block::read_ends(device, READ_SPAN, deadline) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == lunkit::ErrorKind::Timeout => Err(Error::DeadlineExceeded(format!(
            "reading {shown} has not returned in {:.1}s; it is not probed or formatted ({e})",
            timeout.as_secs_f64()
        ))),
        Err(e) => Err(Error::Internal(format!(
            "{shown} cannot be read: {e} (errno {}); it is not probed or formatted",
            e.errno().unwrap_or(0)
        ))),
    }
}

/// Formats the blank `device` with `fs_type`.
pub fn format(device: &BlockNode, fs_type: &str, timeout: Duration) -> Result<()> {
    let dev = device.path.to_string_lossy();
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
    let out = exec::run_on(program, &args, device, timeout)?;
    if out.code == Some(0) {
        Ok(())
    } else {
        Err(Error::Program(out.describe(program, &args)))
    }
}

/// Grows the filesystem of type `fs_type` on `device`, mounted at `mount_point`, to fill the
/// device. The grower writes to the device, so it runs as [`exec::run_on`] it: one left in the
/// kernel at its deadline is known as the plugin's own, and a later unstage waits for it
/// rather than naming lunkit-csi among the device's users.
pub fn grow(
    device: &BlockNode,
    mount_point: &Path,
    fs_type: &str,
    timeout: Duration,
) -> Result<()> {
    let dev = device.path.to_string_lossy();
    let mnt = mount_point.to_string_lossy();
    let (program, arg) = match fs_type {
        "ext4" | "ext3" => (Program::Resize2fs, dev.as_ref()),
        "xfs" => (Program::XfsGrowfs, mnt.as_ref()),
        other => {
            return Err(Error::Unimplemented(format!(
                "growing filesystem type {other:?} is not supported"
            )));
        }
    };
    let out = exec::run_on(program, &[arg], device, timeout)?;
    if out.code == Some(0) {
        Ok(())
    } else {
        Err(Error::Program(out.describe(program, &[arg])))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_that_cannot_be_opened_or_read_is_an_internal_error_naming_it() {
        // A node that does not exist: the error names it and the errno (ENOENT).
        let missing = BlockNode {
            name: "lunkit-missing".into(),
            dev: lunkit::DevNum {
                major: 7,
                minor: 1 << 19,
            },
            path: std::path::PathBuf::from("/dev/lunkit-test-missing-node"),
        };
        let e = check_readable(&missing, Duration::from_secs(60)).unwrap_err();
        let said = e.to_string();
        assert_eq!(e.code(), tonic::Code::Internal, "{said}");
        assert!(said.contains("/dev/lunkit-test-missing-node"), "{said}");
        assert!(said.contains("errno 2"), "{said}");
        let e = probe(&missing, Duration::from_secs(60)).unwrap_err();
        assert!(e.to_string().contains("errno 2"), "{e}");
        // A file in the node's place is not the device: refused, never read as it.
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("dev");
        std::fs::File::create(&f).unwrap().set_len(4096).unwrap();
        let planted = BlockNode { path: f, ..missing };
        let e = check_readable(&planted, Duration::from_secs(60)).unwrap_err();
        assert_eq!(e.code(), tonic::Code::Internal, "{e}");
        assert!(e.to_string().contains("not the device"), "{e}");
    }

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

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

/// How much of each end of a device [`check_readable`] reads: where blkid looks for
/// signatures (superblocks near the start; GPT's backup header, RAID and LVM metadata near
/// the end).
pub const READ_SPAN: u64 = 1 << 20;

/// Probes `device`: first reads its start and its end ([`check_readable`]), then asks
/// `blkid -p`. blkid exits 2 both for "nothing identified" and for "could not read the
/// device", so its 2 means blank only once the reads have succeeded: a device that fails
/// reads is an error, never a blank device to format.
pub fn probe(device: &Path, timeout: Duration) -> Result<Signature> {
    let deadline = std::time::Instant::now() + timeout;
    check_readable(device, timeout)?;
    let dev = device.to_string_lossy();
    let args = ["-p", "-o", "export", dev.as_ref()];
    let left = deadline.saturating_duration_since(std::time::Instant::now());
    let out = exec::run(Program::Blkid, &args, left)?;
    match out.code {
        Some(0) => Ok(parse_probe(&out.stdout)),
        // blkid's "nothing was identified", on a device just read whole at both ends.
        Some(2) => Ok(Signature::Blank),
        _ => Err(Error::Program(out.describe(Program::Blkid, &args))),
    }
}

/// Reads the first and the last [`READ_SPAN`] bytes of `device` (all of a smaller one),
/// within `timeout`. A read that fails is `INTERNAL` naming the device, the offset and the
/// errno; one still blocked at the deadline (I/O queued on a map with no path) is
/// `DEADLINE_EXCEEDED`, its thread left to end on its own.
pub fn check_readable(device: &Path, timeout: Duration) -> Result<()> {
    let (tx, rx) = std::sync::mpsc::channel();
    let path = device.to_owned();
    std::thread::spawn(move || {
        let _ = tx.send(read_ends(&path));
    });
    let shown = device.display();
    match rx.recv_timeout(timeout) {
        Ok(Ok(())) => Ok(()),
        Ok(Err((offset, e))) => Err(Error::Internal(format!(
            "{shown} cannot be read at byte {offset}: {e} (errno {}); it is not probed or formatted",
            e.raw_os_error().unwrap_or(0)
        ))),
        Err(_) => Err(Error::DeadlineExceeded(format!(
            "reading {shown} has not returned in {:.1}s; it is not probed or formatted",
            timeout.as_secs_f64()
        ))),
    }
}

/// The reads of [`check_readable`]; an error with the offset it happened at.
fn read_ends(path: &Path) -> std::result::Result<(), (u64, std::io::Error)> {
    use std::io::{Seek, SeekFrom};
    use std::os::unix::fs::FileExt;
    let mut f = std::fs::File::open(path).map_err(|e| (0, e))?;
    let size = f.seek(SeekFrom::End(0)).map_err(|e| (0, e))?;
    let tail = size.saturating_sub(READ_SPAN);
    let mut buf = vec![0u8; usize::try_from(READ_SPAN.min(size)).unwrap_or(0)];
    for offset in [0, tail] {
        f.read_exact_at(&mut buf, offset).map_err(|e| (offset, e))?;
    }
    Ok(())
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
    fn both_ends_of_a_readable_device_are_read_and_an_unreadable_one_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        // Smaller than two spans, and larger: both read whole at their ends.
        for size in [4096, 3 * READ_SPAN + 512] {
            let f = dir.path().join(format!("dev{size}"));
            std::fs::File::create(&f).unwrap().set_len(size).unwrap();
            check_readable(&f, Duration::from_secs(60)).unwrap();
        }
        // A directory opens, and every read fails (EISDIR): the error names it and the errno.
        let e = check_readable(dir.path(), Duration::from_secs(60)).unwrap_err();
        let said = e.to_string();
        assert_eq!(e.code(), tonic::Code::Internal, "{said}");
        assert!(said.contains(&dir.path().display().to_string()), "{said}");
        assert!(
            said.contains(&format!(
                "errno {}",
                rustix::io::Errno::ISDIR.raw_os_error()
            )),
            "{said}"
        );
        let e = probe(&dir.path().join("missing"), Duration::from_secs(60)).unwrap_err();
        assert!(e.to_string().contains("missing"), "{e}");
        assert!(e.to_string().contains("errno 2"), "{e}");
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

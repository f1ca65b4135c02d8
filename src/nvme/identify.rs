//! What a controller says a namespace is: the Identify Namespace command, sent through the
//! controller's character device (`/dev/nvmeN`, `NVME_IOCTL_ADMIN_CMD`), and its decoding.
//!
//! sysfs shows the size the kernel last read; Identify asks the controller now. A resize
//! compares the two: the array's answer is the size every path must come to, and two
//! controllers of one subsystem that disagree about it are two views of a volume that is
//! changing (or not one volume).
//!
//! [`IdentifyNamespace::parse`] is pure; [`identify_namespace`] opens the controller's node
//! by number (never trusting the name alone) and bounds the command by the deadline, since
//! the kernel waits for its completion.

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::time::Instant;

use rustix::fs::{FileType, Mode, OFlags};

use crate::error::{Error, Result};
use crate::helper::{self, Subject};
use crate::id::DevNum;
use crate::nvme::sysfs as sysnvme;
use crate::root::Root;
use crate::sysfs;

/// The parts of the Identify Namespace data structure a resize needs (NVM Express NVM
/// Command Set Specification, "Identify Namespace data structure").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdentifyNamespace {
    /// NSZE: the namespace's size in logical blocks.
    pub blocks: u64,
    /// The size of a logical block in the format in use, in bytes (2^LBADS).
    pub block_bytes: u64,
}

impl IdentifyNamespace {
    /// Byte offset of NSZE (8 bytes, little-endian).
    const NSZE: usize = 0;
    /// Byte offset of NLBAF: the number of LBA formats, minus one.
    const NLBAF: usize = 25;
    /// Byte offset of FLBAS: the format in use (bits 3:0, and bits 6:5 above them).
    const FLBAS: usize = 26;
    /// Byte offset of the LBA format table: 4 bytes per format, LBADS in bits 23:16.
    const LBAF: usize = 128;
    /// The table has room for 64 formats.
    const MAX_FORMATS: usize = 64;

    /// Decodes the 4096-byte structure. A shorter buffer, a format index past the table or
    /// past NLBAF, and a block size outside 512 bytes to 2 GiB are [`Error::Invalid`]: an
    /// answer that cannot be trusted is never turned into a size.
    pub fn parse(data: &[u8]) -> Result<IdentifyNamespace> {
        const KIND: &str = "Identify Namespace data";
        let bad = |reason: &'static str| Error::Invalid {
            kind: KIND,
            input: format!("{} bytes", data.len()),
            reason,
        };
        if data.len() < lunkit_sys::nvme::NVME_IDENTIFY_DATA_SIZE {
            return Err(bad("shorter than the 4096 bytes Identify returns"));
        }
        let mut nsze = [0u8; 8];
        nsze.copy_from_slice(&data[Self::NSZE..Self::NSZE + 8]);
        let flbas = data[Self::FLBAS];
        let format = usize::from(flbas & 0x0f) | (usize::from((flbas >> 5) & 0x03) << 4);
        if format >= Self::MAX_FORMATS || format > usize::from(data[Self::NLBAF]) {
            return Err(bad("the LBA format in use is not in its table"));
        }
        let lbads = data[Self::LBAF + 4 * format + 2];
        if !(9..=31).contains(&lbads) {
            return Err(bad("the LBA format's block size is not 512 bytes to 2 GiB"));
        }
        Ok(IdentifyNamespace {
            blocks: u64::from_le_bytes(nsze),
            block_bytes: 1 << lbads,
        })
    }

    /// The namespace's size in bytes; `None` when it does not fit in 64 bits.
    pub fn size_bytes(&self) -> Option<u64> {
        self.blocks.checked_mul(self.block_bytes)
    }
}

/// Sends Identify Namespace for `nsid` to controller `name` (`nvme0`) and decodes the answer.
///
/// The controller's character device is found by number: `<root>/sys/class/nvme/<name>/dev`
/// names it, and `<root>/dev/<name>` is used only if it is that character device (checked
/// on the open descriptor). The command runs on a helper thread bounded by `deadline`: the
/// kernel waits for the controller's completion, which a controller that stopped answering
/// delays until its admin timeout.
pub fn identify_namespace(
    root: &Root,
    name: &str,
    nsid: u32,
    deadline: Instant,
) -> Result<IdentifyNamespace> {
    let (node, dev) = controller_node(root, name)?;
    let what = || format!("Identify Namespace {nsid} through {}", node.display());
    let path = node.clone();
    let data = helper::bounded(
        Subject::char_device("identify", dev),
        deadline,
        &what,
        move || {
            let fd = open_controller(&path, dev)?;
            crate::ioctl::nvme_identify_ns(&fd, nsid).map_err(|e| Error::io(&path, e))
        },
    )?;
    IdentifyNamespace::parse(&data[..])
}

/// Controller `name`'s node, `<root>/dev/<name>`, and the character device number sysfs
/// gives it (`<root>/sys/class/nvme/<name>/dev`): what [`open_controller`] checks.
pub(crate) fn controller_node(root: &Root, name: &str) -> Result<(PathBuf, DevNum)> {
    sysfs::check_component("NVMe controller", name)?;
    let dir = sysfs::Confine::new(root)
        .dir(&sysnvme::controller_dir(root, name))
        .ok_or_else(|| Error::NotFound {
            what: format!(
                "NVMe controller {name} not found below {}",
                root.path().display()
            ),
        })?;
    let dev: DevNum = sysfs::attr_parse(&dir, "dev").ok_or_else(|| Error::NotFound {
        what: format!("NVMe controller {name} has no device number in sysfs"),
    })?;
    Ok((root.dev(name), dev))
}

/// Opens the controller node `path` and checks that it is character device `dev`.
pub(crate) fn open_controller(path: &std::path::Path, dev: DevNum) -> Result<OwnedFd> {
    let fd = rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
    )
    .map_err(|e| Error::io(path, e.into()))?;
    let st = rustix::fs::fstat(&fd).map_err(|e| Error::io(path, e.into()))?;
    let is_it = FileType::from_raw_mode(st.st_mode) == FileType::CharacterDevice
        && DevNum {
            major: rustix::fs::major(st.st_rdev),
            minor: rustix::fs::minor(st.st_rdev),
        } == dev;
    if !is_it {
        return Err(Error::Invalid {
            kind: "device node",
            input: path.display().to_string(),
            reason: "is not the NVMe controller the kernel names (stale or foreign node)",
        });
    }
    Ok(fd)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An Identify Namespace structure of `blocks` blocks in format `format` of a table
    /// whose entries have the block-size exponents `lbads`.
    fn data(blocks: u64, lbads: &[u8], format: u8) -> Vec<u8> {
        let mut d = vec![0u8; 4096];
        d[0..8].copy_from_slice(&blocks.to_le_bytes());
        d[8..16].copy_from_slice(&blocks.to_le_bytes());
        d[25] = u8::try_from(lbads.len() - 1).unwrap();
        d[26] = (format & 0x0f) | ((format >> 4) << 5);
        for (i, l) in lbads.iter().enumerate() {
            d[128 + 4 * i + 2] = *l;
        }
        d
    }

    #[test]
    fn size_is_nsze_blocks_of_the_format_in_use() {
        let id = IdentifyNamespace::parse(&data(131_072, &[9, 12], 0)).unwrap();
        assert_eq!(id.block_bytes, 512);
        assert_eq!(id.size_bytes(), Some(64 << 20));
        let id = IdentifyNamespace::parse(&data(16_384, &[9, 12], 1)).unwrap();
        assert_eq!(id.block_bytes, 4096);
        assert_eq!(id.size_bytes(), Some(64 << 20));
        // FLBAS bits 6:5 extend the index past 16 (NVMe 2.0).
        let mut lbads = vec![9u8; 20];
        lbads[17] = 12;
        let id = IdentifyNamespace::parse(&data(10, &lbads, 17)).unwrap();
        assert_eq!(id.block_bytes, 4096);
    }

    #[test]
    fn an_answer_that_cannot_be_trusted_is_invalid() {
        let invalid = |d: &[u8]| {
            IdentifyNamespace::parse(d).map_err(|e| e.kind()) == Err(crate::ErrorKind::Invalid)
        };
        assert!(invalid(&data(1, &[9], 0)[..4095]));
        assert!(invalid(&[]));
        // The format in use is past NLBAF.
        assert!(invalid(&data(1, &[9, 12], 2)));
        // Block sizes the specification does not allow.
        assert!(invalid(&data(1, &[8], 0)));
        assert!(invalid(&data(1, &[0], 0)));
        assert!(invalid(&data(1, &[40], 0)));
        // A size past 64 bits parses, and says it does not fit.
        let id = IdentifyNamespace::parse(&data(u64::MAX, &[12], 0)).unwrap();
        assert_eq!(id.size_bytes(), None);
    }
}

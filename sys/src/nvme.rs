//! NVMe passthrough: `<linux/nvme_ioctl.h>` (type `'N'`), issued on a controller's character
//! device `/dev/nvmeN`, and the Identify command lunkit sends through it.
//!
//! The kernel takes a [`nvme_passthru_cmd`] (also called `struct nvme_admin_cmd`), sends the
//! command to the controller, waits for its completion, copies `data_len` bytes of the
//! command's data to or from `addr`, and writes the completion's `result` back. Needs
//! `CAP_SYS_ADMIN`.

use core::mem::offset_of;

use crate::ioctl::iowr;

/// `struct nvme_passthru_cmd` (`struct nvme_admin_cmd`): one admin or I/O command.
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct nvme_passthru_cmd {
    /// The command's opcode ([`NVME_ADMIN_IDENTIFY`]).
    pub opcode: u8,
    /// Command flags (0).
    pub flags: u8,
    /// Reserved.
    pub rsvd1: u16,
    /// The namespace the command is about.
    pub nsid: u32,
    /// Command dword 2.
    pub cdw2: u32,
    /// Command dword 3.
    pub cdw3: u32,
    /// User address of the metadata buffer (0: none).
    pub metadata: u64,
    /// User address of the data buffer.
    pub addr: u64,
    /// Length of the metadata buffer.
    pub metadata_len: u32,
    /// Length of the data buffer, in bytes.
    pub data_len: u32,
    /// Command dword 10 (for Identify: the CNS value).
    pub cdw10: u32,
    /// Command dword 11.
    pub cdw11: u32,
    /// Command dword 12.
    pub cdw12: u32,
    /// Command dword 13.
    pub cdw13: u32,
    /// Command dword 14.
    pub cdw14: u32,
    /// Command dword 15.
    pub cdw15: u32,
    /// Timeout in milliseconds (0: the driver's default).
    pub timeout_ms: u32,
    /// Dword 0 of the completion, written by the kernel.
    pub result: u32,
}

const _: () = assert!(size_of::<nvme_passthru_cmd>() == 72);
const _: () = assert!(offset_of!(nvme_passthru_cmd, nsid) == 4);
const _: () = assert!(offset_of!(nvme_passthru_cmd, metadata) == 16);
const _: () = assert!(offset_of!(nvme_passthru_cmd, addr) == 24);
const _: () = assert!(offset_of!(nvme_passthru_cmd, data_len) == 36);
const _: () = assert!(offset_of!(nvme_passthru_cmd, cdw10) == 40);
const _: () = assert!(offset_of!(nvme_passthru_cmd, timeout_ms) == 64);
const _: () = assert!(offset_of!(nvme_passthru_cmd, result) == 68);

/// `NVME_IOCTL_ADMIN_CMD`: `_IOWR('N', 0x41, struct nvme_admin_cmd)`; one admin command.
pub const NVME_IOCTL_ADMIN_CMD: u32 = iowr(b'N' as u32, 0x41, size_of::<nvme_passthru_cmd>());

#[cfg(all(target_arch = "x86_64", target_pointer_width = "64"))]
const _: () = assert!(NVME_IOCTL_ADMIN_CMD == 0xc048_4e41);

/// The Identify admin command's opcode (NVM Express Base Specification, Admin Command Set).
pub const NVME_ADMIN_IDENTIFY: u8 = 0x06;
/// Identify's CNS value for the Identify Namespace data structure of the namespace in
/// `nsid` (`cdw10`).
pub const NVME_ID_CNS_NS: u32 = 0x00;
/// Every Identify data structure is 4096 bytes.
pub const NVME_IDENTIFY_DATA_SIZE: usize = 4096;

/// The Get Log Page admin command's opcode (NVM Express Base Specification, Admin Command
/// Set). `cdw10` holds the log id (bits 7:0), Retain Asynchronous Event (bit 15) and the
/// low half of the dword count minus one (bits 31:16); `cdw11` its high half; `cdw12` and
/// `cdw13` the byte offset into the log, which must be a multiple of 4.
pub const NVME_ADMIN_GET_LOG_PAGE: u8 = 0x02;
/// The Discovery Log Page's log id (`NVME_LOG_LID_DISCOVER`), served by discovery
/// controllers.
pub const NVME_LOG_LID_DISCOVER: u8 = 0x70;

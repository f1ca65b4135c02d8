//! Loop devices: `<linux/loop.h>`. Used by tests and the lab to build block devices from
//! files without `losetup`.
//!
//! The loop ioctl numbers are plain constants in the header (type `'L'` = `0x4C`, no
//! direction or size bits), so they are the same on every architecture. `LOOP_*` (except the
//! `LOOP_CTL_*` ones) go to an open `/dev/loopN`; `LOOP_CTL_*` go to `/dev/loop-control`.
//! The obsolete `struct loop_info` (with `unsigned long` fields) is deliberately not here; use
//! [`loop_info64`] with [`LOOP_SET_STATUS64`] / [`LOOP_GET_STATUS64`].

use core::mem::offset_of;

/// `LO_NAME_SIZE`: size of [`loop_info64::lo_file_name`] and `lo_crypt_name`.
pub const LO_NAME_SIZE: usize = 64;
/// `LO_KEY_SIZE`: size of [`loop_info64::lo_encrypt_key`].
pub const LO_KEY_SIZE: usize = 32;

/// `LO_FLAGS_READ_ONLY`: the device is read-only.
pub const LO_FLAGS_READ_ONLY: u32 = 1;
/// `LO_FLAGS_AUTOCLEAR`: detach the backing file on last close.
pub const LO_FLAGS_AUTOCLEAR: u32 = 4;
/// `LO_FLAGS_PARTSCAN`: scan the device for partitions.
pub const LO_FLAGS_PARTSCAN: u32 = 8;
/// `LO_FLAGS_DIRECT_IO`: use direct I/O on the backing file.
pub const LO_FLAGS_DIRECT_IO: u32 = 16;

/// `LOOP_SET_STATUS_SETTABLE_FLAGS`: flags `LOOP_SET_STATUS64` may set.
pub const LOOP_SET_STATUS_SETTABLE_FLAGS: u32 = LO_FLAGS_AUTOCLEAR | LO_FLAGS_PARTSCAN;
/// `LOOP_SET_STATUS_CLEARABLE_FLAGS`: flags `LOOP_SET_STATUS64` may clear.
pub const LOOP_SET_STATUS_CLEARABLE_FLAGS: u32 = LO_FLAGS_AUTOCLEAR;
/// `LOOP_CONFIGURE_SETTABLE_FLAGS`: flags `LOOP_CONFIGURE` may set.
pub const LOOP_CONFIGURE_SETTABLE_FLAGS: u32 =
    LO_FLAGS_READ_ONLY | LO_FLAGS_AUTOCLEAR | LO_FLAGS_PARTSCAN | LO_FLAGS_DIRECT_IO;

/// `LOOP_SET_FD`: attach the backing file whose fd is the argument.
pub const LOOP_SET_FD: u32 = 0x4C00;
/// `LOOP_CLR_FD`: detach the backing file (deferred to last close if open).
pub const LOOP_CLR_FD: u32 = 0x4C01;
/// `LOOP_SET_STATUS`: set status from the obsolete `struct loop_info`.
pub const LOOP_SET_STATUS: u32 = 0x4C02;
/// `LOOP_GET_STATUS`: get status as the obsolete `struct loop_info`.
pub const LOOP_GET_STATUS: u32 = 0x4C03;
/// `LOOP_SET_STATUS64`: set status from a [`loop_info64`].
pub const LOOP_SET_STATUS64: u32 = 0x4C04;
/// `LOOP_GET_STATUS64`: get status into a [`loop_info64`].
pub const LOOP_GET_STATUS64: u32 = 0x4C05;
/// `LOOP_CHANGE_FD`: swap the backing file of a read-only device.
pub const LOOP_CHANGE_FD: u32 = 0x4C06;
/// `LOOP_SET_CAPACITY`: re-read the backing file's size.
pub const LOOP_SET_CAPACITY: u32 = 0x4C07;
/// `LOOP_SET_DIRECT_IO`: turn direct I/O on (argument 1) or off (0).
pub const LOOP_SET_DIRECT_IO: u32 = 0x4C08;
/// `LOOP_SET_BLOCK_SIZE`: set the logical block size (argument: the size).
pub const LOOP_SET_BLOCK_SIZE: u32 = 0x4C09;
/// `LOOP_CONFIGURE`: attach and configure in one call from a [`loop_config`] (Linux 5.8+).
pub const LOOP_CONFIGURE: u32 = 0x4C0A;
/// `LOOP_CTL_ADD`: on `/dev/loop-control`, create `loopN` (argument N).
pub const LOOP_CTL_ADD: u32 = 0x4C80;
/// `LOOP_CTL_REMOVE`: on `/dev/loop-control`, delete `loopN` (argument N).
pub const LOOP_CTL_REMOVE: u32 = 0x4C81;
/// `LOOP_CTL_GET_FREE`: on `/dev/loop-control`, return the number of a free device,
/// creating one if needed.
pub const LOOP_CTL_GET_FREE: u32 = 0x4C82;

/// `struct loop_info64` (232 bytes): argument of `LOOP_SET_STATUS64` / `LOOP_GET_STATUS64`.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct loop_info64 {
    /// Out: device number of the backing file's filesystem.
    pub lo_device: u64,
    /// Out: inode number of the backing file.
    pub lo_inode: u64,
    /// Out: `rdev` of the backing file.
    pub lo_rdevice: u64,
    /// Offset into the backing file, in bytes.
    pub lo_offset: u64,
    /// Size limit in bytes; 0 means the whole (remaining) file.
    pub lo_sizelimit: u64,
    /// Out: the N of `loopN`.
    pub lo_number: u32,
    /// Obsolete, ignored.
    pub lo_encrypt_type: u32,
    /// Obsolete key size (in only).
    pub lo_encrypt_key_size: u32,
    /// `LO_FLAGS_*`.
    pub lo_flags: u32,
    /// Backing file name, NUL-terminated (informational; shown as `loop/backing_file`).
    pub lo_file_name: [u8; LO_NAME_SIZE],
    /// Obsolete crypt name.
    pub lo_crypt_name: [u8; LO_NAME_SIZE],
    /// Obsolete key (in only).
    pub lo_encrypt_key: [u8; LO_KEY_SIZE],
    /// Obsolete.
    pub lo_init: [u64; 2],
}

impl loop_info64 {
    /// An all-zero `loop_info64`.
    pub const fn zeroed() -> Self {
        Self {
            lo_device: 0,
            lo_inode: 0,
            lo_rdevice: 0,
            lo_offset: 0,
            lo_sizelimit: 0,
            lo_number: 0,
            lo_encrypt_type: 0,
            lo_encrypt_key_size: 0,
            lo_flags: 0,
            lo_file_name: [0; LO_NAME_SIZE],
            lo_crypt_name: [0; LO_NAME_SIZE],
            lo_encrypt_key: [0; LO_KEY_SIZE],
            lo_init: [0; 2],
        }
    }
}

impl Default for loop_info64 {
    fn default() -> Self {
        Self::zeroed()
    }
}

/// `struct loop_config` (304 bytes): argument of [`LOOP_CONFIGURE`].
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct loop_config {
    /// File descriptor of the backing file.
    pub fd: u32,
    /// Logical block size; 0 keeps the default (512).
    pub block_size: u32,
    /// Status to apply.
    pub info: loop_info64,
    /// Reserved, must be zero (`__reserved` in the header).
    pub __reserved: [u64; 8],
}

impl loop_config {
    /// An all-zero `loop_config`.
    pub const fn zeroed() -> Self {
        Self {
            fd: 0,
            block_size: 0,
            info: loop_info64::zeroed(),
            __reserved: [0; 8],
        }
    }
}

impl Default for loop_config {
    fn default() -> Self {
        Self::zeroed()
    }
}

const _: () = assert!(size_of::<loop_info64>() == 232);
// 8 on 64-bit ABIs, 4 on i386, like __u64 in C; the size is the same.
const _: () = assert!(align_of::<loop_info64>() == align_of::<u64>());
const _: () = assert!(offset_of!(loop_info64, lo_device) == 0);
const _: () = assert!(offset_of!(loop_info64, lo_inode) == 8);
const _: () = assert!(offset_of!(loop_info64, lo_rdevice) == 16);
const _: () = assert!(offset_of!(loop_info64, lo_offset) == 24);
const _: () = assert!(offset_of!(loop_info64, lo_sizelimit) == 32);
const _: () = assert!(offset_of!(loop_info64, lo_number) == 40);
const _: () = assert!(offset_of!(loop_info64, lo_encrypt_type) == 44);
const _: () = assert!(offset_of!(loop_info64, lo_encrypt_key_size) == 48);
const _: () = assert!(offset_of!(loop_info64, lo_flags) == 52);
const _: () = assert!(offset_of!(loop_info64, lo_file_name) == 56);
const _: () = assert!(offset_of!(loop_info64, lo_crypt_name) == 120);
const _: () = assert!(offset_of!(loop_info64, lo_encrypt_key) == 184);
const _: () = assert!(offset_of!(loop_info64, lo_init) == 216);

const _: () = assert!(size_of::<loop_config>() == 304);
const _: () = assert!(offset_of!(loop_config, fd) == 0);
const _: () = assert!(offset_of!(loop_config, block_size) == 4);
const _: () = assert!(offset_of!(loop_config, info) == 8);
const _: () = assert!(offset_of!(loop_config, __reserved) == 240);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeroed_is_default() {
        assert_eq!(loop_config::zeroed(), loop_config::default());
        assert_eq!(loop_config::default().info, loop_info64::default());
        assert!(loop_info64::default().lo_file_name.iter().all(|&b| b == 0));
    }
}

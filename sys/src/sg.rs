//! SCSI generic passthrough: `<scsi/sg.h>`'s `SG_IO` (interface version 3), issued on an
//! open SCSI disk (`/dev/sdX`) or its `/dev/sgN`.
//!
//! The kernel takes a [`sg_io_hdr`], sends the `cmd_len`-byte command at `cmdp` to the
//! device, waits for it to complete (or for `timeout` milliseconds, after which the SCSI
//! error handler aborts it), copies up to `mx_sb_len` bytes of sense data to `sbp` and
//! writes the outcome back into the header: the SAM `status` byte, the transport's
//! `host_status`, `driver_status`, and `sb_len_wr`, how much sense it wrote. A command that
//! moves no data (TEST UNIT READY) has `dxfer_direction` [`SG_DXFER_NONE`] and no buffer.
//!
//! `SG_IO` is not `_IOC`-encoded: it is `0x2285` on every architecture. On a block device the
//! kernel lets a reader (`O_RDONLY`) send the commands its safe list allows, which includes
//! TEST UNIT READY; anything else needs `CAP_SYS_RAWIO`.

use core::ffi::c_void;
use core::mem::offset_of;

/// `struct sg_io_hdr` (`sg_io_hdr_t`): one command and its outcome. The pointers are the
/// caller's; the header holds none of its own.
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct sg_io_hdr {
    /// [`SG_INTERFACE_ID_ORIG`] (`'S'`); anything else is `ENOSYS`.
    pub interface_id: i32,
    /// Data direction: [`SG_DXFER_NONE`], [`SG_DXFER_TO_DEV`], [`SG_DXFER_FROM_DEV`].
    pub dxfer_direction: i32,
    /// Length of the command at `cmdp` (6 to 16 bytes for the commands lunkit sends).
    pub cmd_len: u8,
    /// Room for sense data at `sbp`, in bytes.
    pub mx_sb_len: u8,
    /// Number of scatter-gather elements at `dxferp` (0: `dxferp` is one buffer).
    pub iovec_count: u16,
    /// Bytes to transfer.
    pub dxfer_len: u32,
    /// The data buffer (null with [`SG_DXFER_NONE`]).
    pub dxferp: *mut c_void,
    /// The command (CDB); read by the kernel.
    pub cmdp: *mut u8,
    /// Where the sense data goes; written by the kernel.
    pub sbp: *mut u8,
    /// How long the command may take, in milliseconds (`u32::MAX`: no timeout).
    pub timeout: u32,
    /// `SG_FLAG_*` bits (0: the defaults).
    pub flags: u32,
    /// Unused by `SG_IO`.
    pub pack_id: i32,
    /// Unused by `SG_IO`.
    pub usr_ptr: *mut c_void,
    /// Out: the SAM status byte (0 GOOD, 2 CHECK CONDITION, 8 BUSY...).
    pub status: u8,
    /// Out: `status` shifted right by one and masked (the old SCSI-2 encoding).
    pub masked_status: u8,
    /// Out: message-level data (unused by most transports).
    pub msg_status: u8,
    /// Out: how many bytes of sense data the kernel wrote at `sbp`.
    pub sb_len_wr: u8,
    /// Out: the host adapter's (transport's) error (0 `DID_OK`).
    pub host_status: u16,
    /// Out: the driver's status (8 `DRIVER_SENSE` with a CHECK CONDITION).
    pub driver_status: u16,
    /// Out: `dxfer_len` minus what was transferred.
    pub resid: i32,
    /// Out: how long the command took, in milliseconds.
    pub duration: u32,
    /// Out: [`SG_INFO_OK_MASK`] bits and the I/O mode.
    pub info: u32,
}

impl sg_io_hdr {
    /// An all-zero header with null pointers.
    pub const fn zeroed() -> Self {
        Self {
            interface_id: 0,
            dxfer_direction: 0,
            cmd_len: 0,
            mx_sb_len: 0,
            iovec_count: 0,
            dxfer_len: 0,
            dxferp: core::ptr::null_mut(),
            cmdp: core::ptr::null_mut(),
            sbp: core::ptr::null_mut(),
            timeout: 0,
            flags: 0,
            pack_id: 0,
            usr_ptr: core::ptr::null_mut(),
            status: 0,
            masked_status: 0,
            msg_status: 0,
            sb_len_wr: 0,
            host_status: 0,
            driver_status: 0,
            resid: 0,
            duration: 0,
            info: 0,
        }
    }
}

impl Default for sg_io_hdr {
    fn default() -> Self {
        Self::zeroed()
    }
}

#[cfg(target_pointer_width = "64")]
const _: () = {
    assert!(size_of::<sg_io_hdr>() == 88);
    assert!(offset_of!(sg_io_hdr, dxfer_direction) == 4);
    assert!(offset_of!(sg_io_hdr, cmd_len) == 8);
    assert!(offset_of!(sg_io_hdr, mx_sb_len) == 9);
    assert!(offset_of!(sg_io_hdr, iovec_count) == 10);
    assert!(offset_of!(sg_io_hdr, dxfer_len) == 12);
    assert!(offset_of!(sg_io_hdr, dxferp) == 16);
    assert!(offset_of!(sg_io_hdr, cmdp) == 24);
    assert!(offset_of!(sg_io_hdr, sbp) == 32);
    assert!(offset_of!(sg_io_hdr, timeout) == 40);
    assert!(offset_of!(sg_io_hdr, flags) == 44);
    assert!(offset_of!(sg_io_hdr, pack_id) == 48);
    assert!(offset_of!(sg_io_hdr, usr_ptr) == 56);
    assert!(offset_of!(sg_io_hdr, status) == 64);
    assert!(offset_of!(sg_io_hdr, masked_status) == 65);
    assert!(offset_of!(sg_io_hdr, msg_status) == 66);
    assert!(offset_of!(sg_io_hdr, sb_len_wr) == 67);
    assert!(offset_of!(sg_io_hdr, host_status) == 68);
    assert!(offset_of!(sg_io_hdr, driver_status) == 70);
    assert!(offset_of!(sg_io_hdr, resid) == 72);
    assert!(offset_of!(sg_io_hdr, duration) == 76);
    assert!(offset_of!(sg_io_hdr, info) == 80);
};

#[cfg(target_pointer_width = "32")]
const _: () = {
    assert!(size_of::<sg_io_hdr>() == 64);
    assert!(offset_of!(sg_io_hdr, dxferp) == 16);
    assert!(offset_of!(sg_io_hdr, cmdp) == 20);
    assert!(offset_of!(sg_io_hdr, sbp) == 24);
    assert!(offset_of!(sg_io_hdr, timeout) == 28);
    assert!(offset_of!(sg_io_hdr, usr_ptr) == 40);
    assert!(offset_of!(sg_io_hdr, status) == 44);
    assert!(offset_of!(sg_io_hdr, sb_len_wr) == 47);
    assert!(offset_of!(sg_io_hdr, host_status) == 48);
    assert!(offset_of!(sg_io_hdr, resid) == 52);
    assert!(offset_of!(sg_io_hdr, info) == 60);
};

/// `SG_IO`: send one command and wait for it (`0x2285`, the same on every architecture).
pub const SG_IO: u32 = 0x2285;

/// `interface_id` of the version 3 interface: `'S'`.
pub const SG_INTERFACE_ID_ORIG: i32 = b'S' as i32;

/// `dxfer_direction`: the command moves no data (TEST UNIT READY).
pub const SG_DXFER_NONE: i32 = -1;
/// `dxfer_direction`: data goes to the device (WRITE).
pub const SG_DXFER_TO_DEV: i32 = -2;
/// `dxfer_direction`: data comes from the device (READ, INQUIRY).
pub const SG_DXFER_FROM_DEV: i32 = -3;

/// The bit of `info` that says whether anything was abnormal (sense, host or driver status).
pub const SG_INFO_OK_MASK: u32 = 0x1;
/// `info & SG_INFO_OK_MASK`: nothing abnormal.
pub const SG_INFO_OK: u32 = 0x0;
/// `info & SG_INFO_OK_MASK`: something abnormal happened; look at the status fields.
pub const SG_INFO_CHECK: u32 = 0x1;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeroed_is_the_default_and_has_null_pointers() {
        let h = sg_io_hdr::default();
        assert_eq!(h, sg_io_hdr::zeroed());
        assert!(h.cmdp.is_null() && h.sbp.is_null() && h.dxferp.is_null());
        assert_eq!(SG_INTERFACE_ID_ORIG, 0x53);
    }
}

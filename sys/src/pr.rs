//! Persistent reservations: `<linux/pr.h>`'s `IOC_PR_*` ioctls (type `'p'`), issued on an
//! open SCSI disk, NVMe namespace or device-mapper map (which forwards them to its paths).
//!
//! Each ioctl takes a pointer to one of the structs below, which the kernel only reads
//! (`_IOW`). The call returns 0 on success, a negative errno, or a **positive** status from
//! the device: on Linux 6.1 the SCSI midlayer's result word (the SAM status in the low byte,
//! the host byte in bits 16-23), from 6.3 on one of the `PR_STS_*` values below, which were
//! chosen to decode the same way (`PR_STS_RESERVATION_CONFLICT` is the SAM status 0x18).
//!
//! The kernel has no ioctl to read keys or the reservation back; SCSI's PERSISTENT RESERVE
//! IN through `SG_IO` does ([`crate::sg`]).

use core::mem::offset_of;

use crate::ioctl::iow;

/// `enum pr_type` [`PR_WRITE_EXCLUSIVE`]: only the holder writes, everyone reads.
pub const PR_WRITE_EXCLUSIVE: u32 = 1;
/// `enum pr_type` [`PR_EXCLUSIVE_ACCESS`]: only the holder reads or writes.
pub const PR_EXCLUSIVE_ACCESS: u32 = 2;
/// `enum pr_type`: every registrant writes while one of them holds it.
pub const PR_WRITE_EXCLUSIVE_REG_ONLY: u32 = 3;
/// `enum pr_type`: every registrant reads and writes while one of them holds it.
pub const PR_EXCLUSIVE_ACCESS_REG_ONLY: u32 = 4;
/// `enum pr_type`: every registrant writes and holds it, until the last one goes.
pub const PR_WRITE_EXCLUSIVE_ALL_REGS: u32 = 5;
/// `enum pr_type`: every registrant reads, writes and holds it.
pub const PR_EXCLUSIVE_ACCESS_ALL_REGS: u32 = 6;

/// `PR_FL_IGNORE_KEY`: register whatever key this initiator had (REGISTER AND IGNORE
/// EXISTING KEY); the only flag the kernel accepts (`EOPNOTSUPP` for any other bit).
pub const PR_FL_IGNORE_KEY: u32 = 1 << 0;

/// `PR_STS_IOERR` (6.3+): the device failed the command (a SCSI CHECK CONDITION).
pub const PR_STS_IOERR: u32 = 0x2;
/// `PR_STS_RESERVATION_CONFLICT` (6.3+), the SAM status RESERVATION CONFLICT on 6.1 too.
pub const PR_STS_RESERVATION_CONFLICT: u32 = 0x18;
/// `PR_STS_RETRY_PATH_FAILURE` (6.3+): the host byte `DID_TRANSPORT_DISRUPTED` (0x0e).
pub const PR_STS_RETRY_PATH_FAILURE: u32 = 0xe0000;
/// `PR_STS_PATH_FAST_FAILED` (6.3+): the host byte `DID_TRANSPORT_FAILFAST` (0x0f).
pub const PR_STS_PATH_FAST_FAILED: u32 = 0xf0000;
/// `PR_STS_PATH_FAILED` (6.3+): the host byte `DID_NO_CONNECT` (0x01).
pub const PR_STS_PATH_FAILED: u32 = 0x10000;

/// `struct pr_registration`: `IOC_PR_REGISTER`'s argument.
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct pr_registration {
    /// The key registered now (0 when none, or ignored with [`PR_FL_IGNORE_KEY`]).
    pub old_key: u64,
    /// The key to register; 0 unregisters.
    pub new_key: u64,
    /// [`PR_FL_IGNORE_KEY`] or 0.
    pub flags: u32,
    /// Padding.
    pub __pad: u32,
}

/// `struct pr_reservation`: `IOC_PR_RESERVE`'s and `IOC_PR_RELEASE`'s argument.
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct pr_reservation {
    /// This initiator's registered key.
    pub key: u64,
    /// A `PR_*` reservation type (1 to 6).
    pub type_: u32,
    /// 0 (the kernel refuses any other flag with `EOPNOTSUPP`).
    pub flags: u32,
}

/// `struct pr_preempt`: `IOC_PR_PREEMPT`'s and `IOC_PR_PREEMPT_ABORT`'s argument.
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct pr_preempt {
    /// This initiator's registered key.
    pub old_key: u64,
    /// The key to preempt (its registrations go, and its reservation with them).
    pub new_key: u64,
    /// The type of the reservation this initiator takes.
    pub type_: u32,
    /// 0.
    pub flags: u32,
}

/// `struct pr_clear`: `IOC_PR_CLEAR`'s argument.
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct pr_clear {
    /// This initiator's registered key.
    pub key: u64,
    /// 0.
    pub flags: u32,
    /// Padding.
    pub __pad: u32,
}

const _: () = {
    assert!(size_of::<pr_registration>() == 24);
    assert!(offset_of!(pr_registration, new_key) == 8);
    assert!(offset_of!(pr_registration, flags) == 16);
    assert!(size_of::<pr_reservation>() == 16);
    assert!(offset_of!(pr_reservation, type_) == 8);
    assert!(offset_of!(pr_reservation, flags) == 12);
    assert!(size_of::<pr_preempt>() == 24);
    assert!(offset_of!(pr_preempt, type_) == 16);
    assert!(offset_of!(pr_preempt, flags) == 20);
    assert!(size_of::<pr_clear>() == 16);
    assert!(offset_of!(pr_clear, flags) == 8);
};

/// The ioctl type of the `IOC_PR_*` requests.
const PR_IOC_TYPE: u32 = b'p' as u32;

/// `IOC_PR_REGISTER`: `_IOW('p', 200, struct pr_registration)`.
pub const IOC_PR_REGISTER: u32 = iow(PR_IOC_TYPE, 200, size_of::<pr_registration>());
/// `IOC_PR_RESERVE`: `_IOW('p', 201, struct pr_reservation)`.
pub const IOC_PR_RESERVE: u32 = iow(PR_IOC_TYPE, 201, size_of::<pr_reservation>());
/// `IOC_PR_RELEASE`: `_IOW('p', 202, struct pr_reservation)`.
pub const IOC_PR_RELEASE: u32 = iow(PR_IOC_TYPE, 202, size_of::<pr_reservation>());
/// `IOC_PR_PREEMPT`: `_IOW('p', 203, struct pr_preempt)`.
pub const IOC_PR_PREEMPT: u32 = iow(PR_IOC_TYPE, 203, size_of::<pr_preempt>());
/// `IOC_PR_PREEMPT_ABORT`: `_IOW('p', 204, struct pr_preempt)`: preempt, and abort the
/// preempted initiators' commands in flight.
pub const IOC_PR_PREEMPT_ABORT: u32 = iow(PR_IOC_TYPE, 204, size_of::<pr_preempt>());
/// `IOC_PR_CLEAR`: `_IOW('p', 205, struct pr_clear)`: drop every registration and the
/// reservation.
pub const IOC_PR_CLEAR: u32 = iow(PR_IOC_TYPE, 205, size_of::<pr_clear>());

#[cfg(all(target_arch = "x86_64", target_pointer_width = "64"))]
mod x86_64_values {
    use super::*;
    // <linux/pr.h> on x86_64.
    const _: () = assert!(IOC_PR_REGISTER == 0x4018_70c8);
    const _: () = assert!(IOC_PR_RESERVE == 0x4010_70c9);
    const _: () = assert!(IOC_PR_RELEASE == 0x4010_70ca);
    const _: () = assert!(IOC_PR_PREEMPT == 0x4018_70cb);
    const _: () = assert!(IOC_PR_PREEMPT_ABORT == 0x4018_70cc);
    const _: () = assert!(IOC_PR_CLEAR == 0x4010_70cd);
}

//! SCSI-3 persistent reservations: one writer per volume across nodes, enforced by the array.
//!
//! A node registers its [`Key`] on every path (I_T nexus) of a volume, then one path takes a
//! reservation of a [`ReservationType`]; the array then refuses writes (or reads and writes)
//! from initiators the type leaves out, with the SAM status RESERVATION CONFLICT. A node that
//! takes a volume over preempts the other key ([`preempt_abort`]): the array drops its
//! registrations, aborts its commands in flight, and refuses whatever it sends next.
//!
//! ## The kernel interface
//!
//! - Out: the block layer's `IOC_PR_*` ioctls (`<linux/pr.h>`, [`lunkit_sys::pr`]) on a SCSI
//!   disk, an NVMe namespace or a device-mapper map; a multipath map forwards a register to
//!   every path and the other requests to one ([`register`], [`reserve`], [`release`],
//!   [`preempt`], [`preempt_abort`], [`clear`], [`unregister`]).
//! - In: there is no ioctl to read keys or the reservation back (6.1, 6.12), so they are read
//!   with SCSI's PERSISTENT RESERVE IN through `SG_IO` ([`read_keys`], [`read_reservation`],
//!   and their pure parsers [`ReadKeys::parse`], [`ReadReservation::parse`]); [`show`] reads
//!   both from every path of a map, and [`unregistered_paths`] finds the paths whose I_T
//!   nexus does not carry a key (a path that came after the registration).
//!
//! Every call opens the device read-only (no udev `change` event on close) on a helper thread
//! bounded by the caller's deadline, as [`crate::block::read_ends`] does. They need
//! `CAP_SYS_ADMIN` (the `IOC_PR_*` ioctls) and `CAP_SYS_RAWIO` (PERSISTENT RESERVE IN is not
//! on the kernel's list of commands a reader may send).
//!
//! ## How the kernel reports a refusal
//!
//! An `IOC_PR_*` ioctl returns a negative errno for its own refusals (`EPERM` without the
//! capability, or on a partition in newer kernels; `EOPNOTSUPP` where the driver has no reservation
//! support or for an unknown flag) and a **positive** value for the device's: on 6.1
//! `sd_pr_command` returns the SCSI midlayer's result word (the SAM status in the low byte,
//! the host byte above: RESERVATION CONFLICT is `DID_NEXUS_FAILURE << 16 | 0x18`, since the
//! error handler sets that host byte on a conflict); from 6.3 `sd_pr_out_command` maps it to
//! a `PR_STS_*` value (`PR_STS_RESERVATION_CONFLICT` is 0x18, the path failures are the
//! matching host bytes). device-mapper (`dm_pr_*`) returns its path's value unchanged. So
//! [`Status::from_ioctl`] reads the low byte as the status and bits 16-23 as the host byte
//! on either kernel, and a conflict becomes [`Error::ReservationConflict`]
//! ([`crate::ErrorKind::ReservationConflict`]), with the holder's key read back where it can.
#![forbid(unsafe_code)]

mod key;
mod out;
mod parse;
mod read;
mod show;

pub use key::Key;
pub use out::{
    Request, clear, preempt, preempt_abort, register, register_ignore, release, request, reserve,
    unregister,
};
pub use parse::{Holder, ParseError, ReadKeys, ReadReservation, Status};
pub use read::{read_keys, read_reservation};
pub use show::{PathState, Unregistered, show, unregistered_paths};

use crate::error::{Error, Result};

/// How long one persistent-reservation command may take in the device, at most (less when
/// the caller's deadline is nearer).
pub const PR_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The six reservation types of SPC-3 (PERSISTENT RESERVE OUT's TYPE field), each mapped to
/// `<linux/pr.h>`'s `enum pr_type` ([`pr_type`](Self::pr_type)) and to SPC's code
/// ([`spc_code`](Self::spc_code)), which READ RESERVATION reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReservationType {
    /// Only the holder writes; everyone reads. `PR_WRITE_EXCLUSIVE`, SPC 1.
    WriteExclusive,
    /// Only the holder reads or writes. `PR_EXCLUSIVE_ACCESS`, SPC 3.
    ExclusiveAccess,
    /// Every registrant writes; the holder is one registrant, and when its key is preempted
    /// every other key's writes are refused. `PR_WRITE_EXCLUSIVE_REG_ONLY`, SPC 5: a
    /// single-node volume's fence.
    WriteExclusiveRegistrantsOnly,
    /// Every registrant reads and writes. `PR_EXCLUSIVE_ACCESS_REG_ONLY`, SPC 6.
    ExclusiveAccessRegistrantsOnly,
    /// Every registrant writes and is a holder, until the last one goes.
    /// `PR_WRITE_EXCLUSIVE_ALL_REGS`, SPC 7: a multi-node volume's.
    WriteExclusiveAllRegistrants,
    /// Every registrant reads, writes and is a holder. `PR_EXCLUSIVE_ACCESS_ALL_REGS`, SPC 8.
    ExclusiveAccessAllRegistrants,
}

impl ReservationType {
    /// Every type, in `pr_type` order.
    pub const ALL: [ReservationType; 6] = [
        ReservationType::WriteExclusive,
        ReservationType::ExclusiveAccess,
        ReservationType::WriteExclusiveRegistrantsOnly,
        ReservationType::ExclusiveAccessRegistrantsOnly,
        ReservationType::WriteExclusiveAllRegistrants,
        ReservationType::ExclusiveAccessAllRegistrants,
    ];

    /// `<linux/pr.h>`'s `enum pr_type` value, what the `IOC_PR_*` ioctls take (1 to 6).
    pub fn pr_type(self) -> u32 {
        use lunkit_sys::pr::*;
        match self {
            ReservationType::WriteExclusive => PR_WRITE_EXCLUSIVE,
            ReservationType::ExclusiveAccess => PR_EXCLUSIVE_ACCESS,
            ReservationType::WriteExclusiveRegistrantsOnly => PR_WRITE_EXCLUSIVE_REG_ONLY,
            ReservationType::ExclusiveAccessRegistrantsOnly => PR_EXCLUSIVE_ACCESS_REG_ONLY,
            ReservationType::WriteExclusiveAllRegistrants => PR_WRITE_EXCLUSIVE_ALL_REGS,
            ReservationType::ExclusiveAccessAllRegistrants => PR_EXCLUSIVE_ACCESS_ALL_REGS,
        }
    }

    /// SPC's TYPE code (SPC-4 table 212), what READ RESERVATION reports: 1, 3, 5, 6, 7, 8.
    pub fn spc_code(self) -> u8 {
        match self {
            ReservationType::WriteExclusive => 1,
            ReservationType::ExclusiveAccess => 3,
            ReservationType::WriteExclusiveRegistrantsOnly => 5,
            ReservationType::ExclusiveAccessRegistrantsOnly => 6,
            ReservationType::WriteExclusiveAllRegistrants => 7,
            ReservationType::ExclusiveAccessAllRegistrants => 8,
        }
    }

    /// The type of SPC's TYPE code `code`; `None` for an obsolete or reserved one.
    pub fn from_spc_code(code: u8) -> Option<ReservationType> {
        Self::ALL.into_iter().find(|t| t.spc_code() == code)
    }

    /// The type of `<linux/pr.h>`'s `pr_type` value; `None` outside 1 to 6.
    pub fn from_pr_type(value: u32) -> Option<ReservationType> {
        Self::ALL.into_iter().find(|t| t.pr_type() == value)
    }

    /// Its name as the CLI and JSON spell it: `write-exclusive-registrants-only`...
    pub fn as_str(self) -> &'static str {
        match self {
            ReservationType::WriteExclusive => "write-exclusive",
            ReservationType::ExclusiveAccess => "exclusive-access",
            ReservationType::WriteExclusiveRegistrantsOnly => "write-exclusive-registrants-only",
            ReservationType::ExclusiveAccessRegistrantsOnly => "exclusive-access-registrants-only",
            ReservationType::WriteExclusiveAllRegistrants => "write-exclusive-all-registrants",
            ReservationType::ExclusiveAccessAllRegistrants => "exclusive-access-all-registrants",
        }
    }

    /// Its short name: `we`, `ea`, `we-ro`, `ea-ro`, `we-ar`, `ea-ar`.
    pub fn short(self) -> &'static str {
        ["we", "ea", "we-ro", "ea-ro", "we-ar", "ea-ar"][self.pr_type() as usize - 1]
    }
}

impl std::fmt::Display for ReservationType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for ReservationType {
    type Err = Error;

    /// Its [name](Self::as_str) or [short name](Self::short), in any case.
    fn from_str(s: &str) -> Result<Self> {
        let lower = s.to_ascii_lowercase();
        Self::ALL
            .into_iter()
            .find(|t| t.as_str() == lower || t.short() == lower)
            .ok_or_else(|| {
                Error::invalid(
                    "reservation type",
                    s,
                    "is none of we, ea, we-ro, ea-ro, we-ar, ea-ar (or their long names, \
                     write-exclusive-registrants-only...)",
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_map_to_pr_h_and_to_spc() {
        let spc: Vec<u8> = ReservationType::ALL.iter().map(|t| t.spc_code()).collect();
        assert_eq!(spc, [1, 3, 5, 6, 7, 8]);
        let pr: Vec<u32> = ReservationType::ALL.iter().map(|t| t.pr_type()).collect();
        assert_eq!(pr, [1, 2, 3, 4, 5, 6]);
        for t in ReservationType::ALL {
            assert_eq!(ReservationType::from_spc_code(t.spc_code()), Some(t));
            assert_eq!(ReservationType::from_pr_type(t.pr_type()), Some(t));
            assert_eq!(t.as_str().parse::<ReservationType>().unwrap(), t);
            assert_eq!(
                t.short().to_uppercase().parse::<ReservationType>().unwrap(),
                t
            );
        }
        // SPC's obsolete and reserved codes are no type; nor is pr_type 0 or 7.
        for code in [0u8, 2, 4, 9, 15] {
            assert_eq!(ReservationType::from_spc_code(code), None, "{code}");
        }
        assert_eq!(ReservationType::from_pr_type(0), None);
        assert_eq!(ReservationType::from_pr_type(7), None);
        let e = "wero".parse::<ReservationType>().unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Invalid);
    }
}

//! The identifiers lunkit names things by: a SCSI address ([`Hctl`]), a volume's identity
//! ([`Wwid`]), an FC port ([`Wwn`]), an NVMe subsystem or host ([`Nqn`], [`Uuid`]), an NVMe
//! namespace ([`Nguid`], [`Eui64`]), a device number ([`DevNum`]), a sysfs object ([`ObjectId`]) and the uuid format of multipath maps
//! ([`mpath`]). Each parses strictly (a typed [`crate::Error::Invalid`] for
//! anything else) and prints the way the kernel writes it.

mod devnum;
mod eui64;
mod hctl;
pub mod mpath;
mod nguid;
mod nqn;
mod wwid;
mod wwn;

pub use crate::sysfs::ObjectId;
pub use devnum::DevNum;
pub use eui64::Eui64;
pub use hctl::Hctl;
pub use nguid::Nguid;
pub use nqn::{MAX_NQN_LEN, Nqn, Uuid};
pub use wwid::Wwid;
pub use wwn::Wwn;

use std::str::FromStr;

/// Parses a non-empty string of ASCII digits; `u32::from_str` alone would accept a leading `+`.
/// Every number lunkit reads from a name, an address or the kernel goes through it.
pub(crate) fn decimal<T: FromStr>(s: &str) -> Option<T> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

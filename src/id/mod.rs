//! The identifiers lunkit names things by: a SCSI address ([`Hctl`]), a volume's identity
//! ([`Wwid`]), an FC port ([`Wwn`]), an NVMe subsystem or host ([`Nqn`], [`Uuid`]), an NVMe
//! namespace ([`Nguid`], [`Eui64`]), a device number ([`DevNum`]), a sysfs object ([`ObjectId`]) and the uuid format of multipath maps
//! ([`mpath`]). Each parses strictly (a typed [`crate::Error::Invalid`] for
//! anything else) and prints the way the kernel writes it.

mod devnum;
mod eui64;
mod hctl;
mod iscsi_name;
pub mod mpath;
mod nguid;
mod nqn;
mod wwid;
mod wwn;

pub use crate::sysfs::ObjectId;
pub use devnum::DevNum;
pub use eui64::Eui64;
pub use hctl::Hctl;
pub use iscsi_name::IscsiName;
pub use nguid::Nguid;
pub use nqn::{MAX_NQN_LEN, Nqn, Uuid};
pub use wwid::Wwid;
pub use wwn::Wwn;

use std::str::FromStr;

/// The `N` bytes that exactly `2N` hex digits (either case) spell, or `None`. Every
/// identifier lunkit reads in hex (NGUID, EUI-64, UUID) goes through it once its separators
/// are gone.
pub(crate) fn hex_bytes<const N: usize>(digits: &[u8]) -> Option<[u8; N]> {
    if digits.len() != 2 * N {
        return None;
    }
    let mut out = [0u8; N];
    for (o, pair) in out.iter_mut().zip(digits.chunks_exact(2)) {
        let hi = char::from(pair[0]).to_digit(16)?;
        let lo = char::from(pair[1]).to_digit(16)?;
        // Two hex digits: at most 255.
        *o = u8::try_from(hi * 16 + lo).ok()?;
    }
    Some(out)
}

/// Parses a non-empty string of ASCII digits; `u32::from_str` alone would accept a leading `+`.
/// Every number lunkit reads from a name, an address or the kernel goes through it.
pub(crate) fn decimal<T: FromStr>(s: &str) -> Option<T> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

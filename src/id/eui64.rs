//! [`Eui64`]: an NVMe namespace's IEEE Extended Unique Identifier.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// An NVMe namespace's EUI-64: 8 bytes the controller reports for a namespace (Identify
/// Namespace, `EUI64`), the same through every controller of the subsystem. A namespace may
/// report it beside, or instead of, an NGUID and a UUID.
///
/// It is written three ways, and all three parse:
/// - 16 hex digits, as `nvme id-ns` prints it;
/// - the kernel's sysfs form, `eui` of a namespace (`%8ph`): 8 two-digit hex bytes separated
///   by single spaces;
/// - the kernel's `wwid` form, `eui.` and 16 hex digits (what `wwid` is when a namespace
///   reports an EUI-64 and neither a UUID nor an NGUID).
///
/// Hex digits may be of either case. It prints as 16 lower-case hex digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Eui64([u8; 8]);

impl Eui64 {
    /// The 8 bytes, in the order the controller reports them.
    pub fn bytes(&self) -> [u8; 8] {
        self.0
    }
}

impl fmt::Display for Eui64 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl FromStr for Eui64 {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        const KIND: &str = "EUI-64";
        const FORMS: &str = "expected 16 hex digits, the sysfs form of 8 space-separated hex \
                             bytes or eui. and 16 hex digits";
        let body = s.strip_prefix("eui.").unwrap_or(s);
        let b = body.as_bytes();
        // The sysfs form: a space after every byte but the last, and nowhere else.
        let digits: Vec<u8> = if b.len() == 23 && body.len() == s.len() {
            if (2..23).step_by(3).any(|i| b[i] != b' ') {
                return Err(Error::invalid(KIND, s, FORMS));
            }
            b.iter().copied().filter(|&c| c != b' ').collect()
        } else {
            b.to_vec()
        };
        if digits.len() != 16 {
            return Err(Error::invalid(KIND, s, FORMS));
        }
        super::hex_bytes(&digits)
            .map(Eui64)
            .ok_or_else(|| Error::invalid(KIND, s, "contains a character that is not a hex digit"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_three_written_forms_are_one_eui64() {
        let plain: Eui64 = "0025385B71B0E7A1".parse().unwrap();
        let sysfs: Eui64 = "00 25 38 5b 71 b0 e7 a1".parse().unwrap();
        let wwid: Eui64 = "eui.0025385b71b0e7a1".parse().unwrap();
        assert_eq!(plain, sysfs);
        assert_eq!(plain, wwid);
        assert_eq!(plain.to_string(), "0025385b71b0e7a1");
        assert_eq!(plain.bytes()[2], 0x38);
        assert_eq!(plain.to_string().parse::<Eui64>().unwrap(), plain);
    }

    #[test]
    fn anything_else_is_refused_with_a_typed_error() {
        for s in [
            "",
            "0025",
            "0025385b71b0e7a100",
            "0025385b71b0e7ag",
            "00 25 38 5b 71 b0 e7a1 ",
            "00-25-38-5b-71-b0-e7-a1",
            "eui.00 25 38 5b 71 b0 e7 a1",
            // An NGUID is not an EUI-64.
            "eui.0025385b71b0e7a10025385b71b0e7a1",
            "+025385b71b0e7a1",
            "0025385b71b0e7\u{e9}",
        ] {
            let e = s.parse::<Eui64>().unwrap_err();
            assert_eq!(e.kind(), crate::ErrorKind::Invalid, "{s:?}");
        }
    }
}

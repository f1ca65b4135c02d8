//! [`Nguid`]: an NVMe namespace's globally unique identifier.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// An NVMe Namespace Globally Unique Identifier: 16 bytes the controller reports for a
/// namespace (Identify Namespace, `NGUID`), the same through every controller of the
/// subsystem and never reused for another namespace.
///
/// It is written three ways, and all three parse:
/// - 32 hex digits, as `nvme id-ns` and arrays' consoles print it;
/// - the kernel's sysfs form, `nguid` of a namespace (`%pU`): 8-4-4-4-12 hex digits;
/// - the kernel's `wwid` form, `eui.` and 32 hex digits (what `wwid` is when a namespace
///   reports an NGUID).
///
/// Hex digits may be of either case. It prints as 32 lower-case hex digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Nguid([u8; 16]);

impl Nguid {
    /// The 16 bytes, in the order the controller reports them.
    pub fn bytes(&self) -> [u8; 16] {
        self.0
    }
}

impl fmt::Display for Nguid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl FromStr for Nguid {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        const KIND: &str = "NGUID";
        const FORMS: &str = "expected 32 hex digits, the sysfs form 8-4-4-4-12 or eui. and 32 \
                             hex digits";
        let body = s.strip_prefix("eui.").unwrap_or(s);
        let b = body.as_bytes();
        let digits: Vec<u8> = if b.len() == 36 {
            if [8, 13, 18, 23].iter().any(|&i| b[i] != b'-') || body.len() != s.len() {
                return Err(Error::invalid(KIND, s, FORMS));
            }
            b.iter().copied().filter(|&c| c != b'-').collect()
        } else {
            b.to_vec()
        };
        if digits.len() != 32 {
            return Err(Error::invalid(KIND, s, FORMS));
        }
        super::hex_bytes(&digits)
            .map(Nguid)
            .ok_or_else(|| Error::invalid(KIND, s, "contains a character that is not a hex digit"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_three_written_forms_are_one_nguid() {
        let plain: Nguid = "5e7a6e670000000000000000000000AB".parse().unwrap();
        let sysfs: Nguid = "5e7a6e67-0000-0000-0000-0000000000ab".parse().unwrap();
        let wwid: Nguid = "eui.5e7a6e670000000000000000000000ab".parse().unwrap();
        assert_eq!(plain, sysfs);
        assert_eq!(plain, wwid);
        assert_eq!(plain.to_string(), "5e7a6e670000000000000000000000ab");
        assert_eq!(plain.bytes()[0], 0x5e);
        assert_eq!(plain.bytes()[15], 0xab);
        assert_eq!(plain.to_string().parse::<Nguid>().unwrap(), plain);
    }

    #[test]
    fn anything_else_is_refused_with_a_typed_error() {
        for s in [
            "",
            "5e7a",
            "5e7a6e670000000000000000000000ab00",
            "5e7a6e670000000000000000000000ag",
            "5e7a6e67-0000-0000-0000_0000000000ab",
            "eui.5e7a6e67-0000-0000-0000-0000000000ab",
            "uuid.5e7a6e67-0000-0000-0000-0000000000ab",
            "+e7a6e670000000000000000000000ab",
            "5e7a6e670000000000000000000000a\u{e9}",
            "5e7a6e670000000000000000000000ab\n",
        ] {
            let e = s.parse::<Nguid>().unwrap_err();
            assert_eq!(e.kind(), crate::ErrorKind::Invalid, "{s:?}");
        }
    }
}

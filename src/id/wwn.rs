//! Fibre Channel world wide names (port and node names).

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// A 64-bit FC world wide name, such as a WWPN.
///
/// Displayed the way sysfs writes it (`0x%016llx`); parsed from that form, from bare hex, and
/// from the colon- or dash-separated forms people paste from switch consoles
/// (`50:01:43:80:02:a3:c4:d6`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Wwn(pub u64);

impl fmt::Display for Wwn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "0x{:016x}", self.0)
    }
}

impl FromStr for Wwn {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        const KIND: &str = "WWN";
        let body = s
            .strip_prefix("0x")
            .or_else(|| s.strip_prefix("0X"))
            .unwrap_or(s);
        let sep = body.contains(':') || body.contains('-');
        let hex: String = body.chars().filter(|c| *c != ':' && *c != '-').collect();
        if sep && body.split([':', '-']).any(|g| g.len() != 2) {
            return Err(Error::invalid(
                KIND,
                s,
                "separated form needs 8 groups of 2 hex digits",
            ));
        }
        if hex.len() != 16 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(Error::invalid(KIND, s, "expected 16 hex digits"));
        }
        u64::from_str_radix(&hex, 16)
            .map(Wwn)
            .map_err(|_| Error::invalid(KIND, s, "expected 16 hex digits"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_common_forms() {
        let w = Wwn(0x5001_4380_02a3_c4d6);
        for s in [
            "0x5001438002a3c4d6",
            "5001438002a3c4d6",
            "50:01:43:80:02:a3:c4:d6",
            "50-01-43-80-02-A3-C4-D6",
        ] {
            assert_eq!(s.parse::<Wwn>().unwrap(), w, "{s}");
        }
        assert_eq!(w.to_string(), "0x5001438002a3c4d6");
        assert_eq!(Wwn(1).to_string().parse::<Wwn>().unwrap(), Wwn(1));
    }

    #[test]
    fn rejects_malformed() {
        for bad in [
            "",
            "0x",
            "0x1234",
            "0x5001438002a3c4d6ff",
            "g001438002a3c4d6",
            "5001:4380:02a3:c4d6",
            "+0014380002a3c4d6",
        ] {
            assert!(bad.parse::<Wwn>().is_err(), "{bad}");
        }
    }
}

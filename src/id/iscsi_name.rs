//! iSCSI names (RFC 3720 3.2.6, RFC 3980): the names of iSCSI targets and initiators.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// Every form an iSCSI name may take, said in each refusal.
const FORMS: &str = "expected iqn.yyyy-mm.<reverse domain name>[:<name>], eui.<16 hex digits> \
                     or naa.<16 or 32 hex digits>";

/// An iSCSI name, as an NVMe subsystem's is an [`Nqn`](super::Nqn): `iqn.2003-01.org.example:array`,
/// `eui.02004567a425678d` or `naa.52004567ba64678d`.
///
/// Parsing is strict, so that a typo is refused where it is typed rather than matching no
/// session: one of the three forms, at most 223 bytes of printable ASCII with no space or `/`
/// (the name is compared with sysfs's `targetname` and ends up in paths and messages). It is
/// kept as written: sessions are matched by the text the target gave.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct IscsiName(String);

impl IscsiName {
    /// The name as written.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for IscsiName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for IscsiName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl FromStr for IscsiName {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        const KIND: &str = "iSCSI name";
        let hex = |h: &str, lens: &[usize]| {
            lens.contains(&h.len()) && h.bytes().all(|b| b.is_ascii_hexdigit())
        };
        // iqn.yyyy-mm. and a naming authority, checked on bytes (no slice of a character).
        let iqn = s.strip_prefix("iqn.").is_some_and(|rest| {
            let b = rest.as_bytes();
            b.len() > 8
                && b[..4].iter().all(u8::is_ascii_digit)
                && b[4] == b'-'
                && b[5..7].iter().all(u8::is_ascii_digit)
                && (1..=12).contains(&((b[5] - b'0') * 10 + (b[6] - b'0')))
                && b[7] == b'.'
        });
        let ok = iqn
            || s.strip_prefix("eui.").is_some_and(|h| hex(h, &[16]))
            || s.strip_prefix("naa.").is_some_and(|h| hex(h, &[16, 32]));
        if !ok {
            return Err(Error::invalid(KIND, s, FORMS));
        }
        crate::iscsi::check_target_name(s)?;
        Ok(IscsiName(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_three_forms_parse_and_anything_else_is_refused() {
        for ok in [
            "iqn.2003-01.org.linux-iscsi.lunkit:lab",
            "iqn.1992-08.com.netapp:sn.1234",
            "eui.02004567A425678D",
            "naa.52004567ba64678d",
            "naa.60014055e7a100000000000000000000",
        ] {
            let n: IscsiName = ok.parse().unwrap();
            assert_eq!(n.as_str(), ok);
            assert_eq!(n.to_string(), ok);
        }
        for bad in [
            "",
            "foo",
            "iqn.",
            "iqn.2003-13.org.x",
            "iqn.03-01.org.x",
            "iqn.2003-01.org.x with space",
            "iqn.2003-01.org/x",
            "iqné.2003-01.org.x",
            "eui.0200",
            "naa.5200456",
            "nqn.2014-08.org.nvmexpress.discovery",
        ] {
            let e = bad.parse::<IscsiName>().unwrap_err();
            assert_eq!(e.kind(), crate::ErrorKind::Invalid, "{bad}");
        }
        let long = format!("iqn.2003-01.org.x:{}", "a".repeat(220));
        assert!(long.parse::<IscsiName>().is_err());
    }
}

//! NVMe Qualified Names: the names of NVMe subsystems and hosts.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// The longest NQN, in bytes (`NVMF_NQN_SIZE` is 223 plus the NUL).
pub const MAX_NQN_LEN: usize = 223;

/// An NVMe Qualified Name (NVMe Base Specification, "NVMe Qualified Names"): a subsystem's
/// or a host's name, such as `nqn.2014-08.org.nvmexpress:uuid:1b4e28ba-2fa1-11d2-883f-b9a761bde3fb`
/// or `nqn.2016-06.io.spdk:cnode1`.
///
/// Parsing is strict, because an NQN ends up in the option string written to
/// `/dev/nvme-fabrics` (`nqn=…,hostnqn=…`), where a `,` or `=` would smuggle in an option of
/// its own (`nqn=x,traddr=1.2.3.4`): an NQN is at most 223 bytes of UTF-8 with no control
/// character, white space, `,`, `=` or `/`, and has the form `nqn.yyyy-mm.<reverse domain>…`
/// (the discovery NQN, `nqn.2014-08.org.nvmexpress.discovery`, has that form too).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Nqn(String);

impl Nqn {
    /// The name as written.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Nqn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for Nqn {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        const KIND: &str = "NQN";
        if s.is_empty() || s.len() > MAX_NQN_LEN {
            return Err(Error::invalid(KIND, s, "must be 1 to 223 bytes"));
        }
        if s.chars()
            .any(|c| c.is_control() || c.is_whitespace() || matches!(c, ',' | '=' | '/'))
        {
            return Err(Error::invalid(
                KIND,
                s,
                "contains a control character, white space, ',', '=' or '/'",
            ));
        }
        // nqn.yyyy-mm.<reverse domain name>, checked on bytes: a multi-byte character
        // anywhere must not make a slice boundary panic.
        let ok = s.strip_prefix("nqn.").is_some_and(|rest| {
            let b = rest.as_bytes();
            let digits = |r: std::ops::Range<usize>| b[r].iter().all(u8::is_ascii_digit);
            b.len() > 8
                && digits(0..4)
                && b[4] == b'-'
                && digits(5..7)
                && (1..=12).contains(&((b[5] - b'0') * 10 + (b[6] - b'0')))
                && b[7] == b'.'
        });
        if !ok {
            return Err(Error::invalid(
                KIND,
                s,
                "expected nqn.yyyy-mm.<reverse domain name>[:<name>]",
            ));
        }
        Ok(Nqn(s.to_owned()))
    }
}

/// A host identifier as Linux writes it: a UUID in its 36-character text form (the
/// `hostid=` option, `/etc/nvme/hostid`, a controller's `hostid` attribute). Kept lower-case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Uuid([u8; 16]);

impl Uuid {
    /// The UUID of these 16 bytes.
    pub const fn from_bytes(bytes: [u8; 16]) -> Uuid {
        Uuid(bytes)
    }

    /// The 16 bytes.
    pub fn bytes(&self) -> [u8; 16] {
        self.0
    }
}

impl fmt::Display for Uuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, b) in self.0.iter().enumerate() {
            if matches!(i, 4 | 6 | 8 | 10) {
                f.write_str("-")?;
            }
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl FromStr for Uuid {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        const KIND: &str = "UUID";
        let b = s.as_bytes();
        let dashes = [8, 13, 18, 23];
        if b.len() != 36 || dashes.iter().any(|&i| b[i] != b'-') {
            return Err(Error::invalid(
                KIND,
                s,
                "expected 8-4-4-4-12 hex digits, like 1b4e28ba-2fa1-11d2-883f-b9a761bde3fb",
            ));
        }
        let digits: Vec<u8> = b.iter().copied().filter(|&c| c != b'-').collect();
        super::hex_bytes(&digits)
            .map(Uuid)
            .ok_or_else(|| Error::invalid(KIND, s, "contains a character that is not hex"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nqns_of_every_common_form_parse_and_print_back() {
        for s in [
            "nqn.2014-08.org.nvmexpress:uuid:1b4e28ba-2fa1-11d2-883f-b9a761bde3fb",
            "nqn.2014-08.org.nvmexpress.discovery",
            "nqn.2016-06.io.spdk:cnode1",
            "nqn.2010-06.com.purestorage:flasharray.1a2b3c",
            "nqn.1988-11.com.dell:powerstore:00:a1b2",
            "nqn.2014-08.org.lunkit:l\u{e4}b",
        ] {
            let n: Nqn = s.parse().unwrap();
            assert_eq!(n.to_string(), s);
        }
    }

    #[test]
    fn nqns_that_could_inject_an_option_or_are_malformed_are_refused() {
        let long = format!("nqn.2014-08.org.a:{}", "x".repeat(MAX_NQN_LEN));
        for s in [
            "",
            "x",
            "nqn.2014-08.org.a,traddr=1.2.3.4",
            "nqn.2014-08.org.a=b",
            "nqn.2014-08.org.a b",
            "nqn.2014-08.org.a\n",
            "nqn.2014-08.org.a\u{85}",
            "nqn.2014-08.org/a",
            "nqn.2014-13.org.a",
            "nqn.14-08.org.a",
            "nqn.2014-08.",
            "iqn.2014-08.org.a",
            long.as_str(),
        ] {
            assert!(s.parse::<Nqn>().is_err(), "{s:?}");
        }
    }

    #[test]
    fn uuids_parse_lowercase_and_print_back() {
        let u: Uuid = "1B4E28BA-2FA1-11D2-883F-B9A761BDE3FB".parse().unwrap();
        assert_eq!(u.to_string(), "1b4e28ba-2fa1-11d2-883f-b9a761bde3fb");
        assert_eq!(u.to_string().parse::<Uuid>().unwrap(), u);
        for bad in [
            "",
            "1b4e28ba2fa111d2883fb9a761bde3fb",
            "1b4e28ba-2fa1-11d2-883f-b9a761bde3f",
            "1b4e28ba-2fa1-11d2-883f-b9a761bde3fg",
            "1b4e28ba-2fa1-11d2-883f-b9a761bde3fb0",
            "1b4e28ba_2fa1-11d2-883f-b9a761bde3fb",
            "1b4e28ba-2fa1-11d2-883f-b9a761bde3-b",
            "+b4e28ba-2fa1-11d2-883f-b9a761bde3fb",
            "1b4e28ba-2fa1-11d2-883f-b9a761bde3f\u{e9}",
        ] {
            assert!(bad.parse::<Uuid>().is_err(), "{bad:?}");
        }
    }
}

//! Volume identity: the WWID the kernel derives from VPD page 0x83.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// The longest WWID, in its sysfs form: `t10.` and a 255-byte designator (a VPD designator's
/// length is one byte). The multipath form of the same WWID is three bytes shorter.
const MAX_LEN: usize = 4 + 255;

/// A logical unit's world-wide identifier, kept in the kernel's sysfs form (`naa.…`, `eui.…`,
/// `t10.…`, or a raw SCSI name string).
///
/// multipath-tools writes the same identity differently: a type digit then the designator
/// (`3` + NAA hex, `2` + EUI-64 hex, `1` + T10 text). Both forms parse, and two `Wwid`s compare
/// equal when they name the same designator, so `naa.6001405abc` equals `36001405abc`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Wwid(String);

impl Wwid {
    /// The sysfs form (`naa.6001405…`).
    pub fn as_sysfs(&self) -> &str {
        &self.0
    }

    /// The multipath-tools form (`36001405…`), used in map uuids `mpath-<wwid>`.
    pub fn to_multipath(&self) -> String {
        if let Some(h) = self.0.strip_prefix("naa.") {
            format!("3{h}")
        } else if let Some(h) = self.0.strip_prefix("eui.") {
            format!("2{h}")
        } else if let Some(t) = self.0.strip_prefix("t10.") {
            format!("1{t}")
        } else {
            self.0.clone()
        }
    }
}

impl fmt::Display for Wwid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for Wwid {
    type Err = Error;

    /// Accepts the sysfs form or the multipath form (a leading type digit `1`, `2` or `3`
    /// followed by the designator). Hex designators are compared case-insensitively.
    fn from_str(s: &str) -> Result<Self> {
        const KIND: &str = "WWID";
        if s.is_empty() || s.len() > MAX_LEN {
            return Err(Error::invalid(KIND, s, "must be 1 to 259 bytes"));
        }
        if s.bytes().any(|b| b.is_ascii_control() || b == b'/') {
            return Err(Error::invalid(
                KIND,
                s,
                "contains a control character or '/'",
            ));
        }
        let hex = |h: &str| !h.is_empty() && h.bytes().all(|b| b.is_ascii_hexdigit());
        let sysfs = if let Some(h) = s.strip_prefix("naa.") {
            if !hex(h) {
                return Err(Error::invalid(KIND, s, "NAA designator is not hex"));
            }
            format!("naa.{}", h.to_ascii_lowercase())
        } else if let Some(h) = s.strip_prefix("eui.") {
            if !hex(h) {
                return Err(Error::invalid(KIND, s, "EUI-64 designator is not hex"));
            }
            format!("eui.{}", h.to_ascii_lowercase())
        } else if s.starts_with("t10.") {
            s.to_owned()
        } else if let Some(h) = s.strip_prefix('3').filter(|h| hex(h)) {
            format!("naa.{}", h.to_ascii_lowercase())
        } else if let Some(h) = s.strip_prefix('2').filter(|h| hex(h)) {
            format!("eui.{}", h.to_ascii_lowercase())
        } else if let Some(t) = s.strip_prefix('1') {
            format!("t10.{t}")
        } else {
            s.to_owned()
        };
        // The bound is on the sysfs form, which is what is kept and displayed: the multipath
        // form grows by three bytes (`3…` to `naa.…`), and a WWID whose displayed form is
        // too long to parse back would not survive a round trip through a map uuid or JSON.
        if sysfs.len() > MAX_LEN {
            return Err(Error::invalid(KIND, s, "must be 1 to 259 bytes"));
        }
        Ok(Wwid(sysfs))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_forms_name_the_same_volume() {
        let a: Wwid = "naa.6001405ABC".parse().unwrap();
        let b: Wwid = "36001405abc".parse().unwrap();
        assert_eq!(a, b);
        assert_eq!(a.as_sysfs(), "naa.6001405abc");
        assert_eq!(a.to_multipath(), "36001405abc");
        let e: Wwid = "eui.0025385b71b0e7a1".parse().unwrap();
        assert_eq!(e.to_multipath(), "20025385b71b0e7a1");
        assert_eq!("20025385b71b0e7a1".parse::<Wwid>().unwrap(), e);
        let t: Wwid = "t10.ATA     QEMU HARDDISK".parse().unwrap();
        assert_eq!(t.to_multipath(), "1ATA     QEMU HARDDISK");
        assert_eq!(t.to_multipath().parse::<Wwid>().unwrap(), t);
        assert_ne!(a, "naa.6001405abd".parse::<Wwid>().unwrap());
    }

    #[test]
    fn rejects_path_tricks_and_garbage() {
        for bad in [
            "",
            "naa.",
            "naa.xyz",
            "eui.12g4",
            "../../etc",
            "naa.1\n",
            &"3".repeat(300),
        ] {
            assert!(bad.parse::<Wwid>().is_err(), "{bad:?}");
        }
    }
}

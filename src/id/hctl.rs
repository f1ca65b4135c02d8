//! SCSI addresses: host, channel, target, LUN.

use std::fmt;
use std::str::FromStr;

use super::decimal;
use crate::error::{Error, Result};

/// A SCSI device address as the kernel names it in sysfs, `H:C:T:L`.
///
/// The LUN is the kernel's 64-bit `scsilun_to_int` form (LUNs below 256 are themselves; a
/// flat-space LUN `n` is `0x4000 | n`), which is what `/sys/class/scsi_device` names use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Hctl {
    /// SCSI host number (`hostN`).
    pub host: u32,
    /// Channel (bus) on the host.
    pub channel: u32,
    /// Target id on the channel.
    pub target: u32,
    /// Logical unit number.
    pub lun: u64,
}

impl Hctl {
    /// An address from its four parts.
    pub const fn new(host: u32, channel: u32, target: u32, lun: u64) -> Self {
        Hctl {
            host,
            channel,
            target,
            lun,
        }
    }
}

impl fmt::Display for Hctl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}:{}",
            self.host, self.channel, self.target, self.lun
        )
    }
}

impl FromStr for Hctl {
    type Err = Error;

    /// Parses `H:C:T:L` with plain decimal parts; anything else (signs, hex, spaces, a fifth
    /// part, out-of-range numbers) is rejected, because the result is used to build sysfs paths.
    fn from_str(s: &str) -> Result<Self> {
        const KIND: &str = "H:C:T:L";
        let mut parts = s.split(':');
        let mut next = || {
            parts
                .next()
                .ok_or_else(|| Error::invalid(KIND, s, "expected four parts"))
        };
        let (h, c, t, l) = (next()?, next()?, next()?, next()?);
        if parts.next().is_some() {
            return Err(Error::invalid(KIND, s, "expected four parts"));
        }
        Ok(Hctl {
            host: decimal(h)
                .ok_or_else(|| Error::invalid(KIND, s, "host is not a 32-bit decimal"))?,
            channel: decimal(c)
                .ok_or_else(|| Error::invalid(KIND, s, "channel is not a 32-bit decimal"))?,
            target: decimal(t)
                .ok_or_else(|| Error::invalid(KIND, s, "target is not a 32-bit decimal"))?,
            lun: decimal(l)
                .ok_or_else(|| Error::invalid(KIND, s, "LUN is not a 64-bit decimal"))?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let h: Hctl = "2:0:1:16384".parse().unwrap();
        assert_eq!(h, Hctl::new(2, 0, 1, 16384));
        assert_eq!(h.to_string(), "2:0:1:16384");
        let max = Hctl::new(u32::MAX, u32::MAX, u32::MAX, u64::MAX);
        assert_eq!(max.to_string().parse::<Hctl>().unwrap(), max);
    }

    #[test]
    fn rejects_malformed() {
        for bad in [
            "",
            "1",
            "1:2:3",
            "1:2:3:4:5",
            "a:0:0:0",
            "1:0:0:",
            ":0:0:0",
            "+1:0:0:0",
            "1:-0:0:0",
            "0x1:0:0:0",
            " 1:0:0:0",
            "1:0:0:0\n",
            "4294967296:0:0:0",
            "0:0:0:18446744073709551616",
            "0:0:0:1/../2",
            "0:0:0:\u{0}",
        ] {
            let err = bad.parse::<Hctl>().unwrap_err();
            assert!(
                matches!(
                    err,
                    Error::Invalid {
                        kind: "H:C:T:L",
                        ..
                    }
                ),
                "{bad:?}: {err}"
            );
        }
    }

    #[test]
    fn orders_numerically() {
        let mut v: Vec<Hctl> = ["10:0:0:0", "2:0:0:10", "2:0:0:9"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        v.sort();
        let s: Vec<String> = v.iter().map(ToString::to_string).collect();
        assert_eq!(s, ["2:0:0:9", "2:0:0:10", "10:0:0:0"]);
    }
}

//! Device numbers: `major:minor`.

use std::fmt;
use std::str::FromStr;

use super::decimal;
use crate::error::{Error, Result};

/// A device number, `major:minor`, as in sysfs `dev` files and `/proc/self/mountinfo`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DevNum {
    /// Major number (8 for sd, 253-ish for device-mapper, dynamic).
    pub major: u32,
    /// Minor number.
    pub minor: u32,
}

impl fmt::Display for DevNum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.major, self.minor)
    }
}

impl FromStr for DevNum {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let (ma, mi) = s
            .split_once(':')
            .ok_or_else(|| Error::invalid("major:minor", s, "expected MAJOR:MINOR"))?;
        match (decimal(ma), decimal(mi)) {
            (Some(major), Some(minor)) => Ok(DevNum { major, minor }),
            _ => Err(Error::invalid(
                "major:minor",
                s,
                "expected two decimal numbers",
            )),
        }
    }
}

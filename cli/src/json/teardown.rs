//! `lunkit flush --json` and `lunkit delete --json`: one device's flush or deletion.

use std::time::Duration;

use lunkit::Hctl;
use lunkit::block::BlockNode;
use lunkit::scsi::Deleted;
use serde::Serialize;

use super::{SCHEMA_VERSION, micros};

/// A flushed block device.
#[derive(Debug, Serialize)]
pub struct Flush {
    pub version: u32,
    /// The kernel name of the device flushed (`sdc`, `dm-0`), whatever name was given.
    pub device: String,
    pub major: u32,
    pub minor: u32,
    pub elapsed_us: u64,
}

/// A SCSI device deleted, or found gone.
#[derive(Debug, Serialize)]
pub struct Delete {
    pub version: u32,
    pub hctl: String,
    /// `deleted`, or `already-gone` (no device at that address: success too).
    pub outcome: &'static str,
    pub elapsed_us: u64,
}

impl Flush {
    pub fn new(node: &BlockNode, elapsed: Duration) -> Self {
        Flush {
            version: SCHEMA_VERSION,
            device: node.name.clone(),
            major: node.dev.major,
            minor: node.dev.minor,
            elapsed_us: micros(elapsed),
        }
    }
}

impl Delete {
    pub fn new(hctl: Hctl, deleted: &Deleted, elapsed: Duration) -> Self {
        Delete {
            version: SCHEMA_VERSION,
            hctl: hctl.to_string(),
            outcome: match deleted {
                Deleted::Now => "deleted",
                Deleted::AlreadyGone => "already-gone",
            },
            elapsed_us: micros(elapsed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lunkit::DevNum;
    use serde_json::json;

    #[test]
    fn a_flush_names_the_kernel_device() {
        let node = BlockNode {
            name: "dm-0".into(),
            dev: DevNum {
                major: 254,
                minor: 0,
            },
            path: "/dev/dm-0".into(),
        };
        assert_eq!(
            serde_json::to_value(Flush::new(&node, Duration::from_micros(77))).unwrap(),
            json!({"version": 1, "device": "dm-0", "major": 254, "minor": 0, "elapsed_us": 77})
        );
    }

    #[test]
    fn a_delete_says_whether_there_was_a_device() {
        let hctl: Hctl = "6:0:0:1".parse().unwrap();
        let now = serde_json::to_value(Delete::new(hctl, &Deleted::Now, Duration::ZERO)).unwrap();
        assert_eq!(
            now,
            json!({"version": 1, "hctl": "6:0:0:1", "outcome": "deleted", "elapsed_us": 0})
        );
        let gone = Delete::new(hctl, &Deleted::AlreadyGone, Duration::ZERO);
        assert_eq!(gone.outcome, "already-gone");
    }
}

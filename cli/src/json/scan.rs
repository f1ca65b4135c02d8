//! `lunkit scan --json` and a SCSI `lunkit attach --json`: the devices that came and every
//! path's outcome.

use std::time::Duration;

use lunkit::ops::MapDevice;
use lunkit::{PathOutcome, PathScan};
use serde::Serialize;

use super::{SCHEMA_VERSION, micros};

#[derive(Debug, Serialize)]
pub struct Scan {
    pub version: u32,
    /// The devices that came (what `scan` printed before it listed every path).
    pub devices: Vec<Device>,
    /// Every path, scanned or skipped, with its outcome.
    pub paths: Vec<Path>,
    /// The multipath map, for `attach --wait-map` only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub map: Option<Map>,
    pub elapsed_us: u64,
}

#[derive(Debug, Serialize)]
pub struct Device {
    pub name: String,
    pub path: String,
    pub hctl: String,
    pub wwid: Option<String>,
    pub major: u32,
    pub minor: u32,
    /// The whole command's `elapsed_us` (every device counts from the same start).
    pub elapsed_us: u64,
    /// With `--wait-udev` only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub udev: Option<Udev>,
}

#[derive(Debug, Serialize)]
pub struct Path {
    pub via: String,
    pub hctl: Option<String>,
    /// `found`, `not-reported`, `timed-out`, `failed` or `skipped`.
    pub outcome: &'static str,
    /// The device, when found.
    pub device: Option<String>,
    /// Why, when timed out, failed or skipped.
    pub detail: Option<String>,
    /// Offsets from the start of the library call (before the transport's paths were read),
    /// in microseconds.
    pub write_start_us: Option<u64>,
    pub write_end_us: Option<u64>,
    pub ready_us: Option<u64>,
}

#[derive(Debug, Serialize)]
pub struct Map {
    pub name: String,
    pub dm: String,
    pub major: u32,
    pub minor: u32,
}

/// What `--wait-udev` found for one device (also in an NVMe attach's devices).
#[derive(Debug, Clone, Serialize)]
pub struct Udev {
    /// `processed` or `not running`.
    pub state: &'static str,
    pub links: Vec<String>,
}

impl Scan {
    /// The document of a scan (or SCSI attach) that took `elapsed`; `udev`, with
    /// `--wait-udev`, has one entry per device that came, in path order.
    pub fn new(
        paths: &[PathScan],
        map: Option<&MapDevice>,
        udev: Option<Vec<Udev>>,
        elapsed: Duration,
    ) -> Self {
        let mut udev = udev.map(Vec::into_iter);
        let elapsed_us = micros(elapsed);
        Scan {
            version: SCHEMA_VERSION,
            devices: paths
                .iter()
                .filter_map(PathScan::device)
                .map(|p| Device {
                    name: p.name.clone(),
                    path: p.dev_path.display().to_string(),
                    hctl: p.hctl.to_string(),
                    wwid: p.wwid.as_ref().map(ToString::to_string),
                    major: p.dev.major,
                    minor: p.dev.minor,
                    elapsed_us,
                    udev: udev.as_mut().and_then(Iterator::next),
                })
                .collect(),
            paths: paths.iter().map(Path::new).collect(),
            map: map.map(|m| Map {
                name: m.name.clone(),
                dm: m.node.name.clone(),
                major: m.node.dev.major,
                minor: m.node.dev.minor,
            }),
            elapsed_us,
        }
    }
}

impl Path {
    fn new(p: &PathScan) -> Self {
        Path {
            via: p.via.clone(),
            hctl: p.hctl.map(|h| h.to_string()),
            outcome: p.outcome.as_str(),
            device: p.device().map(|d| d.name.clone()),
            detail: match &p.outcome {
                PathOutcome::Failed(e) | PathOutcome::TimedOut(e) => Some(e.to_string()),
                PathOutcome::Skipped(why) => Some(why.clone()),
                _ => None,
            },
            write_start_us: p.timing.write_start.map(micros),
            write_end_us: p.timing.write_end.map(micros),
            ready_us: p.timing.ready.map(micros),
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use lunkit::block::BlockNode;
    use lunkit::scsi::PathTiming;
    use lunkit::{DevNum, Hctl, PathDevice};
    use serde_json::{Value, json};

    fn ms(n: u64) -> Option<Duration> {
        Some(Duration::from_millis(n))
    }

    /// One path that came (`6:0:0:2`, sdb) and one its target did not report.
    pub fn two_paths() -> Vec<PathScan> {
        let hctl: Hctl = "6:0:0:2".parse().unwrap();
        vec![
            PathScan {
                via: "session5 (127.0.0.1:3260)".into(),
                hctl: Some(hctl),
                outcome: PathOutcome::Found(PathDevice {
                    hctl,
                    name: "sdb".into(),
                    dev_path: "/dev/sdb".into(),
                    dev: DevNum {
                        major: 8,
                        minor: 16,
                    },
                    wwid: Some("naa.60014055e7a100000020000000000000".parse().unwrap()),
                }),
                timing: PathTiming {
                    write_start: ms(70),
                    write_end: ms(231),
                    ready: ms(346),
                },
            },
            PathScan {
                via: "session6 (127.0.0.2:3260)".into(),
                hctl: Some("7:0:0:2".parse().unwrap()),
                outcome: PathOutcome::Skipped("session FAILED".into()),
                timing: PathTiming::default(),
            },
        ]
    }

    #[test]
    fn a_scan_lists_the_device_that_came_and_every_path() {
        let paths = two_paths();
        let udev = vec![Udev {
            state: "processed",
            links: vec!["/dev/disk/by-id/wwn-0x6001".into()],
        }];
        let doc = Scan::new(&paths, None, Some(udev), Duration::from_micros(9_186_879));
        let v = serde_json::to_value(&doc).unwrap();
        let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(keys, ["devices", "elapsed_us", "paths", "version"]);
        assert_eq!(v["version"], json!(1));
        assert_eq!(v["elapsed_us"], json!(9_186_879));
        assert_eq!(
            v["devices"],
            json!([{
                "name": "sdb", "path": "/dev/sdb", "hctl": "6:0:0:2",
                "wwid": "naa.60014055e7a100000020000000000000", "major": 8, "minor": 16,
                "elapsed_us": 9_186_879,
                "udev": {"state": "processed", "links": ["/dev/disk/by-id/wwn-0x6001"]},
            }])
        );
        assert_eq!(
            v["paths"][0],
            json!({
                "via": "session5 (127.0.0.1:3260)", "hctl": "6:0:0:2", "outcome": "found",
                "device": "sdb", "detail": null, "write_start_us": 70_000,
                "write_end_us": 231_000, "ready_us": 346_000,
            })
        );
        assert_eq!(v["paths"][1]["outcome"], json!("skipped"));
        assert_eq!(v["paths"][1]["detail"], json!("session FAILED"));
        assert_eq!(v["paths"][1]["device"], Value::Null);
        assert_eq!(v["paths"][1]["write_start_us"], Value::Null);
    }

    #[test]
    fn an_attach_with_its_map_adds_map_and_no_udev_without_wait_udev() {
        let map = MapDevice {
            name: "mpatha".into(),
            node: BlockNode {
                name: "dm-0".into(),
                dev: DevNum {
                    major: 254,
                    minor: 0,
                },
                path: "/dev/dm-0".into(),
            },
            partitions: Vec::new(),
        };
        let v = serde_json::to_value(Scan::new(&two_paths(), Some(&map), None, Duration::ZERO))
            .unwrap();
        assert_eq!(
            v["map"],
            json!({"name": "mpatha", "dm": "dm-0", "major": 254, "minor": 0})
        );
        assert!(v["devices"][0].get("udev").is_none(), "{v}");
    }
}

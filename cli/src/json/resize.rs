//! `lunkit resize --json`: a [`Report`] of the volume asked for, with what every path, the
//! map or the NVMe namespace measured before and after.

use std::time::Duration;

use lunkit::ops::{Resized, VolumeSpec};
use serde::Serialize;

use super::{Report, micros};

/// `lunkit resize --json`.
pub type Resize = Report<Volume, Result>;

/// What was asked for.
#[derive(Debug, Serialize)]
pub struct Volume {
    /// The volume as the command line named it.
    pub volume: String,
}

#[derive(Debug, Serialize)]
pub struct Result {
    /// Multipath form; `null` when the volume has none.
    pub wwid: Option<String>,
    /// The volume's size now, in bytes.
    pub size: u64,
    /// Whether any device changed size.
    pub changed: bool,
    /// Whether any path or controller was rescanned.
    pub rescanned: bool,
    /// Every SCSI path (empty for NVMe).
    pub paths: Vec<PathSize>,
    pub map: Option<MapSize>,
    pub nvme: Option<Nvme>,
    /// The library's own time (the last `elapsed_us` of the document).
    pub elapsed_us: u64,
    pub rescan_us: u64,
    pub map_us: u64,
}

#[derive(Debug, Serialize)]
pub struct PathSize {
    pub hctl: String,
    pub disk: String,
    pub before: u64,
    pub after: u64,
}

#[derive(Debug, Serialize)]
pub struct MapSize {
    pub name: String,
    /// `mpatha (dm-0)`.
    pub device: String,
    pub before: u64,
    pub after: u64,
    /// `multipathd`, `table-reload` or `unchanged`.
    pub by: &'static str,
}

#[derive(Debug, Serialize)]
pub struct Nvme {
    pub devices: Vec<NamespaceSize>,
    /// What each controller answered to Identify Namespace.
    pub reported: Vec<Reported>,
}

#[derive(Debug, Serialize)]
pub struct NamespaceSize {
    pub device: String,
    pub before: u64,
    pub after: u64,
}

#[derive(Debug, Serialize)]
pub struct Reported {
    pub controller: String,
    pub size: u64,
}

/// The report of a resize of `spec` that took `elapsed`.
pub fn report(spec: &VolumeSpec, result: &lunkit::Result<Resized>, elapsed: Duration) -> Resize {
    let volume = Volume {
        volume: spec.to_string(),
    };
    Report::new(volume, result, elapsed, Result::new)
}

impl Result {
    fn new(r: &Resized) -> Self {
        let scsi = r.scsi();
        Result {
            wwid: r.wwid.as_ref().map(|w| w.to_multipath()),
            size: r.size(),
            changed: r.changed(),
            rescanned: r.rescanned,
            paths: scsi
                .iter()
                .flat_map(|s| &s.paths)
                .map(|p| PathSize {
                    hctl: p.hctl.to_string(),
                    disk: p.disk.clone(),
                    before: p.before,
                    after: p.after,
                })
                .collect(),
            map: scsi.and_then(|s| s.map.as_ref()).map(|m| MapSize {
                name: m.name.clone(),
                device: m.device.clone(),
                before: m.before,
                after: m.after,
                by: m.by.as_str(),
            }),
            nvme: r.nvme().map(|n| Nvme {
                devices: n
                    .devices
                    .iter()
                    .map(|d| NamespaceSize {
                        device: d.device.clone(),
                        before: d.before,
                        after: d.after,
                    })
                    .collect(),
                reported: n
                    .reported
                    .iter()
                    .map(|(c, s)| Reported {
                        controller: c.clone(),
                        size: *s,
                    })
                    .collect(),
            }),
            elapsed_us: micros(r.elapsed),
            rescan_us: micros(r.rescan_elapsed),
            map_us: micros(scsi.map_or(Duration::ZERO, |s| s.map_elapsed)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json::{Layout, to_text};
    use lunkit::multipath::GrownBy;
    use lunkit::ops::{
        MapSize as LibMap, NamespaceSize as LibNs, NvmeResize, PathSize as LibPath, ResizedFamily,
        ScsiResize,
    };
    use serde_json::{Value, json};

    fn grown() -> Resized {
        Resized {
            wwid: Some("naa.6001405a1b2c3d4e5f60718293a4b5c6".parse().unwrap()),
            family: ResizedFamily::Scsi(ScsiResize {
                paths: vec![LibPath {
                    hctl: "6:0:0:0".parse().unwrap(),
                    disk: "sda".into(),
                    device: "6:0:0:0 (sda)".into(),
                    before: 100,
                    after: 200,
                }],
                map: Some(LibMap {
                    name: "mpatha".into(),
                    device: "mpatha (dm-0)".into(),
                    before: 100,
                    after: 200,
                    by: GrownBy::Multipathd,
                }),
                map_elapsed: Duration::from_micros(40),
            }),
            rescanned: true,
            rescan_elapsed: Duration::from_micros(30),
            elapsed: Duration::from_micros(150),
            device_node: None,
        }
    }

    fn spec() -> VolumeSpec {
        VolumeSpec::Device("/dev/mapper/mpatha".into())
    }

    #[test]
    fn a_grown_map_reports_paths_map_and_times() {
        let v = serde_json::to_value(report(&spec(), &Ok(grown()), Duration::from_micros(151)))
            .unwrap();
        assert_eq!(v["version"], json!(1));
        assert_eq!(v["volume"], json!(spec().to_string()));
        assert_eq!((&v["ok"], &v["error"]), (&json!(true), &Value::Null));
        assert_eq!(v["elapsed_us"], json!(151));
        assert_eq!(
            v["result"],
            json!({
                "wwid": "36001405a1b2c3d4e5f60718293a4b5c6", "size": 200, "changed": true,
                "rescanned": true,
                "paths": [{"hctl": "6:0:0:0", "disk": "sda", "before": 100, "after": 200}],
                "map": {"name": "mpatha", "device": "mpatha (dm-0)", "before": 100, "after": 200, "by": "multipathd"},
                "nvme": null, "elapsed_us": 150, "rescan_us": 30, "map_us": 40,
            })
        );
    }

    #[test]
    fn its_line_ends_with_the_librarys_time_and_names_how_the_map_grew() {
        // `cargo xtask bench` takes the last `elapsed_us` as the library's and looks for
        // `"by":"multipathd"` in the one-line text.
        let text = to_text(
            &report(&spec(), &Ok(grown()), Duration::from_micros(151)),
            Layout::Line,
        );
        let last = text.rfind("\"elapsed_us\":").unwrap();
        assert!(text[last..].starts_with("\"elapsed_us\":150,"), "{text}");
        assert!(text.contains(r#""by":"multipathd""#), "{text}");
    }

    #[test]
    fn an_nvme_resize_lists_devices_and_what_each_controller_reported() {
        let mut r = grown();
        r.family = ResizedFamily::Nvme(NvmeResize {
            devices: vec![LibNs {
                device: "nvme0n1".into(),
                before: 64,
                after: 128,
            }],
            reported: vec![("nvme0".into(), 128), ("nvme1".into(), 128)],
        });
        let v = serde_json::to_value(report(&spec(), &Ok(r), Duration::ZERO)).unwrap();
        assert_eq!(v["result"]["size"], json!(128));
        // The SCSI fields stay in the document, empty, as before the families were typed.
        assert_eq!(
            (
                &v["result"]["paths"],
                &v["result"]["map"],
                &v["result"]["map_us"]
            ),
            (&json!([]), &Value::Null, &json!(0))
        );
        assert_eq!(
            v["result"]["nvme"],
            json!({
                "devices": [{"device": "nvme0n1", "before": 64, "after": 128}],
                "reported": [{"controller": "nvme0", "size": 128}, {"controller": "nvme1", "size": 128}],
            })
        );
    }

    #[test]
    fn a_refused_resize_has_no_result() {
        let failed = Err(lunkit::Error::invalid("volume", "x", "no such"));
        let v = serde_json::to_value(report(&spec(), &failed, Duration::ZERO)).unwrap();
        assert_eq!((&v["ok"], &v["result"]), (&json!(false), &Value::Null));
        assert!(v["error"].as_str().unwrap().contains("no such"));
    }
}

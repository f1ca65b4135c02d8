//! `lunkit scan hctl|iscsi|fc`: bring one LUN in and print its path devices.

use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use lunkit::fc::FcLun;
use lunkit::iscsi::IscsiLun;
use lunkit::ops::MapDevice;
use lunkit::udev::UdevState;
use lunkit::{Hctl, PathDevice, PathOutcome, PathScan, Root, ScanOptions, Wwid, Wwn};
use serde::Serialize;

#[derive(Subcommand)]
pub enum Scan {
    /// Scan one LUN by its SCSI address (writes "C T L" to hostH/scan).
    Hctl {
        /// The address, H:C:T:L.
        hctl: Hctl,
        #[command(flatten)]
        common: Common,
    },
    /// Scan one LUN on every logged-in session to an iSCSI target.
    Iscsi {
        /// Target IQN.
        #[arg(long)]
        target: String,
        /// Only sessions through this portal (ADDR:PORT, an IPv6 address in brackets); repeatable.
        #[arg(long = "portal", value_name = "ADDR:PORT")]
        portals: Vec<String>,
        /// LUN number.
        #[arg(long)]
        lun: u64,
        #[command(flatten)]
        common: Common,
    },
    /// Scan one LUN through every online FC remote port of a target's WWPNs.
    Fc {
        /// Target port WWPN (0x…, bare hex, or colon-separated); repeat it, or separate with
        /// commas, for a target reached through several ports.
        #[arg(long, required = true, value_delimiter = ',')]
        wwpn: Vec<Wwn>,
        /// Only through these local ports (initiator WWPNs); repeatable.
        #[arg(long = "initiator", value_name = "WWPN")]
        initiators: Vec<Wwn>,
        /// LUN number.
        #[arg(long)]
        lun: u64,
        /// Write "- - L" (every target of the host) instead of the exact "C T L".
        #[arg(long)]
        wildcard: bool,
        #[command(flatten)]
        common: Common,
    },
}

#[derive(Args)]
pub struct Common {
    /// Seconds to wait for the block devices.
    #[arg(long, value_name = "SECS", default_value_t = 30.0)]
    timeout: f64,
    /// Reject paths whose WWID differs (sysfs naa.… or multipath 3… form).
    #[arg(long, value_name = "WWID")]
    expect_wwid: Option<Wwid>,
    /// Succeed only when at least N paths came (exit 3 when fewer did, 5 when a path timed out).
    #[arg(long, value_name = "N", default_value_t = 1)]
    min_paths: usize,
    /// Also wait until udevd has processed each device (its /dev/disk/by-* links exist);
    /// reported as "not running" when there is no udevd.
    #[arg(long)]
    wait_udev: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

impl Common {
    pub fn options(&self) -> lunkit::Result<ScanOptions> {
        let mut opts = ScanOptions::default();
        opts.timeout = crate::seconds(self.timeout)?;
        opts.expect_wwid = self.expect_wwid.clone();
        opts.min_paths = self.min_paths;
        Ok(opts)
    }
}

#[derive(Serialize)]
struct Out {
    /// The devices that came (what `scan` printed before it listed every path).
    devices: Vec<Device>,
    /// Every path, scanned or skipped, with its outcome.
    paths: Vec<Path>,
    #[serde(skip_serializing_if = "Option::is_none")]
    map: Option<Map>,
    elapsed_us: u128,
}

#[derive(Serialize)]
struct Device {
    name: String,
    path: String,
    hctl: String,
    wwid: Option<String>,
    major: u32,
    minor: u32,
    elapsed_us: u128,
    #[serde(skip_serializing_if = "Option::is_none")]
    udev: Option<Udev>,
}

#[derive(Serialize)]
struct Path {
    via: String,
    hctl: Option<String>,
    /// `found`, `not-reported`, `timed-out`, `failed` or `skipped`.
    outcome: &'static str,
    /// The device, when found.
    device: Option<String>,
    /// Why, when timed out, failed or skipped.
    detail: Option<String>,
    /// Offsets from the start of the library call (before the transport's paths were read),
    /// in microseconds.
    write_start_us: Option<u128>,
    write_end_us: Option<u128>,
    ready_us: Option<u128>,
}

#[derive(Serialize)]
struct Map {
    name: String,
    dm: String,
    major: u32,
    minor: u32,
}

#[derive(Serialize)]
pub struct Udev {
    /// `processed` or `not running`.
    pub state: &'static str,
    pub links: Vec<String>,
}

pub fn run(root: &Root, cmd: Scan) -> lunkit::Result<()> {
    let common = match &cmd {
        Scan::Hctl { common, .. } | Scan::Iscsi { common, .. } | Scan::Fc { common, .. } => common,
    };
    let opts = common.options()?;
    let start = Instant::now();
    let report = match &cmd {
        Scan::Hctl { hctl, .. } => lunkit::scsi::scan_report(root, *hctl, &opts)?,
        Scan::Iscsi {
            target,
            portals,
            lun,
            ..
        } => {
            let lun = IscsiLun {
                portals: portals.clone(),
                ..IscsiLun::new(target.clone(), *lun)
            };
            lunkit::iscsi::scan(root, &lun, &opts)?
        }
        Scan::Fc {
            wwpn,
            initiators,
            lun,
            wildcard,
            ..
        } => {
            let lun = FcLun {
                wwpns: wwpn.clone(),
                initiators: initiators.clone(),
                lun: *lun,
                wildcard: *wildcard,
            };
            lunkit::fc::scan(root, &lun, &opts)?
        }
    };
    let udev = wait_udev(
        root,
        common,
        report.devices().map(|d| (d.name.clone(), d.dev)),
        start,
        opts.timeout,
    )?;
    print(&report.paths, None, udev, start.elapsed(), common.json);
    Ok(())
}

/// With `--wait-udev`, waits until udevd has processed every device, within the scan's
/// deadline.
pub fn wait_udev(
    root: &Root,
    common: &Common,
    devices: impl Iterator<Item = (String, lunkit::DevNum)>,
    start: Instant,
    timeout: Duration,
) -> lunkit::Result<Option<Vec<Udev>>> {
    if !common.wait_udev {
        return Ok(None);
    }
    let devs: Vec<(String, lunkit::DevNum)> = devices.collect();
    let states =
        lunkit::udev::wait_processed(root, &devs, lunkit::wait::deadline_from(start, timeout))?;
    Ok(Some(
        states
            .into_iter()
            .map(|s| match s {
                UdevState::Processed { links } => Udev {
                    state: "processed",
                    links: links.iter().map(|l| l.display().to_string()).collect(),
                },
                UdevState::NotRunning => Udev {
                    state: "not running",
                    links: Vec::new(),
                },
            })
            .collect(),
    ))
}

fn us(d: Option<Duration>) -> Option<u128> {
    d.map(|d| d.as_micros())
}

/// Prints every path with its outcome (and the map, for `attach --wait-map`), as text or JSON.
pub fn print(
    paths: &[PathScan],
    map: Option<&MapDevice>,
    udev: Option<Vec<Udev>>,
    elapsed: Duration,
    json: bool,
) {
    let mut udev = udev.map(Vec::into_iter);
    let found: Vec<&PathDevice> = paths.iter().filter_map(PathScan::device).collect();
    if json {
        let out = Out {
            devices: found
                .iter()
                .map(|p| Device {
                    udev: udev.as_mut().and_then(Iterator::next),
                    name: p.name.clone(),
                    path: p.dev_path.display().to_string(),
                    hctl: p.hctl.to_string(),
                    wwid: p.wwid.as_ref().map(ToString::to_string),
                    major: p.dev.major,
                    minor: p.dev.minor,
                    elapsed_us: elapsed.as_micros(),
                })
                .collect(),
            paths: paths
                .iter()
                .map(|p| Path {
                    via: p.via.clone(),
                    hctl: p.hctl.map(|h| h.to_string()),
                    outcome: p.outcome.as_str(),
                    device: p.device().map(|d| d.name.clone()),
                    detail: match &p.outcome {
                        PathOutcome::Failed(e) | PathOutcome::TimedOut(e) => Some(e.to_string()),
                        PathOutcome::Skipped(why) => Some(why.clone()),
                        _ => None,
                    },
                    write_start_us: us(p.timing.write_start),
                    write_end_us: us(p.timing.write_end),
                    ready_us: us(p.timing.ready),
                })
                .collect(),
            map: map.map(|m| Map {
                name: m.name.clone(),
                dm: m.node.name.clone(),
                major: m.node.dev.major,
                minor: m.node.dev.minor,
            }),
            elapsed_us: elapsed.as_micros(),
        };
        println!(
            "{}",
            serde_json::to_string_pretty(&out).expect("scan JSON serializes")
        );
        return;
    }
    for p in paths {
        let hctl = p.hctl.map_or("-".into(), |h| h.to_string());
        match p.device() {
            Some(d) => {
                let u = udev
                    .as_mut()
                    .and_then(Iterator::next)
                    .map_or(String::new(), |u| {
                        format!("  udev {} {}", u.state, u.links.join(" "))
                    });
                println!(
                    "{hctl}  {}  {}  {}{}  ({})",
                    d.dev_path.display(),
                    d.dev,
                    d.wwid.as_ref().map_or("-".into(), ToString::to_string),
                    u.trim_end(),
                    p.via
                );
            }
            None => println!("{hctl}  {}  ({})", p.outcome, p.via),
        }
    }
    if let Some(m) = map {
        println!("map {} ({}, {})", m.name, m.node.name, m.node.dev);
    }
    println!(
        "{} of {} path(s) in {:.1} ms",
        found.len(),
        paths.len(),
        elapsed.as_secs_f64() * 1e3
    );
}

//! `lunkit scan hctl|iscsi|fc`: bring one LUN in and print its path devices.

use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use lunkit::fc::FcLun;
use lunkit::iscsi::IscsiLun;
use lunkit::ops::MapDevice;
use lunkit::udev::UdevState;
use lunkit::{Hctl, PathScan, Root, ScanOptions, Wwid, Wwn};

use crate::json::scan::Udev;
use crate::json::{self, Layout};

#[derive(Subcommand)]
pub enum Scan {
    /// Scan one LUN by its SCSI address (writes "C T L" to hostH/scan).
    Hctl {
        /// The address, H:C:T:L.
        #[arg(value_name = "H:C:T:L")]
        hctl: Hctl,
        #[command(flatten)]
        common: Common,
    },
    /// Scan one LUN on every logged-in session to an iSCSI target.
    Iscsi {
        /// The target's iSCSI name: iqn.yyyy-mm.<reverse domain>[:<name>], eui.<16 hex
        /// digits> or naa.<16 or 32 hex digits>.
        #[arg(long = "iscsi-target", alias = "target", value_name = "IQN")]
        target: String,
        /// Only sessions through this portal (ADDR:PORT, an IPv6 address in brackets); repeatable.
        #[arg(long = "portal", value_name = "ADDR:PORT")]
        portals: Vec<String>,
        /// Only sessions logged in through this open-iscsi iface (`default`, or an iface
        /// record's name); repeatable.
        #[arg(long = "iscsi-iface", value_name = "IFACE")]
        iscsi_ifaces: Vec<String>,
        /// The LUN.
        #[arg(long, value_name = "LUN")]
        lun: u64,
        #[command(flatten)]
        common: Common,
    },
    /// Scan one LUN through every online FC remote port of a target's WWPNs.
    Fc {
        /// The target's port name, 16 hex digits (0x…, bare, or colon-separated); repeat it,
        /// or separate with commas, for a target reached through several ports.
        #[arg(
            long = "fc-wwpn",
            alias = "wwpn",
            value_name = "WWPN",
            required = true,
            value_delimiter = ','
        )]
        wwpn: Vec<Wwn>,
        /// Only through these local ports (initiator WWPNs); repeatable.
        #[arg(long = "initiator", value_name = "WWPN")]
        initiators: Vec<Wwn>,
        /// The LUN.
        #[arg(long, value_name = "LUN")]
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
    /// Reject paths whose WWID differs: a SCSI LUN's in the forms of `detach --wwid`, or an
    /// NVMe namespace's as sysfs shows it (uuid.…, eui.…, nvme.…).
    #[arg(long, value_name = "WWID", value_parser = crate::ids::expect_wwid)]
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
            iscsi_ifaces,
            lun,
            ..
        } => {
            let lun = IscsiLun {
                ifaces: iscsi_ifaces.clone(),
                portals: portals
                    .iter()
                    .map(|p| crate::ids::iscsi_portal(p))
                    .collect::<lunkit::Result<_>>()?,
                ..IscsiLun::new(crate::ids::iscsi_name(target)?, *lun)
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

/// Prints every path with its outcome (and the map, for `attach --wait-map`), as text or JSON.
pub fn print(
    paths: &[PathScan],
    map: Option<&MapDevice>,
    udev: Option<Vec<Udev>>,
    elapsed: Duration,
    json: bool,
) {
    if json {
        json::print(
            &json::scan::Scan::new(paths, map, udev, elapsed),
            Layout::Pretty,
        );
        return;
    }
    let mut udev = udev.map(Vec::into_iter);
    let found = paths.iter().filter_map(PathScan::device).count();
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
                outln!(
                    "{hctl}  {}  {}  {}{}  ({})",
                    d.dev_path.display(),
                    d.dev,
                    d.wwid.as_ref().map_or("-".into(), ToString::to_string),
                    u.trim_end(),
                    p.via
                );
            }
            None => outln!("{hctl}  {}  ({})", p.outcome, p.via),
        }
    }
    if let Some(m) = map {
        outln!("map {} ({}, {})", m.name, m.node.name, m.node.dev);
    }
    outln!(
        "{} of {} path(s) in {:.1} ms",
        found,
        paths.len(),
        elapsed.as_secs_f64() * 1e3
    );
}

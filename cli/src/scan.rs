//! `lunkit scan hctl|iscsi|fc`: bring one LUN in and print its path devices.

use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use lunkit::udev::UdevState;
use lunkit::{Hctl, PathDevice, Root, ScanOptions, Wwid, Wwn};
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
    /// Scan one LUN through every online FC remote port of a target WWPN.
    Fc {
        /// Target port WWPN (0x…, bare hex, or colon-separated).
        #[arg(long)]
        wwpn: Wwn,
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
    /// Also wait until udevd has processed each device (its /dev/disk/by-* links exist);
    /// reported as "not running" when there is no udevd.
    #[arg(long)]
    wait_udev: bool,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct Out {
    devices: Vec<Device>,
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
struct Udev {
    /// `processed` or `not running`.
    state: &'static str,
    links: Vec<String>,
}

pub fn run(root: &Root, cmd: Scan) -> lunkit::Result<()> {
    let common = match &cmd {
        Scan::Hctl { common, .. } | Scan::Iscsi { common, .. } | Scan::Fc { common, .. } => common,
    };
    let opts = ScanOptions {
        timeout: crate::seconds(common.timeout)?,
        expect_wwid: common.expect_wwid.clone(),
    };
    let json = common.json;
    let start = Instant::now();
    let paths = match &cmd {
        Scan::Hctl { hctl, .. } => vec![lunkit::scsi::scan(root, *hctl, &opts)?],
        Scan::Iscsi {
            target,
            portals,
            lun,
            ..
        } => lunkit::iscsi::scan(root, target, portals, *lun, &opts)?,
        Scan::Fc {
            wwpn,
            initiators,
            lun,
            wildcard,
            ..
        } => lunkit::fc::scan(root, *wwpn, initiators, *lun, *wildcard, &opts)?,
    };
    let udev = if common.wait_udev {
        let devs: Vec<(String, lunkit::DevNum)> =
            paths.iter().map(|p| (p.name.clone(), p.dev)).collect();
        let states = lunkit::udev::wait_processed(
            root,
            &devs,
            lunkit::wait::deadline_from(start, opts.timeout),
        )?;
        Some(
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
        )
    } else {
        None
    };
    print(&paths, udev, start.elapsed(), json);
    Ok(())
}

fn print(paths: &[PathDevice], udev: Option<Vec<Udev>>, elapsed: Duration, json: bool) {
    let mut udev = udev.map(Vec::into_iter);
    if json {
        let out = Out {
            devices: paths
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
            elapsed_us: elapsed.as_micros(),
        };
        println!(
            "{}",
            serde_json::to_string_pretty(&out).expect("scan JSON serializes")
        );
    } else {
        for p in paths {
            let u = udev
                .as_mut()
                .and_then(Iterator::next)
                .map_or(String::new(), |u| {
                    format!("  udev {} {}", u.state, u.links.join(" "))
                });
            println!(
                "{}  {}  {}  {}{}",
                p.hctl,
                p.dev_path.display(),
                p.dev,
                p.wwid.as_ref().map_or("-".into(), ToString::to_string),
                u.trim_end()
            );
        }
        println!(
            "{} path(s) in {:.1} ms",
            paths.len(),
            elapsed.as_secs_f64() * 1e3
        );
    }
}

//! `lunkit attach`: bring a volume in on every path at once, named as for `detach`.

use std::time::Instant;

use clap::Args;
use lunkit::ops::{self, AttachOptions, AttachedFamily};
use lunkit::{Hctl, Root, Wwn};

use crate::json::scan::Udev;
use crate::json::{self, Layout};
use crate::scan::{Common, print, wait_udev};
use crate::teardown::{AddressArgs, NVME, SCSI};

/// Options of another transport than the chosen volume's are refused by name.
const NOT_FC: [&str; 3] = ["hctl", "iscsi_target", "nvme_nqn"];
const NOT_NVME: [&str; 3] = ["hctl", "iscsi_target", "fc_wwpn"];

/// `lunkit attach`: where to scan (an H:C:T:L, an iSCSI or FC target and LUN) or which NVMe
/// namespace to connect; a device or a WWID says what a volume is, not where it is, and is
/// not taken.
#[derive(Args)]
#[command(group = clap::ArgGroup::new("volume").required(true).args(["hctl", "iscsi_target", "fc_wwpn", "nvme_nqn"]))]
#[command(group = clap::ArgGroup::new("nvme_namespace").args(["nsid", "nguid"]))]
pub struct Attach {
    /// The LUN's SCSI address, when its host, channel and target are known (as `scan hctl`).
    #[arg(value_name = "H:C:T:L", conflicts_with_all = ["lun", "nsid", "nguid"])]
    hctl: Option<Hctl>,
    #[command(flatten)]
    address: AddressArgs,
    /// iSCSI: only sessions through this portal (ADDR:PORT, an IPv6 address in brackets);
    /// NVMe: connect this portal if it is not connected yet. Repeatable.
    #[arg(long = "portal", value_name = "ADDR:PORT", conflicts_with_all = ["hctl", "fc_wwpn"])]
    portals: Vec<String>,
    /// iSCSI: only sessions logged in through this open-iscsi iface (`default`, or an iface
    /// record's name, as `iscsiadm -m session -P 1` shows it). Repeatable.
    #[arg(long = "iscsi-iface", value_name = "IFACE", requires = "iscsi_target")]
    iscsi_ifaces: Vec<String>,
    /// NVMe: ask the discovery service at ADDR (port 8009 unless given; an IPv6 address in
    /// brackets with a port) for the subsystem's paths, referrals followed, and connect every
    /// TCP path it lists with the --portal ones. Repeatable.
    #[arg(long = "discover", value_name = "ADDR[:PORT]", requires = "nvme_nqn", conflicts_with_all = NOT_NVME, help_heading = NVME)]
    discover: Vec<String>,
    /// FC: only through this local port (initiator WWPN); repeatable.
    #[arg(long = "initiator", value_name = "WWPN", conflicts_with_all = NOT_FC, help_heading = SCSI)]
    initiators: Vec<Wwn>,
    /// Also wait until multipathd has built the volume's map with every path that came (a
    /// SCSI LUN: an NVMe namespace has the kernel's native multipath, no map).
    #[arg(long, conflicts_with = "nvme_nqn", help_heading = SCSI)]
    wait_map: bool,
    /// NVMe: this host's NQN for the connects (default: /etc/nvme/hostnqn under --root).
    #[arg(long, value_name = "NQN", conflicts_with_all = NOT_NVME, help_heading = NVME)]
    hostnqn: Option<String>,
    /// NVMe: this host's id, a UUID (default: /etc/nvme/hostid under --root, if any).
    #[arg(long, value_name = "UUID", requires = "hostnqn", conflicts_with_all = NOT_NVME, help_heading = NVME)]
    hostid: Option<String>,
    /// NVMe: a file holding the host's DH-HMAC-CHAP secret (`DHHC-1:…`) for every connect:
    /// read here, never taken on the command line, where any user could read it.
    #[arg(long, value_name = "FILE", requires = "nvme_nqn", conflicts_with_all = NOT_NVME, help_heading = NVME)]
    dhchap_secret_file: Option<std::path::PathBuf>,
    /// NVMe: a file holding the controller's secret: each controller must prove itself
    /// with it.
    #[arg(long, value_name = "FILE", requires = "dhchap_secret_file", conflicts_with_all = NOT_NVME, help_heading = NVME)]
    dhchap_ctrl_secret_file: Option<std::path::PathBuf>,
    #[command(flatten)]
    common: Common,
}

pub fn run(root: &Root, cmd: Attach) -> lunkit::Result<()> {
    let spec = match cmd.hctl {
        Some(h) => ops::VolumeSpec::Device(h.to_string()),
        None => cmd
            .address
            .spec()?
            .expect("clap requires an H:C:T:L or an address"),
    };
    let nvme = matches!(spec, ops::VolumeSpec::Nvme { .. });
    let mut opts = AttachOptions::new(root);
    opts.scan = cmd.common.options()?;
    opts.scsi.fc_initiators = cmd.initiators;
    opts.scsi.wait_map = cmd.wait_map;
    if let Some(nqn) = &cmd.hostnqn {
        opts.nvme.host = Some(lunkit::nvme::Host {
            nqn: nqn.parse()?,
            id: cmd.hostid.as_deref().map(str::parse).transpose()?,
        });
    }
    // `--portal` is the sessions to scan through for iSCSI, the portals to connect for NVMe.
    if nvme {
        opts.nvme.connect = cmd
            .portals
            .iter()
            .map(|p| lunkit::nvme::parse_portal(p))
            .collect::<lunkit::Result<_>>()?;
        opts.nvme.discover = cmd
            .discover
            .iter()
            .map(|a| lunkit::nvme::discovery::parse_address(a))
            .collect::<lunkit::Result<_>>()?;
        let secret = |f: &Option<std::path::PathBuf>| f.as_deref().map(crate::nvme::secret);
        opts.nvme.dhchap_secret = secret(&cmd.dhchap_secret_file).transpose()?;
        opts.nvme.dhchap_ctrl_secret = secret(&cmd.dhchap_ctrl_secret_file).transpose()?;
    } else {
        opts.scsi.iscsi_portals = cmd
            .portals
            .iter()
            .map(|p| crate::ids::iscsi_portal(p))
            .collect::<lunkit::Result<_>>()?;
        opts.scsi.iscsi_ifaces = cmd.iscsi_ifaces.clone();
    }
    let start = Instant::now();
    let volume = ops::attach(root, &spec, &opts)?;
    match &volume.family {
        AttachedFamily::Nvme(nvme) => {
            let udev = wait_udev(
                root,
                &cmd.common,
                nvme.devices.iter().map(|d| (d.name.clone(), d.dev)),
                start,
                opts.scan.timeout,
            )?;
            print_nvme(
                volume.wwid.as_ref(),
                nvme,
                udev,
                start.elapsed(),
                cmd.common.json,
            );
        }
        AttachedFamily::Scsi(scsi) => {
            let udev = wait_udev(
                root,
                &cmd.common,
                scsi.devices().map(|d| (d.name.clone(), d.dev)),
                start,
                opts.scan.timeout,
            )?;
            print(
                &scsi.paths,
                scsi.map.as_ref(),
                udev,
                start.elapsed(),
                cmd.common.json,
            );
        }
        _ => unreachable!("lunkit attaches SCSI LUNs and NVMe namespaces only"),
    }
    Ok(())
}

/// An NVMe attach: what each discovery service listed, each portal's connect, then the
/// namespace's devices.
fn print_nvme(
    wwid: Option<&lunkit::Wwid>,
    nvme: &ops::NvmeAttachment,
    udev: Option<Vec<Udev>>,
    elapsed: std::time::Duration,
    json: bool,
) {
    if json {
        let doc = json::attach::NvmeAttach::new(wwid, nvme, udev, elapsed);
        json::print(&doc, Layout::Pretty);
        return;
    }
    let udev_of = |i: usize| udev.as_ref().and_then(|u| u.get(i));
    for d in &nvme.discovery {
        outln!("{d}");
    }
    for p in &nvme.portals {
        let found = if p.discovered { " [discovered]" } else { "" };
        outln!("{p}{found}");
    }
    for (i, d) in nvme.devices.iter().enumerate() {
        let u = udev_of(i).map_or(String::new(), |u| {
            format!("  udev {} {}", u.state, u.links.join(" "))
        });
        outln!(
            "/dev/{} ({}) WWID {} via {}{}",
            d.name,
            d.dev,
            wwid.map_or_else(|| "none".to_owned(), ToString::to_string),
            nvme.controllers.join(", "),
            u.trim_end()
        );
    }
    outln!("attached in {:.1} ms", elapsed.as_secs_f64() * 1e3);
}

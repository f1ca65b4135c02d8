//! `lunkit flush`, `lunkit delete` and `lunkit detach`: taking devices and volumes off.

use std::time::{Duration, Instant};

use clap::Args;
use lunkit::block;
use lunkit::ops::{self, DetachOptions, NamespaceSelector, Step, VolumeSpec};
use lunkit::scsi::{self, DeleteOptions, Deleted};
use lunkit::{Error, Hctl, Root};

use crate::json::{self, Layout};

/// `lunkit flush`.
#[derive(Args)]
pub struct Flush {
    /// The device: a /dev path, a kernel name (sdc, dm-0) or an H:C:T:L.
    device: String,
    /// Give up after this many seconds (a dead device may never complete its writes).
    #[arg(long, default_value_t = 30.0, value_name = "SECS")]
    timeout: f64,
    /// Print the result as one JSON object.
    #[arg(long)]
    json: bool,
}

/// `lunkit delete`.
#[derive(Args)]
pub struct Delete {
    /// The SCSI device: a /dev path, a kernel name (sdc) or an H:C:T:L.
    device: String,
    /// Delete even when it is in use or its flush fails (its I/O then fails).
    #[arg(long)]
    force: bool,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 30.0, value_name = "SECS")]
    timeout: f64,
    /// Print the result as one JSON object.
    #[arg(long)]
    json: bool,
}

/// The `--help` heading of the options that name or reach a SCSI LUN.
pub const SCSI: &str = "A SCSI LUN (iSCSI, FC)";
/// The `--help` heading of the options that name or reach an NVMe namespace.
pub const NVME: &str = "An NVMe namespace";

/// The options that belong to SCSI LUNs only, refused with an NVMe namespace.
pub const SCSI_ONLY: [&str; 3] = ["iscsi_target", "fc_wwpn", "lun"];
/// The options that belong to NVMe namespaces only, refused with a SCSI LUN.
pub const NVME_ONLY: [&str; 3] = ["nvme_nqn", "nsid", "nguid"];

/// Where a volume is reached: an iSCSI or FC target and a LUN, or an NVMe subsystem and a
/// namespace. `attach` takes these only; `detach` and `resize` also take a device or a WWID
/// ([`VolumeArgs`]). The command's `volume` group requires one kind; an option of another
/// kind is refused by name, never ignored.
#[derive(Args)]
#[group(skip)]
pub struct AddressArgs {
    /// The iSCSI target's name (with --lun): iqn.yyyy-mm.<reverse domain>[:<name>],
    /// eui.<16 hex digits> or naa.<16 or 32 hex digits>.
    #[arg(long, value_name = "IQN", requires = "lun", help_heading = SCSI)]
    iscsi_target: Option<String>,
    /// The FC target's port name (with --lun), 16 hex digits (0x…, bare, or colon-separated);
    /// repeat it, or separate with commas, for a target reached through several ports.
    #[arg(
        long,
        value_name = "WWPN",
        requires = "lun",
        value_delimiter = ',',
        help_heading = SCSI
    )]
    fc_wwpn: Vec<String>,
    /// The LUN, with --iscsi-target or --fc-wwpn.
    #[arg(long, value_name = "LUN", conflicts_with_all = NVME_ONLY, help_heading = SCSI)]
    lun: Option<u64>,
    /// The NVMe subsystem's NQN (with --nsid or --nguid): nqn.yyyy-mm.<reverse domain>[:<name>].
    #[arg(long, value_name = "NQN", requires = "nvme_namespace", help_heading = NVME)]
    nvme_nqn: Option<String>,
    /// The NVMe namespace id, with --nvme-nqn.
    #[arg(
        long,
        value_name = "N",
        requires = "nvme_nqn",
        conflicts_with_all = SCSI_ONLY,
        help_heading = NVME
    )]
    nsid: Option<u32>,
    /// The NVMe namespace's NGUID, with --nvme-nqn: 32 hex digits (as `nvme id-ns` prints
    /// it), 8-4-4-4-12 (as sysfs does) or eui.<32 hex digits>.
    #[arg(
        long,
        value_name = "NGUID",
        requires = "nvme_nqn",
        conflicts_with_all = SCSI_ONLY,
        help_heading = NVME
    )]
    nguid: Option<String>,
}

impl AddressArgs {
    /// The volume these name, every value checked; `None` when none was given.
    pub fn spec(self) -> lunkit::Result<Option<VolumeSpec>> {
        Ok(Some(if let Some(target) = self.iscsi_target {
            VolumeSpec::Iscsi {
                target: crate::ids::iscsi_name(&target)?,
                lun: self.lun.unwrap_or_default(),
            }
        } else if !self.fc_wwpn.is_empty() {
            VolumeSpec::Fc {
                wwpns: self
                    .fc_wwpn
                    .iter()
                    .map(|w| w.parse())
                    .collect::<lunkit::Result<_>>()?,
                lun: self.lun.unwrap_or_default(),
            }
        } else if let Some(n) = self.nvme_nqn {
            VolumeSpec::Nvme {
                nqn: n.parse()?,
                namespace: match (self.nsid, self.nguid) {
                    (Some(id), _) => NamespaceSelector::Id(id),
                    (None, Some(g)) => NamespaceSelector::Nguid(g.parse()?),
                    (None, None) => unreachable!("clap requires --nsid or --nguid with --nvme-nqn"),
                },
            }
        } else {
            return Ok(None);
        }))
    }
}

/// How `detach` and `resize` name a volume: a device, a WWID or an address (one of them;
/// clap's group on the command requires exactly one).
#[derive(Args)]
#[group(skip)]
pub struct VolumeArgs {
    /// A device of the volume: /dev/sdc, /dev/mapper/mpatha, dm-0, a map name, an H:C:T:L.
    #[arg(conflicts_with_all = ["lun", "nsid", "nguid"])]
    device: Option<String>,
    /// The volume's WWID: naa.<hex>, eui.<hex> or t10.<text> as sysfs shows it, or
    /// multipath's 3<hex>, 2<hex>, 1<text> or 8<SCSI name string>.
    #[arg(long, value_name = "WWID", conflicts_with_all = ["lun", "nsid", "nguid"])]
    wwid: Option<String>,
    #[command(flatten)]
    address: AddressArgs,
}

impl VolumeArgs {
    pub fn spec(self) -> lunkit::Result<VolumeSpec> {
        Ok(if let Some(d) = self.device {
            VolumeSpec::Device(d)
        } else if let Some(w) = self.wwid {
            VolumeSpec::Wwid(crate::ids::wwid(&w)?)
        } else {
            self.address
                .spec()?
                .expect("clap requires one of the volume arguments")
        })
    }
}

/// `lunkit detach`.
#[derive(Args)]
#[command(group = clap::ArgGroup::new("volume").required(true).args(["device", "wwid", "iscsi_target", "fc_wwpn", "nvme_nqn"]))]
#[command(group = clap::ArgGroup::new("nvme_namespace").args(["nsid", "nguid"]))]
pub struct Detach {
    #[command(flatten)]
    volume: VolumeArgs,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 60.0, value_name = "SECS")]
    timeout: f64,
    /// Go on past refusals (in use, no active path) and failed flushes: data in flight is lost.
    #[arg(long)]
    force: bool,
    /// Lock the volume within this process only, not with a file under /run/lunkit/locks.
    #[arg(long)]
    no_lock_file: bool,
    /// Print the report as one JSON object (also on failure).
    #[arg(long)]
    json: bool,
}

pub fn flush(root: &Root, cmd: Flush) -> lunkit::Result<()> {
    let deadline = lunkit::wait::deadline_after(crate::seconds(cmd.timeout)?);
    let node = block::resolve(root, &cmd.device)?.ok_or_else(|| Error::NotFound {
        what: no_device(&cmd.device),
    })?;
    let t0 = Instant::now();
    block::flush(&node, deadline)?;
    if cmd.json {
        json::print(
            &json::teardown::Flush::new(&node, t0.elapsed()),
            Layout::Line,
        );
    } else {
        outln!("{node} ({}) flushed in {}", node.dev, ms(t0.elapsed()));
    }
    Ok(())
}

pub fn delete(root: &Root, cmd: Delete) -> lunkit::Result<()> {
    let mut opts = DeleteOptions::default();
    opts.timeout = crate::seconds(cmd.timeout)?;
    opts.force = cmd.force;
    let hctl = scsi_address(root, &cmd.device)?;
    let t0 = Instant::now();
    let deleted = scsi::delete(root, hctl, &opts)?;
    if cmd.json {
        let doc = json::teardown::Delete::new(hctl, &deleted, t0.elapsed());
        json::print(&doc, Layout::Line);
        return Ok(());
    }
    match deleted {
        Deleted::Now => outln!("{hctl} deleted in {}", ms(t0.elapsed())),
        Deleted::AlreadyGone => outln!("{hctl} already gone"),
    }
    Ok(())
}

/// The SCSI address a `delete` argument names. An H:C:T:L is taken as it is (it may be gone
/// already); a device must exist and be a SCSI disk.
fn scsi_address(root: &Root, device: &str) -> lunkit::Result<Hctl> {
    if let Ok(h) = device.parse::<Hctl>() {
        return Ok(h);
    }
    let node = block::resolve(root, device)?.ok_or_else(|| Error::NotFound {
        what: no_device(device),
    })?;
    block::scsi_address(root, &node).ok_or_else(|| {
        Error::invalid(
            "SCSI device",
            device,
            "not a SCSI disk (a partition, a dm device or another kind of disk)",
        )
    })
}

pub fn detach(root: &Root, cmd: Detach) -> lunkit::Result<()> {
    let spec = cmd.volume.spec()?;
    let mut opts = DetachOptions::new(root);
    opts.timeout = crate::seconds(cmd.timeout)?;
    opts.force = cmd.force;
    if cmd.no_lock_file {
        opts.lock_dir = None;
    }
    let as_json = cmd.json;
    let mut steps: Vec<Step> = Vec::new();
    let t0 = Instant::now();
    let result = ops::detach_with(root, &spec, &opts, &mut |s| {
        if !as_json {
            outln!(
                "{:<13} {:<40} {} ({})",
                s.kind.as_str(),
                s.target,
                s.outcome,
                ms(s.duration)
            );
        }
        steps.push(s.clone());
    });
    if as_json {
        let doc = json::detach::Detach::new(&spec, &result, &steps, t0.elapsed());
        json::print(&doc, Layout::Line);
    } else if let Ok(r) = &result {
        outln!(
            "{spec}: detached in {} ({} round(s))",
            ms(r.duration),
            r.rounds
        );
    }
    result.map(|_| ())
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

/// The message for a device argument that names no block device of the node.
fn no_device(device: &str) -> String {
    format!(
        "no block device {device} on this node; give a /dev path, a kernel name (sdc, dm-0) or \
         an H:C:T:L, as `lunkit list` shows them"
    )
}

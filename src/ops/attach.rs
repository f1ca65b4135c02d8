//! Bringing a volume onto the node: scan its LUN on every path at once, check that every
//! path is the same volume, and optionally wait for multipathd's map over all of them.
//!
//! The counterpart of [`super::detach()`], named the same way ([`VolumeSpec`]). A volume is
//! attached through an address: an iSCSI target and LUN, an FC target and LUN, or an
//! H:C:T:L. A WWID or a device name says what a volume is, not where to scan for it, and is
//! refused.
//!
//! multipathd, not lunkit, builds the map (it owns the multipath configuration, and the node
//! has one multipath policy). [`AttachOptions::wait_map`] waits for it: a map whose uuid is
//! `mpath-<WWID>` with every path that came among its slaves, within the same deadline as the
//! scan.
//!
//! ```no_run
//! use lunkit::Root;
//! use lunkit::ops::{AttachOptions, VolumeSpec, attach};
//!
//! let root = Root::default();
//! let spec = VolumeSpec::Iscsi { target: "iqn.2003-01.org.example:array".into(), lun: 3 };
//! let mut opts = AttachOptions::new(&root);
//! opts.wait_map = true;
//! let volume = attach(&root, &spec, &opts)?;
//! for path in &volume.paths {
//!     println!("{path}");
//! }
//! if let Some(map) = &volume.map {
//!     println!("/dev/mapper/{} ({})", map.name, map.node.name);
//! }
//! # Ok::<(), lunkit::Error>(())
//! ```

use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::fc::FcLun;
use crate::id::Hctl;
use crate::id::Wwid;
use crate::id::Wwn;
use crate::iscsi::IscsiLun;
use crate::root::Root;
use crate::scan::{PathScan, ScanOptions, ScanReport};
use crate::sysfs;
use crate::uevent::{Monitor, Uevent};
use crate::wait;

use super::lock::VolumeLock;
use super::names;
use super::volume::{Identity, MapDevice, VolumeSpec, locate};

/// How [`attach`] behaves. [`AttachOptions::new`] remembers names in the lock directory
/// under the root, as detach expects; the default remembers nothing.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct AttachOptions {
    /// The scan: its deadline (which also bounds the map wait), the expected WWID and how
    /// many paths must come.
    pub scan: ScanOptions,
    /// iSCSI: only sessions through these portals (`addr:port`); empty for every session.
    /// NVMe: connect these portals (`addr:port`, `[v6addr]:port`) that are not connected
    /// yet; empty to use the controllers already connected.
    pub portals: Vec<String>,
    /// FC: only through these local ports (initiator WWPNs); empty for every port.
    pub initiators: Vec<Wwn>,
    /// Also wait until multipathd has built the volume's map with every path that came.
    pub wait_map: bool,
    /// The directory of detach's lock files ([`crate::ops::DetachOptions::lock_dir`]). Attach
    /// remembers there which WWID an iSCSI or FC target and LUN named, so that a later detach
    /// by the same name finds the volume's multipath map even once every path is gone. `None`
    /// (the default) remembers nothing; the CLI uses `<root>/run/lunkit/locks`.
    pub lock_dir: Option<std::path::PathBuf>,
    /// NVMe: this node's identity for the connects; `None` reads `/etc/nvme/hostnqn` and
    /// `/etc/nvme/hostid` under the root ([`crate::nvme::Host::from_node`]).
    pub nvme_host: Option<crate::nvme::Host>,
}

impl AttachOptions {
    /// The defaults, remembering names in `<root>/run/lunkit/locks`, where
    /// [`crate::ops::DetachOptions::new`] puts its lock files.
    pub fn new(root: &Root) -> AttachOptions {
        AttachOptions {
            lock_dir: Some(root.run("lunkit/locks")),
            ..AttachOptions::default()
        }
    }
}

/// A volume brought onto the node.
#[derive(Debug)]
pub struct Attachment {
    /// Its WWID, as its paths report it (they all agree).
    pub wwid: Option<Wwid>,
    /// Every path, scanned or skipped, with its outcome.
    pub paths: Vec<PathScan>,
    /// Its multipath map, when [`AttachOptions::wait_map`] asked for it.
    pub map: Option<MapDevice>,
    /// For an NVMe namespace, its devices, controllers and each portal's connect (`paths`
    /// is empty then).
    pub nvme: Option<super::nvme::NvmeAttachment>,
    /// How long the scan took.
    pub scan_elapsed: Duration,
    /// How long the whole attach took, the map wait included.
    pub elapsed: Duration,
}

impl Attachment {
    /// The path devices that came, in path order.
    pub fn devices(&self) -> impl Iterator<Item = &crate::scsi::PathDevice> {
        self.paths.iter().filter_map(PathScan::device)
    }
}

/// Scans the volume's LUN on every path at once and returns every path's outcome, with the
/// multipath map when [`AttachOptions::wait_map`] is set.
///
/// It holds the volume's lock throughout, the one [`super::detach()`] and
/// [`super::resize()`] take (in this process, and across processes through
/// [`AttachOptions::lock_dir`]): named by the expected WWID, or by what a detach of the same
/// name would find, and once the scan has found the WWID, by it too. The lock wait counts
/// against the scan's timeout.
///
/// Errors: [`Error::Invalid`] for a spec that names no address (a WWID, a device path), and
/// the scan's ([`crate::scan`]): [`Error::MissingPaths`] when fewer than
/// [`ScanOptions::min_paths`] came, [`Error::WwidMismatch`] when a path is another volume,
/// [`Error::Timeout`] when the map did not come with every path by the deadline.
pub fn attach(root: &Root, spec: &VolumeSpec, opts: &AttachOptions) -> Result<Attachment> {
    if let VolumeSpec::Nvme { nqn, namespace } = spec {
        return super::nvme::attach(root, spec, nqn, namespace, opts);
    }
    let start = Instant::now();
    let deadline = wait::deadline_from(start, opts.scan.timeout);
    check_address(spec)?;
    let (mut locks, key) = lock(root, spec, opts, deadline)?;
    // The scan gets what the lock wait left of the deadline.
    let mut scan_opts = opts.clone();
    scan_opts.scan.timeout = deadline.saturating_duration_since(Instant::now());
    let report = scan(root, spec, &scan_opts)?;
    let scan_elapsed = report.elapsed;
    let wwid = report.wwid().cloned();
    if let Some(w) = wwid.as_ref().filter(|w| w.to_multipath() != key) {
        // Locked by address, found a WWID: a detach by that WWID, or by another of the
        // volume's names, must not run while this attach hands the volume out.
        locks.push(super::lock::lock(
            &w.to_multipath(),
            opts.lock_dir.as_deref(),
            deadline,
        )?);
    }
    if let (Some(dir), Some(w)) = (&opts.lock_dir, &wwid) {
        // A hint for a later detach; failing to write it does not undo the attach.
        let _ = super::names::remember(dir, spec, w);
    }
    let map = if opts.wait_map {
        Some(wait_map(root, wwid.as_ref(), &report, deadline)?)
    } else {
        None
    };
    Ok(Attachment {
        wwid,
        paths: report.paths,
        map,
        nvme: None,
        scan_elapsed,
        elapsed: start.elapsed(),
    })
}

/// Takes the volume's lock, as a detach or resize of it does (one operation per volume),
/// and returns it with the key it was taken under: the expected WWID when the caller gave
/// one, else the key a detach by the same name would take ([`names::identify`]: the WWID of
/// the devices at the address, or the one remembered for it, or the address itself).
fn lock(
    root: &Root,
    spec: &VolumeSpec,
    opts: &AttachOptions,
    deadline: Instant,
) -> Result<(Vec<VolumeLock>, String)> {
    let key = match &opts.scan.expect_wwid {
        Some(w) => w.to_multipath(),
        None => names::identify(root, spec, opts.lock_dir.as_deref())?.key(),
    };
    let held = super::lock::lock(&key, opts.lock_dir.as_deref(), deadline)?;
    Ok((vec![held], key))
}

fn scan(root: &Root, spec: &VolumeSpec, opts: &AttachOptions) -> Result<ScanReport> {
    match spec {
        VolumeSpec::Iscsi { target, lun } => {
            let lun = IscsiLun {
                target: target.clone(),
                portals: opts.portals.clone(),
                lun: *lun,
            };
            crate::iscsi::scan(root, &lun, &opts.scan)
        }
        VolumeSpec::Fc { wwpns, lun } => {
            let lun = FcLun {
                initiators: opts.initiators.clone(),
                ..FcLun::new(wwpns.clone(), *lun)
            };
            crate::fc::scan(root, &lun, &opts.scan)
        }
        VolumeSpec::Device(d) => match d.parse::<Hctl>() {
            Ok(hctl) => crate::scsi::scan_report(root, hctl, &opts.scan),
            Err(_) => Err(no_address(d)),
        },
        VolumeSpec::Wwid(w) => Err(no_address(&w.to_string())),
        // Attached by `super::nvme`, never scanned.
        VolumeSpec::Nvme { .. } => Err(no_address(&spec.to_string())),
    }
}

/// Refuses, before anything is looked up, a spec that says what a volume is rather than where
/// to scan for it: a WWID, or a device that is not an H:C:T:L.
fn check_address(spec: &VolumeSpec) -> Result<()> {
    match spec {
        VolumeSpec::Device(d) if d.parse::<Hctl>().is_err() => Err(no_address(d)),
        VolumeSpec::Wwid(w) => Err(no_address(&w.to_string())),
        _ => Ok(()),
    }
}

fn no_address(input: &str) -> Error {
    Error::invalid(
        "volume to attach",
        input,
        "attach needs an address to scan: an iSCSI target and LUN, an FC target and LUN, \
         or an H:C:T:L",
    )
}

/// Waits until a multipath map of `wwid` holds every device of `report`.
fn wait_map(
    root: &Root,
    wwid: Option<&Wwid>,
    report: &ScanReport,
    deadline: Instant,
) -> Result<MapDevice> {
    let disks: Vec<String> = report.devices().map(|p| p.name.clone()).collect();
    let Some(wwid) = wwid else {
        return Err(Error::NotFound {
            what: format!(
                "WWID of {} (a multipath map is keyed by it; the LUN has no VPD page 0x83)",
                disks.join(", ")
            ),
        });
    };
    let id = Identity {
        wwid: Some(wwid.clone()),
        addresses: Vec::new(),
    };
    let mut monitor = Monitor::open().ok();
    let what = || {
        format!(
            "multipath map of {} with paths {} (built by multipathd: is it running?)",
            wwid.to_multipath(),
            disks.join(", ")
        )
    };
    // multipathd creates the map (dm `add`), then reloads it as paths join (dm `change`).
    let relevant = |ev: &Uevent| ev.subsystem.as_deref() == Some("block");
    wait::until(monitor.as_mut(), deadline, &what, &relevant, || {
        for map in locate(root, &id)?.maps {
            let slaves = sysfs::block::slaves(root, &map.node.name)?;
            if disks.iter().all(|d| slaves.contains(d)) {
                return Ok(Some(map));
            }
        }
        Ok(None)
    })
}

//! The SCSI attach: one LUN scanned on every path at once, then, if asked, multipathd's map
//! awaited. What it does is told at [`crate::ops::attach()`].

use std::time::Instant;

use crate::error::{Error, Result};
use crate::fc::FcLun;
use crate::id::Hctl;
use crate::id::Wwid;
use crate::iscsi::IscsiLun;
use crate::root::Root;
use crate::scsi::scan::ScanReport;
use crate::uevent::{Subscription, Uevent};
use crate::wait;

use super::identify::identify_for_attach;
use super::locate::locate_until;
use crate::ops::lock::{self, VolumeLock};
use crate::ops::names;
use crate::ops::options::AttachOptions;
use crate::ops::report::{AttachedFamily, Attachment, MapDevice, ScsiAttachment};
use crate::ops::spec::{Identity, VolumeSpec};

/// Attaches the volume `spec`, named by a SCSI address ([`crate::ops::attach()`]).
pub(in crate::ops) fn attach(
    root: &Root,
    spec: &VolumeSpec,
    opts: &AttachOptions,
) -> Result<Attachment> {
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
        locks.push(lock::lock(
            &w.to_multipath(),
            opts.lock_dir.as_deref(),
            deadline,
        )?);
    }
    if let (Some(dir), Some(w)) = (&opts.lock_dir, &wwid) {
        // A hint for a later detach; failing to write it does not undo the attach.
        let _ = names::remember(dir, spec, w);
    }
    let map = if opts.scsi.wait_map {
        Some(wait_map(root, wwid.as_ref(), &report, deadline)?)
    } else {
        None
    };
    Ok(Attachment {
        wwid,
        family: AttachedFamily::Scsi(ScsiAttachment {
            paths: report.paths,
            map,
            scan_elapsed,
        }),
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
        None => identify_for_attach(root, spec, opts.lock_dir.as_deref(), deadline)?.key(),
    };
    let held = lock::lock(&key, opts.lock_dir.as_deref(), deadline)?;
    Ok((vec![held], key))
}

fn scan(root: &Root, spec: &VolumeSpec, opts: &AttachOptions) -> Result<ScanReport> {
    match spec {
        VolumeSpec::Iscsi { target, lun } => {
            let lun = IscsiLun {
                target: target.clone(),
                portals: opts.scsi.iscsi_portals.clone(),
                ifaces: opts.scsi.iscsi_ifaces.clone(),
                lun: *lun,
            };
            crate::iscsi::scan(root, &lun, &opts.scan)
        }
        VolumeSpec::Fc { wwpns, lun } => {
            let lun = FcLun {
                initiators: opts.scsi.fc_initiators.clone(),
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
                "{} report no WWID (the LUN has no VPD page 0x83), and multipath keys its \
                 maps by it; attach without waiting for a map (`wait_map`, the CLI's \
                 --wait-map), or give the LUN a device identifier on the target",
                disks.join(", ")
            ),
        });
    };
    let id = Identity {
        wwid: Some(wwid.clone()),
        addresses: Vec::new(),
    };
    let mut monitor = Subscription::open().ok();
    let what = || {
        format!(
            "multipath map of {} with paths {} (built by multipathd: is it running?)",
            wwid.to_multipath(),
            disks.join(", ")
        )
    };
    // multipathd creates the map (dm `add`), then reloads it as paths join (dm `change`):
    // a dm device's events, not every disk's (many attaches may run at once).
    let relevant = |ev: &Uevent| {
        ev.subsystem.as_deref() == Some("block")
            && ev.devname.as_deref().is_some_and(|n| n.starts_with("dm-"))
    };
    wait::until(monitor.as_mut(), deadline, &what, &relevant, || {
        for map in locate_until(root, &id, deadline)?.maps {
            let slaves = crate::block::sysfs::slaves(root, &map.node.name)?;
            if disks.iter().all(|d| slaves.contains(d)) {
                return Ok(Some(map));
            }
        }
        Ok(None)
    })
    // The paths are on the node whatever became of the map: say which, and their WWID.
    .map_err(|e| Error::MapWait {
        wwid: wwid.clone(),
        paths: disks.clone(),
        source: Box::new(e),
    })
}

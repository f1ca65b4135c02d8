//! What iSCSI and FC volumes share: a SCSI LUN attached on every path, then multipathd's map,
//! and a LUN with another WWID than the volume's refused. Both transports' modules use it;
//! it uses neither.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use lunkit::block::BlockNode;
use lunkit::ops::{self, AttachOptions, DetachOptions, VolumeSpec};
use lunkit::{Root, Wwid};

use crate::error::{Error, Result};
use crate::log::{self, Level};
use crate::mpath;
use crate::node::device::{attach_recorded, detach_recorded, finding};
use crate::node::volume::abnormal;
use crate::node::{Inner, prefix};
use crate::proto::VolumeCondition;
use crate::stale::Presence;
use crate::state::Record;
use lunkit::scsi::sysfs::ScsiState;

/// The SCSI addresses with a device now.
pub(crate) fn scsi_addresses(root: &Root) -> Result<HashSet<lunkit::Hctl>> {
    Ok(lunkit::scsi::sysfs::devices(root)
        .map_err(|e| Error::lunkit("reading the SCSI devices", e))?
        .into_iter()
        .map(|d| d.hctl)
        .collect())
}

/// The WWID of the LUN found at the volume's address when a scan refused it for not being
/// the volume.
pub(crate) fn mismatched_wwid(e: &lunkit::Error) -> Option<&Wwid> {
    match e {
        lunkit::Error::WwidMismatch { actual, .. } => actual.as_ref(),
        lunkit::Error::Step { source, .. } => mismatched_wwid(source),
        _ => None,
    }
}

impl Inner {
    /// `ops::attach` of a SCSI LUN on every path, then multipathd's map when multipathd
    /// runs; returns the device to hand out (the map, or the single path). The WWID the
    /// scan found is recorded before the map is waited for, so that an unstage after a
    /// timeout there detaches by it. A LUN that reports another WWID than expected is
    /// refused, and its devices this call brought in are taken out again.
    pub(crate) fn attach_scsi(
        &self,
        id: &str,
        spec: &VolumeSpec,
        mut opts: AttachOptions,
        record: &mut Record,
        deadline: Instant,
    ) -> Result<BlockNode> {
        let root = self.root();
        let mut multipathd =
            lunkit::multipath::Multipathd::connect(root, Instant::now() + Duration::from_secs(2))
                .ok()
                .flatten();
        opts.scan.timeout = deadline.saturating_duration_since(Instant::now());
        opts.scsi.wait_map = false;
        let what = format!("volume {id}: attach {spec}");
        let before = scsi_addresses(root)?;
        let a = match attach_recorded(root, spec, &opts) {
            Ok(a) => a,
            Err(e) => return Err(self.refused_attach(id, &what, e, &before)),
        };
        let wwid = a.wwid.clone();
        record.wwid = wwid.as_ref().map(Wwid::to_multipath);
        self.store.save(record)?;
        let disks: Vec<String> = a
            .scsi()
            .iter()
            .flat_map(|s| s.devices())
            .map(|p| p.name.clone())
            .collect();
        if let Some(md) = multipathd.as_mut() {
            let wwid = wwid.ok_or_else(|| {
                Error::FailedPrecondition(format!(
                    "{what}: {} report no WWID (no VPD page 0x83), and multipathd keys its maps by it",
                    disks.join(", ")
                ))
            })?;
            // Whatever find_multipaths says: multipathd is asked for the map, and a path it
            // blacklists is never waited for.
            match mpath::map_of(root, md, &wwid, &disks, deadline).map_err(|e| prefix(&what, e))? {
                Some(map) => {
                    self.record_device(record, &map, true)?;
                    return Ok(map);
                }
                None => log::note(
                    Level::Warn,
                    &format!(
                        "{what}: multipathd blacklists {}; the volume is used on its path device",
                        disks.join(", ")
                    ),
                ),
            }
        }
        let first = disks
            .first()
            .ok_or_else(|| Error::NotFound(format!("{what}: no path came")))?;
        let device = lunkit::block::by_name(root, first)
            .map_err(|e| Error::lunkit(what.clone(), e))?
            .ok_or_else(|| Error::NotFound(format!("{what}: {first} went away")))?;
        self.record_device(record, &device, false)?;
        Ok(device)
    }

    /// The error of an attach that failed. A LUN with another WWID than the volume's is
    /// `FAILED_PRECONDITION`, and the devices of that WWID are taken out again when every
    /// one of them came in this call (an address `before` did not have) and no other
    /// volume of this node is known by that WWID.
    pub(crate) fn refused_attach(
        &self,
        id: &str,
        what: &str,
        e: lunkit::Error,
        before: &HashSet<lunkit::Hctl>,
    ) -> Error {
        let Some(actual) = mismatched_wwid(&e).cloned() else {
            return Error::lunkit(what.to_owned(), e);
        };
        let root = self.root();
        let key = actual.to_multipath();
        let mut cleanup = String::new();
        let ours = self.store.all().map(|all| {
            !all.iter()
                .any(|r| r.volume_id != id && r.known_wwid() == Some(key.as_str()))
        });
        let state = ops::volume::identify(root, &VolumeSpec::Wwid(actual.clone()))
            .and_then(|i| ops::volume::locate(root, &i));
        match (ours, state) {
            (Ok(true), Ok(s)) if s.paths.iter().all(|p| !before.contains(&p.hctl)) => {
                let opts = DetachOptions::new(root);
                cleanup = match detach_recorded(root, &VolumeSpec::Wwid(actual), &opts) {
                    Ok(_) => "; its devices that this stage brought in were taken out".into(),
                    Err(d) => format!("; taking its devices out again failed: {d}"),
                };
            }
            _ => cleanup.push_str("; its devices were there before this stage and are left"),
        }
        Error::FailedPrecondition(format!("{what}: refused: {e}{cleanup}"))
    }
}

/// A SCSI volume's device now, found by its WWID: its map, else (unless it was staged on a
/// map) its first path's disk. `None` before the stage learned the WWID, or when nothing of
/// it is on the node.
pub(crate) fn device_of(root: &Root, record: &Record) -> Result<Option<BlockNode>> {
    let what = || finding(record);
    let Some(wwid) = record.wwid.as_deref() else {
        return Ok(None);
    };
    let wwid: Wwid = wwid
        .parse()
        .map_err(|e| Error::lunkit(format!("volume {}: its record", record.volume_id), e))?;
    let state = ops::volume::identify(root, &VolumeSpec::Wwid(wwid))
        .and_then(|i| ops::volume::locate(root, &i))
        .map_err(|e| Error::lunkit(what(), e))?;
    if let Some(m) = state.maps.first() {
        return Ok(Some(m.node.clone()));
    }
    if record.map {
        return Ok(None);
    }
    Ok(state.paths.into_iter().find_map(|p| p.disk))
}

/// Whether a SCSI volume is on the node: any path or map with its known WWID (the one its
/// paths reported, else the one its attributes named); `Unknown` without one.
pub(crate) fn presence(root: &Root, record: &Record) -> Result<Presence> {
    let what = || finding(record);
    let Some(Ok(wwid)) = record.known_wwid().map(str::parse::<Wwid>) else {
        return Ok(Presence::Unknown);
    };
    let state = ops::volume::identify(root, &VolumeSpec::Wwid(wwid))
        .and_then(|i| ops::volume::locate(root, &i))
        .map_err(|e| Error::lunkit(what(), e))?;
    if state.maps.is_empty() && state.paths.is_empty() {
        return Ok(Presence::Gone);
    }
    let dev = match state.maps.first() {
        Some(m) => Some(m.node.dev),
        None if record.map => None,
        None => state
            .paths
            .iter()
            .find_map(|p| p.disk.as_ref().map(|d| d.dev)),
    };
    Ok(Presence::Here(dev))
}

/// Abnormal when a path of the volume is not running, or none is left.
pub(crate) fn condition(root: &Root, record: &Record) -> VolumeCondition {
    let Some(Ok(wwid)) = record.wwid.as_deref().map(str::parse) else {
        return abnormal("the volume's WWID is not known".into());
    };
    let state = ops::volume::identify(root, &VolumeSpec::Wwid(wwid))
        .and_then(|id| ops::volume::locate(root, &id));
    match state {
        Err(e) => abnormal(format!("cannot look at the volume's paths: {e}")),
        Ok(s) if s.paths.is_empty() => abnormal("no path of the volume is left".into()),
        Ok(s) => {
            let down: Vec<String> = s
                .paths
                .iter()
                .filter(|p| p.state != Some(ScsiState::Running))
                .map(|p| {
                    let state = p.state.as_ref().map_or("unknown", ScsiState::as_str);
                    format!("{} is {state}", p.hctl)
                })
                .collect();
            if down.is_empty() {
                VolumeCondition {
                    abnormal: false,
                    message: format!("{} paths running", s.paths.len()),
                }
            } else {
                abnormal(format!("path {}", down.join(", ")))
            }
        }
    }
}

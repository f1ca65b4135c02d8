//! What iSCSI and FC volumes share: a SCSI LUN attached on every path, then multipathd's map,
//! and a LUN with another WWID than the volume's refused. Both transports' modules use it;
//! it uses neither.

use std::time::{Duration, Instant};

use lunkit::block::BlockNode;
use lunkit::ops::volume::VolumeDevice;
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
        let a = match attach_recorded(root, spec, &opts) {
            Ok(a) => a,
            Err(e) => return Err(self.refused_attach(id, &what, e)),
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
    /// `FAILED_PRECONDITION`, and, when no other volume of this node is known by that WWID,
    /// the addresses the scan itself brought in ([`lunkit::Error::new_paths`]) are taken out
    /// again, and only those: the devices that were there before are someone else's.
    pub(crate) fn refused_attach(&self, id: &str, what: &str, e: lunkit::Error) -> Error {
        let Some(actual) = e.mismatched_wwid().cloned() else {
            return Error::lunkit(what.to_owned(), e);
        };
        let root = self.root();
        let key = actual.to_multipath();
        let new = e.new_paths();
        let ours = self.store.all().map(|all| {
            !all.iter()
                .any(|r| r.volume_id != id && r.known_wwid() == Some(key.as_str()))
        });
        let state = ops::volume::identify(root, &VolumeSpec::Wwid(actual.clone()))
            .and_then(|i| ops::volume::locate(root, &i));
        let opts = DetachOptions::new(root);
        let cleanup = match (ours, state) {
            (Ok(true), _) if new.is_empty() => {
                "; its devices were there before this stage and are left".to_owned()
            }
            // Every device of that WWID came in this call: the detach takes the map that
            // multipathd builds over them as they come (`find_multipaths no`) with them,
            // which deleting the paths alone could not (the map holds them).
            (Ok(true), Ok(s)) if s.paths.iter().all(|p| new.contains(&p.hctl)) => {
                match detach_recorded(root, &VolumeSpec::Wwid(actual), &opts, None) {
                    Ok(_) => "; its devices that this stage brought in were taken out".into(),
                    Err(d) => format!("; taking its devices out again failed: {d}"),
                }
            }
            // Some were there before: only the new addresses go, each refused while a map
            // or anything else holds it.
            (Ok(true), Ok(_)) => delete_new(root, new, &opts),
            _ => "; its devices were there before this stage and are left".to_owned(),
        };
        Error::FailedPrecondition(format!("{what}: refused: {e}{cleanup}"))
    }
}

/// Deletes the SCSI devices at `new` (what a refused scan brought in); what the refusal
/// says of them.
fn delete_new(root: &Root, new: &[lunkit::Hctl], opts: &DetachOptions) -> String {
    let mut d = lunkit::scsi::DeleteOptions::default();
    d.timeout = opts.timeout;
    let failed: Vec<String> = new
        .iter()
        .filter_map(|h| {
            lunkit::scsi::delete(root, *h, &d)
                .err()
                .map(|e| format!("{h}: {e}"))
        })
        .collect();
    if failed.is_empty() {
        "; its devices that this stage brought in were taken out, those there before are left"
            .into()
    } else {
        format!(
            "; taking its devices out again failed: {}",
            failed.join("; ")
        )
    }
}

/// A SCSI volume's device now, found by its WWID: its map, else (unless it was staged on a
/// map) its one path's disk, or with several paths and no map the first path's. `None`
/// before the stage learned the WWID, or when nothing of it is on the node. A map that holds
/// a path of the volume but is not the volume's alone (another WWID's, or of mixed paths) is
/// `None` too, where this once handed out a path of the volume the map did not hold: the
/// volume is then split between that map and its other paths, no one device of it is the
/// whole volume, and writes to one path bypass what the map serves (the library's
/// [`VolumeDevice::Mixed`] names no device for that reason).
pub(crate) fn device_of(root: &Root, record: &Record) -> Result<Option<BlockNode>> {
    let what = || finding(record);
    let Some(wwid) = record.wwid.as_deref() else {
        return Ok(None);
    };
    let wwid: Wwid = wwid
        .parse()
        .map_err(|e| Error::lunkit(format!("volume {}: its record", record.volume_id), e))?;
    let found =
        ops::volume::device(root, &VolumeSpec::Wwid(wwid)).map_err(|e| Error::lunkit(what(), e))?;
    Ok(match found {
        VolumeDevice::Map(m) => Some(m.node),
        VolumeDevice::Path(n) if !record.map => Some(n),
        VolumeDevice::Paths(p) if !record.map => p.into_iter().find_map(|p| p.disk),
        _ => None,
    })
}

/// Whether a SCSI volume is on the node: any path or map with its known WWID (the one its
/// paths reported, else the one its attributes named); `Unknown` without one. A volume seen
/// only under a map that is not its alone ([`VolumeDevice::Mixed`]: locate lists such paths
/// with that map, not as the volume's paths) is `Here`, with no device, where this once said
/// `Gone`: its path is on the node, and a cleanup that took the volume for gone would forget
/// it with that path still there.
pub(crate) fn presence(root: &Root, record: &Record) -> Result<Presence> {
    let what = || finding(record);
    let Some(Ok(wwid)) = record.known_wwid().map(str::parse::<Wwid>) else {
        return Ok(Presence::Unknown);
    };
    let found =
        ops::volume::device(root, &VolumeSpec::Wwid(wwid)).map_err(|e| Error::lunkit(what(), e))?;
    Ok(match found {
        VolumeDevice::Absent => Presence::Gone,
        VolumeDevice::Map(m) => Presence::Here(Some(m.node.dev)),
        VolumeDevice::Path(n) => Presence::Here((!record.map).then_some(n.dev)),
        VolumeDevice::Paths(p) => Presence::Here(
            p.iter()
                .find_map(|p| p.disk.as_ref().map(|d| d.dev))
                .filter(|_| !record.map),
        ),
        _ => Presence::Here(None),
    })
}

/// Abnormal when a path of the volume is not running, or none is left, or (a fenced
/// volume) a path carries no registration of this node's key ([`crate::fence_join`]).
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
            // A fenced volume's path that carries no registration of this node's key: a
            // write through it is refused (RESERVATION CONFLICT).
            let disks: Vec<&str> = s
                .paths
                .iter()
                .filter_map(|p| p.disk.as_ref().map(|d| d.name.as_str()))
                .collect();
            let unregistered: Vec<String> = crate::fence_join::of(&record.volume_id)
                .into_iter()
                .filter(|(d, _)| disks.contains(&d.as_str()))
                .map(|(d, why)| format!("{d} has no registration of this node's key ({why})"))
                .collect();
            if !down.is_empty() {
                abnormal(format!("path {}", down.join(", ")))
            } else if !unregistered.is_empty() {
                abnormal(format!("path {}", unregistered.join(", ")))
            } else {
                VolumeCondition {
                    abnormal: false,
                    message: format!("{} paths running", s.paths.len()),
                }
            }
        }
    }
}

//! `lun-gone`: a SCSI disk the kernel still has `running` whose LUN the array no longer
//! serves. sysfs cannot tell (the device stays `running`, its WWID cached), so each such
//! disk is asked: TEST UNIT READY ([`crate::scsi::sg_io::test_unit_ready`]), and an answer
//! of CHECK CONDITION, ILLEGAL REQUEST, 25/00 (LOGICAL UNIT NOT SUPPORTED) is the finding.
//!
//! Asking opens the disk, so it is done only when the examination may open and probe
//! devices ([`super::DoctorOptions::check_use`]; the CSI plugin's background look never
//! does). A disk that does not open, or does not answer within its time, is not a finding:
//! it is either another kind's (offline) or cannot be told apart from a slow LUN.

use std::time::{Duration, Instant};

use super::fix::{FixOutcome, verdict, wwid_changed};
use super::{Finding, Kind, usage};
use crate::block;
use crate::error::{Error, Result};
use crate::helper;
use crate::id::Hctl;
use crate::root::Root;
use crate::scsi::sg_io::{self, TurStatus};
use crate::scsi::sysfs::ScsiState;
use crate::scsi::{self, Deleted, PathIdentity};
use crate::topology::Topology;

/// How many disks are asked at once.
const PROBERS: usize = 4;

/// How long one disk's probe (its open and up to three commands) may take, at most; less
/// when the examination's deadline is nearer.
const PROBE_LIMIT: Duration = Duration::from_secs(10);

/// A disk to ask: `running`, a disk (type 0), with a block device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Candidate {
    pub hctl: Hctl,
    /// Its disk (`sdc`).
    pub disk: String,
    /// The WWID sysfs reports for it.
    pub wwid: Option<String>,
    /// The multipath map it is a path of: its name and `dm-N`.
    pub map: Option<(String, String)>,
}

/// The disks of `t` worth asking. Pure.
pub(super) fn candidates(t: &Topology) -> Vec<Candidate> {
    let maps: Vec<_> = t.multipath_maps().collect();
    t.scsi_devices
        .iter()
        .filter(|d| d.device_type == Some(0))
        .filter(|d| d.state.as_deref().map(ScsiState::parse) == Some(ScsiState::Running))
        .filter_map(|d| {
            let disk = d.block.clone()?;
            let map = maps
                .iter()
                .find(|m| m.paths.contains(&disk))
                .map(|m| (m.name.unwrap_or(m.dm).to_owned(), m.dm.to_owned()));
            Some(Candidate {
                hctl: d.hctl,
                disk,
                wwid: d.wwid.clone(),
                map,
            })
        })
        .collect()
}

/// The finding for candidate `c`, which answered `status`; `None` unless that says the LUN
/// is not served. Pure.
pub(super) fn finding(c: &Candidate, status: &TurStatus) -> Option<Finding> {
    if !status.lun_not_supported() {
        return None;
    }
    let mut objects = vec![c.hctl.to_string(), c.disk.clone()];
    let mut devices = vec![c.disk.clone()];
    if let Some((name, dm)) = &c.map {
        objects.push(name.clone());
        devices.push(dm.clone());
    }
    Some(Finding {
        kind: Kind::LunGone,
        objects,
        why: format!(
            "answers LOGICAL UNIT NOT SUPPORTED (ILLEGAL REQUEST 25/00): the array no longer \
             serves LUN {}",
            c.hctl.lun
        ),
        identity: c.wwid.clone(),
        devices,
        usage: None,
        since: None,
        queues: None,
    })
}

/// Asks every candidate of `t`, [`PROBERS`] at a time, and returns the findings, each with
/// its in-use check (a map's path together with its map: the map as the path's own holder,
/// its users as the path's).
///
/// # Errors
///
/// Those of the in-use check. A probe's own failure is no finding, not an error.
pub(super) fn examine(root: &Root, t: &Topology, deadline: Instant) -> Result<Vec<Finding>> {
    let all = candidates(t);
    let workers = PROBERS.min(all.len());
    let shares: Vec<Vec<&Candidate>> = (0..workers)
        .map(|w| all.iter().skip(w).step_by(workers).collect())
        .collect();
    let found = helper::fan_out("doctor-tur", &shares, |share| {
        Ok(share
            .iter()
            .filter_map(|c| finding(c, &ask(root, &c.disk, deadline)?))
            .collect::<Vec<_>>())
    });
    let mut v = Vec::new();
    for f in found.into_iter().flatten().flatten() {
        let u = usage(root, &f.devices, &f.devices[1..], deadline)?;
        v.push(Finding {
            usage: Some(u),
            ..f
        });
    }
    Ok(v)
}

/// What disk `name` answers to TEST UNIT READY, within [`PROBE_LIMIT`] and `deadline`;
/// `None` when it could not be asked (gone, not opening, not answering in time).
fn ask(root: &Root, name: &str, deadline: Instant) -> Option<TurStatus> {
    let node = block::by_name(root, name).ok()??;
    let deadline = deadline.min(crate::wait::deadline_after(PROBE_LIMIT));
    sg_io::test_unit_ready(&node, deadline).ok()
}

/// Deletes a disk whose LUN the array no longer serves, never a map: the WWID recorded is
/// checked against sysfs, the disk must still be the finding's and `running`, the in-use
/// check runs (a map's path with its map), a disk no map holds is claimed, and the disk is
/// asked again: one that answers otherwise now is [`FixOutcome::Changed`]. Then the
/// identity-checked `delete`.
pub(super) fn fix(root: &Root, f: &Finding, deadline: Instant) -> Result<FixOutcome> {
    let (Some(hctl), Some(disk)) = (f.objects.first(), f.objects.get(1)) else {
        return Err(Error::Internal {
            what: format!("{} finding without its objects: {:?}", f.kind, f.objects),
        });
    };
    let hctl: Hctl = hctl.parse()?;
    let expect = PathIdentity::of(root, hctl);
    if expect.device.is_none() {
        return Ok(FixOutcome::Gone);
    }
    if let Some(why) = wwid_changed(f.identity.as_deref(), expect.wwid.as_ref()) {
        return Ok(FixOutcome::Changed(why));
    }
    let node = match block::of_scsi_device(root, hctl)? {
        Some(n) if n.name == *disk => n,
        Some(n) => {
            return Ok(FixOutcome::Changed(format!(
                "its disk is {} now, was {disk}",
                n.name
            )));
        }
        None => {
            return Ok(FixOutcome::Changed(format!(
                "{disk} is gone, {hctl} is not"
            )));
        }
    };
    match scsi::sysfs::state(root, hctl) {
        Some(ScsiState::Running) => {}
        state => {
            let state = state
                .as_ref()
                .map_or("in an unknown state", ScsiState::as_str);
            return Ok(FixOutcome::Changed(format!("it is {state} now")));
        }
    }
    let own = f.devices.get(1..).unwrap_or_default();
    if let Some(left) = verdict(&usage(root, &f.devices, own, deadline)?) {
        return Ok(left);
    }
    // From the check to the delete nothing may start using it: a disk no map holds is
    // claimed (`O_EXCL`); a map's path is held exclusively by its map already.
    let _claim = match own.is_empty() {
        true => match block::try_claim(&node, deadline) {
            Ok(c) => c,
            Err(e) if e.errno() == Some(libc::EBUSY) => {
                return Ok(FixOutcome::InUse(format!("{disk} was claimed since: {e}")));
            }
            Err(e) => return Err(e),
        },
        false => None,
    };
    // Asked again after the in-use check, which takes a while: a LUN mapped back meanwhile
    // is a volume someone may want.
    let now = sg_io::test_unit_ready(&node, deadline)?;
    if !now.lun_not_supported() {
        return Ok(FixOutcome::Changed(format!(
            "it answers {now} to TEST UNIT READY now"
        )));
    }
    // No flush: the array no longer serves the LUN, so a cache flush (SYNCHRONIZE CACHE) and
    // any write-back would fail with the same sense; nothing cached for this disk can reach
    // the array any more. A map's path had its I/O retried by multipath on another path.
    Ok(match scsi::remove_device(root, hctl, &expect, deadline)? {
        Deleted::Now => FixOutcome::Fixed(format!(
            "deleted SCSI device {hctl} {disk} (not flushed: the array no longer serves the \
             LUN){}",
            match f.objects.get(2) {
                Some(map) => format!("; map {map} is left"),
                None => String::new(),
            }
        )),
        Deleted::AlreadyGone => FixOutcome::Gone,
    })
}

#[cfg(test)]
mod tests;

//! Findings over lunkit's own records in the lock directory (`ops/names.rs`): name records
//! (`names/`: the WWID an address was found to name) and NVMe attach marks (`attached/`).
//!
//! - `stale-name-record`: no device on the node carries the recorded WWID (no SCSI path, no
//!   multipath map, no NVMe namespace) and nothing is at the address. It names nothing; a
//!   detach by the address would find nothing by it. Fixed by removing the file.
//! - `remapped-address`: the devices at the address report another WWID than the record's:
//!   the array gave the LUN number (or namespace id) to another volume. Never fixed here:
//!   the devices may be a new volume someone attached, and the record is rewritten by the
//!   next attach or detach at that address.
//! - `stale-attach-mark`: no controller of the subsystem serves a namespace the mark selects.
//!   A mark keeps every controller of its subsystem through each detach of another
//!   namespace; a stale one keeps them for ever. The array may hide a namespace for a moment
//!   and show it again, so it is a finding only once it lasted past the grace (a
//!   recoverable state), and a plain `--fix` removes the file only when no controller of
//!   the subsystem is on the node any more; naming the kind removes it in any case.
//!
//! The classification ([`classify`]) is pure over a [`Topology`] and the records read
//! ([`read`]); the fix takes the locks an attach or detach of the volume takes, reads both
//! again under them, and removes the file only if it is still the same finding.

use std::path::Path;
use std::time::Instant;

use super::{Finding, Kind};
use crate::error::{Error, Result};
use crate::id::{Hctl, Nqn, Wwid};
use crate::ops::lock::{self, VolumeLock};
use crate::ops::names::{self, Named};
use crate::ops::nvme::subsystem_lock_key;
use crate::ops::spec::{NamespaceSelector, VolumeSpec};
use crate::root::Root;
use crate::topology::Topology;

use super::fix::FixOutcome;

/// Why a `remapped-address` finding is left even when asked for.
pub(crate) const REMAPPED: &str = "lunkit deletes no device for it: the devices at the address may \
     be a new volume someone attached. If a map of the recorded volume is still on the node, \
     detach it by its WWID (`lunkit detach --wwid WWID`); the record is rewritten by the next \
     attach or detach at that address";

/// What the lock directory holds: name records with the WWID each holds (an unreadable or
/// malformed one is left out: it recalls nothing), and attach marks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Records {
    /// Each name record and its WWID.
    pub(crate) names: Vec<(Named, Wwid)>,
    /// Each NVMe attach mark.
    pub(crate) marks: Vec<Named>,
}

/// Reads the records and marks of lock directory `dir` (none when it is not there).
pub(crate) fn read(dir: &Path) -> Result<Records> {
    Ok(Records {
        names: names::recorded(dir)?
            .into_iter()
            .filter_map(|(n, w)| Some((n, w?)))
            .collect(),
        marks: names::attach_marks(dir)?,
    })
}

/// The findings the records show against the node `t`.
pub(crate) fn classify(t: &Topology, r: &Records) -> Vec<Finding> {
    let mut v: Vec<Finding> = r
        .names
        .iter()
        .filter_map(|(n, w)| name_record(t, n, w))
        .collect();
    v.extend(r.marks.iter().filter_map(|m| attach_mark(t, m)));
    v
}

/// One device at an address: its name (the block device, else the SCSI address) and the
/// WWID it reports.
struct AtAddress {
    name: String,
    block: Option<String>,
    wwid: Option<Wwid>,
}

fn wwid_of(s: Option<&String>) -> Option<Wwid> {
    s.and_then(|s| s.parse().ok())
}

/// The devices at `spec`'s address as `t` shows them: an iSCSI target's sessions or an FC
/// target port's remote ports at the LUN, an NVMe subsystem's namespaces the selector picks.
fn at_address(t: &Topology, spec: &VolumeSpec) -> Vec<AtAddress> {
    let scsi = |hctls: Vec<Hctl>| -> Vec<AtAddress> {
        t.scsi_devices
            .iter()
            .filter(|d| hctls.contains(&d.hctl))
            .map(|d| AtAddress {
                name: d.block.clone().unwrap_or_else(|| d.hctl.to_string()),
                block: d.block.clone(),
                wwid: wwid_of(d.wwid.as_ref()),
            })
            .collect()
    };
    match spec {
        VolumeSpec::Iscsi { target, lun } => scsi(
            t.iscsi_sessions
                .iter()
                .filter(|s| s.target.as_deref() == Some(target.as_str()))
                .filter_map(|s| Some(Hctl::new(s.host?, 0, s.target_id?, *lun)))
                .collect(),
        ),
        VolumeSpec::Fc { wwpns, lun } => scsi(
            t.fc_rports
                .iter()
                .filter(|r| r.port_name.is_some_and(|p| wwpns.contains(&p)))
                .filter_map(|r| Some(Hctl::new(r.host, r.channel, r.scsi_target_id?, *lun)))
                .collect(),
        ),
        VolumeSpec::Nvme { nqn, namespace } => namespaces(t, nqn, namespace)
            .map(|ns| AtAddress {
                name: ns.name.clone(),
                block: Some(ns.name.clone()),
                wwid: wwid_of(ns.wwid.as_ref()),
            })
            .collect(),
        VolumeSpec::Device(_) | VolumeSpec::Wwid(_) => Vec::new(),
    }
}

/// The namespace devices of subsystem `nqn` that `sel` picks: the subsystem's heads, and
/// each of its controllers' own devices (without native multipath).
fn namespaces<'a>(
    t: &'a Topology,
    nqn: &'a Nqn,
    sel: &'a NamespaceSelector,
) -> impl Iterator<Item = &'a crate::nvme::sysfs::NvmeNamespace> {
    let nqn = nqn.as_str();
    let heads = t
        .nvme_subsystems
        .iter()
        .filter(move |s| s.nqn.as_deref() == Some(nqn))
        .flat_map(|s| s.namespaces.iter());
    let own = t
        .nvme_controllers
        .iter()
        .filter(move |c| c.subsysnqn.as_deref() == Some(nqn))
        .flat_map(|c| c.namespaces.iter());
    let names: Vec<&String> = heads.chain(own).collect();
    t.nvme_namespaces
        .iter()
        .filter(move |ns| names.contains(&&ns.name) && sel.matches(ns))
}

/// The multipath maps of `w` (their names), and whether any device at all carries it.
fn carriers(t: &Topology, w: &Wwid) -> (Vec<String>, bool) {
    let is = |s: Option<&String>| wwid_of(s).as_ref() == Some(w);
    let maps: Vec<String> = t
        .multipath_maps()
        .filter(|m| m.wwid.parse::<Wwid>().ok().as_ref() == Some(w))
        .map(|m| m.name.unwrap_or(m.dm).to_owned())
        .collect();
    let carried = !maps.is_empty()
        || t.scsi_devices.iter().any(|d| is(d.wwid.as_ref()))
        || t.nvme_namespaces.iter().any(|n| is(n.wwid.as_ref()));
    (maps, carried)
}

fn name_record(t: &Topology, n: &Named, w: &Wwid) -> Option<Finding> {
    let here = at_address(t, &n.spec);
    let (maps, carried) = carriers(t, w);
    let finding = |kind, why| Finding {
        kind,
        objects: vec![n.file.clone(), n.spec.to_string()],
        why,
        identity: Some(w.to_string()),
        devices: Vec::new(),
        usage: None,
        since: None,
        queues: None,
    };
    if here.is_empty() {
        return (!carried).then(|| {
            finding(
                Kind::StaleNameRecord,
                format!(
                    "no device on the node carries WWID {w} and nothing is at {}: the record \
                     names nothing",
                    n.spec
                ),
            )
        });
    }
    let mut others: Vec<String> = here
        .iter()
        .filter_map(|d| d.wwid.as_ref())
        .filter(|x| *x != w)
        .map(ToString::to_string)
        .collect();
    others.sort();
    others.dedup();
    if others.is_empty() {
        return None;
    }
    let names: Vec<String> = here.iter().map(|d| d.name.clone()).collect();
    let lingers = match maps.is_empty() {
        true => String::new(),
        false => format!("; a map of {w} is still on the node ({})", maps.join(", ")),
    };
    let mut f = finding(
        Kind::RemappedAddress,
        format!(
            "{} now holds WWID {} ({}), not the recorded {w}: the array gave the LUN to \
             another volume{lingers}",
            n.spec,
            others.join(", "),
            names.join(", ")
        ),
    );
    f.objects.extend(names);
    f.devices = here.into_iter().filter_map(|d| d.block).collect();
    Some(f)
}

fn attach_mark(t: &Topology, m: &Named) -> Option<Finding> {
    let VolumeSpec::Nvme { nqn, namespace } = &m.spec else {
        return None;
    };
    if namespaces(t, nqn, namespace).next().is_some() {
        return None;
    }
    let controllers: Vec<&str> = t
        .nvme_controllers
        .iter()
        .filter(|c| c.subsysnqn.as_deref() == Some(nqn.as_str()))
        .map(|c| c.name.as_str())
        .collect();
    let keeps = match controllers.is_empty() {
        true => "it would keep every controller of the subsystem through each detach".into(),
        false => format!(
            "it keeps the subsystem's controllers ({}) through each detach",
            controllers.join(", ")
        ),
    };
    Some(Finding {
        kind: Kind::StaleAttachMark,
        objects: vec![m.file.clone(), m.spec.to_string()],
        why: format!("no controller of subsystem {nqn} serves {namespace}: {keeps}"),
        identity: Some(nqn.to_string()),
        devices: Vec::new(),
        usage: None,
        since: None,
        queues: None,
    })
}

/// Removes a stale record or mark, under the locks an attach or detach of its volume takes,
/// once the node and the lock directory `dir` read again under them still show the same
/// finding.
pub(super) fn fix(
    root: &Root,
    f: &Finding,
    dir: Option<&Path>,
    named: bool,
    deadline: Instant,
) -> Result<FixOutcome> {
    let Some(dir) = dir else {
        return Ok(FixOutcome::Unsupported(
            "no lock directory: its records cannot be locked or removed".into(),
        ));
    };
    let file = f.objects.first().map(String::as_str).unwrap_or_default();
    let spec = names::parse_name(file).ok_or_else(|| Error::Internal {
        what: format!("{} finding of no record name: {:?}", f.kind, f.objects),
    })?;
    let _locks = locks(dir, f, &spec, deadline)?;
    let topology = Topology::read(root)?;
    let again = classify(&topology, &read(dir)?);
    let now = again
        .iter()
        .find(|n| n.kind == f.kind && n.objects.first() == f.objects.first());
    match now {
        Some(n) if n.identity == f.identity => {}
        Some(n) => {
            return Ok(FixOutcome::Changed(format!(
                "it holds {} now",
                n.identity.as_deref().unwrap_or("nothing")
            )));
        }
        None if present(dir, f.kind, file)? => {
            return Ok(FixOutcome::Changed(
                "a fresh look under the volume's lock finds its volume on the node".into(),
            ));
        }
        None => return Ok(FixOutcome::Gone),
    }
    match f.kind {
        Kind::StaleNameRecord => {
            let w: Wwid = f.identity.as_deref().unwrap_or_default().parse()?;
            Ok(match names::forget(dir, &spec, &w)? {
                true => FixOutcome::Fixed(format!("removed name record {file} (WWID {w})")),
                false => FixOutcome::Gone,
            })
        }
        _ if !named && subsystem_on_node(&topology, f) => {
            Ok(FixOutcome::NotSelected { opt_in: true })
        }
        _ => {
            names::unmark_attached(dir, &spec)?;
            Ok(FixOutcome::Fixed(format!("removed attach mark {file}")))
        }
    }
}

/// Whether a controller of the attach mark's subsystem (`f.identity`) is on the node: then
/// the namespace may only be hidden for a moment, and a plain `--fix` leaves its mark, which
/// keeps those controllers through a sibling's detach until the namespace comes back.
fn subsystem_on_node(t: &Topology, f: &Finding) -> bool {
    let nqn = f.identity.as_deref();
    t.nvme_controllers
        .iter()
        .any(|c| c.subsysnqn.as_deref() == nqn && nqn.is_some())
}

/// Whether the file of finding kind `kind` is still in `dir`.
fn present(dir: &Path, kind: Kind, file: &str) -> Result<bool> {
    Ok(match kind {
        Kind::StaleAttachMark => names::attach_marks(dir)?.iter().any(|m| m.file == file),
        _ => names::recorded(dir)?.iter().any(|(n, _)| n.file == file),
    })
}

/// The locks an attach or detach by `spec` takes, in the detach's order: the volume's (by the
/// recorded WWID, which is what they find for an address with nothing at it; an NVMe
/// namespace with none recorded by its selector), then an NVMe subsystem's.
fn locks(dir: &Path, f: &Finding, spec: &VolumeSpec, deadline: Instant) -> Result<Vec<VolumeLock>> {
    let recorded = match f.kind {
        Kind::StaleNameRecord => f.identity.as_deref().and_then(|w| w.parse::<Wwid>().ok()),
        _ => names::recall(dir, spec),
    };
    let mut keys = Vec::new();
    match (recorded, spec) {
        (Some(w), _) => keys.push(w.to_multipath()),
        (None, VolumeSpec::Nvme { nqn, namespace }) => {
            keys.push(crate::ops::nvme::lock_key(nqn, namespace));
        }
        (None, _) => {}
    }
    if let VolumeSpec::Nvme { nqn, .. } = spec {
        keys.push(subsystem_lock_key(nqn));
    }
    keys.iter()
        .map(|k| lock::lock(k, Some(dir), deadline))
        .collect()
}

#[cfg(test)]
mod tests;

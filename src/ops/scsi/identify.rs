//! What a caller named (a device, an address, a WWID, a target and LUN) turned into the
//! volume's identity, once, from sysfs only; with what `names` remembers for attach and
//! detach.

use std::path::Path;
use std::time::Instant;

use crate::block::sysfs as sysblock;
use crate::block::{self, BlockNode};
use crate::error::{Error, Result};
use crate::id::Hctl;
use crate::id::Wwid;
use crate::iscsi::sysfs::{Portals, paths_to};
use crate::multipath::{self};
use crate::root::Root;
use crate::scsi::sysfs as sysscsi;

use super::locate::locate_until;
use crate::ops::names;
use crate::ops::spec::{Identity, VolumeSpec};

/// Turns what the caller named into the volume's identity. Reads sysfs only.
///
/// A device that does not exist gives an identity that matches nothing, so a second detach
/// of the same device succeeds as a no-op; a malformed one is [`Error::Invalid`].
pub fn identify(root: &Root, spec: &VolumeSpec) -> Result<Identity> {
    match spec {
        VolumeSpec::Wwid(w) => Ok(Identity {
            wwid: Some(w.clone()),
            addresses: Vec::new(),
        }),
        VolumeSpec::Iscsi { .. } | VolumeSpec::Fc { .. } => {
            by_addresses(root, transport_addresses(root, spec)?)
        }
        VolumeSpec::Device(d) => identify_device(root, d),
        // `crate::ops::volume::identify` takes this one to the NVMe family.
        VolumeSpec::Nvme { .. } => Err(Error::Internal {
            what: format!("{spec} reached the SCSI identify"),
        }),
    }
}

/// The volume's identity, as [`identify`] finds it, with what `lock_dir` remembers
/// of the name: a WWID found at a target and LUN is remembered; with none found there
/// (every path gone), the remembered one is used, but only for a volume of which no path is
/// left anywhere. The LUN number may name another volume by now, whose paths are elsewhere,
/// and the record then says nothing about what the address held. Attach and detach both
/// take their lock by its key, so that they name one volume alike.
pub(in crate::ops) fn identify_named(
    root: &Root,
    spec: &VolumeSpec,
    lock_dir: Option<&Path>,
    deadline: Instant,
) -> Result<Identity> {
    let mut id = identify(root, spec)?;
    let Some(dir) = lock_dir.filter(|_| spec.is_address()) else {
        return Ok(id);
    };
    match &id.wwid {
        // Failing to write the record loses a hint for a later call, not this one.
        Some(w) => {
            let _ = names::remember(dir, spec, w);
        }
        None => {
            if let Some(w) = names::recall(dir, spec) {
                let by_wwid = Identity {
                    wwid: Some(w),
                    addresses: id.addresses.clone(),
                };
                if locate_until(root, &by_wwid, deadline)?.paths.is_empty() {
                    id = by_wwid;
                }
            }
        }
    }
    Ok(id)
}

/// Every address of an iSCSI or FC LUN on the node: its LUN behind every session to the
/// target, logged in or not (a session in recovery still has its devices), or behind every
/// remote port of the target's WWPNs. Empty for another kind of spec.
fn transport_addresses(root: &Root, spec: &VolumeSpec) -> Result<Vec<Hctl>> {
    Ok(match spec {
        VolumeSpec::Iscsi { target, lun } => paths_to(root, target, Portals::Any)?
            .into_iter()
            .filter_map(|s| Some(Hctl::new(s.host?, 0, s.target_id?, *lun)))
            .collect(),
        VolumeSpec::Fc { wwpns, lun } => {
            let wwpns = crate::fc::check_target_ports(wwpns)?;
            crate::fc::sysfs::remote_ports(root)?
                .into_iter()
                .filter(|r| r.port_name.is_some_and(|p| wwpns.contains(&p)))
                .filter_map(|r| Some(Hctl::new(r.host, r.channel, r.scsi_target_id?, *lun)))
                .collect()
        }
        _ => Vec::new(),
    })
}

/// Why [`by_addresses`] refuses devices that disagree.
const MIXED: &str = "the devices at these addresses have different WWIDs";

/// [`identify_named`] for an attach, which scans the address whatever it held: where the
/// devices there disagree on their WWID (the array re-mapped the LUN, and some paths were
/// rescanned since), the identity of the addresses alone, locked by them; the scan then
/// judges each device as what it is now ([`crate::scsi::trigger_start`]).
pub(in crate::ops) fn identify_for_attach(
    root: &Root,
    spec: &VolumeSpec,
    lock_dir: Option<&Path>,
    deadline: Instant,
) -> Result<Identity> {
    match identify_named(root, spec, lock_dir, deadline) {
        Err(Error::Invalid { reason: MIXED, .. }) => Ok(Identity {
            wwid: None,
            addresses: transport_addresses(root, spec)?,
        }),
        r => r,
    }
}

/// The identity of the devices at `addresses`: they must agree on one WWID.
fn by_addresses(root: &Root, mut addresses: Vec<Hctl>) -> Result<Identity> {
    addresses.sort();
    addresses.dedup();
    let mut wwid: Option<Wwid> = None;
    for &h in &addresses {
        let Some(w) = sysscsi::wwid(root, h) else {
            continue;
        };
        match &wwid {
            Some(known) if *known != w => {
                return Err(Error::Invalid {
                    kind: "volume",
                    input: format!("{} and {h}", addresses[0]),
                    reason: MIXED,
                });
            }
            Some(_) => {}
            None => wwid = Some(w),
        }
    }
    Ok(Identity { wwid, addresses })
}

fn identify_device(root: &Root, spec: &str) -> Result<Identity> {
    if let Ok(hctl) = spec.parse::<Hctl>() {
        return by_addresses(root, vec![hctl]);
    }
    let node = match block::resolve(root, spec)? {
        Some(n) => Some(n),
        // Not a kernel name or a node: a multipath map name?
        None if !spec.starts_with('/') => map_by_name(root, spec)?,
        None => None,
    };
    let Some(node) = node else {
        return Ok(Identity {
            wwid: None,
            addresses: Vec::new(),
        });
    };
    if let Some(uuid) = sysblock::dm_uuid(root, &node.name) {
        // A multipath map, or one of its partition maps (`part1-mpath-<wwid>`).
        let wwid = multipath::map_or_partition_uuid_wwid(&uuid).ok_or_else(|| {
            Error::invalid(
                "volume device",
                spec,
                "a device-mapper device that is not a multipath map",
            )
        })?;
        return Ok(Identity {
            wwid: Some(wwid.parse()?),
            addresses: Vec::new(),
        });
    }
    // A partition: the volume is its disk.
    let disk = if sysblock::is_partition(root, &node.name) {
        sysblock::disk_of_partition(root, &node.name).ok_or_else(|| Error::NotFound {
            what: format!("disk of partition {} not found", node.name),
        })?
    } else {
        node.name.clone()
    };
    let hctl = sysblock::scsi_address(root, &disk).ok_or_else(|| {
        Error::invalid(
            "volume device",
            spec,
            "neither a SCSI disk nor a multipath map",
        )
    })?;
    by_addresses(root, vec![hctl])
}

/// The dm device whose map name is `name`.
fn map_by_name(root: &Root, name: &str) -> Result<Option<BlockNode>> {
    if crate::dm::buffer::check_name(name).is_err() {
        return Err(Error::invalid(
            "device",
            name,
            "not a device path, kernel name, map name or H:C:T:L",
        ));
    }
    for b in sysblock::dm_names(root)? {
        if sysblock::dm_name(root, &b).as_deref() == Some(name) {
            return block::by_name(root, &b);
        }
    }
    Ok(None)
}

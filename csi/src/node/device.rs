//! What every transport's record shares: the volume's device found by its identity, whether
//! it is on the node, the WWID it must have, and lunkit's attach and detach with their steps
//! recorded.

use std::path::Path;

use lunkit::block::BlockNode;
use lunkit::ops::{self, AttachOptions, DetachOptions, VolumeSpec};
use lunkit::{Root, Wwid};

use crate::error::{Error, Result};
use crate::log;
use crate::stale::Presence;
use crate::state::{Record, Target};

/// The device number of the block device node at `path` (a raw-block publish target is a
/// bind mount of one); `None` for anything else.
pub(crate) fn rdev_of(path: &Path) -> Option<lunkit::DevNum> {
    let st = rustix::fs::stat(path).ok()?;
    (rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::BlockDevice).then(
        || lunkit::DevNum {
            major: rustix::fs::major(st.st_rdev),
            minor: rustix::fs::minor(st.st_rdev),
        },
    )
}

/// The volume's device now, found by its identity (a SCSI volume's WWID; an NVMe
/// namespace's subsystem, id, UUID and WWID), never by the name recorded: after a reboot
/// or a rescan that name may be another disk's. `None` when the volume is not on the node
/// (or, staged on a map, only its paths are). Each family looks in its own module.
pub(crate) fn device_of(root: &Root, record: &Record) -> Result<Option<BlockNode>> {
    match &record.target {
        Target::Nvme { .. } => crate::nvme::device_of(root, record),
        Target::Iscsi { .. } | Target::Fc { .. } => crate::scsi::device_of(root, record),
    }
}

/// Whether the volume of `record` is on the node, found by its identity as
/// [`device_of`] finds it, never by the name recorded: a SCSI volume by any path or map with
/// its known WWID (the one its paths reported, else the one its attributes named); an NVMe
/// namespace by its subsystem and id (and the WWID stage saw), or, before stage learned the
/// id, by the UUID or WWID the attributes named. [`Presence::Here`] carries the device
/// [`device_of`] hands out, when there is one.
pub(crate) fn presence(root: &Root, record: &Record) -> Result<Presence> {
    match &record.target {
        Target::Nvme { .. } => crate::nvme::presence(root, record),
        Target::Iscsi { .. } | Target::Fc { .. } => crate::scsi::presence(root, record),
    }
}

/// `volume pv-1: find <target>`: what a failed look-up of the volume's device was doing.
pub(crate) fn finding(record: &Record) -> String {
    format!(
        "volume {}: find {}",
        record.volume_id,
        record.target.describe()
    )
}

/// The WWID the volume must have this time: the attributes', else the one an earlier stage
/// of this volume saw (after a reboot the LUN number may hold another volume).
pub(crate) fn expected(attr: Option<&Wwid>, record: &Record) -> Result<Option<Wwid>> {
    if let Some(w) = attr {
        return Ok(Some(w.clone()));
    }
    // An NVMe namespace's identity (`uuid.…`, `eui.…`) is expected when it parses; one in a
    // form lunkit does not name (`nvme.…`) is still checked by the UUID and the recorded
    // WWID when the device is looked up.
    if matches!(record.target, Target::Nvme { .. }) {
        return Ok(record.wwid.as_deref().and_then(|w| w.parse().ok()));
    }
    record
        .wwid
        .as_deref()
        .map(str::parse)
        .transpose()
        .map_err(|e| Error::lunkit(format!("volume {}: its record", record.volume_id), e))
}

/// Whether a stage request names the volume a record was made for. The record's nsid may
/// have been found by UUID after the request that made it, which named none.
pub(crate) fn same_volume(recorded: &Target, asked: &Target) -> bool {
    match (recorded, asked) {
        (
            Target::Nvme {
                nqn: a,
                portals: pa,
                discovery: da,
                nsid: na,
                device_uuid: ua,
                device_wwid: wa,
                host_nqn: ha,
                host_id: ia,
                ..
            },
            Target::Nvme {
                nqn: b,
                portals: pb,
                discovery: db,
                nsid: nb,
                device_uuid: ub,
                device_wwid: wb,
                host_nqn: hb,
                host_id: ib,
                ..
            },
        ) => {
            // A record written before hosts were recorded has none: it says nothing of them.
            let hosts = (ha.is_none() && ia.is_none()) || (ha == hb && ia == ib);
            a == b
                && pa == pb
                && da == db
                && ua == ub
                && wa == wb
                && hosts
                && (nb.is_none() || na == nb)
        }
        // The portals discovery found are what the array advertised then, not what the
        // request names.
        (
            Target::Iscsi {
                iqn: a,
                portals: pa,
                iface: fa,
                lun: la,
                ..
            },
            Target::Iscsi {
                iqn: b,
                portals: pb,
                iface: fb,
                lun: lb,
                ..
            },
        ) => a == b && pa == pb && fa == fb && la == lb,
        _ => recorded == asked,
    }
}

/// [`ops::attach()`], its steps recorded in the metrics and in the current call's log.
pub(crate) fn attach_recorded(
    root: &Root,
    spec: &VolumeSpec,
    opts: &AttachOptions,
) -> lunkit::Result<ops::Attachment> {
    let a = ops::attach(root, spec, opts)?;
    crate::metrics::global().attached(&a);
    let target = spec.to_string();
    if let Some(scsi) = a.scsi() {
        log::step("attach", "scan", &target, "done", scsi.scan_elapsed);
    }
    for p in a.nvme().iter().flat_map(|n| &n.portals) {
        if let Ok(c) = &p.result {
            log::step("attach", "connect", &p.portal, "done", c.elapsed);
        }
    }
    Ok(a)
}

/// [`ops::detach()`], its steps recorded in the metrics and in the current call's log; with
/// `before_removal`, [`ops::detach_before_removal`].
pub(crate) fn detach_recorded(
    root: &Root,
    spec: &VolumeSpec,
    opts: &DetachOptions,
    before_removal: Option<&mut ops::BeforeRemoval<'_>>,
) -> lunkit::Result<ops::DetachReport> {
    let r = match before_removal {
        Some(step) => ops::detach_before_removal(root, spec, opts, &mut |_| {}, step)?,
        None => ops::detach(root, spec, opts)?,
    };
    crate::metrics::global().detached(&r);
    for s in &r.steps {
        let outcome = crate::metrics::outcome_name(&s.outcome);
        log::step("detach", s.kind.as_str(), &s.target, outcome, s.duration);
    }
    Ok(r)
}

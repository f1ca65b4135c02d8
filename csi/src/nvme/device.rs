//! Where an NVMe volume's namespace is now, found by its subsystem, id and identity.

use lunkit::Root;
use lunkit::block::BlockNode;

use lunkit::ops::NamespaceSelector;
use lunkit::ops::volume::{self, VolumeDevice};

use super::{named_check, named_selector};
use crate::error::{Error, Result};
use crate::node::device::finding;
use crate::node::volume::abnormal;
use crate::proto::VolumeCondition;
use crate::stale::Presence;
use crate::state::{Record, Target};
use lunkit::nvme::sysfs::CtrlState;

/// The namespace's device now: the one of the recorded subsystem and id that reports the
/// identity the attributes named and the WWID the stage saw. `None` before the stage learned
/// the id, or when no such namespace is on the node. With several (native multipath off,
/// several controllers) the first, as the stage handed out.
pub(crate) fn device_of(root: &Root, record: &Record) -> Result<Option<BlockNode>> {
    let what = || finding(record);
    let Target::Nvme {
        nqn,
        nsid,
        device_uuid,
        device_wwid,
        ..
    } = &record.target
    else {
        return Ok(None);
    };
    let Some(nsid) = nsid else { return Ok(None) };
    let Some(check) = named_check(
        device_uuid.as_deref(),
        device_wwid.as_deref(),
        record.wwid.as_deref(),
    ) else {
        return Ok(None);
    };
    let nqn: lunkit::Nqn = nqn.parse().map_err(|e| Error::lunkit(what(), e))?;
    let found = volume::namespace_device(root, &nqn, &NamespaceSelector::Id(*nsid), &check)
        .map_err(|e| Error::lunkit(what(), e))?;
    Ok(match found {
        VolumeDevice::Namespace(n) => Some(n),
        VolumeDevice::Namespaces(v) => v.into_iter().next(),
        _ => None,
    })
}

/// Whether the namespace is on the node: by [`device_of`] once the id is known, else by
/// the UUID or WWID the attributes named; `Unknown` when they named neither.
pub(crate) fn presence(root: &Root, record: &Record) -> Result<Presence> {
    let what = || finding(record);
    let Target::Nvme {
        nqn,
        nsid,
        device_uuid,
        device_wwid,
        ..
    } = &record.target
    else {
        return Ok(Presence::Unknown);
    };
    if nsid.is_some() {
        return Ok(match device_of(root, record)? {
            Some(d) => Presence::Here(Some(d.dev)),
            None => Presence::Gone,
        });
    }
    let (uuid, wwid) = (device_uuid.as_deref(), device_wwid.as_deref());
    if uuid.is_none() && wwid.is_none() {
        return Ok(Presence::Unknown);
    }
    // No WWID from the stage here: it learns one only with the id.
    let (Some(selector), Some(check)) = (named_selector(uuid, wwid), named_check(uuid, wwid, None))
    else {
        return Ok(Presence::Gone);
    };
    let nqn: lunkit::Nqn = nqn.parse().map_err(|e| Error::lunkit(what(), e))?;
    let here = volume::namespace_device(root, &nqn, &selector, &check)
        .map_err(|e| Error::lunkit(what(), e))?
        .is_present();
    Ok(if here {
        Presence::Here(None)
    } else {
        Presence::Gone
    })
}

/// Abnormal when a controller of the subsystem is not live, or none is left.
pub(crate) fn condition(root: &Root, nqn: &str) -> VolumeCondition {
    let controllers = nqn
        .parse::<lunkit::Nqn>()
        .and_then(|n| lunkit::nvme::controllers_of(root, &n));
    let mut wrong = match controllers {
        Err(e) => vec![format!("cannot look at the subsystem's controllers: {e}")],
        Ok(c) if c.is_empty() => vec!["no controller of the subsystem is left".into()],
        Ok(c) => {
            let down: Vec<String> = c
                .iter()
                .filter(|c| c.parsed_state != Some(CtrlState::Live))
                .map(|c| format!("{} is {}", c.name, c.state.as_deref().unwrap_or("unknown")))
                .collect();
            if down.is_empty() && crate::follow::unconnected::of(nqn).is_empty() {
                return VolumeCondition {
                    abnormal: false,
                    message: format!("{} controllers live", c.len()),
                };
            }
            if down.is_empty() {
                Vec::new()
            } else {
                vec![format!("controller {}", down.join(", "))]
            }
        }
    };
    // Ports its discovery service lists that the follower could not connect.
    wrong.extend(
        crate::follow::unconnected::of(nqn)
            .into_iter()
            .map(|u| format!("path {} not connected: {}", u.path, u.reason)),
    );
    abnormal(wrong.join("; "))
}

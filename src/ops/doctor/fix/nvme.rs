//! The NVMe fixes: a controller that stays not live, and an idle subsystem's controllers.
//! Both decide under the subsystem's lock, the one the NVMe attach, detach and the
//! persistent-discovery follower take, so that no connect of theirs is undercut; and both
//! leave a subsystem of which lunkit marked a namespace attached (its detach decides about
//! those controllers).

use std::time::Instant;

use super::{FixOptions, FixOutcome, object, verdict};
use crate::error::Result;
use crate::id::Nqn;
use crate::nvme::sysfs::{self as sysnvme, CtrlState, NvmeController};
use crate::ops::doctor::{Finding, subsystems, usage};
use crate::ops::lock::{self, VolumeLock};
use crate::ops::nvme::subsystem_lock_key;
use crate::root::Root;

/// The subsystem's lock, for a finding whose identity is its NQN; `Ok(None)` for an NQN
/// lunkit could not have connected (nothing of lunkit's can race it then).
fn subsystem_lock(f: &Finding, opts: &FixOptions, deadline: Instant) -> Result<Option<VolumeLock>> {
    let Some(Ok(nqn)) = f.identity.as_deref().map(str::parse::<Nqn>) else {
        return Ok(None);
    };
    lock::lock(
        &subsystem_lock_key(&nqn),
        opts.lock_dir.as_deref(),
        deadline,
    )
    .map(Some)
}

/// Why a subsystem's controllers are lunkit's attach's to decide about, if they are.
fn marked(f: &Finding, opts: &FixOptions) -> Result<Option<FixOutcome>> {
    let nqn = f.identity.as_deref().unwrap_or_default();
    Ok(subsystems::marked(opts.lock_dir.as_deref(), nqn)?.then(|| {
        FixOutcome::InUse(format!(
            "a namespace of subsystem {nqn} is marked attached by lunkit: its detach takes \
             the controllers away"
        ))
    }))
}

/// Deletes an NVMe controller that is not live, if it still serves the subsystem it was
/// found with, no namespace of that subsystem is marked attached, and nothing uses the
/// subsystem's namespaces.
pub(super) fn controller(
    root: &Root,
    f: &Finding,
    opts: &FixOptions,
    deadline: Instant,
) -> Result<FixOutcome> {
    let name = object(f, 0)?;
    let _subsystem = subsystem_lock(f, opts, deadline)?;
    let Some(c) = sysnvme::controller(root, name)? else {
        return Ok(FixOutcome::Gone);
    };
    if c.subsysnqn != f.identity {
        return Ok(FixOutcome::Changed(format!(
            "{name} serves subsystem {} now",
            c.subsysnqn.as_deref().unwrap_or("?")
        )));
    }
    if let Some(left) = changed(&c).or(marked(f, opts)?) {
        return Ok(left);
    }
    if let Some(left) = verdict(&usage(root, &f.devices, &[], deadline)?) {
        return Ok(left);
    }
    // Again after the in-use check: it may have reconnected meanwhile.
    let Some(c) = sysnvme::controller(root, name)?.filter(|n| n.cntlid == c.cntlid) else {
        return Ok(FixOutcome::Gone);
    };
    if let Some(left) = changed(&c) {
        return Ok(left);
    }
    // The write goes ahead only if the controller is still this one (subsystem and cntlid).
    crate::nvme::delete_controller(root, &c, deadline)?;
    Ok(FixOutcome::Fixed(format!(
        "deleted controller {name} (subsystem {})",
        c.subsysnqn.as_deref().unwrap_or("?")
    )))
}

/// Why controller `c` is no longer one to delete: live again, or `new` (a connect of an
/// attach is still making it).
fn changed(c: &NvmeController) -> Option<FixOutcome> {
    match c.parsed_state {
        Some(CtrlState::Live) => Some(FixOutcome::Changed(format!("{} is live again", c.name))),
        Some(CtrlState::New) => Some(FixOutcome::Changed(format!(
            "{} is new: a connect is making it",
            c.name
        ))),
        _ => None,
    }
}

/// Disconnects an idle subsystem: under its lock, with no namespace marked attached and
/// nothing using its namespaces (checked again, on the devices it has now), each of its
/// controllers is deleted, side by side, each checked to be the same controller at its
/// write.
pub(super) fn subsystem(
    root: &Root,
    f: &Finding,
    opts: &FixOptions,
    deadline: Instant,
) -> Result<FixOutcome> {
    let nqn = f.identity.as_deref().unwrap_or_default();
    let _subsystem = subsystem_lock(f, opts, deadline)?;
    let controllers: Vec<NvmeController> = sysnvme::controllers(root)?
        .into_iter()
        .filter(|c| c.subsysnqn.as_deref() == Some(nqn))
        .collect();
    if controllers.is_empty() {
        return Ok(FixOutcome::Gone);
    }
    if let Some(left) = marked(f, opts)? {
        return Ok(left);
    }
    if let Some(c) = controllers
        .iter()
        .find(|c| c.parsed_state == Some(CtrlState::New))
    {
        return Ok(changed(c).unwrap_or(FixOutcome::Gone));
    }
    let now = crate::topology::Topology::read(root)?;
    let devices = now
        .nvme_subsystems
        .iter()
        .filter(|s| s.nqn.as_deref() == Some(nqn))
        .flat_map(|s| subsystems::devices(&now, s))
        .collect::<Vec<_>>();
    if let Some(left) = verdict(&usage(root, &devices, &[], deadline)?) {
        return Ok(left);
    }
    let deleted = crate::helper::fan_out("lunkit-doctor-delete", &controllers, |c| {
        crate::nvme::delete_controller(root, c, deadline)
    });
    let names: Vec<&str> = controllers.iter().map(|c| c.name.as_str()).collect();
    match deleted.into_iter().find_map(|r| r.err()) {
        Some(e) => Err(e),
        None => Ok(FixOutcome::Fixed(format!(
            "disconnected subsystem {nqn}: deleted controllers {}",
            names.join(", ")
        ))),
    }
}

//! Idle NVMe over Fabrics subsystems: connected, with controllers the kernel keeps alive (a
//! keep-alive each, reconnects after every outage), for namespaces nothing uses and lunkit
//! marked none of attached. Only the in-use check tells, so they are looked for only with
//! it.

use std::path::Path;

use super::{DoctorOptions, Finding, Kind};
use crate::error::Result;
use crate::id::Nqn;
use crate::nvme::discovery::DISCOVERY_NQN;
use crate::nvme::sysfs::{NvmeSubsystem, parse_namespace_name};
use crate::topology::Topology;

/// The fabrics subsystems that may be idle: none of their namespaces is marked attached in
/// `opts.lock_dir`. A discovery subsystem (a persistent discovery controller, kept on
/// purpose to hear of log changes) and a PCIe one are never idle. Each with its NQN and its
/// namespaces' devices, for the in-use check, which tells: an idle one is [`finding`].
pub(super) fn unmarked<'t>(
    t: &'t Topology,
    opts: &DoctorOptions,
) -> Result<Vec<(&'t NvmeSubsystem, &'t str, Vec<String>)>> {
    let mut out = Vec::new();
    for s in &t.nvme_subsystems {
        let Some(nqn) = fabrics_nqn(t, s) else {
            continue;
        };
        if marked(opts.lock_dir.as_deref(), nqn)? {
            continue;
        }
        out.push((s, nqn, devices(t, s)));
    }
    Ok(out)
}

/// The subsystem's NQN, if it is a fabrics subsystem with controllers and not discovery.
fn fabrics_nqn<'t>(t: &'t Topology, s: &'t NvmeSubsystem) -> Option<&'t str> {
    let nqn = s.nqn.as_deref().filter(|n| *n != DISCOVERY_NQN)?;
    let mut controllers = t
        .nvme_controllers
        .iter()
        .filter(|c| s.controllers.contains(&c.name))
        .peekable();
    controllers.peek()?;
    controllers
        .all(|c| c.transport.as_deref().is_some_and(|t| t != "pcie"))
        .then_some(nqn)
}

/// Whether a namespace of subsystem `nqn` is marked attached in lock directory `dir` (an
/// NQN lunkit could not have attached, one that does not parse, is not).
pub(super) fn marked(dir: Option<&Path>, nqn: &str) -> Result<bool> {
    let (Some(dir), Ok(nqn)) = (dir, nqn.parse::<Nqn>()) else {
        return Ok(false);
    };
    Ok(!crate::ops::names::marked(dir, &nqn)?.is_empty())
}

/// The subsystem's block devices: its native-multipath heads, and each controller's own
/// namespaces (without native multipath, `nvme1n1` is the controller's).
pub(super) fn devices(t: &Topology, s: &NvmeSubsystem) -> Vec<String> {
    let own = t
        .nvme_controllers
        .iter()
        .filter(|c| s.controllers.contains(&c.name))
        .flat_map(|c| c.namespaces.iter())
        .filter(|n| matches!(parse_namespace_name(n), Some((_, None, _))));
    let mut v: Vec<String> = s.namespaces.iter().chain(own).cloned().collect();
    v.sort();
    v.dedup();
    v
}

pub(super) fn finding(
    s: &NvmeSubsystem,
    nqn: &str,
    devices: Vec<String>,
    usage: crate::block::Usage,
) -> Finding {
    let why = match devices.is_empty() {
        true => "it serves no namespace".to_owned(),
        false => format!("nothing uses its namespaces ({})", devices.join(", ")),
    };
    Finding {
        kind: Kind::IdleSubsystem,
        objects: std::iter::once(s.name.clone())
            .chain(s.controllers.iter().cloned())
            .collect(),
        why: format!(
            "{why}, and lunkit marked none attached: its controllers ({}) are kept for \
             nothing",
            s.controllers.join(", ")
        ),
        identity: Some(nqn.to_owned()),
        devices,
        usage: Some(usage),
        since: None,
        queues: None,
    }
}

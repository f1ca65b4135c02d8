//! The NVMe attach: every portal asked for connected at once, then the namespace's device
//! awaited with a path through every live controller.

use std::path::Path;
use std::time::Instant;

use crate::error::{Error, Result};
use crate::helper;
use crate::id::{Nqn, Wwid};
use crate::nvme::sysfs::{CtrlState, NvmeNamespace};
use crate::nvme::{self as fabrics_nvme, ConnectOptions, Host};
use crate::root::Root;
use crate::uevent::{Monitor, Uevent};
use crate::wait;

use super::{NamespaceDevice, by_id, check_selector, selected, subsystem_lock_key};
use crate::ops::lock;
use crate::ops::names;
use crate::ops::options::{AttachOptions, NvmeAttachOptions};
use crate::ops::report::{AttachedFamily, Attachment, NvmeAttachment, PortalConnect};
use crate::ops::spec::{NamespaceSelector, VolumeSpec};

/// [`super::attach()`] of [`VolumeSpec::Nvme`].
pub(in crate::ops) fn attach(
    root: &Root,
    spec: &VolumeSpec,
    nqn: &Nqn,
    namespace: &NamespaceSelector,
    opts: &AttachOptions,
) -> Result<Attachment> {
    check_selector(namespace)?;
    let start = Instant::now();
    let deadline = wait::deadline_from(start, opts.scan.timeout);
    // Held until this namespace is marked attached: a detach of another namespace of the
    // subsystem decides which controllers are needed under the same lock.
    let _subsys = lock::lock(&subsystem_lock_key(nqn), opts.lock_dir.as_deref(), deadline)?;
    let portals = &opts.nvme.connect;
    let host = match &opts.nvme.host {
        Some(h) => Some(h.clone()),
        None if portals.is_empty() => None,
        None => Some(Host::from_node(root)?),
    };
    // Subscribed before any connect, so the namespace's `add` cannot slip past.
    let mut monitor = Monitor::open().ok();
    let connects = connect_all(root, nqn, &opts.nvme, host.as_ref(), deadline);
    let min = opts.scan.min_paths.max(1);
    let wait = Wait {
        root,
        spec,
        nqn,
        namespace,
        min,
    };
    let devices = wait.for_paths(monitor.as_mut(), &connects, deadline)?;
    let canonical = by_id(nqn, &devices);
    let nsid = devices.iter().find_map(|(ns, _)| ns.nsid);
    let devices: Vec<NamespaceDevice> = devices.into_iter().map(|(_, d)| d).collect();
    let wwid = devices.first().and_then(|d| d.wwid.clone());
    if let Some(expected) = &opts.scan.expect_wwid {
        if let Some(d) = devices.iter().find(|d| d.wwid.as_ref() != Some(expected)) {
            return Err(Error::WwidMismatch {
                device: format!("{} ({spec})", d.node.name),
                expected: Some(expected.clone()),
                reference: None,
                actual: d.wwid.clone(),
            });
        }
    }
    if let Some(dir) = &opts.lock_dir {
        remember(dir, spec, canonical.as_ref(), wwid.as_ref());
    }
    let mut controllers: Vec<String> = devices.iter().flat_map(|d| d.controllers.clone()).collect();
    controllers.sort();
    controllers.dedup();
    Ok(Attachment {
        wwid,
        family: AttachedFamily::Nvme(NvmeAttachment {
            nsid,
            devices: devices.into_iter().map(|d| d.node).collect(),
            controllers,
            portals: connects,
        }),
        elapsed: start.elapsed(),
    })
}

/// Connects every portal of `nvme.connect` side by side as `host`, with the secrets of
/// `nvme`, each with what is left of `deadline`, and says how each went.
fn connect_all(
    root: &Root,
    nqn: &Nqn,
    nvme: &NvmeAttachOptions,
    host: Option<&Host>,
    deadline: Instant,
) -> Vec<PortalConnect> {
    let portals = &nvme.connect;
    let results = helper::fan_out("lunkit-nvme-connect", portals, |p| {
        let mut o = ConnectOptions::new(p.ip(), p.port(), nqn.clone());
        o.host = host.cloned();
        o.dhchap_secret.clone_from(&nvme.dhchap_secret);
        o.dhchap_ctrl_secret.clone_from(&nvme.dhchap_ctrl_secret);
        o.timeout = deadline.saturating_duration_since(Instant::now());
        fabrics_nvme::connect(root, &o)
    });
    portals
        .iter()
        .zip(results)
        .map(|(p, r)| PortalConnect {
            portal: p.to_string(),
            result: r.map_err(|e| e.to_string()),
        })
        .collect()
}

/// The wait of an attach for the namespace's devices.
struct Wait<'a> {
    root: &'a Root,
    spec: &'a VolumeSpec,
    nqn: &'a Nqn,
    namespace: &'a NamespaceSelector,
    /// How many controller paths must come at least.
    min: usize,
}

impl Wait<'_> {
    /// The namespace's devices once they have a path through every live controller of the
    /// subsystem, or at the deadline whatever came if that is at least `min` paths. Every
    /// connect failed with no controller of the subsystem left is [`Error::NotFound`] at
    /// once, and nothing at all at the deadline with every connect failed too; too few is
    /// [`Error::Timeout`], naming each portal's connect.
    fn for_paths(
        &self,
        monitor: Option<&mut Monitor>,
        connects: &[PortalConnect],
        deadline: Instant,
    ) -> Result<Vec<(NvmeNamespace, NamespaceDevice)>> {
        let (root, nqn, namespace, min) = (self.root, self.nqn, self.namespace, self.min);
        let what = || {
            let said: Vec<String> = connects.iter().map(ToString::to_string).collect();
            format!(
                "{} on every live controller of the subsystem{}",
                self.spec,
                if said.is_empty() {
                    String::new()
                } else {
                    format!(" (portals: {})", said.join("; "))
                }
            )
        };
        // Every connect failed and the subsystem has no controller at all: nothing can bring
        // the namespace, so waiting out the deadline (a CSI stage's is minutes) says nothing
        // more than the connects said.
        let all_failed = !connects.is_empty() && connects.iter().all(|c| c.result.is_err());
        if all_failed && fabrics_nvme::controllers_of(root, nqn)?.is_empty() {
            return Err(Error::NotFound { what: what() });
        }
        let relevant = |ev: &Uevent| {
            matches!(
                ev.subsystem.as_deref(),
                Some("block" | "nvme" | "nvme-subsystem")
            )
        };
        let found = wait::until(monitor, deadline, &what, &relevant, || {
            let devices = selected(root, nqn, namespace)?;
            let live: Vec<String> = fabrics_nvme::controllers_of(root, nqn)?
                .into_iter()
                .filter(|c| c.parsed_state == Some(CtrlState::Live))
                .map(|c| c.name)
                .collect();
            let reached: Vec<&String> = devices.iter().flat_map(|(_, d)| &d.controllers).collect();
            let complete = !live.is_empty() && live.iter().all(|c| reached.contains(&c));
            Ok((complete && reached.len() >= min).then_some(devices))
        });
        match found {
            Err(Error::Timeout { what, waited }) => {
                let devices = selected(root, nqn, namespace)?;
                let reached = devices
                    .iter()
                    .map(|(_, d)| d.controllers.len())
                    .sum::<usize>();
                if !devices.is_empty() && reached >= min {
                    return Ok(devices);
                }
                Err(
                    if devices.is_empty() && connects.iter().all(|c| c.result.is_err()) {
                        Error::NotFound { what }
                    } else {
                        Error::Timeout { what, waited }
                    },
                )
            }
            found => found,
        }
    }
}

/// Hints for a later detach, under the name given and the namespace's id: the WWID found,
/// and the mark that the namespace is attached. Failing to write them does not undo the
/// attach.
fn remember(dir: &Path, spec: &VolumeSpec, canonical: Option<&VolumeSpec>, wwid: Option<&Wwid>) {
    let canonical = canonical.unwrap_or(spec);
    if let Some(w) = wwid {
        let _ = names::remember(dir, spec, w);
        if canonical != spec {
            let _ = names::remember(dir, canonical, w);
        }
    }
    let _ = names::mark_attached(dir, canonical);
}

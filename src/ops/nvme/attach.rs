//! The NVMe attach: every portal asked for and every path discovered connected at once
//! ([`super::connects`]), then the namespace's device awaited with a path through every
//! live controller.

use std::path::Path;
use std::time::Instant;

use crate::error::{Error, Result};
use crate::id::{Nqn, Wwid};
use crate::nvme::sysfs::{CtrlState, NvmeNamespace};
use crate::nvme::{self as fabrics_nvme, Host};
use crate::root::Root;
use crate::uevent::{Subscription, Uevent};
use crate::wait;

use super::connects::{self, Connects};
use super::{NamespaceDevice, by_id, check_selector, selected, subsystem_lock_key};
use crate::ops::lock;
use crate::ops::names;
use crate::ops::options::AttachOptions;
use crate::ops::report::{AttachedFamily, Attachment, NvmeAttachment};
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
    let nvme = &opts.nvme;
    let host = match &nvme.host {
        Some(h) => Some(h.clone()),
        None if nvme.connect.is_empty() && nvme.discover.is_empty() => None,
        None => Some(Host::from_node(root)?),
    };
    // Subscribed before any connect, so the namespace's `add` cannot slip past.
    let mut monitor = Subscription::open().ok();
    let connects = connects::connect(root, nqn, nvme, host.as_ref(), deadline);
    let wait = Wait {
        root,
        spec,
        nqn,
        namespace,
        min: opts.scan.min_paths.max(1),
    };
    let found = wait.reachable(&connects).and_then(|()| {
        let devices = wait.for_paths(monitor.as_mut(), &connects, deadline)?;
        check_wwid(spec, &devices, opts.scan.expect_wwid.as_ref())?;
        Ok(devices)
    });
    let devices = match found {
        Ok(d) => d,
        Err(e) => {
            // Still under the subsystem's lock: no other attach can have come to rely on
            // the controllers this one made.
            connects::undo(root, nqn, &connects.portals, opts.lock_dir.as_deref());
            return Err(e);
        }
    };
    let wwid = devices.first().and_then(|(_, d)| d.wwid.clone());
    if let Some(dir) = &opts.lock_dir {
        remember(dir, spec, by_id(nqn, &devices).as_ref(), wwid.as_ref());
    }
    Ok(Attachment {
        wwid,
        family: AttachedFamily::Nvme(report(devices, connects)),
        elapsed: start.elapsed(),
    })
}

/// The report of an attach whose namespace came as `devices`.
fn report(devices: Vec<(NvmeNamespace, NamespaceDevice)>, connects: Connects) -> NvmeAttachment {
    let nsid = devices.iter().find_map(|(ns, _)| ns.nsid);
    let mut controllers: Vec<String> = devices
        .iter()
        .flat_map(|(_, d)| d.controllers.clone())
        .collect();
    controllers.sort();
    controllers.dedup();
    NvmeAttachment {
        nsid,
        devices: devices.into_iter().map(|(_, d)| d.node).collect(),
        controllers,
        portals: connects.portals,
        discovery: connects.discovery,
    }
}

/// Every device of the namespace has the WWID the caller expects, if any.
fn check_wwid(
    spec: &VolumeSpec,
    devices: &[(NvmeNamespace, NamespaceDevice)],
    expected: Option<&Wwid>,
) -> Result<()> {
    let Some(expected) = expected else {
        return Ok(());
    };
    match devices
        .iter()
        .find(|(_, d)| d.wwid.as_ref() != Some(expected))
    {
        Some((_, d)) => Err(Error::WwidMismatch {
            device: format!("{} ({spec})", d.node.name),
            expected: Some(expected.clone()),
            reference: None,
            actual: d.wwid.clone(),
            new_paths: Vec::new(),
        }),
        None => Ok(()),
    }
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
    /// After an attach's connects, whether the paths it wants can come at all: it made
    /// every connect it was asked for, so a subsystem with no controller now, or fewer than
    /// `min`, would only run out the deadline. Nothing was asked: the controllers already
    /// connected are used, and someone may be connecting them still.
    fn reachable(&self, connects: &Connects) -> Result<()> {
        if !connects.asked() {
            return Ok(());
        }
        let have = fabrics_nvme::controllers_of(self.root, self.nqn)?
            .iter()
            .filter(|c| !c.parsed_state.as_ref().is_some_and(CtrlState::is_going))
            .count();
        if have >= self.min {
            return Ok(());
        }
        let mut failed = connects.portals.iter().filter_map(|p| p.failure).peekable();
        let refused =
            failed.peek().is_some() && failed.all(|k| k == crate::ErrorKind::PermissionDenied);
        if have == 0 && refused {
            return Err(Error::Refused {
                what: format!("{}{}", self.spec, connects.describe()),
            });
        }
        let what = if have == 0 {
            format!(
                "no path to {} can come: the subsystem has no controller after the \
                 connects{}; check the portals and that the subsystem lets this host in",
                self.spec,
                connects.describe()
            )
        } else {
            format!(
                "{} paths to {} were asked but the subsystem has {have} controller(s) after \
                 the connects{}; connect more portals or ask for fewer paths",
                self.min,
                self.spec,
                connects.describe()
            )
        };
        Err(Error::NotFound { what })
    }

    /// The namespace's devices once they have a path through every live controller of the
    /// subsystem, or at the deadline whatever came if that is at least `min` paths. Nothing
    /// at all, with every connect failed, is [`Error::NotFound`]; too few is
    /// [`Error::Timeout`], naming each portal's connect.
    fn for_paths(
        &self,
        monitor: Option<&mut Subscription>,
        connects: &Connects,
        deadline: Instant,
    ) -> Result<Vec<(NvmeNamespace, NamespaceDevice)>> {
        let (root, nqn, namespace, min) = (self.root, self.nqn, self.namespace, self.min);
        let what = || {
            format!(
                "{} on every live controller of the subsystem{}",
                self.spec,
                connects.describe()
            )
        };
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
                let none_connected = connects.portals.iter().all(|c| c.result.is_err());
                Err(if devices.is_empty() && none_connected {
                    Error::NotFound {
                        what: format!(
                            "{what} did not come: every connect failed; check the portals and \
                             that the subsystem lets this host in"
                        ),
                    }
                } else {
                    Error::Timeout { what, waited }
                })
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

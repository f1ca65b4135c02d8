//! The NVMe resize: the controllers asked what the namespace is, then told to rescan until
//! its device has that size.

use std::time::Instant;

use crate::block::sysfs as sysblock;
use crate::error::{Error, ResizeFailure, Result};
use crate::helper;
use crate::id::Nqn;
use crate::nvme::sysfs::CtrlState;
use crate::nvme::{self as fabrics_nvme};
use crate::root::Root;
use crate::uevent::{Action, Subscription, Uevent};
use crate::wait;

use super::{check_selector, lock_key, selected};
use crate::ops::lock;
use crate::ops::options::{RESCAN_INTERVAL, ResizeOptions};
use crate::ops::report::{NamespaceSize, NvmeResize, Resized, ResizedFamily};
use crate::ops::spec::{NamespaceSelector, VolumeSpec};

/// Identify Namespace `nsid` through every controller in `names` at once: each one's answer
/// in bytes, in the order given. The first failure is the result, as a step naming the
/// controller.
fn identify_all(
    root: &Root,
    names: &[&str],
    nsid: u32,
    deadline: Instant,
) -> Result<Vec<(String, u64)>> {
    let answers = helper::fan_out("lunkit-nvme-identify", names, |&c| {
        let id = fabrics_nvme::identify_namespace(root, c, nsid, deadline)?;
        id.size_bytes().ok_or_else(|| Error::Invalid {
            kind: "Identify Namespace data",
            input: format!("{} blocks of {} bytes", id.blocks, id.block_bytes),
            reason: "the namespace's size does not fit in 64 bits",
        })
    });
    names
        .iter()
        .zip(answers)
        .map(|(&c, r)| {
            r.map(|s| (c.to_owned(), s)).map_err(|e| Error::Step {
                step: "identify",
                target: format!("controller {c}"),
                source: Box::new(e),
            })
        })
        .collect()
}

/// [`super::resize()`] of [`VolumeSpec::Nvme`]: the namespace's devices brought to the size
/// its controllers report.
///
/// 1. Identified and locked as a detach of it would be (same key), so the two never
///    interleave.
/// 2. Every controller of the subsystem must be `live`: one that is reconnecting cannot be
///    asked, and would bring its own view of the size when it comes back
///    ([`ResizeFailure::PathDown`]).
/// 3. Each controller is asked what the namespace is (Identify Namespace), all at once. With
///    [`ResizeOptions::expect_size`] they are asked again every
///    [`RESCAN_INTERVAL`] (or when the namespace changes) until each reports
///    at least that much. They must agree
///    ([`ResizeFailure::SizesDiffer`]), and the namespace must not have shrunk below its
///    device ([`ResizeFailure::Shrunk`]).
/// 4. Devices that already have that size are left alone: nothing is written. Otherwise
///    every controller is told to rescan (`rescan_controller`) and the wait (uevents: the
///    kernel's `change` of the device, with sysfs re-checks) lasts until every device has
///    it.
pub(in crate::ops) fn resize(
    root: &Root,
    spec: &VolumeSpec,
    nqn: &Nqn,
    namespace: &NamespaceSelector,
    opts: &ResizeOptions,
) -> Result<Resized> {
    check_selector(namespace)?;
    let start = Instant::now();
    let deadline = wait::deadline_from(start, opts.timeout);
    let absent = || Error::NotFound {
        what: format!("{spec} not found on the node"),
    };
    let first = selected(root, nqn, namespace)?;
    let key = match first.iter().find_map(|(_, d)| d.wwid.as_ref()) {
        Some(w) => w.to_multipath(),
        None => lock_key(nqn, namespace),
    };
    let _lock = lock::lock(&key, opts.lock_dir.as_deref(), deadline)?;
    // Looked at again under the lock.
    let found = selected(root, nqn, namespace)?;
    let wwid = found.iter().find_map(|(_, d)| d.wwid.clone());
    let nsid = found
        .iter()
        .find_map(|(ns, _)| ns.nsid)
        .ok_or_else(absent)?;
    let volume = found
        .iter()
        .map(|(_, d)| d.node.name.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    let refuse = |reason| Error::Resize {
        volume: volume.clone(),
        reason,
    };
    let controllers = fabrics_nvme::controllers_of(root, nqn)?;
    if let Some(c) = controllers
        .iter()
        .find(|c| c.parsed_state != Some(CtrlState::Live))
    {
        return Err(refuse(ResizeFailure::PathDown {
            path: format!("controller {}", c.name),
            state: c
                .state
                .clone()
                .unwrap_or_else(|| "in an unknown state".to_owned()),
        }));
    }
    let mut devices = found
        .iter()
        .map(|(_, d)| {
            let before = sysblock::size_of(root, &d.node.name)?;
            Ok(NamespaceSize {
                device: d.node.name.clone(),
                before,
                after: before,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let names: Vec<&str> = controllers.iter().map(|c| c.name.as_str()).collect();

    let rescan_start = Instant::now();
    let mut monitor = Subscription::open().ok();
    let ask = Ask {
        root,
        spec,
        names: &names,
        nsid,
        deadline,
    };
    let reported = ask.until_enough(monitor.as_mut(), opts.expect_size)?;
    let size = agreed_size(&reported, &devices).map_err(refuse)?;
    let rescanned = devices.iter().any(|d| d.before != size);
    if rescanned {
        fabrics_nvme::rescan(
            root,
            nqn,
            deadline.saturating_duration_since(Instant::now()),
        )?;
        wait_for_size(root, monitor.as_mut(), &devices, size, &volume, deadline)?;
    }
    for d in &mut devices {
        d.after = sysblock::size_of(root, &d.device)?;
    }
    let rescan_elapsed = rescan_start.elapsed();
    let device_node = match devices.as_slice() {
        [one] => Some(root.dev(&one.device)),
        _ => None,
    };
    Ok(Resized {
        device_node,
        wwid,
        family: ResizedFamily::Nvme(NvmeResize { devices, reported }),
        rescanned,
        rescan_elapsed,
        elapsed: start.elapsed(),
    })
}

/// `nvme0 67108864 bytes, nvme1 67108864 bytes`, for messages.
fn sizes(reported: &[(String, u64)]) -> String {
    reported
        .iter()
        .map(|(c, s)| format!("{c} {s} bytes"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Identify Namespace `nsid` through every controller of `names`, for the resize of `spec`.
struct Ask<'a> {
    root: &'a Root,
    spec: &'a VolumeSpec,
    names: &'a [&'a str],
    nsid: u32,
    deadline: Instant,
}

impl Ask<'_> {
    /// What the controllers say the namespace is, asked again every [`RESCAN_INTERVAL`] (or
    /// when the namespace changes) until each says at least `expect`.
    fn until_enough(
        &self,
        monitor: Option<&mut Subscription>,
        expect: Option<u64>,
    ) -> Result<Vec<(String, u64)>> {
        let reported = identify_all(self.root, self.names, self.nsid, self.deadline)?;
        let Some(expect) = expect else {
            return Ok(reported);
        };
        let spec = self.spec;
        let waiting_for = |said: &[(String, u64)]| {
            format!(
                "every controller of {spec} to report at least {expect} bytes (they report {}); \
                 has the namespace grown on the array?",
                sizes(said)
            )
        };
        let mut asked = Instant::now();
        let what = || waiting_for(&reported);
        let relevant = |ev: &Uevent| matches!(ev.subsystem.as_deref(), Some("block" | "nvme"));
        let mut latest = reported.clone();
        wait::until(monitor, self.deadline, &what, &relevant, || {
            if latest.iter().all(|(_, s)| *s >= expect) {
                return Ok(Some(()));
            }
            if asked.elapsed() >= RESCAN_INTERVAL {
                latest = identify_all(self.root, self.names, self.nsid, self.deadline)?;
                asked = Instant::now();
            }
            Ok(None)
        })
        .map_err(|e| match e {
            // Name what they last said, not what they said first.
            Error::Timeout { waited, .. } => Error::Timeout {
                what: waiting_for(&latest),
                waited,
            },
            e => e,
        })?;
        Ok(latest)
    }
}

/// The size every controller reported, which must be one ([`ResizeFailure::SizesDiffer`])
/// and not below a device's ([`ResizeFailure::Shrunk`]).
fn agreed_size(
    reported: &[(String, u64)],
    devices: &[NamespaceSize],
) -> std::result::Result<u64, ResizeFailure> {
    let size = reported.first().map_or(0, |(_, s)| *s);
    if reported.iter().any(|(_, s)| *s != size) {
        return Err(ResizeFailure::SizesDiffer {
            sizes: reported
                .iter()
                .map(|(c, s)| (format!("controller {c}"), *s))
                .collect(),
        });
    }
    if let Some(d) = devices.iter().find(|d| d.before > size) {
        return Err(ResizeFailure::Shrunk {
            device: d.device.clone(),
            from: d.before,
            to: size,
        });
    }
    Ok(size)
}

/// Waits until every device of `devices` has `size`, after the controllers' rescan.
fn wait_for_size(
    root: &Root,
    monitor: Option<&mut Subscription>,
    devices: &[NamespaceSize],
    size: u64,
    volume: &str,
    deadline: Instant,
) -> Result<()> {
    let what = || {
        let now: Vec<String> = devices
            .iter()
            .map(|d| match sysblock::size_of(root, &d.device) {
                Ok(s) => format!("{} {s} bytes", d.device),
                Err(_) => format!("{} gone", d.device),
            })
            .collect();
        format!(
            "{} bytes on {} after the controllers' rescan (now: {})",
            size,
            volume,
            now.join(", ")
        )
    };
    // `set_capacity_and_notify` sends the device's `change` (RESIZE=1).
    let relevant = |ev: &Uevent| {
        ev.action == Action::Change
            && ev
                .devname
                .as_deref()
                .is_some_and(|n| devices.iter().any(|d| d.device == n))
    };
    wait::until(monitor, deadline, &what, &relevant, || {
        for d in devices {
            if sysblock::size_of(root, &d.device)? != size {
                return Ok(None);
            }
        }
        Ok(Some(()))
    })
}

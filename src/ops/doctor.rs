//! What earlier attaches and detaches left on a node, found in one read of it: devices the
//! kernel gave up on, paths an array re-mapped under a map, maps with no working path,
//! iSCSI sessions that carry nothing in use, NVMe controllers that are not live; and, asked
//! with TEST UNIT READY, disks whose LUN the array no longer serves. Each
//! finding names the objects, says why it is a problem, and carries the same in-use check a
//! detach makes on its devices, so an operator knows what may be cleaned and what a pod
//! still holds. Nothing here writes.
//!
//! ```no_run
//! use lunkit::Root;
//! use lunkit::ops::doctor::{self, DoctorOptions};
//!
//! let found = doctor::examine(&Root::default(), &DoctorOptions::default())?;
//! for f in &found.findings {
//!     println!("{}: {} ({})", f.kind, f.objects.join(" "), f.why);
//! }
//! # Ok::<(), lunkit::Error>(())
//! ```

use std::fmt;
use std::time::{Duration, Instant};

use crate::block::{self, Usage, UsageScope};
use crate::error::Result;
use crate::nvme::sysfs::{CtrlState, parse_namespace_name};
use crate::root::Root;
use crate::scsi::PATH_MANAGERS;
use crate::scsi::sysfs::ScsiState;
use crate::topology::Topology;

/// What kind of leftover a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum Kind {
    /// A SCSI device the kernel set `offline` or `transport-offline`: every command fails.
    ScsiDeviceDown,
    /// A path whose WWID is not its map's: the array re-mapped the LUN number to another
    /// volume, and the map now mixes two volumes' blocks.
    RemappedPath,
    /// A multipath map with no path device at all.
    MapWithoutPaths,
    /// A multipath map whose every path device is down (offline, transport-offline).
    MapPathsDown,
    /// An iSCSI session none of whose LUNs (nor the maps on them) anything uses.
    IdleSession,
    /// An NVMe controller that is not `live` (reconnecting, resetting, being deleted).
    NvmeControllerDown,
    /// A `running` SCSI disk that answers TEST UNIT READY with LOGICAL UNIT NOT SUPPORTED
    /// (ILLEGAL REQUEST, 25/00): the array deleted or unmapped the LUN, and the device is a
    /// phantom. Only asked when [`DoctorOptions::check_use`] is set; a disk that does not
    /// open or answer in time is not one.
    LunGone,
}

impl Kind {
    /// The kind's name in the CLI and JSON (`scsi-device-down`).
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::ScsiDeviceDown => "scsi-device-down",
            Kind::RemappedPath => "remapped-path",
            Kind::MapWithoutPaths => "map-without-paths",
            Kind::MapPathsDown => "map-paths-down",
            Kind::IdleSession => "idle-session",
            Kind::NvmeControllerDown => "nvme-controller-down",
            Kind::LunGone => "lun-gone",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One thing found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// What it is.
    pub kind: Kind,
    /// The objects involved, by the names the kernel gives them (`2:0:0:1`, `sdc`, `mpatha`,
    /// `session3`, `nvme2`).
    pub objects: Vec<String>,
    /// Why it is a problem, in a sentence.
    pub why: String,
    /// What the objects were when found, for a fix to check again before it writes: the
    /// WWID a SCSI device or path reported, a map's WWID, an NVMe controller's subsystem
    /// NQN; `None` when there is none (an iSCSI session, a device without VPD page 0x83).
    pub identity: Option<String>,
    /// The block devices whose users decide whether it may be cleaned up.
    pub devices: Vec<String>,
    /// Who uses those devices ([`crate::block::usage`], as a detach checks), when
    /// [`DoctorOptions::check_use`] asked for it and there are devices.
    pub usage: Option<Usage>,
}

impl Finding {
    /// Whether something uses its devices (or could not be checked): then nothing of it
    /// may be taken away.
    pub fn in_use(&self) -> bool {
        self.usage
            .as_ref()
            .is_some_and(|u| u.has_users() || !u.unchecked.is_empty())
    }
}

/// How [`examine`] looks.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DoctorOptions {
    /// Run the in-use check on each finding's devices, and look for idle iSCSI sessions
    /// (which only that check can tell) and for LUNs gone (which only a TEST UNIT READY to
    /// each `running` disk tells). Without it nothing is opened or probed: the node is only
    /// read.
    pub check_use: bool,
    /// The deadline of the whole examination (each in-use check's opens are bounded by it).
    pub timeout: Duration,
}

impl Default for DoctorOptions {
    fn default() -> Self {
        DoctorOptions {
            check_use: true,
            timeout: Duration::from_secs(60),
        }
    }
}

/// What [`examine`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Examination {
    /// Every finding, by kind, then by the first object's name.
    pub findings: Vec<Finding>,
    /// How long it took.
    pub elapsed: Duration,
}

/// Reads the node once ([`Topology::read`]) and reports what is left over, each finding
/// with its in-use check.
///
/// # Errors
///
/// Those of [`Topology::read`] and [`crate::block::usage`].
pub fn examine(root: &Root, opts: &DoctorOptions) -> Result<Examination> {
    let start = Instant::now();
    let deadline = crate::wait::deadline_from(start, opts.timeout);
    let topology = Topology::read(root)?;
    let mut findings = classify(&topology);
    // An idle session is one whose LUNs nothing uses: only the in-use check (a walk of every
    // process, an `O_EXCL` probe of each device) tells, so without it none is reported. A
    // caller that looks often, as the CSI plugin does, must not probe devices a stage may be
    // opening at that moment.
    if opts.check_use {
        findings.extend(lun_gone::examine(root, &topology, deadline)?);
        for (session, devices, own) in sessions(&topology) {
            let usage = usage(root, &devices, &own, deadline)?;
            if usage.is_empty() {
                findings.push(idle_session(session, devices, usage));
            }
        }
        for f in findings.iter_mut().filter(|f| f.usage.is_none()) {
            if !f.devices.is_empty() {
                f.usage = Some(usage(root, &f.devices, &[], deadline)?);
            }
        }
    }
    findings.sort_by(|a, b| (a.kind, a.objects.first()).cmp(&(b.kind, b.objects.first())));
    Ok(Examination {
        findings,
        elapsed: start.elapsed(),
    })
}

/// The findings a snapshot shows by itself (all but idle sessions, which need the in-use
/// check to tell).
pub fn classify(t: &Topology) -> Vec<Finding> {
    let mut v = scsi_down(t);
    v.extend(maps(t));
    v.extend(nvme_down(t));
    v
}

/// Whether a SCSI device state means every command fails.
fn down(state: Option<&str>) -> bool {
    matches!(
        state.map(ScsiState::parse),
        Some(ScsiState::Offline | ScsiState::TransportOffline)
    )
}

fn scsi_down(t: &Topology) -> Vec<Finding> {
    t.scsi_devices
        .iter()
        .filter(|d| down(d.state.as_deref()))
        .map(|d| Finding {
            kind: Kind::ScsiDeviceDown,
            objects: std::iter::once(d.hctl.to_string())
                .chain(d.block.clone())
                .collect(),
            why: format!(
                "the kernel set it {}: every command to it fails",
                d.state.as_deref().unwrap_or("?")
            ),
            identity: d.wwid.clone(),
            devices: d.block.iter().cloned().collect(),
            usage: None,
        })
        .collect()
}

fn maps(t: &Topology) -> Vec<Finding> {
    let mut v = Vec::new();
    for m in t.multipath_maps() {
        let name = m.name.unwrap_or(m.dm).to_owned();
        let map = || Finding {
            kind: Kind::MapWithoutPaths,
            objects: vec![name.clone(), m.dm.to_owned()],
            why: String::new(),
            identity: Some(m.wwid.to_owned()),
            devices: vec![m.dm.to_owned()],
            usage: None,
        };
        for (path, wwid) in &m.foreign_paths {
            v.push(Finding {
                kind: Kind::RemappedPath,
                objects: vec![name.clone(), (*path).to_owned()],
                why: format!(
                    "{path} reports WWID {wwid}, not the map's {}: the LUN was re-mapped",
                    m.wwid
                ),
                identity: Some(wwid.clone()),
                ..map()
            });
        }
        if m.paths.is_empty() {
            v.push(Finding {
                why: "the map has no path device: its I/O can only queue or fail".into(),
                ..map()
            });
        } else if m.paths.iter().all(|p| path_down(t, p)) {
            v.push(Finding {
                kind: Kind::MapPathsDown,
                why: format!("every path is down ({})", m.paths.join(", ")),
                ..map()
            });
        }
    }
    v
}

/// Whether path device `name` is a SCSI device that is down.
fn path_down(t: &Topology, name: &str) -> bool {
    t.scsi_devices
        .iter()
        .find(|d| d.block.as_deref() == Some(name))
        .is_some_and(|d| down(d.state.as_deref()))
}

fn nvme_down(t: &Topology) -> Vec<Finding> {
    t.nvme_controllers
        .iter()
        .filter(|c| c.transport.as_deref() != Some("pcie"))
        .filter(|c| {
            c.parsed_state
                .as_ref()
                .is_some_and(|s| *s != CtrlState::Live)
        })
        .map(|c| {
            // The subsystem's heads, and the controller's own namespace devices: without
            // native multipath (`nvme_core.multipath=N`) `nvme0n1` is the controller's, not
            // the subsystem's, and a fix must see who uses it.
            let own = c
                .namespaces
                .iter()
                .filter(|n| matches!(parse_namespace_name(n), Some((_, None, _))));
            let mut heads: Vec<String> = t
                .nvme_subsystems
                .iter()
                .filter(|s| s.controllers.contains(&c.name))
                .flat_map(|s| s.namespaces.iter())
                .chain(own)
                .cloned()
                .collect();
            heads.sort();
            heads.dedup();
            Finding {
                kind: Kind::NvmeControllerDown,
                objects: vec![c.name.clone()],
                why: format!(
                    "it is {} (subsystem {}), not live",
                    c.state.as_deref().unwrap_or("?"),
                    c.subsysnqn.as_deref().unwrap_or("?")
                ),
                identity: c.subsysnqn.clone(),
                devices: heads,
                usage: None,
            }
        })
        .collect()
}

/// Each iSCSI session with its LUNs' block devices and the multipath maps on them.
fn sessions(t: &Topology) -> Vec<(String, Vec<String>, Vec<String>)> {
    let maps: Vec<_> = t.multipath_maps().collect();
    t.iscsi_sessions
        .iter()
        .map(|s| {
            let devices: Vec<String> = s
                .host
                .map(|h| {
                    t.devices_on_host(h)
                        .filter_map(|d| d.block.clone())
                        .collect()
                })
                .unwrap_or_default();
            let own = maps
                .iter()
                .filter(|m| m.paths.iter().any(|p| devices.contains(p)))
                .map(|m| m.dm.to_owned())
                .collect();
            (format!("session{}", s.sid), devices, own)
        })
        .collect()
}

fn idle_session(session: String, devices: Vec<String>, usage: Usage) -> Finding {
    Finding {
        kind: Kind::IdleSession,
        why: if devices.is_empty() {
            "the session carries no LUN".into()
        } else {
            format!(
                "nothing uses its LUNs ({}) or a map on them",
                devices.join(", ")
            )
        },
        objects: std::iter::once(session)
            .chain(devices.iter().cloned())
            .collect(),
        identity: None,
        devices,
        usage: Some(usage),
    }
}

/// The in-use check on `devices` (kernel names; those gone meanwhile are passed over), the
/// maps named in `own` counting as part of them.
fn usage(root: &Root, devices: &[String], own: &[String], deadline: Instant) -> Result<Usage> {
    let mut nodes = Vec::new();
    for d in devices {
        if let Some(n) = block::by_name(root, d)? {
            nodes.push(n);
        }
    }
    if nodes.is_empty() {
        return Ok(Usage::default());
    }
    let scope = UsageScope {
        own,
        ignore_openers: PATH_MANAGERS,
    };
    block::usage(root, &nodes, &scope, deadline)
}

mod fix;
mod lun_gone;

pub use fix::{FixOptions, FixOutcome, Fixes, fix};

#[cfg(test)]
mod tests;

//! What earlier attaches and detaches left on a node, found in one read of it: devices the
//! kernel gave up on or that stay blocked, paths an array re-mapped under a map, maps with no
//! working path (and whether they queue), iSCSI sessions and NVMe subsystems that carry
//! nothing in use, NVMe controllers that stay not live, lunkit's own records (in
//! [`DoctorOptions::lock_dir`]) that name nothing or an address the array re-mapped; and,
//! asked with TEST UNIT READY, disks whose LUN the array no longer serves. Each
//! finding names the objects, says why it is a problem, and carries the same in-use check a
//! detach makes on its devices, so an operator knows what may be cleaned and what a pod
//! still holds.
//!
//! A state the kernel may still recover from (a SCSI device `blocked`, an NVMe controller
//! `connecting`) is a finding only once it has lasted past [`DoctorOptions::grace`]; before
//! that it is [`Examination::pending`]. Nothing on the node is written: only lunkit's own
//! record of when each such state was first seen (`seen`).
//!
//! ```no_run
//! use lunkit::Root;
//! use lunkit::ops::doctor::{self, DoctorOptions};
//!
//! let root = Root::default();
//! let found = doctor::examine(&root, &DoctorOptions::new(&root))?;
//! for f in &found.findings {
//!     println!("{}: {} ({})", f.kind, f.objects.join(" "), f.why);
//! }
//! # Ok::<(), lunkit::Error>(())
//! ```

use std::fmt;
use std::path::PathBuf;
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
    /// A SCSI device `blocked` (its transport recovering) for longer than the grace:
    /// commands to it wait, and the transport does not come back.
    ScsiDeviceBlocked,
    /// A path whose WWID is not its map's: the array re-mapped the LUN number to another
    /// volume, and the map now mixes two volumes' blocks.
    RemappedPath,
    /// A multipath map with no path device at all.
    MapWithoutPaths,
    /// A multipath map whose every path device is down (offline, transport-offline).
    MapPathsDown,
    /// An iSCSI session none of whose LUNs (nor the maps on them) anything uses.
    IdleSession,
    /// An NVMe over Fabrics controller not `live` (reconnecting, resetting, being deleted)
    /// for longer than the grace.
    NvmeControllerDown,
    /// An NVMe over Fabrics subsystem none of whose namespaces anything uses, and none of
    /// which lunkit marked attached: controllers kept for nothing.
    IdleSubsystem,
    /// A name record (`<lock_dir>/names/`) whose WWID no device on the node carries, with
    /// nothing at its address: it names nothing.
    StaleNameRecord,
    /// Devices at a name record's address report another WWID than the record: the array
    /// gave the LUN number (or namespace id) to another volume.
    RemappedAddress,
    /// An NVMe attach mark (`<lock_dir>/attached/`) whose namespace no controller of its
    /// subsystem serves: it keeps the subsystem's controllers through every detach.
    StaleAttachMark,
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
            Kind::ScsiDeviceBlocked => "scsi-device-blocked",
            Kind::RemappedPath => "remapped-path",
            Kind::MapWithoutPaths => "map-without-paths",
            Kind::MapPathsDown => "map-paths-down",
            Kind::IdleSession => "idle-session",
            Kind::NvmeControllerDown => "nvme-controller-down",
            Kind::IdleSubsystem => "idle-subsystem",
            Kind::StaleNameRecord => "stale-name-record",
            Kind::RemappedAddress => "remapped-address",
            Kind::StaleAttachMark => "stale-attach-mark",
            Kind::LunGone => "lun-gone",
        }
    }
}

impl Kind {
    /// Whether the kernel may still bring it back by itself: then it is a finding only once
    /// it has lasted past [`DoctorOptions::grace`].
    /// A stale attach mark is one: the array may hide a namespace for a moment (a
    /// re-masking, a namespace moved between pools) and show it again.
    pub fn recoverable(self) -> bool {
        matches!(
            self,
            Kind::ScsiDeviceBlocked | Kind::NvmeControllerDown | Kind::StaleAttachMark
        )
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
    /// NQN, the WWID a name record holds, an attach mark's subsystem NQN; `None` when there
    /// is none (an iSCSI session, a device without VPD page 0x83).
    pub identity: Option<String>,
    /// The block devices whose users decide whether it may be cleaned up.
    pub devices: Vec<String>,
    /// Who uses those devices ([`crate::block::usage`], as a detach checks), when
    /// [`DoctorOptions::check_use`] asked for it and there are devices.
    pub usage: Option<Usage>,
    /// For a state the kernel may recover from ([`Kind::recoverable`]): how long doctor
    /// has seen it, from its first sighting (`None` for the other kinds).
    pub since: Option<Duration>,
    /// For a map finding: whether the map queues I/O (`queue_if_no_path`), so that writes
    /// to it hang rather than fail; `None` for the other kinds, or when its table could not
    /// be read.
    pub queues: Option<bool>,
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
    /// Run the in-use check on each finding's devices, and look for idle iSCSI sessions and
    /// NVMe subsystems (which only that check can tell) and for LUNs gone (which only a TEST
    /// UNIT READY to each `running` disk tells). Without it nothing is opened or probed: the
    /// node is only read.
    pub check_use: bool,
    /// The deadline of the whole examination (each in-use check's opens are bounded by it).
    pub timeout: Duration,
    /// How long a state the kernel may still recover from ([`Kind::recoverable`]) must have
    /// been seen before it is a finding: 120 s, the default iSCSI `replacement_timeout`
    /// (an FC port's `dev_loss_tmo` is shorter, NVMe's `ctrl_loss_tmo` 600 s). Zero: at
    /// once.
    pub grace: Duration,
    /// lunkit's lock directory, as attach and detach use it: its `names/` and `attached/`
    /// records, and doctor's own record of first sightings (`doctor/seen`). `None`: no
    /// record is read or kept, and a recoverable state is always seen for the first time.
    pub lock_dir: Option<PathBuf>,
}

impl DoctorOptions {
    /// The defaults for `root`: the in-use check, 60 s, a grace of 120 s, the lock
    /// directory a detach uses.
    pub fn new(root: &Root) -> DoctorOptions {
        DoctorOptions {
            check_use: true,
            timeout: Duration::from_secs(60),
            grace: Duration::from_secs(120),
            lock_dir: crate::ops::DetachOptions::new(root).lock_dir,
        }
    }
}

/// What [`examine`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Examination {
    /// Every finding, by kind, then by the first object's name.
    pub findings: Vec<Finding>,
    /// States the kernel may still recover from, seen for less than the grace: not (yet)
    /// findings, each with how long it has been seen.
    pub pending: Vec<Finding>,
    /// The grace they were held to ([`DoctorOptions::grace`]).
    pub grace: Duration,
    /// How long it took.
    pub elapsed: Duration,
}

/// Reads the node once ([`Topology::read`]) and reports what is left over, each finding
/// with its in-use check; recoverable states seen for less than the grace are pending.
///
/// # Errors
///
/// Those of [`Topology::read`] and [`crate::block::usage`]; the record of first sightings
/// or `/proc/uptime` could not be read or written ([`Error::Io`](crate::Error::Io), naming
/// the file).
pub fn examine(root: &Root, opts: &DoctorOptions) -> Result<Examination> {
    let start = Instant::now();
    let deadline = crate::wait::deadline_from(start, opts.timeout);
    let topology = Topology::read(root)?;
    let mut seen = seen::Seen::load(root, opts.lock_dir.as_deref())?;
    let mut all = classify(&topology);
    if let Some(dir) = &opts.lock_dir {
        all.extend(records::classify(&topology, &records::read(dir)?));
    }
    let (mut findings, mut pending) = settle(all, &mut seen, opts.grace);
    seen.save()?;
    states::explain(root, &mut findings);
    states::explain(root, &mut pending);
    // An idle session or subsystem is one whose devices nothing uses: only the in-use check
    // (a walk of every process, an `O_EXCL` probe of each device) tells, so without it none
    // is reported. A caller that looks often, as the CSI plugin does, must not probe
    // devices a stage may be opening at that moment.
    if opts.check_use {
        findings.extend(lun_gone::examine(root, &topology, deadline)?);
        check_use(root, &topology, opts, &mut findings, deadline)?;
    }
    let order =
        |a: &Finding, b: &Finding| (a.kind, a.objects.first()).cmp(&(b.kind, b.objects.first()));
    findings.sort_by(order);
    pending.sort_by(order);
    Ok(Examination {
        findings,
        pending,
        grace: opts.grace,
        elapsed: start.elapsed(),
    })
}

/// The findings, and the recoverable states seen for less than `grace` (each timed by
/// `seen`, which keeps them for the next examination).
fn settle(
    all: Vec<Finding>,
    seen: &mut seen::Seen,
    grace: Duration,
) -> (Vec<Finding>, Vec<Finding>) {
    let (mut findings, mut pending) = (Vec::new(), Vec::new());
    for mut f in all {
        if !f.kind.recoverable() {
            findings.push(f);
            continue;
        }
        let since = seen.since(&f);
        f.since = Some(since);
        match since >= grace {
            true => findings.push(f),
            false => pending.push(f),
        }
    }
    (findings, pending)
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

/// Whether a SCSI device state means its transport is recovering: commands wait.
fn blocked(state: Option<&str>) -> bool {
    matches!(
        state.map(ScsiState::parse),
        Some(ScsiState::Blocked | ScsiState::CreatedBlocked)
    )
}

fn scsi_down(t: &Topology) -> Vec<Finding> {
    t.scsi_devices
        .iter()
        .filter_map(|d| {
            let state = d.state.as_deref();
            let (kind, why) = if down(state) {
                (Kind::ScsiDeviceDown, "every command to it fails")
            } else if blocked(state) {
                (
                    Kind::ScsiDeviceBlocked,
                    "its transport has not recovered, and commands to it wait",
                )
            } else {
                return None;
            };
            Some(Finding {
                kind,
                objects: std::iter::once(d.hctl.to_string())
                    .chain(d.block.clone())
                    .collect(),
                why: format!("the kernel set it {}: {why}", state.unwrap_or("?")),
                identity: d.wwid.clone(),
                devices: d.block.iter().cloned().collect(),
                usage: None,
                since: None,
                queues: None,
            })
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
            since: None,
            queues: None,
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
                since: None,
                queues: None,
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
        since: None,
        queues: None,
    }
}

/// The in-use check of every iSCSI session, every fabrics subsystem that may be idle and
/// every finding with devices, all in one ([`block::usages`]: one walk over the processes
/// for all of them, where a check each walked every process once per session and finding).
/// A session or subsystem nothing uses becomes a finding.
fn check_use(
    root: &Root,
    topology: &Topology,
    opts: &DoctorOptions,
    findings: &mut Vec<Finding>,
    deadline: Instant,
) -> Result<()> {
    let sessions = sessions(topology);
    let subsystems = subsystems::unmarked(topology, opts)?;
    let asked: Vec<usize> = (0..findings.len())
        .filter(|&i| findings[i].usage.is_none() && !findings[i].devices.is_empty())
        .collect();
    let mut sets: Vec<(&[String], &[String])> = Vec::new();
    sets.extend(sessions.iter().map(|(_, d, own)| (&d[..], &own[..])));
    sets.extend(subsystems.iter().map(|(_, _, d)| (&d[..], &[][..])));
    sets.extend(asked.iter().map(|&i| (&findings[i].devices[..], &[][..])));
    let mut found = usages(root, &sets, deadline)?.into_iter();
    let mut idle = Vec::new();
    for ((session, devices, _), u) in sessions.into_iter().zip(found.by_ref()) {
        if u.is_empty() {
            idle.push(idle_session(session, devices, u));
        }
    }
    for ((s, nqn, devices), u) in subsystems.into_iter().zip(found.by_ref()) {
        if u.is_empty() {
            idle.push(subsystems::finding(s, nqn, devices, u));
        }
    }
    for (i, u) in asked.into_iter().zip(found) {
        findings[i].usage = Some(u);
    }
    findings.extend(idle);
    Ok(())
}

/// The in-use check on `devices` (kernel names; those gone meanwhile are passed over), the
/// maps named in `own` counting as part of them.
fn usage(root: &Root, devices: &[String], own: &[String], deadline: Instant) -> Result<Usage> {
    Ok(usages(root, &[(devices, own)], deadline)?
        .pop()
        .unwrap_or_default())
}

/// [`usage`] of each `(devices, own)` set, with one walk for all of them. A set none of
/// whose devices is there any more is used by nobody.
fn usages(root: &Root, sets: &[(&[String], &[String])], deadline: Instant) -> Result<Vec<Usage>> {
    let mut nodes: Vec<Vec<block::BlockNode>> = Vec::with_capacity(sets.len());
    for (devices, _) in sets {
        let mut here = Vec::new();
        for d in *devices {
            if let Some(n) = block::by_name(root, d)? {
                here.push(n);
            }
        }
        nodes.push(here);
    }
    let asks: Vec<block::UsageAsk<'_>> = nodes
        .iter()
        .zip(sets)
        .filter(|(n, _)| !n.is_empty())
        .map(|(n, (_, own))| block::UsageAsk {
            devices: n,
            scope: UsageScope {
                own,
                ignore_openers: PATH_MANAGERS,
            },
        })
        .collect();
    let mut found = block::usages(root, &asks, deadline)?.into_iter();
    Ok(nodes
        .iter()
        .map(|n| match n.is_empty() {
            true => Usage::default(),
            false => found.next().unwrap_or_default(),
        })
        .collect())
}

mod fix;
mod lun_gone;
mod records;
mod seen;
mod states;
mod subsystems;

pub use fix::{FixOptions, FixOutcome, Fixes, fix};

#[cfg(test)]
mod tests;

//! What the workflows report: an attach ([`Attachment`]), a detach ([`DetachReport`], made
//! of [`Step`]s) and a resize ([`Resized`]). An attach and a resize say which family the
//! volume is of ([`AttachedFamily`], [`ResizedFamily`]), each with only what applies to it.

use std::fmt;
use std::time::Duration;

use crate::block::BlockNode;
use crate::id::{Hctl, Wwid};
use crate::multipath::GrownBy;
use crate::nvme::Connected;
use crate::scsi::scan::PathScan;

use super::spec::Identity;

/// What an NVMe attach did: [`AttachedFamily::Nvme`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvmeAttachment {
    /// The namespace's id, as the node sees it (whichever way the namespace was named).
    pub nsid: Option<u32>,
    /// The namespace's block devices (one head under native multipath).
    pub devices: Vec<BlockNode>,
    /// The controllers through which the namespace came.
    pub controllers: Vec<String>,
    /// Every portal asked for ([`NvmeAttachOptions::connect`](super::NvmeAttachOptions::connect)),
    /// then every path of the subsystem that discovery found, with how its connect went.
    pub portals: Vec<PortalConnect>,
    /// Every discovery service asked ([`NvmeAttachOptions::discover`](super::NvmeAttachOptions::discover),
    /// and the services their logs refer to), with the subsystem's paths it listed.
    pub discovery: Vec<DiscoveryService>,
}

/// One portal's connect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortalConnect {
    /// `addr:port`.
    pub portal: String,
    /// Whether a discovery log listed it, rather than the caller.
    pub discovered: bool,
    /// The controller made or found, or why there is none (for a discovered path, also:
    /// its port requires TLS).
    pub result: std::result::Result<Connected, String>,
    /// The kind of a failed connect's error ([`crate::ErrorKind::PermissionDenied`] for a
    /// refused DH-HMAC-CHAP secret); `None` when it connected or was not tried.
    pub failure: Option<crate::ErrorKind>,
}

/// One discovery service an NVMe attach asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveryService {
    /// `addr:port`.
    pub service: String,
    /// The discovery address given through which it was reached: itself, or the one whose
    /// log (or a log it referred to) refers to it.
    pub via: String,
    /// The subsystem's TCP paths its log listed (`addr:port`; what became of each is in
    /// [`NvmeAttachment::portals`]), or why it did not answer.
    pub result: std::result::Result<Vec<String>, String>,
}

impl std::fmt::Display for DiscoveryService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "discovery at {}", self.service)?;
        if self.via != self.service {
            write!(f, " (referred, via {})", self.via)?;
        }
        match &self.result {
            Ok(paths) if paths.is_empty() => write!(f, ": no path of the subsystem"),
            Ok(paths) => write!(f, ": listed {}", paths.join(", ")),
            Err(e) => write!(f, ": failed: {e}"),
        }
    }
}

impl std::fmt::Display for PortalConnect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.result {
            Ok(c) if c.existing => {
                write!(f, "{}: {} (already connected)", self.portal, c.controller)
            }
            Ok(c) => write!(f, "{}: {} (connected)", self.portal, c.controller),
            Err(e) => write!(f, "{}: failed: {e}", self.portal),
        }
    }
}

/// One path's size before and after its rescan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathSize {
    /// Its SCSI address.
    pub hctl: Hctl,
    /// Its disk's kernel name (`sdc`).
    pub disk: String,
    /// `7:0:0:1 (sdc)`, for messages.
    pub device: String,
    /// Size in bytes before.
    pub before: u64,
    /// Size in bytes after.
    pub after: u64,
}

/// The multipath map's size before and after.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapSize {
    /// The map name (`mpatha`).
    pub name: String,
    /// `mpatha (dm-0)`, for messages.
    pub device: String,
    /// Size in bytes before.
    pub before: u64,
    /// Size in bytes after.
    pub after: u64,
    /// How it grew ([`GrownBy::Unchanged`] when it already had the paths' size).
    pub by: GrownBy,
}

/// An NVMe namespace's block device in a resize.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamespaceSize {
    /// Its kernel name (`nvme0n1`: the native-multipath head, or, without native multipath,
    /// one controller's own device).
    pub device: String,
    /// Size in bytes before.
    pub before: u64,
    /// Size in bytes after.
    pub after: u64,
}

/// What a resize of an NVMe namespace saw and did: [`ResizedFamily::Nvme`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvmeResize {
    /// The namespace's block devices.
    pub devices: Vec<NamespaceSize>,
    /// What each controller of the subsystem answered to Identify Namespace, in bytes: the
    /// size the devices were brought to.
    pub reported: Vec<(String, u64)>,
}

/// What a resize of a SCSI LUN saw and did: [`ResizedFamily::Scsi`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScsiResize {
    /// Every path, in address order.
    pub paths: Vec<PathSize>,
    /// The multipath map, when the volume has one.
    pub map: Option<MapSize>,
    /// How long growing the map took (multipathd's `resize map` or the table reload).
    pub map_elapsed: Duration,
}

/// Which family a resized volume is of, with what the resize did there.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ResizedFamily {
    /// A SCSI LUN: its paths and its map.
    Scsi(ScsiResize),
    /// An NVMe namespace: its devices and what its controllers reported.
    Nvme(NvmeResize),
}

/// What [`resize`](super::resize()) did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resized {
    /// The volume's WWID, when it has one.
    pub wwid: Option<Wwid>,
    /// What was resized, by family.
    pub family: ResizedFamily,
    /// Whether any path (or NVMe controller) was rescanned: not when the volume already had
    /// the expected size.
    pub rescanned: bool,
    /// How long the rescans took, the wait for [`super::ResizeOptions::expect_size`] included.
    pub rescan_elapsed: Duration,
    /// How long the whole resize took.
    pub elapsed: Duration,
    /// The device node to open for the volume, under the root the resize was given: see
    /// [`Resized::device`].
    pub device_node: Option<std::path::PathBuf>,
}

impl Resized {
    /// The device node to open for the volume, under the [`Root`](crate::Root) the resize
    /// was given (`<root>/dev/dm-0`, `<root>/dev/sdc`, `<root>/dev/nvme0n1`), whatever the
    /// transport, as [`Attachment::device`] gives it: its multipath map; else its one path or
    /// NVMe device. `None` when there are several and no map over them (which to use is the
    /// caller's choice: [`ScsiResize::paths`], [`NvmeResize::devices`]).
    pub fn device(&self) -> Option<&std::path::Path> {
        self.device_node.as_deref()
    }

    /// The SCSI part, for a SCSI LUN.
    pub fn scsi(&self) -> Option<&ScsiResize> {
        match &self.family {
            ResizedFamily::Scsi(s) => Some(s),
            ResizedFamily::Nvme(_) => None,
        }
    }

    /// The NVMe part, for an NVMe namespace.
    pub fn nvme(&self) -> Option<&NvmeResize> {
        match &self.family {
            ResizedFamily::Nvme(n) => Some(n),
            ResizedFamily::Scsi(_) => None,
        }
    }

    /// The volume's size now, in bytes: the map's, or the paths' without one, or the NVMe
    /// namespace device's.
    pub fn size(&self) -> u64 {
        match &self.family {
            ResizedFamily::Nvme(n) => n.devices.first().map_or(0, |d| d.after),
            ResizedFamily::Scsi(s) => match &s.map {
                Some(m) => m.after,
                None => s.paths.first().map_or(0, |p| p.after),
            },
        }
    }

    /// Whether any device changed size.
    pub fn changed(&self) -> bool {
        match &self.family {
            ResizedFamily::Nvme(n) => n.devices.iter().any(|d| d.before != d.after),
            ResizedFamily::Scsi(s) => {
                s.paths.iter().any(|p| p.before != p.after)
                    || s.map.as_ref().is_some_and(|m| m.before != m.after)
            }
        }
    }
}

/// A step of a detach.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StepKind {
    /// Turn the caller's name for the volume into its identity.
    Identify,
    /// Take the volume's lock.
    Lock,
    /// Resume a map of the volume found suspended. A suspended map holds every I/O sent to
    /// it, a flush's included, until it is resumed; a detach or a table reload killed between
    /// its suspend and its resume leaves one so.
    ResumeMap,
    /// Check that nothing uses the volume.
    CheckInUse,
    /// The caller's own step with the volume unused and still in place, its maps flushed
    /// ([`detach_before_removal`](crate::ops::detach_before_removal)).
    BeforeRemoval,
    /// Make a map that no path can serve fail its I/O instead of queueing it (multipathd's
    /// `disablequeueing`, dm's `fail_if_no_path`), so readers stuck on it let go.
    DisableQueueing,
    /// Flush the multipath map.
    FlushMap,
    /// Remove the multipath map.
    RemoveMap,
    /// Flush a path's disk.
    FlushPath,
    /// Delete a path's SCSI device.
    DeletePath,
    /// Flush an NVMe namespace's device.
    FlushNamespace,
    /// Delete an NVMe controller (`delete_controller`).
    DeleteController,
    /// Check that nothing of the volume is left.
    Verify,
}

impl StepKind {
    /// Its name in reports: `check-in-use`, `remove-map`...
    pub fn as_str(self) -> &'static str {
        match self {
            StepKind::Identify => "identify",
            StepKind::Lock => "lock",
            StepKind::ResumeMap => "resume-map",
            StepKind::CheckInUse => "check-in-use",
            StepKind::BeforeRemoval => "before-removal",
            StepKind::DisableQueueing => "disable-queueing",
            StepKind::FlushMap => "flush-map",
            StepKind::RemoveMap => "remove-map",
            StepKind::FlushPath => "flush-path",
            StepKind::DeletePath => "delete-path",
            StepKind::FlushNamespace => "flush-namespace",
            StepKind::DeleteController => "delete-controller",
            StepKind::Verify => "verify",
        }
    }
}

/// How a step ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// It did its work.
    Done,
    /// There was nothing to do: already gone.
    AlreadyGone,
    /// It failed or refused and the detach went on (forced, or the failure cannot lose data);
    /// the text says why.
    Skipped(String),
    /// It failed; the detach retries or ends with the error.
    Failed(String),
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Done => f.write_str("done"),
            Outcome::AlreadyGone => f.write_str("already gone"),
            Outcome::Skipped(why) => write!(f, "skipped: {why}"),
            Outcome::Failed(why) => write!(f, "failed: {why}"),
        }
    }
}

/// One step as it happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// What it was.
    pub kind: StepKind,
    /// What it acted on (`mpatha (dm-0)`, `7:0:0:1 (sdc)`).
    pub target: String,
    /// How it ended.
    pub outcome: Outcome,
    /// When it began, from the start of the workflow (of which [`DetachReport::duration`]
    /// is the whole): steps that ran side by side overlap, and the time between steps is
    /// work no step covers (looking the volume up again between rounds, say).
    pub start: Duration,
    /// How long it took.
    pub duration: Duration,
}

/// What [`detach`](super::detach()) did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DetachReport {
    /// The volume's identity.
    pub identity: Identity,
    /// Every step, in order.
    pub steps: Vec<Step>,
    /// How many take-down rounds ran (0: there was nothing to take down).
    pub rounds: u32,
    /// The whole detach.
    pub duration: Duration,
}

/// A volume brought onto the node.
#[derive(Debug)]
pub struct Attachment {
    /// Its WWID, as its paths report it (they all agree): a SCSI LUN's from VPD page 0x83,
    /// an NVMe namespace's as the kernel's `wwid` gives it (`uuid.…`, `eui.…`, `nvme.…`).
    pub wwid: Option<Wwid>,
    /// What came, by family.
    pub family: AttachedFamily,
    /// How long the whole attach took, the map wait included.
    pub elapsed: Duration,
}

/// Which family an attached volume is of, with what came there.
#[derive(Debug)]
#[non_exhaustive]
pub enum AttachedFamily {
    /// A SCSI LUN: its paths and, when asked for, its multipath map.
    Scsi(ScsiAttachment),
    /// An NVMe namespace: its devices, its controllers and each portal's connect.
    Nvme(NvmeAttachment),
}

/// What a SCSI attach did: [`AttachedFamily::Scsi`].
#[derive(Debug)]
pub struct ScsiAttachment {
    /// Every path, scanned or skipped, with its outcome.
    pub paths: Vec<PathScan>,
    /// Its multipath map, when [`super::ScsiAttachOptions::wait_map`] asked for it.
    pub map: Option<MapDevice>,
    /// How long the scan took.
    pub scan_elapsed: Duration,
}

impl ScsiAttachment {
    /// The path devices that came, in path order.
    pub fn devices(&self) -> impl Iterator<Item = &crate::scsi::PathDevice> {
        self.paths.iter().filter_map(PathScan::device)
    }
}

impl Attachment {
    /// The SCSI part, for a SCSI LUN.
    pub fn scsi(&self) -> Option<&ScsiAttachment> {
        match &self.family {
            AttachedFamily::Scsi(s) => Some(s),
            AttachedFamily::Nvme(_) => None,
        }
    }

    /// The NVMe part, for an NVMe namespace.
    pub fn nvme(&self) -> Option<&NvmeAttachment> {
        match &self.family {
            AttachedFamily::Nvme(n) => Some(n),
            AttachedFamily::Scsi(_) => None,
        }
    }

    /// The device node to open for the volume, under the [`Root`](crate::Root) the attach was
    /// given (`<root>/dev/dm-0`, `<root>/dev/sdc`, `<root>/dev/nvme0n1`), whatever the
    /// transport: its multipath map when the attach waited for one; else its one path or
    /// NVMe device. `None` when there are several and no map over them: opening one path
    /// of a volume that has several would go around multipath, so which to use is the
    /// caller's choice ([`ScsiAttachment::devices`], [`NvmeAttachment::devices`]).
    ///
    /// ```no_run
    /// use lunkit::ops::{self, AttachOptions, VolumeSpec};
    /// let root = lunkit::Root::default();
    /// let volume = VolumeSpec::Iscsi { target: "iqn.2003-01.org.example:array".parse()?, lun: 3 };
    /// let mut opts = AttachOptions::new(&root);
    /// opts.scsi.wait_map = true;
    /// let attached = ops::attach(&root, &volume, &opts)?;
    /// let device = attached.device().expect("the map it waited for");
    /// println!("mkfs or mount {}", device.display());
    /// # Ok::<(), lunkit::Error>(())
    /// ```
    pub fn device(&self) -> Option<&std::path::Path> {
        fn only(mut all: Vec<&std::path::Path>) -> Option<&std::path::Path> {
            match all.len() {
                1 => all.pop(),
                _ => None,
            }
        }
        match &self.family {
            AttachedFamily::Scsi(s) => match &s.map {
                Some(m) => Some(&m.node.path),
                None => only(s.devices().map(|d| d.dev_path.as_path()).collect()),
            },
            AttachedFamily::Nvme(n) => only(n.devices.iter().map(|d| d.path.as_path()).collect()),
        }
    }
}

/// A multipath map of the volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapDevice {
    /// The map name (`mpatha`).
    pub name: String,
    /// Its block device (`dm-0`).
    pub node: BlockNode,
    /// Its partition maps (`dm-1`...), kernel names.
    pub partitions: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::id::DevNum;
    use crate::scsi::{PathDevice, PathOutcome, PathTiming};
    use std::path::{Path, PathBuf};

    fn node(name: &str) -> BlockNode {
        BlockNode {
            name: name.into(),
            dev: DevNum { major: 8, minor: 0 },
            path: PathBuf::from(format!("/host/dev/{name}")),
        }
    }

    fn path(name: &str, lun: u32) -> PathScan {
        let hctl: crate::Hctl = format!("{lun}:0:0:1").parse().unwrap();
        PathScan {
            via: format!("host{lun}"),
            hctl: Some(hctl),
            outcome: PathOutcome::Found(PathDevice {
                hctl,
                name: name.into(),
                dev_path: PathBuf::from(format!("/host/dev/{name}")),
                dev: DevNum { major: 8, minor: 0 },
                wwid: None,
            }),
            timing: PathTiming::default(),
        }
    }

    fn scsi(paths: Vec<PathScan>, map: Option<&str>) -> Attachment {
        Attachment {
            wwid: None,
            family: AttachedFamily::Scsi(ScsiAttachment {
                paths,
                map: map.map(|m| MapDevice {
                    name: "mpatha".into(),
                    node: node(m),
                    partitions: Vec::new(),
                }),
                scan_elapsed: Duration::ZERO,
            }),
            elapsed: Duration::ZERO,
        }
    }

    #[test]
    fn the_device_is_the_map_else_the_one_path_or_namespace_never_a_guess() {
        let two = || vec![path("sdc", 6), path("sdd", 7)];
        assert_eq!(
            scsi(two(), Some("dm-0")).device(),
            Some(Path::new("/host/dev/dm-0"))
        );
        assert_eq!(scsi(two(), None).device(), None);
        assert_eq!(
            scsi(vec![path("sdc", 6)], None).device(),
            Some(Path::new("/host/dev/sdc"))
        );
        let nvme = |devices: Vec<BlockNode>| Attachment {
            wwid: None,
            family: AttachedFamily::Nvme(NvmeAttachment {
                nsid: Some(1),
                devices,
                controllers: Vec::new(),
                portals: Vec::new(),
                discovery: Vec::new(),
            }),
            elapsed: Duration::ZERO,
        };
        assert_eq!(
            nvme(vec![node("nvme0n1")]).device(),
            Some(Path::new("/host/dev/nvme0n1"))
        );
        assert_eq!(nvme(vec![node("nvme0n1"), node("nvme1n1")]).device(), None);
    }
}

//! The workflows a CSI node plugin calls, built from everything below: bringing a volume
//! onto the node ([`attach()`]), growing it online ([`resize()`]) and taking it off
//! ([`detach()`]), with per-volume locking ([`lock`]) and volume discovery ([`volume`]). All
//! three name the volume the same way ([`VolumeSpec`]).
//!
//! ```no_run
//! use lunkit::Root;
//! use lunkit::ops::{DetachOptions, VolumeSpec, detach};
//!
//! let root = Root::default();
//! let spec = VolumeSpec::Wwid("36001405a1b2c3d4e5f60718293a4b5c6".parse()?);
//! let report = detach(&root, &spec, &DetachOptions::new(&root))?;
//! for step in &report.steps {
//!     println!("{:<13} {:<24} {} ({:?})", step.kind.as_str(), step.target, step.outcome, step.duration);
//! }
//! # Ok::<(), lunkit::Error>(())
//! ```

//!
//! # Layout
//!
//! The shared parts are in their own files: how a volume is named ([`VolumeSpec`], `spec.rs`),
//! the option structs (`options.rs`), the reports (`report.rs`), the step log of a detach
//! (`steps.rs`), the per-volume locks ([`lock`]) and the names remembered beside them
//! (`names.rs`). Each protocol family has its own folder: `scsi/` (attach, detach in rounds,
//! resize, and `locate`, which finds a volume's paths and maps) and `nvme/` ([`nvme`]). The two
//! never import each other, and each public verb below is one `match` on the spec that hands
//! it to its family.

mod current;
pub mod doctor;
pub mod lock;
mod names;
pub mod nvme;
mod options;
mod report;
mod scsi;
mod spec;
mod steps;
pub mod volume;

pub use nvme::NamespaceDevice;
pub use options::{
    AttachOptions, DEFAULT_DETACH_TIMEOUT, DEFAULT_RESIZE_TIMEOUT, DetachOptions,
    NvmeAttachOptions, RESCAN_INTERVAL, ResizeOptions, ScsiAttachOptions,
};
pub use report::{
    AttachedFamily, Attachment, DetachReport, DiscoveryService, MapDevice, MapSize, NamespaceSize,
    NvmeAttachment, NvmeResize, Outcome, PathSize, PortalConnect, Resized, ResizedFamily,
    ScsiAttachment, ScsiResize, Step, StepKind,
};
pub use spec::{Identity, NamespaceSelector, VolumeSpec};
pub use volume::{ForeignMap, OrphanMap, VolumeState};

use std::time::Duration;

use crate::error::{Error, Result};
use crate::root::Root;

/// Bringing a volume onto the node: scan its LUN on every path at once, check that every
/// path is the same volume, and optionally wait for multipathd's map over all of them.
///
/// The counterpart of [`crate::ops::detach()`], named the same way ([`VolumeSpec`]). A volume is
/// attached through an address: an iSCSI target and LUN, an FC target and LUN, or an
/// H:C:T:L. A WWID or a device name says what a volume is, not where to scan for it, and is
/// refused.
///
/// multipathd, not lunkit, builds the map (it owns the multipath configuration, and the node
/// has one multipath policy). [`ScsiAttachOptions::wait_map`] waits for it: a map whose uuid is
/// `mpath-<WWID>` with every path that came among its slaves, within the same deadline as the
/// scan.
///
/// ```no_run
/// use lunkit::Root;
/// use lunkit::ops::{AttachOptions, VolumeSpec, attach};
///
/// let root = Root::default();
/// let spec = VolumeSpec::Iscsi { target: "iqn.2003-01.org.example:array".parse()?, lun: 3 };
/// let mut opts = AttachOptions::new(&root);
/// opts.scsi.wait_map = true;
/// let volume = attach(&root, &spec, &opts)?;
/// if let Some(scsi) = volume.scsi() {
///     for path in &scsi.paths {
///         println!("{path}");
///     }
///     if let Some(map) = &scsi.map {
///         println!("/dev/mapper/{} ({})", map.name, map.node.name);
///     }
/// }
/// # Ok::<(), lunkit::Error>(())
/// ```
///
/// Scans the volume's LUN on every path at once and returns every path's outcome, with the
/// multipath map when [`ScsiAttachOptions::wait_map`] is set ([`AttachedFamily::Scsi`]); an
/// NVMe namespace's devices, controllers and connects ([`AttachedFamily::Nvme`]).
///
/// It holds the volume's lock throughout, the one [`detach()`] and
/// [`resize()`] take (in this process, and across processes through
/// [`AttachOptions::lock_dir`]): named by the expected WWID, or by what a detach of the same
/// name would find, and once the scan has found the WWID, by it too. The lock wait counts
/// against the scan's timeout.
///
/// Errors: [`crate::Error::Invalid`] for a spec that names no address (a WWID, a device path), and
/// the scan's ([`crate::scsi`](crate::scsi#every-path-at-once)): [`crate::Error::MissingPaths`] when fewer than
/// [`crate::ScanOptions::min_paths`] came, [`crate::Error::WwidMismatch`] when a path is another volume,
/// [`crate::Error::Timeout`] when the map did not come with every path by the deadline.
pub fn attach(root: &Root, spec: &VolumeSpec, opts: &AttachOptions) -> Result<Attachment> {
    match spec {
        VolumeSpec::Nvme { nqn, namespace } => nvme::attach(root, spec, nqn, namespace, opts),
        VolumeSpec::Device(_)
        | VolumeSpec::Wwid(_)
        | VolumeSpec::Iscsi { .. }
        | VolumeSpec::Fc { .. } => scsi::attach::attach(root, spec, opts),
    }
}

/// Takes the volume `spec` off the node (see [`detach_with`]), with the default step sink.
pub fn detach(root: &Root, spec: &VolumeSpec, opts: &DetachOptions) -> Result<DetachReport> {
    detach_with(root, spec, opts, &mut |_| {})
}

/// How long the walk over the processes that the first of [`detach_all`]'s volumes starts
/// waits for the others to ask: they all start together, and each asks once it holds its
/// volume's lock (a lock another process holds keeps a volume longer; the others then go
/// ahead without it).
pub const BATCH_GATHER: Duration = Duration::from_secs(2);

/// Takes many volumes off the node at once, each as [`detach()`] would and on a thread of
/// its own, with one walk over the processes for all their in-use checks
/// ([`crate::block::gather_checks`]): a node drain's tens of volumes cost about one walk,
/// not one each. Each volume's check is still made after it holds its lock, and a volume
/// that needs a later round checks again with a walk of its own moment.
///
/// The answers are in the order of `specs`; one volume's refusal or failure stops none of
/// the others.
///
/// ```no_run
/// use lunkit::Root;
/// use lunkit::ops::{DetachOptions, VolumeSpec, detach_all};
///
/// let root = Root::default();
/// let specs: Vec<VolumeSpec> = (0..10)
///     .map(|lun| VolumeSpec::Iscsi { target: "iqn.2003-01.org.example:array".parse().unwrap(), lun })
///     .collect();
/// let before = lunkit::block::walks_started(&root);
/// for (spec, answer) in specs.iter().zip(detach_all(&root, &specs, &DetachOptions::new(&root))) {
///     match answer {
///         Ok(report) => println!("{spec}: detached in {:?}", report.duration),
///         Err(e) => println!("{spec}: {e}"),
///     }
/// }
/// println!("{} walks over the processes", lunkit::block::walks_started(&root) - before);
/// ```
pub fn detach_all(
    root: &Root,
    specs: &[VolumeSpec],
    opts: &DetachOptions,
) -> Vec<Result<DetachReport>> {
    let _gathering = crate::block::gather_checks(root, specs.len(), BATCH_GATHER);
    std::thread::scope(|s| {
        let threads: Vec<_> = specs
            .iter()
            .map(|spec| s.spawn(move || detach(root, spec, opts)))
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    })
}

/// Taking a volume off the node: what a CSI driver's NodeUnstage does after the unmount.
///
/// One round is: check nobody uses the volume, flush the multipath map, remove it (the
/// `multipath -f` sequence of [`crate::multipath::remove`]), then flush and delete every path
/// (in parallel: each delete waits for its own SYNCHRONIZE CACHE). Rounds repeat, each starting
/// from a fresh look at sysfs, until nothing of the volume is left or the deadline passes: a
/// map that multipathd re-creates, a path that reappears or a removal that races with udev is
/// taken down by the next round. Every step boundary is a valid state to stop and start again
/// from, so a detach killed halfway is finished by the next one; a map it left suspended
/// (killed between the removal's suspend and remove) is resumed first (`resume-map`).
///
/// # When no path can serve the map
///
/// With the target unreachable, every path is blocked (the transport is recovering) or
/// failed, and a map that queues I/O holds whatever is sent to it. udev probes the map on
/// every change (blkid), and such a probe's read then blocks and keeps the map open.
/// `multipath -f` refuses such a map ("map in use") until multipathd's `no_path_retry` runs
/// out and fails the queue. A detach tells the cases apart instead:
///
/// - a user holds it (a mount, a loop device, a holder, any process that is not a verified
///   udev worker with the map open read-only): refused, as any volume in use (an opener
///   that lets go within [`OPENER_GRACE`](crate::block::OPENER_GRACE) is waited for);
/// - nothing has it open: its last close wrote back what it could, so it has nothing to
///   write. The detach disables queueing (`disable-queueing`), deletes the paths, and removes
///   the map unflushed;
/// - udev's read-only probes, or something `/proc` does not show (a writer's last close
///   writing back, a partition map held the same way), have it open: data may be cached in
///   it, since a writer that closed while a probe held the map did not write back (its close
///   was not the last). Only a path can take that data, so the detach waits, round after
///   round, for one to come back (the probe's read then ends too), and then flushes as
///   usual. At the deadline it fails with [`crate::Error::Timeout`] naming the map and its probes;
///   nothing was changed. `force` fails the queued I/O instead: deletes the paths (which
///   fails the reads a blocked path holds), then removes the map, and what it cached is
///   lost.
///
/// Someone else may fail the queue while the detach waits: multipathd turns queueing off
/// when the map's `no_path_retry` runs out (LIO's default is 12 checker intervals, about
/// 60 s), and what waited in the map fails with EIO. The map then closes with still no
/// path; the detach takes it down as one that nothing had open, and its `flush-map` step
/// says that the writes which waited in it are lost, since they were.
///
/// A udev worker counts as one only when `/proc` confirms it (root, udevd's executable or
/// udevd as parent; see [`crate::block::UsageScope::ignore_openers`]), not by its command name.
///
/// `on_step` is called as each step ends (for progress output, and so that a caller who gets
/// an error still knows what was done).
///
/// An NVMe namespace ([`VolumeSpec::Nvme`]) is taken off as [`nvme`] describes: checked,
/// flushed, and its controllers deleted unless another namespace needs them.
pub fn detach_with(
    root: &Root,
    spec: &VolumeSpec,
    opts: &DetachOptions,
    on_step: &mut dyn FnMut(&Step),
) -> Result<DetachReport> {
    match spec {
        VolumeSpec::Nvme { nqn, namespace } => {
            // Its check walks on its own: the place a batch promised it is given back at
            // once, so the batch's SCSI checks do not wait for it.
            drop(crate::block::intend_check(root));
            nvme::detach(root, spec, nqn, namespace, opts, on_step)
        }
        VolumeSpec::Device(_)
        | VolumeSpec::Wwid(_)
        | VolumeSpec::Iscsi { .. }
        | VolumeSpec::Fc { .. } => scsi::detach::detach(root, spec, opts, on_step, None),
    }
}

/// The caller's own step in a SCSI detach ([`detach_before_removal`]), given the volume as
/// the detach's round found it.
pub type BeforeRemoval<'a> = dyn FnMut(&VolumeState) -> Result<()> + 'a;

/// [`detach_with()`] of a SCSI volume, with a last step of the caller's own while the volume
/// is unused and still in place: `before_removal` runs once, in the first round whose in-use
/// check finds nothing using the volume, after the maps a path can serve are flushed and
/// before anything is removed, given the volume as that round found it (its paths with their
/// states, its maps). Its time, the flush included, is the step `before-removal`.
///
/// This is where a caller does what needs the volume's devices but must wait for the check
/// that nobody uses it, with one check for both: a fenced unstage releases its SCSI-3
/// reservation and unregisters its key on every path here, so a volume found in use keeps
/// its reservation, and no second walk over the processes is made for it.
///
/// A volume found in use never reaches it, and neither does one of which nothing is on the
/// node. An error it returns ends the detach with that error, nothing removed (even with
/// [`DetachOptions::force`]). It runs with the volume's lock held, so it must not detach or
/// attach the same volume.
///
/// # Errors
///
/// As [`detach()`], and an NVMe namespace is refused ([`Error::Invalid`]) with nothing done:
/// its detach has no such step.
///
/// ```no_run
/// use lunkit::Root;
/// use lunkit::ops::{DetachOptions, VolumeSpec, detach_before_removal};
/// use lunkit::scsi::sysfs::ScsiState;
///
/// let root = Root::default();
/// let spec = VolumeSpec::Wwid("3600140512345678901234567890abcde".parse()?);
/// let mut release = |volume: &lunkit::ops::VolumeState| {
///     for p in volume.paths.iter().filter(|p| p.state == Some(ScsiState::Running)) {
///         println!("last moment of {:?} in place", p.disk);
///     }
///     Ok(())
/// };
/// detach_before_removal(&root, &spec, &DetachOptions::new(&root), &mut |_| {}, &mut release)?;
/// # Ok::<(), lunkit::Error>(())
/// ```
pub fn detach_before_removal(
    root: &Root,
    spec: &VolumeSpec,
    opts: &DetachOptions,
    on_step: &mut dyn FnMut(&Step),
    before_removal: &mut BeforeRemoval<'_>,
) -> Result<DetachReport> {
    if let VolumeSpec::Nvme { .. } = spec {
        return Err(Error::invalid(
            "volume",
            &spec.to_string(),
            "an NVMe namespace's detach has no step before removal; detach it with detach()",
        ));
    }
    scsi::detach::detach(root, spec, opts, on_step, Some(before_removal))
}

/// Growing an attached volume online (CSI's NodeExpandVolume): every path learns the new
/// size, the paths must agree, then the multipath map grows to it. The caller grows its
/// filesystem afterwards (`resize2fs`, `xfs_growfs`); the library never does.
///
/// 1. The volume is identified and locked as [`detach()`] does, under the same lock,
///    so a resize and a detach of one volume never interleave.
/// 2. Every path must be `running` with a disk, before anything is written: a path that is
///    down cannot learn the size, and the map must not outgrow a path it may fail back to
///    ([`crate::ResizeFailure::PathDown`]).
/// 3. `1` is written to every path's `rescan`, all at once, each write bounded by the
///    deadline (a path's rescan waits out its commands' timeouts). `sd` re-reads the capacity
///    before the write returns. With [`ResizeOptions::expect_size`] the wait goes on until
///    every path reports at least that size: a path's `change` uevent, or its `scsi_device` event for
///    the target's "capacity data has changed" unit attention, wakes it, and a path still
///    short is rescanned again at most every [`RESCAN_INTERVAL`] (the array may grow the LUN
///    a moment after it said it did).
/// 4. The paths must agree ([`crate::ResizeFailure::SizesDiffer`]) and must not have shrunk below
///    the map ([`crate::ResizeFailure::Shrunk`]). Until here the map is untouched.
/// 5. The map grows ([`crate::multipath::grow`]): through multipathd when it runs, else by a
///    table reload; its length is read back either way.
///
/// An NVMe namespace ([`VolumeSpec::Nvme`]) goes its own way: its controllers are asked
/// what it is (Identify Namespace), they must agree, and, unless its device already has
/// that size, they are told to rescan and the resize waits for the device to have it
/// ([`crate::ops::nvme`]).
///
/// A volume whose map and paths already have one size of at least
/// [`ResizeOptions::expect_size`] is left alone: nothing is written. Resizing again when the array did not grow rescans the paths and changes nothing.
///
/// ```no_run
/// use lunkit::Root;
/// use lunkit::ops::{ResizeOptions, VolumeSpec, resize};
///
/// let root = Root::default();
/// let spec = VolumeSpec::Device("/dev/mapper/mpatha".into());
/// let mut opts = ResizeOptions::new(&root);
/// opts.expect_size = Some(20 << 30);
/// let resized = resize(&root, &spec, &opts)?;
/// if let Some(scsi) = resized.scsi() {
///     for p in &scsi.paths {
///         println!("{}: {} -> {} bytes", p.device, p.before, p.after);
///     }
///     if let Some(map) = &scsi.map {
///         println!("{}: {} -> {} bytes ({})", map.device, map.before, map.after, map.by.as_str());
///     }
/// }
/// // Now grow the filesystem on it: resize2fs /dev/mapper/mpatha.
/// # Ok::<(), lunkit::Error>(())
/// ```
///
/// Grows the volume `spec` to the size its storage now has, on every path and its map.
///
/// # Errors (SCSI)
///
/// - [`crate::Error::NotFound`] when no path of the volume is on the node.
/// - [`crate::Error::Resize`] for every refusal ([`crate::ResizeFailure`]: a path down, paths that disagree,
///   a volume that shrank) and for a map that did not grow.
/// - [`crate::Error::Timeout`] when [`ResizeOptions::expect_size`] was not reached by every path by
///   the deadline, naming what each one reports; the map is untouched then.
/// - [`crate::Error::Step`] (`rescan`) naming the path whose rescan failed.
/// - [`crate::Error::Busy`] when a multipath map holding the volume's paths is not its alone
///   ([`VolumeState::foreign_maps`](VolumeState::foreign_maps)); nothing is written.
pub fn resize(root: &Root, spec: &VolumeSpec, opts: &ResizeOptions) -> Result<Resized> {
    match spec {
        VolumeSpec::Nvme { nqn, namespace } => nvme::resize(root, spec, nqn, namespace, opts),
        VolumeSpec::Device(_)
        | VolumeSpec::Wwid(_)
        | VolumeSpec::Iscsi { .. }
        | VolumeSpec::Fc { .. } => scsi::resize::resize(root, spec, opts),
    }
}

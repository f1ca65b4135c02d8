//! Taking a volume off the node: what a CSI driver's NodeUnstage does after the unmount.
//!
//! One round is: check nobody uses the volume, flush the multipath map, remove it (the
//! `multipath -f` sequence of [`crate::multipath::remove`]), then flush and delete every path
//! (in parallel: each delete waits for its own SYNCHRONIZE CACHE). Rounds repeat, each starting
//! from a fresh look at sysfs, until nothing of the volume is left or the deadline passes: a
//! map that multipathd re-creates, a path that reappears or a removal that races with udev is
//! taken down by the next round. Every step boundary is a valid state to stop and start again
//! from, so a detach killed halfway is finished by the next one; a map it left suspended
//! (killed between the removal's suspend and remove) is resumed first (`resume-map`).
//!
//! # When no path can serve the map
//!
//! With the target unreachable, every path is blocked (the transport is recovering) or
//! failed, and a map that queues I/O holds whatever is sent to it. udev probes the map on
//! every change (blkid), and such a probe's read then blocks and keeps the map open.
//! `multipath -f` refuses such a map ("map in use") until multipathd's `no_path_retry` runs
//! out and fails the queue. A detach tells the cases apart instead:
//!
//! - a user holds it (a mount, a loop device, a holder, any process that is not a verified
//!   udev worker with the map open read-only): refused, as any volume in use (an opener
//!   that lets go within [`OPENER_GRACE`] is waited for);
//! - nothing has it open: its last close wrote back what it could, so it has nothing to
//!   write. The detach disables queueing (`disable-queueing`), deletes the paths, and removes
//!   the map unflushed;
//! - udev's read-only probes, or something `/proc` does not show (a writer's last close
//!   writing back, a partition map held the same way), have it open: data may be cached in
//!   it, since a writer that closed while a probe held the map did not write back (its close
//!   was not the last). Only a path can take that data, so the detach waits, round after
//!   round, for one to come back (the probe's read then ends too), and then flushes as
//!   usual. At the deadline it fails with [`Error::Timeout`] naming the map and its probes;
//!   nothing was changed. `force` fails the queued I/O instead: deletes the paths (which
//!   fails the reads a blocked path holds), then removes the map, and what it cached is
//!   lost.
//!
//! Someone else may fail the queue while the detach waits: multipathd turns queueing off
//! when the map's `no_path_retry` runs out (LIO's default is 12 checker intervals, about
//! 60 s), and what waited in the map fails with EIO. The map then closes with still no
//! path; the detach takes it down as one that nothing had open, and its `flush-map` step
//! says that the writes which waited in it are lost, since they were.
//!
//! A udev worker counts as one only when `/proc` confirms it (root, udevd's executable or
//! udevd as parent; see [`block::UsageScope::ignore_openers`]), not by its command name.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::volume::{self, Identity, MapDevice, VolumePath, VolumeSpec, VolumeState};
use super::{lock, names};
use crate::block::{self, OPENER_GRACE, UsageScope};
use crate::dm::{Control, DevId};
use crate::error::{Error, Result};
use crate::id::DevNum;
use crate::multipath::{self, RemoveOptions};
use crate::root::Root;
use crate::scsi::{self, Deleted, PATH_MANAGERS};
use crate::wait;

/// Default time a detach may take.
pub const DEFAULT_DETACH_TIMEOUT: Duration = Duration::from_secs(60);

/// How [`detach`] behaves. Made with [`DetachOptions::new`], which puts the lock files under
/// the root; then set what differs:
///
/// ```
/// let root = lunkit::Root::default();
/// let mut opts = lunkit::ops::DetachOptions::new(&root);
/// opts.timeout = std::time::Duration::from_secs(20);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DetachOptions {
    /// How long the whole detach may take, lock wait included.
    pub timeout: Duration,
    /// Go on past refusals and errors: a volume in use is taken away anyway (its I/O fails),
    /// queued I/O of a map no path can serve is failed (and what it held is lost), a flush
    /// that fails is passed over. Every step skipped this way is in the report.
    pub force: bool,
    /// Where the cross-process lock files go; `None` locks within this process only.
    pub lock_dir: Option<PathBuf>,
    /// Ask multipathd to remove the map when it runs (so it does not re-create it).
    pub use_multipathd: bool,
}

impl DetachOptions {
    /// The defaults for `root`: 60 s, not forced, locks in `<root>/run/lunkit/locks`,
    /// multipathd used when it runs.
    pub fn new(root: &Root) -> DetachOptions {
        DetachOptions {
            timeout: DEFAULT_DETACH_TIMEOUT,
            force: false,
            lock_dir: Some(root.run("lunkit/locks")),
            use_multipathd: true,
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
            StepKind::DisableQueueing => "disable-queueing",
            StepKind::FlushMap => "flush-map",
            StepKind::RemoveMap => "remove-map",
            StepKind::FlushPath => "flush-path",
            StepKind::DeletePath => "delete-path",
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
    /// How long it took.
    pub duration: Duration,
}

/// What [`detach`] did.
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

/// Takes the volume `spec` off the node (see the module docs), with the default step sink.
pub fn detach(root: &Root, spec: &VolumeSpec, opts: &DetachOptions) -> Result<DetachReport> {
    detach_with(root, spec, opts, &mut |_| {})
}

/// [`detach`], calling `on_step` as each step ends (for progress output, and so that a
/// caller who gets an error still knows what was done).
pub fn detach_with(
    root: &Root,
    spec: &VolumeSpec,
    opts: &DetachOptions,
    on_step: &mut dyn FnMut(&Step),
) -> Result<DetachReport> {
    let start = Instant::now();
    let deadline = crate::wait::deadline_from(start, opts.timeout);
    let mut run = Run {
        root,
        opts,
        deadline,
        steps: Vec::new(),
        on_step,
        waited_on: Vec::new(),
        failed_while_waiting: Vec::new(),
    };
    let identity = run.step(StepKind::Identify, &spec.to_string(), || {
        identify(root, spec, opts.lock_dir.as_deref()).map(|i| (i, Outcome::Done))
    })?;
    let key = identity.key();
    let _lock = run.step(StepKind::Lock, &key, || {
        lock::lock(&key, opts.lock_dir.as_deref(), deadline).map(|l| (l, Outcome::Done))
    })?;

    let mut rounds = 0;
    let mut backoff = wait::Backoff::new(Duration::from_millis(20), Duration::from_millis(500));
    let mut busy_since: Option<Instant> = None;
    loop {
        let state = volume::locate(root, &identity)?;
        if state.is_empty() && rounds == 0 && identity.wwid.is_none() && spec.is_address() {
            // Nothing at the address, and no WWID to look further with: a map whose paths
            // are all gone may be this volume's, and "nothing left" would leave it behind.
            let orphans = volume::orphan_maps(root)?;
            if !orphans.is_empty() {
                let list: Vec<String> = orphans.iter().map(ToString::to_string).collect();
                let e = Error::Unverified {
                    device: spec.to_string(),
                    reason: format!(
                        "no device is at its address and its WWID is not known (none was \
                         remembered by an attach or detach of this name), but {} with no \
                         path left {} on the node and may be its: detach it by its WWID",
                        list.join(", "),
                        if orphans.len() == 1 { "is" } else { "are" }
                    ),
                };
                run.record(
                    StepKind::Verify,
                    &spec.to_string(),
                    Outcome::Failed(e.to_string()),
                    Duration::ZERO,
                );
                return Err(e);
            }
        }
        if state.is_empty() {
            let what = if rounds == 0 {
                "nothing of the volume is on the node".to_owned()
            } else {
                "no map or path of the volume is left".to_owned()
            };
            run.record(StepKind::Verify, &what, Outcome::Done, Duration::ZERO);
            return Ok(DetachReport {
                identity,
                steps: run.steps,
                rounds,
                duration: start.elapsed(),
            });
        }
        rounds += 1;
        // `None`: the round went through but the deadline came before the next look.
        let (again, err) = match run.round(&state, &mut busy_since) {
            // Look again: multipathd may have re-created the map, a path may have come back.
            Ok(()) if Instant::now() < deadline => continue,
            Ok(()) => (false, None),
            Err(Stop::Again(e)) => (true, Some(e)),
            Err(Stop::Fail(e)) => (false, Some(e)),
        };
        let now = Instant::now();
        if !again || now >= deadline {
            let last = match err {
                None => String::new(),
                Some(Error::Timeout { what, .. }) => format!("; last wait: {what}"),
                Some(e) => return Err(e),
            };
            let left = volume::locate(root, &identity)
                .map(|s| s.describe())
                .unwrap_or_default();
            return Err(Error::Timeout {
                what: format!("{spec} to be taken off the node (left: {left}{last})"),
                waited: start.elapsed(),
            });
        }
        backoff.sleep(deadline);
    }
}

/// The volume's identity, as [`volume::identify`] finds it, with what `lock_dir` remembers
/// of the name ([`names`]): a WWID found at a target and LUN is remembered; with none found
/// there (every path gone), the remembered one is used, but only for a volume of which no
/// path is left anywhere. The LUN number may name another volume by now, whose paths are
/// elsewhere, and the record then says nothing about what the address held.
fn identify(root: &Root, spec: &VolumeSpec, lock_dir: Option<&Path>) -> Result<Identity> {
    let mut id = volume::identify(root, spec)?;
    let Some(dir) = lock_dir.filter(|_| spec.is_address()) else {
        return Ok(id);
    };
    match &id.wwid {
        // Failing to write the record loses a hint for a later call, not this detach.
        Some(w) => {
            let _ = names::remember(dir, spec, w);
        }
        None => {
            if let Some(w) = names::recall(dir, spec) {
                let by_wwid = Identity {
                    wwid: Some(w),
                    addresses: id.addresses.clone(),
                };
                if volume::locate(root, &by_wwid)?.paths.is_empty() {
                    id = by_wwid;
                }
            }
        }
    }
    Ok(id)
}

/// Why a round ended early.
enum Stop {
    /// Another round may succeed: something was busy for a moment, or vanished under our feet.
    /// The error is what the caller gets if no time is left for one.
    Again(Error),
    /// Another round would not help: the volume is in use, or something is broken.
    Fail(Error),
}

impl From<Error> for Stop {
    fn from(e: Error) -> Stop {
        if retryable(&e) {
            Stop::Again(e)
        } else {
            Stop::Fail(e)
        }
    }
}

/// Kernel and lookup errors after which another round may succeed. A refusal because the
/// volume is in use is not one of them; the two waits that are ([`OPENER_GRACE`], a map open
/// for a moment) say so with [`Stop::Again`] themselves.
fn retryable(e: &Error) -> bool {
    match e {
        Error::Busy { .. } | Error::Unverified { .. } => false,
        Error::Step { source, .. } => retryable(source),
        Error::Ioctl { .. } | Error::Io { .. } => matches!(
            e.errno(),
            Some(libc::EBUSY | libc::ENXIO | libc::ENODEV | libc::ENOENT | libc::EAGAIN)
        ),
        Error::NotFound { .. } | Error::Replaced { .. } => true,
        _ => false,
    }
}

/// `e` as the error of step `kind` on `target`, so that the caller learns which step failed
/// on what. Refusals (which name the device and say why) and timeouts (which name what was
/// awaited, and which [`detach_with`] completes with what is left) stay as they are.
fn step_error(kind: StepKind, target: &str, e: Error) -> Error {
    match e {
        Error::Busy { .. }
        | Error::Unverified { .. }
        | Error::Timeout { .. }
        | Error::Step { .. } => e,
        e => Error::Step {
            step: kind.as_str(),
            target: target.to_owned(),
            source: Box::new(e),
        },
    }
}

/// One detach in progress: where steps go.
struct Run<'a> {
    root: &'a Root,
    opts: &'a DetachOptions,
    deadline: Instant,
    steps: Vec<Step>,
    on_step: &'a mut dyn FnMut(&Step),
    /// Maps this detach waited on for a path to come back (open, no path, queueing).
    waited_on: Vec<String>,
    /// Of those, the ones found later closed with their queued I/O failed by someone else.
    failed_while_waiting: Vec<String>,
}

impl Run<'_> {
    fn record(&mut self, kind: StepKind, target: &str, outcome: Outcome, duration: Duration) {
        let step = Step {
            kind,
            target: target.to_owned(),
            outcome,
            duration,
        };
        (self.on_step)(&step);
        self.steps.push(step);
    }

    /// Runs `f` as one step; an error is recorded as `Failed` and returned.
    fn step<T>(
        &mut self,
        kind: StepKind,
        target: &str,
        f: impl FnOnce() -> Result<(T, Outcome)>,
    ) -> Result<T> {
        let t0 = Instant::now();
        match f() {
            Ok((v, outcome)) => {
                self.record(kind, target, outcome, t0.elapsed());
                Ok(v)
            }
            Err(e) => {
                self.record(kind, target, Outcome::Failed(e.to_string()), t0.elapsed());
                Err(step_error(kind, target, e))
            }
        }
    }

    /// Like [`Run::step`], but when forced a failure is recorded as `Skipped` and the detach
    /// goes on.
    fn step_or_force(
        &mut self,
        kind: StepKind,
        target: &str,
        f: impl FnOnce() -> Result<Outcome>,
    ) -> Result<()> {
        let t0 = Instant::now();
        let outcome = match f() {
            Ok(o) => o,
            Err(e) if self.opts.force => Outcome::Skipped(format!("forced past: {e}")),
            Err(e) => {
                self.record(kind, target, Outcome::Failed(e.to_string()), t0.elapsed());
                return Err(step_error(kind, target, e));
            }
        };
        self.record(kind, target, outcome, t0.elapsed());
        Ok(())
    }

    /// One take-down round over what `state` found.
    ///
    /// Normally the maps go first, then the paths (a path deleted under a map that queues
    /// would leave its I/O hanging). A map that no path can serve goes the other way round:
    /// its queueing is disabled first, then its paths are deleted, which fails the reads
    /// udev's probes have stuck on them (a blocked path keeps them until it is deleted), and
    /// then the map, no longer open, is removed.
    fn round(
        &mut self,
        state: &VolumeState,
        busy_since: &mut Option<Instant>,
    ) -> std::result::Result<(), Stop> {
        self.resume_suspended(state)?;
        let unreachable = self.check_in_use(state, busy_since)?;
        let maps = || state.maps.iter().zip(&unreachable);
        for (map, _) in maps().filter(|(_, why)| why.is_none()) {
            self.take_down_map(map, None)?;
        }
        let stuck: Vec<_> = maps()
            .filter_map(|(m, why)| Some((m, why.as_deref()?)))
            .collect();
        for (map, _) in &stuck {
            self.disable_queueing(map)?;
        }
        self.take_down_paths(&state.paths, !state.maps.is_empty())?;
        for (map, why) in stuck {
            self.take_down_map(map, Some(why))?;
        }
        Ok(())
    }

    /// Resumes the volume's maps (and their partition maps) that are suspended, parents
    /// first, before anything is checked or flushed: a flush of a suspended map would wait
    /// for the resume, and nothing else would ever resume it. Resuming gives the map back the
    /// table it has, and its users the I/O it held; no data is dropped.
    fn resume_suspended(&mut self, state: &VolumeState) -> std::result::Result<(), Stop> {
        if state.maps.is_empty() {
            return Ok(());
        }
        // Without the control node no map can be looked at; check-in-use, which reads the
        // maps through it too, reports that as its own failure.
        let Ok(ctl) = Control::open(self.root) else {
            return Ok(());
        };
        for map in &state.maps {
            // A dm device's kernel name is `dm-<minor>`, its major the map's.
            let major = map.node.dev.major;
            let parts = map.partitions.iter().filter_map(|p| {
                let minor = p.strip_prefix("dm-")?.parse().ok()?;
                Some(DevNum { major, minor })
            });
            for dev in std::iter::once(map.node.dev).chain(parts) {
                let info = match ctl.info(&DevId::Dev(dev)) {
                    Ok(info) => info,
                    Err(e) if e.is_gone() => continue,
                    Err(e) => {
                        let target = format!("{} ({})", map.name, map.node.name);
                        let failed = Outcome::Failed(e.to_string());
                        self.record(StepKind::ResumeMap, &target, failed, Duration::ZERO);
                        return Err(step_error(StepKind::ResumeMap, &target, e).into());
                    }
                };
                if !info.suspended() {
                    continue;
                }
                let label = format!("{} ({})", info.name, info.kernel_name());
                self.step(StepKind::ResumeMap, &label, || {
                    match ctl.resume(&DevId::Dev(dev)) {
                        Ok(_) => Ok(((), Outcome::Done)),
                        Err(e) if e.is_gone() => Ok(((), Outcome::AlreadyGone)),
                        Err(e) => Err(e),
                    }
                })?;
            }
        }
        Ok(())
    }

    /// Refuses (or, forced, records) use of the volume. Returns, per map of `state`, why no
    /// path can serve it (`None` for a map that can still write): such a map is taken down
    /// unflushed, which this check has made sure loses nothing, unless forced.
    ///
    /// A map that no path can serve is one of three cases (see the module docs): a user
    /// has it (refused), nothing has it open (taken down unflushed), or udev's read-only
    /// probes or something this check cannot see have it open (wait, round after round
    /// until the deadline, for a path to come back, and then flush it).
    fn check_in_use(
        &mut self,
        state: &VolumeState,
        busy_since: &mut Option<Instant>,
    ) -> std::result::Result<Vec<Option<String>>, Stop> {
        let root = self.root;
        let own = state.own_dm();
        let mut devices: Vec<_> = state.maps.iter().map(|m| m.node.clone()).collect();
        devices.extend(state.paths.iter().filter_map(|p| p.disk.clone()));
        let target = state.describe();
        let force = self.opts.force;
        let deadline = self.deadline;
        let t0 = Instant::now();
        let checked = block::usage(
            root,
            &devices,
            &UsageScope {
                own: &own,
                ignore_openers: PATH_MANAGERS,
            },
            deadline,
        )
        .and_then(|usage| {
            let reach = state
                .maps
                .iter()
                .map(|m| map_reach(root, m, &state.paths))
                .collect::<Result<Vec<_>>>()?;
            Ok((usage, reach))
        });
        let (usage, reach) = match checked {
            Ok(v) => v,
            Err(e) => {
                self.record(
                    StepKind::CheckInUse,
                    &target,
                    Outcome::Failed(e.to_string()),
                    t0.elapsed(),
                );
                return Err(step_error(StepKind::CheckInUse, &target, e).into());
            }
        };
        let mut unreachable = Vec::new();
        let mut stuck = Vec::new();
        for (m, r) in state.maps.iter().zip(reach) {
            let Reach::Unreachable { why, open, queues } = r else {
                unreachable.push(None);
                continue;
            };
            // The first look that finds closed a map this detach waited on decides: if it no
            // longer queues, its queued I/O was failed meanwhile (multipathd does so when
            // `no_path_retry` runs out), the writes that waited in it with it. They were lost
            // before this detach changed anything; the report says so. Deciding once keeps
            // the queueing this detach turns off itself from reading as such a loss.
            if open == 0 {
                if let Some(at) = self.waited_on.iter().position(|n| *n == m.name) {
                    self.waited_on.swap_remove(at);
                    if !queues {
                        self.failed_while_waiting.push(m.name.clone());
                    }
                }
            }
            let probes = usage
                .managers
                .iter()
                .filter(|o| o.device == m.node.name && o.read_only)
                .count();
            // Open at all, it may cache writes: a writer that closed while another opener
            // (a udev probe stuck in a queued read, say) held the map did not write back (its
            // close was not the last). Only a path can take them.
            if !force && usage.is_empty() && open > 0 {
                if queues && !self.waited_on.contains(&m.name) {
                    self.waited_on.push(m.name.clone());
                }
                stuck.push(format!(
                    "map {} has no path that can take I/O ({why}) and is open {open} time(s) \
                     ({probes} by udev's read-only probes, the rest by nothing /proc shows): \
                     what it caches can only be written through a path",
                    m.name
                ));
            }
            unreachable.push(Some(why));
        }
        let Some(err) = usage.refusal(&target) else {
            if stuck.is_empty() {
                *busy_since = None;
                self.record(StepKind::CheckInUse, &target, Outcome::Done, t0.elapsed());
                return Ok(unreachable);
            }
            // Nobody uses it, but it may hold writes no path can take: wait for one to come
            // back (the transport recovers on its own), then flush as usual.
            let since = *busy_since.get_or_insert(t0);
            let what = format!("a path to come back: {}", stuck.join("; "));
            self.record(
                StepKind::CheckInUse,
                &target,
                Outcome::Failed(format!("waiting for {what}")),
                t0.elapsed(),
            );
            return Err(Stop::Again(Error::Timeout {
                what,
                waited: since.elapsed(),
            }));
        };
        if force {
            self.record(
                StepKind::CheckInUse,
                &target,
                Outcome::Skipped(format!("forced past: {err}")),
                t0.elapsed(),
            );
            return Ok(unreachable);
        }
        // Processes alone may be udev's probes, which let go by themselves: wait a little.
        let since = *busy_since.get_or_insert(t0);
        if usage.only_openers() && t0 - since < OPENER_GRACE && t0 < deadline {
            self.record(
                StepKind::CheckInUse,
                &target,
                Outcome::Failed(format!("{usage} (waiting for it to close)")),
                t0.elapsed(),
            );
            return Err(Stop::Again(err));
        }
        self.record(
            StepKind::CheckInUse,
            &target,
            Outcome::Failed(err.to_string()),
            t0.elapsed(),
        );
        Err(Stop::Fail(err))
    }

    /// Makes a map that no path can serve fail its I/O instead of queueing it: through
    /// multipathd when it runs (`disablequeueing map NAME`, so that its own reloads of the
    /// map, after each path removal, keep it that way), and with dm's `fail_if_no_path`
    /// message on the table as it is now.
    fn disable_queueing(&mut self, map: &MapDevice) -> std::result::Result<(), Stop> {
        let label = format!("{} ({})", map.name, map.node.name);
        let root = self.root;
        let deadline = self.deadline;
        let use_multipathd = self.opts.use_multipathd;
        let name = map.name.clone();
        self.step_or_force(StepKind::DisableQueueing, &label, || {
            if use_multipathd {
                // Best effort, with half the time left: the dm message below does the job
                // whatever multipathd answers, and a multipathd that is not running, not
                // answering, not root, or not knowing the map ("fail") changes nothing.
                let now = Instant::now();
                let theirs = now + deadline.saturating_duration_since(now) / 2;
                if let Ok(Some(mut d)) = multipath::Multipathd::connect(root, theirs) {
                    let _ = d.command(&format!("disablequeueing map {name}"), theirs);
                }
            }
            let ctl = Control::open(root)?;
            match ctl.message(&DevId::Name(&name), 0, "fail_if_no_path") {
                Ok(_) => Ok(Outcome::Done),
                Err(e) if e.is_gone() => Ok(Outcome::AlreadyGone),
                Err(e) => Err(e),
            }
        })
        .map_err(Stop::from)
    }

    /// Flushes and removes one map. `unreachable` says why no path can serve it: then it
    /// is not flushed (the check found nothing waiting to be written, or the detach is
    /// forced) and its queued I/O is failed.
    fn take_down_map(
        &mut self,
        map: &MapDevice,
        unreachable: Option<&str>,
    ) -> std::result::Result<(), Stop> {
        let label = format!("{} ({})", map.name, map.node.name);
        let deadline = self.deadline;
        let node = map.node.clone();
        if let Some(why) = unreachable {
            let outcome = if self.opts.force {
                format!("no path can take I/O ({why}); forced: whatever it held is lost")
            } else if self.failed_while_waiting.contains(&map.name) {
                format!(
                    "no path can take I/O ({why}); it was open while this detach waited for \
                     a path, until its queued I/O was failed (queueing turned off, as \
                     multipathd does when no_path_retry runs out): writes that waited in it \
                     are lost"
                )
            } else {
                format!("no path can take I/O ({why}); nothing had it open, so nothing waits")
            };
            self.record(
                StepKind::FlushMap,
                &label,
                Outcome::Skipped(outcome),
                Duration::ZERO,
            );
        } else {
            let root = self.root;
            self.step_or_force(StepKind::FlushMap, &label, || {
                match block::flush(&node, deadline) {
                    Ok(()) => Ok(Outcome::Done),
                    Err(e) if flush_found_it_gone(root, &node, &e) => Ok(Outcome::AlreadyGone),
                    Err(e) => Err(e),
                }
            })?;
        }
        let root = self.root;
        let mut opts = RemoveOptions::default();
        opts.timeout = deadline.saturating_duration_since(Instant::now());
        // A map no path can serve was checked to hold nothing: failing its queued I/O (udev's
        // stuck reads) is safe.
        opts.force = self.opts.force || unreachable.is_some();
        opts.use_multipathd = self.opts.use_multipathd;
        let name = map.name.clone();
        self.step_or_force(StepKind::RemoveMap, &label, || {
            match multipath::remove(root, &name, &opts) {
                Ok(_) => Ok(Outcome::Done),
                Err(e) if e.is_gone() => Ok(Outcome::AlreadyGone),
                Err(e) => Err(e),
            }
        })
        .map_err(|e| match e {
            // The check above found it free, so this is an opener of a moment (udev probing
            // the map after its flush): another round retries.
            Error::Busy { .. } => Stop::Again(e),
            e => e.into(),
        })
    }

    fn take_down_paths(&mut self, paths: &[VolumePath], behind_map: bool) -> Result<()> {
        let root = self.root;
        let deadline = self.deadline;
        let force = self.opts.force;
        // Each delete blocks on its device's cache flush and teardown: do them side by side.
        type PathResult = (Duration, Result<Outcome>, Duration, Option<Result<Outcome>>);
        let results: Vec<PathResult> = std::thread::scope(|s| {
            let handles: Vec<_> = paths
                .iter()
                .map(|p| {
                    s.spawn(move || {
                        let t0 = Instant::now();
                        let flushed = flush_path(root, p, behind_map, deadline);
                        let flush_time = t0.elapsed();
                        let t1 = Instant::now();
                        // A path whose flush failed is not deleted (unless forced): `None`.
                        let deleted = match (&flushed, force) {
                            (Err(_), false) => None,
                            _ => Some(
                                scsi::remove_device(root, p.hctl, &p.identity, deadline).map(|d| {
                                    match d {
                                        Deleted::Now => Outcome::Done,
                                        Deleted::AlreadyGone => Outcome::AlreadyGone,
                                    }
                                }),
                            ),
                        };
                        (flush_time, flushed, t1.elapsed(), deleted)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    // Its flush may or may not have run; its delete did not finish.
                    h.join().unwrap_or_else(|_| {
                        let e = Error::Internal {
                            what: "the thread flushing and deleting this path panicked".into(),
                        };
                        (Duration::ZERO, Err(e), Duration::ZERO, None)
                    })
                })
                .collect()
        });
        let mut first_err = None;
        for (p, (ft, flushed, dt, deleted)) in paths.iter().zip(results) {
            let target = p.to_string();
            let flush_failed = flushed.is_err();
            match flushed {
                Ok(o) => self.record(StepKind::FlushPath, &target, o, ft),
                Err(e) if force => self.record(
                    StepKind::FlushPath,
                    &target,
                    Outcome::Skipped(format!("forced past: {e}")),
                    ft,
                ),
                Err(e) => {
                    self.record(
                        StepKind::FlushPath,
                        &target,
                        Outcome::Failed(e.to_string()),
                        ft,
                    );
                    first_err.get_or_insert(step_error(StepKind::FlushPath, &target, e));
                }
            }
            if flush_failed && !force {
                continue;
            }
            match deleted {
                // Not attempted: its flush failed (recorded above).
                None => {}
                Some(Ok(o)) => self.record(StepKind::DeletePath, &target, o, dt),
                // Another device at the address since this round checked it: left alone, and
                // the next round looks at what is there now.
                Some(Err(e @ Error::Replaced { .. })) => {
                    self.record(
                        StepKind::DeletePath,
                        &target,
                        Outcome::Skipped(format!("{e}; looking again")),
                        dt,
                    );
                    first_err.get_or_insert(e);
                }
                Some(Err(e)) => {
                    self.record(
                        StepKind::DeletePath,
                        &target,
                        Outcome::Failed(e.to_string()),
                        dt,
                    );
                    first_err.get_or_insert(step_error(StepKind::DeletePath, &target, e));
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

/// Flushes a path's disk. A path of a multipath volume whose device is not running cannot take
/// writes at all; what the volume had to write went through the map, which was flushed first,
/// so it is passed over rather than holding the detach until the transport gives up.
fn flush_path(root: &Root, p: &VolumePath, behind_map: bool, deadline: Instant) -> Result<Outcome> {
    let Some(disk) = &p.disk else {
        return Ok(Outcome::AlreadyGone);
    };
    match p.state.as_deref() {
        // A lone disk is the volume's only writer: its flush must run, within the deadline.
        _ if !behind_map => {}
        Some("running") => {}
        // blocked (a session in recovery) would hold the flush until the transport gives up,
        // minutes later; offline and transport-offline fail it. The kernel fails a blocked
        // device's queue when it is deleted, so the delete itself does not wait.
        state => {
            return Ok(Outcome::Skipped(format!(
                "device is {}: it takes no writes now, and the map was flushed first",
                state.unwrap_or("in an unknown state")
            )));
        }
    }
    match block::flush(disk, deadline) {
        Ok(()) => Ok(Outcome::Done),
        Err(e) if flush_found_it_gone(root, disk, &e) => Ok(Outcome::AlreadyGone),
        Err(e) => Err(e),
    }
}

/// Whether a failed flush failed because the device is gone, and sysfs agrees. The errno
/// alone does not tell: an offline SCSI disk refuses its open with `ENXIO` too (`sd_open`),
/// and still holds what it cached; only a device whose `/sys/dev/block/M:m` went away is
/// gone.
fn flush_found_it_gone(root: &Root, node: &block::BlockNode, e: &Error) -> bool {
    e.is_gone() && !crate::sysfs::block::number_exists(root, node.dev)
}

/// Whether a map can still write to its storage.
enum Reach {
    /// A path can take I/O now.
    Usable,
    /// No path can take I/O now: none is active in the map (its I/O queues, or fails at once
    /// when it does not queue), or every active one is a SCSI device that is not running
    /// (blocked in transport recovery, offline), so I/O sent to it waits there. A flush
    /// cannot succeed either way: even with nothing cached, its cache-flush request fails.
    Unreachable {
        /// Which, for messages: `no active path`, `sdc blocked, sdd transport-offline`.
        why: String,
        /// How often the map is open beyond its own idle partition maps (an open partition
        /// map counts with its own opens).
        open: usize,
        /// Its table has `queue_if_no_path`.
        queues: bool,
    },
}

/// How often a map is open by anything but its own idle partition maps: each partition
/// map opens the map once, and counts as the map's own only while nothing has the
/// partition map itself open. `part_opens` are the partition maps' open counts.
fn open_beyond_partitions(map_open: i32, partitions: usize, part_opens: &[i32]) -> usize {
    let own = usize::try_from(map_open)
        .unwrap_or(0)
        .saturating_sub(partitions);
    let through_partitions: usize = part_opens
        .iter()
        .map(|&n| usize::try_from(n).unwrap_or(0))
        .sum();
    own + through_partitions
}

/// Reads the map's table, status and open count, and the states of its paths' devices (a
/// map that vanished meanwhile is Usable: the next round will not find it).
fn map_reach(root: &Root, map: &MapDevice, paths: &[VolumePath]) -> Result<Reach> {
    let ctl = Control::open(root)?;
    let id = DevId::Name(&map.name);
    let (table, status, info) = match (ctl.table(&id), ctl.status(&id), ctl.info(&id)) {
        (Ok(t), Ok(s), Ok(i)) => (t, s, i),
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) if e.is_gone() => {
            return Ok(Reach::Usable);
        }
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => return Err(e),
    };
    let (Some(t), Some(s)) = (table.first(), status.first()) else {
        return Ok(Reach::Usable);
    };
    if t.target_type != "multipath" || s.target_type != "multipath" {
        return Ok(Reach::Usable);
    }
    let queues = multipath::Table::parse(&t.params)?.queue_if_no_path();
    let status = multipath::Status::parse(&s.params)?;
    // Each partition map opens the map once; whether those partition maps are themselves
    // open is asked of each (by number: `partitions` holds kernel names).
    let mut part_opens = Vec::new();
    for p in &map.partitions {
        let Some(node) = block::by_name(root, p)? else {
            continue;
        };
        match ctl.info(&DevId::Dev(node.dev)) {
            Ok(i) => part_opens.push(i.open_count),
            Err(e) if e.is_gone() => {}
            Err(e) => return Err(e),
        }
    }
    let open = open_beyond_partitions(info.open_count, map.partitions.len(), &part_opens);
    let active: Vec<_> = status.paths().filter(|p| p.active).collect();
    if active.is_empty() {
        return Ok(Reach::Unreachable {
            why: "no active path".into(),
            open,
            queues,
        });
    }
    // A path device the volume's paths do not list (not SCSI, or not found by WWID) is
    // taken as able to serve: the normal flush is the safe way for it. The states are read
    // now, after the open count, not taken from the round's snapshot: a writer that was
    // waiting in the map closes as soon as a path recovers, and the in-use walk before this
    // takes long enough (a tenth of a second under TCG) for that to happen in between, so
    // the snapshot would pair a closed map with paths that are no longer blocked.
    let mut stopped = Vec::new();
    for p in &active {
        let volume_path = paths
            .iter()
            .find(|vp| vp.disk.as_ref().is_some_and(|d| d.dev == p.dev));
        let now = volume_path.and_then(|vp| Some((vp, volume::path_state(root, vp.hctl)?)));
        match now.as_ref().map(|(vp, s)| (*vp, s.as_str())) {
            Some((vp, state)) if state != "running" => {
                let name = vp.disk.as_ref().map_or("?", |d| d.name.as_str());
                stopped.push(format!("{name} {state}"));
            }
            _ => return Ok(Reach::Usable),
        }
    }
    Ok(Reach::Unreachable {
        why: stopped.join(", "),
        open,
        queues,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flush_error_is_gone_only_when_sysfs_agrees() {
        let dir = std::env::temp_dir().join(format!("lunkit-flush-gone-{}", std::process::id()));
        let root = Root::new(&dir);
        let node = block::BlockNode {
            name: "sdc".into(),
            dev: DevNum {
                major: 8,
                minor: 32,
            },
            path: dir.join("dev/sdc"),
        };
        let open = |errno| Error::io(&node.path, std::io::Error::from_raw_os_error(errno));
        std::fs::create_dir_all(dir.join("sys/dev/block/8:32")).unwrap();
        // The disk is there: an offline disk's ENXIO, or a node udev already removed, is not
        // a flush that may be skipped.
        assert!(!flush_found_it_gone(&root, &node, &open(libc::ENXIO)));
        assert!(!flush_found_it_gone(&root, &node, &open(libc::ENOENT)));
        std::fs::remove_dir(dir.join("sys/dev/block/8:32")).unwrap();
        assert!(flush_found_it_gone(&root, &node, &open(libc::ENOENT)));
        // Gone from sysfs, but the error is not an absence: still an error.
        assert!(!flush_found_it_gone(&root, &node, &open(libc::EIO)));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_open_partition_map_keeps_its_map_busy() {
        // mpatha with one partition map: the partition map's open of the map is its own.
        assert_eq!(open_beyond_partitions(1, 1, &[0]), 0);
        // The partition map is open (mounted, a loop on it): the map is in use through it,
        // although its own open count equals its partition-map count.
        assert_eq!(open_beyond_partitions(1, 1, &[1]), 1);
        assert_eq!(open_beyond_partitions(2, 2, &[0, 2]), 2);
        // Opened directly as well.
        assert_eq!(open_beyond_partitions(3, 1, &[0]), 2);
        // A partition map that vanished meanwhile is not counted either way.
        assert_eq!(open_beyond_partitions(0, 1, &[]), 0);
    }
}

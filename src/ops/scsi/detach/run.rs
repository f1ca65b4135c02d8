//! One detach in progress ([`Run`]): its steps, recorded as they happen, and the taking
//! down of maps and paths. The in-use check that opens every round is in `in_use.rs`.

use std::time::{Duration, Instant};

use super::Stop;
use crate::block;
use crate::dm::{Control, DevId};
use crate::error::{Error, Result};
use crate::helper;
use crate::id::DevNum;
use crate::multipath::{self, RemoveOptions};
use crate::ops::BeforeRemoval;
use crate::ops::options::DetachOptions;
use crate::ops::report::{MapDevice, Outcome, StepKind};
use crate::ops::scsi::locate::{VolumePath, VolumeState};
use crate::ops::steps::{StepLog, step_error};
use crate::root::Root;
use crate::scsi::sysfs::ScsiState;
use crate::scsi::{self, Deleted};

/// One detach in progress: where steps go.
pub(super) struct Run<'a> {
    pub(super) root: &'a Root,
    pub(super) opts: &'a DetachOptions,
    pub(super) deadline: Instant,
    pub(super) log: StepLog<'a>,
    /// The caller's step before anything is removed, until it has run.
    pub(super) before_removal: Option<&'a mut BeforeRemoval<'a>>,
    /// Maps this detach waited on for a path to come back (open, no path, queueing).
    pub(super) waited_on: Vec<String>,
    /// Of those, the ones found later closed with their queued I/O failed by someone else.
    pub(super) failed_while_waiting: Vec<String>,
}

impl Run<'_> {
    /// One take-down round over what `state` found.
    ///
    /// Normally the maps go first, then the paths (a path deleted under a map that queues
    /// would leave its I/O hanging). A map that no path can serve goes the other way round:
    /// its queueing is disabled first, then its paths are deleted, which fails the reads
    /// udev's probes have stuck on them (a blocked path keeps them until it is deleted), and
    /// then the map, no longer open, is removed.
    pub(super) fn round(
        &mut self,
        state: &VolumeState,
        busy_since: &mut Option<Instant>,
        intent: block::CheckIntent,
    ) -> std::result::Result<(), Stop> {
        self.resume_suspended(state)?;
        // The map's flush and each path's flush and delete run on helper threads: have them
        // started while the check looks at the node, not on the take-down's critical path.
        // A path's flush and delete come one after the other, and the map's flush before
        // them, so a thread per path (back to waiting after each call) and one spare do.
        crate::helper::prewarm(state.paths.len() + 1);
        let (unreachable, claims) = self.check_in_use(state, busy_since, intent)?;
        if let Some(step) = self.before_removal.take() {
            // Its flush leaves each map's own below nothing to write, unless the step wrote.
            self.before_removal(state, &unreachable, step)?;
        }
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
        // Those maps stay until their paths are gone, holding them as device-mapper does.
        let held: Vec<String> = stuck.iter().map(|(m, _)| m.node.name.clone()).collect();
        self.take_down_paths(&state.paths, !state.maps.is_empty(), &claims, &held)?;
        for (map, why) in stuck {
            self.take_down_map(map, Some(why))?;
        }
        Ok(())
    }

    /// The caller's step ([`crate::ops::detach_before_removal`]), once the check found the
    /// volume unused: the maps a path can serve (`unreachable[i]` is `None`) flushed first,
    /// since the step may end this node's right to write through them (a reservation
    /// released), then the step. Its error ends the detach, forced or not.
    fn before_removal(
        &mut self,
        state: &VolumeState,
        unreachable: &[Option<String>],
        step: &mut BeforeRemoval<'_>,
    ) -> std::result::Result<(), Stop> {
        let deadline = self.deadline;
        let served = state
            .maps
            .iter()
            .zip(unreachable)
            .filter(|(_, why)| why.is_none());
        let maps: Vec<&MapDevice> = served.map(|(m, _)| m).collect();
        self.log
            .run(StepKind::BeforeRemoval, &state.describe(), || {
                for m in maps {
                    block::flush(&m.node, deadline)?;
                }
                step(state).map(|()| ((), Outcome::Done))
            })
            .map_err(Stop::Fail)
    }

    /// Resumes the volume's maps (and their partition maps) that are suspended, parents
    /// first, before anything is checked or flushed: a flush of a suspended map would wait
    /// for the resume, and nothing else would ever resume it. Resuming gives the map back the
    /// table it has, and its users the I/O it held; no data is dropped. A map that multipathd
    /// is reloading is suspended for that moment, and one it resumed first is no failure.
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
                let t0 = Instant::now();
                match ctl.resume_if_suspended(&DevId::Dev(dev)) {
                    Ok(Some(info)) => {
                        let label = format!("{} ({})", info.name, info.kernel_name());
                        let took = t0.elapsed();
                        self.log
                            .record(StepKind::ResumeMap, &label, Outcome::Done, took);
                    }
                    Ok(None) => {}
                    Err(e) if e.is_gone() => {}
                    Err(e) => {
                        let target = format!("{} (dm-{})", map.name, dev.minor);
                        let failed = Outcome::Failed(e.to_string());
                        self.log
                            .record(StepKind::ResumeMap, &target, failed, t0.elapsed());
                        return Err(step_error(StepKind::ResumeMap, &target, e).into());
                    }
                }
            }
        }
        Ok(())
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
        self.log
            .run_or_force(self.opts.force, StepKind::DisableQueueing, &label, || {
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
            self.log.record(
                StepKind::FlushMap,
                &label,
                Outcome::Skipped(outcome),
                Duration::ZERO,
            );
        } else {
            let root = self.root;
            self.log
                .run_or_force(
                    self.opts.force,
                    StepKind::FlushMap,
                    &label,
                    || match block::flush(&node, deadline) {
                        Ok(()) => Ok(Outcome::Done),
                        Err(e) if flush_found_it_gone(root, &node, &e) => Ok(Outcome::AlreadyGone),
                        Err(e) => Err(e),
                    },
                )?;
        }
        let root = self.root;
        let mut opts = RemoveOptions::default();
        opts.timeout = deadline.saturating_duration_since(Instant::now());
        // A map no path can serve was checked to hold nothing: failing its queued I/O (udev's
        // stuck reads) is safe.
        opts.force = self.opts.force || unreachable.is_some();
        opts.use_multipathd = self.opts.use_multipathd;
        let name = map.name.clone();
        self.log
            .run_or_force(
                self.opts.force,
                StepKind::RemoveMap,
                &label,
                || match multipath::remove(root, &name, &opts) {
                    Ok(_) => Ok(Outcome::Done),
                    Err(e) if e.is_gone() => Ok(Outcome::AlreadyGone),
                    Err(e) => Err(e),
                },
            )
            .map_err(|e| match e {
                // The check above found it free, so this is an opener of a moment (udev probing
                // the map after its flush): another round retries.
                Error::Busy { .. } => Stop::Again(e),
                e => e.into(),
            })
    }

    /// Flushes and deletes every path, side by side. Each disk is claimed exclusively
    /// ([`block::claim`]) before its flush and until its delete, unless `claimed` holds it
    /// already: a path freed by its map's removal is then never free for a mount or a new
    /// stack before it is gone. A claim refused (`EBUSY`: something took it since the
    /// map went, multipathd re-creating the map, say) fails its flush, and the next round
    /// looks again. A path whose only holders are the maps `held_by_maps` (kernel names: maps
    /// no path can serve, removed after their paths) is claimed by device-mapper for them,
    /// exclusively, so nothing else can take it, and neither can this: it is not claimed.
    fn take_down_paths(
        &mut self,
        paths: &[VolumePath],
        behind_map: bool,
        claimed: &[block::Claim],
        held_by_maps: &[String],
    ) -> Result<()> {
        let root = self.root;
        let deadline = self.deadline;
        let force = self.opts.force;
        // Each delete blocks on its device's cache flush and teardown: do them side by side.
        let one = |p: &VolumePath| -> PathResult {
            let t0 = Instant::now();
            let claim = match &p.disk {
                Some(d)
                    if !claimed.iter().any(|c| c.node().dev == d.dev)
                        && !held_by(root, d, held_by_maps) =>
                {
                    block::try_claim(d, deadline)
                }
                _ => Ok(None),
            };
            // Held until this path's delete returned; a claim refused when forced is passed.
            let (held, flushed) = match claim {
                Err(e) if !force => (None, Err(e)),
                c => (c.ok().flatten(), flush_path(root, p, behind_map, deadline)),
            };
            let flush_time = t0.elapsed();
            let t1 = Instant::now();
            // A path whose flush failed is not deleted (unless forced): `None`.
            let deleted = match (&flushed, force) {
                (Err(_), false) => None,
                _ => Some(
                    scsi::remove_device(root, p.hctl, &p.identity, deadline).map(|d| match d {
                        Deleted::Now => Outcome::Done,
                        Deleted::AlreadyGone => Outcome::AlreadyGone,
                    }),
                ),
            };
            // The delete ends once the claim lets go of the deleted disk: that last close
            // is the kernel's release of it (10-20 ms under TCG), which the delete itself
            // pays when nothing holds the disk.
            drop(held);
            ((t0, flush_time), flushed, (t1, t1.elapsed()), deleted)
        };
        // Its flush may or may not have run when its worker failed; its delete did not finish.
        let fanned = Instant::now();
        let results = helper::fan_out("lunkit-delete-path", paths, |p| Ok(one(p)))
            .into_iter()
            .map(|r| {
                let none = (fanned, Duration::ZERO);
                r.unwrap_or_else(|e| (none, Err(e), none, None))
            });
        let mut first_err = None;
        for (p, result) in paths.iter().zip(results) {
            if let Some(e) = self.record_path(&p.to_string(), result) {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Records one path's flush and delete (each with its start and length, so that the
    /// paths' steps overlap in the report) and returns the error that stops the round.
    fn record_path(&mut self, target: &str, result: PathResult) -> Option<Error> {
        let (ft, flushed, dt, deleted) = result;
        let force = self.opts.force;
        let flush_kind = StepKind::FlushPath;
        match flushed {
            Ok(o) => self.log.record_span(flush_kind, target, o, ft.0, ft.1),
            Err(e) if force => {
                let skipped = Outcome::Skipped(format!("forced past: {e}"));
                self.log
                    .record_span(flush_kind, target, skipped, ft.0, ft.1);
            }
            Err(e) => {
                let failed = Outcome::Failed(e.to_string());
                self.log.record_span(flush_kind, target, failed, ft.0, ft.1);
                // Not deleted: `deleted` is `None`.
                return Some(step_error(flush_kind, target, e));
            }
        }
        let kind = StepKind::DeletePath;
        match deleted? {
            Ok(o) => {
                self.log.record_span(kind, target, o, dt.0, dt.1);
                None
            }
            // Another device at the address since this round checked it: left alone, and
            // the next round looks at what is there now.
            Err(e @ Error::Replaced { .. }) => {
                let skipped = Outcome::Skipped(format!("{e}; looking again"));
                self.log.record_span(kind, target, skipped, dt.0, dt.1);
                Some(e)
            }
            Err(e) => {
                let failed = Outcome::Failed(e.to_string());
                self.log.record_span(kind, target, failed, dt.0, dt.1);
                Some(step_error(kind, target, e))
            }
        }
    }
}

/// Whether `disk` is held by the maps `maps` (kernel names) and by nothing else.
fn held_by(root: &Root, disk: &block::BlockNode, maps: &[String]) -> bool {
    !maps.is_empty()
        && crate::block::sysfs::holders_of_number(root, disk.dev)
            .is_ok_and(|h| !h.is_empty() && h.iter().all(|x| maps.contains(x)))
}

/// A step's start and length.
type Span = (Instant, Duration);
/// One path's take-down: its flush's span and outcome, its delete's span and outcome (`None`
/// when not attempted: the flush failed and the detach is not forced).
type PathResult = (Span, Result<Outcome>, Span, Option<Result<Outcome>>);

/// Flushes a path's disk. A path of a multipath volume whose device is not running cannot take
/// writes at all; what the volume had to write went through the map, which was flushed first,
/// so it is passed over rather than holding the detach until the transport gives up.
fn flush_path(root: &Root, p: &VolumePath, behind_map: bool, deadline: Instant) -> Result<Outcome> {
    let Some(disk) = &p.disk else {
        return Ok(Outcome::AlreadyGone);
    };
    match &p.state {
        // A lone disk is the volume's only writer: its flush must run, within the deadline.
        _ if !behind_map => {}
        Some(ScsiState::Running) => {}
        // blocked (a session in recovery) would hold the flush until the transport gives up,
        // minutes later; offline and transport-offline fail it. The kernel fails a blocked
        // device's queue when it is deleted, so the delete itself does not wait.
        state => {
            return Ok(Outcome::Skipped(format!(
                "device is {}: it takes no writes now, and the map was flushed first",
                state
                    .as_ref()
                    .map_or("in an unknown state", ScsiState::as_str)
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
    e.is_gone() && !crate::block::sysfs::number_exists(root, node.dev)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_is_held_by_maps_only_when_they_are_its_only_holders() {
        let dir = std::env::temp_dir().join(format!("lunkit-held-by-{}", std::process::id()));
        let root = Root::new(&dir);
        let node = block::BlockNode {
            name: "sdc".into(),
            dev: DevNum {
                major: 8,
                minor: 32,
            },
            path: dir.join("dev/sdc"),
        };
        let holders = dir.join("sys/dev/block/8:32/holders");
        std::fs::create_dir_all(holders.join("dm-0")).unwrap();
        let maps = ["dm-0".to_owned()];
        assert!(held_by(&root, &node, &maps));
        // No map stays up: the path is claimed as usual.
        assert!(!held_by(&root, &node, &[]));
        // Another holder besides: not the map's alone.
        std::fs::create_dir_all(holders.join("dm-7")).unwrap();
        assert!(!held_by(&root, &node, &maps));
        // No holder at all (the map let go of it).
        std::fs::remove_dir_all(&holders).unwrap();
        std::fs::create_dir_all(&holders).unwrap();
        assert!(!held_by(&root, &node, &maps));
        std::fs::remove_dir_all(&dir).unwrap();
    }

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
}

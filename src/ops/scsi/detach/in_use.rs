//! The check that opens every round of a detach: who uses the volume, and whether each map
//! can still reach its storage.

use std::time::Instant;

use super::Stop;
use super::run::Run;
use crate::block::{self, OPENER_GRACE, UsageScope};
use crate::dm::{Control, DevId};
use crate::error::{Error, Result};
use crate::multipath;
use crate::ops::report::{MapDevice, Outcome, StepKind};
use crate::ops::scsi::locate::{VolumePath, VolumeState};
use crate::root::Root;
use crate::scsi::PATH_MANAGERS;
use crate::scsi::sysfs::ScsiState;

impl Run<'_> {
    /// Refuses (or, forced, records) use of the volume. Returns, per map of `state`, why no
    /// path can serve it (`None` for a map that can still write): such a map is taken down
    /// unflushed, which this check has made sure loses nothing, unless forced.
    ///
    /// A map that no path can serve is one of three cases (see the module docs): a user
    /// has it (refused), nothing has it open (taken down unflushed), or udev's read-only
    /// probes or something this check cannot see have it open (wait, round after round
    /// until the deadline, for a path to come back, and then flush it).
    ///
    /// A volume without a map has its path disks claimed ([`block::claim`]) before the check
    /// is done: from here to their delete nothing can mount them or stack on them. The
    /// claims are returned, to be held until the paths are deleted. (A map's paths are
    /// claimed by device-mapper until the map is removed, and by the take-down after that.)
    pub(super) fn check_in_use(
        &mut self,
        state: &VolumeState,
        busy_since: &mut Option<Instant>,
        intent: block::CheckIntent,
    ) -> std::result::Result<(Vec<Option<String>>, Vec<block::Claim>), Stop> {
        let target = state.describe();
        let force = self.opts.force;
        let deadline = self.deadline;
        let t0 = Instant::now();
        let (usage, reach) = match self.usage_and_reach(state, intent) {
            Ok(v) => v,
            Err(e) => return Err(self.log.fail(StepKind::CheckInUse, &target, e, t0).into()),
        };
        let (unreachable, stuck) = self.unreachable_maps(state, &usage, reach);
        let Some(err) = usage.refusal(&target) else {
            if stuck.is_empty() {
                let claims = match self.claim_lone_paths(state) {
                    Ok(c) => c,
                    Err(e) => {
                        let failed = Outcome::Failed(format!("{e} (taken since the check)"));
                        self.log
                            .record(StepKind::CheckInUse, &target, failed, t0.elapsed());
                        return Err(Stop::Again(e));
                    }
                };
                *busy_since = None;
                self.log
                    .record(StepKind::CheckInUse, &target, Outcome::Done, t0.elapsed());
                return Ok((unreachable, claims));
            }
            // Nobody uses it, but it may hold writes no path can take: wait for one to come
            // back (the transport recovers on its own), then flush as usual.
            let since = *busy_since.get_or_insert(t0);
            let what = format!("a path to come back: {}", stuck.join("; "));
            self.log.record(
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
            self.log.record(
                StepKind::CheckInUse,
                &target,
                Outcome::Skipped(format!("forced past: {err}")),
                t0.elapsed(),
            );
            return Ok((unreachable, Vec::new()));
        }
        // Processes alone may be udev's probes, which let go by themselves: wait a little.
        let since = *busy_since.get_or_insert(t0);
        if usage.only_openers() && t0 - since < OPENER_GRACE && t0 < deadline {
            self.log.record(
                StepKind::CheckInUse,
                &target,
                Outcome::Failed(format!("{usage} (waiting for it to close)")),
                t0.elapsed(),
            );
            return Err(Stop::Again(err));
        }
        self.log.record(
            StepKind::CheckInUse,
            &target,
            Outcome::Failed(err.to_string()),
            t0.elapsed(),
        );
        Err(Stop::Fail(err))
    }

    /// Who uses the volume's maps and disks, and whether each map can still reach its
    /// storage.
    fn usage_and_reach(
        &self,
        state: &VolumeState,
        intent: block::CheckIntent,
    ) -> Result<(block::Usage, Vec<Reach>)> {
        let own = state.own_dm();
        let mut devices: Vec<_> = state.maps.iter().map(|m| m.node.clone()).collect();
        devices.extend(state.paths.iter().filter_map(|p| p.disk.clone()));
        let scope = UsageScope {
            own: &own,
            ignore_openers: PATH_MANAGERS,
        };
        let usage = block::usage_intended(self.root, &devices, &scope, self.deadline, intent)?;
        let reach = state
            .maps
            .iter()
            .map(|m| map_reach(self.root, m, &state.paths))
            .collect::<Result<Vec<_>>>()?;
        Ok((usage, reach))
    }

    /// Claims the disks of a volume that has no map: every path is a lone disk, which
    /// nothing holds between this check and its delete unless the detach does. `EBUSY` means
    /// a user came in between (the next round's check names it).
    fn claim_lone_paths(&self, state: &VolumeState) -> Result<Vec<block::Claim>> {
        if !state.maps.is_empty() {
            return Ok(Vec::new());
        }
        let mut claims = Vec::new();
        for d in state.paths.iter().filter_map(|p| p.disk.as_ref()) {
            claims.extend(block::try_claim(d, self.deadline)?);
        }
        Ok(claims)
    }

    /// Per map of `state`, why no path can serve it (`None` for one that can), and the
    /// maps that must wait for a path: open, nobody `usage` names has them, so writes may
    /// be cached in them that only a path can take. Keeps [`Run::waited_on`] and
    /// [`Run::failed_while_waiting`] up to date.
    fn unreachable_maps(
        &mut self,
        state: &VolumeState,
        usage: &block::Usage,
        reach: Vec<Reach>,
    ) -> (Vec<Option<String>>, Vec<String>) {
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
            if !self.opts.force && usage.is_empty() && open > 0 {
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
        (unreachable, stuck)
    }
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
        let now = volume_path.and_then(|vp| Some((vp, crate::scsi::sysfs::state(root, vp.hctl)?)));
        match now.as_ref().map(|(vp, s)| (*vp, s)) {
            Some((vp, state)) if *state != ScsiState::Running => {
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

//! The SCSI resize: every path rescanned at once, then the map grown. What it does is told at
//! [`crate::ops::resize()`].

use std::time::Instant;

use crate::block::sysfs as sysblock;
use crate::error::{Error, ErrorKind, ResizeFailure, Result};
use crate::helper;
use crate::multipath::{self, GrownBy};
use crate::root::Root;
use crate::uevent::{Action, Subscription, Uevent};
use crate::wait;

use super::identify::identify;
use super::locate::{VolumePath, locate_until};
use crate::ops::lock;
use crate::ops::options::{RESCAN_INTERVAL, ResizeOptions};
use crate::ops::report::{MapSize, PathSize, Resized, ResizedFamily, ScsiResize};
use crate::ops::spec::VolumeSpec;
use crate::scsi::sysfs::ScsiState;

/// Grows the volume `spec`, named by SCSI, on every path and its map
/// ([`crate::ops::resize()`]).
pub(in crate::ops) fn resize(
    root: &Root,
    spec: &VolumeSpec,
    opts: &ResizeOptions,
) -> Result<Resized> {
    let start = Instant::now();
    let deadline = wait::deadline_from(start, opts.timeout);
    let id = identify(root, spec)?;
    let _lock = lock::lock(&id.key(), opts.lock_dir.as_deref(), deadline)?;
    let state = locate_until(root, &id, deadline)?;
    state.refuse_foreign_maps(&spec.to_string())?;
    let map = match state.maps.as_slice() {
        [] => None,
        [m] => Some(m.clone()),
        [a, b, ..] => {
            return Err(Error::Invalid {
                kind: "volume",
                input: format!("{spec}: {} and {}", a.name, b.name),
                reason: "two multipath maps claim this volume; remove the stale one first",
            });
        }
    };
    let volume = map.as_ref().map_or_else(
        || spec.to_string(),
        |m| format!("{} ({})", m.name, m.node.name),
    );
    let refuse = |reason| Error::Resize {
        volume: volume.clone(),
        reason,
    };

    // Every path up and with a disk, and still the LUN the kernel knows, before anything is
    // written.
    let mut paths = paths_up(root, spec, &state.paths, refuse)?;
    refuse_remapped(root, &state.paths, &volume, deadline)?;
    paths.sort_by_key(|p| p.hctl);
    let map_before = match &map {
        Some(m) => Some(sysblock::size_of(root, &m.node.name)?),
        None => None,
    };

    // Every device of one size, and that size enough: nothing to learn, nothing to grow.
    let already = opts.expect_size.is_some_and(|e| {
        let size = map_before.unwrap_or(paths[0].before);
        size >= e && paths.iter().all(|p| p.before == size)
    });
    let rescan_start = Instant::now();
    if !already {
        rescan_until(root, &mut paths, opts.expect_size, deadline)?;
    }
    let rescan_elapsed = rescan_start.elapsed();

    let size = agreed_size(&paths, map_before, &volume).map_err(refuse)?;
    let map_start = Instant::now();
    let device_node = match (&map, paths.as_slice()) {
        (Some(m), _) => Some(m.node.path.clone()),
        (None, [one]) => Some(root.dev(&one.disk)),
        (None, _) => None,
    };
    let map = match (map, map_before) {
        (Some(m), Some(before)) => {
            // A map already of the paths' size needs no device-mapper call at all.
            let by = if size == before {
                GrownBy::Unchanged
            } else {
                multipath::grow(root, &m.name, size, opts.use_multipathd, deadline)?
            };
            Some(MapSize {
                after: sysblock::size_of(root, &m.node.name)?,
                device: format!("{} ({})", m.name, m.node.name),
                name: m.name,
                before,
                by,
            })
        }
        _ => None,
    };
    Ok(Resized {
        wwid: id.wwid,
        family: ResizedFamily::Scsi(ScsiResize {
            paths,
            map,
            map_elapsed: map_start.elapsed(),
        }),
        rescanned: !already,
        rescan_elapsed,
        elapsed: start.elapsed(),
        device_node,
    })
}

/// Every path of the volume with its size now. Every path must be `running` with a disk
/// ([`ResizeFailure::PathDown`], made an error by `refuse`), and there must be one
/// ([`Error::NotFound`]).
fn paths_up(
    root: &Root,
    spec: &VolumeSpec,
    found: &[VolumePath],
    refuse: impl Fn(ResizeFailure) -> Error,
) -> Result<Vec<PathSize>> {
    let mut paths: Vec<PathSize> = Vec::with_capacity(found.len());
    for p in found {
        let disk = p.disk.as_ref().map(|d| d.name.clone());
        let up = p.state == Some(ScsiState::Running);
        match (disk, up) {
            (Some(disk), true) => {
                let before = sysblock::size_of(root, &disk)?;
                paths.push(PathSize {
                    hctl: p.hctl,
                    device: format!("{} ({disk})", p.hctl),
                    disk,
                    before,
                    after: before,
                });
            }
            (disk, _) => {
                return Err(refuse(ResizeFailure::PathDown {
                    path: p.to_string(),
                    state: match (disk, &p.state) {
                        (None, _) => "without a disk".to_owned(),
                        (Some(_), Some(s)) => s.to_string(),
                        (Some(_), None) => "in an unknown state".to_owned(),
                    },
                }));
            }
        }
    }
    if paths.is_empty() {
        return Err(Error::NotFound {
            what: format!("no path of {spec} is on the node"),
        });
    }
    Ok(paths)
}

/// The size every path reports after the rescans, which must be one
/// ([`ResizeFailure::SizesDiffer`]) and not below the map's, or the paths' before
/// ([`ResizeFailure::Shrunk`], naming `volume`).
fn agreed_size(
    paths: &[PathSize],
    map_before: Option<u64>,
    volume: &str,
) -> std::result::Result<u64, ResizeFailure> {
    let size = paths[0].after;
    if paths.iter().any(|p| p.after != size) {
        return Err(ResizeFailure::SizesDiffer {
            sizes: paths.iter().map(|p| (p.device.clone(), p.after)).collect(),
        });
    }
    let shrunk_from = map_before.unwrap_or(paths[0].before);
    if size < shrunk_from {
        return Err(ResizeFailure::Shrunk {
            device: volume.to_owned(),
            from: shrunk_from,
            to: size,
        });
    }
    Ok(size)
}

/// Rescans every path at once, then (with `expect`) waits until each reports `expect` or more,
/// rescanning a path that is still short every [`RESCAN_INTERVAL`]. Fills in `after`.
fn rescan_until(
    root: &Root,
    paths: &mut [PathSize],
    expect: Option<u64>,
    deadline: Instant,
) -> Result<()> {
    // Subscribed before the first write, so no `change` slips past.
    let mut monitor = Subscription::open().ok();
    let disks: Vec<String> = paths.iter().map(|p| p.disk.clone()).collect();
    let hctls: Vec<String> = paths.iter().map(|p| p.hctl.to_string()).collect();
    let short = |root: &Root| -> Vec<usize> {
        (0..disks.len())
            .filter(|&i| {
                expect.is_some_and(|e| sysblock::size_bytes(root, &disks[i]).is_none_or(|s| s < e))
            })
            .collect()
    };
    let all: Vec<usize> = (0..paths.len()).collect();
    rescan_all(root, paths, &all, deadline)?;
    let mut last_rescan = Instant::now();
    let what = || {
        let now: Vec<String> = paths
            .iter()
            .map(|p| match sysblock::size_bytes(root, &p.disk) {
                Some(s) => format!("{} {s} bytes", p.device),
                None => format!("{} gone", p.device),
            })
            .collect();
        format!(
            "at least {} bytes on every path (they report: {}); has the volume grown on the \
             array?",
            expect.unwrap_or_default(),
            now.join(", ")
        )
    };
    // A disk's `change` (`RESIZE=1` from `set_capacity_and_notify`), or a path's
    // `SDEV_UA=CAPACITY_DATA_HAS_CHANGED`, the target's unit attention.
    let relevant = |ev: &Uevent| {
        ev.action == Action::Change
            && (ev
                .devname
                .as_deref()
                .is_some_and(|n| disks.iter().any(|d| d == n))
                || (ev.get("SDEV_UA") == Some("CAPACITY_DATA_HAS_CHANGED")
                    && hctls.iter().any(|h| ev.devpath.ends_with(h.as_str()))))
    };
    wait::until(monitor.as_mut(), deadline, &what, &relevant, || {
        let lagging = short(root);
        if lagging.is_empty() {
            return Ok(Some(()));
        }
        if last_rescan.elapsed() >= RESCAN_INTERVAL {
            // Errors of a repeated rescan end the wait, naming the path; but one begun
            // with moments left and cut off by the deadline is the wait for the size
            // ending (each path's size, below), not a device that failed to answer.
            match rescan_all(root, paths, &lagging, deadline) {
                Err(e) if e.kind() == ErrorKind::Timeout && Instant::now() >= deadline => {
                    return Ok(None);
                }
                r => r?,
            }
            last_rescan = Instant::now();
        }
        Ok(None)
    })?;
    for p in paths.iter_mut() {
        p.after = sysblock::size_of(root, &p.disk)?;
    }
    Ok(())
}

/// [`Error::Busy`] when a path's LUN answers INQUIRY as another one than the kernel knows
/// (the array re-mapped it under the volume): a rescan would make the kernel take it for
/// the new LUN under the volume's users, and grow the volume from it. A LUN number belongs
/// to one identity on the node at a time, as an attach holds (`scsi::trigger_start`).
fn refuse_remapped(
    root: &Root,
    found: &[VolumePath],
    volume: &str,
    deadline: Instant,
) -> Result<()> {
    let asked = helper::fan_out("lunkit-inquiry", found, |p| match &p.disk {
        Some(disk) => {
            let dir = crate::scsi::sysfs::device_dir(root, p.hctl);
            match crate::sysfs::Confine::new(root).dir(&dir) {
                Some(dir) => crate::scsi::remapped(&dir, disk, deadline),
                None => Ok(None),
            }
        }
        None => Ok(None),
    });
    for (p, r) in found.iter().zip(asked) {
        if let Some((known, now)) = r? {
            return Err(Error::Busy {
                device: format!("SCSI device {}", p.hctl),
                reason: format!(
                    "it answers INQUIRY as {now}, but the kernel knows it as {known}, a path \
                     of {volume}: the array re-mapped the LUN under the volume, which is \
                     neither rescanned nor resized; restore the array's mapping, or detach \
                     the volume"
                ),
                usage: None,
            });
        }
    }
    Ok(())
}

/// Writes `rescan` on the paths `which` of `paths` at once, one worker each; the first
/// failure is returned as a `rescan` step naming its path.
fn rescan_all(root: &Root, paths: &[PathSize], which: &[usize], deadline: Instant) -> Result<()> {
    let results = helper::fan_out("lunkit-rescan", which, |&i| {
        crate::scsi::rescan(root, paths[i].hctl, deadline)
    });
    for (&i, r) in which.iter().zip(results) {
        r.map_err(|e| Error::Step {
            step: "rescan",
            target: paths[i].device.clone(),
            source: Box::new(e),
        })?;
    }
    Ok(())
}

//! Growing an attached volume online (CSI's NodeExpandVolume): every path learns the new
//! size, the paths must agree, then the multipath map grows to it. The caller grows its
//! filesystem afterwards (`resize2fs`, `xfs_growfs`); the library never does.
//!
//! 1. The volume is identified and locked as [`super::detach()`] does, under the same lock,
//!    so a resize and a detach of one volume never interleave.
//! 2. Every path must be `running` with a disk, before anything is written: a path that is
//!    down cannot learn the size, and the map must not outgrow a path it may fail back to
//!    ([`ResizeFailure::PathDown`]).
//! 3. `1` is written to every path's `rescan`, all at once, each write bounded by the
//!    deadline (a path's rescan waits out its commands' timeouts). `sd` re-reads the capacity
//!    before the write returns. With [`ResizeOptions::expect_size`] the wait goes on until
//!    every path reports at least that size: a path's `change` uevent, or its `scsi_device` event for
//!    the target's "capacity data has changed" unit attention, wakes it, and a path still
//!    short is rescanned again at most every [`RESCAN_INTERVAL`] (the array may grow the LUN
//!    a moment after it said it did).
//! 4. The paths must agree ([`ResizeFailure::SizesDiffer`]) and must not have shrunk below
//!    the map ([`ResizeFailure::Shrunk`]). Until here the map is untouched.
//! 5. The map grows ([`crate::multipath::grow`]): through multipathd when it runs, else by a
//!    table reload; its length is read back either way.
//!
//! An NVMe namespace ([`VolumeSpec::Nvme`]) goes its own way: its controllers are asked
//! what it is (Identify Namespace), they must agree, and, unless its device already has
//! that size, they are told to rescan and the resize waits for the device to have it
//! ([`crate::ops::nvme`]).
//!
//! A volume whose map and paths already have one size of at least
//! [`ResizeOptions::expect_size`] is left alone: nothing is written. Resizing again when the array did not grow rescans the paths and changes nothing.
//!
//! ```no_run
//! use lunkit::Root;
//! use lunkit::ops::{ResizeOptions, VolumeSpec, resize};
//!
//! let root = Root::default();
//! let spec = VolumeSpec::Device("/dev/mapper/mpatha".into());
//! let mut opts = ResizeOptions::new(&root);
//! opts.expect_size = Some(20 << 30);
//! let resized = resize(&root, &spec, &opts)?;
//! for p in &resized.paths {
//!     println!("{}: {} -> {} bytes", p.device, p.before, p.after);
//! }
//! if let Some(map) = &resized.map {
//!     println!("{}: {} -> {} bytes ({})", map.device, map.before, map.after, map.by.as_str());
//! }
//! // Now grow the filesystem on it: resize2fs /dev/mapper/mpatha.
//! # Ok::<(), lunkit::Error>(())
//! ```

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::error::{Error, ResizeFailure, Result};
use crate::id::{Hctl, Wwid};
use crate::multipath::{self, GrownBy};
use crate::root::Root;
use crate::sysfs::block as sysblock;
use crate::uevent::{Action, Monitor, Uevent};
use crate::wait;

use super::lock;
use super::volume::{VolumeSpec, identify, locate};

/// Default time a resize may take, rescans and the map included.
pub const DEFAULT_RESIZE_TIMEOUT: Duration = Duration::from_secs(60);

/// While waiting for [`ResizeOptions::expect_size`], a path still short of it is rescanned
/// again after this long: the target announces a new capacity only to an initiator that
/// sends it a command, so without a new rescan a path would never learn it.
pub const RESCAN_INTERVAL: Duration = Duration::from_secs(1);

/// How [`resize`] behaves. [`ResizeOptions::new`] locks in `<root>/run/lunkit/locks`, as
/// detach does.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ResizeOptions {
    /// How long the whole resize may take.
    pub timeout: Duration,
    /// The size in bytes the volume must reach at least (CSI's `required_bytes`): wait until
    /// every path reports that much, or fail at the deadline naming what each one reports.
    /// `None` takes what the paths report after one rescan.
    pub expect_size: Option<u64>,
    /// Grow the map through multipathd when it runs (the default); `false` always reloads
    /// the table directly (only for nodes whose maps multipathd does not manage).
    pub use_multipathd: bool,
    /// The directory of the per-volume lock files, shared with detach; `None` locks within
    /// this process only.
    pub lock_dir: Option<PathBuf>,
}

impl Default for ResizeOptions {
    fn default() -> Self {
        ResizeOptions {
            timeout: DEFAULT_RESIZE_TIMEOUT,
            expect_size: None,
            use_multipathd: true,
            lock_dir: None,
        }
    }
}

impl ResizeOptions {
    /// The defaults, locking in `<root>/run/lunkit/locks` like
    /// [`crate::ops::DetachOptions::new`].
    pub fn new(root: &Root) -> ResizeOptions {
        ResizeOptions {
            lock_dir: Some(root.run("lunkit/locks")),
            ..ResizeOptions::default()
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

/// What a resize of an NVMe namespace saw and did, in [`Resized::nvme`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvmeResize {
    /// The namespace's block devices.
    pub devices: Vec<NamespaceSize>,
    /// What each controller of the subsystem answered to Identify Namespace, in bytes: the
    /// size the devices were brought to.
    pub reported: Vec<(String, u64)>,
}

/// What [`resize`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resized {
    /// The volume's WWID, when it has one.
    pub wwid: Option<Wwid>,
    /// Every path, in address order (SCSI; empty for an NVMe namespace).
    pub paths: Vec<PathSize>,
    /// The multipath map, when the volume has one.
    pub map: Option<MapSize>,
    /// The namespace, for a volume named [`VolumeSpec::Nvme`].
    pub nvme: Option<NvmeResize>,
    /// Whether any path (or NVMe controller) was rescanned: not when the volume already had
    /// the expected size.
    pub rescanned: bool,
    /// How long the rescans took, the wait for [`ResizeOptions::expect_size`] included.
    pub rescan_elapsed: Duration,
    /// How long growing the map took (multipathd's `resize map` or the table reload).
    pub map_elapsed: Duration,
    /// How long the whole resize took.
    pub elapsed: Duration,
}

impl Resized {
    /// The volume's size now, in bytes: the map's, or the paths' without one, or the NVMe
    /// namespace device's.
    pub fn size(&self) -> u64 {
        if let Some(n) = &self.nvme {
            return n.devices.first().map_or(0, |d| d.after);
        }
        match &self.map {
            Some(m) => m.after,
            None => self.paths.first().map_or(0, |p| p.after),
        }
    }

    /// Whether any device changed size.
    pub fn changed(&self) -> bool {
        self.paths.iter().any(|p| p.before != p.after)
            || self.map.as_ref().is_some_and(|m| m.before != m.after)
            || self
                .nvme
                .as_ref()
                .is_some_and(|n| n.devices.iter().any(|d| d.before != d.after))
    }
}

/// Grows the volume `spec` to the size its storage now has, on every path and its map.
///
/// # Errors
///
/// - [`Error::NotFound`] when no path of the volume is on the node.
/// - [`Error::Resize`] for every refusal ([`ResizeFailure`]: a path down, paths that disagree,
///   a volume that shrank) and for a map that did not grow.
/// - [`Error::Timeout`] when [`ResizeOptions::expect_size`] was not reached by every path by
///   the deadline, naming what each one reports; the map is untouched then.
/// - [`Error::Step`] (`rescan`) naming the path whose rescan failed.
/// - [`Error::Busy`] when a multipath map holding the volume's paths is not its alone
///   ([`VolumeState::foreign_maps`](super::VolumeState::foreign_maps)); nothing is written.
pub fn resize(root: &Root, spec: &VolumeSpec, opts: &ResizeOptions) -> Result<Resized> {
    if let VolumeSpec::Nvme { nqn, namespace } = spec {
        return super::nvme::resize(root, spec, nqn, namespace, opts);
    }
    let start = Instant::now();
    let deadline = wait::deadline_from(start, opts.timeout);
    let id = identify(root, spec)?;
    let _lock = lock::lock(&id.key(), opts.lock_dir.as_deref(), deadline)?;
    let state = locate(root, &id)?;
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

    // Every path up and with a disk, before anything is written.
    let mut paths: Vec<PathSize> = Vec::with_capacity(state.paths.len());
    for p in &state.paths {
        let disk = p.disk.as_ref().map(|d| d.name.clone());
        let up = p.state.as_deref() == Some("running");
        match (disk, up) {
            (Some(disk), true) => {
                let before = size_of(root, &disk)?;
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
                        (Some(_), Some(s)) => s.clone(),
                        (Some(_), None) => "in an unknown state".to_owned(),
                    },
                }));
            }
        }
    }
    if paths.is_empty() {
        return Err(Error::NotFound {
            what: format!("paths of {spec}"),
        });
    }
    paths.sort_by_key(|p| p.hctl);
    let map_before = match &map {
        Some(m) => Some(size_of(root, &m.node.name)?),
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

    let size = paths[0].after;
    if paths.iter().any(|p| p.after != size) {
        return Err(refuse(ResizeFailure::SizesDiffer {
            sizes: paths.iter().map(|p| (p.device.clone(), p.after)).collect(),
        }));
    }
    let shrunk_from = map_before.unwrap_or(paths[0].before);
    if size < shrunk_from {
        return Err(refuse(ResizeFailure::Shrunk {
            device: volume.clone(),
            from: shrunk_from,
            to: size,
        }));
    }
    let map_start = Instant::now();
    let map = match (map, map_before) {
        (Some(m), Some(before)) => {
            // A map already of the paths' size needs no device-mapper call at all.
            let by = if size == before {
                GrownBy::Unchanged
            } else {
                multipath::grow(root, &m.name, size, opts.use_multipathd, deadline)?
            };
            Some(MapSize {
                after: size_of(root, &m.node.name)?,
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
        paths,
        map,
        nvme: None,
        rescanned: !already,
        rescan_elapsed,
        map_elapsed: map_start.elapsed(),
        elapsed: start.elapsed(),
    })
}

/// The size of block device `name` in bytes, from sysfs.
pub(super) fn size_of(root: &Root, name: &str) -> Result<u64> {
    sysblock::size_bytes(root, name).ok_or_else(|| Error::NotFound {
        what: format!("size of block device {name}"),
    })
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
    let mut monitor = Monitor::open().ok();
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
            // Errors of a repeated rescan end the wait, naming the path.
            rescan_all(root, paths, &lagging, deadline)?;
            last_rescan = Instant::now();
        }
        Ok(None)
    })?;
    for p in paths.iter_mut() {
        p.after = size_of(root, &p.disk)?;
    }
    Ok(())
}

/// Writes `rescan` on the paths `which` of `paths` at once, one worker each; the first
/// failure is returned as a `rescan` step naming its path.
fn rescan_all(root: &Root, paths: &[PathSize], which: &[usize], deadline: Instant) -> Result<()> {
    let results: Vec<(usize, Result<()>)> = std::thread::scope(|s| {
        let workers: Vec<_> = which
            .iter()
            .map(|&i| {
                let hctl = paths[i].hctl;
                (
                    i,
                    std::thread::Builder::new()
                        .name("lunkit-rescan".into())
                        .spawn_scoped(s, move || crate::scsi::rescan(root, hctl, deadline)),
                )
            })
            .collect();
        workers
            .into_iter()
            .map(|(i, w)| {
                let r = match w {
                    Ok(h) => h.join().unwrap_or_else(|_| {
                        Err(Error::Internal {
                            what: "a rescan worker panicked".into(),
                        })
                    }),
                    Err(e) => Err(Error::io("(rescan worker thread)", e)),
                };
                (i, r)
            })
            .collect()
    });
    for (i, r) in results {
        r.map_err(|e| Error::Step {
            step: "rescan",
            target: paths[i].device.clone(),
            source: Box::new(e),
        })?;
    }
    Ok(())
}

//! Growing a multipath map to the size its paths report: `multipathd resize map NAME` when
//! multipathd runs, a table reload with the new length when it does not.
//!
//! Two traps decide the shape of this file:
//!
//! - multipathd takes the new size from the first path of the map's first path group only
//!   (`cli_resize`). When that path was not rescanned it logs "map is still the same size"
//!   and answers `ok` (dell/csm#2002). So its answer is never the result: the map's length is
//!   read back from device-mapper afterwards, and a map that did not grow is an error.
//! - While multipathd runs it owns the map, and reloads it on its own (a path added, a
//!   failback). A reload behind its back is not done then; if multipathd fails, the caller
//!   hears why and the map stays as it was.
//!
//! Without multipathd the table with the new length is loaded into the inactive slot first,
//! while the map serves I/O; then the map is suspended without flushing (I/O queued for lack
//! of a path stays queued) and without freezing its filesystem, and resumed, which swaps the
//! new table in. Every one of those ioctls can wait in the kernel, so each runs under the
//! deadline on a helper thread; a step that fails or is late withdraws the new table, so the
//! map is never left suspended and keeps its old table (see `reload_with_length`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use crate::dm::{Control, DevId, Suspend, Target};
use crate::error::{Error, ResizeFailure, Result};
use crate::helper::{self, Subject};
use crate::root::Root;

use super::find::read_map;
use super::multipathd::Multipathd;

/// How [`grow`] grew a map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrownBy {
    /// It already had the size: nothing was done.
    Unchanged,
    /// multipathd's `resize map` (checked against device-mapper afterwards).
    Multipathd,
    /// A table reload with the new length (load, suspend noflush, resume).
    TableReload,
}

impl GrownBy {
    /// `unchanged`, `multipathd` or `table-reload`: the CLI's and JSON's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            GrownBy::Unchanged => "unchanged",
            GrownBy::Multipathd => "multipathd",
            GrownBy::TableReload => "table-reload",
        }
    }
}

/// Grows the multipath map `name` to `size` bytes, the size its paths now report.
///
/// With `use_multipathd` and multipathd answering on its socket, asks it (`resize map
/// NAME`); otherwise reloads the table itself. Either way the map's length is read back from
/// device-mapper, and only a map of the new length is success.
///
/// # Errors
///
/// - [`Error::Invalid`] when `size` is not a whole number of 512-byte sectors, is smaller
///   than the map (a map is never shrunk: what lies beyond the new end would be cut off
///   under its users), or `name` is not a multipath map with one target.
/// - [`Error::NotFound`] when there is no such map.
/// - [`Error::Resize`] when multipathd answered anything but `ok`
///   ([`ResizeFailure::Multipathd`]), or the map's length is not `size` afterwards
///   ([`ResizeFailure::MapNotGrown`]); [`Error::Ioctl`] when a dm ioctl failed, and
///   [`Error::Timeout`] when one had not returned by `deadline` (either way the map keeps,
///   or gets back, its old table, resumed).
pub fn grow(
    root: &Root,
    name: &str,
    size: u64,
    use_multipathd: bool,
    deadline: Instant,
) -> Result<GrownBy> {
    if size % 512 != 0 {
        return Err(Error::invalid(
            "map size",
            &size.to_string(),
            "not a whole number of 512-byte sectors",
        ));
    }
    let sectors = size / 512;
    // Shared with the helper threads that run the reload's blocking calls.
    let ctl = Arc::new(Control::open(root)?);
    let by_name = DevId::Name(name);
    let map = read_map(&ctl, &by_name)?.ok_or_else(|| Error::NotFound {
        what: format!("multipath map {name} not found"),
    })?;
    let label = map.label();
    if map.sectors == sectors {
        return Ok(GrownBy::Unchanged);
    }
    if map.sectors > sectors {
        return Err(Error::Invalid {
            kind: "map size",
            input: format!("{label}: {size} bytes, the map has {}", map.sectors * 512),
            reason: "smaller than the map: a map is never shrunk",
        });
    }
    let failed = |reason| Error::Resize {
        volume: label.clone(),
        reason,
    };
    let by = match use_multipathd
        .then(|| Multipathd::connect(root, deadline))
        .transpose()?
        .flatten()
    {
        Some(mut daemon) => {
            let command = format!("resize map {name}");
            let reply = daemon.command(&command, deadline)?;
            if reply.trim_end() != "ok" {
                return Err(failed(ResizeFailure::Multipathd {
                    reply: reply.trim_end().to_owned(),
                }));
            }
            GrownBy::Multipathd
        }
        None => {
            reload_with_length(&ctl, &map, sectors, deadline)?;
            GrownBy::TableReload
        }
    };
    let now = read_map(&ctl, &by_name)?.map_or(0, |m| m.sectors);
    if now != sectors {
        return Err(failed(ResizeFailure::MapNotGrown {
            map: label.clone(),
            size: now * 512,
            wanted: size,
            by_multipathd: by == GrownBy::Multipathd,
        }));
    }
    Ok(by)
}

/// Reloads the single `multipath` target of `map` with `sectors` as its length, in the
/// order that never leaves the map suspended and never freezes a filesystem on it:
///
/// 1. `DM_TABLE_LOAD` of the grown table into the inactive slot, while the map goes on
///    serving I/O. The load opens every path (an open waits while a partition scan holds
///    the disk) and sets the paths up, so it is bounded by `deadline`.
/// 2. `DM_DEV_SUSPEND` without flushing and without `lock_fs` (`DM_NOFLUSH_FLAG |
///    DM_SKIP_LOCKFS_FLAG`), then the resume that swaps the new table in, on one helper
///    thread. A freeze would sync the filesystem, which waits for its writes, forever on a
///    map queueing without a path; a longer table needs no frozen image. The suspend still
///    waits for I/O a path has in flight, for as long as that path takes.
///
/// Whatever fails or outlasts `deadline`, the grown table is withdrawn (`DM_TABLE_CLEAR`),
/// by the caller and, for a call that returns late, by its helper thread before it resumes:
/// the map goes on (or comes back, once a late suspend returns) with its old table. Only a
/// suspend that returns as the deadline passes can still swap the new one in.
fn reload_with_length(
    ctl: &Arc<Control>,
    map: &super::Map,
    sectors: u64,
    deadline: Instant,
) -> Result<()> {
    let name = map.name().to_owned();
    let table = ctl.table(&DevId::Name(&name))?;
    let target = match table.as_slice() {
        [t] if t.target_type == "multipath" && t.start == 0 => t,
        _ => {
            return Err(Error::invalid(
                "multipath map",
                &name,
                "its table is not one multipath target from sector 0",
            ));
        }
    };
    let grown = Target {
        length: sectors,
        ..target.clone()
    };
    let label = map.label();
    let steps = Reload {
        ctl: Arc::clone(ctl),
        name,
        given_up: Arc::new(AtomicBool::new(false)),
    };
    // Both steps are one subject: a later grow of this map waits for a late suspend before
    // it loads, so that the late call's withdrawal never takes the later call's table.
    let load = {
        let steps = steps.clone();
        helper::bounded(
            Subject::device("dm-reload", map.info.dev),
            deadline,
            &|| format!("DM_TABLE_LOAD of {label} (opening and setting up its paths)"),
            move || steps.load(&grown),
        )
    };
    let swap = load.and_then(|()| {
        let steps = steps.clone();
        helper::bounded(
            Subject::device("dm-reload", map.info.dev),
            deadline,
            &|| {
                format!(
                    "suspend of {label} to swap in its grown table (I/O in flight on a path \
                     has not completed); the grown table is withdrawn, and the map resumes \
                     with its old one"
                )
            },
            move || steps.swap(),
        )
    });
    if swap.is_err() {
        steps.give_up();
    }
    swap
}

/// The blocking steps of [`reload_with_length`], each run by a helper thread, and the flag
/// that tells one returning after its caller gave up to withdraw the grown table.
#[derive(Clone)]
struct Reload {
    ctl: Arc<Control>,
    name: String,
    given_up: Arc<AtomicBool>,
}

impl Reload {
    fn id(&self) -> DevId<'_> {
        DevId::Name(&self.name)
    }

    /// Loads `grown` into the inactive slot; withdrawn again if the caller gave up meanwhile.
    fn load(&self, grown: &Target) -> Result<()> {
        let loaded = self.ctl.load(&self.id(), std::slice::from_ref(grown));
        self.withdraw_if_given_up();
        loaded.map(drop)
    }

    /// Suspends the map (no flush, no freeze) and resumes it, which swaps the loaded table
    /// in. A resume that fails to swap leaves the map suspended with the old table live, and
    /// the inactive slot emptied by the kernel: a second resume brings the old one back.
    fn swap(&self) -> Result<()> {
        let how = Suspend {
            noflush: true,
            skip_lockfs: true,
        };
        if let Err(e) = self.ctl.suspend(&self.id(), how) {
            self.withdraw();
            return Err(e);
        }
        self.withdraw_if_given_up();
        match self.ctl.resume(&self.id()) {
            Ok(_) => Ok(()),
            Err(e) => {
                let _ = self.ctl.resume(&self.id());
                Err(e)
            }
        }
    }

    /// The caller stops waiting: the grown table goes, now and when a late call returns.
    fn give_up(&self) {
        self.given_up.store(true, Ordering::SeqCst);
        self.withdraw();
    }

    fn withdraw_if_given_up(&self) {
        if self.given_up.load(Ordering::SeqCst) {
            self.withdraw();
        }
    }

    fn withdraw(&self) {
        // Nothing loaded is fine; a failure leaves a table that the next load replaces.
        let _ = self.ctl.clear(&self.id());
    }
}

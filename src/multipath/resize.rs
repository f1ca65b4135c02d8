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
//! Without multipathd the sequence is multipathd's own: suspend without flushing (I/O queued
//! for lack of a path stays queued), load the table with the new length into the inactive
//! slot, resume (which swaps it in). A failed load is followed by a resume of the old table,
//! so the map is never left suspended.

use std::time::Instant;

use crate::dm::{Control, DevId, Suspend, Target};
use crate::error::{Error, ResizeFailure, Result};
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
    /// A table reload with the new length (suspend noflush, load, resume).
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
///   ([`ResizeFailure::MapNotGrown`]); [`Error::Ioctl`] when a dm ioctl failed (after a
///   failed load the old table is resumed).
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
    let ctl = Control::open(root)?;
    let by_name = DevId::Name(name);
    let map = read_map(&ctl, &by_name)?.ok_or_else(|| Error::NotFound {
        what: format!("multipath map {name}"),
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
            reload_with_length(&ctl, name, sectors)?;
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

/// Reloads the single `multipath` target of map `name` with `sectors` as its length:
/// suspend without flush, load, resume; on a failed load, resume the old table.
fn reload_with_length(ctl: &Control, name: &str, sectors: u64) -> Result<()> {
    let by_name = DevId::Name(name);
    let table = ctl.table(&by_name)?;
    let target = match table.as_slice() {
        [t] if t.target_type == "multipath" && t.start == 0 => t,
        _ => {
            return Err(Error::invalid(
                "multipath map",
                name,
                "its table is not one multipath target from sector 0",
            ));
        }
    };
    let grown = Target {
        length: sectors,
        ..target.clone()
    };
    ctl.suspend(
        &by_name,
        Suspend {
            noflush: true,
            skip_lockfs: false,
        },
    )?;
    if let Err(e) = ctl.load(&by_name, std::slice::from_ref(&grown)) {
        // The inactive slot stays empty, so this resumes the old table.
        let _ = ctl.resume(&by_name);
        return Err(e);
    }
    ctl.resume(&by_name).map(drop)
}

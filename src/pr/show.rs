//! Every path of a device at once: [`show`] reads keys and the reservation through each,
//! [`unregistered_paths`] finds the paths whose I_T nexus does not carry a key.

use std::time::Instant;

use super::{Key, ReadKeys, ReadReservation, Request};
use crate::block::{self, BlockNode};
use crate::error::{Error, ErrorKind, Result};
use crate::root::Root;

/// What one path of a device answered.
#[derive(Debug)]
pub struct PathState {
    /// The path (`sdc`), or the device itself when it has no paths of its own.
    pub path: BlockNode,
    /// READ KEYS through it.
    pub keys: Result<ReadKeys>,
    /// READ RESERVATION through it.
    pub reservation: Result<ReadReservation>,
}

/// The paths of `node`: a device-mapper map's (its `slaves/` in sysfs, each a SCSI disk), or
/// `node` itself.
fn paths(root: &Root, node: &BlockNode) -> Result<Vec<BlockNode>> {
    if !block::sysfs::is_dm(root, &node.name) {
        return Ok(vec![node.clone()]);
    }
    let mut out = Vec::new();
    for name in block::sysfs::slaves(root, &node.name)? {
        // A path gone between the listing and now is no path.
        if let Some(p) = block::by_name(root, &name)? {
            out.push(p);
        }
    }
    if out.is_empty() {
        return Err(Error::NotFound {
            what: format!("{node} has no paths (its map lists no devices under slaves/)"),
        });
    }
    Ok(out)
}

/// Reads the keys and the reservation through every path of `node` (a multipath map's
/// paths, or a lone disk), one path after the other, each bounded by `deadline`. A path that
/// fails (down, not SCSI) has its error in its [`PathState`]; the others are still read.
///
/// The keys are the LUN's, whichever path reads them: READ KEYS lists every registration
/// (one per I_T nexus), not only the path's own. [`unregistered_paths`] asks each path.
///
/// # Errors
///
/// [`Error::NotFound`] for a map with no paths; [`Error::Io`] when sysfs cannot be read.
pub fn show(root: &Root, node: &BlockNode, deadline: Instant) -> Result<Vec<PathState>> {
    Ok(paths(root, node)?
        .into_iter()
        .map(|path| {
            let keys = super::read_keys(&path, deadline);
            let reservation = super::read_reservation(&path, deadline);
            PathState {
                path,
                keys,
                reservation,
            }
        })
        .collect())
}

/// A path whose I_T nexus could not be shown to carry the key.
#[derive(Debug)]
pub struct Unregistered {
    /// The path (`sdd`).
    pub path: BlockNode,
    /// Why: [`Error::ReservationConflict`] when the path is not registered with the key;
    /// another error when the path could not be asked (down, timed out).
    pub why: Error,
}

/// The paths of `node` (a map's, or a lone disk) whose I_T nexus is not registered with
/// `key`: a path that came after the registration (a new session, a path back from a
/// failure) is not registered by itself, and its I/O gets RESERVATION CONFLICT.
///
/// READ KEYS cannot tell: it lists the LUN's registrations through any path. So each path
/// is asked directly with REGISTER from `key` to `key`, which an initiator registered with
/// `key` is allowed and any other is refused with RESERVATION CONFLICT (SPC-4 5.14.7). It
/// changes no registration and no reservation; the LUN's PRGENERATION goes up by one per
/// registered path. An empty list: every path carries `key`.
///
/// # Errors
///
/// As [`show`]; [`Error::Invalid`] for a key of 0.
pub fn unregistered_paths(
    root: &Root,
    node: &BlockNode,
    key: Key,
    deadline: Instant,
) -> Result<Vec<Unregistered>> {
    key.nonzero("key")?;
    let probe = Request::Register {
        old: Some(key),
        new: key,
        ignore_existing: false,
    };
    let mut out = Vec::new();
    for path in paths(root, node)? {
        if let Err(why) = super::request(&path, probe, deadline) {
            if why.kind() == ErrorKind::Invalid {
                return Err(why);
            }
            out.push(Unregistered { path, why });
        }
    }
    Ok(out)
}

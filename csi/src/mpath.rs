//! Multipath under whatever policy the node's multipathd has.
//!
//! multipathd builds a map for a new WWID only when its `find_multipaths` says so: `no` and
//! `greedy` map every path; `strict` (Debian's default with no multipath.conf), `yes`/`on`,
//! and `smart` with one path map only WWIDs already in its `wwids` file; a blacklisted WWID
//! never. Waiting for a map multipathd will not build wastes the whole stage deadline.
//!
//! So stage, when multipathd runs, does what `multipath -a` and an administrator's
//! `multipathd add map` do, and asks again until the map holds every path: it makes sure
//! multipathd knows every path (`add path`), records the WWID in multipathd's `wwids` file
//! (so that a restart or reconfigure keeps the map), and asks multipathd for the map of
//! exactly that WWID (`add map WWID`: multipathd builds a map for it whatever
//! `find_multipaths` says, since the administrator named it). multipathd may not have the
//! paths ready yet (it waits for udev to finish with them), so the requests are repeated
//! while the map is awaited (after [`ASK_EVERY`], then less and less often), within the
//! stage's deadline. A path
//! multipathd answers `blacklisted` for is the node's policy: when every path is, no map
//! will ever come, and the volume is handed out on its path device at once, the stage
//! record saying so.

use std::time::{Duration, Instant};

use lunkit::block::BlockNode;
use lunkit::multipath::{Answer, Multipathd};
use lunkit::{Root, Wwid};

use crate::error::{Error, Result};

/// How long after the first request multipathd is asked again for the map; each later wait
/// is twice the one before, up to [`ASK_AT_MOST_EVERY`], so that many volumes staged at once
/// do not keep multipathd busy with requests while it works through their uevents.
pub const ASK_EVERY: Duration = Duration::from_secs(2);

/// The longest wait between two requests.
pub const ASK_AT_MOST_EVERY: Duration = Duration::from_secs(16);

/// The volume's map holding every one of `disks` (kernel names), once multipathd (`md`) has
/// built it at the plugin's request; `None` when multipathd blacklists every path (no map
/// will come). Waits, asking again after [`ASK_EVERY`], then less and less often, until
/// `deadline`.
pub fn map_of(
    root: &Root,
    md: &mut Multipathd,
    wwid: &Wwid,
    disks: &[String],
    deadline: Instant,
) -> Result<Option<BlockNode>> {
    let key = wwid.to_multipath();
    // Under multipath-tools' own lock on the file, so that a line never lands in the middle
    // of multipathd rewriting it.
    lunkit::multipath::remember_wwid(root, wwid, deadline)
        .map_err(|e| Error::lunkit(format!("add {key} to multipathd's wwids file"), e))?;
    let mut next_ask = Instant::now();
    let mut ask_every = ASK_EVERY;
    let mut pause = Duration::from_millis(5);
    loop {
        if let Some(map) = holding(root, wwid, disks)? {
            return Ok(Some(map));
        }
        if Instant::now() >= next_ask {
            if ask(md, wwid, disks, deadline) == Asked::AllBlacklisted {
                return Ok(None);
            }
            next_ask = Instant::now() + ask_every;
            ask_every = (ask_every * 2).min(ASK_AT_MOST_EVERY);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::DeadlineExceeded(format!(
                "multipathd built no map of {key} with paths {} in time",
                disks.join(", ")
            )));
        }
        std::thread::sleep(pause.min(left));
        pause = (pause * 2).min(Duration::from_millis(200));
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Asked {
    AllBlacklisted,
    Asked,
}

/// `add path` for every disk, then `add map WWID`. A command multipathd does not answer is
/// asked again next time (the map may come anyway).
fn ask(md: &mut Multipathd, wwid: &Wwid, disks: &[String], deadline: Instant) -> Asked {
    let blacklisted = disks
        .iter()
        .filter(|d| matches!(md.add_path(d, deadline), Ok(Answer::Blacklisted)))
        .count();
    if !disks.is_empty() && blacklisted == disks.len() {
        return Asked::AllBlacklisted;
    }
    let _ = md.add_map(wwid, deadline);
    Asked::Asked
}

/// A multipath map of `wwid` that holds every one of `disks`.
fn holding(root: &Root, wwid: &Wwid, disks: &[String]) -> Result<Option<BlockNode>> {
    let id = lunkit::ops::volume::Identity {
        wwid: Some(wwid.clone()),
        addresses: Vec::new(),
    };
    let maps = lunkit::ops::volume::locate(root, &id)
        .map_err(|e| Error::lunkit(format!("the maps of {}", wwid.to_multipath()), e))?
        .maps;
    Ok(maps.into_iter().map(|m| m.node).find(|node| {
        let slaves = root.sys(format!("class/block/{}/slaves", node.name));
        disks.iter().all(|d| slaves.join(d).exists())
    }))
}

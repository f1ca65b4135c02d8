//! Multipath under whatever policy the node's multipathd has.
//!
//! multipathd builds a map for a new WWID only when its `find_multipaths` says so: `no` and
//! `greedy` map every path; `strict` (Debian's default with no multipath.conf), `yes`/`on`,
//! and `smart` with one path map only WWIDs already in its `wwids` file; a blacklisted WWID
//! never. Waiting for a map multipathd will not build wastes the whole stage deadline.
//!
//! So stage, when multipathd runs, does what `multipath -a` and an administrator's
//! `multipathd add map` do: it makes sure multipathd knows every path (`add path`), records
//! the WWID in multipathd's `wwids` file (so that a restart or reconfigure keeps the map),
//! and asks multipathd for the map of exactly that WWID (`add map WWID`: multipathd builds a
//! map named by its WWID whatever `find_multipaths` says, since the administrator named it).
//! multipathd answers when the map is made, so whether it exists is known at once: if it
//! does not (every path blacklisted, or multipathd refused), the volume is handed out on its
//! path device, and the stage record says so; the deadline is never waited out.

use std::io::Write;
use std::path::Path;
use std::time::Instant;

use lunkit::multipath::Multipathd;
use lunkit::{Root, Wwid};

use crate::error::{Error, Result};

/// What multipathd did with the volume's paths.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// A map of the WWID exists: wait for it to hold every path.
    Map,
    /// multipathd made no map (every path blacklisted, or it refused): use the path device.
    NoMap(String),
}

/// Has multipathd (`md`) take the WWID `wwid` of the path devices `disks` (kernel names)
/// and build its map; says whether a map of it exists afterwards.
pub fn take_wwid(
    root: &Root,
    md: &mut Multipathd,
    wwid: &Wwid,
    disks: &[String],
    deadline: Instant,
) -> Result<Decision> {
    let key = wwid.to_multipath();
    let said =
        |cmd: &str, e: lunkit::Error| Error::lunkit(format!("multipathd's answer to {cmd:?}"), e);
    let mut blacklisted = Vec::new();
    for d in disks {
        let cmd = format!("add path {d}");
        let reply = md.command(&cmd, deadline).map_err(|e| said(&cmd, e))?;
        if reply.trim() == "blacklisted" {
            blacklisted.push(d.as_str());
        }
    }
    if !disks.is_empty() && blacklisted.len() == disks.len() {
        return Ok(Decision::NoMap(format!(
            "multipathd blacklists {}",
            blacklisted.join(", ")
        )));
    }
    remember_wwid(&root.etc("multipath/wwids"), &key)?;
    let cmd = format!("add map {key}");
    let reply = md.command(&cmd, deadline).map_err(|e| said(&cmd, e))?;
    if map_exists(root, wwid)? {
        Ok(Decision::Map)
    } else {
        Ok(Decision::NoMap(format!(
            "multipathd made no map of {key} ({cmd:?} answered {:?})",
            reply.trim()
        )))
    }
}

fn map_exists(root: &Root, wwid: &Wwid) -> Result<bool> {
    let id = lunkit::ops::volume::Identity {
        wwid: Some(wwid.clone()),
        addresses: Vec::new(),
    };
    let state = lunkit::ops::volume::locate(root, &id)
        .map_err(|e| Error::lunkit(format!("the maps of {}", wwid.to_multipath()), e))?;
    Ok(!state.maps.is_empty())
}

/// Adds `/WWID/` to multipathd's `wwids` file (`file`), as `multipath -a` does, unless it is
/// there; the file (and its directory) are made if missing.
pub fn remember_wwid(file: &Path, wwid: &str) -> Result<()> {
    let fail = |e: std::io::Error| {
        Error::Internal(format!(
            "add {wwid} to multipathd's {}: {e}",
            file.display()
        ))
    };
    let line = format!("/{wwid}/");
    match std::fs::read_to_string(file) {
        Ok(text) if text.lines().any(|l| l.trim() == line) => return Ok(()),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(fail(e)),
    }
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir).map_err(fail)?;
    }
    let new = !file.exists();
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(file)
        .map_err(fail)?;
    if new {
        // The header multipath writes, so that its tools take the file as theirs.
        f.write_all(
            b"# Multipath wwids, Version : 1.0\n\
              # NOTE: This file is automatically maintained by multipath and multipathd.\n\
              # You should not need to edit this file in normal circumstances.\n\
              #\n# Valid WWIDs:\n",
        )
        .map_err(fail)?;
    }
    f.write_all(format!("{line}\n").as_bytes()).map_err(fail)?;
    f.sync_all().map_err(fail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wwid_is_added_once_to_the_wwids_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("etc/multipath/wwids");
        remember_wwid(&file, "36001405aaaa").unwrap();
        remember_wwid(&file, "36001405aaaa").unwrap();
        remember_wwid(&file, "36001405bbbb").unwrap();
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(
            text.starts_with("# Multipath wwids, Version : 1.0\n"),
            "{text}"
        );
        let wwids: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(wwids, ["/36001405aaaa/", "/36001405bbbb/"]);
    }
}

//! Which WWID a target and LUN named, remembered from one call to the next.
//!
//! A volume named by its address (an iSCSI target and LUN, an FC target port and LUN) is
//! identified through the devices at that address. When every path is gone but the
//! multipath map is left (a session logged out, paths deleted behind lunkit's back), nothing
//! at the address tells the WWID any more, and the map would be missed: "nothing left" while
//! a map, maybe with queued writes, stays on the node. So [`crate::ops::attach()`] and
//! [`crate::ops::detach()`] remember the WWID they found for the name, one small file per name
//! in `<dir>/names/` beside the lock files, and a detach that finds no device at the address
//! recalls it.
//!
//! A record is a hint, never proof: the detach uses it only for a volume of which no path is
//! left anywhere (see `ops::detach`), since the LUN number may have been given to another
//! volume since.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::spec::{NamespaceSelector, VolumeSpec};
use crate::error::{Error, Result};
use crate::id::{Nqn, Wwid};

/// The record files of `spec` below `dir`; none for a spec that is not an address.
///
/// An FC volume named through several target ports gets a record per port, so that a later
/// call naming it through any of them (one controller's ports, say) recalls it.
fn records(dir: &Path, spec: &VolumeSpec) -> Vec<PathBuf> {
    spelt(spec)
        .into_iter()
        .map(|n| dir.join("names").join(n))
        .collect()
}

/// The file names of `spec`'s records (and, the first, of its attach mark): the one place
/// they are spelt.
fn spelt(spec: &VolumeSpec) -> Vec<String> {
    match spec {
        VolumeSpec::Iscsi { target, lun } => {
            vec![format!("iscsi-{}-lun-{lun}", encode(target.as_str()))]
        }
        VolumeSpec::Fc { wwpns, lun } => {
            wwpns.iter().map(|w| format!("fc-{w}-lun-{lun}")).collect()
        }
        VolumeSpec::Nvme { nqn, namespace } => {
            let nqn = encode(nqn.as_str());
            vec![match namespace {
                NamespaceSelector::Id(nsid) => format!("nvme-{nqn}-ns-{nsid}"),
                NamespaceSelector::Nguid(g) => format!("nvme-{nqn}-nguid-{g}"),
                NamespaceSelector::Eui64(e) => format!("nvme-{nqn}-eui64-{e}"),
                NamespaceSelector::Uuid(u) => format!("nvme-{nqn}-uuid-{u}"),
            }]
        }
        VolumeSpec::Device(_) | VolumeSpec::Wwid(_) => Vec::new(),
    }
}

/// `s` as one file name: letters, digits, `.`, `:` and `-` as they are, every other byte as
/// `%XX`. An IQN is checked before it gets here, but a file name must never carry a `/`.
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'.' | b':' | b'-') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Remembers that `spec` named the volume `wwid`. The file is written whole and renamed into
/// place, so that a reader never sees half of it.
pub(crate) fn remember(dir: &Path, spec: &VolumeSpec, wwid: &Wwid) -> Result<()> {
    let paths = records(dir, spec);
    if paths.is_empty() {
        return Ok(());
    }
    let names = dir.join("names");
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&names)
        .map_err(|e| Error::io(&names, e))?;
    paths.iter().try_for_each(|p| write_record(p, wwid, false))
}

/// After a detach of `spec` that took volume `wwid` off the node: its records that hold
/// `wwid` say so (a second line, `detached`). They are kept, not removed: a detach of the
/// same address again (a retry) recalls the WWID, finds nothing of it and is done, where
/// without a record any path-less map on the node would make it refuse (see
/// `ops::scsi::detach`). [`recorded`] leaves detached records out: history, not leftovers.
/// The caller holds the volume's lock.
pub(crate) fn retire(dir: &Path, spec: &VolumeSpec, wwid: &Wwid) -> Result<()> {
    for path in records(dir, spec) {
        if read_record(&path).as_ref() == Some(wwid) {
            write_record(&path, wwid, true)?;
        }
    }
    Ok(())
}

/// The second line of a record a detach retired ([`retire`]).
const DETACHED: &str = "detached";

/// Writes one record through a temporary file of its own: the record's whole name with a
/// suffix unique to this write (process id and a counter), created new. A name made with
/// `Path::with_extension` would cut the record name at its last `.`, and an IQN has dots:
/// every LUN of one target would share one temporary file, and two records written at once
/// could each rename the other's WWID into place.
fn write_record(path: &Path, wwid: &Wwid, detached: bool) -> Result<()> {
    static WRITES: AtomicU64 = AtomicU64::new(0);
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(
        ".tmp-{}-{}",
        std::process::id(),
        WRITES.fetch_add(1, Ordering::Relaxed)
    ));
    let tmp = PathBuf::from(tmp);
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)?;
        writeln!(f, "{}", wwid.to_multipath())?;
        if detached {
            writeln!(f, "{DETACHED}")?;
        }
        std::fs::rename(&tmp, path)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        Error::io(path, e)
    })
}

/// The marker of an attached NVMe namespace below `dir`: `attached/<record name>`.
fn marker(dir: &Path, spec: &VolumeSpec) -> Option<PathBuf> {
    let name = records(dir, spec).first()?.file_name()?.to_owned();
    Some(dir.join("attached").join(name))
}

/// Marks `spec` as attached through lunkit: an NVMe subsystem's controllers serve every
/// namespace of it at once, and a detach of one namespace keeps them while another one is
/// marked (or in use).
pub(crate) fn mark_attached(dir: &Path, spec: &VolumeSpec) -> Result<()> {
    let Some(path) = marker(dir, spec) else {
        return Ok(());
    };
    let parent = dir.join("attached");
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&parent)
        .map_err(|e| Error::io(&parent, e))?;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)
        .map(drop)
        .map_err(|e| Error::io(&path, e))
}

/// Takes the mark of [`mark_attached`] away (none is fine).
pub(crate) fn unmark_attached(dir: &Path, spec: &VolumeSpec) -> Result<()> {
    let Some(path) = marker(dir, spec) else {
        return Ok(());
    };
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(&path, e)),
    }
}

/// Whether `spec` is marked attached.
pub(crate) fn is_attached(dir: &Path, spec: &VolumeSpec) -> bool {
    marker(dir, spec).is_some_and(|p| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_file()))
}

/// The namespaces of subsystem `nqn` marked attached in lock directory `dir`, whether their
/// devices are on the node or not: every mark file in `<dir>/attached/` whose name ends in a
/// namespace id, NGUID, EUI-64 or UUID (`…-ns-<id>`, `…-nguid-<NGUID>`, `…-eui64-<EUI-64>`,
/// `…-uuid-<UUID>`) that, asked back through
/// `is_attached` for `nqn`, is marked. The NQN is never parsed out of a file name;
/// this module alone knows how it is spelt there.
pub(crate) fn marked(dir: &Path, nqn: &Nqn) -> Result<Vec<NamespaceSelector>> {
    let path = dir.join("attached");
    let entries = match std::fs::read_dir(&path) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(&path, e)),
    };
    let mut out = Vec::new();
    for entry in entries {
        let name = entry.map_err(|e| Error::io(&path, e))?.file_name();
        let Some(name) = name.to_str() else {
            continue;
        };
        let id = name
            .rsplit_once("-ns-")
            .and_then(|(_, id)| id.parse().ok())
            .map(NamespaceSelector::Id);
        let nguid = name
            .rsplit_once("-nguid-")
            .and_then(|(_, g)| g.parse().ok())
            .map(NamespaceSelector::Nguid);
        let eui = name
            .rsplit_once("-eui64-")
            .and_then(|(_, e)| e.parse().ok())
            .map(NamespaceSelector::Eui64);
        let uuid = name
            .rsplit_once("-uuid-")
            .and_then(|(_, u)| u.parse().ok())
            .map(NamespaceSelector::Uuid);
        for selector in id.into_iter().chain(nguid).chain(eui).chain(uuid) {
            let spec = VolumeSpec::Nvme {
                nqn: nqn.clone(),
                namespace: selector,
            };
            if !out.contains(&selector) && is_attached(dir, &spec) {
                out.push(selector);
            }
        }
    }
    Ok(out)
}

/// The WWID `spec` was last remembered to name, if any (an unreadable or malformed record is
/// none). Where `spec` has several records (an FC volume's target ports), those found must
/// agree: two ports remembered for different volumes tell nothing.
pub(crate) fn recall(dir: &Path, spec: &VolumeSpec) -> Option<Wwid> {
    let mut found = records(dir, spec).into_iter().filter_map(|p| {
        let text = std::fs::read_to_string(p).ok()?;
        text.lines().next()?.trim().parse::<Wwid>().ok()
    });
    let first = found.next()?;
    found.all(|w| w == first).then_some(first)
}

/// The volume a record or mark file name spells ([`spelt`] read backwards); `None` for any
/// other name: a temporary file of [`write_record`], a stray file, a name that is not
/// spelt as this module spells it (`%2f` for `%2F`, a letter encoded that need not be), an
/// IQN or NQN that does not check. An FC name gives the spec of its one target port.
pub(crate) fn parse_name(name: &str) -> Option<VolumeSpec> {
    let spec = if let Some(rest) = name.strip_prefix("iscsi-") {
        let (target, lun) = rest.rsplit_once("-lun-")?;
        // Every record lunkit writes spells an IscsiName; a name that is none is not one of
        // them (a stray file), as an NQN that does not check is.
        let target = decode(target)?.parse().ok()?;
        VolumeSpec::Iscsi {
            target,
            lun: lun.parse().ok()?,
        }
    } else if let Some(rest) = name.strip_prefix("fc-") {
        let (wwpn, lun) = rest.rsplit_once("-lun-")?;
        VolumeSpec::Fc {
            wwpns: vec![wwpn.parse().ok()?],
            lun: lun.parse().ok()?,
        }
    } else if let Some(rest) = name.strip_prefix("nvme-") {
        nvme_name(rest)?
    } else {
        return None;
    };
    // Only a name that the spec spells again, byte for byte: what `records` would open.
    (spelt(&spec).first().map(String::as_str) == Some(name)).then_some(spec)
}

/// `<encoded NQN>-<ns|nguid|eui64|uuid>-<value>`: the NQN may itself hold `-ns-` and the
/// like, and the value never does (digits, hex, a UUID), so the last marker whose value
/// parses is the one; a name two ways read is none.
fn nvme_name(rest: &str) -> Option<VolumeSpec> {
    type Parse = fn(&str) -> Option<NamespaceSelector>;
    let kinds: [(&str, Parse); 4] = [
        ("-ns-", |v| v.parse().ok().map(NamespaceSelector::Id)),
        ("-nguid-", |v| v.parse().ok().map(NamespaceSelector::Nguid)),
        ("-eui64-", |v| v.parse().ok().map(NamespaceSelector::Eui64)),
        ("-uuid-", |v| v.parse().ok().map(NamespaceSelector::Uuid)),
    ];
    let mut found = kinds.iter().filter_map(|(marker, parse)| {
        let (nqn, value) = rest.rsplit_once(marker)?;
        Some((decode(nqn)?.parse::<Nqn>().ok()?, parse(value)?))
    });
    let (nqn, namespace) = found.next()?;
    found
        .next()
        .is_none()
        .then_some(VolumeSpec::Nvme { nqn, namespace })
}

/// [`encode`] undone: `%XX` (two hex digits) to its byte; `None` for a `%` without them or
/// bytes that are not UTF-8.
fn decode(s: &str) -> Option<String> {
    let mut out = Vec::with_capacity(s.len());
    let mut bytes = s.bytes();
    while let Some(b) = bytes.next() {
        if b == b'%' {
            let hex = [bytes.next()?, bytes.next()?];
            let hex = std::str::from_utf8(&hex).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
        } else {
            out.push(b);
        }
    }
    String::from_utf8(out).ok()
}

/// A record or mark file in the lock directory, with the volume its name spells.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Named {
    /// The file's name (in `names/` or `attached/`).
    pub(crate) file: String,
    /// The volume it is for.
    pub(crate) spec: VolumeSpec,
}

/// The names of the files in `<dir>/<sub>/` that spell a volume (see [`parse_name`]), in
/// name order; none when the directory is not there.
fn listed(dir: &Path, sub: &str) -> Result<Vec<Named>> {
    let path = dir.join(sub);
    let entries = match std::fs::read_dir(&path) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(&path, e)),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(&path, e))?;
        if !entry.file_type().is_ok_and(|t| t.is_file()) {
            continue;
        }
        let Some(file) = entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        if let Some(spec) = parse_name(&file) {
            out.push(Named { file, spec });
        }
    }
    out.sort_by(|a, b| a.file.cmp(&b.file));
    Ok(out)
}

/// Every record of `<dir>/names/` but those a detach retired, with the WWID it holds
/// (`None`: unreadable or malformed, which [`recall`] takes for none).
pub(crate) fn recorded(dir: &Path) -> Result<Vec<(Named, Option<Wwid>)>> {
    Ok(listed(dir, "names")?
        .into_iter()
        .filter(|n| !is_retired(&dir.join("names").join(&n.file)))
        .map(|n| {
            let wwid = read_record(&dir.join("names").join(&n.file));
            (n, wwid)
        })
        .collect())
}

/// Whether the record at `path` was retired by a detach ([`retire`]).
fn is_retired(path: &Path) -> bool {
    std::fs::read_to_string(path).is_ok_and(|t| t.lines().nth(1).map(str::trim) == Some(DETACHED))
}

/// Every attach mark of `<dir>/attached/` (NVMe namespaces only).
pub(crate) fn attach_marks(dir: &Path) -> Result<Vec<Named>> {
    Ok(listed(dir, "attached")?
        .into_iter()
        .filter(|n| matches!(n.spec, VolumeSpec::Nvme { .. }))
        .collect())
}

fn read_record(path: &Path) -> Option<Wwid> {
    std::fs::read_to_string(path)
        .ok()?
        .lines()
        .next()?
        .trim()
        .parse()
        .ok()
}

/// Removes `spec`'s record if it still holds `wwid`: `true` when it did, `false` when the
/// record is gone or holds another WWID now. The caller holds the volume's lock, under which
/// attach and detach write records.
pub(crate) fn forget(dir: &Path, spec: &VolumeSpec, wwid: &Wwid) -> Result<bool> {
    let Some(path) = records(dir, spec).into_iter().next() else {
        return Ok(false);
    };
    if read_record(&path).as_ref() != Some(wwid) {
        return Ok(false);
    }
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(Error::io(&path, e)),
    }
}

#[cfg(test)]
mod tests;

//! The guest's writable overlays (/etc and /var, `--overlay-rwdir`): what the tests changed
//! in them since the boot's baseline, and putting that back.
//!
//! The daemons and fixtures write there (iscsid.conf, node records under /etc/iscsi,
//! /etc/multipath.conf, multipathd's bindings and wwids), and a later test must not inherit
//! them: stale bindings rename maps, stale node records log in again. Changes are found
//! cheaply: every path written since the boot has an entry in the overlay's upper directory
//! (a whiteout for a deletion), so only those are compared. What a path held at the
//! baseline is what the upper held then or, for a path the upper did not hold, what the
//! lower (the host's /etc, read-only) holds; the overlay hides the lower, so it is read
//! through a non-recursive bind mount of the root filesystem.
//!
//! Not handled: a directory of the lower removed and made again (an opaque directory hides
//! the lower's children without a whiteout for each). No test or daemon does that.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use lunkit_lab::cmd;

use crate::Result;

/// Where the root filesystem is bind-mounted (without the mounts on top of it) so that the
/// overlays' lower directories can be read.
const LOWER_ROOT: &str = "/run/xtask-lower-root";

/// One overlay and what it held at the baseline.
#[derive(Debug)]
pub struct Overlay {
    /// Where it is mounted (`/etc`).
    pub merged: PathBuf,
    upper: PathBuf,
    /// Its lower directory, readable through [`LOWER_ROOT`].
    lower: PathBuf,
    /// What the merged view held, at the baseline, at every path the upper held then.
    at_baseline: BTreeMap<PathBuf, Entry>,
}

/// What is at a path, compared by kind, permission bits and content.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Entry {
    Absent,
    Dir {
        mode: u32,
    },
    File {
        mode: u32,
        data: Vec<u8>,
    },
    Symlink(PathBuf),
    /// A socket, fifo or device node: compared by kind only, never restored.
    Other(&'static str),
    Unreadable(String),
}

impl Entry {
    fn read(path: &Path) -> Entry {
        let meta = match fs::symlink_metadata(path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Entry::Absent,
            Err(e) => return Entry::Unreadable(e.to_string()),
        };
        let mode = meta.permissions().mode() & 0o7777;
        let ft = meta.file_type();
        if ft.is_dir() {
            Entry::Dir { mode }
        } else if ft.is_symlink() {
            fs::read_link(path).map_or_else(|e| Entry::Unreadable(e.to_string()), Entry::Symlink)
        } else if ft.is_file() {
            fs::read(path).map_or_else(
                |e| Entry::Unreadable(e.to_string()),
                |data| Entry::File { mode, data },
            )
        } else {
            Entry::Other("special file")
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            Entry::Absent => "absent",
            Entry::Dir { .. } => "directory",
            Entry::File { .. } => "file",
            Entry::Symlink(_) => "symlink",
            Entry::Other(k) => k,
            Entry::Unreadable(_) => "unreadable",
        }
    }
}

/// A path whose content differs from the baseline.
#[derive(Debug)]
pub struct Change {
    pub path: PathBuf,
    now: Entry,
    then: Entry,
}

impl Change {
    /// `/etc/multipath.conf (new file)`, `/etc/iscsi/iscsid.conf (changed)`.
    pub fn describe(&self) -> String {
        let what = match (&self.then, &self.now) {
            (Entry::Absent, now) => format!("new {}", now.kind()),
            (then, Entry::Absent) => format!("{} removed", then.kind()),
            (then, now) if then.kind() != now.kind() => {
                format!("{} became a {}", then.kind(), now.kind())
            }
            (Entry::File { mode: a, data: x }, Entry::File { mode: b, data: y }) if x == y => {
                format!("mode {a:o} became {b:o}")
            }
            _ => "changed".to_owned(),
        };
        format!("{} ({what})", self.path.display())
    }
}

impl Overlay {
    /// The overlays mounted on `dirs`, with their baseline taken now.
    pub fn baselines(dirs: &[&str]) -> Result<Vec<Overlay>> {
        ensure_lower_root()?;
        let mountinfo = fs::read_to_string("/proc/self/mountinfo")?;
        dirs.iter()
            .map(|d| Overlay::baseline(&mountinfo, d))
            .collect()
    }

    fn baseline(mountinfo: &str, dir: &str) -> Result<Overlay> {
        let (lowerdir, upperdir) = overlay_dirs(mountinfo, dir)
            .ok_or_else(|| format!("{dir} is not an overlay with one lower directory"))?;
        let lower = Path::new(LOWER_ROOT).join(lowerdir.trim_start_matches('/'));
        if !lower.is_dir() {
            return Err(
                format!("the lower of {dir} is not readable at {}", lower.display()).into(),
            );
        }
        let mut me = Overlay {
            merged: PathBuf::from(dir),
            upper: PathBuf::from(upperdir),
            lower,
            at_baseline: BTreeMap::new(),
        };
        me.at_baseline = me
            .upper_paths()
            .into_iter()
            .map(|rel| {
                let entry = Entry::read(&me.merged.join(&rel));
                (rel, entry)
            })
            .collect();
        Ok(me)
    }

    /// Paths (relative) the upper directory holds.
    fn upper_paths(&self) -> BTreeSet<PathBuf> {
        let mut out = BTreeSet::new();
        walk(&self.upper, Path::new(""), &mut out);
        out
    }

    fn expected(&self, rel: &Path) -> Entry {
        self.at_baseline
            .get(rel)
            .cloned()
            .unwrap_or_else(|| Entry::read(&self.lower.join(rel)))
    }

    /// Every path that differs from the baseline, shallowest first.
    pub fn changes(&self) -> Vec<Change> {
        let mut candidates = self.upper_paths();
        candidates.extend(self.at_baseline.keys().cloned());
        candidates
            .into_iter()
            .filter_map(|rel| {
                let now = Entry::read(&self.merged.join(&rel));
                let then = self.expected(&rel);
                (now != then).then(|| Change {
                    path: self.merged.join(rel),
                    now,
                    then,
                })
            })
            .collect()
    }

    /// The changes in a short form: a new directory stands for everything in it.
    pub fn describe(changes: &[Change]) -> Vec<String> {
        let new_dirs: Vec<&Path> = changes
            .iter()
            .filter(|c| c.then == Entry::Absent && matches!(c.now, Entry::Dir { .. }))
            .map(|c| c.path.as_path())
            .collect();
        changes
            .iter()
            .filter(|c| {
                !new_dirs
                    .iter()
                    .any(|d| c.path != *d && c.path.starts_with(d))
            })
            .map(Change::describe)
            .collect()
    }

    /// Puts every changed path back as it was at the baseline; returns what it could not.
    pub fn restore(&self) -> Vec<String> {
        let changes = self.changes();
        let mut errors = Vec::new();
        // What must go (or change kind) goes first, deepest first.
        let mut doomed: Vec<&Change> = changes
            .iter()
            .filter(|c| c.now != Entry::Absent && c.now.kind() != c.then.kind())
            .collect();
        doomed.sort_by_key(|c| std::cmp::Reverse(c.path.components().count()));
        for c in doomed {
            let gone = if matches!(c.now, Entry::Dir { .. }) {
                fs::remove_dir_all(&c.path)
            } else {
                fs::remove_file(&c.path)
            };
            if let Err(e) = gone {
                if e.kind() != std::io::ErrorKind::NotFound {
                    errors.push(format!("remove {}: {e}", c.path.display()));
                }
            }
        }
        // Then what must be there, parents before children (`changes` is sorted).
        for c in &changes {
            if let Err(e) = put(&c.path, &c.then) {
                errors.push(format!("restore {}: {e}", c.path.display()));
            }
        }
        errors
    }
}

/// Writes `entry` at `path` (which holds nothing or something of the same kind).
fn put(path: &Path, entry: &Entry) -> std::io::Result<()> {
    let chmod = |mode: u32| fs::set_permissions(path, fs::Permissions::from_mode(mode));
    match entry {
        Entry::Absent => Ok(()),
        Entry::Dir { mode } => {
            fs::create_dir_all(path)?;
            chmod(*mode)
        }
        Entry::File { mode, data } => {
            fs::write(path, data)?;
            chmod(*mode)
        }
        Entry::Symlink(target) => {
            if fs::symlink_metadata(path).is_ok() {
                fs::remove_file(path)?;
            }
            std::os::unix::fs::symlink(target, path)
        }
        Entry::Other(kind) => Err(std::io::Error::other(format!("cannot recreate a {kind}"))),
        Entry::Unreadable(e) => Err(std::io::Error::other(format!(
            "it was unreadable at the baseline ({e})"
        ))),
    }
}

/// Relative paths under `dir`, recursively, without following symlinks.
fn walk(root: &Path, rel: &Path, out: &mut BTreeSet<PathBuf>) {
    let Ok(entries) = fs::read_dir(root.join(rel)) else {
        return;
    };
    for e in entries.flatten() {
        let child = rel.join(e.file_name());
        let is_dir = e.file_type().is_ok_and(|t| t.is_dir());
        out.insert(child.clone());
        if is_dir {
            walk(root, &child, out);
        }
    }
}

/// `(lowerdir, upperdir)` of the overlay mounted at `dir`, from mountinfo's super options.
fn overlay_dirs(mountinfo: &str, dir: &str) -> Option<(String, String)> {
    mountinfo.lines().rev().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        if left.split(' ').nth(4)? != dir {
            return None;
        }
        let mut fields = right.split(' ');
        if fields.next()? != "overlay" {
            return None;
        }
        let options = fields.nth(1)?;
        let opt = |key: &str| {
            options
                .split(',')
                .find_map(|o| o.strip_prefix(key)?.strip_prefix('='))
                .map(str::to_owned)
        };
        let lower = opt("lowerdir")?;
        // Several lower layers are joined with ':'; virtme-ng makes one.
        (!lower.contains(':')).then_some(())?;
        Some((lower, opt("upperdir")?))
    })
}

/// Bind-mounts the root filesystem alone (not recursively: without the overlays on top of
/// it) at [`LOWER_ROOT`], once per boot. It is mounted read-only, as the guest's root is.
fn ensure_lower_root() -> Result<()> {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo")?;
    if mountinfo
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(LOWER_ROOT))
    {
        return Ok(());
    }
    fs::create_dir_all(LOWER_ROOT)?;
    cmd::run("mount", &["--bind", "/", LOWER_ROOT])?;
    // Belt and braces: the root is read-only in the guest already.
    cmd::run_ignoring_failure("mount", &["-o", "remount,bind,ro", LOWER_ROOT]);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::overlay_dirs;

    #[test]
    fn reads_overlay_dirs_from_mountinfo() {
        let mi = "23 1 0:21 / / ro,relatime - 9p /dev/root ro,sync\n\
                  33 23 0:25 / /etc rw,relatime - overlay virtme_rw_overlay0 rw,lowerdir=/etc,upperdir=/run/tmp/o0/upper,workdir=/run/tmp/o0/work\n";
        assert_eq!(
            overlay_dirs(mi, "/etc"),
            Some(("/etc".to_owned(), "/run/tmp/o0/upper".to_owned()))
        );
        assert_eq!(overlay_dirs(mi, "/var"), None);
        assert_eq!(overlay_dirs(mi, "/"), None);
    }
}

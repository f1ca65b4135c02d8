//! The plumbing under every subsystem's typed sysfs views (`scsi::sysfs`, `iscsi::sysfs`,
//! `fc::sysfs`, `nvme::sysfs`, `block::sysfs`): reading an attribute, listing a directory,
//! staying inside the [`Root`].
//!
//! Each subsystem's `sysfs` module owns one family of classes and turns its directories into
//! plain structs.
//! Attribute files that fail to read (a `wwid` without VPD page 0x83 gives ENXIO, a connection
//! `address` gives ENOTCONN while the link is down, an entry vanishes during a hot-unplug) become
//! `None`, so one odd device never spoils a whole listing. Directory listings, on the other hand,
//! report their errors: an unreadable `/sys/class/scsi_device` must not look like an empty node.

use std::cmp::Ordering;
use std::fs;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use crate::error::{Error, Result};
use crate::root::Root;

/// Defines a kernel state enum: one variant per spelling the kernel writes to a `state`
/// attribute, and `Other` keeping any spelling this crate does not know (a newer kernel's),
/// so that parsing never fails and [`as_str`](#method.as_str) gives back what sysfs said.
macro_rules! kernel_state {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident = $text:literal,)+ }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vmeta])* $variant,)+
            /// A spelling this crate does not know, as the kernel wrote it.
            Other(String),
        }

        impl $name {
            /// Parses the attribute's text (surrounding whitespace already trimmed).
            pub fn parse(raw: &str) -> Self {
                match raw {
                    $($text => $name::$variant,)+
                    other => $name::Other(other.to_owned()),
                }
            }

            /// The state as the kernel spells it.
            pub fn as_str(&self) -> &str {
                match self {
                    $($name::$variant => $text,)+
                    $name::Other(s) => s,
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}
pub(crate) use kernel_state;

/// Fails with [`Error::NotFound`] when `<root>/sys` is not a directory: a mistyped `--root`
/// must not pass for a node without storage.
pub(crate) fn require(root: &Root) -> Result<()> {
    let top = root.sys("");
    if top.is_dir() {
        return Ok(());
    }
    Err(Error::NotFound {
        what: format!(
            "no sysfs directory {} (is the root given the node's, with /sys mounted?)",
            top.display()
        ),
    })
}

/// sysfs attributes are at most a page; anything larger is not a sysfs attribute.
const MAX_ATTR: u64 = 64 * 1024;

/// Opens an attribute file the way sysfs has them: never through a symlink.
///
/// sysfs attributes are regular files; only directories are reached through symlinks. So the
/// last component is opened with `O_NOFOLLOW` (a fixture or `--root` tree whose attribute is a
/// link to a file outside the root is not followed there), and with `O_NONBLOCK` so that a
/// FIFO in its place cannot block the open or the read.
fn open_attr(path: &Path, options: &mut fs::OpenOptions) -> io::Result<fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    options
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
}

/// Reads `dir/name` as trimmed text; `None` when it cannot be read, is not UTF-8, or is
/// empty.
///
/// One `read(2)` of a page gets the whole attribute: kernfs produces an attribute's text in
/// full for the first read, and a regular file of a fixture tree reads short only at its
/// end. So a read shorter than the buffer ends it, with no second read to find the end of
/// file: under emulation each system call counts, and a lookup reads dozens of these.
pub(crate) fn attr(dir: &Path, name: &str) -> Option<String> {
    let mut f = open_attr(&dir.join(name), fs::OpenOptions::new().read(true)).ok()?;
    let mut page = [0u8; 4096];
    let mut text = Vec::new();
    loop {
        let n = match f.read(&mut page) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return None,
        };
        text.extend_from_slice(&page[..n]);
        if n < page.len() || text.len() as u64 >= MAX_ATTR {
            break;
        }
    }
    text.truncate(MAX_ATTR as usize);
    let s = std::str::from_utf8(&text).ok()?;
    let t = s.trim();
    (!t.is_empty()).then(|| t.to_owned())
}

/// Writes `value` to the existing attribute `path` in one `write(2)`, as the kernel expects
/// (sysfs takes one write per store). Never creates a file: a missing attribute is an error,
/// and so is an attribute that is a symlink ([`open_attr`]) or not a regular file.
pub(crate) fn write_attr(path: &Path, value: &str) -> Result<()> {
    AttrWriter::open(path)?.write(value)
}

/// An attribute opened for writing, written later.
///
/// kernfs ties an open file to the object it belongs to: once that object is removed, a write
/// through the file fails with `ENODEV`, even if a new object of the same name has appeared
/// at the same path meanwhile. Opening first, then checking the object, then writing, makes
/// the write reach the object that was checked or nothing.
#[derive(Debug)]
pub(crate) struct AttrWriter {
    file: fs::File,
    path: PathBuf,
}

impl AttrWriter {
    /// Opens the existing attribute `path` (`open(2)` with `O_WRONLY|O_NOFOLLOW|O_NONBLOCK`).
    pub(crate) fn open(path: &Path) -> Result<AttrWriter> {
        let file = open_attr(path, fs::OpenOptions::new().write(true).truncate(true))
            .map_err(|e| Error::io(path, e))?;
        // What a scan or delete writes must land in an attribute, not in a device node or FIFO.
        if !file.metadata().map_err(|e| Error::io(path, e))?.is_file() {
            return Err(Error::io(path, io::Error::from_raw_os_error(libc::EINVAL)));
        }
        Ok(AttrWriter {
            file,
            path: path.to_owned(),
        })
    }

    /// Writes `value` in one `write(2)`.
    pub(crate) fn write(mut self, value: &str) -> Result<()> {
        use std::io::Write;
        self.file
            .write_all(value.as_bytes())
            .map_err(|e| Error::io(&self.path, e))
    }
}

/// Which sysfs object a directory is: its `(st_dev, st_ino)`.
///
/// kernfs numbers every node it creates anew (a 64-bit id that is not handed out again), so a
/// device removed and created again at the same path, under the same name and device number,
/// is another object. Names, paths and `M:m` numbers are all reused at once (the SCSI
/// midlayer, `sd` and device-mapper allocate the lowest free number); this is not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ObjectId {
    /// `st_dev` of the directory.
    pub dev: u64,
    /// `st_ino` of the directory.
    pub ino: u64,
}

/// The object the directory `path` is now (`stat(2)`, following the class and bus symlinks
/// that lead to it); `None` when there is no directory there.
pub(crate) fn object_id(path: &Path) -> Option<ObjectId> {
    use std::os::unix::fs::MetadataExt;
    let m = fs::metadata(path).ok().filter(fs::Metadata::is_dir)?;
    Some(ObjectId {
        dev: m.dev(),
        ino: m.ino(),
    })
}

/// Reads and parses `dir/name`; `None` when it cannot be read or does not parse.
pub(crate) fn attr_parse<T: FromStr>(dir: &Path, name: &str) -> Option<T> {
    attr(dir, name)?.parse().ok()
}

/// The names in `dir`, in natural order; an absent directory is empty (a class whose driver is
/// not loaded has no directory at all).
pub(crate) fn entries(dir: &Path) -> Result<Vec<String>> {
    let rd = match fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(dir, e)),
    };
    let mut names = Vec::new();
    for entry in rd {
        let entry = entry.map_err(|e| Error::io(dir, e))?;
        if let Ok(name) = entry.file_name().into_string() {
            names.push(name);
        }
    }
    names.sort_by(|a, b| natural_cmp(a, b));
    Ok(names)
}

/// Resolves `path` (following sysfs' relative symlinks) and returns it only if it stays below
/// the root, so a fixture or container tree cannot lead the reader elsewhere.
pub(crate) fn resolve(root: &Root, path: &Path) -> Option<PathBuf> {
    let real = fs::canonicalize(path).ok()?;
    let top = fs::canonicalize(root.path()).ok()?;
    real.starts_with(&top).then_some(real)
}

/// Finds the directories to read devices from below one root, so that a `--root` tree
/// cannot make a reader list or read files outside it.
///
/// Class and `/sys/block` entries are symlinks into `/sys/devices`; [`Confine::dir`] follows
/// them and keeps the result only if it is below the root. On the live system's root, `/`,
/// nothing is outside, and paths are used as they are without resolving them.
#[derive(Debug)]
pub(crate) struct Confine {
    /// The canonical root; `None` for `/`.
    top: Option<PathBuf>,
}

impl Confine {
    pub(crate) fn new(root: &Root) -> Confine {
        let top = (root.path() != Path::new("/")).then(|| {
            // A root that does not resolve has nothing below it: every path fails to resolve.
            fs::canonicalize(root.path()).unwrap_or_else(|_| root.path().to_owned())
        });
        Confine { top }
    }

    /// `path` with its symlinks resolved, or `None` when they lead outside the root.
    ///
    /// A path that does not resolve at all (the device vanished since its directory was
    /// listed) is returned as it is: reading below it fails, and the device shows with its
    /// attributes absent, as on a live system.
    pub(crate) fn dir(&self, path: &Path) -> Option<PathBuf> {
        let Some(top) = &self.top else {
            return Some(path.to_owned());
        };
        match fs::canonicalize(path) {
            Ok(real) => real.starts_with(top).then_some(real),
            Err(_) => Some(path.to_owned()),
        }
    }
}

/// Whether `path` is a directory itself, not a symlink to one.
pub(crate) fn real_dir(path: &Path) -> bool {
    fs::symlink_metadata(path).is_ok_and(|m| m.is_dir())
}

/// The names in `dir/sub`, a subdirectory that sysfs always has as a real directory
/// (`holders/`, `slaves/`, `block/`): one that is a symlink could lead out of the root, and
/// is read as empty.
pub(crate) fn sub_entries(dir: &Path, sub: &str) -> Result<Vec<String>> {
    let path = dir.join(sub);
    if fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_symlink()) {
        return Ok(Vec::new());
    }
    entries(&path)
}

/// Accepts `name` only if it is one plain path component: not empty, not `.` or `..`, no `/`,
/// no NUL, at most 255 bytes (NAME_MAX). Anything a caller hands in as a device or host name
/// goes through this before it is joined to a sysfs path.
pub(crate) fn check_component(kind: &'static str, name: &str) -> Result<()> {
    let reason = if name.is_empty() {
        "empty"
    } else if name == "." || name == ".." {
        "not a device name"
    } else if name.contains('/') {
        "contains '/'"
    } else if name.contains('\0') {
        "contains NUL"
    } else if name.len() > 255 {
        "longer than 255 bytes"
    } else {
        return Ok(());
    };
    Err(Error::invalid(kind, name, reason))
}

/// The final component of `path` as UTF-8.
pub(crate) fn file_name(path: &Path) -> Option<&str> {
    path.file_name()?.to_str()
}

/// Compares names so that digit runs order by value: `sdb < sdaa`, `dm-2 < dm-10`,
/// `host2 < host10`.
pub(crate) fn natural_cmp(a: &str, b: &str) -> Ordering {
    // Letter runs compare by length first because the kernel names disks sda..sdz, sdaa..:
    // `sdb` was created before `sdaa` and should be listed first.
    let (mut a, mut b) = (a.as_bytes(), b.as_bytes());
    loop {
        match (a.first(), b.first()) {
            (None, None) => return Ordering::Equal,
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some(x), Some(y)) => {
                let (ra, rest_a) = run(a, x.is_ascii_digit());
                let (rb, rest_b) = run(b, y.is_ascii_digit());
                let ord = if x.is_ascii_digit() && y.is_ascii_digit() {
                    let ta = trim_zeros(ra);
                    let tb = trim_zeros(rb);
                    ta.len()
                        .cmp(&tb.len())
                        .then(ta.cmp(tb))
                        .then(ra.len().cmp(&rb.len()))
                } else if !x.is_ascii_digit() && !y.is_ascii_digit() {
                    ra.len().cmp(&rb.len()).then(ra.cmp(rb))
                } else {
                    ra.cmp(rb)
                };
                if ord != Ordering::Equal {
                    return ord;
                }
                a = rest_a;
                b = rest_b;
            }
        }
    }
}

fn run(s: &[u8], digits: bool) -> (&[u8], &[u8]) {
    let n = s
        .iter()
        .position(|c| c.is_ascii_digit() != digits)
        .unwrap_or(s.len());
    s.split_at(n)
}

fn trim_zeros(s: &[u8]) -> &[u8] {
    let n = s.iter().position(|&c| c != b'0').unwrap_or(s.len());
    &s[n..]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn natural_order() {
        let sorted = |mut v: Vec<&'static str>| {
            v.sort_by(|a, b| natural_cmp(a, b));
            v
        };
        assert_eq!(
            sorted(vec!["sdaa", "sdb", "sda", "sda1", "sda10", "sda2"]),
            ["sda", "sda1", "sda2", "sda10", "sdb", "sdaa"]
        );
        assert_eq!(
            sorted(vec!["dm-10", "dm-2", "dm-1"]),
            ["dm-1", "dm-2", "dm-10"]
        );
        assert_eq!(
            sorted(vec!["host10", "host2", "host02"]),
            ["host2", "host02", "host10"]
        );
    }

    #[test]
    fn components_reject_path_tricks() {
        for bad in ["", ".", "..", "../sda", "sda/..", "a\0b", &"x".repeat(256)] {
            assert!(check_component("name", bad).is_err(), "{bad:?}");
        }
        for good in ["sda", "dm-0", "nvme0n1", "host2", "..sda"] {
            check_component("name", good).unwrap();
        }
    }

    #[test]
    fn attr_trims_and_absents() {
        let dir = std::env::temp_dir().join(format!("lunkit-attr-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("vendor"), "LIO-ORG \n").unwrap();
        fs::write(dir.join("empty"), "\n").unwrap();
        fs::write(dir.join("num"), "42\n").unwrap();
        assert_eq!(attr(&dir, "vendor").as_deref(), Some("LIO-ORG"));
        assert_eq!(attr(&dir, "empty"), None);
        assert_eq!(attr(&dir, "missing"), None);
        assert_eq!(attr_parse::<u32>(&dir, "num"), Some(42));
        assert_eq!(attr_parse::<u32>(&dir, "vendor"), None);
        assert!(entries(&dir.join("nope")).unwrap().is_empty());
        fs::remove_dir_all(&dir).unwrap();
    }
}

//! `/proc/PID/mountinfo`: which filesystems are mounted from which device numbers, and which
//! device nodes are bind-mounted where.
//!
//! The parser is pure ([`parse`], [`parse_line`]) and works on bytes, because mount points are
//! file names and need not be UTF-8; [`read`] does the file access. Mounts are matched to
//! devices by `major:minor` (field 3), never by the source string, which is whatever the
//! mounter passed (`/dev/disk/by-id/...`, a bind-mounted path, `none`).
//!
//! The line format (`show_mountinfo` in fs/proc_namespace.c):
//!
//! ```text
//! 36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
//! (1)(2) (3)  (4)   (5)     (6)       (7)   (8) (9)    (10)         (11)
//! ```
//!
//! Field 7 is zero or more optional tags ended by a lone `-`. In the root, mount point, type
//! and source fields the kernel writes space, tab, newline and backslash as `\ooo` octal
//! escapes (`seq_escape`); [`unescape`] reverses that and [`escape`] produces it.

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::id::DevNum;
use crate::root::Root;

/// The bytes the kernel escapes in mountinfo's path-like fields.
const ESCAPED: &[u8] = b" \t\n\\";

/// One line of mountinfo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    /// Unique id of the mount.
    pub id: u32,
    /// Id of the parent mount (itself for the root of the namespace's tree).
    pub parent: u32,
    /// The device the filesystem lives on (`st_dev` of files in it).
    pub dev: DevNum,
    /// The directory of the filesystem that is mounted here: `/` for a whole filesystem,
    /// something deeper for a bind mount of a subdirectory.
    pub root: PathBuf,
    /// Where it is mounted, relative to the reading process's root.
    pub mount_point: PathBuf,
    /// Per-mount options (`rw,nosuid,relatime`).
    pub options: String,
    /// Optional tags (`shared:1`, `master:3`, `propagate_from:2`, `unbindable`).
    pub tags: Vec<String>,
    /// Filesystem type (`ext4`, `xfs`, `fuse.sshfs`).
    pub fs_type: String,
    /// Mount source as the mounter gave it (`/dev/sdc1`, `none`).
    pub source: OsString,
    /// Per-superblock options.
    pub super_options: String,
}

impl MountEntry {
    /// For a bind mount of a device *node* (a file of devtmpfs, not a filesystem on the
    /// device): the node's path below `/dev` (`/sdc`, `/mapper/mpatha`). Kubelet publishes
    /// raw block volumes this way. Field 3 is devtmpfs's own number (`0:5`), so such a
    /// mount is found by its root, never by device number.
    pub fn device_node(&self) -> Option<&Path> {
        (self.fs_type == "devtmpfs" && self.root != Path::new("/")).then_some(self.root.as_path())
    }

    /// The line as the kernel writes it (without the trailing newline); [`parse_line`] reads
    /// it back to an equal entry.
    ///
    /// [`parse_line`] unescapes every text field, options and tags included (filesystems
    /// escape their superblock options with `seq_show_option`), so every text field is
    /// escaped here: an option or tag holding a space, tab, newline or backslash would
    /// otherwise split into other fields or decode differently when read back.
    pub fn to_line(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(128);
        out.extend_from_slice(format!("{} {} {} ", self.id, self.parent, self.dev).as_bytes());
        escape_into(self.root.as_os_str().as_bytes(), &mut out);
        out.push(b' ');
        escape_into(self.mount_point.as_os_str().as_bytes(), &mut out);
        out.push(b' ');
        escape_into(self.options.as_bytes(), &mut out);
        for t in &self.tags {
            out.push(b' ');
            if t == "-" {
                // A lone `-` is the end of the tags; `\055` reads back as this tag instead.
                out.extend_from_slice(b"\\055");
            } else {
                escape_into(t.as_bytes(), &mut out);
            }
        }
        out.extend_from_slice(b" - ");
        escape_into(self.fs_type.as_bytes(), &mut out);
        out.push(b' ');
        escape_into(self.source.as_bytes(), &mut out);
        out.push(b' ');
        escape_into(self.super_options.as_bytes(), &mut out);
        out
    }
}

/// Writes `bytes` with space, tab, newline and backslash as `\ooo`, as `seq_escape` does.
pub fn escape(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    escape_into(bytes, &mut out);
    out
}

fn escape_into(bytes: &[u8], out: &mut Vec<u8>) {
    for &b in bytes {
        if ESCAPED.contains(&b) {
            out.extend_from_slice(&[
                b'\\',
                b'0' + (b >> 6),
                b'0' + ((b >> 3) & 7),
                b'0' + (b & 7),
            ]);
        } else {
            out.push(b);
        }
    }
}

/// Decodes `\ooo` octal escapes. A backslash not followed by three octal digits that fit in
/// a byte is kept as it is, as glibc's `getmntent` does.
pub fn unescape(field: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        if field[i] == b'\\' {
            if let Some(&[a, b, c]) = field.get(i + 1..i + 4) {
                let oct = |d: u8| (b'0'..=b'7').contains(&d).then(|| u32::from(d - b'0'));
                if let (Some(a), Some(b), Some(c)) = (oct(a), oct(b), oct(c)) {
                    let v = a << 6 | b << 3 | c;
                    if let Ok(byte) = u8::try_from(v) {
                        out.push(byte);
                        i += 4;
                        continue;
                    }
                }
            }
        }
        out.push(field[i]);
        i += 1;
    }
    out
}

/// Parses one line (a trailing newline is allowed).
pub fn parse_line(line: &[u8]) -> Result<MountEntry> {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let shown = || String::from_utf8_lossy(line).into_owned();
    let bad = |reason| Error::invalid("mountinfo line", &shown(), reason);
    let mut fields = line.split(|&b| b == b' ');
    let mut next = |what| {
        fields
            .next()
            .filter(|f| !f.is_empty())
            .ok_or_else(|| bad(what))
    };
    let number = |f: &[u8], what| -> Result<u32> {
        std::str::from_utf8(f)
            .ok()
            .and_then(crate::id::decimal)
            .ok_or_else(|| bad(what))
    };
    let text = |f: &[u8], what| -> Result<String> {
        String::from_utf8(unescape(f)).map_err(|_| bad(what))
    };
    let id = number(next("missing mount id")?, "mount id is not a number")?;
    let parent = number(next("missing parent id")?, "parent id is not a number")?;
    let dev = std::str::from_utf8(next("missing major:minor")?)
        .ok()
        .and_then(|s| s.parse::<DevNum>().ok())
        .ok_or_else(|| bad("field 3 is not major:minor"))?;
    let root = PathBuf::from(OsString::from_vec(unescape(next("missing root")?)));
    let mount_point = PathBuf::from(OsString::from_vec(unescape(next("missing mount point")?)));
    let options = text(
        next("missing mount options")?,
        "mount options are not UTF-8",
    )?;
    let mut tags = Vec::new();
    loop {
        let f = next("missing the - separator")?;
        if f == b"-" {
            break;
        }
        tags.push(text(f, "optional field is not UTF-8")?);
    }
    let fs_type = text(
        next("missing filesystem type")?,
        "filesystem type is not UTF-8",
    )?;
    // An empty source is written as "none" by current kernels, but older ones wrote nothing
    // and left two spaces, so the source and super options may be empty.
    let source = OsString::from_vec(unescape(
        fields.next().ok_or_else(|| bad("missing source"))?,
    ));
    let super_options = fields
        .next()
        .map(|f| text(f, "superblock options are not UTF-8"))
        .transpose()?
        .ok_or_else(|| bad("missing superblock options"))?;
    if fields.next().is_some() {
        return Err(bad("too many fields"));
    }
    Ok(MountEntry {
        id,
        parent,
        dev,
        root,
        mount_point,
        options,
        tags,
        fs_type,
        source,
        super_options,
    })
}

/// Parses a whole mountinfo file strictly; blank lines are skipped, any malformed line fails
/// it all. For checks on a live table use [`parse_table`], which cannot be made to fail by
/// one odd line.
pub fn parse(text: &[u8]) -> Result<Vec<MountEntry>> {
    text.split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .map(parse_line)
        .collect()
}

/// A mount table as a check reads it: every line that parses, and the ones that did not.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MountTable {
    /// The lines that parsed.
    pub mounts: Vec<MountEntry>,
    /// The lines that did not (a filesystem's options that are not UTF-8, a line cut short).
    pub skipped: Vec<SkippedLine>,
}

/// A mountinfo line [`parse_table`] could not parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedLine {
    /// Its line number, from 1.
    pub number: usize,
    /// Its device field (field 3), when that much of it could be read: a caller that finds
    /// its own device here knows it is mounted without knowing where.
    pub dev: Option<DevNum>,
    /// Why it did not parse.
    pub reason: String,
}

/// Parses a whole mountinfo file, skipping (and keeping count of) lines that do not parse.
///
/// One FUSE filesystem with non-UTF-8 options, or a line a fuzzer mangled, must not make
/// every other mount unreadable: a check that failed on the whole table would refuse every
/// device on the node (or, worse, be skipped). The caller decides what a skipped line on
/// its own device means.
pub fn parse_table(text: &[u8]) -> MountTable {
    let mut table = MountTable::default();
    for (i, line) in text.split(|&b| b == b'\n').enumerate() {
        if line.is_empty() {
            continue;
        }
        match parse_line(line) {
            Ok(m) => table.mounts.push(m),
            Err(e) => table.skipped.push(SkippedLine {
                number: i + 1,
                dev: line
                    .split(|&b| b == b' ')
                    .nth(2)
                    .and_then(|f| std::str::from_utf8(f).ok())
                    .and_then(|f| f.parse().ok()),
                reason: e.to_string(),
            }),
        }
    }
    table
}

/// Reads and parses `<root>/proc/self/mountinfo`: the mounts visible to this process.
pub fn read(root: &Root) -> Result<MountTable> {
    read_path(&root.proc("self/mountinfo"))
}

/// Reads and parses the mount table of process `pid`'s mount namespace
/// (`<root>/proc/PID/mountinfo`; pid 1's is the host's when `<root>/proc` is the host's).
pub fn read_of(root: &Root, pid: u32) -> Result<MountTable> {
    read_path(&root.proc(format!("{pid}/mountinfo")))
}

fn read_path(path: &Path) -> Result<MountTable> {
    let text = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    Ok(parse_table(&text))
}

/// The mounts whose filesystem is on one of `devs`.
pub fn on_devices<'a>(
    mounts: &'a [MountEntry],
    devs: &'a [DevNum],
) -> impl Iterator<Item = &'a MountEntry> + 'a {
    mounts.iter().filter(move |m| devs.contains(&m.dev))
}

/// `path` for messages: lossy UTF-8.
pub(crate) fn show(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &[u8] = b"\
22 1 8:2 / / rw,relatime shared:1 - ext4 /dev/sda2 rw,errors=remount-ro
36 22 8:33 / /mnt/with\\040space rw,relatime shared:20 master:3 - xfs /dev/sdc1 rw,attr2
37 22 8:33 /sub/dir /var/lib/kubelet/pods/x rw,relatime - xfs /dev/sdc1 rw,attr2
38 22 0:45 / /run/user rw,nosuid - tmpfs tmpfs rw,size=100k
39 22 253:0 / /back\\134slash\\011tab rw - ext4 /dev/mapper/mpath\\040a rw
";

    #[test]
    fn parses_fields_and_escapes() {
        let m = parse(SAMPLE).unwrap();
        assert_eq!(m.len(), 5);
        assert_eq!(m[0].id, 22);
        assert_eq!(m[0].parent, 1);
        assert_eq!(m[0].dev, DevNum { major: 8, minor: 2 });
        assert_eq!(m[0].tags, ["shared:1"]);
        assert_eq!(m[1].mount_point, Path::new("/mnt/with space"));
        assert_eq!(m[1].tags, ["shared:20", "master:3"]);
        assert_eq!(m[2].root, Path::new("/sub/dir"));
        assert_eq!(m[3].fs_type, "tmpfs");
        assert_eq!(m[4].mount_point, Path::new("/back\\slash\ttab"));
        assert_eq!(m[4].source, "/dev/mapper/mpath a");
        assert!(m[2].tags.is_empty());
    }

    #[test]
    fn bind_mounts_match_by_device() {
        let m = parse(SAMPLE).unwrap();
        let sdc1 = [DevNum {
            major: 8,
            minor: 33,
        }];
        let points: Vec<_> = on_devices(&m, &sdc1)
            .map(|e| show(&e.mount_point))
            .collect();
        assert_eq!(points, ["/mnt/with space", "/var/lib/kubelet/pods/x"]);
    }

    #[test]
    fn round_trips_through_to_line() {
        for e in parse(SAMPLE).unwrap() {
            assert_eq!(parse_line(&e.to_line()).unwrap(), e);
        }
    }

    #[test]
    fn non_utf8_mount_point_is_kept_as_bytes() {
        let e = parse_line(b"40 22 8:16 / /mnt/\xff\xfe rw - ext4 /dev/sdb rw").unwrap();
        assert_eq!(e.mount_point.as_os_str().as_bytes(), b"/mnt/\xff\xfe");
    }

    #[test]
    fn unescape_keeps_malformed_escapes() {
        assert_eq!(unescape(b"a\\040b"), b"a b");
        assert_eq!(unescape(b"a\\04"), b"a\\04");
        assert_eq!(unescape(b"a\\089"), b"a\\089");
        assert_eq!(unescape(b"\\777"), b"\\777");
        assert_eq!(unescape(b"\\"), b"\\");
        assert_eq!(escape(b"a b\\"), b"a\\040b\\134");
    }

    #[test]
    fn rejects_malformed_lines() {
        for bad in [
            &b""[..],
            b"22",
            b"22 1 8:2 / / rw",
            b"22 1 8:2 / / rw shared:1",
            b"x 1 8:2 / / rw - ext4 /dev/sda rw",
            b"22 1 82 / / rw - ext4 /dev/sda rw",
            b"22 1 8:2 / / rw - ext4",
            b"22 1 8:2 / / rw - ext4 /dev/sda rw extra",
            b"22  1 8:2 / / rw - ext4 /dev/sda rw",
        ] {
            assert!(parse_line(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn a_table_skips_and_counts_lines_that_do_not_parse() {
        let text = b"22 1 8:2 / / rw - ext4 /dev/sda2 rw\n\
50 22 0:50 / /fuse rw - fuse.x src rw,opt=\xff\n\
\n\
51 22 8:33 / /mnt rw\n\
52 22 8:32 / /data rw - xfs /dev/sdc rw\n";
        assert!(parse(text).is_err(), "the strict parser fails the table");
        let t = parse_table(text);
        let points: Vec<_> = t.mounts.iter().map(|m| show(&m.mount_point)).collect();
        assert_eq!(points, ["/", "/data"]);
        assert_eq!(t.skipped.len(), 2);
        assert_eq!(t.skipped[0].number, 2);
        assert_eq!(
            t.skipped[0].dev,
            Some(DevNum {
                major: 0,
                minor: 50
            })
        );
        assert_eq!(t.skipped[1].number, 4);
        assert_eq!(
            t.skipped[1].dev,
            Some(DevNum {
                major: 8,
                minor: 33
            })
        );
        assert!(parse_table(b"").mounts.is_empty());
    }

    #[test]
    fn device_node_binds_are_devtmpfs_mounts_of_a_file() {
        let t = parse_table(
            b"25 22 0:5 / /dev rw - devtmpfs udev rw\n\
90 22 0:5 /dm-0 /var/lib/kubelet/x rw - devtmpfs udev rw\n\
91 22 0:45 /dm-0 /y rw - tmpfs tmpfs rw\n",
        );
        let nodes: Vec<_> = t.mounts.iter().map(|m| m.device_node()).collect();
        assert_eq!(nodes, [None, Some(Path::new("/dm-0")), None]);
    }

    #[test]
    fn empty_source_of_old_kernels_parses() {
        let e = parse_line(b"50 22 0:50 / /x rw - fuse.x  rw").unwrap();
        assert!(e.source.is_empty());
        assert_eq!(e.super_options, "rw");
    }
}

//! `xtask capture-sysfs DEST`: a trimmed but faithful copy of the storage part of sysfs, for
//! the library's fixture-tree tests.
//!
//! - The class and block directories keep their symlinks with the same relative targets, so
//!   the copy resolves inside DEST exactly as sysfs does.
//! - Every `/sys/devices/...` directory those links resolve to is copied recursively, and so
//!   is the target of every `device` link found on the way; bulky or irrelevant parts
//!   (power/, queue/, trace/, driver and subsystem links, ...) are left out.
//! - Attributes are copied with their content (at most 4 KiB). Write-only ones (`scan`,
//!   `delete`) become empty files. Ones that fail to read (`wwid` with ENXIO, a connection's
//!   `address` with ENOTCONN) are not created: they are listed in DEST/.unreadable as
//!   `path ERRNO`, because the library treats an unreadable attribute as absent.

use std::collections::{BTreeSet, HashSet};
use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::{MetadataExt, symlink};
use std::path::{Path, PathBuf};

use crate::Result;

/// The classes whose devices the library reads.
const CLASSES: &[&str] = &[
    "scsi_host",
    "scsi_device",
    "scsi_disk",
    "scsi_generic",
    "block",
    "iscsi_session",
    "iscsi_connection",
    "iscsi_host",
    "fc_host",
    "fc_remote_ports",
    "fc_transport",
    "nvme",
    "nvme-subsystem",
];

/// Directories that are bulky and say nothing about which device is which.
const SKIP_DIRS: &[&str] = &[
    "power",
    "queue",
    "trace",
    "integrity",
    "mq",
    "bsg",
    "statistics",
    "bsg_lib",
];

/// Links that lead out of the storage tree (drivers, buses, firmware, modules).
const SKIP_LINKS: &[&str] = &[
    "subsystem",
    "driver",
    "bdi",
    "firmware_node",
    "of_node",
    "iommu",
    "iommu_group",
    "module",
    "software_node",
];

/// Larger attributes are not attributes the library reads.
const MAX_ATTR: u64 = 4096;

pub fn main(args: &[String]) -> Result<u8> {
    let mut note = String::new();
    let mut dest = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--note" => note = it.next().ok_or("--note needs a text")?.clone(),
            _ if dest.is_none() && !a.starts_with('-') => dest = Some(PathBuf::from(a)),
            _ => {
                return Err(format!(
                    "unexpected argument {a:?}; usage: capture-sysfs [--note TEXT] DEST"
                )
                .into());
            }
        }
    }
    let dest = dest.ok_or("usage: capture-sysfs [--note TEXT] DEST")?;
    let summary = capture(Path::new("/"), &dest, &note)?;
    eprintln!("xtask: captured sysfs into {}: {summary}", dest.display());
    Ok(0)
}

/// What a capture wrote.
#[derive(Debug, Default)]
pub struct Summary {
    pub files: usize,
    pub links: usize,
    pub bytes: u64,
    pub unreadable: usize,
    pub dropped_links: usize,
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} files ({} bytes), {} links, {} unreadable attributes, {} dangling links dropped",
            self.files, self.bytes, self.links, self.unreadable, self.dropped_links
        )
    }
}

/// Copies `<root>/sys` (storage part) and `<root>/proc/self/mountinfo` into `dest`, which must
/// not exist or be empty.
pub fn capture(root: &Path, dest: &Path, note: &str) -> Result<Summary> {
    if fs::read_dir(dest).is_ok_and(|mut d| d.next().is_some()) {
        return Err(format!("{} is not empty", dest.display()).into());
    }
    fs::create_dir_all(dest)?;
    let mut c = Copier {
        root: root.to_path_buf(),
        dest: dest.to_path_buf(),
        walked: HashSet::new(),
        queue: Vec::new(),
        unreadable: BTreeSet::new(),
        links: Vec::new(),
        summary: Summary::default(),
    };
    for class in CLASSES {
        c.copy_links(&format!("sys/class/{class}"))?;
    }
    c.copy_links("sys/block")?;
    c.copy_links("sys/dev/block")?;
    while let Some(dir) = c.queue.pop() {
        c.walk(&dir)?;
    }
    c.drop_dangling_links()?;
    c.copy_file("sys/kernel/uevent_seqnum")?;
    let mountinfo = c.dest.join("proc/self/mountinfo");
    fs::create_dir_all(mountinfo.parent().expect("has a parent"))?;
    fs::copy(root.join("proc/self/mountinfo"), &mountinfo)?;
    let unreadable: String = c
        .unreadable
        .iter()
        .map(|(p, e)| format!("{p} {e}\n"))
        .collect();
    fs::write(dest.join(".unreadable"), unreadable)?;
    c.summary.unreadable = c.unreadable.len();
    write_readme(dest, note, &c.summary)?;
    Ok(c.summary)
}

struct Copier {
    root: PathBuf,
    dest: PathBuf,
    /// Device directories (relative, `sys/devices/...`) already copied or queued.
    walked: HashSet<PathBuf>,
    queue: Vec<PathBuf>,
    unreadable: BTreeSet<(String, String)>,
    /// Every link written (relative to dest), checked at the end.
    links: Vec<PathBuf>,
    summary: Summary,
}

impl Copier {
    /// Copies the links of a class-like directory and queues the directories they resolve to.
    fn copy_links(&mut self, rel: &str) -> Result<()> {
        let dir = self.root.join(rel);
        let Ok(entries) = sorted_entries(&dir) else {
            return Ok(());
        };
        fs::create_dir_all(self.dest.join(rel))?;
        for name in entries {
            let rel_entry = Path::new(rel).join(&name);
            if fs::symlink_metadata(self.root.join(&rel_entry))?
                .file_type()
                .is_symlink()
            {
                self.copy_link(&rel_entry)?;
                self.queue_target(&rel_entry);
            }
        }
        Ok(())
    }

    /// Queues the device directory a link resolves to, if it is under sys/devices.
    fn queue_target(&mut self, rel_link: &Path) {
        let Ok(real) = fs::canonicalize(self.root.join(rel_link)) else {
            return;
        };
        let Ok(rel) = real.strip_prefix(&self.root) else {
            return;
        };
        if rel.starts_with("sys/devices") && self.walked.insert(rel.to_path_buf()) {
            self.queue.push(rel.to_path_buf());
        }
    }

    fn copy_link(&mut self, rel: &Path) -> Result<()> {
        let target = fs::read_link(self.root.join(rel))?;
        let at = self.dest.join(rel);
        fs::create_dir_all(at.parent().expect("has a parent"))?;
        match symlink(&target, &at) {
            Ok(()) => {}
            // Reached twice (a directory walked again from a parent `device` link).
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Ok(()),
            Err(e) => return Err(format!("symlink {}: {e}", at.display()).into()),
        }
        self.links.push(rel.to_path_buf());
        self.summary.links += 1;
        Ok(())
    }

    /// Copies a device directory recursively.
    fn walk(&mut self, rel: &Path) -> Result<()> {
        fs::create_dir_all(self.dest.join(rel))?;
        for name in sorted_entries(&self.root.join(rel))? {
            let rel_entry = rel.join(&name);
            let meta = match fs::symlink_metadata(self.root.join(&rel_entry)) {
                Ok(m) => m,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue, // went away
                Err(e) => return Err(e.into()),
            };
            if meta.file_type().is_symlink() {
                if SKIP_LINKS.contains(&name.as_str()) {
                    continue;
                }
                self.copy_link(&rel_entry)?;
                // `device` leads to the parent device (LUN, host, session): the library
                // follows it, so the copy must contain it.
                if name == "device" {
                    self.queue_target(&rel_entry);
                }
            } else if meta.is_dir() {
                if SKIP_DIRS.contains(&name.as_str()) {
                    continue;
                }
                // A child device directory reached on its own is copied once.
                if self.walked.contains(&rel_entry) && !self.queue.contains(&rel_entry) {
                    continue;
                }
                self.walked.insert(rel_entry.clone());
                self.queue.retain(|q| q != &rel_entry);
                self.walk(&rel_entry)?;
            } else if meta.is_file() {
                self.copy_attr(&rel_entry, meta.mode())?;
            }
        }
        Ok(())
    }

    fn copy_attr(&mut self, rel: &Path, mode: u32) -> Result<()> {
        let at = self.dest.join(rel);
        if mode & 0o444 == 0 {
            // Write-only (scan, delete, rescan): the file exists, its content means nothing.
            fs::write(&at, "")?;
            self.summary.files += 1;
            return Ok(());
        }
        match read_capped(&self.root.join(rel)) {
            Ok(Some(content)) => {
                self.summary.bytes += content.len() as u64;
                self.summary.files += 1;
                fs::write(&at, content)?;
            }
            Ok(None) => {} // larger than MAX_ATTR: not something the library reads
            Err(e) => {
                let errno = e.raw_os_error().map_or_else(|| e.to_string(), errno_name);
                self.unreadable.insert((rel.display().to_string(), errno));
            }
        }
        Ok(())
    }

    fn copy_file(&mut self, rel: &str) -> Result<()> {
        let at = self.dest.join(rel);
        fs::create_dir_all(at.parent().expect("has a parent"))?;
        fs::copy(self.root.join(rel), at)?;
        self.summary.files += 1;
        Ok(())
    }

    /// Links whose target was trimmed away would mislead the library: drop them.
    fn drop_dangling_links(&mut self) -> Result<()> {
        for rel in std::mem::take(&mut self.links) {
            let at = self.dest.join(&rel);
            if fs::metadata(&at).is_err() {
                fs::remove_file(&at)?;
                self.summary.dropped_links += 1;
                self.summary.links -= 1;
            }
        }
        Ok(())
    }
}

fn sorted_entries(dir: &Path) -> io::Result<Vec<String>> {
    let mut v: Vec<String> = fs::read_dir(dir)?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    v.sort();
    Ok(v)
}

/// Reads at most MAX_ATTR bytes; `None` if the attribute is larger.
fn read_capped(path: &Path) -> io::Result<Option<Vec<u8>>> {
    let mut buf = Vec::new();
    fs::File::open(path)?
        .take(MAX_ATTR + 1)
        .read_to_end(&mut buf)?;
    Ok((buf.len() as u64 <= MAX_ATTR).then_some(buf))
}

/// The errnos sysfs attributes fail with, by name (the number for anything else).
fn errno_name(n: i32) -> String {
    let name = match n {
        1 => "EPERM",
        2 => "ENOENT",
        5 => "EIO",
        6 => "ENXIO",
        11 => "EAGAIN",
        12 => "ENOMEM",
        13 => "EACCES",
        16 => "EBUSY",
        19 => "ENODEV",
        22 => "EINVAL",
        38 => "ENOSYS",
        61 => "ENODATA",
        95 => "EOPNOTSUPP",
        107 => "ENOTCONN",
        110 => "ETIMEDOUT",
        _ => return format!("errno{n}"),
    };
    name.to_owned()
}

fn write_readme(dest: &Path, note: &str, summary: &Summary) -> Result<()> {
    let kernel = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let note = if note.is_empty() {
        "(no scenario given)"
    } else {
        note
    };
    let text = format!(
        "# sysfs fixture tree\n\n\
         Captured from a real kernel ({kernel}) by `xtask capture-sysfs` \
         (xtask/src/capture.rs); regenerate with `cargo xtask fixtures`.\n\n\
         Scenario: {note}\n\n\
         Contents: the storage classes ({classes}), `sys/block`, `sys/dev/block`, \
         `sys/kernel/uevent_seqnum`, every `sys/devices/...` directory their links resolve to \
         (recursively, plus the targets of `device` links) and `proc/self/mountinfo`.\n\n\
         Trimmed: directories {dirs}; links {links}; attributes over {MAX_ATTR} bytes; links \
         left dangling by the trimming. Symlinks keep their relative sysfs targets, so the tree \
         resolves inside itself.\n\n\
         Write-only attributes (`scan`, `delete`, `rescan`, ...) are empty files. Attributes \
         that failed to read are not present; `.unreadable` lists them as `path ERRNO`.\n\n\
         Size: {summary}.\n",
        kernel = kernel.trim(),
        classes = CLASSES.join(", "),
        dirs = SKIP_DIRS.join(", "),
        links = SKIP_LINKS.join(", "),
    );
    fs::write(dest.join("README.md"), text)?;
    Ok(())
}

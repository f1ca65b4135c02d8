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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A scratch directory removed on drop.
    struct Scratch(PathBuf);
    impl Scratch {
        fn new(name: &str) -> Self {
            let p = std::env::temp_dir().join(format!("xtask-{name}-{}", std::process::id()));
            let _ = fs::remove_dir_all(&p);
            fs::create_dir_all(&p).unwrap();
            Self(p)
        }
    }
    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn put(root: &Path, rel: &str, content: &str) {
        let p = root.join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, content).unwrap();
    }

    fn link(root: &Path, rel: &str, target: &str) {
        let p = root.join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        symlink(target, p).unwrap();
    }

    #[test]
    fn copies_links_attributes_and_parents_and_trims() {
        let s = Scratch::new("capture");
        let (root, dest) = (s.0.join("root"), s.0.join("dest"));
        let lun = "sys/devices/platform/host6/session1/target6:0:0/6:0:0:0";
        put(&root, &format!("{lun}/vendor"), "LIO-ORG \n");
        put(&root, &format!("{lun}/delete"), "not readable in sysfs");
        fs::set_permissions(
            root.join(lun).join("delete"),
            fs::Permissions::from_mode(0o200),
        )
        .unwrap();
        put(&root, &format!("{lun}/power/control"), "auto\n");
        put(&root, &format!("{lun}/big"), &"x".repeat(5000));
        put(&root, &format!("{lun}/block/sda/size"), "32768\n");
        put(&root, &format!("{lun}/block/sda/queue/rotational"), "1\n");
        link(
            &root,
            &format!("{lun}/block/sda/device"),
            "../../../6:0:0:0",
        );
        link(
            &root,
            &format!("{lun}/block/sda/subsystem"),
            "../../../../../../../../class/block",
        );
        put(
            &root,
            "sys/devices/platform/host6/scsi_host/host6/proc_name",
            "iscsi_tcp\n",
        );
        link(
            &root,
            "sys/devices/platform/host6/scsi_host/host6/device",
            "../../../host6",
        );
        link(
            &root,
            "sys/class/block/sda",
            &format!("../../{}/block/sda", &lun[4..]),
        );
        link(
            &root,
            "sys/class/scsi_host/host6",
            "../../devices/platform/host6/scsi_host/host6",
        );
        link(
            &root,
            "sys/block/sda",
            &format!("../{}/block/sda", &lun[4..]),
        );
        put(&root, "sys/kernel/uevent_seqnum", "1234\n");
        put(
            &root,
            "proc/self/mountinfo",
            "22 1 0:21 / / rw - 9p root ro\n",
        );

        let summary = capture(&root, &dest, "unit test").unwrap();

        let sda = dest.join(lun).join("block/sda");
        assert_eq!(fs::read_to_string(sda.join("size")).unwrap(), "32768\n");
        assert_eq!(
            fs::read_link(dest.join("sys/block/sda")).unwrap(),
            fs::read_link(root.join("sys/block/sda")).unwrap()
        );
        assert!(
            fs::metadata(dest.join("sys/class/block/sda/device/vendor")).is_ok(),
            "device link resolves in the copy"
        );
        assert_eq!(
            fs::read_to_string(dest.join("sys/class/scsi_host/host6/proc_name")).unwrap(),
            "iscsi_tcp\n"
        );
        assert_eq!(
            fs::read_to_string(dest.join(lun).join("delete")).unwrap(),
            "",
            "write-only attribute is an empty file"
        );
        assert!(!dest.join(lun).join("power").exists(), "power/ is trimmed");
        assert!(!sda.join("queue").exists(), "queue/ is trimmed");
        assert!(
            fs::symlink_metadata(sda.join("subsystem")).is_err(),
            "subsystem link is trimmed"
        );
        assert!(
            !dest.join(lun).join("big").exists(),
            "attributes over 4 KiB are left out"
        );
        assert_eq!(
            fs::read_to_string(dest.join("sys/kernel/uevent_seqnum")).unwrap(),
            "1234\n"
        );
        assert!(dest.join("proc/self/mountinfo").is_file() && dest.join("README.md").is_file());
        assert_eq!(summary.dropped_links, 0);
        assert!(
            capture(&root, &dest, "again").is_err(),
            "refuses a non-empty destination"
        );
    }

    /// The committed trees must resolve inside themselves, or the library's fixture tests
    /// would read the host's /sys through a stray absolute or escaping link.
    #[test]
    fn committed_fixture_trees_resolve_inside_themselves() {
        for name in ["scsi-debug", "iscsi-multipath"] {
            let tree = crate::paths::root().join("tests/fixtures").join(name);
            let tree =
                fs::canonicalize(&tree).unwrap_or_else(|e| panic!("{}: {e}", tree.display()));
            let mut stack = vec![tree.clone()];
            let mut links = 0;
            while let Some(dir) = stack.pop() {
                for e in fs::read_dir(&dir).unwrap() {
                    let e = e.unwrap();
                    let ft = e.file_type().unwrap();
                    if ft.is_symlink() {
                        links += 1;
                        let to = fs::canonicalize(e.path())
                            .unwrap_or_else(|err| panic!("{} dangles: {err}", e.path().display()));
                        assert!(
                            to.starts_with(&tree),
                            "{} leaves the tree",
                            e.path().display()
                        );
                    } else if ft.is_dir() {
                        stack.push(e.path());
                    }
                }
            }
            assert!(links > 50, "{name}: only {links} links");
            let unreadable = fs::read_to_string(tree.join(".unreadable")).unwrap();
            for line in unreadable.lines() {
                let (path, errno) = line.rsplit_once(' ').expect("`path ERRNO`");
                assert!(errno.starts_with('E'), "{line}");
                assert!(
                    !tree.join(path).exists(),
                    "{path} is listed unreadable but exists"
                );
            }
        }
    }
}

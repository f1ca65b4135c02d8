//! The plugin's own leftovers, looked for by the background doctor ([`crate::doctor`])
//! beside lunkit's: what the plugin itself keeps and made, whose volume went away behind
//! its back.
//!
//! - **`stale-stage-record`**: a stage record whose volume is not on the node. The volume is
//!   looked for by its identity (as the Node service finds it: a SCSI volume's WWID, any path
//!   or map with it; an NVMe namespace by subsystem NQN and namespace identity), never by
//!   the kernel name the record caches. A record in phase staged counts at once; one in
//!   phase attaching only once it is older than a stage or an unstage may take (a call in
//!   progress, or one the CO is still retrying, keeps it so for a while on purpose). A
//!   record that holds no identity yet (a stage stopped before its scan, with no `wwid`
//!   attribute) cannot be looked for and is not counted. A staged filesystem volume whose
//!   device is on the node but whose staging path has nothing mounted (or another device)
//!   counts too: one mount-table lookup, in the table read for the publishes anyway.
//! - **`published-path-gone`**: a target path the record lists as published (each
//!   NodePublishVolume adds its path, each NodeUnpublishVolume removes it) whose mount's
//!   device is gone: a raw-block publish (a bind mount of the device node) whose node was
//!   deleted (the mount table shows its root as `/sdb//deleted`) or whose device number is
//!   no longer a block device of the node; a filesystem publish (a bind mount of the staging
//!   mount) whose filesystem's device number is no longer one. A path not mounted at all is
//!   not counted: nothing is there to hold.
//!
//! A volume with a call in progress is skipped: its devices and mounts are changing. Paths
//! kubelet gave (staging and target paths) are looked up as given in the plugin's mount
//! table, as the calls use them ([`crate::paths`]); devices under the root's `sys/`.
//!
//! Read only, like the rest of the doctor: the finding's text says what an operator does.

use std::path::Path;
use std::time::{Duration, SystemTime};

use lunkit::block::mountinfo::MountEntry;
use lunkit::{DevNum, Root};

use crate::error::Result;
use crate::state::{Access, Phase, Record, Store};

/// The kind of a stage record whose volume is not on the node.
pub const STALE_STAGE_RECORD: &str = "stale-stage-record";
/// The kind of a publish target path whose device is gone.
pub const PUBLISHED_PATH_GONE: &str = "published-path-gone";

/// One finding of the plugin's doctor: its kind, the objects it is about (comma-separated)
/// and why it is one, with what an operator does about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// [`STALE_STAGE_RECORD`], [`PUBLISHED_PATH_GONE`], or one of `lunkit doctor`'s kinds.
    pub kind: &'static str,
    /// What it is about: the volume id and a path; a finding of lunkit's, kernel names.
    pub objects: String,
    /// Why, and what to do.
    pub why: String,
}

/// Whether a record's volume is on the node, found by its identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Presence {
    /// Something of it is there; the device stage would hand out, when there is one.
    Here(Option<DevNum>),
    /// Nothing with its identity is there.
    Gone,
    /// The record holds no identity to look for.
    Unknown,
}

/// What is known of one record when it is classified.
#[derive(Debug, Clone, Copy)]
pub struct Seen<'a> {
    /// Where the record is (for the operator's text).
    pub file: &'a Path,
    /// When it was last written.
    pub written: Option<SystemTime>,
    /// Now.
    pub now: SystemTime,
    /// How long a call may leave a record in phase attaching.
    pub settle: Duration,
    /// Its volume found by identity.
    pub presence: Presence,
    /// The topmost mount at its staging path.
    pub staging: Option<&'a MountEntry>,
}

/// The `stale-stage-record` finding of `record`, if it is one.
pub fn stale_record(record: &Record, seen: &Seen<'_>) -> Option<Found> {
    let id = &record.volume_id;
    let staging = record.staging_path.display();
    let file = seen.file.display();
    let forget = format!(
        "NodeUnstageVolume of {id} at {staging} takes out what is left and removes the record \
         (kubelet sends it once no pod on the node uses the volume); if kubelet no longer \
         knows the volume, check that nothing is mounted at {staging} and remove {file}"
    );
    let objects = format!("{id},{staging}");
    let found = |why: String| {
        Some(Found {
            kind: STALE_STAGE_RECORD,
            objects: objects.clone(),
            why,
        })
    };
    let identity = record.known_wwid().map_or_else(
        || record.target.describe(),
        |w| format!("{} (WWID {w})", record.target.describe()),
    );
    match record.phase {
        Phase::Staged => match seen.presence {
            Presence::Gone => found(format!(
                "volume {id} is staged (record {file}), but nothing of {identity} is on the \
                 node: its pods get I/O errors; {forget}"
            )),
            Presence::Here(dev) if matches!(record.access, Access::Mount { .. }) => {
                match (seen.staging, dev) {
                    (None, _) => found(format!(
                        "volume {id} is staged (record {file}) and {identity} is on the node, \
                         but nothing is mounted at its staging path {staging}: a publish of it \
                         fails until it is staged again; restart its pods (kubelet stages \
                         before it publishes), or {forget}"
                    )),
                    (Some(m), Some(d)) if m.dev != d => found(format!(
                        "volume {id} is staged (record {file}), but {staging} has device {} \
                         mounted, not the volume's {d}: look at what mounted it; {forget}",
                        m.dev
                    )),
                    _ => None,
                }
            }
            Presence::Here(_) | Presence::Unknown => None,
        },
        Phase::Attaching => {
            let age = seen
                .written
                .and_then(|w| seen.now.duration_since(w).ok())
                .unwrap_or_default();
            (seen.presence == Presence::Gone && age > seen.settle).then(|| Found {
                kind: STALE_STAGE_RECORD,
                objects: objects.clone(),
                why: format!(
                    "volume {id}: a stage or unstage stopped half way {}s ago (record {file} \
                     in phase attaching), and nothing of {identity} is on the node; {forget}",
                    age.as_secs()
                ),
            })
        }
    }
}

/// Whether the mount's root is a file that was deleted (`/sdb//deleted`): the kernel shows
/// an unlinked mount root so in the mount table.
fn deleted(m: &MountEntry) -> bool {
    use std::os::unix::ffi::OsStrExt;
    m.root.as_os_str().as_bytes().ends_with(b"//deleted")
}

/// The `published-path-gone` finding of `target`, one of `record`'s published paths, if it
/// is one. `mount` is the topmost mount at it; `rdev`, for a bind of a device node, the
/// number of the node bound (through the mount, deleted or not); `present` whether a
/// device number is a block device of the node now.
pub fn published_gone(
    record: &Record,
    target: &Path,
    mount: Option<&MountEntry>,
    rdev: Option<DevNum>,
    present: &dyn Fn(DevNum) -> bool,
) -> Option<Found> {
    let m = mount?;
    let id = &record.volume_id;
    let what = match m.device_node() {
        Some(node) if deleted(m) => format!(
            "a bind mount of the device node /dev{} that was deleted",
            node.display().to_string().trim_end_matches("//deleted")
        ),
        Some(node) => match rdev {
            Some(d) if !present(d) => format!(
                "a bind mount of the device node /dev{} whose device {d} is no longer on the node",
                node.display()
            ),
            _ => return None,
        },
        // An anonymous device (major 0: tmpfs, overlay) is not a block device at all.
        None if m.dev.major != 0 && !present(m.dev) => format!(
            "a mount of device {}, which is no longer on the node",
            m.dev
        ),
        None => return None,
    };
    Some(Found {
        kind: PUBLISHED_PATH_GONE,
        objects: format!("{id},{}", target.display()),
        why: format!(
            "volume {id} is published at {}, {what}: the pod using it gets I/O errors; the \
             plugin leaves it: delete the pod (kubelet then unpublishes the path), or unmount \
             it by hand",
            target.display()
        ),
    })
}

/// The topmost mount at `path` in `table`.
fn topmost<'a>(table: &'a [MountEntry], path: &Path) -> Option<&'a MountEntry> {
    let want = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    table.iter().rev().find(|m| m.mount_point == want)
}

/// Whether `dev` is a block device of the node under `root` now (`sys/dev/block/M:m`).
pub fn block_device_present(root: &Root, dev: DevNum) -> bool {
    root.sys(format!("dev/block/{}:{}", dev.major, dev.minor))
        .exists()
}

/// One examination of the records in `store` against the node under `root` and `table`
/// (the plugin's mount table), skipping the volumes `busy` says have a call in progress.
///
/// # Errors
///
/// The state directory could not be listed, or a volume's devices could not be read.
pub fn examine(
    root: &Root,
    store: &Store,
    table: &[MountEntry],
    settle: Duration,
    busy: &dyn Fn(&str) -> bool,
) -> Result<Vec<Found>> {
    let now = SystemTime::now();
    let present = |d| block_device_present(root, d);
    let mut out = Vec::new();
    for (record, written) in store.all_dated()? {
        if busy(&record.volume_id) {
            continue;
        }
        let file = store.path(&record.volume_id);
        let seen = Seen {
            file: &file,
            written,
            now,
            settle,
            presence: crate::node::presence(root, &record)?,
            staging: topmost(table, &record.staging_path),
        };
        out.extend(stale_record(&record, &seen));
        for target in &record.published {
            let mount = topmost(table, target);
            let rdev = mount
                .filter(|m| m.device_node().is_some())
                .and_then(|_| crate::node::rdev_of(target));
            out.extend(published_gone(&record, target, mount, rdev, &present));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{RECORD_VERSION, Target};
    use lunkit::block::mountinfo::parse;

    const WWID: &str = "36001405a1b2c3d4e5f60718293a4b5c6";

    fn record(id: &str, access: Access) -> Record {
        Record {
            version: RECORD_VERSION,
            volume_id: id.into(),
            staging_path: format!("/var/lib/kubelet/plugins/staging/{id}").into(),
            phase: Phase::Staged,
            target: Target::Iscsi {
                iqn: "iqn.2003-01.org.linux-iscsi.lunkit:lab".into(),
                portals: vec!["127.0.0.1:3260".into()],
                iface: None,
                lun: 0,
                discovered: Vec::new(),
                fence: None,
            },
            access,
            wwid: Some(WWID.into()),
            expected_wwid: None,
            device: Some("/dev/sdb".into()),
            map: false,
            published: Vec::new(),
        }
    }

    fn ext4() -> Access {
        Access::Mount {
            fs_type: "ext4".into(),
        }
    }

    /// A mount table as the kernel writes it: the staging mount of `sdb` (8:16), a
    /// filesystem publish of it, a raw-block publish of `sdc` whose node was deleted, one of
    /// `sdd` still there, and a tmpfs.
    const MOUNTINFO: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
30 22 8:16 / /var/lib/kubelet/plugins/staging/pv-fs rw,relatime shared:10 - ext4 /dev/sdb rw
31 22 8:16 / /var/lib/kubelet/pods/p1/volumes/kubernetes.io~csi/pv-fs/mount rw,relatime shared:10 - ext4 /dev/sdb rw
32 22 0:5 /sdc//deleted /var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices/publish/pv-blk/p2 rw,nosuid shared:2 - devtmpfs udev rw,size=1000k
33 22 0:5 /sdd /var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices/publish/pv-ok/p3 rw,nosuid shared:2 - devtmpfs udev rw,size=1000k
34 22 0:40 / /var/lib/kubelet/pods/p4/volumes/kubernetes.io~csi/pv-tmp/mount rw shared:3 - tmpfs tmpfs rw
";

    fn table() -> Vec<MountEntry> {
        parse(MOUNTINFO.as_bytes()).unwrap()
    }

    fn at<'a>(t: &'a [MountEntry], p: &str) -> Option<&'a MountEntry> {
        topmost(t, Path::new(p))
    }

    fn seen<'a>(presence: Presence, staging: Option<&'a MountEntry>) -> Seen<'a> {
        Seen {
            file: Path::new("/var/lib/lunkit-csi/volumes/pv-1.json"),
            written: Some(SystemTime::UNIX_EPOCH + Duration::from_secs(1000)),
            now: SystemTime::UNIX_EPOCH + Duration::from_secs(1060),
            settle: Duration::from_secs(120),
            presence,
            staging,
        }
    }

    #[test]
    fn a_staged_record_whose_volume_is_gone_is_stale_and_says_how_to_forget_it() {
        let r = record("pv-1", Access::Block);
        let f = stale_record(&r, &seen(Presence::Gone, None)).expect("stale");
        assert_eq!(f.kind, STALE_STAGE_RECORD);
        assert_eq!(f.objects, "pv-1,/var/lib/kubelet/plugins/staging/pv-1");
        for part in [WWID, "NodeUnstageVolume", "pv-1.json", "nothing of iSCSI"] {
            assert!(f.why.contains(part), "{part} in {}", f.why);
        }
        // A block volume there, or one whose identity is not known, is not.
        let here = seen(
            Presence::Here(Some(DevNum {
                major: 8,
                minor: 16,
            })),
            None,
        );
        assert_eq!(stale_record(&r, &here), None);
        assert_eq!(stale_record(&r, &seen(Presence::Unknown, None)), None);
    }

    #[test]
    fn an_attaching_record_is_stale_only_once_older_than_a_call_may_take() {
        let mut r = record("pv-1", Access::Block);
        r.phase = Phase::Attaching;
        let mut s = seen(Presence::Gone, None);
        assert_eq!(stale_record(&r, &s), None, "60 s old: a call may still run");
        s.now = SystemTime::UNIX_EPOCH + Duration::from_secs(1000 + 121);
        let f = stale_record(&r, &s).expect("stuck");
        assert!(f.why.contains("121s ago"), "{}", f.why);
        // Its volume (partly) there: a stage the CO retries, not a stale record.
        s.presence = Presence::Here(None);
        assert_eq!(stale_record(&r, &s), None);
        // No time known: not stale, rather than stale at once.
        s.presence = Presence::Gone;
        s.written = None;
        assert_eq!(stale_record(&r, &s), None);
    }

    #[test]
    fn a_staged_filesystem_with_its_staging_path_unmounted_or_another_device_is_stale() {
        let t = table();
        let r = record("pv-fs", ext4());
        let sdb = Presence::Here(Some(DevNum {
            major: 8,
            minor: 16,
        }));
        let staging = at(&t, "/var/lib/kubelet/plugins/staging/pv-fs");
        assert!(staging.is_some());
        assert_eq!(stale_record(&r, &seen(sdb, staging)), None);
        let f = stale_record(&r, &seen(sdb, None)).expect("not mounted");
        assert!(f.why.contains("nothing is mounted at"), "{}", f.why);
        let sdc = Presence::Here(Some(DevNum {
            major: 8,
            minor: 32,
        }));
        let f = stale_record(&r, &seen(sdc, staging)).expect("another device");
        assert!(
            f.why.contains("8:16 mounted, not the volume's 8:32"),
            "{}",
            f.why
        );
        // The device not known (a map-staged volume with only paths): no comparison.
        assert_eq!(stale_record(&r, &seen(Presence::Here(None), staging)), None);
    }

    #[test]
    fn publishes_of_a_deleted_node_or_a_gone_device_are_found_and_live_ones_are_not() {
        let t = table();
        let gone = |d: DevNum| {
            d != DevNum {
                major: 8,
                minor: 16,
            } && d.major != 8
        };
        let present = |d: DevNum| !gone(d);
        // Raw block: the node deleted, whatever the numbers say.
        let blk = record("pv-blk", Access::Block);
        let p = "/var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices/publish/pv-blk/p2";
        let f = published_gone(&blk, Path::new(p), at(&t, p), None, &present).expect("gone");
        assert_eq!(f.kind, PUBLISHED_PATH_GONE);
        assert_eq!(f.objects, format!("pv-blk,{p}"));
        assert!(f.why.contains("/dev/sdc that was deleted"), "{}", f.why);
        // Raw block, the node there: by the bound node's number.
        let ok = "/var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices/publish/pv-ok/p3";
        let sdd = Some(DevNum {
            major: 8,
            minor: 48,
        });
        assert_eq!(
            published_gone(&blk, Path::new(ok), at(&t, ok), sdd, &present),
            None
        );
        let nothing = |_| false;
        let f = published_gone(&blk, Path::new(ok), at(&t, ok), sdd, &nothing).expect("gone");
        assert!(f.why.contains("device 8:48 is no longer"), "{}", f.why);
        // Filesystem: the publish's filesystem's device.
        let fs = record("pv-fs", ext4());
        let p = "/var/lib/kubelet/pods/p1/volumes/kubernetes.io~csi/pv-fs/mount";
        assert_eq!(
            published_gone(&fs, Path::new(p), at(&t, p), None, &present),
            None
        );
        let f = published_gone(&fs, Path::new(p), at(&t, p), None, &nothing).expect("gone");
        assert!(
            f.why.contains("device 8:16, which is no longer"),
            "{}",
            f.why
        );
        assert!(f.why.contains("delete the pod"), "{}", f.why);
        // Not mounted, or an anonymous filesystem: nothing to say.
        let p = "/var/lib/kubelet/pods/p9/volumes/kubernetes.io~csi/pv-fs/mount";
        assert_eq!(
            published_gone(&fs, Path::new(p), at(&t, p), None, &nothing),
            None
        );
        let p = "/var/lib/kubelet/pods/p4/volumes/kubernetes.io~csi/pv-tmp/mount";
        assert_eq!(
            published_gone(&fs, Path::new(p), at(&t, p), None, &nothing),
            None
        );
    }

    #[test]
    fn an_examination_reads_the_records_and_skips_busy_volumes() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        // A fixture root with no SCSI device at all: every volume with a WWID is gone.
        let root = dir.path().join("root");
        for d in [
            "sys/class/scsi_device",
            "sys/block",
            "sys/dev/block",
            "sys/class/block",
        ] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        let root = Root::new(&root);
        let t = table();
        let mut blk = record("pv-blk", Access::Block);
        blk.published = vec![
            "/var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices/publish/pv-blk/p2".into(),
        ];
        store.save(&blk).unwrap();
        let mut unknown = record("pv-new", Access::Block);
        unknown.wwid = None;
        unknown.phase = Phase::Attaching;
        store.save(&unknown).unwrap();
        let found = examine(&root, &store, &t, Duration::from_secs(120), &|_| false).unwrap();
        let kinds: Vec<_> = found.iter().map(|f| (f.kind, f.objects.as_str())).collect();
        assert_eq!(
            kinds,
            [
                (
                    STALE_STAGE_RECORD,
                    "pv-blk,/var/lib/kubelet/plugins/staging/pv-blk"
                ),
                (
                    PUBLISHED_PATH_GONE,
                    "pv-blk,/var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices/publish/pv-blk/p2"
                ),
            ],
            "{found:#?}"
        );
        let busy = examine(&root, &store, &t, Duration::from_secs(120), &|id| {
            id == "pv-blk"
        });
        assert_eq!(busy.unwrap(), []);
    }
}

//! `/sys/block`: disks, their partitions, and the device-mapper devices among them.

use std::path::{Path, PathBuf};

use crate::error::Result;
use crate::id::Hctl;
use crate::root::Root;
use crate::sysfs::{Confine, ObjectId, attr, attr_parse, entries, real_dir, sub_entries};

pub use crate::id::DevNum;

/// A whole disk under `/sys/block` (SCSI disk, dm device, loop, NVMe namespace...).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockDevice {
    /// Kernel name: `sda`, `dm-0`, `nvme0n1`.
    pub name: String,
    /// Its device number.
    pub dev: Option<DevNum>,
    /// Size in bytes (`size` counts 512-byte sectors whatever the logical block size).
    pub size_bytes: Option<u64>,
    /// Whether the kernel marks it read-only (`ro`).
    pub read_only: Option<bool>,
    /// Devices stacked on top of it (`holders/`): dm maps, md arrays.
    pub holders: Vec<String>,
    /// Devices it is stacked on (`slaves/`): a dm map's paths.
    pub slaves: Vec<String>,
    /// Its partitions (`sda1`...).
    pub partitions: Vec<String>,
    /// Device-mapper details, when it is a dm device.
    pub dm: Option<DmInfo>,
}

/// What `/sys/block/dm-N/dm/` says about a device-mapper device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DmInfo {
    /// The map's name (`/dev/mapper/<name>`).
    pub name: Option<String>,
    /// The map's uuid: `mpath-<wwid>` for multipath maps, `partN-mpath-<wwid>` for their
    /// partition maps; absent when none was set.
    pub uuid: Option<String>,
    /// Whether the map is suspended.
    pub suspended: Option<bool>,
}

/// Reads every disk under `/sys/block`, in natural name order.
pub fn devices(root: &Root) -> Result<Vec<BlockDevice>> {
    let top = root.sys("block");
    let confine = Confine::new(root);
    let mut out = Vec::new();
    for name in entries(&top)? {
        // An entry whose symlink leads outside the root is not this root's device.
        if let Some(dir) = confine.dir(&top.join(&name)) {
            out.push(read(&dir, &name)?);
        }
    }
    Ok(out)
}

/// Reads one disk by kernel name. The name must be a single path component.
pub fn device(root: &Root, name: &str) -> Result<Option<BlockDevice>> {
    crate::sysfs::check_component("block device name", name)?;
    let path = root.sys("block").join(name);
    if !path.exists() {
        return Ok(None);
    }
    match Confine::new(root).dir(&path) {
        Some(dir) => read(&dir, name).map(Some),
        None => Ok(None),
    }
}

/// Reads the disk `name` from its directory `dir` (resolved and confined to the root).
fn read(dir: &Path, name: &str) -> Result<BlockDevice> {
    let partitions = partitions_in(dir, name)?;
    let dm = real_dir(&dir.join("dm")).then(|| {
        let d = dir.join("dm");
        DmInfo {
            name: attr(&d, "name"),
            uuid: attr(&d, "uuid"),
            suspended: attr_parse::<u8>(&d, "suspended").map(|v| v != 0),
        }
    });
    Ok(BlockDevice {
        name: name.to_owned(),
        dev: attr_parse(dir, "dev"),
        size_bytes: attr_parse::<u64>(dir, "size").and_then(|s| s.checked_mul(512)),
        read_only: attr_parse::<u8>(dir, "ro").map(|v| v != 0),
        holders: sub_entries(dir, "holders")?,
        slaves: sub_entries(dir, "slaves")?,
        partitions,
        dm,
    })
}

/// The partitions of disk `name` in its directory `dir`: subdirectories named after the
/// disk with a `partition` attribute. Partitions are real subdirectories; `holders`, `bdi`,
/// `device` and the like are not, and a symlink is not followed out of the disk.
fn partitions_in(dir: &Path, name: &str) -> Result<Vec<String>> {
    Ok(entries(dir)?
        .into_iter()
        .filter(|sub| {
            let sub_dir = dir.join(sub);
            sub.starts_with(name) && real_dir(&sub_dir) && sub_dir.join("partition").exists()
        })
        .collect())
}

// One attribute or listing each, for the workflows: they ask one thing of one device, often
// in a loop, where reading the whole [`BlockDevice`] would cost a dozen files. Names come from
// sysfs listings or went through `check_component`.

/// `/sys/class/block/<name>`: every disk and partition, where `/sys/block` has disks only.
fn class_dir(root: &Root, name: &str) -> PathBuf {
    root.sys("class/block").join(name)
}

/// `/sys/dev/block/<M:m>`: the device the kernel numbers `dev` now.
fn number_dir(root: &Root, dev: DevNum) -> PathBuf {
    root.sys(format!("dev/block/{dev}"))
}

/// The device-mapper devices under `/sys/block` (`dm-N`), by kernel name.
pub(crate) fn dm_names(root: &Root) -> Result<Vec<String>> {
    Ok(entries(&root.sys("block"))?
        .into_iter()
        .filter(|n| n.starts_with("dm-"))
        .collect())
}

/// The names under `/sys/class/block`: disks and partitions.
pub(crate) fn names(root: &Root) -> Result<Vec<String>> {
    entries(&root.sys("class/block"))
}

/// `<name>/dev`: the device number, `None` when the device is gone.
pub(crate) fn number(root: &Root, name: &str) -> Option<DevNum> {
    attr_parse(&class_dir(root, name), "dev")
}

/// `<name>/holders/`: what is stacked on the device (dm maps, md arrays, LVM).
pub(crate) fn holders(root: &Root, name: &str) -> Result<Vec<String>> {
    sub_entries(&class_dir(root, name), "holders")
}

/// `<name>/slaves/`: what the device is stacked on (a dm map's paths).
pub(crate) fn slaves(root: &Root, name: &str) -> Result<Vec<String>> {
    sub_entries(&class_dir(root, name), "slaves")
}

/// The partitions of disk `name` (`sda1`...).
pub(crate) fn partitions(root: &Root, name: &str) -> Result<Vec<String>> {
    partitions_in(&class_dir(root, name), name)
}

/// `<name>/size` in bytes: the attribute counts 512-byte sectors whatever the logical block
/// size. The kernel updates it as soon as it learns a new capacity (`set_capacity`), before
/// the `change` uevent that announces it.
pub(crate) fn size_bytes(root: &Root, name: &str) -> Option<u64> {
    attr_parse::<u64>(&class_dir(root, name), "size").and_then(|s| s.checked_mul(512))
}

/// [`size_bytes`], or [`Error::NotFound`](crate::Error::NotFound) naming the device.
pub(crate) fn size_of(root: &Root, name: &str) -> crate::Result<u64> {
    size_bytes(root, name).ok_or_else(|| crate::Error::NotFound {
        what: format!("block device {name} not found (no size in sysfs)"),
    })
}

/// Whether `name` is a partition (`<name>/partition` exists).
pub(crate) fn is_partition(root: &Root, name: &str) -> bool {
    class_dir(root, name).join("partition").exists()
}

/// The disk that partition `name` belongs to: the parent of its resolved directory, if that
/// stays below the root.
pub(crate) fn disk_of_partition(root: &Root, name: &str) -> Option<String> {
    let real = crate::sysfs::resolve(root, &class_dir(root, name))?;
    crate::sysfs::file_name(real.parent()?).map(str::to_owned)
}

/// The SCSI address of disk `name`: its `device` link leads to the scsi_device, named
/// H:C:T:L. `None` for partitions, dm devices and disks of other buses.
pub(crate) fn scsi_address(root: &Root, name: &str) -> Option<Hctl> {
    crate::sysfs::resolve(root, &class_dir(root, name).join("device"))
        .as_deref()
        .and_then(crate::sysfs::file_name)
        .and_then(|n| n.parse().ok())
}

/// Whether `name` is a device-mapper device (it has a `dm/` directory).
pub(crate) fn is_dm(root: &Root, name: &str) -> bool {
    class_dir(root, name).join("dm").exists()
}

/// `<name>/dm/name`: a dm device's map name.
pub(crate) fn dm_name(root: &Root, name: &str) -> Option<String> {
    attr(&class_dir(root, name).join("dm"), "name")
}

/// `<name>/dm/uuid`: a dm device's uuid, `None` when it has none or is no dm device.
pub(crate) fn dm_uuid(root: &Root, name: &str) -> Option<String> {
    attr(&class_dir(root, name).join("dm"), "uuid")
}

/// `<name>/loop/backing_file`: the file bound to loop device `name`, as the kernel's
/// `d_path` prints it; `None` when nothing is bound (the `loop/` directory is absent).
pub(crate) fn loop_backing_file(root: &Root, name: &str) -> Option<String> {
    attr(&class_dir(root, name).join("loop"), "backing_file")
}

/// The kernel name of the device numbered `dev` (`/sys/dev/block/M:m` resolved), `None` when
/// the kernel has none or its link leads outside the root.
pub(crate) fn name_of_number(root: &Root, dev: DevNum) -> Option<String> {
    let real = crate::sysfs::resolve(root, &number_dir(root, dev))?;
    crate::sysfs::file_name(&real).map(str::to_owned)
}

/// Whether the kernel has a device numbered `dev`.
pub(crate) fn number_exists(root: &Root, dev: DevNum) -> bool {
    number_dir(root, dev).exists()
}

/// Whether the device numbered `dev` is a device-mapper device.
pub(crate) fn number_is_dm(root: &Root, dev: DevNum) -> bool {
    number_dir(root, dev).join("dm").is_dir()
}

/// The holders of the device numbered `dev`.
pub(crate) fn holders_of_number(root: &Root, dev: DevNum) -> Result<Vec<String>> {
    entries(&number_dir(root, dev).join("holders"))
}

/// The sysfs object the device numbered `dev` is now ([`ObjectId`]): a number is reused by
/// the next device created, the object is not.
pub(crate) fn object_of_number(root: &Root, dev: DevNum) -> Option<ObjectId> {
    crate::sysfs::object_id(&number_dir(root, dev))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On `/` the device directory is read through its `/sys/block/<name>` symlink, as it is
    /// not resolved there; elsewhere through the resolved directory. Both see the same disk.
    #[test]
    fn reads_a_disk_through_its_block_symlink_and_resolved() {
        let top = std::env::temp_dir().join(format!("lunkit-block-read-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&top);
        let disk = top.join("sys/devices/virtual/block/sdx");
        std::fs::create_dir_all(disk.join("sdx1")).unwrap();
        std::fs::create_dir_all(disk.join("holders/dm-3")).unwrap();
        std::fs::create_dir_all(top.join("sys/block")).unwrap();
        std::fs::write(disk.join("dev"), "8:96\n").unwrap();
        std::fs::write(disk.join("sdx1/partition"), "1\n").unwrap();
        std::os::unix::fs::symlink("../devices/virtual/block/sdx", top.join("sys/block/sdx"))
            .unwrap();
        let through_link = read(&top.join("sys/block/sdx"), "sdx").unwrap();
        let resolved = device(&Root::new(&top), "sdx").unwrap().unwrap();
        std::fs::remove_dir_all(&top).unwrap();
        assert_eq!(through_link.partitions, ["sdx1"]);
        assert_eq!(through_link.holders, ["dm-3"]);
        assert_eq!(
            through_link.dev,
            Some(DevNum {
                major: 8,
                minor: 96
            })
        );
        assert_eq!(through_link, resolved);
    }

    /// The narrow queries read the class directory of a disk, its partitions and its dm
    /// holder the way the kernel lays them out: class links into `/sys/devices`, partitions
    /// as subdirectories of their disk, and the disk's `device` link to its scsi_device.
    #[test]
    fn queries_follow_the_class_links() {
        let top = std::env::temp_dir().join(format!("lunkit-block-query-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&top);
        let scsi = top.join("sys/devices/platform/host7/target7:0:0/7:0:0:3");
        let disk = scsi.join("block/sdx");
        let dm = top.join("sys/devices/virtual/block/dm-4");
        std::fs::create_dir_all(disk.join("sdx1")).unwrap();
        std::fs::create_dir_all(disk.join("holders/dm-4")).unwrap();
        std::fs::create_dir_all(dm.join("dm")).unwrap();
        std::fs::create_dir_all(dm.join("slaves/sdx")).unwrap();
        std::fs::create_dir_all(top.join("sys/class/block")).unwrap();
        std::fs::write(disk.join("dev"), "8:96\n").unwrap();
        std::fs::write(disk.join("sdx1/partition"), "1\n").unwrap();
        std::fs::write(dm.join("dm/uuid"), "mpath-3600a\n").unwrap();
        std::fs::write(dm.join("dm/name"), "mpathe\n").unwrap();
        let link = |to: &str, name: &str| {
            std::os::unix::fs::symlink(to, top.join("sys/class/block").join(name)).unwrap()
        };
        link(
            "../../devices/platform/host7/target7:0:0/7:0:0:3/block/sdx",
            "sdx",
        );
        link(
            "../../devices/platform/host7/target7:0:0/7:0:0:3/block/sdx/sdx1",
            "sdx1",
        );
        link("../../devices/virtual/block/dm-4", "dm-4");
        std::os::unix::fs::symlink("../../../7:0:0:3", disk.join("device")).unwrap();
        let root = Root::new(&top);

        let seen = (
            partitions(&root, "sdx").unwrap(),
            is_partition(&root, "sdx1"),
            is_partition(&root, "sdx"),
            disk_of_partition(&root, "sdx1"),
            scsi_address(&root, "sdx"),
            scsi_address(&root, "dm-4"),
            number(&root, "sdx"),
            holders(&root, "sdx").unwrap(),
            slaves(&root, "dm-4").unwrap(),
            (is_dm(&root, "dm-4"), is_dm(&root, "sdx")),
            (
                dm_uuid(&root, "dm-4"),
                dm_name(&root, "dm-4"),
                dm_uuid(&root, "sdx"),
            ),
        );
        std::fs::remove_dir_all(&top).unwrap();
        assert_eq!(seen.0, ["sdx1"]);
        assert!(seen.1 && !seen.2);
        assert_eq!(seen.3.as_deref(), Some("sdx"));
        assert_eq!(seen.4, Some("7:0:0:3".parse().unwrap()));
        assert_eq!(seen.5, None);
        assert_eq!(
            seen.6,
            Some(DevNum {
                major: 8,
                minor: 96
            })
        );
        assert_eq!(seen.7, ["dm-4"]);
        assert_eq!(seen.8, ["sdx"]);
        assert_eq!(seen.9, (true, false));
        assert_eq!(
            seen.10,
            (Some("mpath-3600a".into()), Some("mpathe".into()), None)
        );
    }

    #[test]
    fn devnum_parses() {
        assert_eq!(
            "8:16".parse::<DevNum>().unwrap(),
            DevNum {
                major: 8,
                minor: 16
            }
        );
        assert_eq!(
            DevNum {
                major: 253,
                minor: 0
            }
            .to_string(),
            "253:0"
        );
        for bad in ["", "8", "8:", ":1", "8:1:2", "a:b", "-1:0", "8: 1"] {
            assert!(bad.parse::<DevNum>().is_err(), "{bad}");
        }
    }
}

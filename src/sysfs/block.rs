//! `/sys/block`: disks, their partitions, and the device-mapper devices among them.

use std::path::Path;

use super::{Confine, attr, attr_parse, entries, real_dir, sub_entries};
use crate::error::Result;
use crate::root::Root;

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
    super::check_component("block device name", name)?;
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
    let mut partitions = Vec::new();
    for sub in entries(dir)? {
        // Partitions are real subdirectories; `holders`, `bdi`, `device` and the like are not.
        let sub_dir = dir.join(&sub);
        if sub.starts_with(name) && real_dir(&sub_dir) && sub_dir.join("partition").exists() {
            partitions.push(sub);
        }
    }
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

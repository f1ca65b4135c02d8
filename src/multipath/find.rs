//! Finding multipath maps: by name, dm-N, node or WWID, with their uuids and partition maps.

use crate::dm::{Control, DevId, DeviceInfo, Target};
use crate::error::{Error, Result};
use crate::id::DevNum;
use crate::id::Wwid;
use crate::root::Root;

use super::table::Table;
pub use crate::id::mpath::{UUID_PREFIX, is_partition_uuid, map_or_partition_uuid_wwid, uuid_wwid};

/// A multipath map: a device-mapper device with uuid `mpath-<wwid>` and one `multipath`
/// target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Map {
    /// What device-mapper says about it.
    pub info: DeviceInfo,
    /// The WWID from its uuid, multipath form (`36001405…`).
    pub wwid: String,
    /// Its table.
    pub table: Table,
    /// Length of the map in sectors.
    pub sectors: u64,
}

impl Map {
    /// The map name.
    pub fn name(&self) -> &str {
        &self.info.name
    }

    /// `name (dm-N)`, for messages.
    pub(super) fn label(&self) -> String {
        format!("{} ({})", self.info.name, self.info.kernel_name())
    }
}

/// Reads the map `id` and checks it is a multipath map; `Ok(None)` if no such device.
pub fn read_map(ctl: &Control, id: &DevId<'_>) -> Result<Option<Map>> {
    let info = match ctl.info(id) {
        Ok(i) => i,
        Err(e) if e.is_gone() => return Ok(None),
        Err(e) => return Err(e),
    };
    let not_mpath = |reason| Error::Invalid {
        kind: "multipath map",
        input: info.name.clone(),
        reason,
    };
    let wwid = info
        .uuid
        .as_deref()
        .and_then(uuid_wwid)
        .ok_or_else(|| not_mpath("not a multipath map: its uuid does not start with mpath-"))?
        .to_owned();
    // Ask by name from now on: the number could be reused if the map went away meanwhile.
    let by_name = DevId::Name(&info.name);
    let table = match ctl.table(&by_name) {
        Ok(t) => t,
        Err(e) if e.is_gone() => return Ok(None),
        Err(e) => return Err(e),
    };
    let [t] = table.as_slice() else {
        return Err(not_mpath(
            "not a multipath map: its table is not one target",
        ));
    };
    if t.target_type != "multipath" {
        return Err(not_mpath(
            "not a multipath map: its target is not multipath",
        ));
    }
    Ok(Some(Map {
        wwid,
        table: Table::parse(&t.params)?,
        sectors: t.length,
        info,
    }))
}

/// Finds a multipath map from what a user typed: a map name, a WWID (either form), `dm-N`,
/// `/dev/dm-N`, `/dev/mapper/NAME`, or a path device `/dev/sdX` (the map holding it).
///
/// A `/dev` path is resolved by `stat` to its device number and then through
/// `/sys/dev/block/M:m`: the string is never spliced into a sysfs path. `/dev/...` is taken
/// below `root`. No such map is [`Error::NotFound`].
pub fn find(ctl: &Control, root: &Root, spec: &str) -> Result<Map> {
    let not_found = || Error::NotFound {
        what: format!("multipath map {spec} not found"),
    };
    if spec.starts_with('/') {
        // Resolved below the root, symlinks included; a node that is gone is no map.
        let dev = crate::block::resolve(root, spec)?
            .ok_or_else(not_found)?
            .dev;
        if is_dm(root, dev) {
            return read_map(ctl, &DevId::Dev(dev))?.ok_or_else(not_found);
        }
        // A path device: the multipath map stacked on it.
        let holders = crate::block::sysfs::holders_of_number(root, dev)?;
        for h in holders {
            // A holder that is not a multipath map (LVM, a partition map) is skipped.
            if let Some(d) = dm_kernel_name_dev(root, &h)? {
                if let Ok(Some(m)) = read_map(ctl, &DevId::Dev(d)) {
                    return Ok(m);
                }
            }
        }
        return Err(not_found());
    }
    if let Some(dev) = dm_kernel_name_dev(root, spec)? {
        return read_map(ctl, &DevId::Dev(dev))?.ok_or_else(not_found);
    }
    if crate::dm::buffer::check_name(spec).is_ok() {
        if let Some(m) = read_map(ctl, &DevId::Name(spec))? {
            return Ok(m);
        }
    }
    if let Ok(wwid) = spec.parse::<Wwid>() {
        let uuid = format!("{UUID_PREFIX}{}", wwid.to_multipath());
        if crate::dm::buffer::check_uuid(&uuid).is_ok() {
            if let Some(m) = read_map(ctl, &DevId::Uuid(&uuid))? {
                return Ok(m);
            }
        }
    }
    Err(not_found())
}

/// `dm-N` → the device number in `/sys/block/dm-N/dev`; `None` if `name` is not `dm-<digits>`
/// or no such device exists.
fn dm_kernel_name_dev(root: &Root, name: &str) -> Result<Option<DevNum>> {
    let Some(n) = name.strip_prefix("dm-") else {
        return Ok(None);
    };
    if crate::id::decimal::<u32>(n).is_none() {
        return Ok(None);
    }
    Ok(crate::block::sysfs::number(root, name))
}

fn is_dm(root: &Root, dev: DevNum) -> bool {
    crate::block::sysfs::number_is_dm(root, dev)
}

/// A partition map of a multipath map (what kpartx creates): one `linear` target on the map,
/// uuid `part<N>-mpath-<wwid>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionMap {
    /// Its name.
    pub name: String,
    /// Its device number.
    pub dev: DevNum,
}

/// Whether a table is one `linear` target on `map_dev` (`<maj:min> <offset>`).
pub fn is_partition_table(table: &[Target], map_dev: DevNum) -> bool {
    let [t] = table else { return false };
    t.target_type == "linear"
        && t.params.split_ascii_whitespace().next() == Some(map_dev.to_string().as_str())
}

/// The partition maps on `map`, as multipath-tools' `do_foreach_partmaps` finds them.
pub fn partition_maps(ctl: &Control, map: &Map) -> Result<Vec<PartitionMap>> {
    let Some(map_uuid) = map.info.uuid.as_deref() else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for d in ctl.list()? {
        if !d
            .uuid
            .as_deref()
            .is_some_and(|u| is_partition_uuid(u, map_uuid))
        {
            continue;
        }
        match ctl.table(&DevId::Name(&d.name)) {
            Ok(t) if is_partition_table(&t, map.info.dev) => out.push(PartitionMap {
                name: d.name,
                dev: d.dev,
            }),
            Ok(_) => {}
            Err(e) if e.is_gone() => {}
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

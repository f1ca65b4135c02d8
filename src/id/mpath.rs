//! The uuids multipath-tools gives device-mapper maps: `mpath-<wwid>` for a multipath map,
//! `part<N>-mpath-<wwid>` for the partition maps kpartx makes on it.

/// The uuid prefix multipath-tools gives the maps it creates: `mpath-<wwid>`.
pub const UUID_PREFIX: &str = "mpath-";

/// The WWID in a multipath map's uuid (`mpath-<wwid>`), or `None` for any other uuid,
/// including a partition map's and a bare `mpath-`.
pub fn uuid_wwid(uuid: &str) -> Option<&str> {
    uuid.strip_prefix(UUID_PREFIX).filter(|w| !w.is_empty())
}

/// The WWID in the uuid of a multipath map or of one of its partition maps
/// (`part<N>-mpath-<wwid>`, as kpartx names them), or `None` for any other uuid.
pub fn map_or_partition_uuid_wwid(uuid: &str) -> Option<&str> {
    uuid_wwid(uuid).or_else(|| partition_parent(uuid).and_then(uuid_wwid))
}

/// The uuid of the map a partition map's uuid (`part<N>-<map uuid>`) names, or `None`.
fn partition_parent(uuid: &str) -> Option<&str> {
    let (n, parent) = uuid.strip_prefix("part")?.split_once('-')?;
    crate::id::decimal::<u32>(n).map(|_| parent)
}

/// Whether `uuid` is `part<digits>-<map_uuid>`.
pub fn is_partition_uuid(uuid: &str, map_uuid: &str) -> bool {
    partition_parent(uuid) == Some(map_uuid)
}

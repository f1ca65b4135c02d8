//! Which devices on the node make up one volume.
//!
//! A volume is named the way a caller knows it (a device, an address, a WWID, a target and
//! LUN). [`identify`](super::identify::identify) turns that into a stable identity, its WWID and the SCSI addresses the
//! caller pointed at, once; [`locate`] then finds what of the volume exists right now, from
//! sysfs only: every scsi_device with that WWID (every session, every host), the devices at
//! the addresses, and the multipath maps over them. `/dev/disk/by-*` links are never used:
//! they are udev's, and stale after a failed cleanup.

use std::collections::HashMap;
use std::fmt;
use std::time::{Duration, Instant};

use crate::block::sysfs as sysblock;
use crate::block::{self, BlockNode};
use crate::error::{Error, Result};
use crate::id::Hctl;
use crate::id::Wwid;
use crate::multipath::{self, UUID_PREFIX};
use crate::root::Root;
use crate::scsi::sysfs::{self as sysscsi, ScsiState};
use crate::scsi::{self, PathIdentity};

use crate::ops::report::MapDevice;
use crate::ops::spec::Identity;

/// One path of the volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumePath {
    /// Its SCSI address.
    pub hctl: Hctl,
    /// Its disk, if `sd` has one for it.
    pub disk: Option<BlockNode>,
    /// The scsi_device state (`running`, `offline`, `transport-offline`, `blocked`...).
    pub state: Option<ScsiState>,
    /// Which device it was when found: its delete goes ahead only while the address still
    /// holds this one (a LUN re-mapped and scanned again meanwhile is left alone).
    pub identity: PathIdentity,
}

impl fmt::Display for VolumePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.disk {
            Some(d) => write!(f, "{} ({})", self.hctl, d.name),
            None => write!(f, "{}", self.hctl),
        }
    }
}

/// A multipath map that holds a path of a volume but is not that volume's alone: its uuid
/// names another WWID (multipathd grouped the path in before the array re-mapped its LUN),
/// or its paths report more than one WWID. Such a map serves two volumes' blocks under one
/// device; taking it down, or its other paths, as part of either volume would take from the
/// other, so it is reported and never taken down by a volume's detach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForeignMap {
    /// The map name (`mpatha`).
    pub name: String,
    /// Its block device (`dm-0`).
    pub node: BlockNode,
    /// The WWID its uuid names (`mpath-<wwid>`), multipath form.
    pub wwid: Option<String>,
    /// Its path devices (kernel names) and the WWID each reports (`None`: not readable, or
    /// not a SCSI disk).
    pub paths: Vec<(String, Option<Wwid>)>,
}

impl fmt::Display for ForeignMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "map {} ({}", self.name, self.node.name)?;
        if let Some(w) = &self.wwid {
            write!(f, ", named for WWID {w}")?;
        }
        f.write_str(") over ")?;
        let paths: Vec<String> = self
            .paths
            .iter()
            .map(|(p, w)| match w {
                Some(w) => format!("{p} reporting {}", w.to_multipath()),
                None => format!("{p} reporting no WWID"),
            })
            .collect();
        f.write_str(&paths.join(", "))
    }
}

/// What of a volume is on the node now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VolumeState {
    /// Its multipath maps (normally at most one): maps whose uuid names its WWID and whose
    /// paths report no other WWID.
    pub maps: Vec<MapDevice>,
    /// Multipath maps holding a path of it that are not its alone (see [`ForeignMap`]).
    /// Neither they nor their other paths are in `maps` and `paths`; a detach or resize
    /// refuses while there is one.
    pub foreign_maps: Vec<ForeignMap>,
    /// Its paths.
    pub paths: Vec<VolumePath>,
    /// Devices at the named addresses that are not provably this volume: another WWID (the
    /// LUN number was reused), or none readable while the volume has one. They are left
    /// alone, unless the volume's own map holds them.
    pub strangers: Vec<Hctl>,
}

impl VolumeState {
    /// Nothing of the volume is left: no map, no path, and no map that mixes it with
    /// another volume.
    pub fn is_empty(&self) -> bool {
        self.maps.is_empty() && self.paths.is_empty() && self.foreign_maps.is_empty()
    }

    /// [`Error::Busy`] naming every map that mixes the volume with another one, or `Ok` when
    /// there is none. `volume` names the volume for the message.
    pub fn refuse_foreign_maps(&self, volume: &str) -> Result<()> {
        if self.foreign_maps.is_empty() {
            return Ok(());
        }
        let maps: Vec<String> = self.foreign_maps.iter().map(ToString::to_string).collect();
        Err(Error::Busy {
            device: volume.to_owned(),
            reason: format!(
                "a multipath map holding its paths is not its alone: {}. Such a map serves \
                 another volume's blocks too (a LUN re-mapped under it), and is never taken \
                 down as part of one volume; take the odd path out of it, or the map down by \
                 hand once neither volume uses it",
                maps.join("; ")
            ),
            usage: None,
        })
    }

    /// The volume's own dm devices: its maps and their partition maps.
    pub fn own_dm(&self) -> Vec<String> {
        let mut v = Vec::new();
        for m in &self.maps {
            v.push(m.node.name.clone());
            v.extend(m.partitions.iter().cloned());
        }
        v
    }

    /// What is left, for messages: `mpatha (dm-0), 7:0:0:1 (sdc)`.
    pub fn describe(&self) -> String {
        let mut v: Vec<String> = self
            .maps
            .iter()
            .map(|m| format!("map {} ({})", m.name, m.node.name))
            .collect();
        v.extend(self.paths.iter().map(|p| format!("path {p}")));
        v.extend(self.foreign_maps.iter().map(|m| format!("foreign {m}")));
        v.join(", ")
    }
}

/// How long [`locate`] waits at most for another lookup's read of every device's WWID,
/// which it shares (see [`locate_until`]).
pub const LOCATE_WAIT: Duration = Duration::from_secs(30);

/// What of the volume `id` is on the node now: [`locate_until`] with [`LOCATE_WAIT`].
pub fn locate(root: &Root, id: &Identity) -> Result<VolumeState> {
    locate_until(root, id, Instant::now() + LOCATE_WAIT)
}

/// What of the volume `id` is on the node now.
///
/// Finding its paths by WWID reads every SCSI device's WWID. Lookups of this process that
/// overlap in time (a node drain detaching tens of volumes at once) share that read: each
/// takes the first one that started after it asked, so it is as fresh as a read of its own.
/// Waiting for another lookup's read ends at `deadline` with [`Error::Timeout`].
pub fn locate_until(root: &Root, id: &Identity, deadline: Instant) -> Result<VolumeState> {
    let mut read = Reads::new(root);
    let mut state = VolumeState::default();
    let mut hctls = named_paths(&mut read, id, &mut state.strangers)?;
    if let Some(want) = &id.wwid {
        for (h, wwid) in scsi::wwids(root, deadline)?.iter() {
            if wwid.as_ref() == Some(want) {
                hctls.push(*h);
            }
        }
    }
    let (named, mut foreign) = maps_over(&mut read, id, &hctls)?;
    for dm in named {
        match named_map(&mut read, id, &dm)? {
            Named::Gone => {}
            Named::Mixed => foreign.push(dm),
            Named::Own(map, paths) => {
                hctls.extend(paths);
                state.maps.push(map);
            }
        }
    }
    for dm in foreign {
        if let Some(map) = foreign_map(&mut read, &dm)? {
            state.foreign_maps.push(map);
        }
    }
    hctls.sort();
    hctls.dedup();
    state.strangers.retain(|h| !hctls.contains(h));
    for h in hctls {
        if let Some(p) = volume_path(&mut read, h)? {
            state.paths.push(p);
        }
    }
    Ok(state)
}

/// The devices at the addresses the caller named that are the volume's (or any, for a
/// volume whose WWID is not known); the others go to `strangers`.
fn named_paths(
    read: &mut Reads<'_>,
    id: &Identity,
    strangers: &mut Vec<Hctl>,
) -> Result<Vec<Hctl>> {
    let mut hctls = Vec::new();
    for &h in &id.addresses {
        if !sysscsi::exists(read.root, h) {
            continue;
        }
        match (&id.wwid, read.wwid(h)) {
            (Some(want), Some(have)) if *want == have => hctls.push(h),
            // A device without a readable WWID at an address of a volume that has one may be
            // anything (another LUN scanned there, its VPD read failing): never counted in.
            // If it is a path of the volume's map, the map brings it in below.
            (Some(_), _) => strangers.push(h),
            (None, _) => hctls.push(h),
        }
    }
    Ok(hctls)
}

/// The dm devices whose uuid names the volume's WWID, and the other multipath maps over one
/// of `hctls`.
///
/// A map is the volume's only when its uuid names the volume's WWID (`mpath-<wwid>`) and
/// none of its paths reports another ([`named_map`]). Any other multipath map over one of the
/// paths, and a map named for the volume that also holds another volume's path, is foreign:
/// reported, never taken as the volume's, and its paths not counted in.
fn maps_over(
    read: &mut Reads<'_>,
    id: &Identity,
    hctls: &[Hctl],
) -> Result<(Vec<String>, Vec<String>)> {
    let root = read.root;
    let uuid = id
        .wwid
        .as_ref()
        .map(|w| format!("{UUID_PREFIX}{}", w.to_multipath()));
    let mut named: Vec<String> = Vec::new();
    for b in sysblock::dm_names(root)? {
        let u = read.uuid(&b);
        if u.is_some() && u == uuid {
            named.push(b);
        }
    }
    let mut foreign: Vec<String> = Vec::new();
    for &h in hctls {
        if let Some(disk) = read.disk(h)? {
            for holder in sysblock::holders(root, &disk.name)? {
                let mpath = read
                    .uuid(&holder)
                    .is_some_and(|u| multipath::uuid_wwid(&u).is_some());
                if mpath && !named.contains(&holder) && !foreign.contains(&holder) {
                    foreign.push(holder);
                }
            }
        }
    }
    Ok((named, foreign))
}

/// What a map named for the volume turned out to be.
enum Named {
    /// No longer on the node.
    Gone,
    /// A path of it reports another WWID: it mixes two volumes.
    Mixed,
    /// The volume's map, with the addresses of its paths.
    Own(MapDevice, Vec<Hctl>),
}

/// The map `dm`, whose uuid names the volume's WWID. A path whose WWID cannot be read is
/// still the map's: the map proves it is the volume's path. One that reports another WWID
/// proves the map mixes two volumes.
fn named_map(read: &mut Reads<'_>, id: &Identity, dm: &str) -> Result<Named> {
    let root = read.root;
    let Some(node) = block::by_name(root, dm)? else {
        return Ok(Named::Gone);
    };
    let slaves = map_paths(read, dm)?;
    if slaves.iter().any(|s| s.wwid.is_some() && s.wwid != id.wwid) {
        return Ok(Named::Mixed);
    }
    let map_uuid = read.uuid(dm).unwrap_or_default();
    let mut partitions = Vec::new();
    for holder in sysblock::holders(root, dm)? {
        let hu = read.uuid(&holder);
        if hu.is_some_and(|u| multipath::is_partition_uuid(&u, &map_uuid)) {
            partitions.push(holder);
        }
    }
    let map = MapDevice {
        name: sysblock::dm_name(root, dm).unwrap_or_else(|| dm.to_owned()),
        node,
        partitions,
    };
    Ok(Named::Own(
        map,
        slaves.iter().filter_map(|s| s.hctl).collect(),
    ))
}

/// The foreign map `dm` with what each of its paths reports, if it is still on the node.
fn foreign_map(read: &mut Reads<'_>, dm: &str) -> Result<Option<ForeignMap>> {
    let root = read.root;
    let Some(node) = block::by_name(root, dm)? else {
        return Ok(None);
    };
    let wwid = read
        .uuid(dm)
        .and_then(|u| multipath::uuid_wwid(&u).map(str::to_owned));
    let paths = map_paths(read, dm)?
        .into_iter()
        .map(|s| (s.name, s.wwid))
        .collect();
    Ok(Some(ForeignMap {
        name: sysblock::dm_name(root, dm).unwrap_or_else(|| dm.to_owned()),
        node,
        wwid,
        paths,
    }))
}

/// The path at `h`, if a scsi_device is there.
fn volume_path(read: &mut Reads<'_>, h: Hctl) -> Result<Option<VolumePath>> {
    let root = read.root;
    if !sysscsi::exists(root, h) {
        return Ok(None);
    }
    // The identity takes the disk as its `block/` entry names it, even one whose device
    // number cannot be read (as `PathIdentity::of` would).
    let name = read.disk_name(h)?;
    let wwid = read.wwid(h);
    Ok(Some(VolumePath {
        hctl: h,
        identity: PathIdentity::with(root, h, name.as_deref(), wwid),
        disk: read.disk(h)?,
        state: sysscsi::state(root, h),
    }))
}

/// One path device of a map: its kernel name, and, for a SCSI disk, its address and WWID.
struct MapPath {
    name: String,
    hctl: Option<Hctl>,
    wwid: Option<Wwid>,
}

/// The path devices of map `dm` (its `slaves/`).
fn map_paths(read: &mut Reads<'_>, dm: &str) -> Result<Vec<MapPath>> {
    let root = read.root;
    let mut paths = Vec::new();
    for slave in sysblock::slaves(root, dm)? {
        let hctl = block::by_name(root, &slave)?.and_then(|n| block::scsi_address(root, &n));
        let wwid = hctl.and_then(|h| read.wwid(h));
        paths.push(MapPath {
            name: slave,
            hctl,
            wwid,
        });
    }
    Ok(paths)
}

/// What one [`locate`] has read, so that it reads each attribute once: a path's WWID and
/// disk, and a dm device's uuid, are asked for again on the way (by WWID, through the
/// holders, as a map's slave, for the path's identity). It all stands for one look at the
/// node, as if read at once.
struct Reads<'a> {
    root: &'a Root,
    wwids: HashMap<Hctl, Option<Wwid>>,
    disk_names: HashMap<Hctl, Option<String>>,
    disks: HashMap<Hctl, Option<BlockNode>>,
    uuids: HashMap<String, Option<String>>,
}

impl<'a> Reads<'a> {
    fn new(root: &'a Root) -> Reads<'a> {
        Reads {
            root,
            wwids: HashMap::new(),
            disk_names: HashMap::new(),
            disks: HashMap::new(),
            uuids: HashMap::new(),
        }
    }

    /// The WWID of the device at `h` ([`sysscsi::wwid`]).
    fn wwid(&mut self, h: Hctl) -> Option<Wwid> {
        let root = self.root;
        self.wwids
            .entry(h)
            .or_insert_with(|| sysscsi::wwid(root, h))
            .clone()
    }

    /// The kernel name of the disk of the device at `h`, its `block/` entry
    /// ([`sysscsi::disk`]).
    fn disk_name(&mut self, h: Hctl) -> Result<Option<String>> {
        if let Some(n) = self.disk_names.get(&h) {
            return Ok(n.clone());
        }
        let n = sysscsi::disk(self.root, h)?;
        self.disk_names.insert(h, n.clone());
        Ok(n)
    }

    /// The disk of the device at `h`, as [`block::of_scsi_device`] finds it.
    fn disk(&mut self, h: Hctl) -> Result<Option<BlockNode>> {
        if let Some(d) = self.disks.get(&h) {
            return Ok(d.clone());
        }
        let d = match self.disk_name(h)? {
            Some(name) => block::by_name(self.root, &name)?,
            None => None,
        };
        self.disks.insert(h, d.clone());
        Ok(d)
    }

    /// The dm uuid of block device `name` ([`sysblock::dm_uuid`]).
    fn uuid(&mut self, name: &str) -> Option<String> {
        if let Some(u) = self.uuids.get(name) {
            return u.clone();
        }
        let u = sysblock::dm_uuid(self.root, name);
        self.uuids.insert(name.to_owned(), u.clone());
        u
    }
}

/// A multipath map none of whose paths is a SCSI disk any more: every path was deleted or
/// logged out while the map stayed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrphanMap {
    /// The map name (`mpatha`).
    pub name: String,
    /// Its kernel name (`dm-0`).
    pub dm: String,
    /// The WWID in its uuid (`mpath-<wwid>`), multipath form.
    pub wwid: String,
}

impl fmt::Display for OrphanMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "map {} ({}, WWID {})", self.name, self.dm, self.wwid)
    }
}

/// Every multipath map on the node that has no SCSI disk below it (`slaves/` empty, or no
/// entry of it a disk with a SCSI address). Partition maps are not multipath maps.
pub fn orphan_maps(root: &Root) -> Result<Vec<OrphanMap>> {
    let mut orphans = Vec::new();
    for dm in sysblock::dm_names(root)? {
        let Some(wwid) =
            sysblock::dm_uuid(root, &dm).and_then(|u| multipath::uuid_wwid(&u).map(str::to_owned))
        else {
            continue;
        };
        let mut has_path = false;
        for slave in sysblock::slaves(root, &dm)? {
            if block::by_name(root, &slave)?
                .is_some_and(|n| block::scsi_address(root, &n).is_some())
            {
                has_path = true;
                break;
            }
        }
        if !has_path {
            orphans.push(OrphanMap {
                name: sysblock::dm_name(root, &dm).unwrap_or_else(|| dm.clone()),
                dm,
                wwid,
            });
        }
    }
    Ok(orphans)
}

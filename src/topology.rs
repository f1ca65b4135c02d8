//! One read-only snapshot of a node's storage: what `lsscsi`, `lsblk`, `multipath -ll` and
//! `iscsiadm -m session` show between them, read straight from sysfs.

use crate::block::sysfs::{self as block, BlockDevice, DevNum};
use crate::error::Result;
use crate::fc::sysfs::{self as fc, FcHost, FcRemotePort};
use crate::iscsi::sysfs::{self as iscsi, IscsiSession};
use crate::nvme::sysfs::{self as nvme, NvmeController, NvmeNamespace, NvmeSubsystem};
use crate::root::Root;
use crate::scsi::sysfs::{self as scsi, ScsiDevice, ScsiHost};
use crate::sysfs::natural_cmp;

/// The uuid prefix multipath-tools gives the maps it creates (the one definition is
/// [`crate::id::mpath::UUID_PREFIX`]).
pub use crate::multipath::UUID_PREFIX as MPATH_UUID_PREFIX;

/// Everything lunkit can see of the node's SCSI, iSCSI, FC, NVMe, block and dm state.
///
/// Read it with [`Topology::read`]; nothing here writes. The snapshot is not atomic: devices
/// can come and go while it is taken, and a device that vanishes mid-read shows up with its
/// attributes absent rather than failing the whole snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    /// SCSI hosts.
    pub scsi_hosts: Vec<ScsiHost>,
    /// SCSI devices, in H:C:T:L order.
    pub scsi_devices: Vec<ScsiDevice>,
    /// Whole block devices (dm devices included), in natural name order.
    pub block_devices: Vec<BlockDevice>,
    /// iSCSI sessions.
    pub iscsi_sessions: Vec<IscsiSession>,
    /// FC host ports.
    pub fc_hosts: Vec<FcHost>,
    /// FC remote ports.
    pub fc_rports: Vec<FcRemotePort>,
    /// NVMe controllers.
    pub nvme_controllers: Vec<NvmeController>,
    /// NVMe subsystems.
    pub nvme_subsystems: Vec<NvmeSubsystem>,
    /// NVMe namespace block devices (native-multipath heads with their paths).
    pub nvme_namespaces: Vec<NvmeNamespace>,
}

/// A device-mapper device, as seen in `/sys/block/dm-N`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DmDevice<'a> {
    /// The map's name.
    pub name: Option<&'a str>,
    /// `dm-N`.
    pub dm: &'a str,
    /// Device number.
    pub dev: Option<DevNum>,
    /// The map's uuid.
    pub uuid: Option<&'a str>,
    /// The devices the map sits on.
    pub slaves: &'a [String],
}

/// A dm-multipath map: a dm device whose uuid starts with `mpath-`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MultipathMap<'a> {
    /// The map's name (`mpatha`, or the WWID without user_friendly_names).
    pub name: Option<&'a str>,
    /// `dm-N`.
    pub dm: &'a str,
    /// Device number.
    pub dev: Option<DevNum>,
    /// `mpath-<wwid>`.
    pub uuid: &'a str,
    /// The WWID multipath groups paths by (`3` + NAA hex for an `naa.` sysfs wwid).
    pub wwid: &'a str,
    /// Its path devices (`sda`, `sdb`).
    pub paths: &'a [String],
    /// Its paths that report another WWID than the map's (multipath form), with that
    /// WWID: the array re-mapped a LUN under the map, which now serves two volumes' blocks.
    /// A path whose WWID cannot be read is not listed.
    pub foreign_paths: Vec<(&'a str, String)>,
}

impl Topology {
    /// Reads the whole topology below `root`.
    ///
    /// Fails with [`Error::NotFound`](crate::Error::NotFound) when the root has no `sys/`
    /// directory, so a mistyped `--root` is not mistaken for a node without storage.
    pub fn read(root: &Root) -> Result<Self> {
        crate::sysfs::require(root)?;
        Ok(Topology {
            scsi_hosts: scsi::hosts(root)?,
            scsi_devices: scsi::devices(root)?,
            block_devices: block::devices(root)?,
            iscsi_sessions: iscsi::sessions(root)?,
            fc_hosts: fc::hosts(root)?,
            fc_rports: fc::remote_ports(root)?,
            nvme_controllers: nvme::controllers(root)?,
            nvme_subsystems: nvme::subsystems(root)?,
            nvme_namespaces: nvme::namespaces(root)?,
        })
    }

    /// The device-mapper devices among the block devices.
    pub fn dm_devices(&self) -> impl Iterator<Item = DmDevice<'_>> {
        self.block_devices.iter().filter_map(|b| {
            let dm = b.dm.as_ref()?;
            Some(DmDevice {
                name: dm.name.as_deref(),
                dm: &b.name,
                dev: b.dev,
                uuid: dm.uuid.as_deref(),
                slaves: &b.slaves,
            })
        })
    }

    /// The multipath maps (not their partition maps), in natural order of their names.
    ///
    /// By name, not by `dm-N`: the kernel numbers maps in the order they happened to be
    /// created, which differs from one boot to the next when multipathd builds them in
    /// parallel, while the names are what an operator knows them by.
    pub fn multipath_maps(&self) -> impl Iterator<Item = MultipathMap<'_>> {
        let mut maps: Vec<MultipathMap<'_>> = self
            .dm_devices()
            .filter_map(|d| {
                let uuid = d.uuid?;
                let wwid = crate::multipath::uuid_wwid(uuid)?;
                Some(MultipathMap {
                    name: d.name,
                    dm: d.dm,
                    dev: d.dev,
                    uuid,
                    wwid,
                    paths: d.slaves,
                    foreign_paths: self.foreign_paths(wwid, d.slaves),
                })
            })
            .collect();
        maps.sort_by(|a, b| {
            natural_cmp(a.name.unwrap_or(a.dm), b.name.unwrap_or(b.dm))
                .then_with(|| natural_cmp(a.dm, b.dm))
        });
        maps.into_iter()
    }

    /// Those of `paths` whose SCSI device reports a WWID other than `wwid` (multipath
    /// form), with the WWID each reports.
    fn foreign_paths<'a>(&'a self, wwid: &str, paths: &'a [String]) -> Vec<(&'a str, String)> {
        paths
            .iter()
            .filter_map(|p| {
                let dev = self
                    .scsi_devices
                    .iter()
                    .find(|d| d.block.as_deref() == Some(p.as_str()))?;
                let reported = dev.wwid.as_deref()?.parse::<crate::Wwid>().ok()?;
                let reported = reported.to_multipath();
                (reported != wwid).then_some((p.as_str(), reported))
            })
            .collect()
    }

    /// The block device with this kernel name.
    pub fn block(&self, name: &str) -> Option<&BlockDevice> {
        self.block_devices.iter().find(|b| b.name == name)
    }

    /// The SCSI devices attached through `host`.
    pub fn devices_on_host(&self, host: u32) -> impl Iterator<Item = &ScsiDevice> {
        self.scsi_devices
            .iter()
            .filter(move |d| d.hctl.host == host)
    }
}

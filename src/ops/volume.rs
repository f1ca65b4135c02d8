//! Which devices on the node make up one volume.
//!
//! A volume is named the way a caller knows it (a device, an address, a WWID, a target and
//! LUN, an NVMe subsystem and namespace). [`identify`] turns that into a stable identity, its
//! WWID and the SCSI addresses the caller pointed at, once; [`locate`] then finds what of the
//! volume exists right now, from sysfs only: every scsi_device with that WWID (every session,
//! every host), the devices at the addresses, and the multipath maps over them.
//! `/dev/disk/by-*` links are never used: they are udev's, and stale after a failed cleanup.

pub use super::current::{NamespaceCheck, VolumeDevice, device, namespace_device};
pub use super::report::MapDevice;
pub use super::scsi::locate::{
    ForeignMap, LOCATE_WAIT, OrphanMap, VolumePath, VolumeState, locate, locate_until, orphan_maps,
};
pub use super::spec::{Identity, NamespaceSelector, VolumeSpec};

use crate::error::Result;
use crate::root::Root;

/// Turns what the caller named into the volume's identity. Reads sysfs only.
///
/// A device that does not exist gives an identity that matches nothing, so a second detach
/// of the same device succeeds as a no-op; a malformed one is
/// [`Error::Invalid`](crate::Error::Invalid). An NVMe namespace has no SCSI address: its
/// WWID is its device's, when one is on the node.
pub fn identify(root: &Root, spec: &VolumeSpec) -> Result<Identity> {
    match spec {
        VolumeSpec::Nvme { nqn, namespace } => super::nvme::identify(root, nqn, namespace),
        VolumeSpec::Device(_)
        | VolumeSpec::Wwid(_)
        | VolumeSpec::Iscsi { .. }
        | VolumeSpec::Fc { .. } => super::scsi::identify::identify(root, spec),
    }
}

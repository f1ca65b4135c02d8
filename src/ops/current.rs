//! A volume's device on the node now, found by its identity ([`device`]): what a plugin opens,
//! mounts or checks after a restart or a reboot, when the kernel names it recorded (`dm-3`,
//! `sdc`, `nvme0n1`) may already be another disk's.

use std::path::Path;

use super::report::MapDevice;
use super::scsi::locate::{ForeignMap, VolumePath};
use super::spec::{NamespaceSelector, VolumeSpec};
use crate::block::BlockNode;
use crate::error::Result;
use crate::id::{Nqn, Wwid};
use crate::root::Root;

/// What [`device`] found of a volume on the node.
///
/// Only [`Map`](VolumeDevice::Map), [`Path`](VolumeDevice::Path) and
/// [`Namespace`](VolumeDevice::Namespace) name one device to open; the other answers say why
/// there is none, so a caller never opens one path of a volume that has several by accident.
/// `#[non_exhaustive]`: a `match` outside this crate needs a `_` arm.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum VolumeDevice {
    /// The volume's dm-multipath map: its uuid names the volume's WWID and every path in it
    /// reports that WWID.
    Map(MapDevice),
    /// The volume's one SCSI path (and its disk); no map is over it.
    Path(BlockNode),
    /// The NVMe namespace's device: its native-multipath head, or with native multipath off,
    /// the one controller's namespace that has it.
    Namespace(BlockNode),
    /// SCSI paths of the volume and no map over them, and not exactly one path with a disk:
    /// several paths (multipathd has not built the map, or will not), or paths whose disk
    /// is not (yet) there. Which to open, if any, is the caller's choice.
    Paths(Vec<VolumePath>),
    /// Several namespace devices with the volume's identity and no head over them (native
    /// multipath off, several controllers): which to open is the caller's choice.
    Namespaces(Vec<BlockNode>),
    /// A multipath map holding a path of the volume is not its alone (its uuid names
    /// another WWID, or its paths report more than one): the volume is on the node, but no
    /// device of it is safe to open as the volume.
    Mixed(Vec<ForeignMap>),
    /// Nothing with the volume's identity is on the node.
    Absent,
}

impl VolumeDevice {
    /// The one device to open, when there is one ([`Map`](Self::Map), [`Path`](Self::Path),
    /// [`Namespace`](Self::Namespace)).
    pub fn node(&self) -> Option<&BlockNode> {
        match self {
            VolumeDevice::Map(m) => Some(&m.node),
            VolumeDevice::Path(n) | VolumeDevice::Namespace(n) => Some(n),
            _ => None,
        }
    }

    /// The node path of [`node`](Self::node) under the [`Root`] the look was given
    /// (`<root>/dev/dm-0`), as [`Attachment::device`](super::Attachment::device) gives it.
    pub fn path(&self) -> Option<&Path> {
        self.node().map(|n| n.path.as_path())
    }

    /// Whether anything of the volume is on the node (every answer but
    /// [`Absent`](Self::Absent)).
    pub fn is_present(&self) -> bool {
        !matches!(self, VolumeDevice::Absent)
    }
}

/// More that an NVMe namespace must show to be the volume, beyond the one selector of its
/// [`VolumeSpec::Nvme`]: a record that knows the namespace id and its UUID checks both.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NamespaceCheck {
    /// Further selectors the namespace must match too.
    pub also: Vec<NamespaceSelector>,
    /// Kernel WWIDs (sysfs `wwid`, in any of its forms: `uuid.…`, `eui.…`, `nvme.…`) the
    /// namespace must report, each one; compared without regard to case.
    pub wwids: Vec<String>,
}

/// The volume's device on the node now, found by its identity under `root`, from sysfs only.
/// Nothing is cached and no `/dev/disk/by-*` link is used: a SCSI volume's map and paths are
/// the ones whose WWID (read from each device) is the volume's; an NVMe namespace is the one of
/// the subsystem (its `subsysnqn`) that reports the selected id, NGUID, EUI-64 or UUID.
///
/// A SCSI volume named by a device, an address or a target and LUN is identified first
/// ([`identify`](super::volume::identify)); naming it by its WWID is the way to find it again
/// after a reboot. Reads only; never waits.
///
/// ```no_run
/// use lunkit::Root;
/// use lunkit::ops::volume::{self, VolumeDevice, VolumeSpec};
///
/// let root = Root::new("/host");
/// let spec = VolumeSpec::Wwid("36001405a1b2c3d4e5f60718293a4b5c6".parse()?);
/// match volume::device(&root, &spec)? {
///     VolumeDevice::Absent => println!("not on this node"),
///     found => match found.path() {
///         Some(p) => println!("open {}", p.display()),
///         None => println!("on the node, but no one device: {found:?}"),
///     },
/// }
/// # Ok::<(), lunkit::Error>(())
/// ```
pub fn device(root: &Root, spec: &VolumeSpec) -> Result<VolumeDevice> {
    match spec {
        VolumeSpec::Nvme { nqn, namespace } => {
            namespace_device(root, nqn, namespace, &NamespaceCheck::default())
        }
        _ => scsi_device(root, spec),
    }
}

/// [`device`] of the namespace of subsystem `nqn` that `selector` names and that shows all of
/// `check` too.
pub fn namespace_device(
    root: &Root,
    nqn: &Nqn,
    selector: &NamespaceSelector,
    check: &NamespaceCheck,
) -> Result<VolumeDevice> {
    let reports = |ns: &crate::nvme::sysfs::NvmeNamespace, want: &str| {
        ns.wwid.as_deref().is_some_and(|k| {
            k.eq_ignore_ascii_case(want)
                || matches!((k.parse::<Wwid>(), want.parse::<Wwid>()), (Ok(a), Ok(b)) if a == b)
        })
    };
    let mut found: Vec<BlockNode> = crate::nvme::namespace_devices(root, nqn)?
        .into_iter()
        .filter(|(ns, _)| {
            selector.matches(ns)
                && check.also.iter().all(|s| s.matches(ns))
                && check.wwids.iter().all(|w| reports(ns, w))
        })
        .map(|(_, d)| d.node)
        .collect();
    Ok(match found.len() {
        0 => VolumeDevice::Absent,
        1 => VolumeDevice::Namespace(found.remove(0)),
        _ => VolumeDevice::Namespaces(found),
    })
}

/// [`device`] of a SCSI volume: its map, else its one path.
fn scsi_device(root: &Root, spec: &VolumeSpec) -> Result<VolumeDevice> {
    let identity = super::volume::identify(root, spec)?;
    let mut state = super::volume::locate(root, &identity)?;
    // A volume has one map; a second one over the same WWID is multipathd's fault and the
    // first is as good as the other (both are checked to be the volume's alone).
    if !state.maps.is_empty() {
        return Ok(VolumeDevice::Map(state.maps.remove(0)));
    }
    if !state.foreign_maps.is_empty() {
        return Ok(VolumeDevice::Mixed(state.foreign_maps));
    }
    Ok(match state.paths.as_slice() {
        [] => VolumeDevice::Absent,
        [VolumePath { disk: Some(d), .. }] => VolumeDevice::Path(d.clone()),
        _ => VolumeDevice::Paths(state.paths),
    })
}

impl NamespaceSelector {
    /// The selector a kernel WWID of a namespace (sysfs `wwid`) stands for: `uuid.…` selects
    /// the UUID; `eui.…` with 32 hex digits the NGUID, with 16 the EUI-64; `nvme.…` (what the
    /// kernel makes up for a namespace that reports none of them: vendor, serial, model and
    /// namespace id) the namespace id it ends with, so check the whole WWID as well
    /// ([`NamespaceCheck::wwids`]). `None` for any other form.
    pub fn from_kernel_wwid(wwid: &str) -> Option<NamespaceSelector> {
        if let Some(u) = wwid.strip_prefix("uuid.") {
            return u.parse().ok().map(NamespaceSelector::Uuid);
        }
        if let Some(rest) = wwid.strip_prefix("nvme.") {
            // `nvme.%04x-%*phN-%*phN-%08x`: the id is the last group.
            let (_, nsid) = rest.rsplit_once('-')?;
            return (nsid.len() == 8)
                .then(|| u32::from_str_radix(nsid, 16).ok())
                .flatten()
                .map(NamespaceSelector::Id);
        }
        wwid.parse()
            .map(NamespaceSelector::Nguid)
            .or_else(|_| wwid.parse().map(NamespaceSelector::Eui64))
            .ok()
    }
}

//! An NVMe over Fabrics namespace as a volume: attach and detach of
//! [`VolumeSpec::Nvme`], reached through [`super::attach()`] and
//! [`super::detach()`] with the same options, locks, reports and exit codes as a SCSI LUN.
//!
//! **Attach** connects every portal given ([`NvmeAttachOptions::connect`](super::NvmeAttachOptions::connect))
//! and every TCP path of the subsystem that the discovery services given list
//! ([`NvmeAttachOptions::discover`](super::NvmeAttachOptions::discover), referrals followed),
//! where no controller is connected yet, all at once, then waits (uevents, with sysfs re-checks) until the
//! namespace's block device is there with a path through every live controller of the
//! subsystem. With native multipath (`CONFIG_NVME_MULTIPATH`, on in distribution kernels) that
//! device is the head `nvme<S>n<N>`; without it, each controller has its own. Its identity is
//! the kernel's `wwid` (NGUID, EUI-64 or UUID), checked against
//! [`ScanOptions::expect_wwid`](crate::ScanOptions::expect_wwid).
//!
//! The namespace is named by id or by NGUID ([`NamespaceSelector`]). Whichever it was, an
//! attach is remembered (the WWID hint, the "attached" mark) under its id as well, since the
//! id is what a detach of another namespace of the subsystem looks for.
//!
//! **Detach** checks that nothing uses the namespace ([`crate::block::usage`]: mounts in any
//! mount namespace, kubelet's loop devices and bind mounts, holders, open descriptors),
//! flushes it, and then deletes the subsystem's controllers (`delete_controller`) that no
//! other namespace still needs, side by side. A controller serves every namespace of its
//! subsystem at once and the host cannot drop one namespace from it, so while another
//! namespace of the subsystem is attached through lunkit (marked in the lock directory) or in use, the
//! controllers it goes through stay, and so does this namespace's device until the array
//! unmaps it: the report says so. A marked namespace that is not on the node at that moment
//! keeps every controller of the subsystem.
//!
//! With no controller live but one reconnecting (the target unreachable), I/O to the
//! namespace queues until a path comes back, and a writer's last close may be waiting there
//! where `/proc` no longer shows it: the detach waits for a path until its deadline, as for a
//! SCSI map no path can serve, and `force` takes the namespace away, failing what waits.
//! Attach and detach of one subsystem decide which controllers are needed under one lock
//! ([`subsystem_lock_key`]). A detach takes it before it looks at anything it decides on (is
//! the namespace still the one identified, is it in use, which namespaces are marked), and
//! holds it until the controllers are deleted or kept: a wait for the lock never leaves it
//! acting on what it saw before. A controller is deleted only while it is still the one that
//! was listed (same subsystem and controller id): its name may have been reused.

use std::path::Path;

use crate::error::{Error, Result};
use crate::id::{Nqn, Wwid};
pub use crate::nvme::NamespaceDevice;
use crate::nvme::sysfs::NvmeNamespace;
use crate::nvme::{self as fabrics_nvme};
use crate::root::Root;

use super::names;
use super::spec::{Identity, NamespaceSelector, VolumeSpec};

mod attach;
mod connects;
mod detach;
pub mod follow;
mod resize;

pub(super) use attach::attach;
pub(super) use detach::detach;
pub(super) use resize::resize;

/// The block devices of the selected namespace of subsystem `nqn` on the node: its
/// native-multipath head, or each controller's own device without native multipath. Empty
/// when it is not there.
pub fn namespace_devices(
    root: &Root,
    nqn: &Nqn,
    namespace: &NamespaceSelector,
) -> Result<Vec<NamespaceDevice>> {
    Ok(selected(root, nqn, namespace)?
        .into_iter()
        .map(|(_, d)| d)
        .collect())
}

/// [`namespace_devices`] with what sysfs says of each namespace (its id, for one).
fn selected(
    root: &Root,
    nqn: &Nqn,
    namespace: &NamespaceSelector,
) -> Result<Vec<(NvmeNamespace, NamespaceDevice)>> {
    Ok(fabrics_nvme::namespace_devices(root, nqn)?
        .into_iter()
        .filter(|(ns, _)| namespace.matches(ns))
        .collect())
}

/// The spec naming the namespace by its id, once the node has it: the name its hints and
/// marks are kept under, whether the caller named it by id or by NGUID, so that a detach of
/// another namespace of the subsystem sees it either way.
fn by_id(nqn: &Nqn, found: &[(NvmeNamespace, NamespaceDevice)]) -> Option<VolumeSpec> {
    let nsid = found.iter().find_map(|(ns, _)| ns.nsid)?;
    Some(VolumeSpec::Nvme {
        nqn: nqn.clone(),
        namespace: NamespaceSelector::Id(nsid),
    })
}

/// The lock of a namespace whose WWID is not known (nothing of it on the node).
pub(in crate::ops) fn lock_key(nqn: &Nqn, namespace: &NamespaceSelector) -> String {
    match namespace {
        NamespaceSelector::Id(nsid) => format!("nvme-{nqn}-ns-{nsid}"),
        NamespaceSelector::Nguid(g) => format!("nvme-{nqn}-nguid-{g}"),
        NamespaceSelector::Eui64(e) => format!("nvme-{nqn}-eui64-{e}"),
        NamespaceSelector::Uuid(u) => format!("nvme-{nqn}-uuid-{u}"),
    }
}

/// The lock key under which attach and detach of any namespace of subsystem `nqn` decide
/// which of its controllers are needed: an attach holds it from its connects until its
/// namespace is marked attached, a detach from before its in-use check until its controllers
/// are deleted or kept. [`super::lock::file_path`] names its file in a lock directory; whoever holds
/// an exclusive `flock(2)` on that file holds both off.
pub fn subsystem_lock_key(nqn: &Nqn) -> String {
    format!("nvme-subsys-{nqn}")
}

/// Namespace ids are 1 to 0xFFFFFFFE: 0 is none and 0xFFFFFFFF means every namespace. The
/// nil UUID and the all-zero NGUID and EUI-64 are what sysfs shows for a namespace that has
/// none: they name no namespace.
fn check_selector(namespace: &NamespaceSelector) -> Result<()> {
    let nsid = match *namespace {
        NamespaceSelector::Id(nsid) => nsid,
        NamespaceSelector::Uuid(u) if u.bytes() == [0; 16] => {
            return Err(Error::invalid(
                "namespace UUID",
                &u.to_string(),
                "the nil UUID names no namespace (sysfs shows it for one without a UUID)",
            ));
        }
        NamespaceSelector::Nguid(g) if g.bytes() == [0; 16] => {
            return Err(Error::invalid(
                "namespace NGUID",
                &g.to_string(),
                "the all-zero NGUID names no namespace (sysfs shows it for one without one)",
            ));
        }
        NamespaceSelector::Eui64(e) if e.bytes() == [0; 8] => {
            return Err(Error::invalid(
                "namespace EUI-64",
                &e.to_string(),
                "the all-zero EUI-64 names no namespace (sysfs shows it for one without one)",
            ));
        }
        NamespaceSelector::Nguid(_) | NamespaceSelector::Eui64(_) | NamespaceSelector::Uuid(_) => {
            return Ok(());
        }
    };
    if nsid == 0 || nsid == u32::MAX {
        return Err(Error::invalid(
            "namespace id",
            &nsid.to_string(),
            "must be 1 to 4294967294",
        ));
    }
    Ok(())
}

/// After a detach: the mark that `spec` is attached goes, and its name records holding
/// `wwid` are retired ([`names::retire`]).
fn unmark(dir: Option<&Path>, spec: &VolumeSpec, wwid: Option<&Wwid>) {
    // A stale mark keeps another namespace's detach from deleting controllers, never loses
    // data; failing to remove it (or to retire a record) does not fail the detach.
    if let Some(dir) = dir {
        let _ = names::unmark_attached(dir, spec);
        if let Some(w) = wwid {
            let _ = names::retire(dir, spec, w);
        }
    }
}

/// The identity of namespace `namespace` of subsystem `nqn`: no SCSI address, and the WWID
/// its device reports when one is on the node.
pub(in crate::ops) fn identify(
    root: &Root,
    nqn: &Nqn,
    namespace: &NamespaceSelector,
) -> Result<Identity> {
    Ok(Identity {
        wwid: namespace_devices(root, nqn, namespace)?
            .first()
            .and_then(|d| d.wwid.clone()),
        addresses: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_that_name_no_namespace_are_refused() {
        let nil = NamespaceSelector::Uuid("00000000-0000-0000-0000-000000000000".parse().unwrap());
        let zero = NamespaceSelector::Eui64("0000000000000000".parse().unwrap());
        let zero_nguid =
            NamespaceSelector::Nguid("00000000000000000000000000000000".parse().unwrap());
        for bad in [
            NamespaceSelector::Id(0),
            NamespaceSelector::Id(u32::MAX),
            nil,
            zero,
            zero_nguid,
        ] {
            let e = check_selector(&bad).unwrap_err();
            assert_eq!(e.kind(), crate::ErrorKind::Invalid, "{bad}: {e}");
        }
        let uuid = NamespaceSelector::Uuid("6c1d8a70-1c9e-4d5e-9a40-3b4c5d6e7f80".parse().unwrap());
        for good in [NamespaceSelector::Id(1), uuid] {
            check_selector(&good).unwrap();
        }
        let nqn: Nqn = "nqn.2014-08.org.example:a".parse().unwrap();
        assert_eq!(
            lock_key(&nqn, &uuid),
            "nvme-nqn.2014-08.org.example:a-uuid-6c1d8a70-1c9e-4d5e-9a40-3b4c5d6e7f80"
        );
    }
}

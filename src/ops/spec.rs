//! How a caller names a volume ([`VolumeSpec`]), whichever family it is of, and the identity
//! that name stands for ([`Identity`]).

use std::fmt;

use crate::id::{Eui64, Hctl, IscsiName, Nguid, Nqn, Uuid, Wwid, Wwn};

/// How a caller names a volume.
///
/// `#[non_exhaustive]`: another transport may be added without a major release; a `match`
/// outside this crate needs a `_` arm.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum VolumeSpec {
    /// A device: a `/dev` path (`/dev/sdc`, `/dev/mapper/mpatha`, `/dev/dm-0`, a by-id link),
    /// a kernel name (`sdc`, `dm-0`), a multipath map name, or an H:C:T:L.
    Device(String),
    /// The volume's WWID, in sysfs (`naa.…`) or multipath (`36…`) form.
    Wwid(Wwid),
    /// LUN `lun` of the iSCSI target `target`, on every session to it.
    Iscsi {
        /// The target's iSCSI name (`iqn.…`, `eui.…` or `naa.…`), parsed with
        /// `"iqn.2003-01.org.example:array".parse()?`.
        target: IscsiName,
        /// The LUN.
        lun: u64,
    },
    /// LUN `lun` of the FC target reached through the target ports `wwpns` (an array has one
    /// per controller port), through every local port that sees one of them.
    Fc {
        /// The target's port names; at least one (see [`crate::fc::check_target_ports`]).
        wwpns: Vec<Wwn>,
        /// The LUN.
        lun: u64,
    },
    /// A namespace of the NVMe subsystem `nqn`, through every controller of it (see
    /// [`crate::ops::nvme`]).
    Nvme {
        /// The subsystem NQN.
        nqn: Nqn,
        /// Which of its namespaces: by id, by NGUID, by EUI-64 or by UUID.
        namespace: NamespaceSelector,
    },
}

/// Which namespace of an NVMe subsystem a volume is.
///
/// The namespace id is what the array's mapping says (LUN-like, and reusable once a namespace
/// is deleted); the NGUID, the EUI-64 and the UUID are the namespace's own, globally unique
/// identity, so naming a volume by one of them can never reach another volume that took over
/// the id. They can only be matched once the namespace is on the node: until then, an attach
/// by one of them waits for a namespace of the subsystem that reports it. A namespace may
/// report any of the three, and sysfs shows each (`nguid`, `eui`, `uuid`) whichever of them
/// its `wwid` is made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NamespaceSelector {
    /// The namespace id (1 to 0xFFFFFFFE).
    Id(u32),
    /// The namespace's NGUID.
    Nguid(Nguid),
    /// The namespace's EUI-64 (sysfs `eui`). The all-zero one, which sysfs shows for a
    /// namespace without one, is refused.
    Eui64(Eui64),
    /// The namespace's UUID (its Namespace Identification Descriptor; sysfs `uuid`). A CSI
    /// volume handle often carries it. The nil UUID, which sysfs shows for a namespace
    /// without one, is refused.
    Uuid(Uuid),
}

impl NamespaceSelector {
    /// Whether the namespace sysfs shows as `ns` is the one selected. An NGUID, EUI-64 or
    /// UUID that sysfs does not report, or reports malformed, matches nothing; nor does an
    /// all-zero one, which is what sysfs shows for a namespace that has none.
    pub fn matches(&self, ns: &crate::nvme::sysfs::NvmeNamespace) -> bool {
        fn parsed<T: std::str::FromStr>(s: Option<&String>) -> Option<T> {
            s.and_then(|s| s.parse().ok())
        }
        match self {
            NamespaceSelector::Id(id) => ns.nsid == Some(*id),
            NamespaceSelector::Nguid(g) => {
                g.bytes() != [0; 16] && parsed::<Nguid>(ns.nguid.as_ref()) == Some(*g)
            }
            NamespaceSelector::Eui64(e) => {
                e.bytes() != [0; 8] && parsed::<Eui64>(ns.eui.as_ref()) == Some(*e)
            }
            NamespaceSelector::Uuid(u) => {
                u.bytes() != [0; 16] && parsed::<Uuid>(ns.uuid.as_ref()) == Some(*u)
            }
        }
    }
}

impl From<u32> for NamespaceSelector {
    fn from(nsid: u32) -> Self {
        NamespaceSelector::Id(nsid)
    }
}

impl From<Nguid> for NamespaceSelector {
    fn from(nguid: Nguid) -> Self {
        NamespaceSelector::Nguid(nguid)
    }
}

impl From<Eui64> for NamespaceSelector {
    fn from(eui: Eui64) -> Self {
        NamespaceSelector::Eui64(eui)
    }
}

impl From<Uuid> for NamespaceSelector {
    fn from(uuid: Uuid) -> Self {
        NamespaceSelector::Uuid(uuid)
    }
}

impl fmt::Display for NamespaceSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NamespaceSelector::Id(id) => write!(f, "namespace {id}"),
            NamespaceSelector::Nguid(g) => write!(f, "namespace NGUID {g}"),
            NamespaceSelector::Eui64(e) => write!(f, "namespace EUI-64 {e}"),
            NamespaceSelector::Uuid(u) => write!(f, "namespace UUID {u}"),
        }
    }
}

impl VolumeSpec {
    /// Whether this names the volume by where it is reached (a target and LUN), so that
    /// once its paths are gone, the name alone no longer tells its WWID.
    pub fn is_address(&self) -> bool {
        matches!(
            self,
            VolumeSpec::Iscsi { .. } | VolumeSpec::Fc { .. } | VolumeSpec::Nvme { .. }
        )
    }
}

impl fmt::Display for VolumeSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VolumeSpec::Device(d) => f.write_str(d),
            VolumeSpec::Wwid(w) => write!(f, "WWID {w}"),
            VolumeSpec::Iscsi { target, lun } => write!(f, "iSCSI {target} LUN {lun}"),
            VolumeSpec::Fc { wwpns, lun } => {
                write!(f, "FC {} LUN {lun}", crate::fc::list(wwpns))
            }
            VolumeSpec::Nvme { nqn, namespace } => write!(f, "NVMe {nqn} {namespace}"),
        }
    }
}

/// A volume's identity: what stays true about it while its devices come and go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// Its WWID, when the caller gave one or a device of it had one.
    pub wwid: Option<Wwid>,
    /// The SCSI addresses the caller named (directly, or through a target and LUN).
    pub addresses: Vec<Hctl>,
}

impl Identity {
    /// A name for the volume that two callers naming it differently agree on: the WWID
    /// (multipath form) when known, else its addresses.
    pub fn key(&self) -> String {
        match &self.wwid {
            Some(w) => w.to_multipath(),
            None => {
                let a: Vec<String> = self.addresses.iter().map(ToString::to_string).collect();
                format!("hctl-{}", a.join(","))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nvme::sysfs::NvmeNamespace;

    fn namespace(nsid: u32, nguid: Option<&str>, uuid: Option<&str>) -> NvmeNamespace {
        NvmeNamespace {
            name: format!("nvme0n{nsid}"),
            nsid: Some(nsid),
            wwid: None,
            uuid: uuid.map(str::to_owned),
            nguid: nguid.map(str::to_owned),
            eui: Some(format!("00 00 00 00 00 00 00 {nsid:02x}")),
            size_bytes: None,
            paths: Vec::new(),
        }
    }

    #[test]
    fn a_selector_matches_its_namespace_only() {
        let uuid = "6c1d8a70-1c9e-4d5e-9a40-3b4c5d6e7f80";
        let nguid = "0123456789abcdef0123456789abcdef";
        let ns = namespace(3, Some(nguid), Some(uuid));
        let other = namespace(4, Some("00000000000000000000000000000001"), None);
        let by_uuid = NamespaceSelector::Uuid(uuid.parse().unwrap());
        let by_nguid = NamespaceSelector::Nguid(nguid.parse().unwrap());
        let by_eui = NamespaceSelector::Eui64("0000000000000003".parse().unwrap());
        for s in [NamespaceSelector::Id(3), by_nguid, by_eui, by_uuid] {
            assert!(s.matches(&ns), "{s} should match {}", ns.name);
            assert!(!s.matches(&other), "{s} should not match {}", other.name);
        }
        // sysfs's UUID in upper case is the same UUID; a malformed one matches nothing.
        assert!(by_uuid.matches(&namespace(3, None, Some(&uuid.to_uppercase()))));
        assert!(!by_uuid.matches(&namespace(3, None, Some("not-a-uuid"))));
        assert_eq!(by_uuid.to_string(), format!("namespace UUID {uuid}"));
        assert_eq!(by_eui.to_string(), "namespace EUI-64 0000000000000003");
        // sysfs shows all zeros for an id a namespace does not report: a selector of zeros
        // names nothing, not every such namespace.
        let zeros = "00000000-0000-0000-0000-000000000000";
        let mut none = namespace(3, Some(zeros), Some(zeros));
        none.eui = Some("00 00 00 00 00 00 00 00".into());
        for s in [
            NamespaceSelector::Nguid(zeros.parse().unwrap()),
            NamespaceSelector::Eui64("0000000000000000".parse().unwrap()),
            NamespaceSelector::Uuid(zeros.parse().unwrap()),
        ] {
            assert!(!s.matches(&none), "{s}");
        }
    }
}

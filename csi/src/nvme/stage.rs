//! The NVMe steps of a stage and an unstage.

use std::time::Instant;

use lunkit::block::BlockNode;
use lunkit::ops::volume;
use lunkit::ops::{AttachOptions, DetachOptions, NamespaceSelector, VolumeSpec};

use super::{named_check, named_selector};
use crate::attrs::NvmeVolume;
use crate::error::{Error, Result};
use crate::log::{self, Level};
use crate::node::Inner;
use crate::node::device::{attach_recorded, detach_recorded, expected};
use crate::state::{Record, Target};

impl Inner {
    /// Brings an NVMe namespace onto the node through lunkit: connects every port, and
    /// every port the discovery addresses list (connect-all), and waits for the namespace's
    /// device, named by its nsid or, without one, by what the
    /// attributes say it is ([`named_selector`]). Records the nsid as soon as the attach
    /// says it, then checks the namespace is the one the attributes name. Returns its device.
    pub(crate) fn attach_nvme(
        &self,
        id: &str,
        vol: &NvmeVolume,
        record: &mut Record,
        deadline: Instant,
    ) -> Result<BlockNode> {
        let root = self.root();
        let what = format!("volume {id}: attach NVMe {}", vol.nqn);
        let host = self.nvme_host(&what, vol)?;
        let (uuid, wwid) = (vol.device_uuid.as_deref(), vol.device_wwid.as_deref());
        let namespace = match vol.nsid {
            Some(n) => NamespaceSelector::Id(n),
            None => named_selector(uuid, wwid).ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "{what}: neither nsid nor a deviceID lunkit can find the namespace by"
                ))
            })?,
        };
        let mut opts = AttachOptions::new(root);
        opts.scan.timeout = deadline.saturating_duration_since(Instant::now());
        opts.scan.expect_wwid = expected(vol.wwid.as_ref(), record)?;
        opts.nvme.connect = vol
            .portals
            .iter()
            .map(|p| lunkit::nvme::parse_portal(p))
            .collect::<lunkit::Result<_>>()
            .map_err(|e| Error::lunkit(what.clone(), e))?;
        opts.nvme.discover = vol
            .discovery
            .iter()
            .map(|a| lunkit::nvme::discovery::parse_address(a))
            .collect::<lunkit::Result<_>>()
            .map_err(|e| Error::lunkit(what.clone(), e))?;
        opts.nvme.host = host;
        opts.nvme.dhchap_secret.clone_from(&vol.auth.secret);
        opts.nvme
            .dhchap_ctrl_secret
            .clone_from(&vol.auth.ctrl_secret);
        let spec = VolumeSpec::Nvme {
            nqn: vol.nqn.clone(),
            namespace,
        };
        let what = format!("{what} {namespace}");
        let a = attach_recorded(root, &spec, &opts).map_err(|e| Error::lunkit(what.clone(), e))?;
        let nvme = a
            .nvme()
            .ok_or_else(|| Error::Internal(format!("{what}: not attached as NVMe")))?;
        let nsid = nvme
            .nsid
            .ok_or_else(|| Error::NotFound(format!("{what}: the namespace shows no id")))?;
        if let Target::Nvme { nsid: n, .. } = &mut record.target {
            *n = Some(nsid);
        }
        self.store.save(record)?;
        let device = nvme
            .devices
            .first()
            .cloned()
            .ok_or_else(|| Error::NotFound(format!("{what}: no device came")))?;
        if uuid.is_some() || wwid.is_some() {
            let named = match named_check(uuid, wwid, None) {
                Some(check) => {
                    volume::namespace_device(root, &vol.nqn, &NamespaceSelector::Id(nsid), &check)
                        .map_err(|e| Error::lunkit(what.clone(), e))?
                        .is_present()
                }
                None => false,
            };
            if !named {
                let found = lunkit::nvme::namespace_devices(root, &vol.nqn)
                    .map_err(|e| Error::lunkit(what.clone(), e))?
                    .into_iter()
                    .find(|(ns, _)| ns.nsid == Some(nsid))
                    .map(|(ns, _)| ns);
                let said =
                    |v: Option<&String>| v.map_or_else(|| "not reported".to_owned(), Clone::clone);
                return Err(Error::FailedPrecondition(format!(
                    "{what}: the namespace reports UUID {} and identity {}, not the {} the \
                     volume attributes name",
                    said(found.as_ref().and_then(|n| n.uuid.as_ref())),
                    said(found.as_ref().and_then(|n| n.wwid.as_ref())),
                    uuid.or(wwid).unwrap_or_default()
                )));
            }
        }
        record.wwid = a.wwid.map(|w| w.to_string());
        self.record_device(record, &device, false)?;
        Ok(device)
    }

    /// The host identity a volume's connects present: the node's (`None`: lunkit reads
    /// `/etc/nvme` under the root), or the volume's `hostNqn`/`hostId`. A volume that names
    /// only its `hostId` gets the node's host NQN with it, as csi-driver-nvmf gives it. One
    /// that names only its `hostNqn` gets no id here, and lunkit's connect chooses it
    /// ([`lunkit::nvme::with_host_id`]: the id the kernel already pairs with that NQN, the
    /// UUID in a `nqn.2014-08.org.nvmexpress:uuid:<id>` NQN, or one derived from the NQN).
    /// csi-driver-nvmf gives such a volume the node's host id, which newer kernels (6.12)
    /// refuse under a second NQN (`EINVAL`).
    pub(crate) fn nvme_host(
        &self,
        what: &str,
        vol: &NvmeVolume,
    ) -> Result<Option<lunkit::nvme::Host>> {
        crate::follow::volume_host(self.root(), vol.host_nqn.clone(), vol.host_id)
            .map_err(|e| Error::lunkit(format!("{what}: the node's host NQN (for hostId)"), e))
    }

    /// Whether namespace `nsid` of `nqn` is on the node with another identity than the WWID
    /// `record` saw at stage: the target gave the nsid to another namespace since, and
    /// detaching "namespace `nsid`" would take that one.
    pub(crate) fn nsid_reassigned(
        &self,
        record: &Record,
        nqn: &lunkit::Nqn,
        nsid: u32,
    ) -> Result<bool> {
        let Some(ours) = record.wwid.as_deref() else {
            return Ok(false);
        };
        let what = format!("volume {}: find {nqn} namespace {nsid}", record.volume_id);
        Ok(lunkit::nvme::namespace_devices(self.root(), nqn)
            .map_err(|e| Error::lunkit(what, e))?
            .into_iter()
            .filter(|(ns, _)| ns.nsid == Some(nsid))
            .any(|(_, d)| d.wwid.as_ref().is_some_and(|w| w.to_string() != ours)))
    }
}

/// The record's target of an NVMe volume, and the identity its attributes name.
pub(crate) fn target_of(v: &NvmeVolume) -> (Target, Option<String>) {
    (
        Target::Nvme {
            nqn: v.nqn.to_string(),
            portals: v.portals.clone(),
            discovery: v.discovery.clone(),
            nsid: v.nsid,
            device_uuid: v.device_uuid.clone(),
            device_wwid: v.device_wwid.clone(),
            host_nqn: v.host_nqn.as_ref().map(ToString::to_string),
            host_id: v.host_id.as_ref().map(ToString::to_string),
            dhchap: crate::state::Dhchap::of(v.auth.secret.is_some(), v.auth.ctrl_secret.is_some()),
        },
        v.wwid.as_ref().map(ToString::to_string),
    )
}

impl Inner {
    /// The NVMe part of an unstage: the namespace's detach, which deletes the controllers no
    /// other attached or used namespace needs; a namespace whose id another one has now is
    /// left as it is. A stage stopped before the namespace was found leaves only
    /// connections: those go when no other volume of the subsystem needs them.
    pub(crate) fn unstage_nvme(
        &self,
        record: &Record,
        opts: &DetachOptions,
        what: &str,
    ) -> Result<()> {
        let Target::Nvme { nqn, nsid, .. } = &record.target else {
            return Err(Error::Internal(format!("{what}: not an NVMe volume")));
        };
        let (root, id) = (self.root(), record.volume_id.as_str());
        let what = what.to_owned();
        let nqn: lunkit::Nqn = nqn.parse().map_err(|e| Error::lunkit(what.clone(), e))?;
        match nsid {
            // Deletes the controllers no other attached or used namespace needs.
            Some(n) if self.nsid_reassigned(record, &nqn, *n)? => log::note(
                Level::Warn,
                &format!(
                    "volume {id}: namespace {n} of {nqn} reports another identity than its WWID {}; left as it is",
                    record.wwid.as_deref().unwrap_or("")
                ),
            ),
            Some(n) => {
                let spec = VolumeSpec::Nvme {
                    nqn,
                    namespace: NamespaceSelector::Id(*n),
                };
                detach_recorded(root, &spec, opts, None)
                    .map_err(|e| Error::lunkit(what.clone(), e))?;
            }
            // Stopped before the namespace was found: only connections may be left.
            None => {
                let lock = self.target_lock(&nqn.to_string());
                let _g = lock.lock().unwrap_or_else(|p| p.into_inner());
                // The lock lunkit's attach, detach and discovery followers take on
                // the subsystem: no follower connects a path while this decides.
                let _subsystem = lunkit::ops::lock::lock(
                    &lunkit::ops::nvme::subsystem_lock_key(&nqn),
                    opts.lock_dir.as_deref(),
                    Instant::now() + opts.timeout,
                )
                .map_err(|e| Error::lunkit(what.clone(), e))?;
                if !self.others_on_target(record)? {
                    let mut d = lunkit::nvme::DisconnectOptions::default();
                    d.timeout = opts.timeout;
                    lunkit::nvme::disconnect(root, &nqn, &d)
                        .map_err(|e| Error::lunkit(what.clone(), e))?;
                }
                self.store.remove(id)?;
            }
        }
        Ok(())
    }
}

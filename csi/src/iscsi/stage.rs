//! The iSCSI steps of a stage and an unstage: SendTargets discovery, the logins under the
//! target's lock, the LUN's attach, and the logout of the sessions no volume uses any more.

use std::time::Instant;

use lunkit::block::BlockNode;
use lunkit::ops::{AttachOptions, BeforeRemoval, DetachOptions, VolumeSpec};

use crate::attrs::IscsiVolume;
use crate::error::{Error, Result};
use crate::iscsi;
use crate::node::Inner;
use crate::node::device::{detach_recorded, expected};
use crate::state::{Record, Target};
use lunkit::Wwid;

impl Inner {
    /// The volume with the portals SendTargets discovery found added (`discovery: true`),
    /// recorded before any is logged in to; the volume as it is otherwise. Checks its
    /// `initiatorName` first ([`iscsi::check_initiator`]).
    pub(crate) fn discover_iscsi(
        &self,
        id: &str,
        vol: &IscsiVolume,
        record: &mut Record,
        deadline: Instant,
    ) -> Result<IscsiVolume> {
        if let Some(name) = &vol.initiator_name {
            iscsi::check_initiator(self.root(), id, name)?;
        }
        if !vol.discovery {
            return Ok(vol.clone());
        }
        let found = iscsi::discover(
            &self.config.iscsi_nodes,
            &vol.iqn,
            &vol.portals,
            vol.iface.as_deref(),
            vol.discovery_chap.as_ref(),
            deadline,
        )
        .map_err(|e| match e {
            Error::Program(m) => Error::Program(format!("volume {id}: {m}")),
            Error::PermissionDenied(m) => Error::PermissionDenied(format!("volume {id}: {m}")),
            other => other,
        })?;
        let mut all = vol.clone();
        let new: Vec<String> = found
            .into_iter()
            .filter(|p| !vol.portals.contains(p))
            .collect();
        all.portals.extend(new.iter().cloned());
        if let Target::Iscsi { discovered, .. } = &mut record.target {
            for p in new {
                if !discovered.contains(&p) {
                    discovered.push(p);
                }
            }
        }
        self.store.save(record)?;
        Ok(all)
    }

    /// Logs in to the volume's portals that have no session yet (with session CHAP when the
    /// volume asks for it), under the target's lock.
    pub(crate) fn login_iscsi(&self, id: &str, vol: &IscsiVolume, deadline: Instant) -> Result<()> {
        let lock = self.target_lock(&vol.iqn);
        let _g = lock.lock().unwrap_or_else(|p| p.into_inner());
        iscsi::login(
            self.root(),
            &self.config.iscsi_nodes,
            &vol.iqn,
            &vol.portals,
            vol.iface.as_deref(),
            vol.chap.as_ref(),
            deadline,
        )
        .map(drop)
        .map_err(|e| match e {
            Error::Program(m) => Error::Program(format!("volume {id}: {m}")),
            Error::PermissionDenied(m) => Error::PermissionDenied(format!("volume {id}: {m}")),
            other => other,
        })
    }

    /// Brings the volume onto the node once it is logged in: scan, map; returns its device
    /// and WWID.
    pub(crate) fn attach_iscsi(
        &self,
        id: &str,
        vol: &IscsiVolume,
        record: &mut Record,
        deadline: Instant,
    ) -> Result<BlockNode> {
        // The attributes' check parsed it already (`attrs::iscsi`); this cannot fail for a
        // volume that came through it.
        let target = vol
            .iqn
            .parse()
            .map_err(|e| Error::lunkit(format!("volume {id}: target {}", vol.iqn), e))?;
        let spec = VolumeSpec::Iscsi {
            target,
            lun: vol.lun,
        };
        let mut opts = AttachOptions::new(self.root());
        opts.scan.expect_wwid = expected(vol.wwid.as_ref(), record)?;
        opts.scsi.iscsi_portals = vol.portals.clone();
        // Only the sessions of the volume's iface are the plugin's: another iface's session
        // to the target (another driver's) gets no path of this volume.
        opts.scsi.iscsi_ifaces = vec![
            vol.iface
                .as_deref()
                .unwrap_or(super::DEFAULT_IFACE)
                .to_owned(),
        ];
        self.attach_scsi(id, &spec, opts, record, deadline)
    }
}

/// The record's target of an iSCSI volume, and the WWID its attributes name (multipath's
/// form, as records keep it).
pub(crate) fn target_of(v: &IscsiVolume) -> (Target, Option<String>) {
    (
        Target::Iscsi {
            iqn: v.iqn.clone(),
            portals: v.portals.clone(),
            iface: v.iface.clone(),
            lun: v.lun,
            discovered: Vec::new(),
            fence: None,
        },
        v.wwid.as_ref().map(Wwid::to_multipath),
    )
}

impl Inner {
    /// The iSCSI part of a stage: discovery, the logins, then the LUN's attach; returns the
    /// device to hand out. `first`: this call made the record.
    pub(crate) fn stage_iscsi(
        &self,
        id: &str,
        v: &IscsiVolume,
        record: &mut Record,
        first: bool,
        deadline: Instant,
    ) -> Result<BlockNode> {
        // A refused initiatorName, a discovery that failed on every portal, or every
        // portal's login failed (those are the errors these give then): no portal
        // has a session and nothing of the volume is on the node, so a record this
        // call made would only wait for an unstage that a CO need not send after a
        // stage that failed this way.
        let logged_in = self
            .discover_iscsi(id, v, record, deadline)
            .and_then(|v| self.login_iscsi(id, &v, deadline).map(|()| v));
        let v = match logged_in {
            Ok(v) => v,
            Err(e) => {
                if first
                    && matches!(
                        e,
                        Error::PermissionDenied(_)
                            | Error::Program(_)
                            | Error::FailedPrecondition(_)
                    )
                {
                    self.store.remove(id)?;
                }
                return Err(e);
            }
        };
        self.attach_iscsi(id, &v, record, deadline)
    }
}

impl Inner {
    /// The iSCSI part of an unstage: the LUN's detach (by identity whenever it is known),
    /// then, under the target's lock, the logout of the sessions no other volume of the
    /// target needs; the record goes before the lock is let go. `before_removal` is the
    /// detach's last step with the volume in place (a fenced volume's release).
    pub(crate) fn unstage_iscsi(
        &self,
        record: &Record,
        opts: &DetachOptions,
        what: &str,
        deadline: Instant,
        before_removal: Option<&mut BeforeRemoval<'_>>,
    ) -> Result<()> {
        let Target::Iscsi {
            iqn,
            portals,
            iface,
            lun,
            discovered,
            ..
        } = &record.target
        else {
            return Err(Error::Internal(format!("{what}: not an iSCSI volume")));
        };
        let (root, id) = (self.root(), record.volume_id.as_str());
        // By identity whenever it is known: the address may hold another volume now.
        let spec = match record.known_wwid().map(str::parse) {
            Some(Ok(w)) => VolumeSpec::Wwid(w),
            // Every record a stage writes names a target the attributes parsed. One that
            // does not (kept from before they checked the form, with no WWID) is refused
            // with the parser's error, which names the forms: the address cannot be matched
            // safely, and logging the sessions out with its device still there loses data.
            _ => VolumeSpec::Iscsi {
                target: iqn.parse().map_err(|e| Error::lunkit(what.to_owned(), e))?,
                lun: *lun,
            },
        };
        detach_recorded(root, &spec, opts, before_removal)
            .map_err(|e| Error::lunkit(what.to_owned(), e))?;
        let lock = self.target_lock(iqn);
        let _g = lock.lock().unwrap_or_else(|p| p.into_inner());
        if !self.others_on_target(record)? {
            let mut all = portals.clone();
            all.extend(discovered.iter().filter(|p| !portals.contains(p)).cloned());
            let nodes = &self.config.iscsi_nodes;
            // The volume's devices are gone: its sessions are all that is left. A detach
            // that used the whole deadline (waiting for queued I/O to drain) must not fail
            // the unstage over a logout with no time at all, so it gets the clean-up's own
            // time, as the deletion of a record holding a CHAP secret does.
            let logout_by = deadline.max(Instant::now() + iscsi::CLEANUP);
            iscsi::logout_unused(root, nodes, iqn, &all, iface.as_deref(), logout_by)
                .map_err(|e| Error::Program(format!("volume {id}: logout: {e}")))?;
        }
        // Gone from the records before the lock is let go: two volumes of one target
        // unstaged together must not each see the other's record and both skip the
        // logout.
        self.store.remove(id)
    }
}

//! Fibre Channel volumes: the fabric's logins are the HBA's, so a stage is the LUN's scan
//! through every port that leads to one of the target's ports, and the map (the shared SCSI
//! part, [`crate::scsi`]); an unstage has no session to log out of. Imports no other
//! transport's module.

use std::time::Instant;

use lunkit::Root;
use lunkit::block::BlockNode;
use lunkit::ops::{AttachOptions, BeforeRemoval, DetachOptions, VolumeSpec};

use crate::attrs::FcVolume;
use crate::error::{Error, Result};
use crate::node::Inner;
use crate::node::device::{detach_recorded, expected};
use crate::state::{Record, Target};
use lunkit::Wwid;

impl Inner {
    /// Brings an FC LUN onto the node: the fabric's logins are the HBA's, so this is the scan
    /// through every port that leads to one of the target's ports, and the map.
    pub(crate) fn attach_fc(
        &self,
        id: &str,
        vol: &FcVolume,
        record: &mut Record,
        deadline: Instant,
    ) -> Result<BlockNode> {
        let spec = VolumeSpec::Fc {
            wwpns: vol.wwpns.clone(),
            lun: vol.lun,
        };
        let mut opts = AttachOptions::new(self.root());
        opts.scan.expect_wwid = expected(vol.wwid.as_ref(), record)?;
        self.attach_scsi(id, &spec, opts, record, deadline)
    }
}

/// The record's target of an FC volume, and the WWID its attributes name (multipath's form,
/// as records keep it).
pub(crate) fn target_of(v: &FcVolume) -> (Target, Option<String>) {
    (
        Target::Fc {
            wwpns: v.wwpns.iter().map(ToString::to_string).collect(),
            lun: v.lun,
            fence: None,
        },
        v.wwid.as_ref().map(Wwid::to_multipath),
    )
}

/// The FC part of an unstage: the LUN's detach, by identity whenever it is known. No session
/// to log out of: the HBAs' logins to the fabric are nobody's to end.
pub(crate) fn unstage(
    root: &Root,
    record: &Record,
    opts: &DetachOptions,
    what: &str,
    before_removal: Option<&mut BeforeRemoval<'_>>,
) -> Result<()> {
    let Target::Fc { wwpns, lun, .. } = &record.target else {
        return Err(Error::Internal(format!("{what}: not an FC volume")));
    };
    let id = &record.volume_id;
    // By identity whenever it is known: the address may hold another volume now.
    let spec = match record.known_wwid().map(str::parse) {
        Some(Ok(w)) => VolumeSpec::Wwid(w),
        _ => VolumeSpec::Fc {
            wwpns: wwpns
                .iter()
                .map(|w| w.parse())
                .collect::<lunkit::Result<_>>()
                .map_err(|e| Error::lunkit(format!("volume {id}: its record"), e))?,
            lun: *lun,
        },
    };
    detach_recorded(root, &spec, opts, before_removal)
        .map_err(|e| Error::lunkit(what.to_owned(), e))?;
    Ok(())
}

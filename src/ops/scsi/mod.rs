//! The SCSI family: a LUN reached over iSCSI, FC or an H:C:T:L, its paths, and the multipath
//! map over them. Nothing here knows about NVMe: [`crate::ops`] sends each spec to its family.

pub(super) mod attach;
pub(super) mod detach;
pub(super) mod identify;
pub(super) mod locate;
pub(super) mod resize;

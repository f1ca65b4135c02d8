//! PERSISTENT RESERVE IN through `SG_IO`: [`read_keys`], [`read_reservation`].

use std::os::fd::AsFd;
use std::time::Instant;

use rustix::fs::OFlags;

use super::{PR_TIMEOUT, ReadKeys, ReadReservation};
use crate::block::{self, BlockNode};
use crate::error::{Error, Result};
use crate::helper::{self, Subject};
use crate::scsi::sg_io::TurStatus;

/// The PERSISTENT RESERVE IN opcode.
const PERSISTENT_RESERVE_IN: u8 = 0x5e;
/// Service action READ KEYS.
pub(crate) const READ_KEYS: u8 = 0x00;
/// Service action READ RESERVATION.
pub(crate) const READ_RESERVATION: u8 = 0x01;
/// The first allocation: 126 keys, more than any volume has paths times nodes.
const FIRST_LEN: usize = 1024;
/// The largest allocation the 16-bit ALLOCATION LENGTH can ask for.
const MAX_LEN: usize = u16::MAX as usize;
/// How many commands one read sends at most: UNIT ATTENTIONs (a preemption reports one to
/// the preempted initiator) and one longer read.
const ATTEMPTS: usize = 4;

/// Reads the keys registered on the LUN behind `node` (a SCSI disk, or a multipath map,
/// which sends the command down its current path): READ KEYS, asked again with a longer
/// buffer when the list is longer than the first (up to 64 KiB, 8190 keys), and again after
/// a UNIT ATTENTION. On a helper thread bounded by `deadline`, the device opened read-only.
///
/// # Errors
///
/// [`Error::Io`] when the node does not open, [`Error::Ioctl`] when `SG_IO` fails (`EPERM`
/// without `CAP_SYS_RAWIO`, `ENOTTY` on a device that is not SCSI) or the device answers
/// anything but GOOD (a target without persistent reservations: ILLEGAL REQUEST),
/// [`Error::Invalid`] when the data is cut short, [`Error::Timeout`] at the deadline.
pub fn read_keys(node: &BlockNode, deadline: Instant) -> Result<ReadKeys> {
    let data = on_helper(node, READ_KEYS, deadline)?;
    ReadKeys::parse(&data).map_err(|e| bad_data(node, e))
}

/// Reads the reservation held on the LUN behind `node`, if any: READ RESERVATION, as
/// [`read_keys`] sends READ KEYS.
///
/// # Errors
///
/// As [`read_keys`].
pub fn read_reservation(node: &BlockNode, deadline: Instant) -> Result<ReadReservation> {
    let data = on_helper(node, READ_RESERVATION, deadline)?;
    ReadReservation::parse(&data).map_err(|e| bad_data(node, e))
}

fn bad_data(node: &BlockNode, e: super::ParseError) -> Error {
    Error::Invalid {
        kind: "PERSISTENT RESERVE IN data",
        input: node.to_string(),
        reason: match e {
            super::ParseError::Short { .. } => "is shorter than its 8-byte header",
        },
    }
}

/// Opens `node` and sends the service action `sa` on a helper thread.
fn on_helper(node: &BlockNode, sa: u8, deadline: Instant) -> Result<Vec<u8>> {
    let what = || format!("PERSISTENT RESERVE IN to {node} (the device is not answering)");
    let subject = Subject::device("pr-in", node.dev);
    let node = node.clone();
    helper::bounded(subject, deadline, &what, move || {
        let fd = block::open_checked(&node, OFlags::NONBLOCK)?;
        let _held = helper::hold(fd.as_fd(), node.dev);
        pr_in(&fd, &node, sa, deadline)
    })
}

/// PERSISTENT RESERVE IN with service action `sa` on the open `fd`: the data, whole (read
/// again with the length its ADDITIONAL LENGTH states, bounded by [`MAX_LEN`]).
pub(crate) fn pr_in(
    fd: &impl AsFd,
    node: &BlockNode,
    sa: u8,
    deadline: Instant,
) -> Result<Vec<u8>> {
    let mut want = FIRST_LEN;
    let mut last = None;
    for _ in 0..ATTEMPTS {
        let (status, data) = send(fd, node, sa, want, deadline)?;
        match status {
            TurStatus::Ready => {}
            TurStatus::CheckCondition(s) if s.key == crate::scsi::sg_io::UNIT_ATTENTION => {
                last = Some(status);
                continue;
            }
            TurStatus::Status(super::parse::RESERVATION_CONFLICT) => {
                return Err(Error::ReservationConflict {
                    op: "PERSISTENT RESERVE IN",
                    device: node.to_string(),
                    holder: None,
                });
            }
            other => return Err(refused(node, other)),
        }
        let stated = data
            .get(4..8)
            .map_or(0, |l| u32::from_be_bytes([l[0], l[1], l[2], l[3]]) as usize);
        let whole = stated.saturating_add(8);
        if whole > data.len() && want < whole.min(MAX_LEN) {
            want = whole.min(MAX_LEN);
            continue;
        }
        return Ok(data);
    }
    Err(refused(node, last.unwrap_or(TurStatus::Ready)))
}

fn refused(node: &BlockNode, status: TurStatus) -> Error {
    Error::Ioctl {
        op: "PERSISTENT RESERVE IN",
        target: node.to_string(),
        source: std::io::Error::other(format!("the device answered {status}")),
    }
}

/// One PERSISTENT RESERVE IN of `len` bytes at most: its status and the bytes that came.
fn send(
    fd: &impl AsFd,
    node: &BlockNode,
    sa: u8,
    len: usize,
    deadline: Instant,
) -> Result<(TurStatus, Vec<u8>)> {
    let alloc = u16::try_from(len).unwrap_or(u16::MAX).to_be_bytes();
    let cdb = [
        PERSISTENT_RESERVE_IN,
        sa,
        0,
        0,
        0,
        0,
        0,
        alloc[0],
        alloc[1],
        0,
    ];
    crate::scsi::sg_io::data_in(fd, node, &cdb, len, deadline, PR_TIMEOUT)
}

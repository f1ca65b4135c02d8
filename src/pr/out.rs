//! PERSISTENT RESERVE OUT through the block layer's `IOC_PR_*` ioctls: [`request`] and its
//! one-line wrappers.

use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use lunkit_sys::pr::*;
use rustix::fs::OFlags;

use super::{Key, ReservationType, Status};
use crate::block::{self, BlockNode};
use crate::error::{Error, Result};
use crate::helper::{self, Subject};

/// One persistent-reservation request, as the kernel's ioctls take them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    /// REGISTER `new` for this initiator (every path of a map): `old` is the key it has now
    /// (`None`: none), or, with `ignore_existing`, whatever it has (REGISTER AND IGNORE
    /// EXISTING KEY).
    Register {
        /// The key registered now, when one is.
        old: Option<Key>,
        /// The key to register (never 0: [`Request::Unregister`] is that).
        new: Key,
        /// `PR_FL_IGNORE_KEY`: replace whatever key this initiator has.
        ignore_existing: bool,
    },
    /// REGISTER with new key 0: drop this initiator's registration of `key` (and the
    /// reservation, when it holds one of a registrants-only type).
    Unregister {
        /// The key registered now.
        key: Key,
    },
    /// RESERVE: take a reservation of type `kind` with the registered `key`.
    Reserve {
        /// This initiator's registered key.
        key: Key,
        /// The type.
        kind: ReservationType,
    },
    /// RELEASE the reservation `key` holds (type `kind`, which must be the one held).
    Release {
        /// This initiator's registered key.
        key: Key,
        /// The held reservation's type.
        kind: ReservationType,
    },
    /// PREEMPT (with `abort`: PREEMPT AND ABORT) `victim`'s registrations and reservation,
    /// taking a reservation of type `kind` with `key`.
    Preempt {
        /// This initiator's registered key.
        key: Key,
        /// The key to remove.
        victim: Key,
        /// The type of the reservation taken.
        kind: ReservationType,
        /// Also abort the victim's commands in flight.
        abort: bool,
    },
    /// CLEAR every registration and the reservation, with this initiator's registered `key`.
    Clear {
        /// This initiator's registered key.
        key: Key,
    },
}

impl Request {
    /// The ioctl's name, for messages.
    pub fn op(&self) -> &'static str {
        match self {
            Request::Register { .. } | Request::Unregister { .. } => "IOC_PR_REGISTER",
            Request::Reserve { .. } => "IOC_PR_RESERVE",
            Request::Release { .. } => "IOC_PR_RELEASE",
            Request::Preempt { abort: false, .. } => "IOC_PR_PREEMPT",
            Request::Preempt { abort: true, .. } => "IOC_PR_PREEMPT_ABORT",
            Request::Clear { .. } => "IOC_PR_CLEAR",
        }
    }

    /// Refuses a 0 where a key must be one.
    fn check(&self) -> Result<()> {
        match *self {
            Request::Register { new, .. } => new.nonzero("new key").map(drop),
            Request::Unregister { key }
            | Request::Reserve { key, .. }
            | Request::Release { key, .. }
            | Request::Clear { key } => key.nonzero("key").map(drop),
            Request::Preempt { key, victim, .. } => {
                key.nonzero("key")?;
                victim.nonzero("key to preempt").map(drop)
            }
        }
    }

    /// The one ioctl, on the open device: what it returned.
    fn issue(&self, fd: &impl AsFd) -> std::io::Result<i32> {
        let reg = |old: u64, new: u64, flags: u32| pr_registration {
            old_key: old,
            new_key: new,
            flags,
            __pad: 0,
        };
        let res = |key: Key, kind: ReservationType| pr_reservation {
            key: key.get(),
            type_: kind.pr_type(),
            flags: 0,
        };
        match *self {
            Request::Register {
                old,
                new,
                ignore_existing,
            } => {
                let flags = if ignore_existing { PR_FL_IGNORE_KEY } else { 0 };
                let old = old.map_or(0, Key::get);
                let arg = reg(old, new.get(), flags);
                crate::ioctl::pr_ioctl(fd, IOC_PR_REGISTER, &arg)
            }
            Request::Unregister { key } => {
                crate::ioctl::pr_ioctl(fd, IOC_PR_REGISTER, &reg(key.get(), 0, 0))
            }
            Request::Reserve { key, kind } => {
                crate::ioctl::pr_ioctl(fd, IOC_PR_RESERVE, &res(key, kind))
            }
            Request::Release { key, kind } => {
                crate::ioctl::pr_ioctl(fd, IOC_PR_RELEASE, &res(key, kind))
            }
            Request::Preempt {
                key,
                victim,
                kind,
                abort,
            } => {
                let op = if abort {
                    IOC_PR_PREEMPT_ABORT
                } else {
                    IOC_PR_PREEMPT
                };
                let arg = pr_preempt {
                    old_key: key.get(),
                    new_key: victim.get(),
                    type_: kind.pr_type(),
                    flags: 0,
                };
                crate::ioctl::pr_ioctl(fd, op, &arg)
            }
            Request::Clear { key } => {
                let arg = pr_clear {
                    key: key.get(),
                    flags: 0,
                    __pad: 0,
                };
                crate::ioctl::pr_ioctl(fd, IOC_PR_CLEAR, &arg)
            }
        }
    }
}

/// Sends `req` to `node` (a SCSI disk, an NVMe namespace, or a device-mapper map, which
/// registers on every path and sends the rest down one), on a helper thread bounded by
/// `deadline`, the device opened read-only. Needs `CAP_SYS_ADMIN`.
///
/// # Errors
///
/// - [`Error::ReservationConflict`] when the device answers RESERVATION CONFLICT (another
///   key holds it, the key is not this initiator's, or the path is not registered): the
///   holder's key is read back with READ RESERVATION when the device answers it;
/// - [`Error::Invalid`] for a key of 0 where one is needed (nothing is sent);
/// - [`Error::Ioctl`] with the errno (`EPERM`, `EOPNOTSUPP` on a device without
///   reservations, `ENOTTY`), or, for any other answer of the device or the transport,
///   without one, naming the SCSI status and host byte ([`Status`]);
/// - [`Error::Io`] when the node does not open; [`Error::Timeout`] at the deadline.
pub fn request(node: &BlockNode, req: Request, deadline: Instant) -> Result<()> {
    req.check()?;
    let what = || format!("{} on {node} (the device is not answering)", req.op());
    let subject = Subject::device("pr-out", node.dev);
    let node = node.clone();
    helper::bounded(subject, deadline, &what, move || {
        let fd = block::open_checked(&node, OFlags::NONBLOCK)?;
        let _held = helper::hold(fd.as_fd(), node.dev);
        // A CHECK CONDITION here is mostly a UNIT ATTENTION the target queued for this
        // I_T nexus (RESERVATIONS RELEASED after another path's RELEASE, REGISTRATIONS
        // PREEMPTED): reporting it consumes it and the request was not carried out, so it
        // is sent again, as PERSISTENT RESERVE IN is and as 6.8+'s sd does itself (6.1's
        // sd passes it up; the ioctl carries no sense to tell it from another).
        let mut status = Status::Done;
        for _ in 0..3 {
            let ret = req.issue(&fd).map_err(|source| Error::Ioctl {
                op: req.op(),
                target: node.to_string(),
                source,
            })?;
            status = Status::from_ioctl(ret);
            if !matches!(
                status,
                Status::Failed {
                    status: 0x02,
                    host: 0
                }
            ) {
                break;
            }
        }
        match status {
            Status::Done => Ok(()),
            Status::Conflict => Err(Error::ReservationConflict {
                op: req.op(),
                device: node.to_string(),
                holder: holder_now(&fd, &node, deadline),
            }),
            failed => Err(Error::Ioctl {
                op: req.op(),
                target: node.to_string(),
                source: std::io::Error::other(format!("the device answered {failed}")),
            }),
        }
    })
}

/// The reservation holder's key, read after a conflict with a short bound of its own (at
/// most 2 s, within the deadline); `None` when none is held or it could not be read.
fn holder_now(fd: &impl AsFd, node: &BlockNode, deadline: Instant) -> Option<Key> {
    let soon = deadline.min(Instant::now() + Duration::from_secs(2));
    let data = super::read::pr_in(fd, node, super::read::READ_RESERVATION, soon).ok()?;
    super::ReadReservation::parse(&data)
        .ok()?
        .holder
        .map(|h| h.key)
}

/// Registers `key` for this initiator, which has no key yet ([`Request::Register`]).
pub fn register(node: &BlockNode, key: Key, deadline: Instant) -> Result<()> {
    let req = Request::Register {
        old: None,
        new: key,
        ignore_existing: false,
    };
    request(node, req, deadline)
}

/// Registers `key` for this initiator, replacing whatever key it has (REGISTER AND IGNORE
/// EXISTING KEY): what a node does on every path, since a path may keep an old registration.
pub fn register_ignore(node: &BlockNode, key: Key, deadline: Instant) -> Result<()> {
    let req = Request::Register {
        old: None,
        new: key,
        ignore_existing: true,
    };
    request(node, req, deadline)
}

/// Drops this initiator's registration of `key` ([`Request::Unregister`]).
pub fn unregister(node: &BlockNode, key: Key, deadline: Instant) -> Result<()> {
    request(node, Request::Unregister { key }, deadline)
}

/// Takes a reservation of type `kind` with the registered `key` ([`Request::Reserve`]).
pub fn reserve(node: &BlockNode, key: Key, kind: ReservationType, deadline: Instant) -> Result<()> {
    request(node, Request::Reserve { key, kind }, deadline)
}

/// Releases the reservation of type `kind` that `key` holds ([`Request::Release`]).
pub fn release(node: &BlockNode, key: Key, kind: ReservationType, deadline: Instant) -> Result<()> {
    request(node, Request::Release { key, kind }, deadline)
}

/// Preempts `victim` with `key`, taking a reservation of type `kind` ([`Request::Preempt`]).
pub fn preempt(
    node: &BlockNode,
    key: Key,
    victim: Key,
    kind: ReservationType,
    deadline: Instant,
) -> Result<()> {
    let req = Request::Preempt {
        key,
        victim,
        kind,
        abort: false,
    };
    request(node, req, deadline)
}

/// As [`preempt`], and aborts `victim`'s commands in flight (PREEMPT AND ABORT): from its
/// return, none of the victim's writes lands.
pub fn preempt_abort(
    node: &BlockNode,
    key: Key,
    victim: Key,
    kind: ReservationType,
    deadline: Instant,
) -> Result<()> {
    let req = Request::Preempt {
        key,
        victim,
        kind,
        abort: true,
    };
    request(node, req, deadline)
}

/// Clears every registration and the reservation, with the registered `key`
/// ([`Request::Clear`]).
pub fn clear(node: &BlockNode, key: Key, deadline: Instant) -> Result<()> {
    request(node, Request::Clear { key }, deadline)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_keys_are_refused_before_any_call() {
        let kind = ReservationType::WriteExclusive;
        for req in [
            Request::Register {
                old: None,
                new: Key(0),
                ignore_existing: true,
            },
            Request::Unregister { key: Key(0) },
            Request::Reserve { key: Key(0), kind },
            Request::Clear { key: Key(0) },
            Request::Preempt {
                key: Key(1),
                victim: Key(0),
                kind,
                abort: true,
            },
        ] {
            let e = req.check().unwrap_err();
            assert_eq!(e.kind(), crate::ErrorKind::Invalid, "{req:?}");
        }
        let ok = Request::Preempt {
            key: Key(1),
            victim: Key(2),
            kind,
            abort: true,
        };
        assert!(ok.check().is_ok());
        assert_eq!(ok.op(), "IOC_PR_PREEMPT_ABORT");
    }

    #[test]
    fn a_conflict_is_a_refusal_naming_the_device_and_holder() {
        let e = Error::ReservationConflict {
            op: "IOC_PR_RESERVE",
            device: "sdc (8:32)".into(),
            holder: Some(Key(0xbeef)),
        };
        assert_eq!(e.kind(), crate::ErrorKind::ReservationConflict);
        assert_eq!(e.errno(), None);
        assert_eq!(
            e.to_string(),
            "IOC_PR_RESERVE on sdc (8:32): reservation conflict (the reservation is held by \
             key 0x000000000000beef)"
        );
        let unheld = Error::ReservationConflict {
            op: "IOC_PR_REGISTER",
            device: "sdd".into(),
            holder: None,
        };
        assert!(unheld.to_string().contains("not registered"), "{unheld}");
    }
}

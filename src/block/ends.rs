//! Reading both ends of a device under a deadline: [`read_ends`].
//!
//! A caller that is about to format a device, or to trust a probe that says it is blank,
//! first proves the device answers reads where signatures live. On a map that queues I/O
//! with no path such a read never returns, and a read on a thread of the caller's own keeps
//! the device open for as long: the next in-use check finds the caller itself holding the
//! device and refuses its take-down. So the read runs on a helper thread ([`crate::helper`]),
//! its descriptor registered ([`Usage::helpers`](super::Usage::helpers), not a user), and a
//! second call while the first is still blocked starts no other thread.

use std::os::fd::AsFd;
use std::time::Instant;

use rustix::fs::OFlags;

use super::{BlockNode, open_checked};
use crate::error::{Error, Result};
use crate::helper::{self, Subject};

/// What [`read_ends`] read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ends {
    /// The device's size in bytes (`BLKGETSIZE64`).
    pub size: u64,
    /// Its first `min(span, size)` bytes.
    pub head: Vec<u8>,
    /// Its last `min(span, size)` bytes (the same bytes as `head` on a device no larger than
    /// `span`).
    pub tail: Vec<u8>,
}

/// Reads the first and the last `span` bytes of `node` (all of a smaller device), on a
/// helper thread bounded by `deadline`.
///
/// - A read that fails is [`Error::Step`] (step `"read"`, the target naming the device and
///   the byte offset) around the [`Error::Io`] with the errno: [`Error::errno`] gives it.
///   A short read (the device shrank under the call) is `UnexpectedEof` the same way.
/// - A read still blocked at `deadline` (I/O queued on a map with no path) is
///   [`Error::Timeout`]; its thread finishes on its own and closes the device then. Until
///   it does, its descriptor is listed in [`Usage::helpers`](super::Usage::helpers), not as
///   a user, and a take-down of the device waits for it within its own deadline (removing a
///   queueing map first fails the queued I/O, which ends the read).
/// - A call on a device whose earlier read is still blocked starts no thread: it waits for
///   that read within its deadline, then returns [`Error::Timeout`] naming it.
///
/// The device is opened read-only (no udev `change` event on close) and checked to be the
/// device `node` names, as [`flush`](super::flush) does.
pub fn read_ends(node: &BlockNode, span: u64, deadline: Instant) -> Result<Ends> {
    let what = || format!("read of both ends of {node} (the device is not completing reads)");
    let subject = Subject::device("read", node.dev);
    let node = node.clone();
    helper::bounded(subject, deadline, &what, move || read_now(&node, span))
}

/// The reads of [`read_ends`], on the helper thread.
fn read_now(node: &BlockNode, span: u64) -> Result<Ends> {
    let fd = open_checked(node, OFlags::empty())?;
    let _held = helper::hold(fd.as_fd(), node.dev);
    let size = crate::ioctl::blkgetsize64(&fd).map_err(|source| Error::Ioctl {
        op: "BLKGETSIZE64",
        target: node.to_string(),
        source,
    })?;
    let len = usize::try_from(span.min(size)).map_err(|_| Error::Invalid {
        kind: "read span",
        input: span.to_string(),
        reason: "does not fit in memory",
    })?;
    let head = read_at(&fd, node, 0, len)?;
    let tail_at = size.saturating_sub(span);
    let tail = if tail_at == 0 {
        head.clone()
    } else {
        read_at(&fd, node, tail_at, len)?
    };
    Ok(Ends { size, head, tail })
}

/// `len` bytes of `node` from byte `offset`, whole.
fn read_at(fd: &impl AsFd, node: &BlockNode, offset: u64, len: usize) -> Result<Vec<u8>> {
    let fail = |at: u64, source: std::io::Error| Error::Step {
        step: "read",
        target: format!("{node} at byte {at}"),
        source: Box::new(Error::io(&node.path, source)),
    };
    let mut buf = vec![0u8; len];
    let mut done = 0;
    while done < len {
        let at = offset + done as u64;
        match rustix::io::pread(fd, &mut buf[done..], at) {
            Ok(0) => {
                return Err(fail(
                    at,
                    std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "the device ended before its size (it shrank?)",
                    ),
                ));
            }
            Ok(n) => done += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(fail(at, e.into())),
        }
    }
    Ok(buf)
}

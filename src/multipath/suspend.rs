//! The calls of a removal that can wait in the kernel, bounded by its deadline: the flushing
//! suspend, and `DM_DEV_REMOVE` itself.
//!
//! `DM_DEV_SUSPEND` with a flush returns once every I/O in flight on the map has ended. A
//! path that is blocked (an iSCSI session in recovery, an FC port before its dev_loss_tmo)
//! holds its I/O until the transport gives up, so the call runs on a helper thread and the
//! removal returns [`Error::Timeout`] at its deadline. The suspend still completes later, in
//! the kernel, and a map left suspended would hold every opener's I/O until someone resumed
//! it: so the helper resumes the map itself when its caller has given up by then.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use crate::dm::{Control, DevId, Removed, Suspend};
use crate::error::{ErrorKind, Result};
use crate::helper::{self, Subject};
use crate::id::DevNum;

/// Where a helper's suspend is, as its caller and the helper both see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// The call is in the kernel.
    Running,
    /// It returned, and its caller has (or will have) its result.
    Done,
    /// Its caller gave up at its deadline: the helper resumes what it suspended.
    Abandoned,
}

/// Suspends the map `name` (device `dev`) with a flush, on a helper thread, until `deadline`:
/// `true` when it did, `false` when another caller had it suspended (multipathd's reload: see
/// [`Control::suspend_unless_suspended`]); [`crate::Error::Timeout`] when the flush was still
/// waiting at the deadline, the map then resumed by the helper once the suspend returns.
pub(super) fn flushing(ctl: &Control, name: &str, dev: DevNum, deadline: Instant) -> Result<bool> {
    let how = Suspend {
        noflush: false,
        skip_lockfs: true,
    };
    let state = Arc::new(Mutex::new(State::Running));
    let theirs = ctl.try_clone()?;
    let (helper_state, owned) = (Arc::clone(&state), name.to_owned());
    let what = || format!("suspend of map {name} (its paths hold I/O that does not end)");
    let r = helper::bounded(
        Subject::device("suspend", dev),
        deadline,
        &what,
        move || {
            let id = DevId::Name(&owned);
            let r = theirs.suspend_unless_suspended(&id, how);
            let mut s = helper_state.lock().unwrap_or_else(PoisonError::into_inner);
            if *s == State::Abandoned {
                if matches!(r, Ok(true)) {
                    let _ = theirs.resume_if_suspended(&id);
                }
            } else {
                *s = State::Done;
            }
            r
        },
    );
    if r.as_ref().is_err_and(|e| e.kind() == ErrorKind::Timeout) {
        let mut s = state.lock().unwrap_or_else(PoisonError::into_inner);
        if *s == State::Done {
            // It returned just as the wait ended: its result is lost here, so the map may be
            // suspended by it, and must not stay so.
            let _ = ctl.resume_if_suspended(&DevId::Name(name));
        } else {
            *s = State::Abandoned;
        }
    }
    r
}

/// `DM_DEV_REMOVE` of the map `name` (device `dev`), on a helper thread, until `deadline`.
///
/// The kernel's removal first suspends the map (its targets' presuspend) and then waits, in
/// uninterruptible sleep, until no other call holds the device: another process's ioctl on
/// the map (a flushing suspend whose paths hold I/O, a status read) keeps the removal waiting
/// as long as it does. Past the deadline this returns [`crate::Error::Timeout`]; the removal
/// goes on in the kernel and ends with the map gone, which the caller's next look finds.
pub(super) fn remove(
    ctl: &Control,
    name: &str,
    dev: DevNum,
    deferred: bool,
    deadline: Instant,
) -> Result<Removed> {
    let theirs = ctl.try_clone()?;
    let owned = name.to_owned();
    let what = || format!("DM_DEV_REMOVE of map {name} (another call on the map holds it)");
    helper::bounded(Subject::device("remove", dev), deadline, &what, move || {
        theirs.remove(&DevId::Name(&owned), deferred)
    })
}

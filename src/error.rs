//! The one error type of the library.
//!
//! Every variant names what it was working on (a path, a device, an input) so that a message
//! printed by a CLI or logged by a CSI driver can be acted on without a debugger. The CLI maps
//! [`Error::kind`] to its exit codes.

use std::io;
use std::path::PathBuf;

/// A `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in lunkit.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A file or directory under the root could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file the operation touched.
        path: PathBuf,
        /// The underlying error, with its errno.
        #[source]
        source: io::Error,
    },

    /// The device, host, session, map or port asked for does not exist.
    #[error("{what}")]
    NotFound {
        /// The whole message, one sentence: what was looked for and, where the caller can
        /// do something about it, what (`no logged-in iSCSI session to iqn… through
        /// 192.0.2.10:3260; log in first with …`, `SCSI device 2:0:0:7 not found`).
        what: String,
    },

    /// A user-supplied or kernel-supplied string could not be parsed.
    #[error("invalid {kind} {input:?}: {reason}")]
    Invalid {
        /// What the string should have been, e.g. `H:C:T:L`.
        kind: &'static str,
        /// The offending input (truncated to a sane length).
        input: String,
        /// Why it was rejected.
        reason: &'static str,
    },

    /// An ioctl on a device or on `/dev/mapper/control` failed.
    #[error("{op} on {target}: {source}")]
    Ioctl {
        /// The request, e.g. `DM_DEV_REMOVE` or `BLKFLSBUF`.
        op: &'static str,
        /// What it was aimed at: a device path or a dm map name.
        target: String,
        /// The errno.
        #[source]
        source: io::Error,
    },

    /// The device is in use and the operation was refused so as not to lose data.
    #[error("{device} is in use: {reason}")]
    Busy {
        /// The device (`/dev/sdc`, `mpatha (dm-0)`).
        device: String,
        /// Who uses it: mount points, holders, open count.
        reason: String,
        /// What the in-use check found, when one ran, for a caller to branch on: a
        /// filesystem mount, kubelet's loop device or bind mount, a process. `None` when the
        /// refusal came from elsewhere (device-mapper's open count, a map that queues with
        /// no path, a path of another volume's map). [`Error::usage`] finds it through
        /// [`Error::Step`].
        usage: Option<Box<crate::block::Usage>>,
    },

    /// Nothing was found using the device, but the check could not look everywhere (a
    /// process whose open files or mount table could not be read, without root or
    /// `CAP_SYS_PTRACE`): refused, since "not found" is not "not in use".
    #[error("{device} may be in use: {reason}")]
    Unverified {
        /// The device (`/dev/sdc`, `mpatha (dm-0)`).
        device: String,
        /// What could not be checked, and why.
        reason: String,
        /// What the in-use check saw, with what it could not look at in
        /// [`Usage::unchecked`](crate::block::Usage::unchecked); `None` when the doubt is not
        /// the check's (a map left with no path and no remembered WWID).
        usage: Option<Box<crate::block::Usage>>,
    },

    /// The device at an address is not the one the operation checked: it was removed and
    /// another created there (a LUN re-mapped and scanned again), or its WWID changed. Nothing
    /// was done to it; the checks must run again on what is there now.
    #[error("{device} changed under the operation: {reason}")]
    Replaced {
        /// The address (`SCSI device 7:0:0:1`).
        device: String,
        /// What changed.
        reason: String,
    },

    /// A step of a workflow failed: which step, on what, and why.
    #[error("{step} {target}: {source}")]
    Step {
        /// The step (`flush-path`, `remove-map`: [`crate::ops::StepKind::as_str`]).
        step: &'static str,
        /// What it acted on (`mpatha (dm-0)`, `7:0:0:1 (sdc)`).
        target: String,
        /// Why it failed.
        #[source]
        source: Box<Error>,
    },

    /// lunkit itself failed (a helper thread panicked); a bug, reported instead of a panic.
    #[error("internal error: {what}")]
    Internal {
        /// What went wrong, and where.
        what: String,
    },

    /// Every path the caller asked for refused this host: the subsystem's in-band
    /// authentication (DH-HMAC-CHAP) failed or wanted a secret none was given for. Each
    /// path's refusal is in `what`.
    #[error("{what}: every connect was refused for this host's credentials")]
    Refused {
        /// The volume and each path's refusal.
        what: String,
    },

    /// A wait passed its deadline.
    #[error("timed out after {waited:.1?} waiting for {what}")]
    Timeout {
        /// What was awaited, e.g. `block device of 2:0:0:7`.
        what: String,
        /// How long it waited.
        waited: std::time::Duration,
    },

    /// Fewer paths of a LUN came than were wanted ([`crate::ScanOptions::min_paths`]);
    /// every path's outcome is here, so a caller can tell a masked path from a slow one.
    #[error(
        "{what}: {found} of {} path(s) came, {wanted} wanted: {}",
        paths.len(),
        crate::scsi::scan::describe_paths(paths)
    )]
    MissingPaths {
        /// The LUN (`LUN 3 of iSCSI target iqn…`).
        what: String,
        /// How many paths came.
        found: usize,
        /// How many were wanted.
        wanted: usize,
        /// Every path, scanned or skipped, with its outcome.
        paths: Vec<crate::scsi::scan::PathScan>,
    },

    /// The LUN at an address is not the volume the caller expected (a LUN number was
    /// reused), or, with none expected, not the volume its other paths are.
    #[error(
        "{device} has WWID {}, expected {}{}",
        or_none(actual.as_ref()),
        or_none(expected.as_ref()),
        reference.as_ref().map_or(String::new(), |r| format!(", as on {r}"))
    )]
    WwidMismatch {
        /// The device that was found (`sdc (2:0:0:7)`).
        device: String,
        /// The WWID it should have had: the caller's, or the `reference` path's (`None` when
        /// that path reports none).
        expected: Option<crate::id::Wwid>,
        /// With no WWID from the caller, the path whose WWID the others must share
        /// (`sdc (5:0:0:0)`).
        reference: Option<String>,
        /// The WWID the device has (`None` without VPD page 0x83).
        actual: Option<crate::id::Wwid>,
        /// The addresses among those scanned that had no SCSI device before this call (of
        /// whatever WWID): what the call brought onto the node. A caller taking back what it
        /// brought deletes these only; the others were there before it. Empty for NVMe.
        new_paths: Vec<crate::id::Hctl>,
    },

    /// An attach's paths came but multipathd's map over them did not (`source` says why:
    /// a [`Error::Timeout`] mostly). The WWID the paths report, and the paths, are here so
    /// that a caller can look for the map again, or take the paths back out.
    #[error("{source}")]
    MapWait {
        /// The WWID the paths report (the map's uuid is `mpath-` and its multipath form).
        wwid: crate::id::Wwid,
        /// The paths' disks (`sdc`, `sdd`).
        paths: Vec<String>,
        /// Why the map was not there.
        #[source]
        source: Box<Error>,
    },

    /// A resize was refused, or did not take. Every refusal comes before the multipath map
    /// is touched; [`ResizeFailure::MapNotGrown`] and [`ResizeFailure::Multipathd`] say what
    /// became of it.
    #[error("cannot resize {volume}: {reason}")]
    Resize {
        /// The volume (`mpatha (dm-0)`, `WWID naa.…`, `sdc`).
        volume: String,
        /// Why.
        reason: ResizeFailure,
    },

    /// A persistent-reservation command refused with RESERVATION CONFLICT (another key
    /// holds the device, or the path is not registered with the key): nothing changed.
    #[error(
        "{op} on {device}: reservation conflict{}",
        holder.map_or_else(
            || " (no reservation is held: this path is not registered with that key?)"
                .to_owned(),
            |k| format!(" (the reservation is held by key {k})")
        )
    )]
    ReservationConflict {
        /// The request (`IOC_PR_RESERVE`, `PERSISTENT RESERVE IN`).
        op: &'static str,
        /// The device (`sdc`, `dm-0`).
        device: String,
        /// The key holding the reservation, when it could be read back after the refusal.
        holder: Option<crate::pr::Key>,
    },

    /// The kernel did not create an NVMe over Fabrics controller: the write of the connect
    /// string to `/dev/nvme-fabrics` failed.
    #[error(
        "connect to {target}: {source}{}",
        if hint.is_empty() { String::new() } else { format!(" ({hint})") }
    )]
    Connect {
        /// The path (`nqn.… at 192.0.2.10:4420`).
        target: String,
        /// What the errno most likely means here, or empty.
        hint: &'static str,
        /// The errno.
        #[source]
        source: io::Error,
    },
}

/// Why [`Error::Resize`]: each case names the devices and sizes involved.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ResizeFailure {
    /// A path is not running (or has no disk): its size cannot be trusted, and the map must
    /// not grow past what that path can serve. Nothing was rescanned.
    PathDown {
        /// The path (`7:0:0:1 (sdc)`).
        path: String,
        /// Its scsi_device state (`offline`, `blocked`, `transport-offline`, `no disk`).
        state: String,
    },
    /// The paths report different sizes after their rescan: one of them is not this
    /// volume's current size yet. The map was not touched.
    SizesDiffer {
        /// Every path with the size it reports, in bytes.
        sizes: Vec<(String, u64)>,
    },
    /// The paths report less than the map has: a volume shrunk on the array. The map is
    /// never shrunk (what lay beyond the new end would be cut off under its users).
    Shrunk {
        /// The map (`mpatha (dm-0)`) or, without one, the path.
        device: String,
        /// Its size, in bytes.
        from: u64,
        /// What the paths report now, in bytes.
        to: u64,
    },
    /// multipathd answered something else than `ok` to `resize map`. The map is as it was.
    Multipathd {
        /// Its answer.
        reply: String,
    },
    /// The map's length did not become the paths' size (read back from device-mapper).
    MapNotGrown {
        /// The map (`mpatha (dm-0)`).
        map: String,
        /// Its size now, in bytes.
        size: u64,
        /// The paths' size, in bytes.
        wanted: u64,
        /// Whether multipathd did the resize (and answered `ok`).
        by_multipathd: bool,
    },
}

impl std::fmt::Display for ResizeFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ResizeFailure::PathDown { path, state } => write!(
                f,
                "path {path} is {state}; bring it back or delete it before resizing                  (nothing was rescanned)"
            ),
            ResizeFailure::SizesDiffer { sizes } => {
                f.write_str("the paths disagree on the size: ")?;
                for (i, (p, s)) in sizes.iter().enumerate() {
                    let sep = if i == 0 { "" } else { ", " };
                    write!(f, "{sep}{p} {s} bytes")?;
                }
                f.write_str(" (the map was not touched)")
            }
            ResizeFailure::Shrunk { device, from, to } => write!(
                f,
                "{device} has {from} bytes and its paths now report {to}: the volume shrank;                  the map is never shrunk"
            ),
            ResizeFailure::Multipathd { reply } => write!(
                f,
                "multipathd answered {reply:?} to resize map; the map was not changed (see                  its log)"
            ),
            ResizeFailure::MapNotGrown {
                map,
                size,
                wanted,
                by_multipathd,
            } => {
                write!(f, "{map} has {size} bytes after the resize, not {wanted}")?;
                if *by_multipathd {
                    f.write_str(
                        " although multipathd answered ok (it takes the size from the first \
                         path of the first path group)",
                    )?;
                }
                Ok(())
            }
        }
    }
}

/// Coarse classification of an [`Error`], stable across versions; the CLI's exit codes follow it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The thing asked for does not exist.
    NotFound,
    /// The input was malformed.
    Invalid,
    /// The caller lacks the privilege (EACCES, EPERM).
    PermissionDenied,
    /// Refused because the device is in use.
    Busy,
    /// Refused because whether the device is in use could not be checked completely.
    Unverified,
    /// A deadline passed.
    Timeout,
    /// A device is not the volume expected: it reports another WWID (a LUN number or
    /// namespace id reused), or not the one its other paths report ([`Error::WwidMismatch`]).
    WwidMismatch,
    /// Refused with RESERVATION CONFLICT ([`Error::ReservationConflict`]).
    ReservationConflict,
    /// Anything else.
    Other,
}

impl Error {
    /// Wraps an I/O error with the path it happened on.
    pub fn io(path: impl Into<PathBuf>, source: io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }

    /// Builds an [`Error::Invalid`], keeping at most 256 bytes of the input in the message.
    pub fn invalid(kind: &'static str, input: &str, reason: &'static str) -> Self {
        let mut end = input.len().min(256);
        while !input.is_char_boundary(end) {
            end -= 1;
        }
        Error::Invalid {
            kind,
            input: input[..end].to_owned(),
            reason,
        }
    }

    /// The errno behind this error, if the kernel gave one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Error::Io { source, .. }
            | Error::Ioctl { source, .. }
            | Error::Connect { source, .. } => source.raw_os_error(),
            Error::Step { source, .. } | Error::MapWait { source, .. } => source.errno(),
            _ => None,
        }
    }

    /// The coarse class of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::NotFound { .. } => ErrorKind::NotFound,
            Error::Invalid { .. } => ErrorKind::Invalid,
            Error::Timeout { .. } => ErrorKind::Timeout,
            Error::Busy { .. } => ErrorKind::Busy,
            Error::Unverified { .. } => ErrorKind::Unverified,
            // An ioctl's EBUSY is the kernel refusing a device in use (DM_DEV_REMOVE).
            Error::Ioctl { source, .. } if source.raw_os_error() == Some(libc::EBUSY) => {
                ErrorKind::Busy
            }
            Error::Ioctl { source, .. } => errno_kind(source),
            Error::WwidMismatch { .. } => ErrorKind::WwidMismatch,
            Error::MapWait { source, .. } => source.kind(),
            Error::Replaced { .. } | Error::Internal { .. } | Error::Resize { .. } => {
                ErrorKind::Other
            }
            Error::MissingPaths { paths, .. } => missing_paths_kind(paths),
            Error::Step { source, .. } => source.kind(),
            Error::Refused { .. } => ErrorKind::PermissionDenied,
            Error::ReservationConflict { .. } => ErrorKind::ReservationConflict,
            Error::Connect { source, .. } => match source.raw_os_error() {
                // Nothing at that address: the path asked for is not there.
                Some(libc::ECONNREFUSED | libc::EHOSTUNREACH | libc::ENETUNREACH) => {
                    ErrorKind::NotFound
                }
                Some(libc::ETIMEDOUT) => ErrorKind::Timeout,
                // No privilege here, or the subsystem refused this host's credentials.
                Some(libc::EACCES | libc::EPERM | libc::ENOKEY | libc::EKEYREJECTED) => {
                    ErrorKind::PermissionDenied
                }
                _ => ErrorKind::Other,
            },
            // A file's ENXIO and ENODEV are not "not found", deliberately: opening an offline
            // SCSI disk fails with ENXIO (`sd_open`), and a write to one with ENODEV, while
            // the disk and what it caches are still there. Only a missing file is.
            Error::Io { source, .. } => match source.kind() {
                io::ErrorKind::NotFound => ErrorKind::NotFound,
                io::ErrorKind::PermissionDenied => ErrorKind::PermissionDenied,
                _ => ErrorKind::Other,
            },
        }
    }

    /// What the in-use check found, for a refusal that came from it ([`Error::Busy`] or
    /// [`Error::Unverified`]), looking through [`Error::Step`]: a detach reports its refusal
    /// as a failed `check-in-use` step.
    ///
    /// ```
    /// # use lunkit::{Error, block::Usage};
    /// fn waits_for_kubelet(e: &Error) -> bool {
    ///     // kubelet's loop device on the volume is let go when its unmap ends: retry.
    ///     e.usage().is_some_and(|u| !u.loops.is_empty() && u.mounts.is_empty())
    /// }
    /// ```
    pub fn usage(&self) -> Option<&crate::block::Usage> {
        match self {
            Error::Busy { usage, .. } | Error::Unverified { usage, .. } => usage.as_deref(),
            Error::Step { source, .. } => source.usage(),
            _ => None,
        }
    }

    /// The WWID a device reported against the one expected, for an
    /// [`ErrorKind::WwidMismatch`] (looking through [`Error::Step`]); `None` for any other
    /// error, or when that device reports none.
    pub fn mismatched_wwid(&self) -> Option<&crate::id::Wwid> {
        match self {
            Error::WwidMismatch { actual, .. } => actual.as_ref(),
            Error::Step { source, .. } => source.mismatched_wwid(),
            _ => None,
        }
    }

    /// The addresses this call brought onto the node, for an [`ErrorKind::WwidMismatch`] of
    /// a SCSI scan (looking through [`Error::Step`]): see `new_paths` there. Empty otherwise.
    pub fn new_paths(&self) -> &[crate::id::Hctl] {
        match self {
            Error::WwidMismatch { new_paths, .. } => new_paths,
            Error::Step { source, .. } => source.new_paths(),
            _ => &[],
        }
    }

    /// The WWID the volume's devices reported, for an attach that failed after they came:
    /// [`Error::MapWait`]'s, or the mismatched one of [`Error::mismatched_wwid`].
    pub fn seen_wwid(&self) -> Option<&crate::id::Wwid> {
        match self {
            Error::MapWait { wwid, .. } => Some(wwid),
            Error::Step { source, .. } => source.seen_wwid(),
            _ => self.mismatched_wwid(),
        }
    }

    /// Whether what the call acted on does not exist (any more): [`ErrorKind::NotFound`].
    /// That is a file that is not there (`ENOENT`), or an ioctl's `ENXIO`/`ENODEV`/`ENOENT`
    /// (device-mapper's answer for an unknown device). A take-down treats it as done only
    /// where the call's target is known to have a single meaning for it; a flush also asks
    /// sysfs (see `ops::detach`).
    pub fn is_gone(&self) -> bool {
        self.kind() == ErrorKind::NotFound
    }
}

/// The kind of an ioctl's errno.
fn errno_kind(source: &io::Error) -> ErrorKind {
    match source.raw_os_error() {
        Some(libc::ENXIO | libc::ENODEV | libc::ENOENT) => ErrorKind::NotFound,
        Some(libc::EACCES | libc::EPERM) => ErrorKind::PermissionDenied,
        _ => ErrorKind::Other,
    }
}

/// A WWID for a message: `none` when the device reports none.
fn or_none(w: Option<&crate::id::Wwid>) -> String {
    w.map_or_else(|| "none".to_owned(), ToString::to_string)
}

/// A timed-out path makes the whole a timeout (waiting longer may help); else the first
/// failed path's kind (a permission problem stays one); else not found.
fn missing_paths_kind(paths: &[crate::scsi::scan::PathScan]) -> ErrorKind {
    use crate::scsi::scan::PathOutcome;
    if paths
        .iter()
        .any(|p| matches!(p.outcome, PathOutcome::TimedOut(_)))
    {
        return ErrorKind::Timeout;
    }
    paths
        .iter()
        .find_map(|p| match &p.outcome {
            PathOutcome::Failed(e) => Some(e.kind()),
            _ => None,
        })
        .unwrap_or(ErrorKind::NotFound)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_error_names_path_and_errno() {
        let e = Error::io(
            "/sys/block/sda/size",
            io::Error::from_raw_os_error(libc::ENXIO),
        );
        assert_eq!(e.errno(), Some(libc::ENXIO));
        let msg = e.to_string();
        assert!(msg.starts_with("/sys/block/sda/size: "), "{msg}");
        assert!(msg.contains("No such device or address"), "{msg}");
        assert_eq!(e.kind(), ErrorKind::Other);
    }

    #[test]
    fn kinds_follow_errno() {
        // An ioctl's ENXIO is an unknown device (dm); a file's is also an offline disk's
        // open (sd_open), which is still there: not gone.
        for errno in [libc::ENXIO, libc::ENODEV, libc::ENOENT] {
            let io = Error::io("/dev/sdc", io::Error::from_raw_os_error(errno));
            let ioctl = Error::Ioctl {
                op: "DM_DEV_STATUS",
                target: "mpatha".into(),
                source: io::Error::from_raw_os_error(errno),
            };
            assert_eq!(io.is_gone(), errno == libc::ENOENT, "{io}");
            assert_eq!(ioctl.kind(), ErrorKind::NotFound, "{ioctl}");
            assert!(ioctl.is_gone());
        }
        let busy = |source| Error::Ioctl {
            op: "DM_DEV_REMOVE",
            target: "mpatha".into(),
            source,
        };
        assert_eq!(
            busy(io::Error::from_raw_os_error(libc::EBUSY)).kind(),
            ErrorKind::Busy
        );
        assert!(!busy(io::Error::from_raw_os_error(libc::EIO)).is_gone());
        let e = Error::io("/x", io::Error::from_raw_os_error(libc::ENOENT));
        assert_eq!(e.kind(), ErrorKind::NotFound);
        let e = Error::io("/x", io::Error::from_raw_os_error(libc::EACCES));
        assert_eq!(e.kind(), ErrorKind::PermissionDenied);
        // A subsystem refusing the host's DH-HMAC-CHAP secret, or wanting one.
        let connect = |errno| Error::Connect {
            target: "nqn.2014-08.org.example:a at 192.0.2.1:4420".into(),
            hint: "",
            source: io::Error::from_raw_os_error(errno),
        };
        for (errno, kind) in [
            (libc::EKEYREJECTED, ErrorKind::PermissionDenied),
            (libc::ENOKEY, ErrorKind::PermissionDenied),
            (libc::ECONNREFUSED, ErrorKind::NotFound),
            (libc::EIO, ErrorKind::Other),
        ] {
            assert_eq!(connect(errno).kind(), kind, "{errno}");
        }
        let refused = Error::Refused { what: "x".into() };
        assert_eq!(refused.kind(), ErrorKind::PermissionDenied);
    }

    #[test]
    fn invalid_truncates_long_input_on_char_boundary() {
        let long = "é".repeat(300);
        let Error::Invalid { input, .. } = Error::invalid("H:C:T:L", &long, "too long") else {
            unreachable!()
        };
        assert!(input.len() <= 256);
        assert!(long.starts_with(&input));
    }
}

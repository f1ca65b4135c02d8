//! The plugin's errors and the gRPC status each becomes.
//!
//! Every error names the volume (or path) and the cause. [`code_of`] maps lunkit's
//! [`ErrorKind`] to the code the CSI spec asks for; [`Error`] carries that code to
//! [`tonic::Status`].

use lunkit::ErrorKind;
use tonic::{Code, Status};

/// What a CSI call failed with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request is malformed: a missing id, path or capability, a bad volume attribute.
    #[error("{0}")]
    InvalidArgument(String),
    /// The volume (or what a call names) does not exist on this node.
    #[error("{0}")]
    NotFound(String),
    /// The call cannot go ahead in the node's current state (still published, in use, another
    /// filesystem on the device); nothing was changed.
    #[error("{0}")]
    FailedPrecondition(String),
    /// The volume is staged or published here already, incompatibly with this request.
    #[error("{0}")]
    AlreadyExists(String),
    /// Another call on the same volume is in progress.
    #[error("{0}")]
    Aborted(String),
    /// A capability this plugin does not offer (an NVMe transport other than TCP, growing a
    /// filesystem it cannot grow).
    #[error("{0}")]
    Unimplemented(String),
    /// A deadline passed.
    #[error("{0}")]
    DeadlineExceeded(String),
    /// The storage refused this node: an iSCSI login rejected for its credentials (CHAP) or
    /// its authorization (the target's ACL).
    #[error("{0}")]
    PermissionDenied(String),
    /// A lunkit workflow failed: `context` says on what volume and in which step.
    #[error("{context}: {source}")]
    Lunkit {
        /// `volume pv-1: attach iSCSI iqn... LUN 3`.
        context: String,
        /// What lunkit said (boxed: lunkit's error carries a WWID mismatch's new paths, and
        /// every `Result` of the plugin would carry its size).
        source: Box<lunkit::Error>,
    },
    /// A program the plugin runs (iscsiadm, mkfs, blkid) failed.
    #[error("{0}")]
    Program(String),
    /// Anything else: a failed mount, an unreadable state record.
    #[error("{0}")]
    Internal(String),
}

/// The gRPC code for a lunkit error kind.
///
/// - `NotFound`: the LUN or session is not there: `NOT_FOUND`.
/// - `Invalid`: a malformed IQN, WWID or path: `INVALID_ARGUMENT`.
/// - `Busy`: the device is in use (mounted, bind-mounted by kubelet, a loop device on it):
///   `FAILED_PRECONDITION`, nothing removed.
/// - `Unverified`: whether it is in use could not be checked completely (a process whose
///   open files cannot be read): `FAILED_PRECONDITION` too, since nothing was removed and a
///   retry gives the same answer until the node changes.
/// - `Timeout`: `DEADLINE_EXCEEDED`; the CO retries.
/// - `PermissionDenied`: `PERMISSION_DENIED` (the plugin lacks a privilege).
/// - anything else: `INTERNAL`.
pub fn code_of(kind: ErrorKind) -> Code {
    match kind {
        ErrorKind::NotFound => Code::NotFound,
        ErrorKind::Invalid => Code::InvalidArgument,
        ErrorKind::Busy | ErrorKind::Unverified | ErrorKind::ReservationConflict => {
            Code::FailedPrecondition
        }
        ErrorKind::Timeout => Code::DeadlineExceeded,
        ErrorKind::PermissionDenied => Code::PermissionDenied,
        _ => Code::Internal,
    }
}

impl Error {
    /// The gRPC code this error is answered with.
    pub fn code(&self) -> Code {
        match self {
            Error::InvalidArgument(_) => Code::InvalidArgument,
            Error::NotFound(_) => Code::NotFound,
            Error::FailedPrecondition(_) => Code::FailedPrecondition,
            Error::AlreadyExists(_) => Code::AlreadyExists,
            Error::Aborted(_) => Code::Aborted,
            Error::Unimplemented(_) => Code::Unimplemented,
            Error::DeadlineExceeded(_) => Code::DeadlineExceeded,
            Error::PermissionDenied(_) => Code::PermissionDenied,
            Error::Lunkit { source, .. } => code_of(source.kind()),
            Error::Program(_) | Error::Internal(_) => Code::Internal,
        }
    }

    /// Wraps a lunkit error with what was being done to which volume.
    pub fn lunkit(context: impl Into<String>, source: lunkit::Error) -> Error {
        Error::Lunkit {
            context: context.into(),
            source: Box::new(source),
        }
    }
}

impl From<Error> for Status {
    fn from(e: Error) -> Status {
        Status::new(e.code(), e.to_string())
    }
}

/// The result of a plugin step.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lunkit_kinds_map_to_the_codes_the_spec_names() {
        let cases = [
            (ErrorKind::NotFound, Code::NotFound),
            (ErrorKind::Invalid, Code::InvalidArgument),
            (ErrorKind::Busy, Code::FailedPrecondition),
            (ErrorKind::Unverified, Code::FailedPrecondition),
            (ErrorKind::ReservationConflict, Code::FailedPrecondition),
            (ErrorKind::Timeout, Code::DeadlineExceeded),
            (ErrorKind::PermissionDenied, Code::PermissionDenied),
            (ErrorKind::Other, Code::Internal),
        ];
        for (kind, code) in cases {
            assert_eq!(code_of(kind), code, "{kind:?}");
        }
    }

    #[test]
    fn a_wrapped_lunkit_error_keeps_its_kind_and_names_the_volume() {
        let source = lunkit::Error::invalid("iSCSI target name", "bad name", "must be printable");
        let e = Error::lunkit("volume pv-1: attach", source);
        assert_eq!(e.code(), Code::InvalidArgument);
        let status = Status::from(e);
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(
            status.message().starts_with("volume pv-1: attach: "),
            "{}",
            status.message()
        );
        assert!(
            status.message().contains("bad name"),
            "{}",
            status.message()
        );
    }
}

//! iSCSI transport discovery: which SCSI host and target id a session to a target IQN has.
//!
//! The scan itself is the generic one: `0 <target_id> <lun>` to the session's host reaches the
//! kernel's `iscsi_user_scan`, which scans exactly that LUN on sessions that are `LOGGED_IN`.

use crate::error::{Error, Result};
use crate::hctl::Hctl;
use crate::root::Root;
use crate::scsi::{self, PathDevice, ScanOptions, ScanTarget};
use crate::sysfs::iscsi::{IscsiSession, sessions_to};

/// Checks an IQN/EUI target name: printable, no spaces or `/`, at most 223 bytes (RFC 3720).
pub fn check_target_name(name: &str) -> Result<()> {
    const KIND: &str = "iSCSI target name";
    if name.is_empty() || name.len() > 223 {
        return Err(Error::invalid(KIND, name, "must be 1 to 223 bytes"));
    }
    if !name.bytes().all(|b| b.is_ascii_graphic() && b != b'/') {
        return Err(Error::invalid(
            KIND,
            name,
            "must be printable ASCII without spaces or '/'",
        ));
    }
    Ok(())
}

/// The sessions to `target` that can be scanned: `LOGGED_IN`, with a host and target id, and,
/// when `portals` is not empty, through one of those portals (`addr:port`).
pub fn scannable_sessions(
    root: &Root,
    target: &str,
    portals: &[String],
) -> Result<Vec<IscsiSession>> {
    check_target_name(target)?;
    let found: Vec<IscsiSession> = sessions_to(root, target)?
        .into_iter()
        .filter(|s| portals.is_empty() || s.portal().is_some_and(|p| portals.contains(&p)))
        .filter(|s| s.state.as_deref() == Some("LOGGED_IN"))
        .filter(|s| s.host.is_some() && s.target_id.is_some())
        .collect();
    if found.is_empty() {
        let via = if portals.is_empty() {
            String::new()
        } else {
            format!(" through {}", portals.join(", "))
        };
        return Err(Error::NotFound {
            what: format!("logged-in iSCSI session to {target}{via}"),
        });
    }
    Ok(found)
}

/// Scans LUN `lun` on every logged-in session to `target` (optionally only through `portals`)
/// and returns one path device per session, in session order. Sessions to other targets are
/// never touched.
pub fn scan(
    root: &Root,
    target: &str,
    portals: &[String],
    lun: u64,
    opts: &ScanOptions,
) -> Result<Vec<PathDevice>> {
    let targets: Vec<ScanTarget> = scannable_sessions(root, target, portals)?
        .iter()
        .filter_map(|s| Some(ScanTarget::exact(Hctl::new(s.host?, 0, s.target_id?, lun))))
        .collect();
    scsi::scan_targets(root, &targets, opts)
}

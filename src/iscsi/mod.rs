//! iSCSI transport discovery: which SCSI host and target id a session to a target IQN has.
//!
//! The scan itself is the generic one: `0 <target_id> <lun>` to the session's host reaches the
//! kernel's `iscsi_user_scan`, which scans exactly that LUN on sessions that are `LOGGED_IN`.

use std::time::Instant;

use self::sysfs::{IscsiState, Portals, SessionPath, paths_to, portal_of};
use crate::error::{Error, Result};
use crate::id::{Hctl, IscsiName};
use crate::root::Root;
use crate::scsi::ScanTarget;
use crate::scsi::scan::{Candidate, ScanOptions, ScanReport};

pub mod sysfs;

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

/// No session to `target` (through `portals`) can be scanned: the message gives the
/// `iscsiadm` commands that log one in, with the first portal asked (`PORTAL` without one).
fn no_session(target: &IscsiName, portals: &[String], ifaces: &[String]) -> Error {
    let mut via = String::new();
    if !portals.is_empty() {
        via += &format!(" through {}", portals.join(", "));
    }
    if !ifaces.is_empty() {
        via += &format!(" on iface {}", ifaces.join(", "));
    }
    let portal = portals.first().map_or("PORTAL", String::as_str);
    let iface = ifaces.first().map_or(String::new(), |i| format!(" -I {i}"));
    Error::NotFound {
        what: format!(
            "no logged-in iSCSI session to {target}{via}; log in first with \
             `iscsiadm -m node -T {target} -p {portal}{iface} --login` (after \
             `iscsiadm -m discovery -t sendtargets -p {portal}{iface}` if the node is not \
             known yet)"
        ),
    }
}

/// Which LUN an iSCSI scan brings in, and through which sessions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IscsiLun {
    /// The target's iSCSI name.
    pub target: IscsiName,
    /// Only sessions through these portals (`addr:port`, `[v6]:port`); empty for every session.
    pub portals: Vec<String>,
    /// Only sessions logged in through these open-iscsi ifaces (their `ifacename`:
    /// `default`, or an iface record's name); empty for every session. Another iface's
    /// session to the same target is someone else's (another driver, a session made by
    /// hand): a caller that owns one iface's sessions scans only through those.
    pub ifaces: Vec<String>,
    /// The LUN.
    pub lun: u64,
}

impl IscsiLun {
    /// LUN `lun` of `target`, on every session.
    pub fn new(target: IscsiName, lun: u64) -> IscsiLun {
        IscsiLun {
            target,
            portals: Vec::new(),
            ifaces: Vec::new(),
            lun,
        }
    }
}

/// Scans the LUN on every logged-in session to its target (optionally only through some
/// portals), all sessions at once, and reports every session's outcome; sessions in
/// recovery are listed as skipped. Sessions to other targets are never touched.
///
/// It succeeds when [`ScanOptions::min_paths`] sessions brought the LUN; see
/// [`crate::scsi`](crate::scsi#every-path-at-once) for the outcomes and errors.
pub fn scan(root: &Root, lun: &IscsiLun, opts: &ScanOptions) -> Result<ScanReport> {
    let start = Instant::now();
    // Each path's scan write runs on a helper thread: start them while the sessions are read
    // (two, as most nodes have; `scan_paths` starts more if there are more paths).
    crate::helper::prewarm(2);
    // Only what the writes need: a portal costs reads of its own, made before the writes
    // only when the caller chose paths by portal, and otherwise once the writes are in
    // flight (`portal_of` in the namer below), for the report.
    let portals = if lun.portals.is_empty() {
        Portals::Any
    } else {
        Portals::Only(&lun.portals)
    };
    let mut sessions: Vec<SessionPath> = paths_to(root, &lun.target, portals)?;
    if !lun.ifaces.is_empty() {
        // A session whose iface cannot be read is not known to be one of them: left out.
        sessions.retain(|s| sysfs::iface_of(root, s.sid).is_some_and(|i| lun.ifaces.contains(&i)));
    }
    let candidates: Vec<Candidate> = sessions
        .iter()
        .map(|s| {
            let via = match &s.portal {
                Some(p) => format!("session{} ({p})", s.sid),
                None => format!("session{}", s.sid),
            };
            let hctl = s
                .host
                .zip(s.target_id)
                .map(|(h, t)| Hctl::new(h, 0, t, lun.lun));
            match (&s.state, hctl) {
                (Some(IscsiState::LoggedIn), Some(hctl)) => Candidate::Scan {
                    via,
                    target: ScanTarget::exact(hctl),
                },
                (state, hctl) => Candidate::Skip {
                    via,
                    hctl,
                    why: match (state, hctl) {
                        (_, None) => "the session has no SCSI host or target yet".into(),
                        (Some(st), _) => format!("session state {st}, not LOGGED_IN"),
                        (None, _) => "the session state cannot be read".into(),
                    },
                },
            }
        })
        .collect();
    let portal = |i: usize| {
        let s = sessions.get(i).filter(|s| s.portal.is_none())?;
        Some(format!("({})", portal_of(root, s.sid)?))
    };
    let what = format!("LUN {} of iSCSI target {}", lun.lun, lun.target);
    let none = || no_session(&lun.target, &lun.portals, &lun.ifaces);
    crate::scsi::scan::scan_paths(root, &what, start, candidates, &portal, &none, opts)
}

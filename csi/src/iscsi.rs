//! iSCSI sessions: logging in to a volume's portals before its LUN is scanned, and out again
//! once a session carries no LUN this node uses.
//!
//! Logging in is the one iSCSI step lunkit leaves to open-iscsi. Before each login the node
//! record gets `node.session.scan = manual`, so the login scans no LUN (a whole-target scan
//! brings in every LUN of the target: phantom devices and uevent storms), and
//! `node.startup = manual`, so iscsid does not log in again at boot behind the plugin's back.
//! A volume with session CHAP gets its credentials set on the record in the same
//! `-o update` call (the passwords on iscsiadm's command line: see [`crate::exec`]).
//!
//! A login that fails deletes the node record again: `-o new` made it (open-iscsi 2.1
//! replaces a record that was there), and a record left behind would keep the CHAP secret on
//! the node with nothing to take it away. Unstage deletes the records of the portals it logs
//! out of, and of the volume's portals that have no session left.

use std::time::{Duration, Instant};

use lunkit::Root;
use lunkit::sysfs::iscsi::{IscsiSession, sessions_to};

use crate::attrs::Chap;
use crate::error::{Error, Result};
use crate::exec::{self, Program};

/// iscsiadm's exit code for "session exists" (`ISCSI_ERR_SESS_EXISTS`).
const SESSION_EXISTS: i32 = 15;
/// iscsiadm's exit code for "no matching session or record" (`ISCSI_ERR_NO_OBJS_FOUND`).
const NO_OBJECTS: i32 = 21;
/// iscsiadm's exit code for a login the target refused for the initiator's credentials or
/// its authorization (`ISCSI_ERR_LOGIN_AUTH_FAILED`; open-iscsi's initiator.c maps both login
/// statuses 0x0201, authentication failure, and 0x0202, authorization failure, to it).
pub const LOGIN_AUTH_FAILED: i32 = 24;

/// The sessions to `iqn` through `portal`.
fn sessions_via(root: &Root, iqn: &str, portal: &str) -> Result<Vec<IscsiSession>> {
    let all = sessions_to(root, iqn)
        .map_err(|e| Error::lunkit(format!("reading the iSCSI sessions to {iqn}"), e))?;
    Ok(all
        .into_iter()
        .filter(|s| s.portal().as_deref() == Some(portal))
        .collect())
}

fn remaining(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}

fn node_args<'a>(iqn: &'a str, portal: &'a str, iface: Option<&'a str>) -> Vec<&'a str> {
    let mut a = vec!["-m", "node", "-T", iqn, "-p", portal];
    if let Some(i) = iface {
        a.extend(["-I", i]);
    }
    a
}

/// What [`login`] did on each portal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Login {
    /// Portals that had a session already.
    pub existing: Vec<String>,
    /// Portals logged in to now.
    pub new: Vec<String>,
    /// Portals whose login failed, with iscsiadm's words.
    pub failed: Vec<(String, String)>,
    /// Those of [`failed`](Self::failed) the target refused for the node's credentials or
    /// authorization ([`LOGIN_AUTH_FAILED`]).
    pub refused: Vec<String>,
}

/// Why one portal's login failed.
enum Failure {
    /// The target refused the initiator ([`LOGIN_AUTH_FAILED`]).
    Refused(String),
    /// Anything else.
    Other(String),
}

/// Logs in to `iqn` through every portal that has no session yet, with manual scan and, when
/// `chap` is given, session CHAP. Succeeds when at least one portal has a session afterwards
/// (the others are reported in [`Login::failed`]); fails naming every portal's error
/// otherwise: `PERMISSION_DENIED` when the target refused the node's credentials or
/// authorization on a portal, `INTERNAL` else.
pub fn login(
    root: &Root,
    iqn: &str,
    portals: &[String],
    iface: Option<&str>,
    chap: Option<&Chap>,
    deadline: Instant,
) -> Result<Login> {
    let mut done = Login {
        existing: Vec::new(),
        new: Vec::new(),
        failed: Vec::new(),
        refused: Vec::new(),
    };
    for portal in portals {
        if !sessions_via(root, iqn, portal)?.is_empty() {
            done.existing.push(portal.clone());
            continue;
        }
        match login_one(iqn, portal, iface, chap, deadline) {
            Ok(()) => done.new.push(portal.clone()),
            Err(Failure::Refused(why)) => {
                done.refused.push(portal.clone());
                done.failed.push((portal.clone(), why));
            }
            Err(Failure::Other(why)) => done.failed.push((portal.clone(), why)),
        }
    }
    if done.existing.is_empty() && done.new.is_empty() {
        let why: Vec<String> = done
            .failed
            .iter()
            .map(|(p, e)| format!("{p}: {e}"))
            .collect();
        if !done.refused.is_empty() {
            return Err(Error::PermissionDenied(format!(
                "the iSCSI target {iqn} refused this node's login through {} (authentication \
                 or authorization failed, iscsiadm exit {LOGIN_AUTH_FAILED}: check the CHAP \
                 secret and the target's ACL for this node's initiator name): {}",
                done.refused.join(", "),
                why.join("; ")
            )));
        }
        return Err(Error::Program(format!(
            "no session to {iqn} could be logged in: {}",
            why.join("; ")
        )));
    }
    Ok(done)
}

fn login_one(
    iqn: &str,
    portal: &str,
    iface: Option<&str>,
    chap: Option<&Chap>,
    deadline: Instant,
) -> std::result::Result<(), Failure> {
    let other = |e: Error| Failure::Other(e.to_string());
    let base = node_args(iqn, portal, iface);
    // The node record for this target and portal (open-iscsi 2.1 replaces one that is there).
    let mut new = base.clone();
    new.extend(["-o", "new"]);
    exec::run(Program::Iscsiadm, &new, remaining(deadline)).map_err(other)?;
    // Every setting in one call: one process instead of one per setting.
    let mut settings = vec![("node.session.scan", "manual"), ("node.startup", "manual")];
    if let Some(c) = chap {
        settings.extend(c.settings());
    }
    let mut update = base.clone();
    update.extend(["-o", "update"]);
    for (name, value) in &settings {
        update.extend(["-n", name, "-v", value]);
    }
    if let Err(e) = exec::run_ok(Program::Iscsiadm, &update, remaining(deadline)) {
        delete_record(&base, deadline);
        return Err(other(e));
    }
    let mut login = base.clone();
    login.push("--login");
    let out = exec::run(Program::Iscsiadm, &login, remaining(deadline)).map_err(other)?;
    match out.code {
        Some(0) | Some(SESSION_EXISTS) => Ok(()),
        code => {
            delete_record(&base, deadline);
            let said = out.describe(Program::Iscsiadm, &login);
            Err(if code == Some(LOGIN_AUTH_FAILED) {
                Failure::Refused(said)
            } else {
                Failure::Other(said)
            })
        }
    }
}

/// Deletes the node record `base` names (`-m node -T IQN -p PORTAL [-I IFACE]`), best effort:
/// a record that is not there is what was wanted.
fn delete_record(base: &[&str], deadline: Instant) {
    let mut delete = base.to_vec();
    delete.extend(["-o", "delete"]);
    let _ = exec::run(Program::Iscsiadm, &delete, remaining(deadline));
}

/// Logs out of the sessions to `iqn` through `portals` whose SCSI host has no device left, and
/// deletes their node records, and the records of the portals that have no session at all (a
/// portal whose login failed, or whose session went away): the caller has made sure that no
/// other volume of this node uses the target. Returns the portals logged out of.
pub fn logout_unused(
    root: &Root,
    iqn: &str,
    portals: &[String],
    iface: Option<&str>,
    deadline: Instant,
) -> Result<Vec<String>> {
    let devices = lunkit::sysfs::scsi::devices(root)
        .map_err(|e| Error::lunkit("reading the SCSI devices", e))?;
    let mut out = Vec::new();
    for portal in portals {
        let sessions = sessions_via(root, iqn, portal)?;
        if sessions.is_empty() {
            delete_record(&node_args(iqn, portal, iface), deadline);
        }
        for s in sessions {
            let Some(host) = s.host else { continue };
            if devices.iter().any(|d| d.hctl.host == host) {
                continue;
            }
            let base = node_args(iqn, portal, iface);
            let mut logout = base.clone();
            logout.push("--logout");
            let o = exec::run(Program::Iscsiadm, &logout, remaining(deadline))?;
            if !matches!(o.code, Some(0) | Some(NO_OBJECTS)) {
                return Err(Error::Program(o.describe(Program::Iscsiadm, &logout)));
            }
            delete_record(&base, deadline);
            out.push(portal.clone());
        }
    }
    Ok(out)
}

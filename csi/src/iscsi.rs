//! iSCSI sessions: logging in to a volume's portals before its LUN is scanned, and out again
//! once a session carries no LUN this node uses.
//!
//! Logging in is the one iSCSI step lunkit leaves to open-iscsi. Before each login the node
//! record gets `node.session.scan = manual`, so the login scans no LUN (a whole-target scan
//! brings in every LUN of the target: phantom devices and uevent storms), and
//! `node.startup = manual`, so iscsid does not log in again at boot behind the plugin's back.

use std::time::{Duration, Instant};

use lunkit::Root;
use lunkit::sysfs::iscsi::{IscsiSession, sessions_to};

use crate::error::{Error, Result};
use crate::exec::{self, Program};

/// iscsiadm's exit code for "session exists" (`ISCSI_ERR_SESS_EXISTS`).
const SESSION_EXISTS: i32 = 15;
/// iscsiadm's exit code for "no matching session or record" (`ISCSI_ERR_NO_OBJS_FOUND`).
const NO_OBJECTS: i32 = 21;

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
}

/// Logs in to `iqn` through every portal that has no session yet, with manual scan. Succeeds
/// when at least one portal has a session afterwards (the others are reported in
/// [`Login::failed`]); fails naming every portal's error otherwise.
pub fn login(
    root: &Root,
    iqn: &str,
    portals: &[String],
    iface: Option<&str>,
    deadline: Instant,
) -> Result<Login> {
    let mut done = Login {
        existing: Vec::new(),
        new: Vec::new(),
        failed: Vec::new(),
    };
    for portal in portals {
        if !sessions_via(root, iqn, portal)?.is_empty() {
            done.existing.push(portal.clone());
            continue;
        }
        match login_one(iqn, portal, iface, deadline) {
            Ok(()) => done.new.push(portal.clone()),
            Err(e) => done.failed.push((portal.clone(), e.to_string())),
        }
    }
    if done.existing.is_empty() && done.new.is_empty() {
        let why: Vec<String> = done
            .failed
            .iter()
            .map(|(p, e)| format!("{p}: {e}"))
            .collect();
        return Err(Error::Program(format!(
            "no session to {iqn} could be logged in: {}",
            why.join("; ")
        )));
    }
    Ok(done)
}

fn login_one(iqn: &str, portal: &str, iface: Option<&str>, deadline: Instant) -> Result<()> {
    let base = node_args(iqn, portal, iface);
    // A node record for this target and portal; an existing one is kept (`-o new` on it
    // fails, which the update below tells apart from a real problem).
    let mut new = base.clone();
    new.extend(["-o", "new"]);
    exec::run(Program::Iscsiadm, &new, remaining(deadline))?;
    for (name, value) in [("node.session.scan", "manual"), ("node.startup", "manual")] {
        let mut update = base.clone();
        update.extend(["-o", "update", "-n", name, "-v", value]);
        exec::run_ok(Program::Iscsiadm, &update, remaining(deadline))?;
    }
    let mut login = base.clone();
    login.push("--login");
    let out = exec::run(Program::Iscsiadm, &login, remaining(deadline))?;
    match out.code {
        Some(0) | Some(SESSION_EXISTS) => Ok(()),
        _ => Err(Error::Program(out.describe(Program::Iscsiadm, &login))),
    }
}

/// Logs out of the sessions to `iqn` through `portals` whose SCSI host has no device left,
/// unless `in_use` says another volume of this node uses the target, and deletes their node
/// records. Returns the portals logged out of.
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
        for s in sessions_via(root, iqn, portal)? {
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
            let mut delete = base;
            delete.extend(["-o", "delete"]);
            let _ = exec::run(Program::Iscsiadm, &delete, remaining(deadline));
            out.push(portal.clone());
        }
    }
    Ok(out)
}

//! The open-iscsi initiator: iscsid, sendtargets discovery and logins with
//! `node.session.scan = manual`, so that logging in creates a session and a SCSI host but no
//! LUN: tests scan exactly the LUNs they want (docs/DESIGN.md, lesson 1).

use std::fs;
use std::time::Duration;

use super::{Result, cmd, sysfs, wait};

const ISCSID_CONF: &str = "/etc/iscsi/iscsid.conf";

/// A logged-in session as sysfs shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    pub sid: u32,
    /// The SCSI host iscsi_tcp created for this session.
    pub host: u32,
    pub target: String,
    /// `address:port` the session was logged in through.
    pub portal: String,
}

/// Sets the manual scan default for new node records and starts iscsid unless it runs. /etc
/// is an overlay in the guest, so the host's configuration is not touched. Returns whether it
/// started iscsid, so the caller can [`stop_iscsid`] what it started.
pub fn ensure_iscsid() -> Result<bool> {
    let conf = fs::read_to_string(ISCSID_CONF).unwrap_or_default();
    let mut out: String = conf
        .lines()
        .filter(|l| !l.trim_start().starts_with("node.session.scan"))
        .map(|l| format!("{l}\n"))
        .collect();
    out.push_str("node.session.scan = manual\n");
    fs::write(ISCSID_CONF, out).map_err(|e| format!("write {ISCSID_CONF}: {e}"))?;
    if cmd::process_running("iscsid") {
        return Ok(false);
    }
    cmd::run("modprobe", &["iscsi_tcp"])?;
    cmd::run("iscsid", &[])?;
    wait::until_true("iscsid to start", Duration::from_secs(10), || {
        cmd::process_running("iscsid")
    })?;
    Ok(true)
}

/// Stops iscsid (`iscsiadm -k 0`, then SIGKILL if it lingers) and waits until it is gone. It
/// does not log sessions out: call [`logout_all`] first. A daemon left running would outlive
/// the test that started it and answer for the next one.
pub fn stop_iscsid() -> Result<()> {
    if !cmd::process_running("iscsid") {
        return Ok(());
    }
    cmd::run_bounded("iscsiadm", &["-k", "0"], Duration::from_secs(10));
    let gone = || !cmd::process_running("iscsid");
    if wait::until_true("iscsid to exit", Duration::from_secs(10), gone).is_ok() {
        return Ok(());
    }
    for pid in cmd::pids_of("iscsid") {
        cmd::run_ignoring_failure("kill", &["-KILL", &pid.to_string()]);
    }
    wait::until_true(
        "iscsid to exit after SIGKILL",
        Duration::from_secs(10),
        gone,
    )
}

/// SendTargets discovery through `portal`; creates node records for every portal advertised.
pub fn discover(portal: &str) -> Result<String> {
    cmd::run(
        "iscsiadm",
        &["-m", "discovery", "-t", "sendtargets", "-p", portal],
    )
}

/// Logs in to `target` through `portal` with manual scan and returns the new session.
pub fn login(target: &str, portal: &str) -> Result<Session> {
    // The node record may predate ensure_iscsid (discovery copies iscsid.conf): force it.
    cmd::run(
        "iscsiadm",
        &[
            "-m",
            "node",
            "-T",
            target,
            "-p",
            portal,
            "-o",
            "update",
            "-n",
            "node.session.scan",
            "-v",
            "manual",
        ],
    )?;
    cmd::run(
        "iscsiadm",
        &["-m", "node", "-T", target, "-p", portal, "--login"],
    )?;
    wait::until(
        &format!("the session to {target} through {portal}"),
        Duration::from_secs(30),
        || {
            Ok(sessions()
                .into_iter()
                .find(|s| s.target == target && s.portal == portal))
        },
    )
}

/// Logs out of every session (ignoring "no session" errors) and deletes the node records.
pub fn logout_all() {
    cmd::run_ignoring_failure("iscsiadm", &["-m", "node", "--logoutall=all"]);
    cmd::run_ignoring_failure("iscsiadm", &["-m", "node", "-o", "delete"]);
}

/// The sessions sysfs knows, read with std::fs (ground truth for tests).
pub fn sessions() -> Vec<Session> {
    let mut v: Vec<Session> = sysfs::names("/sys/class/iscsi_session")
        .iter()
        .filter_map(|name| {
            let dir = format!("/sys/class/iscsi_session/{name}");
            let sid = sysfs::number_after(name, "session")?;
            // The session device sits under its host: .../platform/host6/session1.
            let dev = sysfs::resolve(format!("{dir}/device"))?;
            let host = sysfs::number_after(dev.parent()?.file_name()?.to_str()?, "host")?;
            let conn = format!("/sys/class/iscsi_connection/connection{sid}:0");
            let address = sysfs::attr(format!("{conn}/persistent_address"))?;
            let port = sysfs::attr(format!("{conn}/persistent_port"))?;
            Some(Session {
                sid,
                host,
                target: sysfs::attr(format!("{dir}/targetname"))?,
                portal: format!("{address}:{port}"),
            })
        })
        .collect();
    v.sort_by_key(|s| s.sid);
    v
}

/// Scans one LUN on a session's host (`0 0 LUN` to `hostN/scan`, target id 0 for iscsi_tcp)
/// and waits until its disk appears (sd probes asynchronously after the write returns).
pub fn scan_lun(session: &Session, lun: u32) -> Result<String> {
    let scan = format!("/sys/class/scsi_host/host{}/scan", session.host);
    fs::write(&scan, format!("0 0 {lun}")).map_err(|e| format!("write {scan}: {e}"))?;
    let hctl = format!("{}:0:0:{lun}", session.host);
    wait::until(
        &format!("the disk of {hctl}"),
        Duration::from_secs(30),
        || {
            Ok(
                sysfs::names(format!("/sys/class/scsi_device/{hctl}/device/block"))
                    .into_iter()
                    .next(),
            )
        },
    )
}

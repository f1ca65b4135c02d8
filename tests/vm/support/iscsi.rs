//! The open-iscsi initiator: iscsid, sendtargets discovery and logins with
//! `node.session.scan = manual`, so that logging in creates a session and a SCSI host but no
//! LUN: tests scan exactly the LUNs they want (docs/DESIGN.md, lesson 1).

use std::fs;
use std::time::Duration;

use super::{Result, cmd, sysfs, wait};

const ISCSID_CONF: &str = "/etc/iscsi/iscsid.conf";
/// open-iscsi's node records (Debian's place).
const NODES: &str = "/etc/iscsi/nodes";

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
    cmd::modprobe(&["iscsi_tcp"])?;
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
    manual_scan(target, portal)?;
    cmd::run(
        "iscsiadm",
        &["-m", "node", "-T", target, "-p", portal, "--login"],
    )?;
    wait_session(target, portal)
}

/// Discovers `target` and logs in through each of `portals` with manual scan: one
/// SendTargets discovery when it advertises every portal (LIO advertises each portal of its
/// TPG), and one `--login` for all of them when discovery made node records for exactly
/// these portals. The sessions, in portal order. What [`discover`] and [`login`] per
/// portal do, in fewer processes: each iscsiadm costs 0.1 to 1 s under TCG.
pub fn discover_and_login(target: &str, portals: &[String]) -> Result<Vec<Session>> {
    let mut records: Vec<String> = Vec::new();
    for portal in portals {
        if !records.contains(portal) {
            records.extend(
                discover(portal)?
                    .lines()
                    .filter_map(|l| {
                        let (at, iqn) = l.trim().split_once(' ')?;
                        let (addr, _tpgt) = at.rsplit_once(',')?;
                        (iqn == target).then(|| addr.to_owned())
                    })
                    .collect::<Vec<_>>(),
            );
        }
    }
    records.sort();
    records.dedup();
    let mut wanted = portals.to_vec();
    wanted.sort();
    if records != wanted {
        return portals.iter().map(|p| login(target, p)).collect();
    }
    for portal in portals {
        manual_scan(target, portal)?;
    }
    cmd::run("iscsiadm", &["-m", "node", "-T", target, "--login"])?;
    portals.iter().map(|p| wait_session(target, p)).collect()
}

/// Makes sure the node record of `target` through `portal` scans manually: discovery copies
/// iscsid.conf's default, which [`ensure_iscsid`] sets, but a record may predate it. Read
/// from the record (no process) and forced with iscsiadm only when it says otherwise.
fn manual_scan(target: &str, portal: &str) -> Result<()> {
    if record_scans_manually(target, portal) {
        return Ok(());
    }
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
    Ok(())
}

/// Whether every node record of `target` through `portal` (`/etc/iscsi/nodes/TARGET/
/// ADDR,PORT,TPGT/IFACE`) has `node.session.scan = manual`; `false` when there is none.
fn record_scans_manually(target: &str, portal: &str) -> bool {
    let dir = std::path::Path::new(NODES).join(target);
    let prefix = format!("{portal},");
    let mut files = Vec::new();
    for name in sysfs::names(&dir) {
        if !name.starts_with(&prefix) {
            continue;
        }
        let at = dir.join(&name);
        if at.is_dir() {
            files.extend(sysfs::names(&at).into_iter().map(|f| at.join(f)));
        } else {
            files.push(at);
        }
    }
    !files.is_empty()
        && files.iter().all(|f| {
            fs::read_to_string(f)
                .is_ok_and(|t| t.lines().any(|l| l.trim() == "node.session.scan = manual"))
        })
}

/// Waits until sysfs shows the session to `target` through `portal`.
fn wait_session(target: &str, portal: &str) -> Result<Session> {
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
///
/// Each step runs only when there is something for it (a session in sysfs, a record in
/// `/etc/iscsi/nodes`): a CSI test's plugin has usually logged out and deleted its records
/// itself, and an iscsiadm costs 0.1 to 1 s under TCG.
pub fn logout_all() {
    if !sysfs::names("/sys/class/iscsi_session").is_empty() {
        cmd::run_ignoring_failure("iscsiadm", &["-m", "node", "--logoutall=all"]);
    }
    if !sysfs::names(NODES).is_empty() {
        cmd::run_ignoring_failure("iscsiadm", &["-m", "node", "-o", "delete"]);
    }
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

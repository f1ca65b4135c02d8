//! iSCSI sessions: logging in to a volume's portals before its LUN is scanned, and out again
//! once a session carries no LUN this node uses.
//!
//! Logging in is the one iSCSI step lunkit leaves to open-iscsi. Before each login the node
//! record gets `node.session.scan = manual`, so the login scans no LUN (a whole-target scan
//! brings in every LUN of the target: phantom devices and uevent storms), and
//! `node.startup = manual`, so iscsid does not log in again at boot behind the plugin's back.
//! A volume with session CHAP gets its method and user names set in the same `-o update`
//! call; its passwords never go on a command line (where `/proc/PID/cmdline` shows them to
//! every local user): iscsiadm takes a value only there, so the plugin writes them into the
//! node record file itself ([`write_secrets`]), mode 0600, atomically, after `-o new` and
//! `-o update` made it and before `--login` reads it.
//!
//! A login that fails deletes the node record again: `-o new` made it (open-iscsi 2.1
//! replaces a record that was there), and a record left behind would keep the CHAP secret on
//! the node with nothing to take it away. Unstage deletes the records of the portals it logs
//! out of, and of the volume's portals that have no session left.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use lunkit::Root;
use lunkit::iscsi::sysfs::{IscsiSession, sessions_to};

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
    nodes: &Path,
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
        match login_one(nodes, iqn, portal, iface, chap, deadline) {
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
    nodes: &Path,
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
    if let Some(c) = chap {
        if let Err(e) = write_secrets(nodes, iqn, portal, iface, &c.secrets()) {
            delete_record(&base, deadline);
            return Err(other(e));
        }
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

/// The node record file of `iqn` through `portal` (`addr:port`, `[v6addr]:port`) on
/// `iface` in open-iscsi's node database `nodes`: `IQN/ADDR,PORT,TPGT/IFACE` once the portal
/// group tag is known, or the flat `IQN/ADDR,PORT` file that `-o new` writes without one
/// (open-iscsi 2.1.8).
pub fn record_path(nodes: &Path, iqn: &str, portal: &str, iface: Option<&str>) -> Result<PathBuf> {
    let (addr, port) = portal
        .rsplit_once(':')
        .ok_or_else(|| Error::Internal(format!("portal {portal:?} has no port")))?;
    let addr = addr.trim_start_matches('[').trim_end_matches(']');
    let flat = format!("{addr},{port}");
    let tagged = format!("{flat},");
    let dir = nodes.join(iqn);
    let entries = std::fs::read_dir(&dir).map_err(|e| {
        Error::Internal(format!("open-iscsi's node records {}: {e}", dir.display()))
    })?;
    let found = entries
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name().is_some_and(|n| {
                let n = n.to_string_lossy();
                n == flat || n.starts_with(&tagged)
            })
        })
        .ok_or_else(|| {
            Error::Internal(format!(
                "no node record of {iqn} through {portal} in {} after iscsiadm -o new",
                dir.display()
            ))
        })?;
    Ok(if found.is_dir() {
        found.join(iface.unwrap_or("default"))
    } else {
        found
    })
}

/// Writes the secret `settings` (`node.session.auth.password`...) into the node record of
/// `iqn` through `portal`, replacing any there: the record's other lines are kept, the new
/// ones go before its `# END RECORD` line, and the whole is written to a new file of mode
/// 0600 in the same directory, synced, and renamed over the record. iscsiadm reads the
/// record at `--login` and hands iscsid the credentials over its socket.
///
/// Values were checked by [`crate::attrs`]: no control character (a newline would be a
/// setting of its own), no spaces at the ends (the record's parser strips them).
pub fn write_secrets(
    nodes: &Path,
    iqn: &str,
    portal: &str,
    iface: Option<&str>,
    settings: &[(&str, &str)],
) -> Result<()> {
    rewrite_record(&record_path(nodes, iqn, portal, iface)?, settings)
}

/// Writes `settings` into the open-iscsi record file at `path` (a node record, or a
/// discovery record), as [`write_secrets`] describes.
pub fn rewrite_record(path: &Path, settings: &[(&str, &str)]) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let fail = |what: &str, e: std::io::Error| {
        Error::Internal(format!(
            "{what} the record {} (its CHAP secrets): {e}",
            path.display()
        ))
    };
    let text = std::fs::read_to_string(path).map_err(|e| fail("read", e))?;
    let text = with_settings(&text, settings);
    let tmp = path.with_file_name(format!(
        ".{}.lunkit-csi",
        path.file_name()
            .map_or_else(Default::default, |n| n.to_string_lossy())
    ));
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| fail("create a new", e))?;
    let written = f
        .write_all(text.as_bytes())
        .and_then(|()| f.sync_all())
        .and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(fail("write", e));
    }
    if let Some(dir) = path.parent() {
        let _ = std::fs::File::open(dir).and_then(|d| d.sync_all());
    }
    Ok(())
}

/// The SendTargets discovery record of `portal` (`addr:port`, `[v6addr]:port`) in the
/// open-iscsi database whose node records are in `nodes`: `../send_targets/ADDR,PORT/st_config`
/// (idbm.c's `ST_CONFIG_DIR` and `ST_CONFIG_NAME`).
pub fn discovery_record_path(nodes: &Path, portal: &str) -> Result<PathBuf> {
    let (addr, port) = portal
        .rsplit_once(':')
        .ok_or_else(|| Error::Internal(format!("portal {portal:?} has no port")))?;
    let addr = addr.trim_start_matches('[').trim_end_matches(']');
    let db = nodes.parent().unwrap_or(nodes);
    Ok(db
        .join("send_targets")
        .join(format!("{addr},{port}"))
        .join("st_config"))
}

/// The portals of `iqn` in iscsiadm's flat listing of discovered targets (`-o
/// nonpersistent`): one `ADDR:PORT,TPGT IQN` or `[V6ADDR]:PORT,TPGT IQN` line each, in the
/// order given, each once. Other targets' lines and lines of another form are skipped.
pub fn portals_of(listing: &str, iqn: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for line in listing.lines() {
        let Some((address, name)) = line.trim().split_once(' ') else {
            continue;
        };
        if name.trim() != iqn {
            continue;
        }
        let Some((portal, _tpgt)) = address.rsplit_once(',') else {
            continue;
        };
        if let Ok(p) = crate::attrs::portal(portal) {
            if !out.contains(&p) {
                out.push(p);
            }
        }
    }
    out
}

/// Asks each of `portals` for the target's portals (SendTargets), through `iface`, with
/// discovery CHAP when `chap` is given; returns the portals of `iqn` any of them
/// advertised, in the order found, each once. Nothing is left in open-iscsi's database: the
/// discovery runs with `-o nonpersistent` (no node records for the targets found, which
/// would be every target of the array with `node.startup` from iscsid.conf), and the
/// discovery record that carries the CHAP secret is deleted after. A portal that does not
/// answer is passed over; none answering fails, `PERMISSION_DENIED` when a portal refused
/// the discovery login ([`LOGIN_AUTH_FAILED`]).
pub fn discover(
    nodes: &Path,
    iqn: &str,
    portals: &[String],
    iface: Option<&str>,
    chap: Option<&Chap>,
    deadline: Instant,
) -> Result<Vec<String>> {
    let mut found: Vec<String> = Vec::new();
    let mut failed = Vec::new();
    let mut refused = false;
    for portal in portals {
        match discover_one(nodes, portal, iface, chap, deadline) {
            Ok(listing) => {
                for p in portals_of(&listing, iqn) {
                    if !found.contains(&p) {
                        found.push(p);
                    }
                }
            }
            Err((code, why)) => {
                refused |= code == Some(LOGIN_AUTH_FAILED);
                failed.push(format!("{portal}: {why}"));
            }
        }
    }
    if failed.len() == portals.len() {
        let why = format!(
            "SendTargets discovery of {iqn} failed on every portal: {}",
            failed.join("; ")
        );
        return Err(if refused {
            Error::PermissionDenied(format!(
                "{why} (the discovery login was refused: check the discovery CHAP secret)"
            ))
        } else {
            Error::Program(why)
        });
    }
    Ok(found)
}

/// One portal's SendTargets listing, or iscsiadm's exit code and words.
fn discover_one(
    nodes: &Path,
    portal: &str,
    iface: Option<&str>,
    chap: Option<&Chap>,
    deadline: Instant,
) -> std::result::Result<String, (Option<i32>, String)> {
    let Some(chap) = chap else {
        // No record needed: iscsiadm's plain discovery mode takes iscsid.conf's settings.
        let mut args = vec!["-m", "discovery", "-t", "sendtargets", "-p", portal];
        if let Some(i) = iface {
            args.extend(["-I", i]);
        }
        args.extend(["-o", "nonpersistent"]);
        return listing(&args, deadline);
    };
    let mut base = vec!["-m", "discoverydb", "-t", "sendtargets", "-p", portal];
    if let Some(i) = iface {
        base.extend(["-I", i]);
    }
    let mut new = base.clone();
    new.extend(["-o", "new"]);
    exec::run_ok(Program::Iscsiadm, &new, remaining(deadline))
        .map_err(|e| (None, e.to_string()))?;
    let found = discover_with_chap(nodes, portal, &base, chap, deadline);
    // Whatever happened: the record holds the secret.
    let mut delete = base.clone();
    delete.extend(["-o", "delete"]);
    let _ = exec::run(Program::Iscsiadm, &delete, remaining(deadline));
    found
}

/// The discovery through the record `base` names (`-m discoverydb -t sendtargets -p PORTAL
/// [-I IFACE]`), which `-o new` made: CHAP's method and user names set by iscsiadm, its
/// passwords written into the record ([`rewrite_record`]), then `--discover`.
fn discover_with_chap(
    nodes: &Path,
    portal: &str,
    base: &[&str],
    chap: &Chap,
    deadline: Instant,
) -> std::result::Result<String, (Option<i32>, String)> {
    let fail = |e: Error| (None, e.to_string());
    let mut update = base.to_vec();
    update.extend(["-o", "update"]);
    let settings = chap.settings();
    for (name, value) in &settings {
        update.extend(["-n", name, "-v", value]);
    }
    exec::run_ok(Program::Iscsiadm, &update, remaining(deadline)).map_err(fail)?;
    let path = discovery_record_path(nodes, portal).map_err(fail)?;
    rewrite_record(&path, &chap.secrets()).map_err(fail)?;
    let mut run = base.to_vec();
    run.extend(["--discover", "-o", "nonpersistent"]);
    listing(&run, deadline)
}

/// Runs an iscsiadm discovery and returns what it printed.
fn listing(args: &[&str], deadline: Instant) -> std::result::Result<String, (Option<i32>, String)> {
    let out = exec::run(Program::Iscsiadm, args, remaining(deadline))
        .map_err(|e| (None, e.to_string()))?;
    if out.code == Some(0) {
        Ok(out.stdout)
    } else {
        Err((out.code, out.describe(Program::Iscsiadm, args)))
    }
}

/// The node's initiator name: `InitiatorName=` in `<root>/etc/iscsi/initiatorname.iscsi`,
/// which iscsid reads at start; `None` when the file is not there or names none.
pub fn node_initiator_name(root: &Root) -> Result<Option<String>> {
    let path = root.etc("iscsi/initiatorname.iscsi");
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::Internal(format!("{}: {e}", path.display()))),
    };
    Ok(initiator_name_in(&text))
}

/// The `InitiatorName=` of an `initiatorname.iscsi` file's text (comments skipped).
pub fn initiator_name_in(text: &str) -> Option<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix("InitiatorName="))
        .map(|n| n.trim().to_owned())
        .filter(|n| !n.is_empty())
}

/// Checks a volume's `initiatorName` against the node's. lunkit-csi logs in with the
/// node's name only: open-iscsi keeps one session per target, portal and iface, a LUN
/// number means what the target's ACL for the initiator name maps it to, and lunkit's scan
/// of a volume's LUN goes through every session to the target through its portals. A second
/// initiator name (an iface with its own `iface.initiatorname`, as Kubernetes' in-tree plugin
/// makes) would put two sessions through one portal, each seeing its own LUN behind the same
/// number, and the scan would mix them. So another name is refused, `FAILED_PRECONDITION`
/// naming both, before anything is done; the node's own name (or none) goes ahead.
pub fn check_initiator(root: &Root, volume_id: &str, wanted: &str) -> Result<()> {
    let node = node_initiator_name(root)?;
    if node
        .as_deref()
        .is_some_and(|n| n.eq_ignore_ascii_case(wanted))
    {
        return Ok(());
    }
    Err(Error::FailedPrecondition(format!(
        "volume {volume_id}: volume attribute initiatorName {wanted:?} is not this node's \
         initiator name ({}, from {}): lunkit-csi logs in as the node only (a LUN number means \
         what the target maps it to for each initiator name, and two names' sessions through \
         one portal would mix); leave initiatorName out or set it to the node's name, and \
         give the target's ACL the node's name",
        node.as_deref()
            .map_or("none set".to_owned(), |n| format!("{n:?}")),
        root.etc("iscsi/initiatorname.iscsi").display()
    )))
}

/// The node record `text` with `settings` in place of any lines of the same names.
pub fn with_settings(text: &str, settings: &[(&str, &str)]) -> String {
    let key = |line: &str| line.split_once('=').map(|(k, _)| k.trim().to_owned());
    let mut lines: Vec<String> = text
        .lines()
        .filter(|l| !key(l).is_some_and(|k| settings.iter().any(|(n, _)| *n == k)))
        .map(str::to_owned)
        .collect();
    let end = lines
        .iter()
        .rposition(|l| l.trim_start().starts_with("# END RECORD"))
        .unwrap_or(lines.len());
    for (i, (name, value)) in settings.iter().enumerate() {
        lines.insert(end + i, format!("{name} = {value}"));
    }
    let mut out = lines.join("\n");
    out.push('\n');
    out
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
    let devices = lunkit::scsi::sysfs::devices(root)
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

#[cfg(test)]
mod tests {
    use super::*;

    const RECORD: &str = "# BEGIN RECORD 2.1.8\nnode.name = iqn.2003-01.org.example:t\n\
node.session.auth.authmethod = CHAP\nnode.session.auth.username = u\n\
node.session.auth.password = old\nnode.startup = manual\n# END RECORD\n";

    #[test]
    fn secrets_replace_their_lines_before_the_end_of_the_record() {
        let out = with_settings(
            RECORD,
            &[
                ("node.session.auth.password", "n3w secret"),
                ("node.session.auth.password_in", "in"),
            ],
        );
        assert_eq!(
            out,
            "# BEGIN RECORD 2.1.8\nnode.name = iqn.2003-01.org.example:t\n\
node.session.auth.authmethod = CHAP\nnode.session.auth.username = u\n\
node.startup = manual\nnode.session.auth.password = n3w secret\n\
node.session.auth.password_in = in\n# END RECORD\n"
        );
        // Without an end marker, at the end; the username (same prefix) is not touched.
        let out = with_settings(
            "node.session.auth.username = u\n",
            &[("node.session.auth.password", "p")],
        );
        assert_eq!(
            out,
            "node.session.auth.username = u\nnode.session.auth.password = p\n"
        );
    }

    #[test]
    fn sendtargets_listings_give_the_targets_portals_once_each() {
        let listing = "127.0.0.1:3260,1 iqn.2003-01.org.example:t\n\
127.0.0.2:3260,1 iqn.2003-01.org.example:t\n\
127.0.0.1:3260,1 iqn.2003-01.org.example:other\n\
[fd00::1]:3260,2 iqn.2003-01.org.example:t\n\
127.0.0.2:3260,1 iqn.2003-01.org.example:t\n\
iscsiadm: some warning\n";
        assert_eq!(
            portals_of(listing, "iqn.2003-01.org.example:t"),
            ["127.0.0.1:3260", "127.0.0.2:3260", "[fd00::1]:3260"]
        );
        assert!(portals_of(listing, "iqn.2003-01.org.example:none").is_empty());
        assert_eq!(
            discovery_record_path(Path::new("/etc/iscsi/nodes"), "[fd00::1]:3260").unwrap(),
            Path::new("/etc/iscsi/send_targets/fd00::1,3260/st_config")
        );
    }

    #[test]
    fn the_initiator_name_is_read_past_comments() {
        let text = "## DO NOT EDIT\n#InitiatorName=iqn.old:x\nInitiatorName=iqn.1993-08.org.debian:01:abc\n";
        assert_eq!(
            initiator_name_in(text).as_deref(),
            Some("iqn.1993-08.org.debian:01:abc")
        );
        assert_eq!(initiator_name_in("# none\nInitiatorName=\n"), None);
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("etc/iscsi")).unwrap();
        std::fs::write(root.path().join("etc/iscsi/initiatorname.iscsi"), text).unwrap();
        let r = Root::new(root.path());
        check_initiator(&r, "pv", "iqn.1993-08.org.debian:01:abc").unwrap();
        let e = check_initiator(&r, "pv", "iqn.2016-04.com.example:other").unwrap_err();
        assert!(matches!(e, Error::FailedPrecondition(_)), "{e}");
        assert!(
            e.to_string().contains("iqn.1993-08.org.debian:01:abc"),
            "{e}"
        );
    }

    #[test]
    fn the_record_is_found_by_portal_and_rewritten_owner_only() {
        use std::os::unix::fs::PermissionsExt;
        let nodes = tempfile::tempdir().unwrap();
        let iqn = "iqn.2003-01.org.example:t";
        // A record as iscsiadm -o new leaves it (tpgt -1), and one of another portal.
        let dir = nodes.path().join(iqn).join("127.0.0.1,3260,-1");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::create_dir_all(nodes.path().join(iqn).join("127.0.0.2,3260,1")).unwrap();
        let rec = dir.join("default");
        std::fs::write(&rec, RECORD).unwrap();
        std::fs::set_permissions(&rec, std::fs::Permissions::from_mode(0o644)).unwrap();
        write_secrets(
            nodes.path(),
            iqn,
            "127.0.0.1:3260",
            None,
            &[("node.session.auth.password", "s3cret")],
        )
        .unwrap();
        let text = std::fs::read_to_string(&rec).unwrap();
        assert!(
            text.contains("node.session.auth.password = s3cret\n# END RECORD"),
            "{text}"
        );
        assert!(!text.contains("= old"), "{text}");
        let mode = std::fs::metadata(&rec).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let left: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(left.len(), 1, "no temporary file left: {left:?}");
        // A portal with no record is an error naming it; IPv6 portals drop their brackets.
        let e = write_secrets(nodes.path(), iqn, "10.0.0.9:3260", None, &[]).unwrap_err();
        assert!(e.to_string().contains("10.0.0.9:3260"), "{e}");
        let v6 = nodes.path().join(iqn).join("fd00::1,3260,1");
        std::fs::write(&v6, RECORD).unwrap();
        assert_eq!(
            record_path(nodes.path(), iqn, "[fd00::1]:3260", None).unwrap(),
            v6
        );
        // The flat file `-o new` writes without a portal group tag (open-iscsi 2.1.8); a
        // portal whose address only starts the same is not it.
        let flat = nodes.path().join(iqn).join("10.0.0.1,3260");
        std::fs::write(nodes.path().join(iqn).join("10.0.0.10,3260"), RECORD).unwrap();
        std::fs::write(&flat, RECORD).unwrap();
        assert_eq!(
            record_path(nodes.path(), iqn, "10.0.0.1:3260", None).unwrap(),
            flat
        );
    }
}

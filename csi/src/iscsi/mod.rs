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
//! the node with nothing to take it away. That clean-up gets [`CLEANUP`] of its own, whatever
//! is left of the call's deadline: a login that ran out of time still takes the secret away.
//! Unstage deletes the records of the portals it logs out of, and of the volume's portals that
//! have no session left.
//!
//! **Only the volume's sessions.** Several sessions can go to one target through one portal:
//! one per open-iscsi iface. The plugin works on those of the volume's iface only (its PV's
//! `iscsiInterface`, `default` when it names none) that present the initiator name that iface
//! logs in with ([`Owner`]). A session on another iface, an administrator's or another
//! driver's, is never taken for the volume's at login, never logged out (the plugin logs out
//! by session id, `-m session -r SID -u`, where `-m node -T IQN -p PORTAL --logout` would end
//! every iface's session), and its node record is never deleted (every `-m node` call names
//! the iface, `-I IFACE`).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use lunkit::Root;
use lunkit::iscsi::sysfs::{IscsiSession, iface_of, sessions_to};

use crate::attrs::Chap;
use crate::error::{Error, Result};
use crate::exec::{self, Output, Program};

mod stage;

pub(crate) use stage::target_of;

/// iscsiadm's exit code for "session exists" (`ISCSI_ERR_SESS_EXISTS`).
const SESSION_EXISTS: i32 = 15;
/// iscsiadm's exit code for "no matching session or record" (`ISCSI_ERR_NO_OBJS_FOUND`).
const NO_OBJECTS: i32 = 21;
/// iscsiadm's exit code for "session not found" (`ISCSI_ERR_SESS_NOT_FOUND`).
const SESSION_NOT_FOUND: i32 = 2;
/// iscsiadm's exit code for a login the target refused for the initiator's credentials or
/// its authorization (`ISCSI_ERR_LOGIN_AUTH_FAILED`; open-iscsi's initiator.c maps both login
/// statuses 0x0201, authentication failure, and 0x0202, authorization failure, to it).
pub const LOGIN_AUTH_FAILED: i32 = 24;

/// How long the deletion of a record that may hold a CHAP secret gets, whatever is left of
/// the call's deadline (often nothing, after a login that timed out).
pub const CLEANUP: Duration = Duration::from_secs(5);

/// open-iscsi's iface when a volume names none.
pub const DEFAULT_IFACE: &str = "default";

/// Runs iscsiadm with the arguments, waiting at most the time given: [`exec::run`] in the
/// plugin, a recorder in tests.
type Iscsiadm<'a> = dyn FnMut(&[&str], Duration) -> Result<Output> + 'a;

fn iscsiadm(args: &[&str], timeout: Duration) -> Result<Output> {
    exec::run(Program::Iscsiadm, args, timeout)
}

/// Which sessions are a volume's: those through the iface its PV names that present the
/// initiator name that iface logs in with. Any other session to the same target and portal
/// is someone else's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// The open-iscsi iface ([`DEFAULT_IFACE`] when the volume names none).
    pub iface: String,
    /// The initiator name sessions through it present: the iface record's
    /// `iface.initiatorname`, else the node's; `None` when neither names one (the iface
    /// decides alone).
    pub initiator: Option<String>,
}

impl Owner {
    /// The owner of the sessions a volume logs in through `iface` makes, with open-iscsi's
    /// node records in `nodes` (its iface records are in `ifaces/` beside them).
    pub fn of(root: &Root, nodes: &Path, iface: Option<&str>) -> Result<Owner> {
        let iface = iface.unwrap_or(DEFAULT_IFACE).to_owned();
        let initiator = match iface_initiator(nodes, &iface) {
            Some(name) => Some(name),
            None => node_initiator_name(root)?,
        };
        Ok(Owner { iface, initiator })
    }

    /// Whether a session on `iface` presenting `initiator` is the volume's. A session whose
    /// iface (or, when one is expected, initiator name) cannot be read is not.
    pub fn owns(&self, iface: Option<&str>, initiator: Option<&str>) -> bool {
        let name_fits = match &self.initiator {
            None => true,
            Some(want) => initiator.is_some_and(|n| n.eq_ignore_ascii_case(want)),
        };
        iface == Some(self.iface.as_str()) && name_fits
    }
}

/// The `iface.initiatorname` of open-iscsi's iface record `iface` (`<db>/ifaces/IFACE`, the
/// node records `nodes` being `<db>/nodes`), when it sets one.
fn iface_initiator(nodes: &Path, iface: &str) -> Option<String> {
    if iface == DEFAULT_IFACE || iface.contains('/') || iface.starts_with('.') {
        return None;
    }
    let text = std::fs::read_to_string(nodes.parent()?.join("ifaces").join(iface)).ok()?;
    text.lines()
        .filter_map(|l| l.split_once('='))
        .find(|(k, _)| k.trim() == "iface.initiatorname")
        .map(|(_, v)| v.trim().to_owned())
        .filter(|v| !v.is_empty() && v != "<empty>")
}

/// The sessions to `iqn` through `portal` that are `owner`'s, in sid order.
fn sessions_via(root: &Root, iqn: &str, portal: &str, owner: &Owner) -> Result<Vec<IscsiSession>> {
    let all = sessions_to(root, iqn)
        .map_err(|e| Error::lunkit(format!("reading the iSCSI sessions to {iqn}"), e))?;
    Ok(all
        .into_iter()
        .filter(|s| s.portal().as_deref() == Some(portal))
        .filter(|s| owner.owns(iface_of(root, s.sid).as_deref(), s.initiator.as_deref()))
        .collect())
}

fn remaining(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}

/// `-m node -T IQN -p PORTAL -I IFACE`: the node record of one iface only. Without `-I`,
/// iscsiadm acts on the records of every iface (a `--login` logs in each, `-o delete`
/// deletes each).
fn node_args<'a>(iqn: &'a str, portal: &'a str, iface: &'a str) -> Vec<&'a str> {
    vec!["-m", "node", "-T", iqn, "-p", portal, "-I", iface]
}

/// `-m session -r SID -u`: the logout of that one session. `-m node -T IQN -p PORTAL
/// --logout` would log out every iface's session to the target through the portal.
fn logout_args(sid: &str) -> [&str; 5] {
    ["-m", "session", "-r", sid, "-u"]
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

/// Logs in to `iqn` through every portal that has no session of the volume's ([`Owner`]) yet,
/// on `iface`, with manual scan and, when `chap` is given, session CHAP. Succeeds when at
/// least one portal has a session afterwards (the others are reported in [`Login::failed`]);
/// fails naming every portal's error otherwise: `PERMISSION_DENIED` when the target refused
/// the node's credentials or authorization on a portal, `INTERNAL` else.
pub fn login(
    root: &Root,
    nodes: &Path,
    iqn: &str,
    portals: &[String],
    iface: Option<&str>,
    chap: Option<&Chap>,
    deadline: Instant,
) -> Result<Login> {
    let owner = Owner::of(root, nodes, iface)?;
    let target = Node {
        nodes,
        iqn,
        owner: &owner,
    };
    login_with(&mut iscsiadm, root, &target, portals, chap, deadline)
}

/// The node records of one target on one iface.
struct Node<'a> {
    /// open-iscsi's node database.
    nodes: &'a Path,
    iqn: &'a str,
    owner: &'a Owner,
}

/// [`login`], with iscsiadm run by `run`.
fn login_with(
    run: &mut Iscsiadm<'_>,
    root: &Root,
    target: &Node<'_>,
    portals: &[String],
    chap: Option<&Chap>,
    deadline: Instant,
) -> Result<Login> {
    let iqn = target.iqn;
    let mut done = Login {
        existing: Vec::new(),
        new: Vec::new(),
        failed: Vec::new(),
        refused: Vec::new(),
    };
    for portal in portals {
        if !sessions_via(root, iqn, portal, target.owner)?.is_empty() {
            done.existing.push(portal.clone());
            continue;
        }
        match login_one(run, target, portal, chap, deadline) {
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

/// Logs in through `portal`. Whatever step fails (a timeout included), the node record is
/// deleted again, with [`CLEANUP`] of its own: it may hold the CHAP secret.
fn login_one(
    run: &mut Iscsiadm<'_>,
    target: &Node<'_>,
    portal: &str,
    chap: Option<&Chap>,
    deadline: Instant,
) -> std::result::Result<(), Failure> {
    let base = node_args(target.iqn, portal, &target.owner.iface);
    let done = login_steps(run, target, portal, &base, chap, deadline);
    if done.is_err() {
        delete_record(run, &base);
    }
    done
}

/// The steps of [`login_one`] through the node record `base` names.
fn login_steps(
    run: &mut Iscsiadm<'_>,
    target: &Node<'_>,
    portal: &str,
    base: &[&str],
    chap: Option<&Chap>,
    deadline: Instant,
) -> std::result::Result<(), Failure> {
    let other = |e: Error| Failure::Other(e.to_string());
    let ok = |out: Output, args: &[&str]| match out.code {
        Some(0) => Ok(()),
        _ => Err(Failure::Other(out.describe(Program::Iscsiadm, args))),
    };
    // The node record for this target and portal (open-iscsi 2.1 replaces one that is there).
    let mut new = base.to_vec();
    new.extend(["-o", "new"]);
    run(&new, remaining(deadline)).map_err(other)?;
    // Every setting in one call: one process instead of one per setting.
    let mut settings = vec![("node.session.scan", "manual"), ("node.startup", "manual")];
    if let Some(c) = chap {
        settings.extend(c.settings());
    }
    let mut update = base.to_vec();
    update.extend(["-o", "update"]);
    for (name, value) in &settings {
        update.extend(["-n", name, "-v", value]);
    }
    ok(run(&update, remaining(deadline)).map_err(other)?, &update)?;
    if let Some(c) = chap {
        let iface = Some(target.owner.iface.as_str());
        write_secrets(target.nodes, target.iqn, portal, iface, &c.secrets()).map_err(other)?;
    }
    let mut login = base.to_vec();
    login.push("--login");
    let out = run(&login, remaining(deadline)).map_err(other)?;
    match out.code {
        Some(0) | Some(SESSION_EXISTS) => Ok(()),
        code => {
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
    // Whatever happened (a timeout too, hence a deadline of its own): the record holds the
    // secret.
    let mut delete = base.clone();
    delete.extend(["-o", "delete"]);
    let _ = exec::run(Program::Iscsiadm, &delete, CLEANUP);
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

/// Deletes the node record `base` names (`-m node -T IQN -p PORTAL -I IFACE`), best effort
/// (a record that is not there is what was wanted), within [`CLEANUP`] whatever the call's
/// deadline left: the record may hold a CHAP secret.
fn delete_record(run: &mut Iscsiadm<'_>, base: &[&str]) {
    let mut delete = base.to_vec();
    delete.extend(["-o", "delete"]);
    let _ = run(&delete, CLEANUP);
}

/// Logs out of the volume's sessions ([`Owner`] of `iface`) to `iqn` through `portals` whose
/// SCSI host has no device left, each by its session id, and deletes their node records on
/// that iface, and that iface's records of the portals that have no session of the volume's
/// at all (a portal whose login failed, or whose session went away): the caller has made sure
/// that no other volume of this node uses the target. Sessions on other ifaces, or under
/// another initiator name, and their records, are left alone. Returns the portals logged out
/// of.
pub fn logout_unused(
    root: &Root,
    nodes: &Path,
    iqn: &str,
    portals: &[String],
    iface: Option<&str>,
    deadline: Instant,
) -> Result<Vec<String>> {
    let owner = Owner::of(root, nodes, iface)?;
    logout_with(&mut iscsiadm, root, iqn, &owner, portals, deadline)
}

/// [`logout_unused`], with iscsiadm run by `run`.
fn logout_with(
    run: &mut Iscsiadm<'_>,
    root: &Root,
    iqn: &str,
    owner: &Owner,
    portals: &[String],
    deadline: Instant,
) -> Result<Vec<String>> {
    let devices = lunkit::scsi::sysfs::devices(root)
        .map_err(|e| Error::lunkit("reading the SCSI devices", e))?;
    let mut out = Vec::new();
    for portal in portals {
        let base = node_args(iqn, portal, &owner.iface);
        let mut in_use = false;
        for s in sessions_via(root, iqn, portal, owner)? {
            let Some(host) = s.host else {
                in_use = true;
                continue;
            };
            if devices.iter().any(|d| d.hctl.host == host) {
                in_use = true;
                continue;
            }
            let sid = s.sid.to_string();
            let logout = logout_args(&sid);
            let o = run(&logout, remaining(deadline))?;
            // No such session: it went away by itself, which is what was wanted.
            if !matches!(o.code, Some(0) | Some(NO_OBJECTS) | Some(SESSION_NOT_FOUND)) {
                return Err(Error::Program(o.describe(Program::Iscsiadm, &logout)));
            }
            if !out.contains(portal) {
                out.push(portal.clone());
            }
        }
        if !in_use {
            delete_record(run, &base);
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

    const IQN: &str = "iqn.2003-01.org.example:t";
    const NODE: &str = "iqn.1993-08.org.debian:01:node";
    const P0: &str = "10.0.0.1:3260";
    const P1: &str = "10.0.0.2:3260";
    const P2: &str = "10.0.0.3:3260";

    /// A node as sysfs shows it: each session `(sid, host, target, portal, iface, initiator)`
    /// under its SCSI host, its class entry and connection 0 linked as the kernel links them,
    /// a SCSI device on each of `busy` hosts, and the node's initiator name.
    fn node(sessions: &[(u32, u32, &str, &str, &str, &str)], busy: &[u32]) -> tempfile::TempDir {
        use std::os::unix::fs::symlink;
        let dir = tempfile::tempdir().unwrap();
        let sys = dir.path().join("sys");
        for d in [
            "class/iscsi_session",
            "class/iscsi_connection",
            "class/scsi_device",
        ] {
            std::fs::create_dir_all(sys.join(d)).unwrap();
        }
        for &(sid, host, target, portal, iface, initiator) in sessions {
            let dev = format!("devices/platform/host{host}/session{sid}");
            let sess = sys.join(&dev).join(format!("iscsi_session/session{sid}"));
            std::fs::create_dir_all(&sess).unwrap();
            for (name, value) in [
                ("targetname", target),
                ("ifacename", iface),
                ("initiatorname", initiator),
                ("state", "LOGGED_IN"),
            ] {
                std::fs::write(sess.join(name), format!("{value}\n")).unwrap();
            }
            let to = format!("../../{dev}/iscsi_session/session{sid}");
            symlink(to, sys.join(format!("class/iscsi_session/session{sid}"))).unwrap();
            let conn = sys.join(format!(
                "{dev}/connection{sid}:0/iscsi_connection/connection{sid}:0"
            ));
            std::fs::create_dir_all(&conn).unwrap();
            let (addr, port) = portal.rsplit_once(':').unwrap();
            std::fs::write(conn.join("persistent_address"), addr).unwrap();
            std::fs::write(conn.join("persistent_port"), port).unwrap();
            let to = format!("../../{dev}/connection{sid}:0/iscsi_connection/connection{sid}:0");
            symlink(
                to,
                sys.join(format!("class/iscsi_connection/connection{sid}:0")),
            )
            .unwrap();
        }
        for host in busy {
            let d = sys.join(format!("class/scsi_device/{host}:0:0:1/device"));
            std::fs::create_dir_all(d.join("block")).unwrap();
        }
        std::fs::create_dir_all(dir.path().join("etc/iscsi/nodes")).unwrap();
        std::fs::write(
            dir.path().join("etc/iscsi/initiatorname.iscsi"),
            format!("InitiatorName={NODE}\n"),
        )
        .unwrap();
        dir
    }

    /// An iscsiadm that records each call and its time limit, and answers with `answer`.
    type Calls = Vec<(Vec<String>, Duration)>;
    fn recorder<'a>(
        calls: &'a mut Calls,
        mut answer: impl FnMut(&[&str]) -> Result<Output> + 'a,
    ) -> impl FnMut(&[&str], Duration) -> Result<Output> + 'a {
        move |args: &[&str], limit: Duration| {
            calls.push((args.iter().map(|a| a.to_string()).collect(), limit));
            answer(args)
        }
    }

    fn exited(code: i32) -> Result<Output> {
        Ok(Output {
            code: Some(code),
            stdout: String::new(),
            stderr: String::new(),
        })
    }

    #[test]
    fn a_session_is_the_volumes_only_on_its_iface_under_its_initiator_name() {
        let dir = node(&[], &[]);
        let root = Root::new(dir.path());
        let nodes = dir.path().join("etc/iscsi/nodes");
        let owner = Owner::of(&root, &nodes, None).unwrap();
        assert_eq!(owner.iface, "default");
        assert_eq!(owner.initiator.as_deref(), Some(NODE));
        assert!(owner.owns(Some("default"), Some(&NODE.to_uppercase())));
        assert!(!owner.owns(Some("other"), Some(NODE)));
        assert!(!owner.owns(Some("default"), Some("iqn.2016-04.com.example:else")));
        assert!(!owner.owns(None, Some(NODE)));
        assert!(!owner.owns(Some("default"), None));
        // An iface record with a name of its own: its sessions present that name.
        let ifaces = dir.path().join("etc/iscsi/ifaces");
        std::fs::create_dir_all(&ifaces).unwrap();
        std::fs::write(
            ifaces.join("eth1"),
            "# BEGIN RECORD\niface.iscsi_ifacename = eth1\niface.initiatorname = iqn.x:eth1\n",
        )
        .unwrap();
        std::fs::write(ifaces.join("eth2"), "iface.initiatorname = <empty>\n").unwrap();
        let eth1 = Owner::of(&root, &nodes, Some("eth1")).unwrap();
        assert_eq!(eth1.initiator.as_deref(), Some("iqn.x:eth1"));
        assert!(
            eth1.owns(Some("eth1"), Some("iqn.x:eth1")) && !eth1.owns(Some("eth1"), Some(NODE))
        );
        let eth2 = Owner::of(&root, &nodes, Some("eth2")).unwrap();
        assert_eq!(eth2.initiator.as_deref(), Some(NODE));
        // No name anywhere: the iface decides alone.
        let bare = tempfile::tempdir().unwrap();
        let anyone = Owner::of(&Root::new(bare.path()), &nodes, None).unwrap();
        assert!(anyone.owns(Some("default"), None) && !anyone.owns(Some("other"), None));
    }

    #[test]
    fn the_volumes_sessions_are_chosen_by_target_portal_iface_and_initiator_name() {
        let dir = node(
            &[
                (1, 7, IQN, P0, "default", NODE),
                (2, 8, IQN, P0, "other", NODE),
                (3, 9, IQN, P0, "default", "iqn.2016-04.com.example:else"),
                (4, 10, IQN, P1, "default", NODE),
                (5, 11, "iqn.2003-01.org.example:u", P0, "default", NODE),
            ],
            &[],
        );
        let root = Root::new(dir.path());
        let owner = Owner::of(&root, &dir.path().join("etc/iscsi/nodes"), None).unwrap();
        let sids = |portal| -> Vec<u32> {
            let s = sessions_via(&root, IQN, portal, &owner).unwrap();
            s.iter().map(|s| s.sid).collect()
        };
        assert_eq!(sids(P0), [1]);
        assert_eq!(sids(P1), [4]);
        assert!(sids(P2).is_empty());
        let other = Owner {
            iface: "other".into(),
            initiator: Some(NODE.into()),
        };
        let s = sessions_via(&root, IQN, P0, &other).unwrap();
        assert_eq!(s.iter().map(|s| s.sid).collect::<Vec<_>>(), [2]);
    }

    /// Unstage logs out of the volume's unused sessions by id and deletes only its iface's
    /// records; a session on another iface through the same portal, or under another
    /// initiator name, is left with its record, whatever devices it has.
    #[test]
    fn unstage_logs_out_by_session_id_and_deletes_only_its_ifaces_records() {
        let dir = node(
            &[
                (1, 7, IQN, P0, "default", NODE),
                (2, 8, IQN, P0, "other", NODE),
                (3, 9, IQN, P0, "default", "iqn.2016-04.com.example:else"),
                (4, 10, IQN, P1, "default", NODE),
            ],
            &[10],
        );
        let root = Root::new(dir.path());
        let owner = Owner::of(&root, &dir.path().join("etc/iscsi/nodes"), None).unwrap();
        let mut calls = Calls::new();
        let portals = [P0.to_owned(), P1.to_owned(), P2.to_owned()];
        let deadline = Instant::now() + Duration::from_secs(60);
        let out = logout_with(
            &mut recorder(&mut calls, |_| exited(0)),
            &root,
            IQN,
            &owner,
            &portals,
            deadline,
        )
        .unwrap();
        assert_eq!(out, [P0]);
        let args: Vec<String> = calls.iter().map(|(a, _)| a.join(" ")).collect();
        assert_eq!(
            args,
            [
                "-m session -r 1 -u".to_owned(),
                format!("-m node -T {IQN} -p {P0} -I default -o delete"),
                // P1's session has a device: neither logged out nor its record deleted.
                format!("-m node -T {IQN} -p {P2} -I default -o delete"),
            ]
        );
        assert!(calls.iter().skip(1).all(|(_, limit)| *limit == CLEANUP));
    }

    /// A login that runs out of time still deletes the node record that holds the CHAP
    /// secret, with a deadline of its own; a portal with a session of the volume's is not
    /// logged in again, and one with only others' sessions is.
    #[test]
    fn a_login_that_times_out_deletes_its_record_within_a_cleanup_deadline_of_its_own() {
        let dir = node(
            &[
                (2, 8, IQN, P0, "other", NODE),
                (3, 9, IQN, P0, "default", "iqn.2016-04.com.example:else"),
                (4, 10, IQN, P1, "default", NODE),
            ],
            &[],
        );
        let root = Root::new(dir.path());
        let nodes = dir.path().join("etc/iscsi/nodes");
        let owner = Owner::of(&root, &nodes, None).unwrap();
        let record = nodes.join(IQN).join("10.0.0.1,3260");
        let secrets = std::collections::HashMap::from([
            ("node.session.auth.username".to_owned(), "u".to_owned()),
            (
                "node.session.auth.password".to_owned(),
                "s3cret-pa55".to_owned(),
            ),
        ]);
        let chap = crate::attrs::chap("pv", &secrets).unwrap();
        let mut calls = Calls::new();
        let answer = |args: &[&str]| match args.last() {
            Some(&"new") => {
                std::fs::create_dir_all(record.parent().unwrap()).unwrap();
                std::fs::write(&record, "node.name = t\n# END RECORD\n").unwrap();
                exited(0)
            }
            Some(&"--login") => {
                assert!(
                    std::fs::read_to_string(&record)
                        .unwrap()
                        .contains("s3cret-pa55")
                );
                // What exec::run says of a program it killed at the deadline.
                Err(Error::Program(
                    "iscsiadm ... --login was killed at its deadline".into(),
                ))
            }
            Some(&"delete") => {
                std::fs::remove_file(&record).unwrap();
                exited(0)
            }
            _ => exited(0),
        };
        let target = Node {
            nodes: &nodes,
            iqn: IQN,
            owner: &owner,
        };
        // The call's time is up by the time the login gives up.
        let deadline = Instant::now() + Duration::from_millis(1);
        let done = login_with(
            &mut recorder(&mut calls, answer),
            &root,
            &target,
            &[P0.to_owned(), P1.to_owned()],
            Some(&chap),
            deadline,
        )
        .unwrap();
        assert_eq!(done.existing, [P1]);
        assert!(done.new.is_empty());
        assert_eq!(done.failed.len(), 1, "{:?}", done.failed);
        assert_eq!(done.failed[0].0, P0);
        let (last, limit) = calls.last().unwrap();
        assert_eq!(
            last.join(" "),
            format!("-m node -T {IQN} -p {P0} -I default -o delete")
        );
        assert_eq!(*limit, CLEANUP);
        assert!(!record.exists(), "the record with the secret is gone");
        assert!(
            calls.iter().all(|(a, _)| a.contains(&"-I".to_owned())),
            "every call names the iface: {calls:?}"
        );
        assert!(!calls.iter().any(|(a, _)| a.contains(&P1.to_owned())));
    }
}

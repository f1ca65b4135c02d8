//! Logging in to a volume's portals (manual scan, session CHAP) and out of the sessions no
//! LUN of the node uses any more, by session id and on the volume's iface only.

// The parts of the iSCSI module share its imports, constants and runner.
use super::*;

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
pub(super) enum Failure {
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
pub(super) struct Node<'a> {
    /// open-iscsi's node database.
    pub(super) nodes: &'a Path,
    pub(super) iqn: &'a str,
    pub(super) owner: &'a Owner,
}

/// [`login`], with iscsiadm run by `run`.
pub(super) fn login_with(
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
pub(super) fn login_one(
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
pub(super) fn login_steps(
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
pub(super) fn logout_with(
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

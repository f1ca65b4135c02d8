//! SendTargets discovery: the portals an array advertises for a target, with discovery
//! CHAP when the volume asks for it.

// The parts of the iSCSI module share its imports, constants and runner.
use super::*;

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
pub(super) fn discover_one(
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
pub(super) fn discover_with_chap(
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
pub(super) fn listing(
    args: &[&str],
    deadline: Instant,
) -> std::result::Result<String, (Option<i32>, String)> {
    let out = exec::run(Program::Iscsiadm, args, remaining(deadline))
        .map_err(|e| (None, e.to_string()))?;
    if out.code == Some(0) {
        Ok(out.stdout)
    } else {
        Err((out.code, out.describe(Program::Iscsiadm, args)))
    }
}

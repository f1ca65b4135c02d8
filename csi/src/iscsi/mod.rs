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
use lunkit::id::IscsiName;
use lunkit::iscsi::sysfs::{IscsiSession, iface_of, sessions, sessions_to};

use crate::attrs::Chap;
use crate::error::{Error, Result};
use crate::exec::{self, Output, Program};

mod discovery;
mod login;
mod record;
mod session;
mod stage;
#[cfg(test)]
mod tests;

pub use discovery::{discover, portals_of};
pub use login::{Login, login, logout_unused};
pub use record::{
    discovery_record_path, record_path, rewrite_record, with_settings, write_secrets,
};
pub use session::{Owner, check_initiator, initiator_name_in, node_initiator_name};
pub(crate) use stage::target_of;
// What the parts use of each other (each part's `use super::*`).
use record::*;
use session::*;

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

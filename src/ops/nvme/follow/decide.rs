//! The follower's decisions, apart from the kernel: which entries of the log changed, which
//! uevents say it did, which paths are tried again, and which controllers must stay.

use std::collections::HashSet;
use std::time::Duration;

use super::{PathAction, PathChange, Trigger};
use crate::nvme::discovery::{Entry, Subtype, tls_refusal};
use crate::nvme::sysfs::{CtrlState, NvmeController};
use crate::uevent::{Action, Uevent};

use super::{AEN_DISCOVERY_CHANGE, FollowOptions, PATH_RETRY};
use crate::nvme::fabrics::{ConnectOptions, Host};

/// The longest wait between two retries of failed paths (30 s doubled five times).
pub(super) const PATH_RETRY_MAX: Duration = Duration::from_secs(16 * 60);

/// How long the follower waits before it tries failed paths again after `failed_retries`
/// retries in a row failed: 30 s doubled each time, at most 16 min. A subsystem that refuses
/// the host's secrets costs a connect (and an authentication) every 16 minutes at most, not
/// every 30 s.
pub fn retry_wait(failed_retries: u32) -> Duration {
    PATH_RETRY
        .checked_mul(1 << failed_retries.min(5))
        .map_or(PATH_RETRY_MAX, |d| d.min(PATH_RETRY_MAX))
}

/// Makes a read after `known` see each path of `paths` whose connect or delete failed as new
/// (or as gone) again: a failed connect's entry is forgotten, a failed delete's remembered.
/// Paths refused for TLS stay as they are: trying again changes nothing. Whether any path is
/// to be tried again.
pub fn requeue(known: &mut Vec<Entry>, paths: &[PathChange]) -> bool {
    let failed: Vec<&Entry> = paths
        .iter()
        .filter(|p| {
            matches!(
                p.action,
                PathAction::Failed(_) | PathAction::DeleteFailed { .. }
            )
        })
        .map(|p| &p.entry)
        .filter(|e| tls_refusal(e).is_none())
        .collect();
    if failed.is_empty() {
        return false;
    }
    let key = |e: &Entry| (e.subsystem.clone(), e.address.clone(), e.service_id.clone());
    let failed_keys: HashSet<_> = failed.iter().map(|e| key(e)).collect();
    let listed: HashSet<_> = known.iter().map(key).collect();
    known.retain(|e| !failed_keys.contains(&key(e)));
    known.extend(
        failed
            .into_iter()
            .filter(|e| !listed.contains(&key(e)))
            .cloned(),
    );
    true
}

/// Whether `ev` is the removal of controller `controller`.
pub fn removes(ev: &Uevent, controller: &str) -> bool {
    ev.action == Action::Remove
        && ev.subsystem.as_deref() == Some("nvme")
        && ev.devpath.rsplit('/').next() == Some(controller)
}

/// Whether `ev` says the log of discovery controller `controller` changed.
pub fn trigger(ev: &Uevent, controller: &str) -> Option<Trigger> {
    let name = ev.devpath.rsplit('/').next()?;
    if name != controller || ev.subsystem.as_deref() != Some("nvme") {
        return None;
    }
    if ev.get("NVME_AEN") == Some(AEN_DISCOVERY_CHANGE) {
        Some(Trigger::Changed)
    } else if ev.get("NVME_EVENT") == Some("rediscover") {
        Some(Trigger::Rediscover)
    } else {
        None
    }
}

/// The NVM subsystem entries of `now` not in `before`, and those of `before` not in `now`,
/// each path (subsystem, transport, address, port) once.
pub fn diff(before: &[Entry], now: &[Entry]) -> (Vec<Entry>, Vec<Entry>) {
    let key = |e: &Entry| {
        (
            e.subsystem.clone(),
            e.transport,
            e.address.clone(),
            e.service_id.clone(),
        )
    };
    let old: HashSet<_> = before.iter().map(key).collect();
    let new: HashSet<_> = now.iter().map(key).collect();
    let nvm = |e: &&Entry| e.subtype == Subtype::Nvm;
    let added = now
        .iter()
        .filter(nvm)
        .filter(|e| !old.contains(&key(e)))
        .cloned()
        .collect();
    let removed = before
        .iter()
        .filter(nvm)
        .filter(|e| !new.contains(&key(e)))
        .cloned()
        .collect();
    (added, removed)
}

/// Why controller `c`, whose path the log no longer lists, must stay; `None` when deleting
/// it takes no device anyone could have opened and leaves the subsystem reachable.
pub fn keep_reason(c: &NvmeController, subsystem: &[NvmeController]) -> Option<String> {
    if let Some(own) = c.namespaces.iter().find(|n| !is_path(n)) {
        return Some(format!(
            "{own} is a namespace device of its own (no native multipath): deleting {} would \
             take it away",
            c.name
        ));
    }
    let live_other = subsystem
        .iter()
        .any(|s| s.name != c.name && s.parsed_state == Some(CtrlState::Live));
    if !live_other {
        return Some(format!(
            "{} is the subsystem's only path, or its other paths are not live",
            c.name
        ));
    }
    None
}

/// Whether namespace name `n` is a native-multipath path (`nvme0c1n2`), not a device.
pub(super) fn is_path(n: &str) -> bool {
    n.strip_prefix("nvme")
        .and_then(|r| r.split_once('c'))
        .is_some_and(|(a, b)| {
            !a.is_empty() && a.bytes().all(|c| c.is_ascii_digit()) && b.contains('n')
        })
}

/// The connect options of `e`'s path as `host` with the secrets of `opts`, or `None` for an
/// entry that is not a TCP path with a valid NQN, address and port (the log's own odd
/// entries), and for a subsystem outside [`FollowOptions::subsystems`].
pub(super) fn path_connect(opts: &FollowOptions, host: &Host, e: &Entry) -> Option<ConnectOptions> {
    let nqn = e.nqn().ok()?;
    if opts
        .subsystems
        .as_ref()
        .is_some_and(|only| !only.contains(&nqn))
    {
        return None;
    }
    let mut o = ConnectOptions::new(e.ip().ok()?, e.port().ok()?, nqn);
    o.host = Some(host.clone());
    o.dhchap_secret.clone_from(&opts.dhchap_secret);
    o.dhchap_ctrl_secret.clone_from(&opts.dhchap_ctrl_secret);
    o.timeout = opts.step_timeout;
    Some(o)
}

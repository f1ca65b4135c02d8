//! Persistent discovery for the staged NVMe volumes that name discovery services
//! (`discoveryAddrs`): one lunkit follower ([`lunkit::ops::nvme::follow::Follower`]) per
//! service, host identity and DH-HMAC-CHAP secrets, on a thread of its own, for as long as a
//! staged volume names it. A port the array links to a volume's subsystem later is connected,
//! and one it unlinks loses its controller (when that is safe), with no call from the CO.
//!
//! Each follower acts only on the subsystems of the volumes that named its service with its
//! host identity and secrets, and connects their paths with exactly those: a path is never
//! connected as another volume's host or with its secrets, and a volume staged with
//! `dhchapCtrlSecret` is never followed without it (its controllers must prove themselves,
//! and one that cannot is refused by the kernel). The secrets come from the kernel, which
//! keeps them with the volume's controllers ([`auth`]); none is written to disk, logged or
//! put in a metric. A path refused (its secrets rejected, say) is tried again after a wait
//! that doubles from 30 s up to 16 minutes ([`lunkit::ops::nvme::follow::retry_wait`]).
//!
//! The follower decides under the subsystem's lock that lunkit's attach and detach take, so
//! an unstage that deletes the subsystem's last controllers is never undone by a follower
//! reacting to a log change at the same moment.
//!
//! The set of services followed is derived from the stage records ([`Followers::notify`]), after
//! every stage and unstage and at startup, so a restarted plugin follows what its records say.
//! A persistent discovery controller the plugin connected is deleted when no staged volume
//! names its service any more; one it found connected (by `nvme discover -p`, say) is left,
//! unless a marker in the state directory says the plugin made it before a restart.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use lunkit::Root;
use lunkit::id::Nqn;
use lunkit::nvme::Host;
use lunkit::ops::nvme::follow::{Change, FollowOptions, Follower, PathAction};

use crate::log::{self, Level};
use crate::state::{Dhchap, Record, Store, Target};

pub mod auth;
pub mod unconnected;

pub use auth::Auth;

/// How often a follower thread looks at its stop flag while it waits for the log to change.
const STOP_CHECK: Duration = Duration::from_secs(2);

/// How long a follower that could not start (the service unreachable) waits to try again.
const RESTART_AFTER: Duration = Duration::from_secs(30);

/// One service followed as one host with one set of secrets: what a follower thread is
/// keyed by.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Key {
    /// The discovery service.
    pub address: SocketAddr,
    /// The host NQN the volume connects as (`hostNqn`); `None` for the node's.
    pub host_nqn: Option<String>,
    /// The host id the volume connects with (`hostId`); `None` for the node's or the one
    /// lunkit derives.
    pub host_id: Option<String>,
    /// The DH-HMAC-CHAP secrets its paths are connected with (never in its ownership
    /// marker, nor in any message: [`Auth`]'s `Debug` says only which there are).
    pub auth: Auth,
}

impl Key {
    /// A stable file name for the key's ownership marker: of the service and host only, so
    /// that no digest of a secret is on disk. Keys that differ only in their secrets share
    /// it, as they share the persistent discovery controller (one per service and host).
    fn marker(&self) -> String {
        let text = format!(
            "{} {} {}",
            self.address,
            self.host_nqn.as_deref().unwrap_or("-"),
            self.host_id.as_deref().unwrap_or("-")
        );
        // FNV-1a 64: short, and the same in every run (std's hasher is seeded).
        let hash = text.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        format!("discovery-{hash:016x}")
    }

    fn describe(&self) -> String {
        let auth = match self.auth.dhchap() {
            Dhchap::None => "",
            Dhchap::Host => " with DH-HMAC-CHAP",
            Dhchap::Bidirectional => " with DH-HMAC-CHAP both ways",
        };
        match &self.host_nqn {
            Some(n) => format!("discovery service {} as {n}{auth}", self.address),
            None => format!("discovery service {}{auth}", self.address),
        }
    }
}

/// What each follower acts on: the subsystems of the volumes that named its key.
pub type Plan = BTreeMap<Key, BTreeSet<Nqn>>;

/// The services the NVMe records in `records` name, each with the host it connects as and
/// the secrets `auth_of` finds for the record's subsystem ([`auth::from_kernel`]), and the
/// subsystems each is followed for; and why each record left out was (no secrets as its
/// stage had, or none could be read). Addresses and NQNs a record cannot parse are skipped
/// (stage checked them; a hand-edited record is not the follower's to refuse).
pub fn wanted(
    records: &[Record],
    auth_of: impl Fn(&Record, &Nqn) -> Result<Auth, String>,
) -> (Plan, Vec<String>) {
    let mut plan = Plan::new();
    let mut left = Vec::new();
    for r in records {
        let Target::Nvme {
            nqn,
            discovery,
            host_nqn,
            host_id,
            dhchap,
            ..
        } = &r.target
        else {
            continue;
        };
        let Ok(nqn) = nqn.parse::<Nqn>() else {
            continue;
        };
        if discovery.is_empty() {
            continue;
        }
        let auth = match auth_of(r, &nqn) {
            Ok(a) if a.satisfies(*dhchap) => a,
            Ok(_) => {
                left.push(format!(
                    "volume {}: its discovery services are not followed: it was staged with \
                     {}, and no controller of {nqn} as its host holds it now (the plugin \
                     keeps no secret of its own; stage the volume again)",
                    r.volume_id,
                    if *dhchap == Dhchap::Host {
                        "dhchapSecret"
                    } else {
                        "dhchapSecret and dhchapCtrlSecret"
                    }
                ));
                continue;
            }
            Err(e) => {
                left.push(format!(
                    "volume {}: its discovery services are not followed: {e}",
                    r.volume_id
                ));
                continue;
            }
        };
        for a in discovery {
            if let Ok(address) = lunkit::nvme::discovery::parse_address(a) {
                let key = Key {
                    address,
                    host_nqn: host_nqn.clone(),
                    host_id: host_id.clone(),
                    auth: auth.clone(),
                };
                plan.entry(key).or_default().insert(nqn.clone());
            }
        }
    }
    (plan, left)
}

/// The secrets the kernel holds for `record`'s subsystem `nqn` as its host
/// ([`auth::from_kernel`]).
fn kernel_auth(root: &Root, record: &Record, nqn: &Nqn) -> Result<Auth, String> {
    let Target::Nvme {
        host_nqn, host_id, ..
    } = &record.target
    else {
        return Ok(Auth::default());
    };
    let host = match host_of(root, host_nqn.as_deref(), host_id.as_deref()) {
        Ok(Some(h)) => h,
        Ok(None) => Host::from_node(root).map_err(|e| format!("the node's host NQN: {e}"))?,
        Err(e) => return Err(format!("its host identity: {e}")),
    };
    auth::from_kernel(root, nqn, host.nqn.as_str())
}

/// The subsystems a follower acts on, which [`sync`] changes while it runs.
type Subsystems = Arc<Mutex<BTreeSet<Nqn>>>;

struct Running {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
    subsystems: Subsystems,
}

/// The plugin's followers: a thread that keeps one follower thread per wanted key, told to
/// look at the records again by [`Followers::notify`]. Stage and unstage only notify it, so
/// neither waits for a follower to start or to stop.
#[derive(Debug)]
pub struct Followers {
    tx: Mutex<mpsc::Sender<()>>,
}

impl Followers {
    /// Starts the manager thread for the node under `root`, reading `store`'s records (once
    /// now, then on every [`Followers::notify`]); ownership markers go in its directory's
    /// `followed/`.
    ///
    /// # Errors
    ///
    /// The thread could not be started.
    pub fn spawn(root: Root, store: Store) -> std::io::Result<Followers> {
        let (tx, rx) = mpsc::channel();
        let markers = store.dir().join("followed");
        std::thread::Builder::new()
            .name("lunkit-csi-followers".into())
            .spawn(move || manage(&root, &store, &markers, &rx))?;
        let f = Followers { tx: Mutex::new(tx) };
        f.notify();
        Ok(f)
    }

    /// Asks the manager to bring the followers in line with the records.
    pub fn notify(&self) {
        let tx = self.tx.lock().unwrap_or_else(PoisonError::into_inner);
        let _ = tx.send(());
    }
}

/// The manager: on each notice (those queued meanwhile taken as one), the wanted keys from
/// the records, then [`sync`].
fn manage(root: &Root, store: &Store, markers: &Path, rx: &mpsc::Receiver<()>) {
    let mut running = BTreeMap::new();
    while rx.recv().is_ok() {
        while rx.try_recv().is_ok() {}
        match store.all() {
            Ok(records) => {
                let (plan, left) = wanted(&records, |r, nqn| kernel_auth(root, r, nqn));
                for why in left {
                    log::note(Level::Warn, &why);
                }
                sync(root, markers, &mut running, &plan);
            }
            Err(e) => log::note(
                Level::Warn,
                &format!("following discovery services: the records: {e}"),
            ),
        }
    }
}

/// Starts a follower for each key of `wanted` that has none, gives each its subsystems, and
/// stops (and waits for) each one `wanted` no longer has: its persistent discovery
/// controller is deleted if the plugin made it.
fn sync(root: &Root, markers: &Path, running: &mut BTreeMap<Key, Running>, wanted: &Plan) {
    let followed = wanted.values().flatten().map(|n| n.as_str().to_owned());
    unconnected::keep_only(&followed.collect());
    let gone: Vec<Key> = running
        .keys()
        .filter(|k| !wanted.contains_key(k))
        .cloned()
        .collect();
    for key in gone {
        if let Some(r) = running.remove(&key) {
            r.stop.store(true, Ordering::Relaxed);
            // At most a STOP_CHECK, a step's deadline while it acts, and the delete.
            let _ = r.thread.join();
        }
    }
    for (key, nqns) in wanted {
        if let Some(r) = running.get(key) {
            nqns.clone_into(&mut r.subsystems.lock().unwrap_or_else(PoisonError::into_inner));
            continue;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let subsystems: Subsystems = Arc::new(Mutex::new(nqns.clone()));
        let (root, marker) = (root.clone(), markers.join(key.marker()));
        let (k, s, n) = (key.clone(), stop.clone(), subsystems.clone());
        let spawned = std::thread::Builder::new()
            .name("lunkit-csi-follow".into())
            .spawn(move || follow(&root, &k, &n, &marker, &s));
        match spawned {
            Ok(thread) => {
                let r = Running {
                    stop,
                    thread,
                    subsystems,
                };
                running.insert(key.clone(), r);
            }
            Err(e) => log::note(
                Level::Error,
                &format!("cannot start following {}: {e}", key.describe()),
            ),
        }
    }
}

/// A follower thread: started again after the service or its controller went, until `stop`.
fn follow(root: &Root, key: &Key, subsystems: &Subsystems, marker: &Path, stop: &AtomicBool) {
    loop {
        let stopping = stop.load(Ordering::Relaxed);
        // Stopped before it started (a restarted plugin whose last volume was unstaged at
        // once): a controller the marker says is the plugin's is still taken, to delete it.
        if stopping && !marker.exists() {
            return;
        }
        match start(root, key, &current(subsystems), marker) {
            Ok(f) => {
                if run(f, key, subsystems, marker, stop) {
                    return;
                }
            }
            Err(_) if stopping => return,
            Err(e) => {
                log::note(
                    Level::Warn,
                    &format!(
                        "following {}: {e}; trying again in {}s",
                        key.describe(),
                        RESTART_AFTER.as_secs()
                    ),
                );
                let until = Instant::now() + RESTART_AFTER;
                while Instant::now() < until && !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(STOP_CHECK);
                }
            }
        }
    }
}

/// What `subsystems` holds now.
fn current(subsystems: &Subsystems) -> BTreeSet<Nqn> {
    subsystems
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
}

/// The follower's options for `key`: its host, its secrets, and only `subsystems`' paths.
pub fn options(
    root: &Root,
    key: &Key,
    subsystems: &BTreeSet<Nqn>,
) -> lunkit::Result<FollowOptions> {
    let mut opts = FollowOptions::new(key.address.ip(), key.address.port());
    opts.host = host(root, key)?;
    opts.dhchap_secret.clone_from(&key.auth.secret);
    opts.dhchap_ctrl_secret.clone_from(&key.auth.ctrl_secret);
    opts.subsystems = Some(subsystems.clone());
    Ok(opts)
}

/// Connects (or takes) the persistent discovery controller, and marks it the plugin's when
/// the plugin made it.
fn start(
    root: &Root,
    key: &Key,
    subsystems: &BTreeSet<Nqn>,
    marker: &Path,
) -> lunkit::Result<Follower> {
    let opts = options(root, key, subsystems)?;
    let mut f = Follower::start(root, opts)?;
    if f.owned() {
        // Written before anything can stop the plugin: a restart then knows it made it.
        let written = marker
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| std::fs::write(marker, f.controller()));
        if let Err(e) = written {
            log::note(
                Level::Warn,
                &format!(
                    "{}: {e}: a restart will leave its controller",
                    marker.display()
                ),
            );
        }
    } else if marker.exists() {
        f.take_ownership();
    }
    log::note(
        Level::Info,
        &format!(
            "following {} on persistent discovery controller {}",
            key.describe(),
            f.controller()
        ),
    );
    Ok(f)
}

/// Follows until `stop` (then the controller is deleted when the plugin's, and `true` is
/// returned) or until the controller is gone (`false`: start again).
fn run(
    mut f: Follower,
    key: &Key,
    subsystems: &Subsystems,
    marker: &Path,
    stop: &AtomicBool,
) -> bool {
    loop {
        if stop.load(Ordering::Relaxed) {
            let (name, owned) = (f.controller().to_owned(), f.owned());
            match f.stop() {
                Ok(()) if owned => {
                    let _ = std::fs::remove_file(marker);
                    log::note(
                        Level::Info,
                        &format!(
                            "stopped following {}: controller {name} deleted",
                            key.describe()
                        ),
                    );
                }
                Ok(()) => {}
                Err(e) => log::note(
                    Level::Warn,
                    &format!("stopped following {}: {e}", key.describe()),
                ),
            }
            return true;
        }
        f.set_subsystems(Some(current(subsystems)));
        match f.next(Instant::now() + STOP_CHECK) {
            Ok(Some(change)) => report(key, &change),
            Ok(None) => {}
            Err(e) if e.kind() == lunkit::ErrorKind::NotFound => {
                log::note(Level::Warn, &format!("following {}: {e}", key.describe()));
                let _ = std::fs::remove_file(marker);
                return false;
            }
            // The read is made again on the next event or a few seconds later.
            Err(e) => log::note(Level::Warn, &format!("following {}: {e}", key.describe())),
        }
    }
}

/// The host identity of `key`, as stage resolved its volume's ([`volume_host`]).
fn host(root: &Root, key: &Key) -> lunkit::Result<Option<Host>> {
    host_of(root, key.host_nqn.as_deref(), key.host_id.as_deref())
}

/// [`volume_host`] of a record's `hostNqn` and `hostId` as recorded.
fn host_of(root: &Root, nqn: Option<&str>, id: Option<&str>) -> lunkit::Result<Option<Host>> {
    let nqn = nqn.map(str::parse).transpose()?;
    let id = id.map(str::parse).transpose()?;
    volume_host(root, nqn, id)
}

/// The host a volume with `hostNqn` `nqn` and `hostId` `id` connects as: `None` (the node's)
/// with neither; the node's NQN with a `hostId` alone, as csi-driver-nvmf gives it. Stage and
/// the followers resolve it here, so a service is followed as the host that connected.
///
/// # Errors
///
/// The node's host NQN cannot be read ([`Host::from_node`]).
pub fn volume_host(
    root: &Root,
    nqn: Option<lunkit::Nqn>,
    id: Option<lunkit::id::Uuid>,
) -> lunkit::Result<Option<Host>> {
    if nqn.is_none() && id.is_none() {
        return Ok(None);
    }
    let nqn = match nqn {
        Some(n) => n,
        None => Host::from_node(root)?.nqn,
    };
    Ok(Some(Host { nqn, id }))
}

/// One line per path the follower acted on; a path not connected is recorded for the
/// volumes' condition ([`unconnected`]) until it is, or leaves the log.
fn report(key: &Key, change: &Change) {
    for p in &change.paths {
        let at = format!("{}:{}", p.entry.address, p.entry.service_id);
        let path = format!("{} at {at}", p.entry.subsystem);
        match &p.action {
            PathAction::Failed(e) => unconnected::failed(&p.entry.subsystem, &at, e),
            PathAction::Connected { .. } | PathAction::Deleted { .. } | PathAction::Left { .. } => {
                unconnected::settled(&p.entry.subsystem, &at);
            }
            PathAction::DeleteFailed { .. } => {}
        }
        let (level, what) = match &p.action {
            PathAction::Connected {
                controller,
                existing,
            } => (
                Level::Info,
                if *existing {
                    format!("new path {path}: already connected as {controller}")
                } else {
                    format!("new path {path}: connected as {controller}")
                },
            ),
            PathAction::Deleted { controller } => (
                Level::Info,
                format!("path {path} gone from the log: controller {controller} deleted"),
            ),
            PathAction::Left { controller, reason } => (
                Level::Warn,
                format!("path {path} gone from the log: controller {controller} left: {reason}"),
            ),
            PathAction::Failed(e) if e.kind() == lunkit::ErrorKind::PermissionDenied => (
                Level::Warn,
                format!(
                    "path {path}: not connected: {e}; tried again after a wait that doubles \
                     from 30 s to 16 min"
                ),
            ),
            PathAction::Failed(e) => (Level::Warn, format!("path {path}: not connected: {e}")),
            PathAction::DeleteFailed { controller, error } => (
                Level::Warn,
                format!(
                    "path {path} gone from the log: controller {controller} not deleted: {error}"
                ),
            ),
        };
        log::note(level, &format!("{}: {what}", key.describe()));
    }
}

#[cfg(test)]
mod tests;

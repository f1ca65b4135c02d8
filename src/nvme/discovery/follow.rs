//! Persistent discovery: a discovery controller kept connected (with a keep-alive), whose
//! log changes the kernel announces, and a follower that brings the node's paths in line.
//!
//! A discovery controller connected with a non-zero `keep_alive_tmo` stays, and the kernel
//! enables the discovery-change asynchronous event on it. When the target's log changes (a
//! port linked to or unlinked from a subsystem, a referral added or removed) the kernel
//! sends a `change` uevent on the controller with `NVME_AEN=0x70f002`; when the controller
//! reconnects after a link loss, one with `NVME_EVENT=rediscover` (the keys nvme-cli's
//! `70-nvmf-autoconnect.rules` matches). [`Follower::next`] waits for either, reads the log
//! again (referrals followed, as [`super::discover`] does), and for the subsystems this node
//! already uses:
//!
//! - connects each new path (not one whose port requires TLS: that is reported as failed);
//! - deletes the controller of each path the log no longer lists, but only while another
//!   controller of the subsystem is `live` and the path's namespaces are native-multipath
//!   paths (`nvmeXcYnZ`), so that no device anyone opened goes away.
//!
//! ```no_run
//! use std::time::{Duration, Instant};
//! use lunkit::Root;
//! use lunkit::nvme::discovery::follow::{FollowOptions, Follower};
//!
//! let root = Root::default();
//! let mut f = Follower::start(&root, FollowOptions::new("192.0.2.10".parse()?, 4420))?;
//! while let Some(change) = f.next(Instant::now() + Duration::from_secs(3600))? {
//!     for p in &change.paths {
//!         println!("{} at {}:{}: {:?}", p.entry.subsystem, p.entry.address, p.entry.service_id, p.action);
//!     }
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::HashSet;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use super::{DISCOVERY_NQN, DiscoverOptions, Entry, Subtype, discover};
use crate::error::{Error, Result};
use crate::nvme::fabrics::{ConnectOptions, Host};
use crate::nvme::sysfs::{self as sysnvme, CtrlState, NvmeController};
use crate::root::Root;
use crate::uevent::{Action, Monitor, Received, Uevent};

/// The `NVME_AEN` value of a Discovery Log Page change notice (event type 2, notice; info
/// 0xf0, discovery log change; log page 0x70), as the kernel prints it.
pub const AEN_DISCOVERY_CHANGE: &str = "0x70f002";

/// How long after a failed read of the log the follower reads it again, unless another
/// event comes first.
const READ_RETRY: Duration = Duration::from_secs(5);

/// nvme-cli's keep-alive for persistent discovery controllers (`NVMF_DEF_DISC_TMO`).
pub const DEFAULT_KEEP_ALIVE: u32 = 30;

/// What [`Follower::start`] connects to, and how.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct FollowOptions {
    /// The discovery service's address.
    pub traddr: IpAddr,
    /// Its port.
    pub trsvcid: u16,
    /// This node's identity; `None` reads it with [`Host::from_node`].
    pub host: Option<Host>,
    /// The discovery controller's keep-alive, in seconds (non-zero: that is what keeps it).
    pub keep_alive_tmo: u32,
    /// The deadline of each connect, log read and delete the follower makes.
    pub step_timeout: Duration,
}

impl FollowOptions {
    /// Follow the service at `traddr`:`trsvcid` as this node, with nvme-cli's keep-alive.
    pub fn new(traddr: IpAddr, trsvcid: u16) -> FollowOptions {
        FollowOptions {
            traddr,
            trsvcid,
            host: None,
            keep_alive_tmo: DEFAULT_KEEP_ALIVE,
            step_timeout: Duration::from_secs(30),
        }
    }
}

/// Why the log was read again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trigger {
    /// The discovery-change event ([`AEN_DISCOVERY_CHANGE`]).
    Changed,
    /// The controller reconnected (`NVME_EVENT=rediscover`): what changed meanwhile is
    /// unknown.
    Rediscover,
    /// The uevent queue overflowed: an event may have been lost, so the log is read anyway.
    Overflow,
}

/// What the follower did about one path.
#[derive(Debug)]
pub enum PathAction {
    /// A new path, connected (or found connected already).
    Connected {
        /// The controller (`nvme4`).
        controller: String,
        /// Whether it was there before.
        existing: bool,
    },
    /// A path the log no longer lists: its controller was deleted.
    Deleted {
        /// The controller that was deleted.
        controller: String,
    },
    /// A path the log no longer lists, whose controller was left, and why.
    Left {
        /// The controller left.
        controller: String,
        /// Why it was not deleted.
        reason: String,
    },
    /// The connect or the delete failed.
    Failed(Error),
}

/// One path the follower acted on.
#[derive(Debug)]
pub struct PathChange {
    /// The log's entry for the path (for a removed path, the entry it had).
    pub entry: Entry,
    /// What was done.
    pub action: PathAction,
}

/// One change of the log, and what the follower did about it.
#[derive(Debug)]
pub struct Change {
    /// Why the log was read.
    pub trigger: Trigger,
    /// The NVM subsystem entries that are new.
    pub added: Vec<Entry>,
    /// The NVM subsystem entries that are gone.
    pub removed: Vec<Entry>,
    /// The paths of subsystems this node uses that were connected or deleted.
    pub paths: Vec<PathChange>,
    /// How long reading and acting took.
    pub elapsed: Duration,
}

/// A persistent discovery controller and the log it last showed.
#[derive(Debug)]
pub struct Follower {
    root: Root,
    opts: FollowOptions,
    host: Host,
    monitor: Monitor,
    controller: String,
    /// Whether [`Follower::start`] made the controller (then [`Follower::stop`] deletes it).
    owned: bool,
    known: Vec<Entry>,
    /// A change seen but not yet read (the read failed): the next call reads at once.
    pending: Option<Trigger>,
}

impl Follower {
    /// Subscribes to uevents, connects the persistent discovery controller (or takes the
    /// one connected already, as [`super::discover`] does) and reads the log once.
    ///
    /// # Errors
    ///
    /// Those of [`crate::nvme::connect`] and [`super::discover`]; [`Error::Io`] when the
    /// uevent socket cannot be opened.
    pub fn start(root: &Root, opts: FollowOptions) -> Result<Follower> {
        let host = opts
            .host
            .clone()
            .map_or_else(|| Host::from_node(root), Ok)?;
        // Subscribe first: a change between the connect and the first read is then seen.
        let monitor = Monitor::open()?;
        let mut connect = ConnectOptions::new(opts.traddr, opts.trsvcid, DISCOVERY_NQN.parse()?);
        connect.host = Some(host.clone());
        connect.keep_alive_tmo = Some(opts.keep_alive_tmo.max(1));
        connect.timeout = opts.step_timeout;
        let c = crate::nvme::connect(root, &connect)?;
        let mut f = Follower {
            root: root.clone(),
            opts,
            host,
            monitor,
            controller: c.controller,
            owned: !c.existing,
            known: Vec::new(),
            pending: None,
        };
        match f.read() {
            Ok(known) => f.known = known,
            Err(e) => {
                // Nothing to follow: the controller made for it goes too.
                let _ = f.stop();
                return Err(e);
            }
        }
        Ok(f)
    }

    /// The persistent discovery controller (`nvme3`).
    pub fn controller(&self) -> &str {
        &self.controller
    }

    /// The NVM subsystem entries the log showed when last read.
    pub fn entries(&self) -> &[Entry] {
        &self.known
    }

    /// Waits until the kernel says the log changed (or may have), then reads it and acts
    /// on the difference. `None` when `deadline` passed with no such event.
    ///
    /// # Errors
    ///
    /// [`Error::NotFound`] when the discovery controller is gone (deleted by someone, or
    /// by the kernel after `ctrl_loss_tmo`); those of [`super::discover`] when the log
    /// cannot be read, the change being kept: the next call reads again on the next event
    /// or 5 s later, whichever comes first.
    pub fn next(&mut self, deadline: Instant) -> Result<Option<Change>> {
        let trigger = match self.pending.take() {
            // A read that failed (the controller reconnecting, say) is made again on the
            // next event or after READ_RETRY, not at once: a caller's loop must not spin.
            Some(t) => {
                let retry_at = Instant::now() + READ_RETRY;
                if self.wait(retry_at.min(deadline))?.is_none() && deadline < retry_at {
                    self.pending = Some(t);
                    return Ok(None);
                }
                t
            }
            None => match self.wait(deadline)? {
                Some(t) => t,
                None => return Ok(None),
            },
        };
        let start = Instant::now();
        let now = match self.read() {
            Ok(now) => now,
            Err(e) => {
                self.pending = Some(trigger);
                return Err(e);
            }
        };
        let (added, removed) = diff(&self.known, &now);
        let mut paths = Vec::new();
        for e in &added {
            if let Some(p) = self.connect(e)? {
                paths.push(p);
            }
        }
        for e in &removed {
            if let Some(p) = self.drop_path(e)? {
                paths.push(p);
            }
        }
        self.known = now;
        Ok(Some(Change {
            trigger,
            added,
            removed,
            paths,
            elapsed: start.elapsed(),
        }))
    }

    /// Deletes the discovery controller if [`Follower::start`] made it; one that was there
    /// before is left to whoever made it.
    pub fn stop(self) -> Result<()> {
        if !self.owned {
            return Ok(());
        }
        let deadline = Instant::now() + self.opts.step_timeout;
        match sysnvme::controller(&self.root, &self.controller)? {
            Some(c) => crate::nvme::delete_controller(&self.root, &c, deadline),
            None => Ok(()),
        }
    }

    /// The next event that says the log changed, for this controller.
    fn wait(&mut self, deadline: Instant) -> Result<Option<Trigger>> {
        // Looked at once; from then on the controller's own `remove` uevent says it went.
        if sysnvme::controller(&self.root, &self.controller)?.is_none() {
            return Err(self.gone());
        }
        loop {
            match self.monitor.recv(Some(deadline))? {
                Received::TimedOut => return Ok(None),
                Received::Overflow => return Ok(Some(Trigger::Overflow)),
                Received::Event(ev) if removes(&ev, &self.controller) => return Err(self.gone()),
                Received::Event(ev) => {
                    if let Some(t) = trigger(&ev, &self.controller) {
                        return Ok(Some(t));
                    }
                }
            }
        }
    }

    fn gone(&self) -> Error {
        Error::NotFound {
            what: format!(
                "persistent discovery controller {} (deleted, or the kernel gave up \
                 reconnecting)",
                self.controller
            ),
        }
    }

    /// The NVM subsystem entries of the log and of the services it refers to.
    fn read(&self) -> Result<Vec<Entry>> {
        let mut opts = DiscoverOptions::new(self.opts.traddr, self.opts.trsvcid);
        opts.host = Some(self.host.clone());
        opts.timeout = self.opts.step_timeout;
        Ok(discover(&self.root, &opts)?.subsystems().cloned().collect())
    }

    /// Connects the path of `e` when its subsystem has a controller on the node already.
    fn connect(&self, e: &Entry) -> Result<Option<PathChange>> {
        let Some(opts) = self.path_options(e) else {
            return Ok(None);
        };
        if !self.uses(&opts)? {
            return Ok(None);
        }
        if let Some(refusal) = tls_refusal(e) {
            return Ok(Some(PathChange {
                entry: e.clone(),
                action: PathAction::Failed(refusal),
            }));
        }
        let action = match crate::nvme::connect(&self.root, &opts) {
            Ok(c) => PathAction::Connected {
                controller: c.controller,
                existing: c.existing,
            },
            Err(err) => PathAction::Failed(err),
        };
        Ok(Some(PathChange {
            entry: e.clone(),
            action,
        }))
    }

    /// Deletes the controller of the path `e` listed, when that is safe.
    fn drop_path(&self, e: &Entry) -> Result<Option<PathChange>> {
        let Some(opts) = self.path_options(e) else {
            return Ok(None);
        };
        let Some(c) = crate::nvme::find_controller(&self.root, &opts, &self.host)? else {
            return Ok(None);
        };
        let siblings = crate::nvme::controllers_of(&self.root, &opts.nqn)?;
        let action = match keep_reason(&c, &siblings) {
            Some(reason) => PathAction::Left {
                controller: c.name.clone(),
                reason,
            },
            None => {
                let deadline = Instant::now() + self.opts.step_timeout;
                match crate::nvme::delete_controller(&self.root, &c, deadline) {
                    Ok(()) => PathAction::Deleted {
                        controller: c.name.clone(),
                    },
                    Err(err) => PathAction::Failed(err),
                }
            }
        };
        Ok(Some(PathChange {
            entry: e.clone(),
            action,
        }))
    }

    /// The connect options of `e`'s path as this host, or `None` for an entry that is not
    /// a TCP path with a valid NQN, address and port (the log's own odd entries).
    fn path_options(&self, e: &Entry) -> Option<ConnectOptions> {
        let mut o = ConnectOptions::new(e.ip().ok()?, e.port().ok()?, e.nqn().ok()?);
        o.host = Some(self.host.clone());
        o.timeout = self.opts.step_timeout;
        Some(o)
    }

    /// Whether the node uses the subsystem of `opts`: a controller of it exists as this
    /// host NQN.
    fn uses(&self, opts: &ConnectOptions) -> Result<bool> {
        Ok(crate::nvme::controllers_of(&self.root, &opts.nqn)?
            .iter()
            .any(|c| c.hostnqn.as_deref() == Some(self.host.nqn.as_str())))
    }
}

/// The refusal of a path whose port requires a secure channel (`TREQ`): lunkit does not set
/// up NVMe/TCP TLS, which needs a handshake daemon (tlshd) Debian 12 does not package.
pub fn tls_refusal(e: &Entry) -> Option<Error> {
    e.secure_channel_required().then(|| {
        Error::invalid(
            "discovery entry",
            &format!("{} at {}:{}", e.subsystem, e.address, e.service_id),
            "the port requires a secure channel (NVMe/TCP TLS), which lunkit does not set up: \
             it needs a TLS handshake daemon (tlshd) that Debian 12 does not package",
        )
    })
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
fn is_path(n: &str) -> bool {
    n.strip_prefix("nvme")
        .and_then(|r| r.split_once('c'))
        .is_some_and(|(a, b)| {
            !a.is_empty() && a.bytes().all(|c| c.is_ascii_digit()) && b.contains('n')
        })
}

#[cfg(test)]
mod tests;

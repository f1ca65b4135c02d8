//! Persistent discovery: a discovery controller kept connected (with a keep-alive), whose
//! log changes the kernel announces, and a follower that brings the node's paths in line.
//!
//! A discovery controller connected with a non-zero `keep_alive_tmo` stays, and the kernel
//! enables the discovery-change asynchronous event on it. When the target's log changes (a
//! port linked to or unlinked from a subsystem, a referral added or removed) the kernel
//! sends a `change` uevent on the controller with `NVME_AEN=0x70f002`; when the controller
//! reconnects after a link loss, one with `NVME_EVENT=rediscover` (the keys nvme-cli's
//! `70-nvmf-autoconnect.rules` matches). [`Follower::next`] waits for either, reads the log
//! again through that controller (which re-arms the event; referrals followed, as
//! [`crate::nvme::discovery::discover`] does), and for the subsystems this node already uses:
//!
//! - connects each new path (not one whose port requires TLS: that is reported as failed);
//! - deletes the controller of each path the log no longer lists, but only while another
//!   controller of the subsystem is `live` and the path's namespaces are native-multipath
//!   paths (`nvmeXcYnZ`), so that no device anyone opened goes away.
//!
//! A path the first read at [`Follower::start`] lists for such a subsystem, with no
//! controller, is connected on the first [`Follower::next`] ([`Trigger::Started`]): a port
//! added before the follower started is no change any later read would show.
//!
//! ```no_run
//! use std::time::{Duration, Instant};
//! use lunkit::Root;
//! use lunkit::ops::nvme::follow::{FollowOptions, Follower};
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

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::subsystem_lock_key;
use crate::error::{Error, Result};
use crate::id::Nqn;
use crate::nvme::dhchap::Secret;
use crate::nvme::discovery::{
    DISCOVERY_NQN, DiscoverOptions, Entry, Subtype, discover_via, tls_refusal,
};
use crate::nvme::fabrics::{ConnectOptions, Host};
use crate::nvme::sysfs as sysnvme;
use crate::ops::lock::{self, VolumeLock};
use crate::root::Root;
use crate::uevent::{Monitor, Received};

mod decide;

pub use decide::{diff, keep_reason, removes, requeue, retry_wait, trigger};

/// The `NVME_AEN` value of a Discovery Log Page change notice (event type 2, notice; info
/// 0xf0, discovery log change; log page 0x70), as the kernel prints it.
pub const AEN_DISCOVERY_CHANGE: &str = "0x70f002";

/// How long after a failed read of the log the follower reads it again, unless another
/// event comes first.
const READ_RETRY: Duration = Duration::from_secs(5);

/// How long after a path's connect or delete failed the follower tries it again, unless
/// another event comes first; doubled after each retry that failed again, up to
/// [`PATH_RETRY_MAX`]: a subsystem that refuses this host's secrets is not asked every 30 s
/// for ever.
const PATH_RETRY: Duration = Duration::from_secs(30);

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
    /// How long the follower waits for a subsystem's lock (an attach holds it until its
    /// device comes) before it leaves the path for the next try.
    pub lock_timeout: Duration,
    /// The directory of attach's and detach's lock files
    /// ([`AttachOptions::lock_dir`](crate::ops::AttachOptions::lock_dir)); `None` takes
    /// theirs by default, `<root>/run/lunkit/locks`. The follower decides about each
    /// subsystem's paths under that subsystem's lock there ([`super::subsystem_lock_key`]).
    pub lock_dir: Option<PathBuf>,
    /// The host's DH-HMAC-CHAP secret each path is connected with
    /// ([`ConnectOptions::dhchap_secret`]); not used for the discovery controller.
    pub dhchap_secret: Option<Secret>,
    /// The controller's secret each path is connected with
    /// ([`ConnectOptions::dhchap_ctrl_secret`]): a path whose controller cannot prove itself
    /// with it is refused by the kernel and never connected.
    pub dhchap_ctrl_secret: Option<Secret>,
    /// The only subsystems whose paths the follower connects and deletes; `None`: every
    /// subsystem the node uses as this host. A caller that follows one service for volumes
    /// with different secrets gives each follower the subsystems its secrets are for, so
    /// that no path is connected with another volume's secrets, or without them
    /// ([`Follower::set_subsystems`] changes it).
    pub subsystems: Option<BTreeSet<Nqn>>,
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
            lock_timeout: Duration::from_secs(30),
            lock_dir: None,
            dhchap_secret: None,
            dhchap_ctrl_secret: None,
            subsystems: None,
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
    /// A path's connect or delete failed earlier and is tried again.
    Retry,
    /// The first read, at [`Follower::start`], listed paths of subsystems this node uses
    /// that have no controller: the log changed between their volume's attach and the
    /// start (or while no follower ran), with no event this follower could see.
    Started,
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
    /// The new path's connect failed (or the subsystem's lock could not be had for it): the
    /// volume has one path fewer than its discovery service lists. Tried again later.
    Failed(Error),
    /// A path the log no longer lists kept its controller: the delete failed. Tried again.
    DeleteFailed {
        /// The controller not deleted.
        controller: String,
        /// Why.
        error: Error,
    },
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
    lock_dir: PathBuf,
    controller: String,
    /// Whether [`Follower::start`] made the controller (then [`Follower::stop`] deletes it).
    owned: bool,
    known: Vec<Entry>,
    /// A read to make again (the read failed, or a path did), and when it is due unless an
    /// event comes first.
    pending: Option<(Trigger, Instant)>,
    /// How many retries of failed paths in a row failed again: the next waits
    /// [`PATH_RETRY`] doubled as often.
    failed_retries: u32,
}

impl Follower {
    /// Subscribes to uevents, connects the persistent discovery controller (or takes the
    /// one connected already for the same service and host: a persistent one made by
    /// someone else, or by this caller before a restart) and reads the log once.
    ///
    /// # Errors
    ///
    /// Those of [`crate::nvme::connect`] and [`crate::nvme::discovery::discover_via`];
    /// [`Error::Io`] when the
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
        let lock_dir = opts
            .lock_dir
            .clone()
            .unwrap_or_else(|| root.run("lunkit/locks"));
        let mut f = Follower {
            root: root.clone(),
            opts,
            host,
            monitor,
            lock_dir,
            controller: c.controller,
            owned: !c.existing,
            known: Vec::new(),
            pending: None,
            failed_retries: 0,
        };
        let known = match f.read().and_then(|known| f.unconnected(known)) {
            Ok(known) => known,
            Err(e) => {
                // Nothing to follow: the controller made for it goes too.
                let _ = f.stop();
                return Err(e);
            }
        };
        f.known = known.0;
        if known.1 {
            // The first `next` reads again and connects them, as for a change.
            f.pending = Some((Trigger::Started, Instant::now()));
        }
        Ok(f)
    }

    /// `entries` without the paths of subsystems this node uses that have no controller, and
    /// whether there were any. A port the array added after a volume's attach, before this
    /// follower read the log, changes nothing the follower could see later: left in, it
    /// would never be connected.
    fn unconnected(&self, entries: Vec<Entry>) -> Result<(Vec<Entry>, bool)> {
        let mut known = Vec::with_capacity(entries.len());
        let mut missing = false;
        for e in entries {
            if self.lacks_path(&e)? {
                missing = true;
            } else {
                known.push(e);
            }
        }
        Ok((known, missing))
    }

    /// Whether `e` is a path of an NVM subsystem this node uses, with no controller.
    fn lacks_path(&self, e: &Entry) -> Result<bool> {
        let Some(opts) = self.path_options(e) else {
            return Ok(false);
        };
        Ok(e.subtype == Subtype::Nvm
            && self.uses(&opts)?
            && crate::nvme::find_controller(&self.root, &opts, &self.host)?.is_none())
    }

    /// The persistent discovery controller (`nvme3`).
    pub fn controller(&self) -> &str {
        &self.controller
    }

    /// Whether [`Follower::stop`] deletes the controller: [`Follower::start`] made it, or
    /// [`Follower::take_ownership`] said so.
    pub fn owned(&self) -> bool {
        self.owned
    }

    /// Makes [`Follower::stop`] delete the controller though [`Follower::start`] found it
    /// connected: for a caller that knows it made it earlier (a restarted CSI plugin that
    /// recorded it), so that it is not left behind.
    pub fn take_ownership(&mut self) {
        self.owned = true;
    }

    /// Makes the follower act only on the paths of `subsystems` from now on (`None`: every
    /// subsystem the node uses as this host), as [`FollowOptions::subsystems`].
    pub fn set_subsystems(&mut self, subsystems: Option<BTreeSet<Nqn>>) {
        self.opts.subsystems = subsystems;
    }

    /// The NVM subsystem entries the log showed when last read.
    pub fn entries(&self) -> &[Entry] {
        &self.known
    }

    /// Waits until the kernel says the log changed (or may have), then reads it and acts
    /// on the difference. `None` when `deadline` passed with no such event.
    ///
    /// A path whose connect or delete failed (a subsystem lock held past the step's
    /// deadline, a port not answering yet) is tried again on the next event or 30 s later
    /// ([`Trigger::Retry`]); one refused for TLS is not.
    ///
    /// # Errors
    ///
    /// [`Error::NotFound`] when the discovery controller is gone (deleted by someone, or
    /// by the kernel after `ctrl_loss_tmo`); those of [`crate::nvme::discovery::discover_via`]
    /// when the log cannot be read, the change being kept: a later call reads again on the
    /// next event or 5 s after the failure, whichever comes first.
    pub fn next(&mut self, deadline: Instant) -> Result<Option<Change>> {
        let trigger = match self.pending.take() {
            // A read that failed (the controller reconnecting, say) or a path that failed is
            // tried again on the next event or when due, not at once: a caller's loop must
            // not spin. The due time stays across calls with short deadlines.
            Some((t, due)) => match self.wait(due.min(deadline))? {
                Some(_) => t,
                None if Instant::now() >= due => t,
                None => {
                    self.pending = Some((t, due));
                    return Ok(None);
                }
            },
            None => match self.wait(deadline)? {
                Some(t) => t,
                None => return Ok(None),
            },
        };
        let start = Instant::now();
        let now = match self.read() {
            Ok(now) => now,
            Err(e) => {
                self.pending = Some((trigger, Instant::now() + READ_RETRY));
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
        if requeue(&mut self.known, &paths) {
            // A retry that failed again waits twice as long; a new change starts over.
            self.failed_retries = if trigger == Trigger::Retry {
                self.failed_retries.saturating_add(1)
            } else {
                0
            };
            let wait = retry_wait(self.failed_retries);
            self.pending = Some((Trigger::Retry, Instant::now() + wait));
        } else {
            self.failed_retries = 0;
        }
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
                "persistent discovery controller {} is gone (deleted, or the kernel gave up \
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
        // Through the persistent controller itself: that read re-arms its change event.
        Ok(discover_via(&self.root, &self.controller, &opts)?
            .subsystems()
            .cloned()
            .collect())
    }

    /// Connects the path of `e` when its subsystem has a controller on the node already.
    ///
    /// Decided under the subsystem's lock: a detach deletes the subsystem's last controllers
    /// under it, so a path is never connected again for a subsystem a detach just took
    /// away, and an attach's connects are never raced.
    fn connect(&self, e: &Entry) -> Result<Option<PathChange>> {
        let Some(opts) = self.path_options(e) else {
            return Ok(None);
        };
        if !self.uses(&opts)? {
            return Ok(None);
        }
        let failed = |err| {
            Ok(Some(PathChange {
                entry: e.clone(),
                action: PathAction::Failed(err),
            }))
        };
        if let Some(refusal) = tls_refusal(e) {
            return failed(refusal);
        }
        let _subsystem = match self.lock(&opts.nqn) {
            Ok(l) => l,
            Err(err) => return failed(err),
        };
        // Looked at again under the lock: a detach may have deleted the last controller
        // between the first look and the lock.
        if !self.uses(&opts)? {
            return Ok(None);
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

    /// The lock attach and detach take on subsystem `nqn`, within the lock's timeout.
    fn lock(&self, nqn: &Nqn) -> Result<VolumeLock> {
        let deadline = Instant::now() + self.opts.lock_timeout;
        lock::lock(&subsystem_lock_key(nqn), Some(&self.lock_dir), deadline)
    }

    /// Deletes the controller of the path `e` listed, when that is safe; decided under the
    /// subsystem's lock, as attach and detach decide which controllers are needed.
    fn drop_path(&self, e: &Entry) -> Result<Option<PathChange>> {
        let Some(opts) = self.path_options(e) else {
            return Ok(None);
        };
        let Some(seen) = crate::nvme::find_controller(&self.root, &opts, &self.host)? else {
            return Ok(None);
        };
        let _subsystem = match self.lock(&opts.nqn) {
            Ok(l) => l,
            Err(error) => {
                return Ok(Some(PathChange {
                    entry: e.clone(),
                    action: PathAction::DeleteFailed {
                        controller: seen.name,
                        error,
                    },
                }));
            }
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
                    Err(error) => PathAction::DeleteFailed {
                        controller: c.name.clone(),
                        error,
                    },
                }
            }
        };
        Ok(Some(PathChange {
            entry: e.clone(),
            action,
        }))
    }

    /// The connect options of `e`'s path as this host ([`decide::path_connect`]).
    fn path_options(&self, e: &Entry) -> Option<ConnectOptions> {
        decide::path_connect(&self.opts, &self.host, e)
    }

    /// Whether the node uses the subsystem of `opts`: a controller of it exists as this
    /// host NQN.
    fn uses(&self, opts: &ConnectOptions) -> Result<bool> {
        Ok(crate::nvme::controllers_of(&self.root, &opts.nqn)?
            .iter()
            .any(|c| c.hostnqn.as_deref() == Some(self.host.nqn.as_str())))
    }
}

#[cfg(test)]
mod tests;

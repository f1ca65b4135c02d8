//! Which walk over the processes an in-use check takes: its own, started at once when no
//! other check of this process is walking, or the next one, shared with every check that
//! asked while the one under way ran ([`helper::Shared`]).
//!
//! A walk is good for a check only if it started after the check asked: one already under
//! way may have passed a process before that process opened the device. A node drain
//! detaches tens of volumes at once, and a walk of each check's own would read every
//! process again beside the others.

use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustix::fs::{Mode, OFlags};

use crate::error::{Error, Result};
use crate::helper;
use crate::root::Root;

use super::processes::{Collected, Walk};

/// How long a check about to walk waits at most for the checks that said they will ask
/// ([`CheckIntent`]). 32 detaches started together reached their checks within 230 ms of
/// each other in a TCG guest (a few ms on hardware); a walk there took 1.2–3 s, and a check
/// that asks while one is under way waits for it and then for the next.
const GATHER_MAX: Duration = Duration::from_millis(250);

/// A check's word that it will soon look at the processes under a `/proc`: a check about
/// to start a walk there waits for it a little (at most [`GATHER_MAX`]), so that checks
/// that began together share one walk. Dropped once the check has asked, or when it will
/// not ask after all.
///
/// A check may also ask before it knows its devices ([`CheckIntent::begin`]): the walk
/// reads every process's block devices whichever they are, and is matched against the
/// devices only once the check has them.
pub(crate) struct CheckIntent(Stage);

enum Stage {
    /// Said, not asked yet.
    Said(helper::Intent<Collected>),
    /// Asked: the check's place among the walks, perhaps a walk of its own under way (or
    /// why `<root>/proc` could not be opened, for the check to report).
    Begun(Result<Walking>),
}

/// A [`CheckIntent`] for the processes under `root`'s `/proc`. Reads nothing.
pub(crate) fn intend_check(root: &Root) -> CheckIntent {
    CheckIntent(Stage::Said(shared(&root.proc("")).intend()))
}

impl CheckIntent {
    /// Asks now, before the check has its devices, so that its walk runs while the caller
    /// finds them (a detach locating its volume): the check then takes a walk that started
    /// from here on, as [`Walking::start`] does at the check. The earlier the ask, the
    /// longer a process that opens the device after the walk passed it goes unseen, so a
    /// caller asks only once nothing it waits for comes between (a detach: once it holds
    /// the volume's lock). An error opening `/proc` is the check's, reported by it.
    pub(crate) fn begin(self, root: &Root, deadline: Instant) -> CheckIntent {
        match self.0 {
            Stage::Said(said) => {
                CheckIntent(Stage::Begun(Walking::ask(root, deadline, Some(said), true)))
            }
            Stage::Begun(_) => self,
        }
    }
}

/// A check's place among the walks of its `/proc`, taken when the check starts.
pub(super) struct Walking {
    proc_fd: Arc<OwnedFd>,
    walks: &'static helper::Shared<Collected>,
    ticket: helper::Ticket,
    /// The walk this check started itself, none being under way: it runs while the check
    /// reads the rest, and is published for the checks that ask meanwhile.
    lead: Option<(helper::Lead<'static, Collected>, Walk)>,
}

impl Walking {
    /// Opens `<root>/proc` and takes the check's place: a walk of its own if none is under
    /// way (its shares start on helper threads now), else a ticket for the next one. The
    /// check's `intent`, if it gave one, ends once it has asked; a walk of its own starts
    /// once the other checks that gave one have asked too, or [`GATHER_MAX`] has passed.
    pub(super) fn start(
        root: &Root,
        deadline: Instant,
        intent: Option<CheckIntent>,
    ) -> Result<Walking> {
        match intent.map(|i| i.0) {
            Some(Stage::Begun(begun)) => begun,
            Some(Stage::Said(said)) => Walking::ask(root, deadline, Some(said), false),
            None => Walking::ask(root, deadline, None, false),
        }
    }

    /// [`Walking::start`], by a check that said it would ask (`intent`) if any; `ahead`:
    /// the caller has other work before the check (see [`Walk::start`]).
    fn ask(
        root: &Root,
        deadline: Instant,
        intent: Option<helper::Intent<Collected>>,
        ahead: bool,
    ) -> Result<Walking> {
        let proc_dir = root.proc("");
        let proc_fd = Arc::new(
            rustix::fs::open(
                &proc_dir,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| Error::io(&proc_dir, e.into()))?,
        );
        let walks = shared(&proc_dir);
        let ticket = walks.ask();
        drop(intent);
        walks.gather(deadline.min(Instant::now() + GATHER_MAX));
        let lead = match walks.lead() {
            Some(lead) => Some((lead, Walk::start(root, &proc_fd, deadline, ahead)?)),
            None => None,
        };
        Ok(Walking {
            proc_fd,
            walks,
            ticket,
            lead,
        })
    }

    /// `<root>/proc`, open.
    pub(super) fn proc_fd(&self) -> &Arc<OwnedFd> {
        &self.proc_fd
    }

    /// What the check's walk saw: its own, or the first of this process's walks that
    /// started after the check did, which this check may run itself. Dropped unused (the
    /// check found a user first), a walk of its own stops, and those waiting for it run
    /// their own.
    pub(super) fn collected(self, root: &Root, deadline: Instant) -> Result<Arc<Collected>> {
        if let Some((lead, walk)) = self.lead {
            return Ok(lead.share(walk.collect(deadline)?));
        }
        let asked = Instant::now();
        let mut failed = None;
        let own = || match Walk::start(root, &self.proc_fd, deadline, false)
            .and_then(|w| w.collect(deadline))
        {
            Ok(c) => Some(c),
            Err(e) => {
                failed = Some(e);
                None
            }
        };
        match self.ticket.take(self.walks, deadline, own) {
            helper::Taken::Shared(c) => Ok(c),
            helper::Taken::Failed => Err(failed.unwrap_or_else(|| Error::Internal {
                what: "the /proc walk failed without saying why".into(),
            })),
            helper::Taken::TimedOut => Err(Error::Timeout {
                what: "another in-use check's walk over every process to end (this check \
                       shares the next one)"
                    .into(),
                waited: asked.elapsed(),
            }),
        }
    }
}

/// The walks of the `/proc` at `proc_dir`, shared by this process's checks.
fn shared(proc_dir: &Path) -> &'static helper::Shared<Collected> {
    static WALKS: helper::Registry<Collected> = Mutex::new(Vec::new());
    helper::keyed(&WALKS, proc_dir)
}

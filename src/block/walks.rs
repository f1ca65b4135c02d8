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
                CheckIntent(Stage::Begun(Walking::ask(root, deadline, said, true)))
            }
            Stage::Begun(_) => self,
        }
    }
}

/// A check's place among the walks of its `/proc`, taken when the check starts.
pub(super) struct Walking {
    proc_fd: Arc<OwnedFd>,
    walks: &'static helper::Shared<Collected>,
    /// `None` once taken or given up.
    ticket: Option<helper::Ticket>,
    /// The walk this check started itself, none being under way: it runs while the check
    /// reads the rest, and is published for the checks that ask meanwhile.
    lead: Option<(helper::Lead<'static, Collected>, Walk)>,
    deadline: Instant,
}

/// Checks to come, promised a place in the walk that the first of them starts
/// ([`gather_checks`]). Dropped, the places nobody claimed are withdrawn.
#[must_use = "the promise holds only while the value lives"]
pub struct CheckGathering(#[allow(dead_code)] helper::Promise<Collected>);

impl std::fmt::Debug for CheckGathering {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CheckGathering")
    }
}

/// Says ahead that `count` in-use checks of this process will begin together over the
/// processes under `root`'s `/proc` (a detach each, [`crate::ops::detach_all`]): the walk
/// the first of them starts waits for the others to ask, up to `within` from now, where a
/// check would otherwise wait a quarter of a second at most. Then one walk serves them all,
/// where checks whose threads run late would each take another.
///
/// Each detach claims a place as it begins (an NVMe detach gives its place back at once:
/// its check walks on its own); the places nobody claimed are withdrawn
/// when the returned value drops, so a promise for more checks than came costs the others
/// at most `within` of waiting.
pub fn gather_checks(root: &Root, count: usize, within: Duration) -> CheckGathering {
    CheckGathering(shared(&root.proc("")).promise(count, Instant::now() + within))
}

/// How many walks over the processes under `root`'s `/proc` this process has started (for
/// its own, and for the checks that shared each): a batch's report says how many it took.
pub fn walks_started(root: &Root) -> u64 {
    shared(&root.proc("")).started()
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
            Some(Stage::Said(said)) => Walking::ask(root, deadline, said, false),
            // Said and asked at once: a check of a batch claims its promised place.
            None => {
                let said = shared(&root.proc("")).intend();
                Walking::ask(root, deadline, said, false)
            }
        }
    }

    /// [`Walking::start`], by a check that said it would ask (`intent`) if any; `ahead`:
    /// the caller has other work before the check (see [`Walk::start`]).
    fn ask(
        root: &Root,
        deadline: Instant,
        intent: helper::Intent<Collected>,
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
        walks.gather(Instant::now() + GATHER_MAX, deadline);
        let lead = match walks.lead() {
            Some(lead) => match Walk::start(root, &proc_fd, deadline, ahead) {
                Ok(walk) => Some((lead, walk)),
                Err(e) => {
                    walks.give_up(ticket);
                    return Err(e);
                }
            },
            None => None,
        };
        Ok(Walking {
            proc_fd,
            walks,
            ticket: Some(ticket),
            lead,
            deadline,
        })
    }

    /// `<root>/proc`, open.
    pub(super) fn proc_fd(&self) -> &Arc<OwnedFd> {
        &self.proc_fd
    }

    /// What the check's walk saw: its own, or the first of this process's walks that
    /// started after the check did, which this check may run itself. Dropped unused (the
    /// check found a user first), a walk of its own goes on for those waiting for it, or
    /// stops when nobody is (see the `Drop`).
    pub(super) fn collected(mut self, root: &Root, deadline: Instant) -> Result<Arc<Collected>> {
        if let Some((lead, walk)) = self.lead.take() {
            if let Some(t) = self.ticket.take() {
                self.walks.give_up(t);
            }
            return Ok(lead.share(walk.collect(deadline)?));
        }
        let Some(ticket) = self.ticket.take() else {
            return Err(Error::Internal {
                what: "an in-use check asked for its walk twice".into(),
            });
        };
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
        match ticket.take(self.walks, deadline, own) {
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

/// A check that needs no walk after all (it found a user first): a walk it leads goes on
/// for the checks that asked before it started, finished on a thread of its own and shared
/// with them as if the check had collected it; nobody else waiting, it stops.
impl Drop for Walking {
    fn drop(&mut self) {
        if let Some(t) = self.ticket.take() {
            self.walks.give_up(t);
        }
        let Some((lead, walk)) = self.lead.take() else {
            return;
        };
        if !self.walks.wanted(lead.run()) {
            return;
        }
        let deadline = self.deadline;
        // Failing to start the thread drops both: the walk stops and the run ends failed,
        // and those who waited for it run their own, as before the hand-over.
        let _ = std::thread::Builder::new()
            .name("lunkit-walk".into())
            .spawn(move || {
                if let Ok(found) = walk.collect(deadline) {
                    lead.share(found);
                }
            });
    }
}

/// The walks of the `/proc` at `proc_dir`, shared by this process's checks.
fn shared(proc_dir: &Path) -> &'static helper::Shared<Collected> {
    static WALKS: helper::Registry<Collected> = Mutex::new(Vec::new());
    helper::keyed(&WALKS, proc_dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A root of its own whose `proc` is the host's: its walks are this test's alone,
    /// whatever other tests of this process check meanwhile.
    fn own_root(name: &str) -> Root {
        let dir = std::env::temp_dir().join(format!("lunkit-walks-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::os::unix::fs::symlink("/proc", dir.join("proc")).unwrap();
        Root::new(dir)
    }

    fn deadline() -> Instant {
        Instant::now() + Duration::from_secs(30)
    }

    #[test]
    fn a_walk_whose_check_needs_none_goes_on_for_a_check_that_asked_before_it() {
        let root = own_root("handed");
        let walks = shared(&root.proc(""));
        let other = walks.ask();
        let leader = Walking::start(&root, deadline(), None).unwrap();
        assert!(leader.lead.is_some(), "nothing was under way");
        drop(leader);
        let got = other.take(walks, deadline(), || {
            panic!("the leader's walk was handed over, not stopped")
        });
        assert!(
            matches!(got, helper::Taken::Shared(_)),
            "the walk was shared"
        );
        assert_eq!(walks_started(&root), 1, "one walk for both");
        let _ = std::fs::remove_dir_all(root.path());
    }

    #[test]
    fn a_walk_nobody_else_wants_stops_with_its_check() {
        let root = own_root("stopped");
        let walks = shared(&root.proc(""));
        let leader = Walking::start(&root, deadline(), None).unwrap();
        assert!(leader.lead.is_some(), "nothing was under way");
        drop(leader);
        assert!(walks.lead().is_some(), "the walk ended with its check");
        let _ = std::fs::remove_dir_all(root.path());
    }
}

//! Paths that join a fenced volume after its stage: a new session, a path back from a
//! failure on a new session, a port the array adds. A registration belongs to one I_T
//! nexus (this initiator port and one target port), so such a path carries none: a write
//! through it gets RESERVATION CONFLICT, which dm-multipath fails rather than retries on
//! another path.
//!
//! A thread of the plugin ([`spawn`]) reads the kernel's uevents and registers this node's
//! key on every new disk of a fenced volume as it appears: the kernel's event reaches it
//! before multipathd, which waits for udev's handling of the same event, adds the disk to the
//! map. It does the same for every path of every fenced volume when it starts, and when
//! events were lost. Only staged volumes: a stage registers every path it finds itself, and
//! once its record says `Staged` looks again ([`after_stage`]) for a path that joined in
//! between, which the thread passed over.
//!
//! Never for a node that was fenced: a single-node volume's path is registered only while
//! this node's key holds the reservation ([`verdict`]), and is unregistered again when the
//! reservation is found held by another key right after (another node preempted between the
//! two looks: its preemption removed every registration of the key but the one made after
//! it). A path that could not be registered is kept ([`of`]) and named in the volume's
//! condition.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use lunkit::block::BlockNode;
use lunkit::pr::{self, Key, ReservationType};
use lunkit::uevent::{Action, Monitor, Received, Uevent};
use lunkit::{Hctl, Root, Wwid};

use crate::fence::{all_registrants, volume_paths};
use crate::log::{self, Level};
use crate::node::NodeService;
use crate::state::{Phase, Record};

/// How long one path's registration may take (its PR requests wait out a path's command
/// timeouts at worst).
const JOIN_TIMEOUT: Duration = Duration::from_secs(30);

/// `(volume id, disk)` → why the disk carries no registration of this node's key.
static UNREGISTERED: Mutex<BTreeMap<(String, String), String>> = Mutex::new(BTreeMap::new());

fn unregistered() -> MutexGuard<'static, BTreeMap<(String, String), String>> {
    UNREGISTERED.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The volume's disks that carry no registration of this node's key, with why: `(disk,
/// reason)`.
pub fn of(volume_id: &str) -> Vec<(String, String)> {
    unregistered()
        .iter()
        .filter(|((v, _), _)| v == volume_id)
        .map(|((_, d), why)| (d.clone(), why.clone()))
        .collect()
}

/// What to do about a joining path of a volume reserved `kind` with key `ours`, whose
/// reservation `holder` now has (`None`: nobody holds it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Register this node's key on it.
    Register,
    /// Leave it unregistered, for this reason.
    Leave(String),
}

/// [`Verdict`]: an all-registrants volume's path is always registered (every node that
/// stages it registers, nobody preempts); a single-node volume's only while `ours` holds it.
pub fn verdict(kind: ReservationType, ours: Key, holder: Option<Key>) -> Verdict {
    if all_registrants(kind) {
        return Verdict::Register;
    }
    match holder {
        Some(k) if k == ours => Verdict::Register,
        Some(k) => Verdict::Leave(format!(
            "key {k} holds the volume, not this node's key {ours}: this node was fenced"
        )),
        None => Verdict::Leave(format!(
            "nobody holds the volume's reservation, which this node's key {ours} took at stage"
        )),
    }
}

/// Starts the thread that registers joining paths, for as long as the process runs.
///
/// # Errors
///
/// The thread could not be started.
pub fn spawn(node: NodeService) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("lunkit-csi-fence".into())
        .spawn(move || watch(&node))
}

fn watch(node: &NodeService) {
    // Subscribed first: a disk that comes while the sweep runs is seen either way.
    let mut monitor = match Monitor::open() {
        Ok(m) => m,
        Err(e) => {
            log::note(
                Level::Warn,
                &format!(
                    "fencing: no uevents ({e}): paths that join a fenced volume are not registered"
                ),
            );
            return;
        }
    };
    sweep(node, None);
    loop {
        match monitor.recv(None) {
            Ok(Received::Event(ev)) => {
                if let Some(disk) = new_disk(&ev) {
                    sweep(node, Some(&disk));
                }
            }
            Ok(Received::Overflow) => sweep(node, None),
            Ok(Received::TimedOut) => {}
            Err(e) => {
                log::note(Level::Warn, &format!("fencing: reading uevents: {e}"));
                std::thread::sleep(Duration::from_secs(1));
            }
        }
    }
}

/// A whole SCSI disk the event adds: its kernel name and its LUN's address, from the
/// devpath (`…/H:C:T:L/block/NAME`). A dm map, a loop device or an NVMe namespace has no
/// address there, and carries no path's registration.
fn new_disk(ev: &Uevent) -> Option<(String, Hctl)> {
    if ev.action != Action::Add
        || ev.subsystem.as_deref() != Some("block")
        || ev.devtype.as_deref() != Some("disk")
    {
        return None;
    }
    let (above, _) = ev.devpath.rsplit_once("/block/")?;
    let hctl = above.rsplit('/').next()?.parse().ok()?;
    Some((ev.devname.clone()?, hctl))
}

/// Registers this node's key on `disk` if it is a path of a fenced volume, or on every path
/// of every fenced volume (`None`). Forgets the unregistered disks of volumes no longer
/// staged.
fn sweep(node: &NodeService, disk: Option<&(String, Hctl)>) {
    let records = match node.store().all() {
        Ok(r) => r,
        Err(e) => {
            log::note(
                Level::Warn,
                &format!("fencing: reading the stage records: {e}"),
            );
            return;
        }
    };
    unregistered().retain(|(v, _), _| records.iter().any(|r| &r.volume_id == v));
    // A new disk's WWID, read once from its LUN: only the volume it belongs to is located
    // (each location reads every SCSI device's WWID), not every fenced volume.
    let new = match disk {
        Some((name, hctl)) => match disk_wwid(node.root(), *hctl) {
            Some(w) => Some((name.as_str(), w)),
            None => return,
        },
        None => None,
    };
    // A volume still staging registers every path it finds itself.
    let wanted = |r: &&Record| {
        r.phase == Phase::Staged
            && r.target.fence().is_some()
            && new.as_ref().is_none_or(|(_, w)| {
                r.known_wwid().and_then(|k| k.parse::<Wwid>().ok()).as_ref() == Some(w)
            })
    };
    for record in records.iter().filter(wanted) {
        // The disk is joined only if locating the volume by its WWID finds it too.
        let this_one = |p: &BlockNode| new.as_ref().is_none_or(|(d, _)| p.name == *d);
        join_running(node.root(), record, Instant::now() + JOIN_TIMEOUT, this_one);
    }
}

/// After a fenced stage saved its record as `Staged`: every running path of the volume the
/// stage did not register (`registered`) joins now, as [`verdict`] says. The thread passed
/// over such a path while the record was not `Staged` yet; after this look, the thread sees
/// every later one. Within the stage's own deadline: a path that cannot be registered by
/// then is named in the volume's condition, as the thread's would be.
pub fn after_stage(root: &Root, record: &Record, registered: &[BlockNode], deadline: Instant) {
    let not_yet = |p: &BlockNode| !registered.iter().any(|r| r.dev == p.dev);
    join_running(root, record, deadline, not_yet);
}

/// [`join`]s every running path of `record`'s volume that `wanted` keeps.
fn join_running(
    root: &Root,
    record: &Record,
    deadline: Instant,
    wanted: impl Fn(&BlockNode) -> bool,
) {
    match volume_paths(root, record, deadline) {
        Ok(paths) => {
            for (path, _) in paths.iter().filter(|(p, running)| *running && wanted(p)) {
                join(record, path, deadline);
            }
        }
        Err(e) => log::note(
            Level::Warn,
            &format!("fencing: volume {}: {e}", record.volume_id),
        ),
    }
}

/// The WWID the LUN at `hctl` reports (VPD page 0x83, as sysfs has it).
fn disk_wwid(root: &Root, hctl: Hctl) -> Option<Wwid> {
    lunkit::scsi::sysfs::device(root, hctl)
        .ok()
        .flatten()?
        .wwid?
        .parse()
        .ok()
}

/// Registers this node's key on `path` of the fenced volume of `record`, as [`verdict`]
/// says, and remembers the outcome for the volume's condition.
fn join(record: &Record, path: &BlockNode, deadline: Instant) {
    let id = record.volume_id.as_str();
    let slot = (id.to_owned(), path.name.clone());
    match try_join(record, path, deadline) {
        Ok(()) => {
            unregistered().remove(&slot);
        }
        Err(why) => {
            log::note(
                Level::Warn,
                &format!("fencing: volume {id}: {path} is not registered: {why}"),
            );
            unregistered().insert(slot, why);
        }
    }
}

fn try_join(record: &Record, path: &BlockNode, deadline: Instant) -> Result<(), String> {
    let Some(fence) = record.target.fence() else {
        return Ok(());
    };
    let ours = fence.key().map_err(|e| e.to_string())?;
    let holder = || {
        pr::read_reservation(path, deadline)
            .map(|r| r.holder.map(|h| h.key))
            .map_err(|e| format!("reading its reservation: {e}"))
    };
    if let Verdict::Leave(why) = verdict(fence.kind(), ours, holder()?) {
        return Err(why);
    }
    pr::register_ignore(path, ours, deadline).map_err(|e| format!("registering: {e}"))?;
    // Another node may have preempted between the look and the registration: its
    // preemption removed the key everywhere but here, where it must go too.
    if let Verdict::Leave(why) = verdict(fence.kind(), ours, holder()?) {
        let undone = pr::unregister(path, ours, deadline).map_or_else(
            |e| format!("; unregistering it again failed: {e}"),
            |()| String::new(),
        );
        return Err(format!("{why} (found right after registering it){undone}"));
    }
    log::note(
        Level::Info,
        &format!(
            "fencing: volume {}: {path} joined: key {ours} registered",
            record.volume_id
        ),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_joining_path_is_registered_only_while_this_node_holds_a_single_node_volume() {
        let (ours, theirs) = (Key(0x11), Key(0x22));
        let wero = ReservationType::WriteExclusiveRegistrantsOnly;
        assert_eq!(verdict(wero, ours, Some(ours)), Verdict::Register);
        let Verdict::Leave(why) = verdict(wero, ours, Some(theirs)) else {
            panic!("another node's key holds it");
        };
        assert!(
            why.contains(&theirs.to_string()) && why.contains("fenced"),
            "{why}"
        );
        assert!(matches!(verdict(wero, ours, None), Verdict::Leave(_)));
        // All registrants: every node registers, whoever the reservation names.
        let wear = ReservationType::WriteExclusiveAllRegistrants;
        assert_eq!(verdict(wear, ours, Some(theirs)), Verdict::Register);
        assert_eq!(verdict(wear, ours, None), Verdict::Register);
    }

    #[test]
    fn a_disk_is_new_only_on_a_whole_disks_add() {
        let scsi = "/devices/platform/host7/session3/target7:0:0/7:0:0:1/block/sdc";
        let ev = |action: &str, devpath: &str, devtype: &str| {
            let name = devpath.rsplit('/').next().unwrap();
            let text = format!(
                "{action}@{devpath}\0ACTION={action}\0DEVPATH={devpath}\0\
                 SUBSYSTEM=block\0DEVNAME={name}\0DEVTYPE={devtype}\0SEQNUM=7\0"
            );
            Uevent::parse(text.as_bytes()).unwrap()
        };
        let hctl: Hctl = "7:0:0:1".parse().unwrap();
        assert_eq!(
            new_disk(&ev("add", scsi, "disk")),
            Some(("sdc".into(), hctl))
        );
        assert_eq!(new_disk(&ev("remove", scsi, "disk")), None);
        assert_eq!(
            new_disk(&ev("add", &format!("{scsi}/sdc1"), "partition")),
            None
        );
        assert_eq!(
            new_disk(&ev("add", "/devices/virtual/block/dm-3", "disk")),
            None
        );
    }
}

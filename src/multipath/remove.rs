//! Taking a multipath map down: multipath-tools' `_dm_flush_map`, through multipathd when it
//! runs, with the checks that keep data safe.

use std::time::{Duration, Instant};

use crate::block::{self, UsageScope};
use crate::dm::{Control, DevId, Removed};
use crate::error::{Error, Result};
use crate::id::DevNum;
use crate::id::Wwid;
use crate::root::Root;
use crate::uevent::{Action, Subscription};

use super::find::{Map, PartitionMap, find, partition_maps};
use super::multipathd::Multipathd;
use super::table::Status;

/// How [`remove`] behaves. The default: 30 s, not deferred, not forced, multipathd asked
/// when it runs.
///
/// ```
/// let mut opts = lunkit::multipath::RemoveOptions::default();
/// opts.timeout = std::time::Duration::from_secs(10);
/// opts.deferred = true;
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RemoveOptions {
    /// How long the removal may take, counted from the call. The map is left as it was found
    /// (queueing restored) on failure.
    pub timeout: Duration,
    /// Mark an open map for removal on last close instead of refusing.
    pub deferred: bool,
    /// Remove even when no path is active and the map queues I/O: queued I/O is failed.
    pub force: bool,
    /// Ask multipathd when it runs (the default), so it does not re-create the map.
    pub use_multipathd: bool,
}

impl Default for RemoveOptions {
    fn default() -> Self {
        RemoveOptions {
            timeout: DEFAULT_REMOVE_TIMEOUT,
            deferred: false,
            force: false,
            use_multipathd: true,
        }
    }
}

/// Default time a [`remove`] may take.
pub const DEFAULT_REMOVE_TIMEOUT: Duration = Duration::from_secs(30);

/// What [`remove`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoveReport {
    /// The map name.
    pub map: String,
    /// Its kernel name (`dm-N`).
    pub kernel_name: String,
    /// Removed now, or marked for removal on last close.
    pub outcome: Removed,
    /// multipathd did it.
    pub via_multipathd: bool,
    /// Why multipathd, though it runs and was to be asked, did not do it, and the removal
    /// was done through device-mapper instead: it did not answer in time, its socket's
    /// listener is not root, or it answered something other than `ok`.
    pub multipathd_skipped: Option<String>,
    /// Maps found suspended and resumed first (a removal killed between its suspend and its
    /// remove leaves the map so).
    pub resumed: Vec<String>,
    /// Partition maps removed first.
    pub partitions_removed: Vec<String>,
}

/// Takes the multipath map `spec` (see [`find`]) off the node: `multipath -f` without the
/// tool, with a deadline.
///
/// 1. It must be a multipath map (uuid `mpath-`, one `multipath` target).
/// 2. The map and its partition maps, if found suspended, are resumed
///    ([`RemoveReport::resumed`]). No active path while `queue_if_no_path` is set: refused with
///    [`Error::Busy`] unless `force` (then `fail_if_no_path` fails the queued I/O first).
/// 3. Open beyond its own partition maps, or a partition map open: [`Error::Busy`] naming the
///    open count and who uses it (unless `deferred`). A map held by nothing but processes is
///    given [`block::OPENER_GRACE`] first: udev probes a map after every reload.
/// 4. multipathd running (as root): `del map NAME`, given half the time left; otherwise, or if
///    it fails or does not answer in time ([`RemoveReport::multipathd_skipped`]):
///    `fail_if_no_path` if the table queues, remove partition maps, suspend with flush (on a
///    helper thread bounded by the deadline; a map found suspended by another process, as
///    multipathd's reload leaves it for a moment, is waited for and suspended again),
///    remove, retrying `EBUSY` with backoff until the deadline (resuming between tries), and
///    on failure restore `queue_if_no_path`.
/// 5. After an immediate removal, wait for the `remove` uevent of `dm-N` (or its sysfs
///    directory to vanish).
pub fn remove(root: &Root, spec: &str, opts: &RemoveOptions) -> Result<RemoveReport> {
    let deadline = crate::wait::deadline_after(opts.timeout);
    // A malformed name is the caller's mistake (Invalid), whatever the node has.
    if !spec.starts_with('/') && spec.parse::<Wwid>().is_err() {
        crate::dm::buffer::check_name(spec)?;
    }
    let ctl = Control::open(root)?;
    // Subscribe before acting, so the remove uevent cannot slip past.
    let mut monitor = Subscription::open().ok();
    let map = find(&ctl, root, spec)?;
    // The removal wait watches this object, not `M:m`: device-mapper hands the freed minor
    // to the next map created (multipathd building another volume's map), at once.
    let sys_object = crate::block::sysfs::object_of_number(root, map.info.dev);
    let name = map.info.name.clone();
    let queues = map.table.queue_if_no_path();
    let parts = partition_maps(&ctl, &map)?;
    let report_resumed = resume_suspended(&ctl, &map, &parts)?;
    let queue_disabled = fail_queue_if_pathless(&ctl, &map, queues, opts.force)?;
    if !opts.deferred {
        wait_released(&ctl, root, &map, &parts, queue_disabled, deadline)?;
    }

    let kernel_name = map.info.kernel_name();
    let mut report = RemoveReport {
        map: name.clone(),
        kernel_name: kernel_name.clone(),
        outcome: Removed::Now,
        via_multipathd: false,
        multipathd_skipped: None,
        resumed: report_resumed,
        partitions_removed: Vec::new(),
    };

    let mut done = false;
    if opts.use_multipathd && !opts.deferred {
        // multipathd's flush cannot defer; a deferred removal is done here.
        match ask_multipathd(root, &name, deadline) {
            Ok(true) => {
                report.via_multipathd = true;
                report.partitions_removed = parts.iter().map(|p| p.name.clone()).collect();
                done = true;
            }
            Ok(false) => {}
            // Not running, not answering in time, not root, or answering "fail": do it here,
            // which reports precisely why it cannot be done, if it cannot. A multipathd that
            // timed out may still be at it; the sequence below takes a map that vanishes
            // under it as removed.
            Err(why) => report.multipathd_skipped = Some(why),
        }
    }
    if !done {
        let (outcome, removed_parts) =
            flush_and_remove(&ctl, &map, &parts, opts, deadline, queue_disabled)?;
        report.outcome = outcome;
        report.partitions_removed = removed_parts;
    }

    if report.outcome == Removed::Now {
        wait_gone(
            root,
            monitor.as_mut(),
            map.info.dev,
            sys_object,
            &kernel_name,
            deadline,
        )?;
    }
    Ok(report)
}

/// Asks multipathd to `del map NAME`: `Ok(true)` when it answered `ok`, `Ok(false)` when no
/// multipathd runs, `Err(why)` when it runs but did not do it.
///
/// It gets half of the time left, so that the device-mapper sequence keeps the other half
/// when multipathd hangs.
fn ask_multipathd(root: &Root, name: &str, deadline: Instant) -> std::result::Result<bool, String> {
    let now = Instant::now();
    let theirs = now + deadline.saturating_duration_since(now) / 2;
    let mut d = match Multipathd::connect(root, theirs) {
        Ok(Some(d)) => d,
        Ok(None) => return Ok(false),
        Err(e) => return Err(e.to_string()),
    };
    match d.command(&format!("del map {name}"), theirs) {
        Ok(reply) if reply.trim_end() == "ok" => Ok(true),
        Ok(reply) => Err(format!(
            "multipathd answered {:?} to \"del map {name}\"",
            reply.trim_end()
        )),
        Err(e) => Err(format!("multipathd: {e}")),
    }
}

/// Resumes the map and its partition maps where they were left suspended (a removal killed
/// between its suspend and its remove), and names them. A suspended map holds every I/O,
/// udev's probes' and the flush's, and cannot be suspended again: the sequence starts from a
/// map that serves I/O.
fn resume_suspended(ctl: &Control, map: &Map, parts: &[PartitionMap]) -> Result<Vec<String>> {
    let mut resumed = Vec::new();
    let devs = std::iter::once(map.info.dev).chain(parts.iter().map(|p| p.dev));
    for dev in devs {
        match ctl.resume_if_suspended(&DevId::Dev(dev)) {
            Ok(Some(i)) => resumed.push(i.name),
            Ok(None) => {}
            Err(e) if e.is_gone() => {}
            Err(e) => return Err(e),
        }
    }
    Ok(resumed)
}

/// For a map that queues (`queues`) with no active path: queued and dirty data cannot reach
/// the storage, which is [`Error::Busy`] unless `force`; forced, the queued I/O is failed now
/// (`fail_if_no_path`), so that writers stuck on it (a close that syncs) let go of the map
/// before the busy check. Returns whether queueing was disabled.
fn fail_queue_if_pathless(ctl: &Control, map: &Map, queues: bool, force: bool) -> Result<bool> {
    let name = &map.info.name;
    let by_name = DevId::Name(name);
    let status = ctl.status(&by_name)?;
    let status = match status.as_slice() {
        [t] if t.target_type == "multipath" => Status::parse(&t.params)?,
        _ => {
            return Err(Error::invalid(
                "multipath map",
                name,
                "its status is not one multipath target",
            ));
        }
    };
    if !queues || status.active_paths() != 0 {
        return Ok(false);
    }
    if !force {
        return Err(Error::Busy {
            device: map.label(),
            reason: "no path is active and queue_if_no_path is set: queued and dirty data \
                     cannot reach the storage; refusing (force fails that I/O)"
                .into(),
            usage: None,
        });
    }
    ctl.message(&by_name, 0, "fail_if_no_path")?;
    Ok(true)
}

/// Waits for the map to be released: failed I/O gets until the deadline to unwind; otherwise
/// only a map held by nothing but processes is waited for, briefly (udev probes a map after
/// every reload). Still held is [`Error::Busy`], with queueing restored.
fn wait_released(
    ctl: &Control,
    root: &Root,
    map: &Map,
    parts: &[PartitionMap],
    queue_disabled: bool,
    deadline: Instant,
) -> Result<()> {
    let until = if queue_disabled {
        deadline
    } else {
        crate::wait::deadline_after(block::OPENER_GRACE).min(deadline)
    };
    let mut last = None;
    let settled =
        crate::wait::until_polled(until, &|| format!("{} to be released", map.label()), || {
            last = busy_reason(ctl, root, map, parts, deadline)?;
            Ok(match &last {
                Some(b) if queue_disabled || b.transient => None,
                _ => Some(()),
            })
        });
    match settled {
        Ok(()) | Err(Error::Timeout { .. }) => {}
        Err(e) => return Err(e),
    }
    if let Some(Busy { reason, .. }) = last {
        restore_queueing(ctl, &DevId::Name(&map.info.name), queue_disabled);
        return Err(Error::Busy {
            device: map.label(),
            reason,
            usage: None,
        });
    }
    Ok(())
}

/// Waits until the map's kernel object is gone: its remove uevent, or sysfs showing another
/// object (or none) at its number. The object, not `M:m`, is watched: device-mapper hands the
/// freed minor to the next map created at once.
fn wait_gone(
    root: &Root,
    monitor: Option<&mut Subscription>,
    dev: DevNum,
    sys_object: Option<crate::sysfs::ObjectId>,
    kernel_name: &str,
    deadline: Instant,
) -> Result<()> {
    crate::wait::until(
        monitor,
        deadline,
        &|| format!("removal of {kernel_name}"),
        &|ev| ev.action == Action::Remove && ev.devname.as_deref() == Some(kernel_name),
        || {
            let now = crate::block::sysfs::object_of_number(root, dev);
            let gone = match sys_object {
                Some(id) => now != Some(id),
                None => now.is_none(),
            };
            Ok(gone.then_some(()))
        },
    )
}

/// The local `_dm_flush_map` sequence (steps 4 and on of [`remove`]).
fn flush_and_remove(
    ctl: &Control,
    map: &Map,
    parts: &[PartitionMap],
    opts: &RemoveOptions,
    deadline: Instant,
    mut queue_disabled: bool,
) -> Result<(Removed, Vec<String>)> {
    let name = map.name();
    let by_name = DevId::Name(name);
    // A suspended map answers messages with EBUSY; then leave queueing alone and do not
    // suspend (as multipath-tools does when the message fails). A deferred removal never
    // suspends: the map stays in use until its last close, and a map left suspended would
    // block every opener (udev's probe after the holder closes, the holder's own writeback),
    // so that last close would never come. multipath-tools' deferred path does not suspend
    // either.
    let mut may_suspend = !opts.deferred;
    if map.table.queue_if_no_path() && !queue_disabled {
        match ctl.message(&by_name, 0, "fail_if_no_path") {
            Ok(_) => queue_disabled = true,
            Err(e) if e.is_gone() => return Ok((Removed::Now, Vec::new())),
            Err(_) => may_suspend = false,
        }
    }
    let fail = |e: Error| {
        restore_queueing(ctl, &by_name, queue_disabled);
        e
    };

    let removed = remove_partition_maps(ctl, map, parts, opts.deferred, deadline).map_err(fail)?;

    let removing_since = Instant::now();
    let mut backoff =
        crate::wait::Backoff::new(Duration::from_millis(50), Duration::from_millis(500));
    loop {
        let why = match try_remove(ctl, map, opts.deferred, may_suspend, deadline) {
            Ok(Attempt::Done(Removed::Deferred)) => {
                // Still serving its holder until the last close: give it back the I/O policy
                // it had.
                restore_queueing(ctl, &by_name, queue_disabled);
                return Ok((Removed::Deferred, removed));
            }
            Ok(Attempt::Done(outcome)) => return Ok((outcome, removed)),
            Ok(Attempt::Again(why)) => why,
            Err(e) => return Err(fail(e)),
        };
        if Instant::now() >= deadline {
            return Err(fail(Error::Timeout {
                what: format!("removal of {} ({why})", map.label()),
                waited: removing_since.elapsed(),
            }));
        }
        backoff.sleep(deadline);
    }
}

/// What one try of [`try_remove`] came to.
enum Attempt {
    /// Removed (or found gone: [`Removed::Now`]).
    Done(Removed),
    /// Not yet, and why, for the timeout's message.
    Again(String),
}

/// One try at the removal: the flushing suspend (unless `may_suspend` is false), then
/// `DM_DEV_REMOVE`. The map found suspended by another caller (multipathd's reload, without a
/// flush) is not removed this time: that caller resumes it, and the next try suspends it with
/// the flush. A map still open (`EBUSY`) is resumed for the wait, so that its openers' I/O
/// goes on meanwhile.
fn try_remove(
    ctl: &Control,
    map: &Map,
    deferred: bool,
    may_suspend: bool,
    deadline: Instant,
) -> Result<Attempt> {
    let by_name = DevId::Name(map.name());
    let gone = |e: &Error| e.is_gone();
    if may_suspend {
        match super::suspend::flushing(ctl, map.name(), map.info.dev, deadline) {
            Ok(true) => {}
            Ok(false) => return Ok(Attempt::Again("suspended by another process".into())),
            Err(e) if gone(&e) => return Ok(Attempt::Done(Removed::Now)),
            Err(e) => return Err(e),
        }
    }
    match super::suspend::remove(ctl, map.name(), map.info.dev, deferred, deadline) {
        Ok(outcome) => Ok(Attempt::Done(outcome)),
        Err(e) if gone(&e) => Ok(Attempt::Done(Removed::Now)),
        Err(e) if e.errno() == Some(libc::EBUSY) => {
            if may_suspend {
                match ctl.resume_if_suspended(&by_name) {
                    Ok(_) => {}
                    Err(e) if gone(&e) => return Ok(Attempt::Done(Removed::Now)),
                    Err(e) => return Err(e),
                }
            }
            match ctl.info(&by_name) {
                Ok(i) => Ok(Attempt::Again(format!(
                    "still open, open count {}",
                    i.open_count
                ))),
                Err(e) if gone(&e) => Ok(Attempt::Done(Removed::Now)),
                Err(_) => Ok(Attempt::Again("still open".into())),
            }
        }
        Err(e) => Err(e),
    }
}

/// Removes the map's partition maps (deferred with `deferred`), and names those removed. One
/// still open is [`Error::Busy`].
fn remove_partition_maps(
    ctl: &Control,
    map: &Map,
    parts: &[PartitionMap],
    deferred: bool,
    deadline: Instant,
) -> Result<Vec<String>> {
    let mut removed = Vec::new();
    for p in parts {
        match super::suspend::remove(ctl, &p.name, p.dev, deferred, deadline) {
            Ok(_) => removed.push(p.name.clone()),
            Err(e) if e.is_gone() => {}
            Err(e) if e.errno() == Some(libc::EBUSY) => {
                return Err(Error::Busy {
                    device: format!("{} ({})", map.label(), p.name),
                    reason: "its partition map is open".into(),
                    usage: None,
                });
            }
            Err(e) => return Err(e),
        }
    }
    Ok(removed)
}

/// Re-enables queueing if this call disabled it (best effort: the map may be gone).
fn restore_queueing(ctl: &Control, id: &DevId<'_>, disabled: bool) {
    if disabled {
        let _ = ctl.message(id, 0, "queue_if_no_path");
    }
}

/// Why a map cannot be removed now.
struct Busy {
    reason: String,
    /// Only processes hold it, or nothing is to be seen any more: it may pass on its own.
    transient: bool,
}

/// Why the map cannot be removed now, or `None`: it is open beyond its partition maps, or a
/// partition map is open (multipath-tools' `mpath_in_use`).
fn busy_reason(
    ctl: &Control,
    root: &Root,
    map: &Map,
    parts: &[PartitionMap],
    deadline: Instant,
) -> Result<Option<Busy>> {
    let info = ctl.info(&DevId::Name(map.name()))?;
    let mut open_parts = Vec::new();
    for p in parts {
        match ctl.info(&DevId::Name(&p.name)) {
            Ok(i) if i.open_count > 0 => open_parts.push(format!(
                "partition map {} open {} time(s)",
                p.name, i.open_count
            )),
            Ok(_) => {}
            Err(e) if e.is_gone() => {}
            Err(e) => return Err(e),
        }
    }
    let own = i64::from(info.open_count) - parts.len() as i64;
    if own <= 0 && open_parts.is_empty() {
        return Ok(None);
    }
    let users = users(root, info.dev, parts, deadline);
    let mut reason = format!(
        "open count {} ({} partition map(s))",
        info.open_count,
        parts.len(),
    );
    if let Some(u) = users.as_ref().filter(|u| !u.is_empty()) {
        reason.push_str(&format!(": {u}"));
    }
    for p in open_parts {
        reason.push_str("; ");
        reason.push_str(&p);
    }
    Ok(Some(Busy {
        reason,
        transient: users.is_none_or(|u| u.is_empty() || u.only_openers()),
    }))
}

/// Who uses a map (mounts, holders, swap, openers), as [`block::usage`] finds it for the map
/// and its partition maps in one walk: what a person needs to act on a refusal. The partition
/// maps are its own, not users by themselves. `None` when the map is gone or cannot be looked
/// at.
fn users(
    root: &Root,
    dev: DevNum,
    parts: &[PartitionMap],
    deadline: Instant,
) -> Option<block::Usage> {
    let node = block::by_number(root, dev).ok()??;
    let own: Vec<String> = parts
        .iter()
        .filter_map(|p| block::by_number(root, p.dev).ok().flatten())
        .map(|n| n.name)
        .collect();
    let scope = UsageScope {
        own: &own,
        ignore_openers: &[],
    };
    block::usage(root, &[node], &scope, deadline).ok()
}

//! Taking one SCSI device out: the in-use check, the flush and the `delete` write, and the
//! identity a path must still have for its delete to go ahead.

use std::time::{Duration, Instant};

use super::sysfs;
use crate::block::{self, UsageScope};
use crate::error::{Error, Result};
use crate::helper::{self, Subject};
use crate::id::{Hctl, Wwid};
use crate::root::Root;
use crate::uevent::{Action, Subscription, Uevent};
use crate::wait;

/// Command names whose open file descriptors on a device do not make it busy. multipathd
/// keeps every path open for its checkers and closes it when the path's `remove` event comes.
/// udev's workers open each new or changed disk read-only to probe it (blkid, scsi_id) and
/// close it when done; under load that takes seconds, and deleting the disk under them only
/// fails their reads. `kpartx` is one of udev's probes too: multipath-tools' `kpartx.rules`
/// runs it on every change of a map, and it opens the map read-only for its partition table
/// (with the target down it sits in that read as blkid does). So are `multipath` and
/// `scsi_id`, which open each new or changed disk for a moment: multipath-tools'
/// `60-multipath.rules` runs `multipath -u` to ask whether multipathd should claim the disk
/// (a detach run just after an attach found it on a path), and systemd's
/// `60-persistent-storage.rules` runs `scsi_id` for the disk's serial where no other rule
/// set it (a node without sg3-utils' rules). Only one a udev worker started counts (see
/// [`crate::block::UsageScope::ignore_openers`]): any of them run from a shell is a user.
pub const PATH_MANAGERS: &[&str] = &[
    "multipathd",
    "(udev-worker)",
    "systemd-udevd",
    "udevd",
    "kpartx",
    "multipath",
    "scsi_id",
];

/// How [`delete`] behaves. The default: 30 s, not forced.
///
/// ```
/// let mut opts = lunkit::scsi::DeleteOptions::default();
/// opts.timeout = std::time::Duration::from_secs(10);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeleteOptions {
    /// How long the check, the flush and the removal may take, counted from the call.
    pub timeout: Duration,
    /// Delete even when the device is in use or its flush fails. In-flight and later I/O to
    /// it fails; a mounted filesystem on it is shut down by the kernel.
    pub force: bool,
}

impl Default for DeleteOptions {
    fn default() -> Self {
        DeleteOptions {
            timeout: DEFAULT_DELETE_TIMEOUT,
            force: false,
        }
    }
}

/// Default time a [`delete`] may take.
pub const DEFAULT_DELETE_TIMEOUT: Duration = Duration::from_secs(30);

/// What [`delete`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deleted {
    /// The device was deleted by this call.
    Now,
    /// There was no device at that address (already deleted, or never there).
    AlreadyGone,
}

/// Takes the SCSI device at `hctl` off the node: refuses when it is in use (mounted, held by
/// a multipath map or anything else, swap, open), flushes its disk ([`block::flush`]), writes
/// `delete`, and waits until the scsi_device and its disk are gone from sysfs.
///
/// A device that is not there is success ([`Deleted::AlreadyGone`]), so a retry after a
/// partial cleanup completes it. The kernel itself checks nothing before deleting (a path
/// under a live multipath map fails, and if it was the last one with `queue_if_no_path` I/O
/// hangs), which is why the check is here: take the map down first.
pub fn delete(root: &Root, hctl: Hctl, opts: &DeleteOptions) -> Result<Deleted> {
    let deadline = wait::deadline_after(opts.timeout);
    if !sysfs::device_dir(root, hctl).exists() {
        return Ok(Deleted::AlreadyGone);
    }
    // Before the checks: the delete goes ahead only if the device it writes to is the one
    // they were about.
    let expect = PathIdentity::of(root, hctl);
    let node = block::of_scsi_device(root, hctl)?;
    // Held from the check to the delete: nothing can mount the disk or stack on it between.
    let mut _claim = None;
    if let Some(node) = &node {
        if !opts.force {
            let scope = UsageScope {
                own: &[],
                ignore_openers: PATH_MANAGERS,
            };
            let usage = block::usage(root, std::slice::from_ref(node), &scope, deadline)?;
            match usage.refusal(&format!("{node} ({hctl})")) {
                Some(Error::Busy {
                    device,
                    usage: found,
                    ..
                }) => {
                    return Err(Error::Busy {
                        device,
                        reason: busy_reason(root, &usage),
                        usage: found,
                    });
                }
                Some(e) => return Err(e),
                None => {}
            }
            _claim = claim_for_delete(node, deadline)?;
        }
        match block::flush(node, deadline) {
            Ok(()) => {}
            Err(_) if opts.force => {}
            Err(e) => return Err(e),
        }
    }
    remove_device(root, hctl, &expect, deadline)
}

/// Claims a disk about to be deleted ([`block::try_claim`]): `EBUSY` (something took it
/// since the in-use check) refuses the delete.
fn claim_for_delete(node: &block::BlockNode, deadline: Instant) -> Result<Option<block::Claim>> {
    block::try_claim(node, deadline).map_err(|_| Error::Busy {
        device: node.to_string(),
        reason: "something claimed it exclusively (a mount, a device stacked on it) after \
                 the in-use check found it free"
            .into(),
        usage: None,
    })
}

/// The usage message, pointing at the map when a multipath map holds the path.
pub(super) fn busy_reason(root: &Root, usage: &block::Usage) -> String {
    let mut reason = usage.to_string();
    for h in &usage.holders {
        if crate::block::sysfs::dm_uuid(root, h)
            .is_some_and(|u| crate::multipath::uuid_wwid(&u).is_some())
        {
            let name = crate::block::sysfs::dm_name(root, h).unwrap_or_else(|| h.clone());
            reason.push_str(&format!(
                "; it is a path of multipath map {name} ({h}): take the map down first, or \
                 detach the whole volume"
            ));
        }
    }
    reason
}

/// Which device a path was when it was checked: what its delete must still find at its
/// address to go ahead.
///
/// A LUN deleted and scanned again at the same H:C:T:L (re-mapped on the target meanwhile)
/// often gets the same disk name and device number back, and may be another volume. Its
/// sysfs objects are new ([`crate::sysfs::ObjectId`]), and its WWID tells the volumes apart.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PathIdentity {
    /// The scsi_device's sysfs directory (`…/target7:0:0/7:0:0:1`).
    pub device: Option<crate::sysfs::ObjectId>,
    /// Its disk's sysfs directory (`…/7:0:0:1/block/sdc`); `None` when it had no disk.
    pub disk: Option<crate::sysfs::ObjectId>,
    /// The WWID it reported; `None` when none could be read.
    pub wwid: Option<Wwid>,
}

impl PathIdentity {
    /// What the device at `hctl` is now.
    pub fn of(root: &Root, hctl: Hctl) -> PathIdentity {
        let disk = sysfs::disk(root, hctl).ok().flatten();
        PathIdentity::with(root, hctl, disk.as_deref(), sysfs::wwid(root, hctl))
    }

    /// The identity of the device at `hctl`, whose disk (`block/` entry) and WWID the caller
    /// has just read: only the sysfs objects are looked at.
    pub(crate) fn with(
        root: &Root,
        hctl: Hctl,
        disk: Option<&str>,
        wwid: Option<Wwid>,
    ) -> PathIdentity {
        let dir = sysfs::device_dir(root, hctl);
        PathIdentity {
            device: crate::sysfs::object_id(&dir),
            disk: disk.and_then(|name| crate::sysfs::object_id(&dir.join("block").join(name))),
            wwid,
        }
    }

    /// Why `now` is not the device `self` recorded; `None` when it still is. A disk that went
    /// away while its scsi_device stayed is the same device (`sd` was unbound); a disk that
    /// came or changed is not.
    fn differs(&self, now: &PathIdentity) -> Option<String> {
        if self.device.is_some() && now.device != self.device {
            return Some("its scsi_device was removed and another created at the address".into());
        }
        if now.disk.is_some() && now.disk != self.disk {
            return Some("it has another disk than the one that was checked".into());
        }
        if now.wwid != self.wwid {
            let show = |w: &Option<Wwid>| w.as_ref().map_or("none".to_owned(), Wwid::to_string);
            return Some(format!(
                "its WWID is {} now, was {}",
                show(&now.wwid),
                show(&self.wwid)
            ));
        }
        None
    }
}

/// Writes `delete` for the device at `hctl`, if it is still the device `expect` recorded, and
/// waits until that scsi_device and its disk are gone. No in-use checks and no flush: the
/// caller has done them, on the device `expect` describes.
///
/// [`Error::Replaced`] when the device at `hctl` is not that one any more: the caller's checks
/// were about another device, so nothing is written.
pub(crate) fn remove_device(
    root: &Root,
    hctl: Hctl,
    expect: &PathIdentity,
    deadline: Instant,
) -> Result<Deleted> {
    let dir = crate::sysfs::Confine::new(root)
        .dir(&sysfs::device_dir(root, hctl))
        .ok_or_else(|| Error::NotFound {
            what: format!(
                "SCSI device {hctl} not found below {}",
                root.path().display()
            ),
        })?;
    // Open first, check second, write third: the write then reaches the object that was
    // checked, or fails with ENODEV if it was removed after the check (crate::sysfs::AttrWriter).
    let writer = match crate::sysfs::AttrWriter::open(&dir.join("delete")) {
        Ok(w) => w,
        // Gone since the caller looked.
        Err(e) if e.is_gone() && !dir.exists() => {
            return Ok(Deleted::AlreadyGone);
        }
        Err(e) => return Err(e),
    };
    let now = PathIdentity::of(root, hctl);
    if now.device.is_none() {
        return Ok(Deleted::AlreadyGone);
    }
    if let Some(why) = expect.differs(&now) {
        return Err(Error::Replaced {
            device: format!("SCSI device {hctl}"),
            reason: why,
        });
    }
    // Subscribe before acting, so the remove events cannot slip past.
    let mut monitor = Subscription::open().ok();
    let what = || {
        format!(
            "write to {} (the device is not answering)",
            dir.join("delete").display()
        )
    };
    let subject = Subject::write(&dir.join("delete"), "1");
    match helper::bounded(subject, deadline, &what, move || writer.write("1")) {
        Ok(()) => {}
        // ENODEV: removed after the check, by someone else's delete (under way or done);
        // wait for it like for ours. A device created since is another object.
        Err(e) if e.errno() == Some(libc::ENODEV) => {}
        Err(e) => return Err(e),
    }
    // Wait for this object to go, not for the name: a scan can put a new device at the same
    // address, with the same disk name, before this looks. Its disk lies below it and goes
    // first (`sd` is unbound in the scsi_device's removal).
    let what = || format!("removal of SCSI device {hctl}");
    // This device's own removals, not every device's: many detaches run at once.
    let name = hctl.to_string();
    let relevant = |ev: &Uevent| ev.action == Action::Remove && ev.is_at_or_below(&name);
    wait::until(monitor.as_mut(), deadline, &what, &relevant, || {
        Ok((crate::sysfs::object_id(&dir) != now.device).then_some(()))
    })?;
    Ok(Deleted::Now)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(device: u64, disk: Option<u64>, wwid: Option<&str>) -> PathIdentity {
        let obj = |ino| crate::sysfs::ObjectId { dev: 22, ino };
        PathIdentity {
            device: Some(obj(device)),
            disk: disk.map(obj),
            wwid: wwid.map(|w| w.parse().unwrap()),
        }
    }

    const A: &str = "naa.60014055e7a100000010000000000000";
    const B: &str = "naa.60014055e7a100000020000000000000";

    #[test]
    fn the_same_objects_and_wwid_are_the_same_device() {
        assert_eq!(
            id(1, Some(2), Some(A)).differs(&id(1, Some(2), Some(A))),
            None
        );
        // `sd` unbound since the check: its disk went, the device stayed.
        assert_eq!(id(1, Some(2), Some(A)).differs(&id(1, None, Some(A))), None);
    }

    #[test]
    fn a_new_object_at_the_address_is_another_device() {
        let why = id(1, Some(2), Some(A)).differs(&id(3, Some(2), Some(A)));
        assert!(why.unwrap().contains("another created"));
        let why = id(1, Some(2), Some(A)).differs(&id(1, Some(4), Some(A)));
        assert!(why.unwrap().contains("another disk"));
        // A disk that came since a check that saw none was not checked.
        let why = id(1, None, Some(A)).differs(&id(1, Some(4), Some(A)));
        assert!(why.unwrap().contains("another disk"));
    }

    #[test]
    fn a_changed_wwid_is_another_volume() {
        let why = id(1, Some(2), Some(A))
            .differs(&id(1, Some(2), Some(B)))
            .unwrap();
        assert!(why.contains(B) && why.contains(A), "{why}");
        let why = id(1, Some(2), None)
            .differs(&id(1, Some(2), Some(B)))
            .unwrap();
        assert!(why.contains("was none"), "{why}");
    }
}

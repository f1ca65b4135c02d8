//! Bringing one SCSI device in: the scan or rescan write on a helper thread, whose device was
//! there before it, and the first open of its disk.

use std::path::{Path, PathBuf};
use std::time::Instant;

use rustix::fs::{Mode, OFlags};

use super::delete::{PATH_MANAGERS, busy_reason};
use super::sg_io;
use super::sysfs;
use super::vpd::{self, LuIdentity};
use super::{PathDevice, ScanTarget, Triggered, write_start};
use crate::block::{self, UsageScope};
use crate::error::{Error, ErrorKind, Result};
use crate::helper::{self, Subject};
use crate::id::{DevNum, Hctl, Wwid};
use crate::root::Root;
use crate::sysfs::{attr, attr_parse};

/// A scan (or rescan) write in flight on a helper thread ([`trigger_start`]), and what to
/// check once it returned.
pub(crate) struct TriggerPending {
    write: helper::Pending<()>,
    /// The attribute written, for a timeout's message.
    path: PathBuf,
    dev_dir: PathBuf,
    /// `Some` for a rescan of a present device: whose it was before.
    rescanned: Option<Present>,
    /// For the in-use check after a rescan.
    root: Root,
}

/// Starts the scan (or rescan) write for one target; [`TriggerPending::finish`] then says
/// whether the SCSI device now exists. The checks run here, the write on a helper thread, so
/// that one thread can have every path's write in flight at once.
///
/// A device already present may be a leftover path of another volume: the array re-mapped
/// its LUN number while its disk still sits in that volume's multipath map, under a mount,
/// in a pod (a bind mount of its node, kubelet's loop device) or open in some process, in
/// any mount namespace (os-brick's CVE-2023-2088). Whose it is comes from sysfs
/// ([`Present`]); when that is not the volume asked for, the same in-use check a detach
/// makes ([`block::usage`]) decides, and [`Error::Busy`] refuses a device in use, naming
/// its user:
/// - without a rescan, when it belongs to another volume than `expect`;
/// - without a rescan, when the LUN answers INQUIRY with another identity than the kernel
///   last read for it (`refuse_if_remapped`): the rescan would overwrite the kernel's copy,
///   the one record of what its users opened;
/// - after the rescan (in `finish`), when it now reports another WWID than the volume it
///   belonged to (where the INQUIRY could not tell).
///
/// Any of these refuses the whole volume, not only this path ([`super::scan`]): a LUN number
/// belongs to one identity on the node at a time.
///
/// A device nobody uses may be rescanned and handed out as what it reports now: its last
/// close dropped whatever the old LUN left in its page cache.
pub(crate) fn trigger_start(
    root: &Root,
    t: &ScanTarget,
    expect: Option<&Wwid>,
    deadline: Instant,
) -> Result<TriggerPending> {
    let h = t.hctl;
    // Class entries are symlinks: below a --root they must not lead the write out of it.
    let confine = crate::sysfs::Confine::new(root);
    let dev_dir = sysfs::device_dir(root, h);
    if dev_dir.exists() {
        let Some(dev_dir) = confine.dir(&dev_dir) else {
            return Err(Error::NotFound {
                what: format!("SCSI device {h} not found below {}", root.path().display()),
            });
        };
        let mut present = Present::read(root, h, &dev_dir)?;
        if let Some(expect) = expect.filter(|e| present.owner.as_ref() != Some(*e)) {
            present.refuse_if_used(
                root,
                &format!(
                    "it is a path of volume {} ({}), not of {expect}: a leftover of another \
                     volume, left as it is (not rescanned); detach that volume first",
                    show(&present.owner),
                    present.by
                ),
                deadline,
            )?;
        }
        if !present.checked {
            present.refuse_if_remapped(root, &dev_dir, deadline)?;
        }
        // Already present: `rescan` is synchronous and re-reads VPD pages and capacity.
        let path = dev_dir.join("rescan");
        return Ok(TriggerPending {
            write: write_start(&path, "1", deadline)?,
            path,
            dev_dir,
            rescanned: Some(present),
            root: root.clone(),
        });
    }
    let host_dir = confine
        .dir(&sysfs::host_dir(root, h.host))
        .filter(|d| d.is_dir())
        .ok_or_else(|| Error::NotFound {
            what: format!("SCSI host{} not found", h.host),
        })?;
    let path = host_dir.join("scan");
    Ok(TriggerPending {
        write: write_start(&path, &t.request, deadline)?,
        path,
        dev_dir,
        rescanned: None,
        root: root.clone(),
    })
}

impl TriggerPending {
    /// Waits for the write until `deadline`, then says whether the SCSI device exists now,
    /// and when the write returned.
    pub(crate) fn finish(self, deadline: Instant) -> Result<(Triggered, Instant)> {
        let path = &self.path;
        let what = || format!("write to {} (the device is not answering)", path.display());
        let ((), at) = self.write.wait_timed(deadline, &what)?;
        let Some(mut present) = self.rescanned else {
            // The scsi_device is added before the write returns, or never: nothing to wait
            // for.
            let found = if self.dev_dir.exists() {
                Triggered::Added
            } else {
                Triggered::NotReported
            };
            return Ok((found, at));
        };
        let now: Option<Wwid> = attr_parse(&self.dev_dir, "wwid");
        if now != present.owner && !present.checked {
            present.refuse_if_used(
                &self.root,
                &format!(
                    "it reports WWID {} since its rescan, but was a path of volume {} ({}): \
                     the LUN was re-mapped under a device still in use, and is not handed \
                     out as the new volume; detach the old one first",
                    show(&now),
                    show(&present.owner),
                    present.by
                ),
                deadline,
            )?;
        }
        Ok((Triggered::Present, at))
    }
}

/// The refusal of the whole volume `what` (`LUN 3 of iSCSI target …`) for the paths refused
/// as another volume's (`held`: each [`Error::Busy`] or [`Error::Unverified`], at least
/// one): one path's own error, or with several, each named under the volume; `Busy` when
/// any is.
pub(crate) fn whole_volume_refusal(what: &str, mut held: Vec<Error>) -> Error {
    let whole =
        |reason: String| format!("{reason}. No path of {what} is handed out while it is held");
    if held.len() == 1 {
        return match held.swap_remove(0) {
            Error::Busy {
                device,
                reason,
                usage,
            } => Error::Busy {
                device,
                reason: whole(reason),
                usage,
            },
            Error::Unverified {
                device,
                reason,
                usage,
            } => Error::Unverified {
                device,
                reason: whole(reason),
                usage,
            },
            other => other,
        };
    }
    let busy = held.iter().any(|e| e.kind() == ErrorKind::Busy);
    let usage = held.iter().find_map(|e| e.usage().cloned()).map(Box::new);
    let each: Vec<String> = held.iter().map(Error::to_string).collect();
    let (device, reason) = (what.to_owned(), whole(each.join("; ")));
    match busy {
        true => Error::Busy {
            device,
            reason,
            usage,
        },
        false => Error::Unverified {
            device,
            reason,
            usage,
        },
    }
}

/// A WWID for messages, `unknown` when there is none.
fn show(w: &Option<Wwid>) -> String {
    w.as_ref().map_or("unknown".to_owned(), Wwid::to_string)
}

/// Whether the LUN behind the SCSI device at `dev_dir` (its `device` directory), whose disk is
/// `disk`, is another one than the kernel last read: the identity the kernel keeps
/// (`vpd_pg83`) and the one the LUN answers INQUIRY with now, when they differ. `None` when
/// they agree, or when there is nothing to compare (no page in sysfs, no answer, no
/// designator of the LU): then only a rescan can tell. [`Error::Timeout`] when the device
/// did not answer by `deadline`.
pub(crate) fn remapped(
    dev_dir: &Path,
    disk: &block::BlockNode,
    deadline: Instant,
) -> Result<Option<(LuIdentity, LuIdentity)>> {
    let Some(known) = std::fs::read(dev_dir.join("vpd_pg83"))
        .ok()
        .and_then(|p| LuIdentity::parse(&p).ok())
        .filter(|id| !id.is_empty())
    else {
        return Ok(None);
    };
    let now = match sg_io::inquiry_vpd(disk, vpd::DEVICE_IDENTIFICATION, deadline) {
        Ok(Some(page)) => match LuIdentity::parse(&page) {
            Ok(id) if !id.is_empty() => id,
            _ => return Ok(None),
        },
        Ok(None) => return Ok(None),
        Err(e) if e.kind() == ErrorKind::Timeout => return Err(e),
        Err(_) => return Ok(None),
    };
    Ok((now != known).then_some((known, now)))
}

/// A SCSI device found present before its rescan, and whose it is.
struct Present {
    hctl: Hctl,
    /// Its disk, when `sd` has one for it.
    disk: Option<block::BlockNode>,
    /// The volume it is a path of: the WWID of the multipath map stacked on its disk (or on
    /// a partition of it) when there is one, else the WWID the device reported before
    /// anything was rescanned.
    owner: Option<Wwid>,
    /// Where `owner` comes from, for messages: `multipath map dm-0 is stacked on sdc`, `its
    /// own VPD`.
    by: String,
    /// The in-use check ran and found nothing (no need to run it twice).
    checked: bool,
}

impl Present {
    /// Reads whose the device at `dev_dir` (its `device` directory) is, from sysfs alone.
    fn read(root: &Root, hctl: Hctl, dev_dir: &Path) -> Result<Present> {
        let own: Option<Wwid> = attr_parse(dev_dir, "wwid");
        let mut present = Present {
            hctl,
            disk: None,
            owner: own,
            by: "by the WWID it reports".to_owned(),
            checked: false,
        };
        let Some(disk) = crate::sysfs::sub_entries(dev_dir, "block")?
            .into_iter()
            .next()
        else {
            return Ok(present);
        };
        crate::sysfs::check_component("block device name", &disk)?;
        let mut family = vec![disk.clone()];
        family.extend(crate::block::sysfs::partitions(root, &disk)?);
        'family: for name in &family {
            for h in crate::block::sysfs::holders(root, name)? {
                crate::sysfs::check_component("holder name", &h)?;
                let map_wwid: Option<Wwid> = crate::block::sysfs::dm_uuid(root, &h)
                    .and_then(|u| crate::multipath::uuid_wwid(&u).and_then(|w| w.parse().ok()));
                if map_wwid.is_some() {
                    present.owner = map_wwid;
                    present.by = format!("multipath map {h} is stacked on {name}");
                    break 'family;
                }
            }
        }
        present.disk = block::by_name(root, &disk)?;
        Ok(present)
    }

    /// Asks the LUN what it is now (INQUIRY for its Device Identification page, which leaves
    /// the kernel's copy alone) and, when that is not what the kernel last read
    /// (`vpd_pg83`), refuses as [`Self::refuse_if_used`] does: the device's users opened it
    /// as the LUN the kernel knew, and a rescan would overwrite the only record of that
    /// (sysfs `wwid`), so that the next attach would hand the device out as the new volume
    /// under them. Nothing to compare (no disk, no page in sysfs, no answer) is left to the
    /// check after the rescan.
    fn refuse_if_remapped(&mut self, root: &Root, dev_dir: &Path, deadline: Instant) -> Result<()> {
        let Some(disk) = &self.disk else {
            return Ok(());
        };
        let Some((known, now)) = remapped(dev_dir, disk, deadline)? else {
            return Ok(());
        };
        self.refuse_if_used(
            root,
            &format!(
                "it answers INQUIRY as {now}, but the kernel knows it as {known}, a path of \
                 volume {} ({}): the LUN was re-mapped under a device still in use, and is \
                 neither rescanned nor handed out as the new volume; detach the old one first",
                show(&self.owner),
                self.by
            ),
            deadline,
        )
    }

    /// [`Error::Busy`] (or [`Error::Unverified`]) when anything uses the device's disk, by
    /// the detach's check ([`block::usage`]; multipathd's and udev's own opens do not
    /// count), its message `why` followed by who uses it. Notes that the check found
    /// nothing.
    fn refuse_if_used(&mut self, root: &Root, why: &str, deadline: Instant) -> Result<()> {
        let Some(disk) = &self.disk else {
            self.checked = true;
            return Ok(());
        };
        let scope = UsageScope {
            own: &[],
            ignore_openers: PATH_MANAGERS,
        };
        let usage = block::usage(root, std::slice::from_ref(disk), &scope, deadline)?;
        let device = format!("SCSI device {}", self.hctl);
        if usage.has_users() {
            return Err(Error::Busy {
                device,
                reason: format!("{why}. In use: {}", busy_reason(root, &usage)),
                usage: Some(Box::new(usage)),
            });
        }
        if !usage.unchecked.is_empty() {
            return Err(Error::Unverified {
                device,
                reason: format!("{why}. Whether it is in use is not known: {usage}"),
                usage: Some(Box::new(usage)),
            });
        }
        self.checked = true;
        Ok(())
    }
}

/// The path device at `hctl` once `sd` has bound it and its node opens: `None` while it has
/// no disk yet (or an open of it from an earlier call is still blocked), else the disk's
/// open handed to a helper thread, for [`ReadyPending::finish`]. In two halves so that a
/// scan opens every path's disk at once: an open can wait while the kernel still probes the
/// disk, and the paths' probes run side by side.
pub(crate) fn ready_start(root: &Root, hctl: Hctl) -> Result<Option<ReadyPending>> {
    let dir = sysfs::device_dir(root, hctl);
    if !dir.exists() {
        // It existed after the scan write; vanishing means someone deleted it meanwhile.
        return Err(Error::NotFound {
            what: format!("SCSI device {hctl} was removed while waiting for it"),
        });
    }
    let Some(dir) = crate::sysfs::Confine::new(root).dir(&dir) else {
        return Err(Error::NotFound {
            what: format!(
                "SCSI device {hctl} not found below {}",
                root.path().display()
            ),
        });
    };
    let Some(name) = crate::sysfs::sub_entries(&dir, "block")?.into_iter().next() else {
        return Ok(None);
    };
    crate::sysfs::check_component("block device name", &name)?;
    let Some(dev) = attr_parse::<DevNum>(&dir.join("block").join(&name), "dev") else {
        return Ok(None);
    };
    let dev_path = root.dev(&name);
    // devtmpfs creates the node before the `add` uevent; opening it proves the disk is
    // usable (the probe has finished and the queue accepts opens).
    // The node exists from the start of the probe, and an open waits while the probe holds
    // the disk (reading its partition table, which a failing LUN can stretch to minutes).
    let node = dev_path.clone();
    // Not a wait for an earlier open still blocked on this disk: the scan checks again on
    // the next uevent or backoff, and its other paths' opens go ahead meanwhile.
    let Some(open) = helper::try_start(Subject::device("open", dev), move || {
        Ok(rustix::fs::open(
            &node,
            OFlags::RDONLY | OFlags::NONBLOCK | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .is_ok())
    })?
    else {
        return Ok(None);
    };
    Ok(Some(ReadyPending {
        open,
        dir,
        device: PathDevice {
            hctl,
            name,
            dev_path,
            dev,
            wwid: None,
        },
    }))
}

/// What a path's readiness open waits for, for its timeout.
fn opening(dev_path: &Path) -> impl Fn() -> String + '_ {
    move || {
        format!(
            "{} to open (the kernel is still probing it)",
            dev_path.display()
        )
    }
}

/// A path's disk being opened on a helper thread ([`ready_start`]).
pub(crate) struct ReadyPending {
    open: helper::Pending<bool>,
    /// The SCSI device's sysfs directory, for its WWID once the disk opened.
    dir: PathBuf,
    device: PathDevice,
}

impl ReadyPending {
    /// The path device, with when its open returned, once it did; `None` when the open
    /// failed (the disk is not usable yet); [`Error::Timeout`] when it was still blocked at
    /// `deadline`.
    pub(crate) fn finish(self, deadline: Instant) -> Result<Option<(PathDevice, Instant)>> {
        let (opened, at) = self
            .open
            .wait_timed(deadline, &opening(&self.device.dev_path))?;
        if !opened {
            return Ok(None);
        }
        let device = PathDevice {
            wwid: attr(&self.dir, "wwid").and_then(|w| w.parse().ok()),
            ..self.device
        };
        Ok(Some((device, at)))
    }
}

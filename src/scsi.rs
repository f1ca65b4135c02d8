//! Bringing one LUN in: scan exactly one H:C:T:L and wait for its block device.
//!
//! A scan writes `"C T L"` to `/sys/class/scsi_host/hostN/scan` (never wildcards unless asked:
//! whole-target scans create unwanted disks, uevent storms and phantom LUNs). The kernel creates
//! the `scsi_device` before the write returns, or not at all when the target does not report the
//! LUN, so a missing LUN fails at once with [`Error::NotFound`]. The `sd` probe that creates the
//! block device runs asynchronously after the write; that is what the scan waits for, on uevents
//! with sysfs re-checks as the safety net (see [`crate::wait`]).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use rustix::fs::{Mode, OFlags};

use crate::error::{Error, Result};
use crate::hctl::Hctl;
use crate::root::Root;
use crate::sysfs::block::DevNum;
use crate::sysfs::{self, attr, attr_parse, entries};
use crate::uevent::{Monitor, Uevent};
use crate::wait;
use crate::wwid::Wwid;

/// Default time a scan waits for its block devices.
pub const DEFAULT_SCAN_TIMEOUT: Duration = Duration::from_secs(30);

/// One path to a LUN: the SCSI device and the disk `sd` made of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathDevice {
    /// Its SCSI address.
    pub hctl: Hctl,
    /// Kernel name of the disk (`sdc`).
    pub name: String,
    /// Its device node (`<root>/dev/sdc`).
    pub dev_path: PathBuf,
    /// Its device number.
    pub dev: DevNum,
    /// Its WWID, absent when the LUN has no VPD page 0x83.
    pub wwid: Option<Wwid>,
}

/// How a scan behaves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanOptions {
    /// How long to wait for every block device to appear and open.
    pub timeout: Duration,
    /// The WWID the volume must have; a path with another one is rejected with
    /// [`Error::WwidMismatch`] (a reused LUN number is not the old volume).
    pub expect_wwid: Option<Wwid>,
}

impl Default for ScanOptions {
    fn default() -> Self {
        ScanOptions {
            timeout: DEFAULT_SCAN_TIMEOUT,
            expect_wwid: None,
        }
    }
}

/// What to write where: the LUN expected at `hctl`, brought in by writing `request` to
/// `hostN/scan`. `request` is `"C T L"`, or `"- - L"` for a wildcard scan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ScanTarget {
    pub hctl: Hctl,
    pub request: String,
}

impl ScanTarget {
    pub(crate) fn exact(hctl: Hctl) -> Self {
        ScanTarget {
            request: format!("{} {} {}", hctl.channel, hctl.target, hctl.lun),
            hctl,
        }
    }
}

/// Scans the LUN at `hctl` and waits until its block device exists and its `/dev` node opens.
///
/// A LUN that is already present is rescanned (its `rescan` attribute: capacity and VPD are
/// re-read) and returned after the same checks.
pub fn scan(root: &Root, hctl: Hctl, opts: &ScanOptions) -> Result<PathDevice> {
    let mut v = scan_targets(root, &[ScanTarget::exact(hctl)], opts)?;
    Ok(v.remove(0))
}

/// Scans every target, then waits for all their block devices together, so the asynchronous
/// `sd` probes of several paths overlap.
pub(crate) fn scan_targets(
    root: &Root,
    targets: &[ScanTarget],
    opts: &ScanOptions,
) -> Result<Vec<PathDevice>> {
    let deadline = Instant::now() + opts.timeout;
    // Subscribe before acting so the block device's `add` cannot slip past.
    let mut monitor = Monitor::open().ok();
    for t in targets {
        trigger(root, t)?;
    }
    let hctls: Vec<Hctl> = targets.iter().map(|t| t.hctl).collect();
    let what = || {
        let list: Vec<String> = hctls.iter().map(ToString::to_string).collect();
        format!("block device of {} to appear and open", list.join(", "))
    };
    let relevant = |ev: &Uevent| ev.subsystem.as_deref() == Some("block");
    let paths = wait::until(monitor.as_mut(), deadline, &what, &relevant, || {
        let mut found = Vec::with_capacity(hctls.len());
        for &h in &hctls {
            match ready_path(root, h)? {
                Some(p) => found.push(p),
                None => return Ok(None),
            }
        }
        Ok(Some(found))
    })?;
    if let Some(want) = &opts.expect_wwid {
        for p in &paths {
            if p.wwid.as_ref() != Some(want) {
                return Err(Error::WwidMismatch {
                    device: format!("{} ({})", p.name, p.hctl),
                    expected: want.to_string(),
                    actual: p.wwid.as_ref().map_or("none".into(), ToString::to_string),
                });
            }
        }
    }
    Ok(paths)
}

/// Writes the scan (or rescan) for one target and checks that the SCSI device now exists.
fn trigger(root: &Root, t: &ScanTarget) -> Result<()> {
    let h = t.hctl;
    let dev_dir = scsi_device_dir(root, h);
    if dev_dir.exists() {
        // Already present: `rescan` is synchronous and re-reads VPD pages and capacity.
        return sysfs::write_attr(&dev_dir.join("rescan"), "1");
    }
    let host_dir = root.sys("class/scsi_host").join(format!("host{}", h.host));
    if !host_dir.is_dir() {
        return Err(Error::NotFound {
            what: format!("SCSI host{}", h.host),
        });
    }
    sysfs::write_attr(&host_dir.join("scan"), &t.request)?;
    // The scsi_device is added before the write returns, or never: nothing to wait for.
    if !dev_dir.exists() {
        return Err(Error::NotFound {
            what: format!(
                "LUN {} behind host{} channel {} target {} (the target did not report it)",
                h.lun, h.host, h.channel, h.target
            ),
        });
    }
    Ok(())
}

fn scsi_device_dir(root: &Root, h: Hctl) -> PathBuf {
    root.sys("class/scsi_device")
        .join(h.to_string())
        .join("device")
}

/// The path device at `hctl` once `sd` has bound it and its node opens; `None` before that.
fn ready_path(root: &Root, hctl: Hctl) -> Result<Option<PathDevice>> {
    let dir = scsi_device_dir(root, hctl);
    if !dir.exists() {
        // It existed after the scan write; vanishing means someone deleted it meanwhile.
        return Err(Error::NotFound {
            what: format!("SCSI device {hctl} (removed while waiting for it)"),
        });
    }
    let Some(name) = entries(&dir.join("block"))?.into_iter().next() else {
        return Ok(None);
    };
    sysfs::check_component("block device name", &name)?;
    let Some(dev) = attr_parse::<DevNum>(&dir.join("block").join(&name), "dev") else {
        return Ok(None);
    };
    let dev_path = root.dev(&name);
    // devtmpfs creates the node before the `add` uevent; opening it proves the disk is
    // usable (the probe has finished and the queue accepts opens).
    match rustix::fs::open(
        &dev_path,
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(_fd) => {}
        Err(_) => return Ok(None),
    }
    let wwid = attr(&dir, "wwid").and_then(|w| w.parse().ok());
    Ok(Some(PathDevice {
        hctl,
        name,
        dev_path,
        dev,
        wwid,
    }))
}

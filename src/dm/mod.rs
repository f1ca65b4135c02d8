//! Device-mapper control through `/dev/mapper/control`, without libdevmapper.
//!
//! [`Control`] issues one ioctl per call. Replies are decoded by the pure functions of
//! [`buffer`], which bounds-check every offset the kernel returns. The request buffer starts
//! at 16 KiB (as libdm's does) and doubles whenever the kernel answers `DM_BUFFER_FULL_FLAG`,
//! up to 64 MiB.
//!
//! No udev cookie is ever passed (`event_nr` is 0): a caller that must know when the device
//! node is gone waits for the kernel's `remove` uevent of `dm-N` instead of a SysV semaphore
//! that udev rules would release (docs/DESIGN.md, "device-mapper").
//!
//! Every command needs `CAP_SYS_ADMIN`. A failed command comes back as [`Error::Ioctl`] naming
//! the command, the device and the errno; the kernel copies nothing else back on failure, so a
//! caller wanting the open count after `EBUSY` asks again with [`Control::info`].

pub mod buffer;
mod types;

use std::io;
use std::os::fd::OwnedFd;

use lunkit_sys::dm as sys;
use rustix::fs::{Mode, OFlags};

use crate::error::{Error, Result};
use crate::id::DevNum;
use crate::ioctl::{self, DmBuffer};
use crate::root::Root;

use buffer::Request;
pub use types::{DevId, Device, DeviceInfo, ListedUuid, Removed, Suspend, Target, Version};

/// First buffer size, as libdm: large enough for any single-map reply.
const INITIAL_BUFFER: usize = 16 << 10;
/// Largest buffer we grow to. A listing of ~100k maps fits; beyond that something is wrong.
const MAX_BUFFER: usize = 64 << 20;

/// Interface minor from which list records carry `event_nr` and `flags` (Linux 4.14).
const MINOR_LIST_EVENT_NR: u32 = 37;

/// How many times [`Control::suspend_unless_suspended`] suspends a device that another
/// caller suspended and resumed between its look and its own suspend (`EINVAL`). Each try
/// is taken only after such a collision, so the tries end as soon as the other caller's
/// reloads leave a gap. Three collisions in a row happened in a loaded TCG guest against a
/// reload loop (the test's stand-in for multipathd), 7 suspends into its run.
pub const SUSPEND_TRIES: u32 = 16;

/// An open `/dev/mapper/control`.
#[derive(Debug)]
pub struct Control {
    fd: OwnedFd,
    version: Version,
}

/// A successful reply: the buffer and its decoded header.
struct Reply {
    buf: DmBuffer,
    header: buffer::Header,
}

impl Reply {
    fn payload(&self) -> Result<&[u8]> {
        buffer::payload(self.buf.bytes(), &self.header)
    }

    fn info(&self) -> DeviceInfo {
        let h = &self.header;
        DeviceInfo {
            name: h.name.clone(),
            uuid: (!h.uuid.is_empty()).then(|| h.uuid.clone()),
            dev: h.dev,
            open_count: h.open_count,
            event_nr: h.event_nr,
            target_count: h.target_count,
            flags: h.flags,
        }
    }
}

impl Control {
    /// Opens `<root>/dev/mapper/control` (`O_RDWR | O_CLOEXEC`) and asks the kernel its
    /// interface version with `DM_VERSION`.
    pub fn open(root: &Root) -> Result<Control> {
        let path = root.dev("mapper/control");
        let fd = rustix::fs::open(&path, OFlags::RDWR | OFlags::CLOEXEC, Mode::empty())
            .map_err(|e| Error::io(&path, io::Error::from(e)))?;
        let mut ctl = Control {
            fd,
            version: Version {
                major: 4,
                minor: 0,
                patch: 0,
            },
        };
        let reply = ctl.call("DM_VERSION", sys::DM_VERSION, &Request::default())?;
        let [major, minor, patch] = reply.header.version;
        ctl.version = Version {
            major,
            minor,
            patch,
        };
        Ok(ctl)
    }

    /// The kernel's device-mapper ioctl interface version (`DM_VERSION`, asked at open).
    pub fn version(&self) -> Version {
        self.version
    }

    /// Issues one command, growing the buffer while the kernel reports `DM_BUFFER_FULL_FLAG`.
    fn call(&self, op: &'static str, cmd: u32, req: &Request<'_>) -> Result<Reply> {
        let target = || {
            req.id
                .map_or_else(|| "device-mapper".to_owned(), |i| i.to_string())
        };
        let mut size = INITIAL_BUFFER.max(buffer::HEADER_SIZE + req.payload.len());
        loop {
            let mut buf = DmBuffer::zeroed(size);
            buffer::write_request(buf.bytes_mut(), req)?;
            ioctl::dm_ioctl(&self.fd, cmd, &mut buf).map_err(|source| Error::Ioctl {
                op,
                target: target(),
                source,
            })?;
            let header = buffer::decode_header(buf.bytes())?;
            if header.flags & sys::DM_BUFFER_FULL_FLAG == 0 {
                return Ok(Reply { buf, header });
            }
            size = size.saturating_mul(2);
            if size > MAX_BUFFER {
                return Err(Error::Ioctl {
                    op,
                    target: target(),
                    source: io::Error::new(
                        io::ErrorKind::OutOfMemory,
                        "reply does not fit in 64 MiB (DM_BUFFER_FULL)",
                    ),
                });
            }
        }
    }

    /// A request about device `id` with `flags`.
    fn on<'a>(id: &DevId<'a>, flags: u32) -> Request<'a> {
        Request {
            id: Some(*id),
            flags,
            ..Request::default()
        }
    }

    /// `DM_LIST_DEVICES` with `DM_UUID_FLAG`: every device with its name, number, event
    /// counter and uuid.
    ///
    /// Kernels before 5.13 ignore `DM_UUID_FLAG`; their records say nothing about uuids, and
    /// this asks each such device with `DM_DEV_STATUS` instead (a device removed in between
    /// is left out). A name that is not UTF-8 makes the whole listing an [`Error::Invalid`].
    pub fn list(&self) -> Result<Vec<Device>> {
        let req = Request {
            flags: sys::DM_UUID_FLAG,
            ..Request::default()
        };
        let reply = self.call("DM_LIST_DEVICES", sys::DM_LIST_DEVICES, &req)?;
        let with_event_nr = self.version.minor >= MINOR_LIST_EVENT_NR;
        let mut devices = buffer::decode_names(reply.payload()?, with_event_nr)?;
        let mut gone = Vec::new();
        for (i, d) in devices.iter_mut().enumerate() {
            if d.uuid != ListedUuid::Unknown {
                continue;
            }
            match self.info(&DevId::Name(&d.name)) {
                Ok(info) => d.uuid = info.uuid.map_or(ListedUuid::None, ListedUuid::Some),
                Err(e) if e.is_gone() => gone.push(i),
                Err(e) => return Err(e),
            }
        }
        for i in gone.into_iter().rev() {
            devices.remove(i);
        }
        Ok(devices)
    }

    /// `DM_DEV_STATUS`: open count, flags (suspended, tables present, deferred removal),
    /// event counter, number, name and uuid. An unknown device is `ENXIO`.
    pub fn info(&self, id: &DevId<'_>) -> Result<DeviceInfo> {
        self.call("DM_DEV_STATUS", sys::DM_DEV_STATUS, &Self::on(id, 0))
            .map(|r| r.info())
    }

    /// `DM_TABLE_STATUS` with `DM_STATUS_TABLE_FLAG`: the live table's lines.
    pub fn table(&self, id: &DevId<'_>) -> Result<Vec<Target>> {
        let req = Self::on(id, sys::DM_STATUS_TABLE_FLAG);
        let r = self.call("DM_TABLE_STATUS", sys::DM_TABLE_STATUS, &req)?;
        buffer::decode_targets(r.payload()?, r.header.target_count)
    }

    /// `DM_TABLE_STATUS`: each target's status line (for multipath: path states, fail counts).
    pub fn status(&self, id: &DevId<'_>) -> Result<Vec<Target>> {
        let r = self.call("DM_TABLE_STATUS", sys::DM_TABLE_STATUS, &Self::on(id, 0))?;
        buffer::decode_targets(r.payload()?, r.header.target_count)
    }

    /// `DM_TABLE_DEPS`: the devices the live table uses.
    pub fn deps(&self, id: &DevId<'_>) -> Result<Vec<DevNum>> {
        let r = self.call("DM_TABLE_DEPS", sys::DM_TABLE_DEPS, &Self::on(id, 0))?;
        buffer::decode_deps(r.payload()?)
    }

    /// `DM_TARGET_MSG`: sends `message` to the target covering `sector` (0 for single-target
    /// maps); returns the target's answer if it gave one. A suspended multipath map answers
    /// `EBUSY`.
    pub fn message(&self, id: &DevId<'_>, sector: u64, message: &str) -> Result<Option<String>> {
        let payload = buffer::encode_message(sector, message)?;
        let req = Request {
            payload: &payload,
            ..Self::on(id, 0)
        };
        let r = self.call("DM_TARGET_MSG", sys::DM_TARGET_MSG, &req)?;
        buffer::decode_message(r.payload()?, r.header.flags)
    }

    /// `DM_DEV_SUSPEND` with `DM_SUSPEND_FLAG`: holds new I/O; with a flush (the default) it
    /// first waits for in-flight I/O, which on a multipath map without paths means failing
    /// queued I/O (dm-mpath's presuspend turns `queue_if_no_path` off until resume).
    pub fn suspend(&self, id: &DevId<'_>, how: Suspend) -> Result<DeviceInfo> {
        let mut flags = sys::DM_SUSPEND_FLAG;
        if how.noflush {
            flags |= sys::DM_NOFLUSH_FLAG;
        }
        if how.skip_lockfs {
            flags |= sys::DM_SKIP_LOCKFS_FLAG;
        }
        self.call("DM_DEV_SUSPEND", sys::DM_DEV_SUSPEND, &Self::on(id, flags))
            .map(|r| r.info())
    }

    /// `DM_DEV_SUSPEND` without `DM_SUSPEND_FLAG`: resumes the device, first swapping in the
    /// inactive table if one was loaded.
    pub fn resume(&self, id: &DevId<'_>) -> Result<DeviceInfo> {
        self.call("DM_DEV_SUSPEND", sys::DM_DEV_SUSPEND, &Self::on(id, 0))
            .map(|r| r.info())
    }

    /// Resumes the device if it is suspended: `DM_DEV_STATUS`, then `DM_DEV_SUSPEND` without
    /// `DM_SUSPEND_FLAG`. `Some` with the device's state when this call resumed it; `None`
    /// when it was not suspended, or another process resumed it in between (multipathd
    /// reloading the map suspends and resumes it inside its own `DM_DEV_SUSPEND`). The
    /// kernel's `dm_resume` answers `EINVAL` for a device that is not suspended, so an
    /// `EINVAL` is looked at again before it is taken for a failure.
    pub fn resume_if_suspended(&self, id: &DevId<'_>) -> Result<Option<DeviceInfo>> {
        if !self.info(id)?.suspended() {
            return Ok(None);
        }
        match self.resume(id) {
            Ok(info) => Ok(Some(info)),
            Err(e) if e.errno() == Some(libc::EINVAL) && !self.info(id)?.suspended() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Suspends the device (as [`Control::suspend`]) unless another caller has it suspended:
    /// `true` when this call suspended it; `false` when it was found suspended, so that this
    /// call's flush did not happen (multipathd reloading the map suspends it without a
    /// flush, inside one `DM_DEV_SUSPEND`): wait for it to be resumed, and call again. The
    /// kernel's `dm_suspend` answers `EINVAL` for a device suspended in between its
    /// `DM_DEV_SUSPEND` handler's look and its own, so an `EINVAL` is looked at again before
    /// it is taken for a failure: still suspended is another's suspension; resumed already
    /// (a reload's suspension lasts a moment), the suspend is tried again, up to
    /// [`SUSPEND_TRIES`] times.
    pub fn suspend_unless_suspended(&self, id: &DevId<'_>, how: Suspend) -> Result<bool> {
        let mut tries = 0;
        loop {
            if self.info(id)?.suspended() {
                return Ok(false);
            }
            tries += 1;
            match self.suspend(id, how) {
                Ok(_) => return Ok(true),
                Err(e) if e.errno() == Some(libc::EINVAL) && tries < SUSPEND_TRIES => {}
                Err(e) if e.errno() == Some(libc::EINVAL) && self.info(id)?.suspended() => {
                    return Ok(false);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Another handle on the same control device (a `dup` of its descriptor), for a call
    /// made on a helper thread.
    pub fn try_clone(&self) -> Result<Control> {
        let fd = self
            .fd
            .try_clone()
            .map_err(|e| Error::io("/dev/mapper/control", e))?;
        Ok(Control {
            fd,
            version: self.version,
        })
    }

    /// `DM_DEV_CREATE`: a new device named `name` (with `uuid` if given), with no table. Load
    /// one with [`Control::load`] and [`Control::resume`] to make it usable.
    pub fn create(&self, name: &str, uuid: Option<&str>) -> Result<DeviceInfo> {
        let req = Request {
            id: Some(DevId::Name(name)),
            new_uuid: uuid,
            ..Request::default()
        };
        self.call("DM_DEV_CREATE", sys::DM_DEV_CREATE, &req)
            .map(|r| r.info())
    }

    /// `DM_TABLE_LOAD`: loads `targets` into the device's inactive table slot; a
    /// [`Control::resume`] makes it live.
    pub fn load(&self, id: &DevId<'_>, targets: &[Target]) -> Result<DeviceInfo> {
        let payload = buffer::encode_targets(targets)?;
        let count = u32::try_from(targets.len())
            .map_err(|_| Error::invalid("table", "", "more than 2^32 targets"))?;
        let req = Request {
            target_count: count,
            payload: &payload,
            ..Self::on(id, 0)
        };
        self.call("DM_TABLE_LOAD", sys::DM_TABLE_LOAD, &req)
            .map(|r| r.info())
    }

    /// `DM_TABLE_CLEAR`: drops the table [`Control::load`] put in the inactive slot, so that
    /// the next resume keeps the live one (some kernels answer `ENXIO` when nothing was
    /// loaded). It does not wait for a suspend in progress.
    pub fn clear(&self, id: &DevId<'_>) -> Result<DeviceInfo> {
        self.call("DM_TABLE_CLEAR", sys::DM_TABLE_CLEAR, &Self::on(id, 0))
            .map(|r| r.info())
    }

    /// `DM_DEV_REMOVE`: removes the device. An open device is `EBUSY`, unless `deferred`
    /// (`DM_DEFERRED_REMOVE`), in which case the kernel marks it for removal on last close
    /// and this returns [`Removed::Deferred`].
    pub fn remove(&self, id: &DevId<'_>, deferred: bool) -> Result<Removed> {
        let flags = if deferred { sys::DM_DEFERRED_REMOVE } else { 0 };
        let r = self.call("DM_DEV_REMOVE", sys::DM_DEV_REMOVE, &Self::on(id, flags))?;
        // The kernel clears the flag when it removed at once, and leaves it set when it only
        // marked the device.
        Ok(
            if deferred && r.header.flags & sys::DM_DEFERRED_REMOVE != 0 {
                Removed::Deferred
            } else {
                Removed::Now
            },
        )
    }

    /// `DM_TARGET_MSG` `@cancel_deferred_remove`: the device stays after its last close.
    /// `ENXIO` if no removal was pending.
    pub fn cancel_deferred_remove(&self, id: &DevId<'_>) -> Result<()> {
        self.message(id, 0, "@cancel_deferred_remove").map(drop)
    }

    /// `DM_LIST_VERSIONS`: the loaded target types and their versions.
    pub fn target_versions(&self) -> Result<Vec<(String, [u32; 3])>> {
        let r = self.call(
            "DM_LIST_VERSIONS",
            sys::DM_LIST_VERSIONS,
            &Request::default(),
        )?;
        buffer::decode_target_versions(r.payload()?)
    }
}

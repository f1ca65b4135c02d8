//! Plain values exchanged with device-mapper: device identities, device information, table
//! lines, removal results.

use std::fmt;

use lunkit_sys::dm as sys;

use crate::id::DevNum;

/// How a request names its device. The kernel looks up by uuid, then name, then number, and
/// only one may be given (name and uuid together are `EINVAL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DevId<'a> {
    /// The map name (`/dev/mapper/<name>`).
    Name(&'a str),
    /// The map uuid (`mpath-<wwid>`, `part1-mpath-<wwid>`).
    Uuid(&'a str),
    /// The device number of `/dev/dm-N`.
    Dev(DevNum),
}

impl fmt::Display for DevId<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DevId::Name(n) => f.write_str(n),
            DevId::Uuid(u) => write!(f, "uuid {u}"),
            DevId::Dev(d) => write!(f, "dm device {d}"),
        }
    }
}

/// The ioctl interface version the kernel speaks (`4.x.y`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    /// Always 4.
    pub major: u32,
    /// Grows with features: 37 event numbers in lists, 45 uuids in lists (5.13).
    pub minor: u32,
    /// Patch level.
    pub patch: u32,
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// What `DM_DEV_STATUS` (and every other per-device command) says about a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The map name.
    pub name: String,
    /// The map uuid, if one was set.
    pub uuid: Option<String>,
    /// `/dev/dm-N`'s device number.
    pub dev: DevNum,
    /// How many times the device is open: mounts, stacked maps, processes, and transient
    /// udev/blkid opens.
    pub open_count: i32,
    /// The device's event counter (bumped by table swaps and target events).
    pub event_nr: u32,
    /// Targets in the table the reply refers to.
    pub target_count: u32,
    /// The raw `DM_*_FLAG` bits of the reply.
    pub flags: u32,
}

impl DeviceInfo {
    /// The device is suspended (I/O is held).
    pub fn suspended(&self) -> bool {
        self.flags & sys::DM_SUSPEND_FLAG != 0
    }

    /// The device is read-only.
    pub fn read_only(&self) -> bool {
        self.flags & sys::DM_READONLY_FLAG != 0
    }

    /// A live table is loaded.
    pub fn live_table(&self) -> bool {
        self.flags & sys::DM_ACTIVE_PRESENT_FLAG != 0
    }

    /// An inactive table waits for a resume.
    pub fn inactive_table(&self) -> bool {
        self.flags & sys::DM_INACTIVE_PRESENT_FLAG != 0
    }

    /// Removal on last close is pending.
    pub fn deferred_remove(&self) -> bool {
        self.flags & sys::DM_DEFERRED_REMOVE != 0
    }

    /// The kernel name of the device node, `dm-<minor>`.
    pub fn kernel_name(&self) -> String {
        format!("dm-{}", self.dev.minor)
    }
}

/// One device of `DM_LIST_DEVICES`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    /// The map name.
    pub name: String,
    /// `/dev/dm-N`'s device number.
    pub dev: DevNum,
    /// The device's event counter (interface 4.37+).
    pub event_nr: Option<u32>,
    /// The map uuid as the listing reported it.
    pub uuid: ListedUuid,
}

/// What a `DM_LIST_DEVICES` record says about the device's uuid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListedUuid {
    /// The kernel did not say (older than 5.13, or uuids were not asked for).
    Unknown,
    /// The device has no uuid.
    None,
    /// The device's uuid.
    Some(String),
}

impl ListedUuid {
    /// The uuid, if the kernel reported one.
    pub fn as_deref(&self) -> Option<&str> {
        match self {
            ListedUuid::Some(u) => Some(u),
            _ => None,
        }
    }
}

/// One line of a table or of a status: `<start> <length> <type> <params>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// First sector covered.
    pub start: u64,
    /// Sectors covered.
    pub length: u64,
    /// Target type: `multipath`, `linear`, ...
    pub target_type: String,
    /// The table parameters or status text.
    pub params: String,
}

impl fmt::Display for Target {
    /// The `dmsetup table` form.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} {} {}",
            self.start, self.length, self.target_type, self.params
        )
    }
}

/// How [`super::Control::suspend`] suspends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Suspend {
    /// Do not wait for queued I/O (`DM_NOFLUSH_FLAG`): with multipath, I/O queued for lack of
    /// paths stays queued instead of being flushed (or failed).
    pub noflush: bool,
    /// Do not freeze a filesystem on the device (`DM_SKIP_LOCKFS_FLAG`).
    pub skip_lockfs: bool,
}

/// What a remove did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removed {
    /// The device is gone.
    Now,
    /// The device was busy and will be removed on its last close.
    Deferred,
}

//! Device-mapper control interface: `<linux/dm-ioctl.h>` (ioctl interface 4.x), plus the
//! udev cookie flags of `<libdevmapper.h>`.
//!
//! Every command is an `_IOWR(0xfd, nr, struct dm_ioctl)` on `/dev/mapper/control` with a
//! buffer that starts with a [`dm_ioctl`] header and is `data_size` bytes long; the payload
//! (target specs, name lists, deps, messages) sits at `data_start`. The payload records have
//! flexible array members, so only their fixed headers are structs here and the offset of the
//! trailing array is a constant (e.g. [`DM_NAME_LIST_NAME_OFFSET`]). Character arrays are
//! `u8` (C `char`), NUL-terminated when shorter than the array.
//!
//! Layout notes (checked at compile time below and against the system header by
//! the root crate's `tests/sys_abi_c.rs`):
//! - `dm_ioctl` is 312 bytes (`0x138`); `data` at 305 is 7 bytes of padding, so the first
//!   payload byte is at 312 and `data_start` comes back as 312.
//! - `dm_name_list` has `sizeof` 16 (12 on i386, where `__u64` is 4-aligned) but its name
//!   starts at 12 on every architecture, inside the tail padding.

use core::mem::offset_of;

use crate::ioctl::{io, iowr};

/// `DM_DIR`: directory under `/dev` holding the named device nodes (udev creates them).
pub const DM_DIR: &str = "mapper";
/// `DM_CONTROL_NODE`: name of the control node in [`DM_DIR`] (`/dev/mapper/control`).
pub const DM_CONTROL_NODE: &str = "control";
/// `DM_MAX_TYPE_NAME`: size of [`dm_target_spec::target_type`], including the NUL.
pub const DM_MAX_TYPE_NAME: usize = 16;
/// `DM_NAME_LEN`: size of [`dm_ioctl::name`], including the NUL.
pub const DM_NAME_LEN: usize = 128;
/// `DM_UUID_LEN`: size of [`dm_ioctl::uuid`], including the NUL.
pub const DM_UUID_LEN: usize = 129;

/// `DM_IOCTL`: the ioctl type ("magic") byte of all device-mapper ioctls.
pub const DM_IOCTL: u32 = 0xfd;

/// `DM_VERSION_MAJOR`: the interface major version. The kernel rejects any other major.
pub const DM_VERSION_MAJOR: u32 = 4;
/// The `dm_ioctl::version` to send: `{4, 0, 0}`.
///
/// The kernel answers `EINVAL` if the major differs or the minor is *above* its own, and
/// always writes its own version back, so asking for 4.0.0 works on every 4.x kernel; the
/// caller then checks the returned minor before relying on newer behaviour.
pub const DM_VERSION_REQUEST: [u32; 3] = [DM_VERSION_MAJOR, 0, 0];

/// `struct dm_ioctl`: the header of every device-mapper ioctl buffer (312 bytes).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct dm_ioctl {
    /// Interface version: in, the version the caller was written for; out, the kernel's.
    pub version: [u32; 3],
    /// Total size of the buffer passed in, including this header.
    pub data_size: u32,
    /// Offset of the payload from the start of this header.
    pub data_start: u32,
    /// Number of targets (in for TABLE_LOAD, out for status calls).
    pub target_count: u32,
    /// Out: how many times the device is open.
    pub open_count: i32,
    /// In/out: `DM_*_FLAG` bits.
    pub flags: u32,
    /// In/out event number; on DEV_SUSPEND (resume), DEV_REMOVE and DEV_RENAME the udev
    /// cookie passed through to the uevent's `DM_COOKIE` (input only).
    pub event_nr: u32,
    /// Padding; keep zero.
    pub padding: u32,
    /// In/out device number, in the kernel's `huge_encode_dev` (glibc `makedev`) encoding.
    pub dev: u64,
    /// Device name, NUL-terminated.
    pub name: [u8; DM_NAME_LEN],
    /// Device uuid, NUL-terminated.
    pub uuid: [u8; DM_UUID_LEN],
    /// Padding up to the 8-byte aligned end of the header (or the first payload bytes).
    pub data: [u8; 7],
}

impl dm_ioctl {
    /// An all-zero header.
    pub const fn zeroed() -> Self {
        Self {
            version: [0; 3],
            data_size: 0,
            data_start: 0,
            target_count: 0,
            open_count: 0,
            flags: 0,
            event_nr: 0,
            padding: 0,
            dev: 0,
            name: [0; DM_NAME_LEN],
            uuid: [0; DM_UUID_LEN],
            data: [0; 7],
        }
    }
}

impl Default for dm_ioctl {
    fn default() -> Self {
        Self::zeroed()
    }
}

/// `struct dm_target_spec`: one table line (40 bytes), followed by its NUL-terminated
/// parameter string, padded so the next spec is 8-byte aligned.
///
/// `next` means different things in the two directions: on `DM_TABLE_LOAD` input it is the
/// distance from *this* spec to the next one; on `DM_TABLE_STATUS` output it is the distance
/// from the *first* spec (at `data_start`) to the next one.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct dm_target_spec {
    /// First sector covered by this target.
    pub sector_start: u64,
    /// Number of sectors covered.
    pub length: u64,
    /// Out only: status of the target.
    pub status: i32,
    /// Offset of the next spec (see the type's doc for which base).
    pub next: u32,
    /// Target type name (`multipath`, `linear`, ...), NUL-terminated.
    pub target_type: [u8; DM_MAX_TYPE_NAME],
}

/// Offset of a target's parameter string from the start of its [`dm_target_spec`].
pub const DM_TARGET_SPEC_PARAMS_OFFSET: usize = size_of::<dm_target_spec>();

/// `struct dm_target_deps` header (8 bytes): `count` device numbers (`u64`) follow at
/// [`DM_TARGET_DEPS_DEV_OFFSET`]. Returned by `DM_TABLE_DEPS` at `data_start`.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct dm_target_deps {
    /// Number of entries in `dev[]`.
    pub count: u32,
    /// Unused.
    pub padding: u32,
}

/// Offset of `dm_target_deps.dev[]` (array of `u64` device numbers).
pub const DM_TARGET_DEPS_DEV_OFFSET: usize = size_of::<dm_target_deps>();

/// `struct dm_name_list` header: one record of the `DM_LIST_DEVICES` reply.
///
/// The NUL-terminated name starts at [`DM_NAME_LIST_NAME_OFFSET`] (12), inside this struct's
/// tail padding (`sizeof` is 16 on 64-bit ABIs, 12 on i386: never use `size_of` to find the
/// name). With interface minor 38 or later, `u32 event_nr; u32 flags;`
/// follow at the next 8-byte boundary after the name's NUL; when the request set
/// [`DM_UUID_FLAG`] and `flags` has [`DM_NAME_LIST_FLAG_HAS_UUID`], the uuid string follows at
/// the next 8-byte boundary after those. `next` is relative to this record, 0 on the last one;
/// `dev == 0` in the first record means there are no devices.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct dm_name_list {
    /// Device number (`huge_encode_dev` encoding).
    pub dev: u64,
    /// Offset from the start of this record to the next one; 0 on the last.
    pub next: u32,
}

/// Offset of `dm_name_list.name[]` (flexible array) from the start of a record.
pub const DM_NAME_LIST_NAME_OFFSET: usize = 12;

/// `DM_NAME_LIST_FLAG_HAS_UUID`: the `dm_name_list` record carries a uuid string.
pub const DM_NAME_LIST_FLAG_HAS_UUID: u32 = 1;
/// `DM_NAME_LIST_FLAG_DOESNT_HAVE_UUID`: uuid was asked for but the device has none.
pub const DM_NAME_LIST_FLAG_DOESNT_HAVE_UUID: u32 = 2;

/// `struct dm_target_versions` header: one record of the `DM_LIST_VERSIONS` and
/// `DM_GET_TARGET_VERSION` replies. The NUL-terminated target name follows at
/// [`DM_TARGET_VERSIONS_NAME_OFFSET`]; `next` is relative to this record.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct dm_target_versions {
    /// Offset from the start of this record to the next one; 0 on the last.
    pub next: u32,
    /// Target version (major, minor, patch).
    pub version: [u32; 3],
}

/// Offset of `dm_target_versions.name[]` (flexible array) from the start of a record.
pub const DM_TARGET_VERSIONS_NAME_OFFSET: usize = size_of::<dm_target_versions>();

/// `struct dm_target_msg` header: placed at `data_start` for `DM_TARGET_MSG`, followed by the
/// NUL-terminated message at [`DM_TARGET_MSG_MESSAGE_OFFSET`]. If the reply has
/// [`DM_DATA_OUT_FLAG`], the target's answer is a string at `data_start`.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct dm_target_msg {
    /// Sector selecting the target (0 for single-target maps such as multipath).
    pub sector: u64,
}

/// Offset of `dm_target_msg.message[]` (flexible array) from the start of the record.
pub const DM_TARGET_MSG_MESSAGE_OFFSET: usize = size_of::<dm_target_msg>();

// Command numbers: the anonymous enum in <linux/dm-ioctl.h>.

/// `DM_VERSION_CMD`: get the interface version.
pub const DM_VERSION_CMD: u32 = 0;
/// `DM_REMOVE_ALL_CMD`: remove every device (and with `DM_DEFERRED_REMOVE`, defer busy ones).
pub const DM_REMOVE_ALL_CMD: u32 = 1;
/// `DM_LIST_DEVICES_CMD`: list devices as `dm_name_list` records.
pub const DM_LIST_DEVICES_CMD: u32 = 2;
/// `DM_DEV_CREATE_CMD`: create a device (no table).
pub const DM_DEV_CREATE_CMD: u32 = 3;
/// `DM_DEV_REMOVE_CMD`: remove a device (`EBUSY` if open, unless deferred).
pub const DM_DEV_REMOVE_CMD: u32 = 4;
/// `DM_DEV_RENAME_CMD`: rename (or, with `DM_UUID_FLAG`, set the uuid of) a device.
pub const DM_DEV_RENAME_CMD: u32 = 5;
/// `DM_DEV_SUSPEND_CMD`: suspend (with `DM_SUSPEND_FLAG`) or resume (without) a device.
pub const DM_DEV_SUSPEND_CMD: u32 = 6;
/// `DM_DEV_STATUS_CMD`: get a device's header information (open count, flags, ...).
pub const DM_DEV_STATUS_CMD: u32 = 7;
/// `DM_DEV_WAIT_CMD`: wait for the device's event counter to move past `event_nr`.
pub const DM_DEV_WAIT_CMD: u32 = 8;
/// `DM_TABLE_LOAD_CMD`: load a table into the inactive slot.
pub const DM_TABLE_LOAD_CMD: u32 = 9;
/// `DM_TABLE_CLEAR_CMD`: clear the inactive table.
pub const DM_TABLE_CLEAR_CMD: u32 = 10;
/// `DM_TABLE_DEPS_CMD`: list the devices the table uses (`dm_target_deps`).
pub const DM_TABLE_DEPS_CMD: u32 = 11;
/// `DM_TABLE_STATUS_CMD`: per-target status, or the table with `DM_STATUS_TABLE_FLAG`.
pub const DM_TABLE_STATUS_CMD: u32 = 12;
/// `DM_LIST_VERSIONS_CMD`: list loaded target types (`dm_target_versions`).
pub const DM_LIST_VERSIONS_CMD: u32 = 13;
/// `DM_TARGET_MSG_CMD`: send a message to a target (`dm_target_msg`).
pub const DM_TARGET_MSG_CMD: u32 = 14;
/// `DM_DEV_SET_GEOMETRY_CMD`: set the device's CHS geometry.
pub const DM_DEV_SET_GEOMETRY_CMD: u32 = 15;
/// `DM_DEV_ARM_POLL_CMD`: re-arm `poll()` on the control fd (interface 4.37+).
pub const DM_DEV_ARM_POLL_CMD: u32 = 16;
/// `DM_GET_TARGET_VERSION_CMD`: version of one target type named in `name` (4.41+).
pub const DM_GET_TARGET_VERSION_CMD: u32 = 17;
/// `DM_MPATH_PROBE_PATHS_CMD`: number of [`DM_MPATH_PROBE_PATHS`] (interface 4.50, Linux
/// 6.16; not in older headers).
pub const DM_MPATH_PROBE_PATHS_CMD: u32 = 18;

const DM_IOCTL_SIZE: usize = size_of::<dm_ioctl>();

/// `DM_VERSION`: `_IOWR(DM_IOCTL, DM_VERSION_CMD, struct dm_ioctl)`.
pub const DM_VERSION: u32 = iowr(DM_IOCTL, DM_VERSION_CMD, DM_IOCTL_SIZE);
/// `DM_REMOVE_ALL`: `_IOWR(DM_IOCTL, DM_REMOVE_ALL_CMD, struct dm_ioctl)`.
pub const DM_REMOVE_ALL: u32 = iowr(DM_IOCTL, DM_REMOVE_ALL_CMD, DM_IOCTL_SIZE);
/// `DM_LIST_DEVICES`: `_IOWR(DM_IOCTL, DM_LIST_DEVICES_CMD, struct dm_ioctl)`.
pub const DM_LIST_DEVICES: u32 = iowr(DM_IOCTL, DM_LIST_DEVICES_CMD, DM_IOCTL_SIZE);
/// `DM_DEV_CREATE`: `_IOWR(DM_IOCTL, DM_DEV_CREATE_CMD, struct dm_ioctl)`.
pub const DM_DEV_CREATE: u32 = iowr(DM_IOCTL, DM_DEV_CREATE_CMD, DM_IOCTL_SIZE);
/// `DM_DEV_REMOVE`: `_IOWR(DM_IOCTL, DM_DEV_REMOVE_CMD, struct dm_ioctl)`.
pub const DM_DEV_REMOVE: u32 = iowr(DM_IOCTL, DM_DEV_REMOVE_CMD, DM_IOCTL_SIZE);
/// `DM_DEV_RENAME`: `_IOWR(DM_IOCTL, DM_DEV_RENAME_CMD, struct dm_ioctl)`.
pub const DM_DEV_RENAME: u32 = iowr(DM_IOCTL, DM_DEV_RENAME_CMD, DM_IOCTL_SIZE);
/// `DM_DEV_SUSPEND`: `_IOWR(DM_IOCTL, DM_DEV_SUSPEND_CMD, struct dm_ioctl)`.
pub const DM_DEV_SUSPEND: u32 = iowr(DM_IOCTL, DM_DEV_SUSPEND_CMD, DM_IOCTL_SIZE);
/// `DM_DEV_STATUS`: `_IOWR(DM_IOCTL, DM_DEV_STATUS_CMD, struct dm_ioctl)`.
pub const DM_DEV_STATUS: u32 = iowr(DM_IOCTL, DM_DEV_STATUS_CMD, DM_IOCTL_SIZE);
/// `DM_DEV_WAIT`: `_IOWR(DM_IOCTL, DM_DEV_WAIT_CMD, struct dm_ioctl)`.
pub const DM_DEV_WAIT: u32 = iowr(DM_IOCTL, DM_DEV_WAIT_CMD, DM_IOCTL_SIZE);
/// `DM_TABLE_LOAD`: `_IOWR(DM_IOCTL, DM_TABLE_LOAD_CMD, struct dm_ioctl)`.
pub const DM_TABLE_LOAD: u32 = iowr(DM_IOCTL, DM_TABLE_LOAD_CMD, DM_IOCTL_SIZE);
/// `DM_TABLE_CLEAR`: `_IOWR(DM_IOCTL, DM_TABLE_CLEAR_CMD, struct dm_ioctl)`.
pub const DM_TABLE_CLEAR: u32 = iowr(DM_IOCTL, DM_TABLE_CLEAR_CMD, DM_IOCTL_SIZE);
/// `DM_TABLE_DEPS`: `_IOWR(DM_IOCTL, DM_TABLE_DEPS_CMD, struct dm_ioctl)`.
pub const DM_TABLE_DEPS: u32 = iowr(DM_IOCTL, DM_TABLE_DEPS_CMD, DM_IOCTL_SIZE);
/// `DM_TABLE_STATUS`: `_IOWR(DM_IOCTL, DM_TABLE_STATUS_CMD, struct dm_ioctl)`.
pub const DM_TABLE_STATUS: u32 = iowr(DM_IOCTL, DM_TABLE_STATUS_CMD, DM_IOCTL_SIZE);
/// `DM_LIST_VERSIONS`: `_IOWR(DM_IOCTL, DM_LIST_VERSIONS_CMD, struct dm_ioctl)`.
pub const DM_LIST_VERSIONS: u32 = iowr(DM_IOCTL, DM_LIST_VERSIONS_CMD, DM_IOCTL_SIZE);
/// `DM_TARGET_MSG`: `_IOWR(DM_IOCTL, DM_TARGET_MSG_CMD, struct dm_ioctl)`.
pub const DM_TARGET_MSG: u32 = iowr(DM_IOCTL, DM_TARGET_MSG_CMD, DM_IOCTL_SIZE);
/// `DM_DEV_SET_GEOMETRY`: `_IOWR(DM_IOCTL, DM_DEV_SET_GEOMETRY_CMD, struct dm_ioctl)`.
pub const DM_DEV_SET_GEOMETRY: u32 = iowr(DM_IOCTL, DM_DEV_SET_GEOMETRY_CMD, DM_IOCTL_SIZE);
/// `DM_DEV_ARM_POLL`: `_IOWR(DM_IOCTL, DM_DEV_ARM_POLL_CMD, struct dm_ioctl)`.
pub const DM_DEV_ARM_POLL: u32 = iowr(DM_IOCTL, DM_DEV_ARM_POLL_CMD, DM_IOCTL_SIZE);
/// `DM_GET_TARGET_VERSION`: `_IOWR(DM_IOCTL, DM_GET_TARGET_VERSION_CMD, struct dm_ioctl)`.
pub const DM_GET_TARGET_VERSION: u32 = iowr(DM_IOCTL, DM_GET_TARGET_VERSION_CMD, DM_IOCTL_SIZE);
/// `DM_MPATH_PROBE_PATHS`: `_IO(DM_IOCTL, DM_MPATH_PROBE_PATHS_CMD)`.
///
/// Unlike the others this is a *block-device* ioctl, issued on a dm-multipath map's own
/// node (`/dev/dm-N`): it reads from each active path of the current path group, fails the
/// ones that error, and returns `ENOTCONN` if no valid path is left. Interface 4.50+.
pub const DM_MPATH_PROBE_PATHS: u32 = io(DM_IOCTL, DM_MPATH_PROBE_PATHS_CMD);

// Flags of dm_ioctl.flags ("Status bits" in <linux/dm-ioctl.h>).

/// `DM_READONLY_FLAG` (in/out): the device is (to be) read-only.
pub const DM_READONLY_FLAG: u32 = 1 << 0;
/// `DM_SUSPEND_FLAG` (in/out): suspend with DEV_SUSPEND; out, the device is suspended.
pub const DM_SUSPEND_FLAG: u32 = 1 << 1;
/// `DM_PERSISTENT_DEV_FLAG` (in): create with the device number given in `dev`.
pub const DM_PERSISTENT_DEV_FLAG: u32 = 1 << 3;
/// `DM_STATUS_TABLE_FLAG` (in): TABLE_STATUS returns the table instead of the status.
pub const DM_STATUS_TABLE_FLAG: u32 = 1 << 4;
/// `DM_ACTIVE_PRESENT_FLAG` (out): a live table is loaded.
pub const DM_ACTIVE_PRESENT_FLAG: u32 = 1 << 5;
/// `DM_INACTIVE_PRESENT_FLAG` (out): an inactive table is loaded.
pub const DM_INACTIVE_PRESENT_FLAG: u32 = 1 << 6;
/// `DM_BUFFER_FULL_FLAG` (out): the buffer was too small; enlarge it and retry.
pub const DM_BUFFER_FULL_FLAG: u32 = 1 << 8;
/// `DM_SKIP_BDGET_FLAG` (in): ignored by current kernels.
pub const DM_SKIP_BDGET_FLAG: u32 = 1 << 9;
/// `DM_SKIP_LOCKFS_FLAG` (in): do not freeze filesystems when suspending.
pub const DM_SKIP_LOCKFS_FLAG: u32 = 1 << 10;
/// `DM_NOFLUSH_FLAG` (in): suspend without flushing queued I/O.
pub const DM_NOFLUSH_FLAG: u32 = 1 << 11;
/// `DM_QUERY_INACTIVE_TABLE_FLAG` (in): table information refers to the inactive table.
pub const DM_QUERY_INACTIVE_TABLE_FLAG: u32 = 1 << 12;
/// `DM_UEVENT_GENERATED_FLAG` (out): the call generated a uevent.
pub const DM_UEVENT_GENERATED_FLAG: u32 = 1 << 13;
/// `DM_UUID_FLAG` (in): RENAME sets the uuid; LIST_DEVICES also returns uuids (5.13+).
pub const DM_UUID_FLAG: u32 = 1 << 14;
/// `DM_SECURE_DATA_FLAG` (in): wipe kernel buffers after use (key material).
pub const DM_SECURE_DATA_FLAG: u32 = 1 << 15;
/// `DM_DATA_OUT_FLAG` (out): TARGET_MSG produced output at `data_start`.
pub const DM_DATA_OUT_FLAG: u32 = 1 << 16;
/// `DM_DEFERRED_REMOVE` (in/out): remove on last close if busy; out, removal is pending.
/// (The header spells it without `_FLAG`.)
pub const DM_DEFERRED_REMOVE: u32 = 1 << 17;
/// `DM_INTERNAL_SUSPEND_FLAG` (out): the device is suspended internally.
pub const DM_INTERNAL_SUSPEND_FLAG: u32 = 1 << 18;
/// `DM_IMA_MEASUREMENT_FLAG` (in): return the table data IMA would measure (5.15+).
pub const DM_IMA_MEASUREMENT_FLAG: u32 = 1 << 19;

// udev cookies: <libdevmapper.h>. Not kernel ABI, but the kernel copies the cookie from
// dm_ioctl.event_nr into the DM_COOKIE uevent variable, and udev rules (10-dm.rules,
// 95-dm-notify.rules) interpret the flag half of it.

/// `DM_COOKIE_MAGIC`: the upper 16 bits of a libdm semaphore key (`0x0D4D << 16 | base`).
pub const DM_COOKIE_MAGIC: u32 = 0x0D4D;
/// `DM_UDEV_FLAGS_MASK`: the bits of `event_nr` that carry `DM_UDEV_*` flags.
pub const DM_UDEV_FLAGS_MASK: u32 = 0xFFFF_0000;
/// `DM_UDEV_FLAGS_SHIFT`: `event_nr = (udev_flags << 16) | cookie_base`.
pub const DM_UDEV_FLAGS_SHIFT: u32 = 16;
/// `DM_UDEV_DISABLE_DM_RULES_FLAG`: skip the `/dev/mapper` symlink rules.
pub const DM_UDEV_DISABLE_DM_RULES_FLAG: u32 = 0x0001;
/// `DM_UDEV_DISABLE_SUBSYSTEM_RULES_FLAG`: skip subsystem (LVM, multipath, ...) rules.
pub const DM_UDEV_DISABLE_SUBSYSTEM_RULES_FLAG: u32 = 0x0002;
/// `DM_UDEV_DISABLE_DISK_RULES_FLAG`: skip the `/dev/disk/by-*` rules.
pub const DM_UDEV_DISABLE_DISK_RULES_FLAG: u32 = 0x0004;
/// `DM_UDEV_DISABLE_OTHER_RULES_FLAG`: skip all other rules.
pub const DM_UDEV_DISABLE_OTHER_RULES_FLAG: u32 = 0x0008;
/// `DM_UDEV_LOW_PRIORITY_FLAG`: lower link priority.
pub const DM_UDEV_LOW_PRIORITY_FLAG: u32 = 0x0010;
/// `DM_UDEV_DISABLE_LIBRARY_FALLBACK`: libdm must not create nodes itself.
pub const DM_UDEV_DISABLE_LIBRARY_FALLBACK: u32 = 0x0020;
/// `DM_UDEV_PRIMARY_SOURCE_FLAG`: a real (libdm-originated) event; libdm sets it on
/// RESUME, REMOVE and RENAME.
pub const DM_UDEV_PRIMARY_SOURCE_FLAG: u32 = 0x0040;
/// `DM_SUBSYSTEM_UDEV_FLAG0`: first of eight flags reserved for dm subsystems.
pub const DM_SUBSYSTEM_UDEV_FLAG0: u32 = 0x0100;
/// `DM_SUBSYSTEM_UDEV_FLAG1` (multipath-tools' `MPATH_UDEV_NO_KPARTX_FLAG`).
pub const DM_SUBSYSTEM_UDEV_FLAG1: u32 = 0x0200;
/// `DM_SUBSYSTEM_UDEV_FLAG2`.
pub const DM_SUBSYSTEM_UDEV_FLAG2: u32 = 0x0400;
/// `DM_SUBSYSTEM_UDEV_FLAG3`.
pub const DM_SUBSYSTEM_UDEV_FLAG3: u32 = 0x0800;
/// `DM_SUBSYSTEM_UDEV_FLAG4`.
pub const DM_SUBSYSTEM_UDEV_FLAG4: u32 = 0x1000;
/// `DM_SUBSYSTEM_UDEV_FLAG5`.
pub const DM_SUBSYSTEM_UDEV_FLAG5: u32 = 0x2000;
/// `DM_SUBSYSTEM_UDEV_FLAG6`.
pub const DM_SUBSYSTEM_UDEV_FLAG6: u32 = 0x4000;
/// `DM_SUBSYSTEM_UDEV_FLAG7`.
pub const DM_SUBSYSTEM_UDEV_FLAG7: u32 = 0x8000;

// Sizes and offsets, as in <linux/dm-ioctl.h>. The offsets are the same on every Linux
// architecture. Alignment follows the C ABI's alignment of __u64, which is 4 on i386 (and
// Rust's u64 matches it there), so the one size that depends on tail padding,
// sizeof(struct dm_name_list), is 16 on 64-bit ABIs but 12 on i386.
#[allow(
    dead_code,
    reason = "used only by the asserts below; rustc 1.85 does not count those"
)]
const U64_ALIGN: usize = align_of::<u64>();
const _: () = assert!(size_of::<dm_ioctl>() == 312);
const _: () = assert!(align_of::<dm_ioctl>() == U64_ALIGN);
const _: () = assert!(offset_of!(dm_ioctl, version) == 0);
const _: () = assert!(offset_of!(dm_ioctl, data_size) == 12);
const _: () = assert!(offset_of!(dm_ioctl, data_start) == 16);
const _: () = assert!(offset_of!(dm_ioctl, target_count) == 20);
const _: () = assert!(offset_of!(dm_ioctl, open_count) == 24);
const _: () = assert!(offset_of!(dm_ioctl, flags) == 28);
const _: () = assert!(offset_of!(dm_ioctl, event_nr) == 32);
const _: () = assert!(offset_of!(dm_ioctl, padding) == 36);
const _: () = assert!(offset_of!(dm_ioctl, dev) == 40);
const _: () = assert!(offset_of!(dm_ioctl, name) == 48);
const _: () = assert!(offset_of!(dm_ioctl, uuid) == 176);
const _: () = assert!(offset_of!(dm_ioctl, data) == 305);

const _: () = assert!(size_of::<dm_target_spec>() == 40);
const _: () = assert!(offset_of!(dm_target_spec, sector_start) == 0);
const _: () = assert!(offset_of!(dm_target_spec, length) == 8);
const _: () = assert!(offset_of!(dm_target_spec, status) == 16);
const _: () = assert!(offset_of!(dm_target_spec, next) == 20);
const _: () = assert!(offset_of!(dm_target_spec, target_type) == 24);
const _: () = assert!(DM_TARGET_SPEC_PARAMS_OFFSET == 40);

const _: () = assert!(size_of::<dm_target_deps>() == 8);
const _: () = assert!(offset_of!(dm_target_deps, count) == 0);
const _: () = assert!(offset_of!(dm_target_deps, padding) == 4);
const _: () = assert!(DM_TARGET_DEPS_DEV_OFFSET == 8);

const _: () = assert!(size_of::<dm_name_list>() == if U64_ALIGN == 8 { 16 } else { 12 });
const _: () = assert!(align_of::<dm_name_list>() == U64_ALIGN);
const _: () = assert!(offset_of!(dm_name_list, dev) == 0);
const _: () = assert!(offset_of!(dm_name_list, next) == 8);
const _: () = assert!(DM_NAME_LIST_NAME_OFFSET == offset_of!(dm_name_list, next) + 4);

const _: () = assert!(size_of::<dm_target_versions>() == 16);
const _: () = assert!(offset_of!(dm_target_versions, next) == 0);
const _: () = assert!(offset_of!(dm_target_versions, version) == 4);
const _: () = assert!(DM_TARGET_VERSIONS_NAME_OFFSET == 16);

const _: () = assert!(size_of::<dm_target_msg>() == 8);
const _: () = assert!(offset_of!(dm_target_msg, sector) == 0);
const _: () = assert!(DM_TARGET_MSG_MESSAGE_OFFSET == 8);

// _IOWR numbers are the same on every architecture: READ|WRITE is 3 << 30 in the generic
// layout and 6 << 29 in the powerpc/mips/sparc one, both 0xC000_0000.
const _: () = assert!(DM_VERSION == 0xC138_FD00);
const _: () = assert!(DM_REMOVE_ALL == 0xC138_FD01);
const _: () = assert!(DM_LIST_DEVICES == 0xC138_FD02);
const _: () = assert!(DM_DEV_CREATE == 0xC138_FD03);
const _: () = assert!(DM_DEV_REMOVE == 0xC138_FD04);
const _: () = assert!(DM_DEV_RENAME == 0xC138_FD05);
const _: () = assert!(DM_DEV_SUSPEND == 0xC138_FD06);
const _: () = assert!(DM_DEV_STATUS == 0xC138_FD07);
const _: () = assert!(DM_DEV_WAIT == 0xC138_FD08);
const _: () = assert!(DM_TABLE_LOAD == 0xC138_FD09);
const _: () = assert!(DM_TABLE_CLEAR == 0xC138_FD0A);
const _: () = assert!(DM_TABLE_DEPS == 0xC138_FD0B);
const _: () = assert!(DM_TABLE_STATUS == 0xC138_FD0C);
const _: () = assert!(DM_LIST_VERSIONS == 0xC138_FD0D);
const _: () = assert!(DM_TARGET_MSG == 0xC138_FD0E);
const _: () = assert!(DM_DEV_SET_GEOMETRY == 0xC138_FD0F);
const _: () = assert!(DM_DEV_ARM_POLL == 0xC138_FD10);
const _: () = assert!(DM_GET_TARGET_VERSION == 0xC138_FD11);

#[cfg(any(
    target_arch = "x86_64",
    target_arch = "x86",
    target_arch = "aarch64",
    target_arch = "arm",
    target_arch = "riscv64"
))]
const _: () = assert!(DM_MPATH_PROBE_PATHS == 0xfd12);
#[cfg(any(target_arch = "powerpc", target_arch = "powerpc64"))]
const _: () = assert!(DM_MPATH_PROBE_PATHS == 0x2000_fd12);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeroed_is_all_zero_and_default() {
        let h = dm_ioctl::zeroed();
        assert_eq!(h, dm_ioctl::default());
        assert!(h.name.iter().chain(h.uuid.iter()).all(|&b| b == 0));
        assert_eq!(h.version, [0; 3]);
        assert_eq!(dm_target_spec::default().target_type, [0; DM_MAX_TYPE_NAME]);
    }

    #[test]
    fn flags_are_distinct_bits() {
        let flags = [
            DM_READONLY_FLAG,
            DM_SUSPEND_FLAG,
            DM_PERSISTENT_DEV_FLAG,
            DM_STATUS_TABLE_FLAG,
            DM_ACTIVE_PRESENT_FLAG,
            DM_INACTIVE_PRESENT_FLAG,
            DM_BUFFER_FULL_FLAG,
            DM_SKIP_BDGET_FLAG,
            DM_SKIP_LOCKFS_FLAG,
            DM_NOFLUSH_FLAG,
            DM_QUERY_INACTIVE_TABLE_FLAG,
            DM_UEVENT_GENERATED_FLAG,
            DM_UUID_FLAG,
            DM_SECURE_DATA_FLAG,
            DM_DATA_OUT_FLAG,
            DM_DEFERRED_REMOVE,
            DM_INTERNAL_SUSPEND_FLAG,
            DM_IMA_MEASUREMENT_FLAG,
        ];
        let mut seen = 0u32;
        for f in flags {
            assert_eq!(f.count_ones(), 1, "{f:#x}");
            assert_eq!(seen & f, 0, "{f:#x} repeated");
            seen |= f;
        }
    }

    #[test]
    fn udev_flags_fit_the_flag_half_of_event_nr() {
        let all = DM_UDEV_DISABLE_DM_RULES_FLAG
            | DM_UDEV_DISABLE_SUBSYSTEM_RULES_FLAG
            | DM_UDEV_DISABLE_DISK_RULES_FLAG
            | DM_UDEV_DISABLE_OTHER_RULES_FLAG
            | DM_UDEV_LOW_PRIORITY_FLAG
            | DM_UDEV_DISABLE_LIBRARY_FALLBACK
            | DM_UDEV_PRIMARY_SOURCE_FLAG
            | DM_SUBSYSTEM_UDEV_FLAG0
            | DM_SUBSYSTEM_UDEV_FLAG1
            | DM_SUBSYSTEM_UDEV_FLAG2
            | DM_SUBSYSTEM_UDEV_FLAG3
            | DM_SUBSYSTEM_UDEV_FLAG4
            | DM_SUBSYSTEM_UDEV_FLAG5
            | DM_SUBSYSTEM_UDEV_FLAG6
            | DM_SUBSYSTEM_UDEV_FLAG7;
        assert_eq!(all, 0xFF7F);
        assert_eq!(all << DM_UDEV_FLAGS_SHIFT, (all << 16) & DM_UDEV_FLAGS_MASK);
        assert_eq!(DM_COOKIE_MAGIC << DM_UDEV_FLAGS_SHIFT, 0x0D4D_0000);
    }
}

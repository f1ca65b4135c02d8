//! Kernel uevents over netlink: `NETLINK_KOBJECT_UEVENT` from `<linux/netlink.h>`, limits
//! from the kernel's `<linux/kobject.h>` (not uapi), and the libudev re-broadcast header
//! (`struct monitor_netlink_header` in systemd's `sd-device/device-monitor.c`, not a header
//! file at all). Constants only; no socket code.
//!
//! A listener opens `socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_KOBJECT_UEVENT)` and
//! binds a `sockaddr_nl` with `nl_groups = UEVENT_GROUP_KERNEL` (raw kernel events, no root
//! needed) or `UEVENT_GROUP_UDEV` (udevd's processed events). Kernel datagrams have no
//! `nlmsghdr`: `"ACTION@DEVPATH\0"` then `KEY=VALUE\0` pairs. udev datagrams start with the
//! 40-byte libudev header described by the `LIBUDEV_*` constants. Only accept datagrams whose
//! sender `nl_pid` is 0 (the kernel).
//!
//! The socket-option numbers differ by architecture (`SO_PASSCRED` is 16 generic, 17 on mips,
//! 20 on powerpc, 2 on sparc), so they are re-exported from `libc`, which has per-arch values.

use libc::c_int;

/// `AF_NETLINK` (16), re-exported from `libc`.
pub const AF_NETLINK: c_int = libc::AF_NETLINK;
/// `NETLINK_KOBJECT_UEVENT`: the netlink protocol carrying kobject uevents.
pub const NETLINK_KOBJECT_UEVENT: c_int = 15;
/// `NETLINK_NO_ENOBUFS` (`SOL_NETLINK` option): suppresses `ENOBUFS` on overflow. Listed so
/// callers can recognise it; do not set it, lost events must be noticed.
pub const NETLINK_NO_ENOBUFS: c_int = 5;
/// `SOL_NETLINK` (270): socket level of netlink options, re-exported from `libc`.
pub const SOL_NETLINK: c_int = libc::SOL_NETLINK;

/// Multicast group of raw kernel uevents (`nl_groups` bit 0).
pub const UEVENT_GROUP_KERNEL: u32 = 1;
/// Multicast group of udevd's re-broadcast events, sent after rule processing (bit 1).
pub const UEVENT_GROUP_UDEV: u32 = 2;

/// The kernel's `UEVENT_BUFFER_SIZE` (2048): the most bytes of `KEY=VALUE\0` data one
/// kernel uevent can carry (kernel-internal, `<linux/kobject.h>`).
pub const UEVENT_KERNEL_BUFFER_SIZE: usize = 2048;
/// The kernel's `UEVENT_NUM_ENVP` (64): the most variables one kernel uevent can carry.
pub const UEVENT_NUM_ENVP: usize = 64;
/// Suggested receive buffer for one datagram (8 KiB): room for the kernel's
/// [`UEVENT_KERNEL_BUFFER_SIZE`] plus the `ACTION@DEVPATH` header and for udev's larger
/// re-broadcasts. Note: *not* the kernel's macro of the same name, which is 2048.
pub const UEVENT_BUFFER_SIZE: usize = 8192;

/// `SO_PASSCRED`, re-exported from `libc` (16 on x86_64): receive `SCM_CREDENTIALS` with
/// each datagram, to check that the sender's uid is 0.
pub const SO_PASSCRED: c_int = libc::SO_PASSCRED;
/// `SO_RCVBUFFORCE`, re-exported from `libc` (33 on x86_64): set the receive queue size
/// beyond `rmem_max` (needs CAP_NET_ADMIN).
pub const SO_RCVBUFFORCE: c_int = libc::SO_RCVBUFFORCE;
/// `SO_RCVBUF`, re-exported from `libc` (8 on x86_64): receive queue size, capped by
/// `net.core.rmem_max`.
pub const SO_RCVBUF: c_int = libc::SO_RCVBUF;

/// Prefix of a udev-monitor datagram: `"libudev\0"` (8 bytes at offset 0).
pub const LIBUDEV_PREFIX: &[u8; 8] = b"libudev\0";
/// `UDEV_MONITOR_MAGIC`: stored big-endian (`htobe32`) at [`LIBUDEV_MAGIC_OFFSET`].
pub const LIBUDEV_MAGIC: u32 = 0xfeed_cafe;
/// Size of the udev-monitor header: 8-byte prefix and eight `u32`s.
pub const LIBUDEV_HEADER_SIZE: usize = 40;
/// Offset of the big-endian magic.
pub const LIBUDEV_MAGIC_OFFSET: usize = 8;
/// Offset of `header_size` (host byte order).
pub const LIBUDEV_HEADER_SIZE_OFFSET: usize = 12;
/// Offset of `properties_off` (host byte order): where the `KEY=VALUE\0` pairs start.
pub const LIBUDEV_PROPERTIES_OFF_OFFSET: usize = 16;
/// Offset of `properties_len` (host byte order).
pub const LIBUDEV_PROPERTIES_LEN_OFFSET: usize = 20;
/// Offset of `filter_subsystem_hash` (big-endian).
pub const LIBUDEV_FILTER_SUBSYSTEM_HASH_OFFSET: usize = 24;
/// Offset of `filter_devtype_hash` (big-endian).
pub const LIBUDEV_FILTER_DEVTYPE_HASH_OFFSET: usize = 28;
/// Offset of `filter_tag_bloom_hi` (big-endian).
pub const LIBUDEV_FILTER_TAG_BLOOM_HI_OFFSET: usize = 32;
/// Offset of `filter_tag_bloom_lo` (big-endian).
pub const LIBUDEV_FILTER_TAG_BLOOM_LO_OFFSET: usize = 36;

const _: () = assert!(LIBUDEV_HEADER_SIZE == LIBUDEV_PREFIX.len() + 8 * 4);
const _: () = assert!(LIBUDEV_FILTER_TAG_BLOOM_LO_OFFSET + 4 == LIBUDEV_HEADER_SIZE);
const _: () = assert!(UEVENT_BUFFER_SIZE > UEVENT_KERNEL_BUFFER_SIZE);
const _: () = assert!(AF_NETLINK == 16);
const _: () = assert!(SOL_NETLINK == 270);

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
const _: () = assert!(SO_PASSCRED == 16 && SO_RCVBUFFORCE == 33 && SO_RCVBUF == 8);

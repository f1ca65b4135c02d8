//! Block-device ioctls from `<linux/fs.h>` (type `0x12`), issued on an open `/dev/sdX`,
//! `/dev/dm-N` or similar node.
//!
//! The old ones are `_IO()` even though they take a pointer; the newer ones that were
//! declared `_IOR(0x12, n, size_t)` encode `sizeof(size_t)`, not the size of what they write:
//! `BLKGETSIZE64` writes a `u64` everywhere but is `0x8008_1272` on 64-bit ABIs and
//! `0x8004_1272` on 32-bit ones (x86_64 kernels accept both from x32/compat callers).

use crate::ioctl::{io, ior};

/// `BLKROSET`: `_IO(0x12, 93)`; set read-only from an `int*` (CAP_SYS_ADMIN).
pub const BLKROSET: u32 = io(0x12, 93);
/// `BLKROGET`: `_IO(0x12, 94)`; read-only state into an `int*`.
pub const BLKROGET: u32 = io(0x12, 94);
/// `BLKRRPART`: `_IO(0x12, 95)`; re-read the partition table (CAP_SYS_ADMIN; `EINVAL` on
/// a partition or a dm device, `EBUSY` while a partition is open).
pub const BLKRRPART: u32 = io(0x12, 95);
/// `BLKGETSIZE`: `_IO(0x12, 96)`; size in 512-byte sectors into an `unsigned long*`
/// (`EFBIG` if it does not fit).
pub const BLKGETSIZE: u32 = io(0x12, 96);
/// `BLKFLSBUF`: `_IO(0x12, 97)`; write back dirty pages (or sync the mounted filesystem)
/// and drop the clean page cache of the device (CAP_SYS_ADMIN). Sends no device cache
/// flush: pair it with `fsync`.
pub const BLKFLSBUF: u32 = io(0x12, 97);
/// `BLKSSZGET`: `_IO(0x12, 104)`; logical block size into an `int*`.
pub const BLKSSZGET: u32 = io(0x12, 104);
/// `BLKBSZGET`: `_IOR(0x12, 112, size_t)`; soft block size into an `int*`.
pub const BLKBSZGET: u32 = ior(0x12, 112, size_of::<usize>());
/// `BLKGETSIZE64`: `_IOR(0x12, 114, size_t)`; size in bytes into a `u64*`. Encoded with
/// `sizeof(size_t)`, not 8.
pub const BLKGETSIZE64: u32 = ior(0x12, 114, size_of::<usize>());
/// `BLKDISCARD`: `_IO(0x12, 119)`; discard the byte range given as `u64[2]`
/// (start, length). Destroys data.
pub const BLKDISCARD: u32 = io(0x12, 119);
/// `BLKIOMIN`: `_IO(0x12, 120)`; minimum I/O size into a `uint*`.
pub const BLKIOMIN: u32 = io(0x12, 120);
/// `BLKIOOPT`: `_IO(0x12, 121)`; optimal I/O size into a `uint*`.
pub const BLKIOOPT: u32 = io(0x12, 121);
/// `BLKPBSZGET`: `_IO(0x12, 123)`; physical block size into a `uint*`.
pub const BLKPBSZGET: u32 = io(0x12, 123);
/// `BLKGETDISKSEQ`: `_IOR(0x12, 128, __u64)`; the disk sequence number (Linux 5.15+), which
/// tells a re-used device name apart from the disk that had it before.
pub const BLKGETDISKSEQ: u32 = ior(0x12, 128, size_of::<u64>());

#[cfg(all(target_arch = "x86_64", target_pointer_width = "64"))]
mod x86_64_values {
    use super::*;
    // Values from research/kernel.md §2 and <linux/fs.h> on x86_64.
    const _: () = assert!(BLKROSET == 0x125d);
    const _: () = assert!(BLKROGET == 0x125e);
    const _: () = assert!(BLKRRPART == 0x125f);
    const _: () = assert!(BLKGETSIZE == 0x1260);
    const _: () = assert!(BLKFLSBUF == 0x1261);
    const _: () = assert!(BLKSSZGET == 0x1268);
    const _: () = assert!(BLKBSZGET == 0x8008_1270);
    const _: () = assert!(BLKGETSIZE64 == 0x8008_1272);
    const _: () = assert!(BLKDISCARD == 0x1277);
    const _: () = assert!(BLKIOMIN == 0x1278);
    const _: () = assert!(BLKIOOPT == 0x1279);
    const _: () = assert!(BLKPBSZGET == 0x127b);
    const _: () = assert!(BLKGETDISKSEQ == 0x8008_1280);
}

#[cfg(all(
    any(target_arch = "x86", target_arch = "arm"),
    target_pointer_width = "32"
))]
const _: () = assert!(BLKGETSIZE64 == 0x8004_1272);

#[cfg(target_arch = "powerpc64")]
mod powerpc64_values {
    use super::*;
    // _IO() carries _IOC_NONE = 1 << 29 and _IOR() is 2 << 29 on powerpc.
    const _: () = assert!(BLKFLSBUF == 0x2000_1261);
    const _: () = assert!(BLKGETSIZE64 == 0x4008_1272);
}

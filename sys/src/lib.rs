//! Raw Linux kernel ABI used by lunkit: no logic, only layouts and numbers.
//!
//! | module | mirrors | contents |
//! |---|---|---|
//! | [`ioctl`] | `<asm-generic/ioctl.h>`, `arch/*/include/uapi/asm/ioctl.h` | `_IOC`/`_IO`/`_IOR`/`_IOW`/`_IOWR` as `const fn`, per-architecture bit layout |
//! | [`dm`] | `<linux/dm-ioctl.h>`, `<libdevmapper.h>` (udev cookie flags) | `dm_ioctl`, `dm_target_spec`, `dm_target_deps`, `dm_name_list`, `dm_target_versions`, `dm_target_msg`; `DM_*` commands, opcodes and flags |
//! | [`block`] | `<linux/fs.h>` | `BLK*` opcodes (`BLKFLSBUF`, `BLKGETSIZE64`, ...) |
//! | [`loop_dev`] | `<linux/loop.h>` | `loop_info64`, `loop_config`, `LOOP_*` opcodes, `LO_FLAGS_*` |
//! | [`netlink`] | `<linux/netlink.h>`, kernel `kobject.h`, systemd's monitor header | uevent socket protocol, groups, limits, libudev header layout |
//! | [`nvme`] | `<linux/nvme_ioctl.h>` | `nvme_passthru_cmd`, `NVME_IOCTL_ADMIN_CMD`, the Identify opcode and CNS |
//! | [`pr`] | `<linux/pr.h>` | `pr_registration`, `pr_reservation`, `pr_preempt`, `pr_clear`, `IOC_PR_*`, `PR_FL_IGNORE_KEY`, the `pr_type` and `PR_STS_*` values |
//! | [`sg`] | `<scsi/sg.h>` | `sg_io_hdr`, `SG_IO`, `SG_DXFER_*`, `SG_INFO_*` |
//!
//! # Why handwritten
//!
//! The usual route, bindgen over `<linux/dm-ioctl.h>` (as `devicemapper-sys` does with
//! `<libdevmapper.h>`), needs libclang, and in that crate also libdevmapper and pkg-config,
//! at build time. `linux-raw-sys` has the opcodes but not the device-mapper structs. These
//! structures are small and have been stable since interface 4.0, so they are written by
//! hand here and pinned three ways:
//!
//! 1. `const _: () = assert!(..)` on every struct size and field offset (and on the x86_64
//!    value of every opcode), so a wrong layout does not compile;
//! 2. the opcodes are computed with the [`ioctl`] encoders from the same inputs as the C
//!    macros, so they are right on architectures with another `_IOC` layout (powerpc, mips,
//!    sparc) and with a 32-bit `size_t`;
//! 3. `tests/sys_abi_c.rs` (in the root crate) compiles a C program against the installed
//!    kernel headers and compares every size, offset, opcode and flag with the values here.
//!
//! # Conventions
//!
//! - Struct and field names are the C ones (hence `#[allow(non_camel_case_types)]`);
//!   `char[]` fields are `[u8; N]`.
//! - Structs whose C definition ends in a flexible array member (`name[]`, `dev[]`,
//!   `message[]`) contain only the fixed header; the array's offset is a `*_OFFSET` constant.
//!   Callers read the trailing data from their buffer at that offset, bounds-checked.
//! - Opcodes are `u32` request numbers (what `rustix::ioctl::Opcode` and the kernel use).
//! - Every struct has an all-zero constructor (`zeroed()` where `Default` cannot be derived).
//!
//! The crate is `#![no_std]` and contains no `unsafe`.
#![no_std]
#![deny(missing_docs)]
#![forbid(unsafe_code)]

#[cfg(test)]
extern crate std;

pub mod block;
pub mod dm;
pub mod ioctl;
pub mod loop_dev;
pub mod netlink;
pub mod nvme;
pub mod pr;
pub mod sg;

//! The library's only `unsafe`: raw ioctls on block devices (SCSI passthrough among them),
//! `/dev/mapper/control` and NVMe controllers, and one `getsockopt` ([`so_peercred`]).
//!
//! Each function issues exactly one call (the ioctls through [`rustix::ioctl`]) and returns
//! what the kernel returned; the callers (`dm`, block operations, the multipathd client) own
//! all decoding and error context.
//! Opcodes come from `lunkit-sys`, which computes them per architecture.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::AsFd;

use lunkit_sys::block::{BLKFLSBUF, BLKGETSIZE64, BLKRRPART, BLKSSZGET};
use lunkit_sys::dm::dm_ioctl;
use lunkit_sys::loop_dev::{LOOP_GET_STATUS64, loop_info64};
use lunkit_sys::nvme::{
    NVME_ADMIN_GET_LOG_PAGE, NVME_ADMIN_IDENTIFY, NVME_ID_CNS_NS, NVME_IDENTIFY_DATA_SIZE,
    NVME_IOCTL_ADMIN_CMD, nvme_passthru_cmd,
};
use lunkit_sys::sg::{SG_DXFER_FROM_DEV, SG_DXFER_NONE, SG_INTERFACE_ID_ORIG, SG_IO, sg_io_hdr};
use rustix::ioctl::{Getter, Ioctl, IoctlOutput, NoArg, Opcode, Updater, ioctl};

/// `ioctl(fd, BLKFLSBUF)` — writes back the block device's page cache (or syncs the mounted
/// filesystem on it) and drops its clean pages. Needs `CAP_SYS_ADMIN`; sends no cache flush
/// to the device (use `fsync` for that).
#[allow(dead_code, reason = "for the block module (flush, size, rescan)")]
pub(crate) fn blkflsbuf(fd: impl AsFd) -> io::Result<()> {
    // SAFETY: BLKFLSBUF takes no argument and touches no user memory.
    let req = unsafe { NoArg::<{ BLKFLSBUF as Opcode }>::new() };
    // SAFETY: `req` carries the opcode with the argument type the kernel expects (none).
    unsafe { ioctl(fd, req) }.map_err(io::Error::from)
}

/// `ioctl(fd, BLKRRPART)` — asks the kernel to re-read the partition table. Needs
/// `CAP_SYS_ADMIN`; `EBUSY` while a partition is open, `EINVAL` on a partition or dm disk.
#[allow(dead_code, reason = "for the block module (flush, size, rescan)")]
pub(crate) fn blkrrpart(fd: impl AsFd) -> io::Result<()> {
    // SAFETY: BLKRRPART takes no argument and touches no user memory.
    let req = unsafe { NoArg::<{ BLKRRPART as Opcode }>::new() };
    // SAFETY: `req` carries the opcode with the argument type the kernel expects (none).
    unsafe { ioctl(fd, req) }.map_err(io::Error::from)
}

/// `ioctl(fd, BLKGETSIZE64, &u64)` — the device's size in bytes.
///
/// The opcode is `_IOR(0x12, 114, size_t)` but the kernel always writes a `u64`
/// (`lunkit-sys` encodes the `size_t` width of the target).
#[allow(dead_code, reason = "for the block module (flush, size, rescan)")]
pub(crate) fn blkgetsize64(fd: impl AsFd) -> io::Result<u64> {
    // SAFETY: BLKGETSIZE64 writes exactly one u64 through its pointer argument.
    let req = unsafe { Getter::<{ BLKGETSIZE64 as Opcode }, u64>::new() };
    // SAFETY: the getter hands the kernel a pointer to a u64 it owns.
    unsafe { ioctl(fd, req) }.map_err(io::Error::from)
}

/// `ioctl(fd, BLKSSZGET, &int)` — the logical block (sector) size in bytes.
#[allow(dead_code, reason = "for the block module (flush, size, rescan)")]
pub(crate) fn blksszget(fd: impl AsFd) -> io::Result<u32> {
    // SAFETY: BLKSSZGET writes exactly one C `int` through its pointer argument.
    let req = unsafe { Getter::<{ BLKSSZGET as Opcode }, libc::c_int>::new() };
    // SAFETY: the getter hands the kernel a pointer to a c_int it owns.
    let size = unsafe { ioctl(fd, req) }.map_err(io::Error::from)?;
    u32::try_from(size).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// `ioctl(fd, LOOP_GET_STATUS64, &loop_info64)` on an open `/dev/loopN` — what backs the loop
/// device: the backing file's filesystem device (`lo_device`), inode (`lo_inode`) and, when
/// the backing file is a device node, that device's number (`lo_rdevice`). `ENXIO` when no
/// file is bound.
pub(crate) fn loop_get_status64(fd: impl AsFd) -> io::Result<loop_info64> {
    // SAFETY: LOOP_GET_STATUS64 writes exactly one `struct loop_info64` through its pointer
    // argument; lunkit-sys checks the struct's size and layout against the C header.
    let req = unsafe { Getter::<{ LOOP_GET_STATUS64 as Opcode }, loop_info64>::new() };
    // SAFETY: the getter hands the kernel a pointer to a loop_info64 it owns.
    unsafe { ioctl(fd, req) }.map_err(io::Error::from)
}

/// `ioctl(ctrl_fd, NVME_IOCTL_ADMIN_CMD, &cmd)` with Identify (CNS 0) for namespace `nsid`,
/// on an open NVMe controller character device (`/dev/nvmeN`): the Identify Namespace data
/// structure, as the controller returned it (4096 bytes; the caller decodes it). Needs
/// `CAP_SYS_ADMIN`. The kernel waits for the command's completion, for as long as its admin
/// timeout allows; callers bound the call.
pub(crate) fn nvme_identify_ns(
    ctrl_fd: impl AsFd,
    nsid: u32,
) -> io::Result<Box<[u8; NVME_IDENTIFY_DATA_SIZE]>> {
    let mut data = Box::new([0u8; NVME_IDENTIFY_DATA_SIZE]);
    let mut cmd = nvme_passthru_cmd {
        opcode: NVME_ADMIN_IDENTIFY,
        nsid,
        addr: data.as_mut_ptr() as u64,
        data_len: NVME_IDENTIFY_DATA_SIZE as u32,
        cdw10: NVME_ID_CNS_NS,
        ..nvme_passthru_cmd::default()
    };
    // SAFETY: NVME_IOCTL_ADMIN_CMD reads and writes back exactly one `nvme_passthru_cmd`
    // through its pointer argument; lunkit-sys checks the struct against the C header.
    let req =
        unsafe { Updater::<{ NVME_IOCTL_ADMIN_CMD as Opcode }, nvme_passthru_cmd>::new(&mut cmd) };
    // SAFETY: besides `cmd`, the kernel writes at most `data_len` bytes at `addr`, which is
    // `data`: a live heap allocation of exactly that many bytes that nothing else touches
    // until the call returns. `metadata` is 0, so no other user memory is involved.
    unsafe { ioctl(ctrl_fd, req) }.map_err(io::Error::from)?;
    Ok(data)
}

/// `ioctl(ctrl_fd, NVME_IOCTL_ADMIN_CMD, &cmd)` with Get Log Page for log `lid`, reading
/// `buf.len()` bytes from byte `offset` of the log into `buf`, on an open NVMe controller
/// character device (`/dev/nvmeN`). Retain Asynchronous Event is clear: the read
/// acknowledges the log's change event, so the controller can raise the next one. `EINVAL`
/// (without a call) unless `buf` is 4 bytes to 16 MiB and `offset` and `buf.len()` are
/// multiples of 4. Needs `CAP_SYS_ADMIN`; the kernel waits for the completion.
pub(crate) fn nvme_get_log(
    ctrl_fd: impl AsFd,
    lid: u8,
    offset: u64,
    buf: &mut [u8],
) -> io::Result<()> {
    let len = u32::try_from(buf.len())
        .ok()
        .filter(|&l| (4..=16 << 20).contains(&l) && l % 4 == 0 && offset % 4 == 0)
        .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
    let dwords = len / 4 - 1;
    let mut cmd = nvme_passthru_cmd {
        opcode: NVME_ADMIN_GET_LOG_PAGE,
        nsid: 0,
        addr: buf.as_mut_ptr() as u64,
        data_len: len,
        cdw10: u32::from(lid) | (dwords & 0xffff) << 16,
        cdw11: dwords >> 16,
        cdw12: offset as u32,
        cdw13: (offset >> 32) as u32,
        ..nvme_passthru_cmd::default()
    };
    // SAFETY: NVME_IOCTL_ADMIN_CMD reads and writes back exactly one `nvme_passthru_cmd`
    // through its pointer argument; lunkit-sys checks the struct against the C header.
    let req =
        unsafe { Updater::<{ NVME_IOCTL_ADMIN_CMD as Opcode }, nvme_passthru_cmd>::new(&mut cmd) };
    // SAFETY: besides `cmd`, the kernel writes at most `data_len` bytes at `addr`, which is
    // `buf`: a live, exclusively borrowed slice of exactly that many bytes, untouched by
    // anything else until the call returns. `metadata` is 0.
    unsafe { ioctl(ctrl_fd, req) }.map_err(io::Error::from)?;
    Ok(())
}

/// `ioctl(fd, SG_IO, &sg_io_hdr)` with `cdb`, a SCSI command that moves no data (TEST UNIT
/// READY), on an open SCSI disk or `/dev/sgN`: the header as the kernel wrote it back (its
/// pointers cleared), with up to `sense.len()` (at most 255) bytes of sense data in `sense`
/// (`sb_len_wr` says how many). The kernel waits for the command's completion for up to
/// `timeout_ms` milliseconds, after which the SCSI error handler aborts it; callers also
/// bound the call, since the error handler's recovery can take longer. `EINVAL` (without a
/// call) unless `cdb` is 6 to 16 bytes. A reader may send the commands the kernel's safe
/// list allows (TEST UNIT READY is one); others need `CAP_SYS_RAWIO`.
pub(crate) fn sg_io_no_data(
    fd: impl AsFd,
    cdb: &[u8],
    sense: &mut [u8],
    timeout_ms: u32,
) -> io::Result<sg_io_hdr> {
    sg_io(fd, cdb, &mut [], sense, timeout_ms)
}

/// [`sg_io_no_data`] for a command that reads up to `data.len()` bytes from the device
/// (INQUIRY, on the kernel's safe list for a reader): `resid` in the header says how much of
/// `data` was not filled. `EINVAL` (without a call) also when `data` is over `u32::MAX`
/// bytes.
pub(crate) fn sg_io_from_dev(
    fd: impl AsFd,
    cdb: &[u8],
    data: &mut [u8],
    sense: &mut [u8],
    timeout_ms: u32,
) -> io::Result<sg_io_hdr> {
    if data.is_empty() {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    sg_io(fd, cdb, data, sense, timeout_ms)
}

/// The one `SG_IO` call: data from the device into `data`, or none when it is empty.
fn sg_io(
    fd: impl AsFd,
    cdb: &[u8],
    data: &mut [u8],
    sense: &mut [u8],
    timeout_ms: u32,
) -> io::Result<sg_io_hdr> {
    let Ok(dxfer_len) = u32::try_from(data.len()) else {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    };
    if !(6..=16).contains(&cdb.len()) {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let mut cmd = [0u8; 16];
    cmd[..cdb.len()].copy_from_slice(cdb);
    let (dxfer_direction, dxferp) = match data.is_empty() {
        true => (SG_DXFER_NONE, std::ptr::null_mut()),
        false => (SG_DXFER_FROM_DEV, data.as_mut_ptr().cast()),
    };
    let mut hdr = sg_io_hdr {
        interface_id: SG_INTERFACE_ID_ORIG,
        dxfer_direction,
        cmd_len: cdb.len() as u8,
        mx_sb_len: u8::try_from(sense.len()).unwrap_or(u8::MAX),
        dxfer_len,
        dxferp,
        cmdp: cmd.as_mut_ptr(),
        sbp: sense.as_mut_ptr(),
        timeout: timeout_ms,
        ..sg_io_hdr::zeroed()
    };
    // SAFETY: SG_IO reads and writes back exactly one `sg_io_hdr` through its pointer
    // argument; lunkit-sys checks the struct against the C header.
    let req = unsafe { Updater::<{ SG_IO as Opcode }, sg_io_hdr>::new(&mut hdr) };
    // Besides `hdr` the kernel reads `cmd_len` (<= 16) bytes at `cmdp` (`cmd`, live) and
    // writes <= `mx_sb_len` bytes at `sbp` (`sense`, exclusively borrowed, that long).
    // SAFETY: it writes <= `dxfer_len` bytes at `dxferp`: `data`, exclusively borrowed and
    // that long (one buffer, `iovec_count` 0), or null with SG_DXFER_NONE and a length of 0.
    unsafe { ioctl(fd, req) }.map_err(io::Error::from)?;
    hdr.cmdp = std::ptr::null_mut();
    hdr.sbp = std::ptr::null_mut();
    hdr.dxferp = std::ptr::null_mut();
    Ok(hdr)
}

/// The argument structs of the `IOC_PR_*` ioctls, each `_IOW` of exactly that struct.
pub(crate) trait PrArg: Copy {}
impl PrArg for lunkit_sys::pr::pr_registration {}
impl PrArg for lunkit_sys::pr::pr_reservation {}
impl PrArg for lunkit_sys::pr::pr_preempt {}
impl PrArg for lunkit_sys::pr::pr_clear {}

/// One persistent-reservation request: its opcode and the struct the kernel reads.
struct PrRequest<'a, T: PrArg> {
    opcode: Opcode,
    arg: &'a T,
}

// SAFETY: every IOC_PR_* opcode is `_IOW('p', nr, struct pr_*)`: the kernel copies exactly
// one struct of the argument's type from the pointer (`copy_from_user`) and writes nothing
// back (IS_MUTATING false). `pr_ioctl` pairs each opcode with its own struct, whose layout
// lunkit-sys checks against the C header; the shared borrow keeps it alive for the call.
unsafe impl<T: PrArg> Ioctl for PrRequest<'_, T> {
    type Output = libc::c_int;
    const IS_MUTATING: bool = false;

    fn opcode(&self) -> Opcode {
        self.opcode
    }

    fn as_ptr(&mut self) -> *mut core::ffi::c_void {
        std::ptr::from_ref(self.arg).cast_mut().cast()
    }

    unsafe fn output_from_ptr(
        out: IoctlOutput,
        _: *mut core::ffi::c_void,
    ) -> rustix::io::Result<libc::c_int> {
        Ok(out)
    }
}

/// `ioctl(fd, IOC_PR_*, &arg)` on an open block device: what the kernel returned, kept
/// whole, since a persistent-reservation call answers a device's refusal with a **positive**
/// value (the SCSI result on 6.1, a `PR_STS_*` from 6.3: `lunkit_sys::pr`), not an errno.
/// `opcode` must be the `IOC_PR_*` whose struct `T` is (`IOC_PR_REGISTER` with
/// `pr_registration`, ...): the callers in `pr` pair them.
pub(crate) fn pr_ioctl<T: PrArg>(fd: impl AsFd, opcode: u32, arg: &T) -> io::Result<i32> {
    let req = PrRequest {
        opcode: opcode as Opcode,
        arg,
    };
    // SAFETY: see the `Ioctl` impl of `PrRequest`: the kernel reads one `T` from `arg`.
    unsafe { ioctl(fd, req) }.map_err(io::Error::from)
}

/// An 8-byte aligned, zero-initialised byte buffer for device-mapper ioctls.
///
/// libdm hands the kernel a `malloc`ed (so 8-aligned) buffer; keeping the same alignment
/// means every `u64` in the header and payload (`dev`, `sector_start`, deps) sits on its
/// natural boundary, as the kernel lays them out.
#[derive(Debug, Clone)]
pub(crate) struct DmBuffer {
    words: Vec<u64>,
}

impl DmBuffer {
    /// A zeroed buffer of `len` bytes, rounded up to a multiple of 8.
    pub(crate) fn zeroed(len: usize) -> DmBuffer {
        DmBuffer {
            words: vec![0; len.div_ceil(8)],
        }
    }

    /// Its length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.words.len() * 8
    }

    /// The bytes.
    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: `words` is a live, initialised allocation of `len()` bytes; u8 has no
        // alignment or validity requirements, and the shared borrow of `self` keeps it alive
        // and unmodified for the returned lifetime.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr().cast::<u8>(), self.len()) }
    }

    /// The bytes, writable.
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        let len = self.len();
        // SAFETY: as in `bytes`; the exclusive borrow of `self` makes this the only view, and
        // every byte pattern is a valid u64, so writes through it cannot break `words`.
        unsafe { std::slice::from_raw_parts_mut(self.words.as_mut_ptr().cast::<u8>(), len) }
    }
}

/// One device-mapper request: a runtime opcode and the buffer it reads and writes.
struct DmRequest<'a> {
    opcode: Opcode,
    buf: &'a mut DmBuffer,
}

// SAFETY: every DM_* opcode is `_IOWR(0xfd, nr, struct dm_ioctl)`: the kernel reads the
// header, then up to `data_size` bytes, and writes back at most `data_size` bytes, all from
// the pointer we pass. `dm_ioctl` (below) checks that `data_size` fits in the buffer and that
// the buffer holds at least a header before calling, so the kernel stays inside `buf`, which
// the exclusive borrow keeps alive and unaliased for the call. IS_MUTATING is true because
// the kernel writes the reply into the buffer.
unsafe impl Ioctl for DmRequest<'_> {
    type Output = ();
    const IS_MUTATING: bool = true;

    fn opcode(&self) -> Opcode {
        self.opcode
    }

    fn as_ptr(&mut self) -> *mut core::ffi::c_void {
        self.buf.words.as_mut_ptr().cast()
    }

    unsafe fn output_from_ptr(_: IoctlOutput, _: *mut core::ffi::c_void) -> rustix::io::Result<()> {
        Ok(())
    }
}

/// `ioctl(control_fd, DM_*, buf)` — one device-mapper command on `/dev/mapper/control`.
///
/// `buf` must start with a `struct dm_ioctl` header whose `data_size` is at most the buffer's
/// length; otherwise this returns `EINVAL` without calling the kernel. On success the kernel
/// has written its reply (header and payload) into `buf`; on failure it has written nothing
/// but `version`. `cmd` must be one of the `lunkit_sys::dm::DM_*` opcodes.
pub(crate) fn dm_ioctl(control_fd: impl AsFd, cmd: u32, buf: &mut DmBuffer) -> io::Result<()> {
    const HEADER: usize = size_of::<dm_ioctl>();
    const DATA_SIZE_AT: usize = std::mem::offset_of!(dm_ioctl, data_size);
    let bytes = buf.bytes();
    if bytes.len() < HEADER {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let mut ds = [0u8; 4];
    ds.copy_from_slice(&bytes[DATA_SIZE_AT..DATA_SIZE_AT + 4]);
    let data_size = u32::from_ne_bytes(ds) as usize;
    if data_size > bytes.len() || data_size < HEADER {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let req = DmRequest {
        opcode: cmd as Opcode,
        buf,
    };
    // SAFETY: the buffer holds a header and `data_size` fits in it (checked above); see the
    // `Ioctl` impl of `DmRequest` for why the kernel stays within it.
    unsafe { ioctl(control_fd, req) }.map_err(io::Error::from)
}

/// `getsockopt(fd, SOL_SOCKET, SO_PEERCRED)` — the credentials the kernel recorded for the
/// peer of a connected Unix socket when it called `listen` or `connect`: its pid (0 when it
/// is not visible in this pid namespace, as multipathd on the host is from a container with
/// its own pid namespace), uid and gid.
///
/// Not an ioctl, and the one `unsafe` call here that is not: rustix's `socket_peercred`
/// reads the reply into a type whose pid cannot be 0, so the invisible-pid case would be
/// undefined behaviour.
pub(crate) fn so_peercred(fd: impl AsFd) -> io::Result<libc::ucred> {
    use std::os::fd::AsRawFd;
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let size = size_of::<libc::ucred>() as libc::socklen_t;
    let mut len = size;
    // SAFETY: `cred` and `len` are valid for writes for the whole call, and `len` holds
    // `cred`'s size: the kernel writes at most that many bytes into `cred`, then the count
    // into `len`. Any bit pattern is a valid `ucred` (three integers).
    let r = unsafe {
        libc::getsockopt(
            fd.as_fd().as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut cred).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    if len != size {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("SO_PEERCRED returned {len} bytes, not {size}"),
        ));
    }
    Ok(cred)
}

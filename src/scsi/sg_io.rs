//! Asking a SCSI disk directly: TEST UNIT READY through `SG_IO` ([`test_unit_ready`]), a VPD
//! page ([`inquiry_vpd`]: what the LUN says it is now, without the kernel's rescan), and the
//! sense data it may answer with ([`Sense::parse`], pure).
//!
//! sysfs shows what the kernel last knew: a LUN the array deleted or unmapped stays
//! `running` until a command to it fails, and the midlayer does not take it away even then.
//! The array says so only to a command: CHECK CONDITION, sense key ILLEGAL REQUEST, ASC/ASCQ
//! 25/00, LOGICAL UNIT NOT SUPPORTED ([`TurStatus::lun_not_supported`]).
//!
//! TEST UNIT READY moves no data and changes nothing on the device. It is sent on the disk's
//! node opened `O_RDONLY | O_NONBLOCK | O_CLOEXEC` (never `O_EXCL`: it claims nothing), which
//! the kernel allows a reader; with a hard timeout in the command itself ([`TUR_TIMEOUT`],
//! less when the caller's deadline is nearer) and on a helper thread bounded by that
//! deadline, since a timed-out command goes to the SCSI error handler, whose recovery can
//! take longer.

use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use rustix::fs::OFlags;

use crate::block::{self, BlockNode};
use crate::error::{Error, Result};
use crate::helper::{self, Subject};

/// How long one TEST UNIT READY may take in the device (the `sg_io_hdr` timeout), at most.
pub const TUR_TIMEOUT: Duration = Duration::from_secs(5);

/// How many times a TEST UNIT READY is sent while it answers UNIT ATTENTION: a unit
/// attention (a LUN inventory or capacity change, a reset) is reported once, to the next
/// command, and says nothing about whether the LUN is served.
const ATTEMPTS: usize = 3;

/// The SCSI INQUIRY opcode.
const INQUIRY: u8 = 0x12;

/// The SCSI TEST UNIT READY command: opcode 0, five bytes of zeros.
const TEST_UNIT_READY: [u8; 6] = [0; 6];

/// SAM status GOOD.
const GOOD: u8 = 0x00;
/// SAM status CHECK CONDITION: sense data describes the error.
const CHECK_CONDITION: u8 = 0x02;
/// `driver_status` DRIVER_SENSE: sense data was written (with a CHECK CONDITION).
const DRIVER_SENSE: u16 = 0x08;

/// Sense key NOT READY.
pub const NOT_READY: u8 = 0x2;
/// Sense key ILLEGAL REQUEST.
pub const ILLEGAL_REQUEST: u8 = 0x5;
/// Sense key UNIT ATTENTION.
pub const UNIT_ATTENTION: u8 = 0x6;

/// How the sense data is laid out (SPC-4, 4.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SenseFormat {
    /// Response code 0x70 (current) or 0x71 (deferred): the key in byte 2, ASC/ASCQ in
    /// bytes 12/13.
    Fixed,
    /// Response code 0x72 (current) or 0x73 (deferred): key, ASC and ASCQ in bytes 1 to 3.
    Descriptor,
}

/// Decoded sense data: what the device says went wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sense {
    /// Its layout.
    pub format: SenseFormat,
    /// Whether it is about an earlier command (0x71, 0x73), not this one.
    pub deferred: bool,
    /// The sense key (4 bits: [`ILLEGAL_REQUEST`], [`UNIT_ATTENTION`]...).
    pub key: u8,
    /// The additional sense code; `None` when the data stops before it.
    pub asc: Option<u8>,
    /// Its qualifier; `None` when the data stops before it.
    pub ascq: Option<u8>,
}

/// Why sense data could not be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SenseError {
    /// No sense data at all.
    Empty,
    /// A response code this parser does not know (0x7f vendor-specific, or garbage).
    UnknownResponseCode(u8),
    /// Too short to hold the sense key: `len` bytes of a `format` response.
    Truncated {
        /// The layout its response code announced.
        format: SenseFormat,
        /// How many bytes there were.
        len: usize,
    },
}

impl std::fmt::Display for SenseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SenseError::Empty => f.write_str("no sense data"),
            SenseError::UnknownResponseCode(c) => write!(f, "sense response code {c:#04x}"),
            SenseError::Truncated { format, len } => {
                write!(f, "{format:?} sense data cut short at {len} bytes")
            }
        }
    }
}

impl Sense {
    /// Decodes the sense data in `buf` (what the kernel wrote: `sb_len_wr` bytes), in either
    /// format, the way the kernel's `scsi_normalize_sense` does: the fixed format's
    /// additional length (byte 7) limits what is read; ASC and ASCQ are `None` when the
    /// data stops before them. Never panics, whatever `buf` holds.
    ///
    /// # Errors
    ///
    /// [`SenseError`]: no data, an unknown response code, or too short for the sense key.
    pub fn parse(buf: &[u8]) -> std::result::Result<Sense, SenseError> {
        let first = *buf.first().ok_or(SenseError::Empty)?;
        let code = first & 0x7f;
        let (format, deferred) = match code {
            0x70 => (SenseFormat::Fixed, false),
            0x71 => (SenseFormat::Fixed, true),
            0x72 => (SenseFormat::Descriptor, false),
            0x73 => (SenseFormat::Descriptor, true),
            other => return Err(SenseError::UnknownResponseCode(other)),
        };
        let (key_at, asc_at, len) = match format {
            SenseFormat::Fixed => {
                // Byte 7 counts the bytes after the first 8.
                let len = match buf.get(7) {
                    Some(&more) => buf.len().min(8 + usize::from(more)),
                    None => buf.len(),
                };
                (2, 12, len)
            }
            SenseFormat::Descriptor => (1, 2, buf.len()),
        };
        let byte = |i: usize| (i < len).then(|| buf[i]);
        let key = byte(key_at).ok_or(SenseError::Truncated {
            format,
            len: buf.len(),
        })? & 0x0f;
        Ok(Sense {
            format,
            deferred,
            key,
            asc: byte(asc_at),
            ascq: byte(asc_at + 1),
        })
    }

    /// ILLEGAL REQUEST, 25/00: LOGICAL UNIT NOT SUPPORTED. The target does not serve this
    /// LUN (any more): the array deleted or unmapped it.
    pub fn lun_not_supported(&self) -> bool {
        !self.deferred
            && self.key == ILLEGAL_REQUEST
            && self.asc == Some(0x25)
            && self.ascq == Some(0x00)
    }

    /// The sense key's name (SPC-4, table 28).
    pub fn key_name(&self) -> &'static str {
        const NAMES: [&str; 16] = [
            "NO SENSE",
            "RECOVERED ERROR",
            "NOT READY",
            "MEDIUM ERROR",
            "HARDWARE ERROR",
            "ILLEGAL REQUEST",
            "UNIT ATTENTION",
            "DATA PROTECT",
            "BLANK CHECK",
            "VENDOR SPECIFIC",
            "COPY ABORTED",
            "ABORTED COMMAND",
            "RESERVED",
            "VOLUME OVERFLOW",
            "MISCOMPARE",
            "COMPLETED",
        ];
        NAMES[usize::from(self.key & 0x0f)]
    }
}

impl std::fmt::Display for Sense {
    /// `ILLEGAL REQUEST 25/00` (`??` for a code the data did not reach).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hex = |b: Option<u8>| b.map_or("??".to_owned(), |b| format!("{b:02x}"));
        write!(
            f,
            "{}{} {}/{}",
            if self.deferred { "deferred " } else { "" },
            self.key_name(),
            hex(self.asc),
            hex(self.ascq)
        )
    }
}

/// What a disk answered to TEST UNIT READY.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TurStatus {
    /// GOOD: the LUN is there and ready.
    Ready,
    /// CHECK CONDITION, with the sense data that says why.
    CheckCondition(Sense),
    /// CHECK CONDITION whose sense data could not be decoded (none, cut short, unknown).
    BadSense(SenseError),
    /// Another SAM status: BUSY (0x08), RESERVATION CONFLICT (0x18), TASK SET FULL (0x28)...
    Status(u8),
    /// The command did not reach the device or did not come back from it: the transport
    /// (`host_status`, `DID_*`) or the driver (`driver_status`) failed it.
    Transport {
        /// The host byte (`DID_NO_CONNECT` 1, `DID_TIME_OUT` 3, `DID_TRANSPORT_DISRUPTED`
        /// 14...).
        host_status: u16,
        /// The driver byte, without `DRIVER_SENSE`.
        driver_status: u16,
    },
}

impl TurStatus {
    /// Decodes what `SG_IO` wrote back: the SAM `status`, the `host_status` and
    /// `driver_status`, and the `sense` bytes it wrote (`sb_len_wr` of them). Pure.
    pub fn from_reply(status: u8, host_status: u16, driver_status: u16, sense: &[u8]) -> Self {
        let driver_status = driver_status & !DRIVER_SENSE;
        if host_status != 0 || driver_status != 0 {
            return TurStatus::Transport {
                host_status,
                driver_status,
            };
        }
        match status {
            GOOD => TurStatus::Ready,
            CHECK_CONDITION => match Sense::parse(sense) {
                Ok(s) => TurStatus::CheckCondition(s),
                Err(e) => TurStatus::BadSense(e),
            },
            other => TurStatus::Status(other),
        }
    }

    /// Whether the target said it does not serve this LUN (see
    /// [`Sense::lun_not_supported`]).
    pub fn lun_not_supported(&self) -> bool {
        matches!(self, TurStatus::CheckCondition(s) if s.lun_not_supported())
    }

    /// Whether it is a UNIT ATTENTION, which a second command gets past.
    fn unit_attention(&self) -> bool {
        matches!(self, TurStatus::CheckCondition(s) if s.key == UNIT_ATTENTION)
    }
}

impl std::fmt::Display for TurStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TurStatus::Ready => f.write_str("GOOD"),
            TurStatus::CheckCondition(s) => write!(f, "CHECK CONDITION, {s}"),
            TurStatus::BadSense(e) => write!(f, "CHECK CONDITION ({e})"),
            TurStatus::Status(s) => write!(f, "status {s:#04x}"),
            TurStatus::Transport {
                host_status,
                driver_status,
            } => write!(
                f,
                "failed by the transport (host status {host_status:#x}, driver status \
                 {driver_status:#x})"
            ),
        }
    }
}

/// Sends TEST UNIT READY to the SCSI disk `node` and returns its answer; once more (up to
/// three times) while it answers UNIT ATTENTION.
///
/// The node is opened `O_RDONLY | O_NONBLOCK | O_CLOEXEC` and checked to be `node`'s device
/// number (never `O_EXCL`: nothing is claimed, a mount or a map may hold the disk). Each
/// command may take [`TUR_TIMEOUT`] in the device, or what is left until `deadline` if
/// that is less. The open and the commands run on a helper thread bounded by `deadline`
/// (one per disk at a time: a later call waits for a stuck one, within its own deadline),
/// and the descriptor is registered as a helper's, so that an in-use check does not count
/// it as a user.
///
/// # Errors
///
/// [`Error::Io`] when the node does not open (an offline disk refuses with `ENXIO`),
/// [`Error::Invalid`] when it is not `node`'s device, [`Error::Ioctl`] when `SG_IO` fails
/// (`ENOTTY` on a disk that is not SCSI), [`Error::Timeout`] at the deadline.
pub fn test_unit_ready(node: &BlockNode, deadline: Instant) -> Result<TurStatus> {
    let what = || format!("TEST UNIT READY to {node} (the device is not answering)");
    let subject = Subject::device("test-unit-ready", node.dev);
    let node = node.clone();
    helper::bounded(subject, deadline, &what, move || {
        let fd = block::open_checked(&node, OFlags::NONBLOCK)?;
        let _held = helper::hold(fd.as_fd(), node.dev);
        let mut status = send(&fd, &node, deadline)?;
        for _ in 1..ATTEMPTS {
            if !status.unit_attention() {
                break;
            }
            status = send(&fd, &node, deadline)?;
        }
        Ok(status)
    })
}

/// One TEST UNIT READY on the open disk `fd`.
fn send(fd: &impl AsFd, node: &BlockNode, deadline: Instant) -> Result<TurStatus> {
    let left = deadline.saturating_duration_since(Instant::now());
    let timeout = left.clamp(Duration::from_millis(1), TUR_TIMEOUT);
    let timeout_ms = u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX);
    let mut sense = [0u8; 64];
    let hdr = crate::ioctl::sg_io_no_data(fd, &TEST_UNIT_READY, &mut sense, timeout_ms).map_err(
        |source| Error::Ioctl {
            op: "SG_IO",
            target: node.to_string(),
            source,
        },
    )?;
    let written = usize::from(hdr.sb_len_wr).min(sense.len());
    Ok(TurStatus::from_reply(
        hdr.status,
        hdr.host_status,
        hdr.driver_status,
        &sense[..written],
    ))
}

/// The largest VPD page asked for: a Device Identification page lists a few designators
/// per port, far below this.
const VPD_MAX: usize = 4096;

/// Sends INQUIRY for the VPD page `page` to the SCSI disk `node` and returns the page as the
/// device answers it now (`None` when it answers something else than GOOD, after up to
/// three UNIT ATTENTIONs: a re-mapped LUN reports INQUIRY DATA HAS CHANGED once). Unlike a
/// `rescan`, it leaves the kernel's copy of the page (sysfs `vpd_pg83`) as it was.
///
/// The first INQUIRY asks for 255 bytes, as the kernel does; a longer page is asked for
/// again at its stated length, up to 4 KiB. Open, timeouts, helper thread and errors as
/// [`test_unit_ready`].
pub fn inquiry_vpd(node: &BlockNode, page: u8, deadline: Instant) -> Result<Option<Vec<u8>>> {
    let what = || format!("INQUIRY to {node} (the device is not answering)");
    let subject = Subject::device("inquiry", node.dev);
    let node = node.clone();
    helper::bounded(subject, deadline, &what, move || {
        let fd = block::open_checked(&node, OFlags::NONBLOCK)?;
        let _held = helper::hold(fd.as_fd(), node.dev);
        let mut want = 255;
        for _ in 0..ATTEMPTS + 1 {
            let (status, data) = send_inquiry(&fd, &node, page, want, deadline)?;
            if status.unit_attention() {
                continue;
            }
            if status != TurStatus::Ready {
                return Ok(None);
            }
            let stated = data
                .get(2..4)
                .map_or(0, |l| 4 + usize::from(u16::from_be_bytes([l[0], l[1]])));
            if stated > data.len() && want < stated.min(VPD_MAX) {
                want = stated.min(VPD_MAX);
                continue;
            }
            return Ok(Some(data));
        }
        Ok(None)
    })
}

/// One INQUIRY with EVPD for `page`, `len` bytes at most, on the open disk `fd`: its status,
/// and the bytes the device sent.
fn send_inquiry(
    fd: &impl AsFd,
    node: &BlockNode,
    page: u8,
    len: usize,
    deadline: Instant,
) -> Result<(TurStatus, Vec<u8>)> {
    let alloc = u16::try_from(len).unwrap_or(u16::MAX).to_be_bytes();
    let cdb = [INQUIRY, 0x01, page, alloc[0], alloc[1], 0];
    data_in(fd, node, &cdb, len, deadline, TUR_TIMEOUT)
}

/// One SCSI command `cdb` that reads at most `len` bytes from the open disk `fd`, given the
/// time left to `deadline` and at most `limit` in the device: its status (from the SAM
/// status, the host and driver bytes and the sense data) and the bytes the device sent (the
/// residual count taken off).
pub(crate) fn data_in(
    fd: &impl AsFd,
    node: &BlockNode,
    cdb: &[u8],
    len: usize,
    deadline: Instant,
    limit: Duration,
) -> Result<(TurStatus, Vec<u8>)> {
    let left = deadline.saturating_duration_since(Instant::now());
    let timeout = left.clamp(Duration::from_millis(1), limit);
    let timeout_ms = u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX);
    let mut data = vec![0u8; len];
    let mut sense = [0u8; 64];
    let hdr = crate::ioctl::sg_io_from_dev(fd, cdb, &mut data, &mut sense, timeout_ms).map_err(
        |source| Error::Ioctl {
            op: "SG_IO",
            target: node.to_string(),
            source,
        },
    )?;
    let resid = usize::try_from(hdr.resid).unwrap_or(0).min(len);
    data.truncate(len - resid);
    let written = usize::from(hdr.sb_len_wr).min(sense.len());
    let status = TurStatus::from_reply(
        hdr.status,
        hdr.host_status,
        hdr.driver_status,
        &sense[..written],
    );
    Ok((status, data))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fixed-format sense (0x70) with key, ASC and ASCQ, 18 bytes as most targets send.
    fn fixed(key: u8, asc: u8, ascq: u8) -> Vec<u8> {
        let mut s = vec![0u8; 18];
        s[0] = 0xf0; // current, with the VALID bit
        s[2] = key;
        s[7] = 10;
        s[12] = asc;
        s[13] = ascq;
        s
    }

    fn descriptor(key: u8, asc: u8, ascq: u8) -> Vec<u8> {
        vec![0x72, key, asc, ascq, 0, 0, 0, 0]
    }

    #[test]
    fn logical_unit_not_supported_in_either_format() {
        for buf in [fixed(0x05, 0x25, 0x00), descriptor(0x05, 0x25, 0x00)] {
            let s = Sense::parse(&buf).unwrap();
            assert!(s.lun_not_supported(), "{s:?}");
            assert_eq!(s.to_string(), "ILLEGAL REQUEST 25/00");
        }
        let s = Sense::parse(&fixed(0x05, 0x25, 0x00)).unwrap();
        assert_eq!((s.format, s.deferred), (SenseFormat::Fixed, false));
        // Only the key's low 4 bits are the key (FILEMARK, EOM, ILI above it).
        let mut flags = fixed(0x05, 0x25, 0x00);
        flags[2] |= 0xe0;
        assert!(Sense::parse(&flags).unwrap().lun_not_supported());
    }

    #[test]
    fn other_answers_are_not_a_lun_gone() {
        // INVALID FIELD IN CDB, a unit attention, NOT READY, a deferred error.
        for buf in [
            fixed(0x05, 0x24, 0x00),
            fixed(0x05, 0x25, 0x01),
            fixed(0x06, 0x3f, 0x0e),
            fixed(0x02, 0x04, 0x01),
            descriptor(0x06, 0x29, 0x00),
        ] {
            assert!(!Sense::parse(&buf).unwrap().lun_not_supported(), "{buf:?}");
        }
        let mut deferred = fixed(0x05, 0x25, 0x00);
        deferred[0] = 0x71;
        let s = Sense::parse(&deferred).unwrap();
        assert!(s.deferred && !s.lun_not_supported());
        let s = Sense::parse(&[0x73, 0x05, 0x25, 0x00]).unwrap();
        assert_eq!((s.format, s.deferred), (SenseFormat::Descriptor, true));
    }

    #[test]
    fn short_and_garbage_sense_is_typed_never_a_panic() {
        assert_eq!(Sense::parse(&[]), Err(SenseError::Empty));
        assert_eq!(
            Sense::parse(&[0x7f, 0x05, 0x25]),
            Err(SenseError::UnknownResponseCode(0x7f))
        );
        assert_eq!(
            Sense::parse(&[0x00; 18]),
            Err(SenseError::UnknownResponseCode(0))
        );
        let cut = |format, len| Err(SenseError::Truncated { format, len });
        assert_eq!(Sense::parse(&[0x70, 0]), cut(SenseFormat::Fixed, 2));
        assert_eq!(Sense::parse(&[0x72]), cut(SenseFormat::Descriptor, 1));
        // The key but not the codes: known, and not taken for a LUN gone.
        let s = Sense::parse(&[0x70, 0, 0x05]).unwrap();
        assert_eq!((s.key, s.asc, s.ascq), (0x05, None, None));
        assert!(!s.lun_not_supported());
        assert_eq!(s.to_string(), "ILLEGAL REQUEST ??/??");
        let s = Sense::parse(&[0x72, 0x05, 0x25]).unwrap();
        assert_eq!((s.asc, s.ascq), (Some(0x25), None));
        assert!(!s.lun_not_supported());
        // The additional length says the codes are not there, whatever follows.
        let mut short = fixed(0x05, 0x25, 0x00);
        short[7] = 4;
        let s = Sense::parse(&short).unwrap();
        assert_eq!((s.asc, s.ascq), (None, None));
        short[7] = 5;
        assert_eq!(Sense::parse(&short).unwrap().asc, Some(0x25));
        // Every byte pattern of every length up to 20, starting with each response code.
        for code in [0x70u8, 0x71, 0x72, 0x73, 0xf0, 0x7f, 0x00] {
            for len in 0..=20usize {
                for fill in [0x00u8, 0x25, 0xff] {
                    let mut b = vec![fill; len];
                    if let Some(f) = b.first_mut() {
                        *f = code;
                    }
                    let _ = Sense::parse(&b);
                }
            }
        }
    }

    #[test]
    fn replies_are_told_apart() {
        let gone = fixed(0x05, 0x25, 0x00);
        let s = TurStatus::from_reply(0x02, 0, 0x08, &gone);
        assert!(s.lun_not_supported(), "{s:?}");
        assert_eq!(
            s.to_string(),
            "CHECK CONDITION, ILLEGAL REQUEST 25/00",
            "{s:?}"
        );
        assert_eq!(TurStatus::from_reply(0, 0, 0, &[]), TurStatus::Ready);
        // Sense left over in the buffer means nothing without CHECK CONDITION.
        assert_eq!(TurStatus::from_reply(0, 0, 0, &gone), TurStatus::Ready);
        assert_eq!(
            TurStatus::from_reply(0x08, 0, 0, &[]),
            TurStatus::Status(0x08)
        );
        assert_eq!(
            TurStatus::from_reply(0x02, 0, 0x08, &[]),
            TurStatus::BadSense(SenseError::Empty)
        );
        // A transport failure is not the target's answer, whatever the status says.
        let lost = TurStatus::from_reply(0x02, 0x01, 0, &gone);
        assert_eq!(
            lost,
            TurStatus::Transport {
                host_status: 1,
                driver_status: 0
            }
        );
        assert!(!lost.lun_not_supported());
        assert!(TurStatus::from_reply(0x02, 0, 0x08, &fixed(0x06, 0x29, 0)).unit_attention());
    }
}

//! Pure encoding and decoding of device-mapper ioctl buffers: no I/O here.
//!
//! A buffer is a `struct dm_ioctl` header followed by a payload at `data_start`. Everything
//! read from a reply is bounds-checked against the bytes actually present: a truncated,
//! corrupt or hostile buffer decodes to [`Error::Invalid`], never to a panic or an
//! out-of-bounds read. Offsets are read as little as possible and each one is checked before
//! use; linked records must move strictly forward, so no corrupt `next` can loop.
//!
//! Integers are native-endian, as the kernel writes them.

use std::mem::offset_of;

use lunkit_sys::dm::{self as sys, dm_ioctl, dm_target_spec};

use super::types::{DevId, Device, ListedUuid, Target};
use crate::error::{Error, Result};
use crate::id::DevNum;

/// Size of the `dm_ioctl` header, and the `data_start` this library sends.
pub const HEADER_SIZE: usize = size_of::<dm_ioctl>();

const KIND: &str = "device-mapper reply";

fn invalid(reason: &'static str) -> Error {
    Error::Invalid {
        kind: KIND,
        input: String::new(),
        reason,
    }
}

fn u32_at(buf: &[u8], off: usize) -> Result<u32> {
    let end = off
        .checked_add(4)
        .ok_or_else(|| invalid("offset overflows"))?;
    let b = buf.get(off..end).ok_or_else(|| invalid("truncated"))?;
    Ok(u32::from_ne_bytes(b.try_into().expect("slice of 4")))
}

fn u64_at(buf: &[u8], off: usize) -> Result<u64> {
    let end = off
        .checked_add(8)
        .ok_or_else(|| invalid("offset overflows"))?;
    let b = buf.get(off..end).ok_or_else(|| invalid("truncated"))?;
    Ok(u64::from_ne_bytes(b.try_into().expect("slice of 8")))
}

/// Rounds up to the kernel's 8-byte record alignment (`align_ptr` in dm-ioctl.c).
fn align8(n: usize) -> Option<usize> {
    n.checked_add(7).map(|v| v & !7)
}

/// The NUL-terminated string at `buf[off..end]`: returns it and the offset just past its NUL.
fn c_str(buf: &[u8], off: usize, end: usize, what: &'static str) -> Result<(String, usize)> {
    let area = buf
        .get(off..end)
        .ok_or_else(|| invalid("string out of bounds"))?;
    let len = area
        .iter()
        .position(|&b| b == 0)
        .ok_or_else(|| invalid("string not NUL-terminated"))?;
    let s = std::str::from_utf8(&area[..len]).map_err(|_| Error::Invalid {
        kind: what,
        input: String::from_utf8_lossy(&area[..len.min(256)]).into_owned(),
        reason: "not UTF-8",
    })?;
    Ok((s.to_owned(), off + len + 1))
}

/// A fixed-size `char[N]` field: up to the first NUL, or all of it.
fn char_array(field: &[u8], what: &'static str) -> Result<String> {
    let len = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    std::str::from_utf8(&field[..len])
        .map(str::to_owned)
        .map_err(|_| Error::Invalid {
            kind: what,
            input: String::from_utf8_lossy(&field[..len]).into_owned(),
            reason: "not UTF-8",
        })
}

/// Decodes a kernel device number (`huge_encode_dev`, the glibc `makedev` layout).
pub fn decode_dev(dev: u64) -> DevNum {
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    DevNum {
        major: major as u32,
        minor: minor as u32,
    }
}

/// Encodes a device number the way the kernel's `huge_decode_dev` reads it.
pub fn encode_dev(dev: DevNum) -> u64 {
    let (ma, mi) = (u64::from(dev.major), u64::from(dev.minor));
    (mi & 0xff) | ((ma & 0xfff) << 8) | ((mi & !0xff) << 12) | ((ma & !0xfff) << 32)
}

/// Checks a map name as the kernel will (`check_name`, `DM_NAME_LEN`): non-empty, shorter
/// than 128 bytes, no `/`, no NUL, not `.`/`..` (which would be odd `/dev/mapper` entries).
pub fn check_name(name: &str) -> Result<()> {
    let reason = if name.is_empty() {
        "empty"
    } else if name.len() >= sys::DM_NAME_LEN {
        "longer than 127 bytes"
    } else if name.contains('/') {
        "contains '/'"
    } else if name.contains('\0') {
        "contains NUL"
    } else if name == "." || name == ".." {
        "not a map name"
    } else {
        return Ok(());
    };
    Err(Error::invalid("device-mapper name", name, reason))
}

/// Checks a uuid: non-empty, shorter than 129 bytes, no NUL.
pub fn check_uuid(uuid: &str) -> Result<()> {
    let reason = if uuid.is_empty() {
        "empty"
    } else if uuid.len() >= sys::DM_UUID_LEN {
        "longer than 128 bytes"
    } else if uuid.contains('\0') {
        "contains NUL"
    } else {
        return Ok(());
    };
    Err(Error::invalid("device-mapper uuid", uuid, reason))
}

/// What goes into a request buffer.
#[derive(Debug, Clone, Copy, Default)]
pub struct Request<'a> {
    /// The device the command is about (none for version and list commands).
    pub id: Option<DevId<'a>>,
    /// `DM_DEV_CREATE` only: the new device's uuid, written next to its name (for every
    /// other command name and uuid are alternative lookup keys and must not both be set).
    pub new_uuid: Option<&'a str>,
    /// `DM_*_FLAG` bits.
    pub flags: u32,
    /// Number of target specs in `payload` (`DM_TABLE_LOAD`).
    pub target_count: u32,
    /// The bytes placed at `data_start`.
    pub payload: &'a [u8],
}

/// Writes `req` into `buf`: header (version 4.0.0, `data_size` = the whole buffer,
/// `data_start` = 312, `event_nr` 0: no udev cookie), the device identity, flags, target
/// count, and the payload at `data_start`. The rest of `buf` is zeroed.
pub fn write_request(buf: &mut [u8], req: &Request<'_>) -> Result<()> {
    let Request {
        id,
        new_uuid,
        flags,
        target_count,
        payload,
    } = *req;
    let need = HEADER_SIZE + payload.len();
    if buf.len() < need || u32::try_from(buf.len()).is_err() {
        return Err(Error::invalid(
            "device-mapper request",
            "",
            "buffer too small or larger than 4 GiB",
        ));
    }
    buf.fill(0);
    let put32 = |buf: &mut [u8], off: usize, v: u32| {
        buf[off..off + 4].copy_from_slice(&v.to_ne_bytes());
    };
    for (i, v) in sys::DM_VERSION_REQUEST.iter().enumerate() {
        put32(buf, offset_of!(dm_ioctl, version) + 4 * i, *v);
    }
    put32(buf, offset_of!(dm_ioctl, data_size), buf.len() as u32);
    put32(buf, offset_of!(dm_ioctl, data_start), HEADER_SIZE as u32);
    put32(buf, offset_of!(dm_ioctl, target_count), target_count);
    put32(buf, offset_of!(dm_ioctl, flags), flags);
    if let Some(u) = new_uuid {
        check_uuid(u)?;
        let at = offset_of!(dm_ioctl, uuid);
        buf[at..at + u.len()].copy_from_slice(u.as_bytes());
    }
    match id {
        None => {}
        Some(DevId::Name(n)) => {
            check_name(n)?;
            let at = offset_of!(dm_ioctl, name);
            buf[at..at + n.len()].copy_from_slice(n.as_bytes());
        }
        Some(DevId::Uuid(u)) => {
            check_uuid(u)?;
            let at = offset_of!(dm_ioctl, uuid);
            buf[at..at + u.len()].copy_from_slice(u.as_bytes());
        }
        Some(DevId::Dev(d)) => {
            let at = offset_of!(dm_ioctl, dev);
            buf[at..at + 8].copy_from_slice(&encode_dev(d).to_ne_bytes());
        }
    }
    buf[HEADER_SIZE..need].copy_from_slice(payload);
    Ok(())
}

/// A decoded reply header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// The kernel's interface version.
    pub version: [u32; 3],
    /// `data_size`: how much of the buffer the reply uses.
    pub data_size: u32,
    /// `data_start`: where the payload starts.
    pub data_start: u32,
    /// `target_count`.
    pub target_count: u32,
    /// `open_count`.
    pub open_count: i32,
    /// `flags`.
    pub flags: u32,
    /// `event_nr`.
    pub event_nr: u32,
    /// `dev`, decoded.
    pub dev: DevNum,
    /// `name` (empty if none).
    pub name: String,
    /// `uuid` (empty if none).
    pub uuid: String,
}

/// Decodes the `dm_ioctl` header at the start of `buf`.
pub fn decode_header(buf: &[u8]) -> Result<Header> {
    if buf.len() < HEADER_SIZE {
        return Err(invalid("shorter than a dm_ioctl header"));
    }
    let v = offset_of!(dm_ioctl, version);
    let name_at = offset_of!(dm_ioctl, name);
    let uuid_at = offset_of!(dm_ioctl, uuid);
    Ok(Header {
        version: [u32_at(buf, v)?, u32_at(buf, v + 4)?, u32_at(buf, v + 8)?],
        data_size: u32_at(buf, offset_of!(dm_ioctl, data_size))?,
        data_start: u32_at(buf, offset_of!(dm_ioctl, data_start))?,
        target_count: u32_at(buf, offset_of!(dm_ioctl, target_count))?,
        open_count: u32_at(buf, offset_of!(dm_ioctl, open_count))? as i32,
        flags: u32_at(buf, offset_of!(dm_ioctl, flags))?,
        event_nr: u32_at(buf, offset_of!(dm_ioctl, event_nr))?,
        dev: decode_dev(u64_at(buf, offset_of!(dm_ioctl, dev))?),
        name: char_array(
            &buf[name_at..name_at + sys::DM_NAME_LEN],
            "device-mapper name",
        )?,
        uuid: char_array(
            &buf[uuid_at..uuid_at + sys::DM_UUID_LEN],
            "device-mapper uuid",
        )?,
    })
}

/// The payload of a reply: `buf[data_start..data_size]`.
///
/// `data_size` below `data_start` is an empty payload (an empty device list comes back with
/// `data_size == data_start`); either offset beyond the buffer is an error.
pub fn payload<'b>(buf: &'b [u8], header: &Header) -> Result<&'b [u8]> {
    let start = header.data_start as usize;
    let end = header.data_size as usize;
    if start < HEADER_SIZE - 7 {
        // The kernel never puts data inside the header (it returns 312).
        return Err(invalid("data_start inside the header"));
    }
    if start > buf.len() || end > buf.len() {
        return Err(invalid("data_start or data_size beyond the buffer"));
    }
    Ok(if end <= start { &[] } else { &buf[start..end] })
}

/// Decodes a `DM_LIST_DEVICES` payload: `dm_name_list` records chained by `next` (relative to
/// each record, 0 on the last).
///
/// `with_event_nr` says the kernel appends `event_nr` and `flags` after each name (interface
/// 4.37+); a uuid follows when `flags` has `DM_NAME_LIST_FLAG_HAS_UUID`. An empty payload, or
/// a first record with `dev == 0`, is an empty list.
pub fn decode_names(payload: &[u8], with_event_nr: bool) -> Result<Vec<Device>> {
    let mut out = Vec::new();
    if payload.is_empty() || u64_at(payload, 0)? == 0 {
        return Ok(out);
    }
    let mut off = 0usize;
    loop {
        let dev = u64_at(payload, off)?;
        let next = u32_at(payload, off + offset_of!(sys::dm_name_list, next))? as usize;
        let end = if next == 0 {
            payload.len()
        } else {
            off.checked_add(next)
                .filter(|&e| e <= payload.len())
                .ok_or_else(|| invalid("name list record points beyond the buffer"))?
        };
        let (name, mut used) = c_str(
            payload,
            off + sys::DM_NAME_LIST_NAME_OFFSET,
            end,
            "device-mapper name",
        )?;
        let mut event_nr = None;
        let mut uuid = ListedUuid::Unknown;
        if with_event_nr {
            let ext = align8(used).ok_or_else(|| invalid("offset overflows"))?;
            if ext + 8 > end {
                return Err(invalid("name list record lacks event_nr and flags"));
            }
            event_nr = Some(u32_at(payload, ext)?);
            let flags = u32_at(payload, ext + 4)?;
            used = ext + 8;
            if flags & sys::DM_NAME_LIST_FLAG_HAS_UUID != 0 {
                let at = align8(used).ok_or_else(|| invalid("offset overflows"))?;
                let (u, after) = c_str(payload, at.min(end), end, "device-mapper uuid")?;
                used = after;
                uuid = ListedUuid::Some(u);
            } else if flags & sys::DM_NAME_LIST_FLAG_DOESNT_HAVE_UUID != 0 {
                uuid = ListedUuid::None;
            }
        }
        out.push(Device {
            name,
            dev: decode_dev(dev),
            event_nr,
            uuid,
        });
        if next == 0 {
            return Ok(out);
        }
        // `end` is past everything this record used, so the walk strictly advances.
        debug_assert!(used <= end);
        off = end;
    }
}

/// Decodes a `DM_TABLE_STATUS` payload of `count` targets: `dm_target_spec` records whose
/// `next` is relative to the *first* spec, each followed by a NUL-terminated string.
pub fn decode_targets(payload: &[u8], count: u32) -> Result<Vec<Target>> {
    const SPEC: usize = size_of::<dm_target_spec>();
    let mut out = Vec::new();
    let mut off = 0usize;
    for i in 0..count {
        let spec = payload
            .get(
                off..off
                    .checked_add(SPEC)
                    .ok_or_else(|| invalid("offset overflows"))?,
            )
            .ok_or_else(|| invalid("target spec truncated"))?;
        let start = u64_at(spec, offset_of!(dm_target_spec, sector_start))?;
        let length = u64_at(spec, offset_of!(dm_target_spec, length))?;
        let next = u32_at(spec, offset_of!(dm_target_spec, next))? as usize;
        let tt = offset_of!(dm_target_spec, target_type);
        let target_type = char_array(&spec[tt..tt + sys::DM_MAX_TYPE_NAME], "target type")?;
        let (params, used) = c_str(payload, off + SPEC, payload.len(), "target parameters")?;
        out.push(Target {
            start,
            length,
            target_type,
            params,
        });
        if i + 1 < count {
            if next < used || next <= off {
                return Err(invalid("target spec `next` does not move forward"));
            }
            off = next;
        }
    }
    Ok(out)
}

/// Decodes a `DM_TABLE_DEPS` payload: `u32 count; u32 pad; u64 dev[count]`.
pub fn decode_deps(payload: &[u8]) -> Result<Vec<DevNum>> {
    let count = u32_at(payload, offset_of!(sys::dm_target_deps, count))? as usize;
    let need = count
        .checked_mul(8)
        .and_then(|n| n.checked_add(sys::DM_TARGET_DEPS_DEV_OFFSET))
        .ok_or_else(|| invalid("deps count overflows"))?;
    if need > payload.len() {
        return Err(invalid("deps list truncated"));
    }
    (0..count)
        .map(|i| u64_at(payload, sys::DM_TARGET_DEPS_DEV_OFFSET + 8 * i).map(decode_dev))
        .collect()
}

/// Decodes a `DM_TARGET_MSG` reply: the target's answer at `data_start` if the kernel set
/// `DM_DATA_OUT_FLAG`, else `None`.
pub fn decode_message(payload: &[u8], flags: u32) -> Result<Option<String>> {
    if flags & sys::DM_DATA_OUT_FLAG == 0 {
        return Ok(None);
    }
    c_str(payload, 0, payload.len(), "target message reply").map(|(s, _)| Some(s))
}

/// Decodes a `DM_LIST_VERSIONS`/`DM_GET_TARGET_VERSION` payload: (`name`, version) records
/// chained by `next` relative to each record.
pub fn decode_target_versions(payload: &[u8]) -> Result<Vec<(String, [u32; 3])>> {
    let mut out = Vec::new();
    let mut off = 0usize;
    if payload.is_empty() {
        return Ok(out);
    }
    loop {
        let next = u32_at(payload, off)? as usize;
        let version = [
            u32_at(payload, off + 4)?,
            u32_at(payload, off + 8)?,
            u32_at(payload, off + 12)?,
        ];
        let end = if next == 0 {
            payload.len()
        } else {
            off.checked_add(next)
                .filter(|&e| e <= payload.len())
                .ok_or_else(|| invalid("version record points beyond the buffer"))?
        };
        let (name, _) = c_str(
            payload,
            off + sys::DM_TARGET_VERSIONS_NAME_OFFSET,
            end,
            "target type",
        )?;
        out.push((name, version));
        if next == 0 {
            return Ok(out);
        }
        off = end;
    }
}

/// Encodes a `DM_TABLE_LOAD` payload: one `dm_target_spec` per target, each followed by its
/// NUL-terminated parameters padded to 8 bytes, `next` relative to the current spec.
pub fn encode_targets(targets: &[Target]) -> Result<Vec<u8>> {
    const SPEC: usize = size_of::<dm_target_spec>();
    let mut out = Vec::new();
    for t in targets {
        if t.target_type.is_empty()
            || t.target_type.len() >= sys::DM_MAX_TYPE_NAME
            || t.target_type.contains('\0')
        {
            return Err(Error::invalid(
                "target type",
                &t.target_type,
                "must be 1 to 15 bytes without NUL",
            ));
        }
        if t.params.contains('\0') {
            return Err(Error::invalid(
                "target parameters",
                &t.params,
                "contains NUL",
            ));
        }
        let rec = align8(SPEC + t.params.len() + 1).ok_or_else(|| invalid("offset overflows"))?;
        let next = u32::try_from(rec)
            .map_err(|_| Error::invalid("target parameters", &t.params, "too long"))?;
        let at = out.len();
        out.resize(at + rec, 0);
        let r = &mut out[at..];
        r[0..8].copy_from_slice(&t.start.to_ne_bytes());
        r[8..16].copy_from_slice(&t.length.to_ne_bytes());
        r[offset_of!(dm_target_spec, next)..][..4].copy_from_slice(&next.to_ne_bytes());
        let tt = offset_of!(dm_target_spec, target_type);
        r[tt..tt + t.target_type.len()].copy_from_slice(t.target_type.as_bytes());
        r[SPEC..SPEC + t.params.len()].copy_from_slice(t.params.as_bytes());
    }
    Ok(out)
}

/// Encodes a `DM_TARGET_MSG` payload: `u64 sector`, then the NUL-terminated message.
pub fn encode_message(sector: u64, message: &str) -> Result<Vec<u8>> {
    if message.is_empty() || message.contains('\0') {
        return Err(Error::invalid(
            "target message",
            message,
            "empty or contains NUL",
        ));
    }
    let mut out = Vec::with_capacity(8 + message.len() + 1);
    out.extend_from_slice(&sector.to_ne_bytes());
    out.extend_from_slice(message.as_bytes());
    out.push(0);
    out.resize(align8(out.len()).unwrap_or(out.len()), 0);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dev_encoding_round_trips() {
        for (ma, mi) in [
            (8, 16),
            (253, 0),
            (253, 300),
            (259, 1 << 19),
            (4095, 0xfffff),
        ] {
            let d = DevNum {
                major: ma,
                minor: mi,
            };
            assert_eq!(decode_dev(encode_dev(d)), d);
        }
        // The kernel's new_encode_dev of 253:300 (minor above 255 splits).
        assert_eq!(
            encode_dev(DevNum {
                major: 253,
                minor: 300
            }),
            0x10_fd2c
        );
    }

    #[test]
    fn request_header_layout() {
        let mut buf = vec![0xaa; 1024];
        let req = Request {
            id: Some(DevId::Name("mpatha")),
            flags: sys::DM_DEFERRED_REMOVE,
            payload: b"xy",
            ..Request::default()
        };
        write_request(&mut buf, &req).unwrap();
        let h = decode_header(&buf).unwrap();
        assert_eq!(h.version, [4, 0, 0]);
        assert_eq!(h.data_size, 1024);
        assert_eq!(h.data_start, 312);
        assert_eq!(h.flags, sys::DM_DEFERRED_REMOVE);
        assert_eq!(h.event_nr, 0);
        assert_eq!(h.name, "mpatha");
        assert_eq!(h.uuid, "");
        assert_eq!(&buf[312..315], b"xy\0");
    }
}

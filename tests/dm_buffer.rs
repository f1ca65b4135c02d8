//! Host tests of the device-mapper reply decoders: buffers laid out as dm-ioctl.c writes
//! them, then truncated, corrupted and filled with garbage. Every input must decode to a
//! value or to `Error::Invalid`; none may panic.

use lunkit::dm::buffer::{
    self, HEADER_SIZE, Request, decode_deps, decode_header, decode_message, decode_names,
    decode_targets, encode_targets, write_request,
};
use lunkit::dm::{DevId, ListedUuid, Target};
use lunkit::{DevNum, Error};
use lunkit_sys::dm as sys;

fn dev(major: u32, minor: u32) -> DevNum {
    DevNum { major, minor }
}

fn align8(n: usize) -> usize {
    (n + 7) & !7
}

fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_ne_bytes());
}

fn put64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_ne_bytes());
}

/// A `DM_LIST_DEVICES` payload as `list_devices()` writes it with `DM_UUID_FLAG`.
fn name_list(devs: &[(&str, DevNum, u32, Option<&str>)]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut prev: Option<usize> = None;
    for (name, d, event_nr, uuid) in devs {
        let at = out.len();
        if let Some(p) = prev {
            let next = (at - p) as u32;
            put32(&mut out, p + 8, next);
        }
        let name_end = at + 12 + name.len() + 1;
        let ext = align8(name_end);
        let mut end = ext + 8;
        let uuid_at = align8(end);
        if let Some(u) = uuid {
            end = align8(uuid_at + u.len() + 1);
        } else {
            end = uuid_at;
        }
        out.resize(end, 0);
        put64(&mut out, at, buffer::encode_dev(*d));
        put32(&mut out, at + 8, 0);
        out[at + 12..at + 12 + name.len()].copy_from_slice(name.as_bytes());
        put32(&mut out, ext, *event_nr);
        let flags = if uuid.is_some() {
            sys::DM_NAME_LIST_FLAG_HAS_UUID
        } else {
            sys::DM_NAME_LIST_FLAG_DOESNT_HAVE_UUID
        };
        put32(&mut out, ext + 4, flags);
        if let Some(u) = uuid {
            out[uuid_at..uuid_at + u.len()].copy_from_slice(u.as_bytes());
        }
        prev = Some(at);
    }
    out
}

/// A `DM_TABLE_STATUS` payload as `retrieve_status()` writes it (`next` from the first spec).
fn status_payload(targets: &[Target]) -> Vec<u8> {
    let mut out = Vec::new();
    for t in targets {
        let at = out.len();
        let end = align8(at + 40 + t.params.len() + 1);
        out.resize(end, 0);
        put64(&mut out, at, t.start);
        put64(&mut out, at + 8, t.length);
        put32(&mut out, at + 20, end as u32);
        out[at + 24..at + 24 + t.target_type.len()].copy_from_slice(t.target_type.as_bytes());
        out[at + 40..at + 40 + t.params.len()].copy_from_slice(t.params.as_bytes());
    }
    out
}

fn target(start: u64, length: u64, tt: &str, params: &str) -> Target {
    Target {
        start,
        length,
        target_type: tt.into(),
        params: params.into(),
    }
}

fn assert_invalid<T: std::fmt::Debug>(r: Result<T, Error>, what: &str) {
    match r {
        Err(Error::Invalid { .. }) => {}
        other => panic!("{what}: expected Error::Invalid, got {other:?}"),
    }
}

const MPATH_UUID: &str = "mpath-36001405a1b2c3d4e5f60718293a4b5c6";

fn sample_list() -> Vec<u8> {
    name_list(&[
        ("mpatha", dev(253, 0), 3, Some(MPATH_UUID)),
        (
            "mpatha1",
            dev(253, 1),
            1,
            Some("part1-mpath-36001405a1b2c3d4e5f60718293a4b5c6"),
        ),
        ("plain", dev(253, 300), 0, None),
    ])
}

#[test]
fn name_list_decodes_names_numbers_event_nrs_and_uuids() {
    let list = decode_names(&sample_list(), true).unwrap();
    assert_eq!(list.len(), 3);
    assert_eq!(list[0].name, "mpatha");
    assert_eq!(list[0].dev, dev(253, 0));
    assert_eq!(list[0].event_nr, Some(3));
    assert_eq!(list[0].uuid, ListedUuid::Some(MPATH_UUID.into()));
    assert_eq!(list[1].name, "mpatha1");
    assert_eq!(list[2].dev, dev(253, 300));
    assert_eq!(list[2].uuid, ListedUuid::None);
}

#[test]
fn name_list_without_extension_has_unknown_uuids() {
    // Pre-4.37 layout: records are name only, padded to 8.
    let mut out = vec![0u8; 48];
    put64(&mut out, 0, buffer::encode_dev(dev(253, 0)));
    put32(&mut out, 8, 24);
    out[12..16].copy_from_slice(b"abc\0");
    put64(&mut out, 24, buffer::encode_dev(dev(253, 1)));
    out[36..40].copy_from_slice(b"xyz\0");
    let list = decode_names(&out, false).unwrap();
    assert_eq!(list.len(), 2);
    assert!(
        list.iter()
            .all(|d| d.uuid == ListedUuid::Unknown && d.event_nr.is_none())
    );
    assert_eq!(list[1].name, "xyz");
}

#[test]
fn empty_name_list() {
    assert!(decode_names(&[], true).unwrap().is_empty());
    // The kernel's "no devices" marker: dev == 0 in the first record.
    assert!(decode_names(&[0u8; 16], true).unwrap().is_empty());
}

#[test]
fn every_prefix_of_a_name_list_is_a_value_or_invalid() {
    let full = sample_list();
    for len in 0..full.len() {
        match decode_names(&full[..len], true) {
            Ok(v) => assert!(v.len() <= 3),
            Err(Error::Invalid { .. }) => {}
            Err(e) => panic!("prefix {len}: {e}"),
        }
    }
}

#[test]
fn name_list_next_out_of_bounds_or_backwards_is_invalid() {
    let full = sample_list();
    for bad_next in [
        1u32,
        4,
        12,
        13,
        0xffff_fff0,
        full.len() as u32 + 8,
        u32::MAX,
    ] {
        let mut b = full.clone();
        put32(&mut b, 8, bad_next);
        assert_invalid(decode_names(&b, true), &format!("next={bad_next}"));
    }
}

#[test]
fn name_list_garbage_never_panics() {
    // Deterministic pseudo-random bytes (xorshift), with a few shapes that stress parsing.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for round in 0..2000 {
        let len = (round * 7) % 300;
        let mut b = Vec::with_capacity(len);
        for _ in 0..len {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            b.push((x >> 24) as u8);
        }
        let _ = decode_names(&b, true);
        let _ = decode_names(&b, false);
        let _ = decode_targets(&b, (x % 5) as u32);
        let _ = decode_targets(&b, u32::MAX);
        let _ = decode_deps(&b);
        let _ = decode_message(&b, sys::DM_DATA_OUT_FLAG);
        let _ = buffer::decode_target_versions(&b);
        if b.len() >= HEADER_SIZE {
            if let Ok(h) = decode_header(&b) {
                let _ = buffer::payload(&b, &h);
            }
        }
    }
}

#[test]
fn name_list_non_utf8_name_is_invalid() {
    let mut b = sample_list();
    b[12] = 0xff;
    assert_invalid(decode_names(&b, true), "non-UTF-8 name");
}

#[test]
fn name_list_uuid_flag_with_missing_uuid_is_invalid() {
    // One record whose flags claim a uuid that is not there (record ends after flags).
    let mut b = name_list(&[("a", dev(253, 0), 0, None)]);
    put32(&mut b, 16 + 4, sys::DM_NAME_LIST_FLAG_HAS_UUID);
    assert_invalid(decode_names(&b, true), "uuid flag without uuid");
}

fn mpath_targets() -> Vec<Target> {
    vec![
        target(
            0,
            2097152,
            "multipath",
            "2 0 0 0 2 1 A 0 1 0 8:16 A 0 E 0 1 0 8:32 F 1 ",
        ),
        target(2097152, 8, "linear", "8:48 0"),
    ]
}

#[test]
fn status_decodes_targets() {
    let p = status_payload(&mpath_targets());
    assert_eq!(decode_targets(&p, 2).unwrap(), mpath_targets());
    assert_eq!(decode_targets(&p, 1).unwrap(), mpath_targets()[..1]);
    assert!(decode_targets(&[], 0).unwrap().is_empty());
}

#[test]
fn every_prefix_of_a_status_is_a_value_or_invalid() {
    let full = status_payload(&mpath_targets());
    for len in 0..full.len() {
        match decode_targets(&full[..len], 2) {
            // Only the alignment padding after the last NUL may be cut off.
            Ok(v) => assert_eq!(v, mpath_targets(), "prefix {len}"),
            Err(Error::Invalid { .. }) => {}
            Err(e) => panic!("prefix {len}: {e}"),
        }
    }
}

#[test]
fn status_next_must_move_forward() {
    let full = status_payload(&mpath_targets());
    // next pointing at itself (would loop), inside its own params, and past the end.
    for bad in [0u32, 8, 40, full.len() as u32, u32::MAX] {
        let mut b = full.clone();
        put32(&mut b, 20, bad);
        assert_invalid(decode_targets(&b, 2), &format!("next={bad}"));
    }
    // A target count larger than what is there.
    assert_invalid(decode_targets(&full, 3), "count 3 of 2");
    assert_invalid(decode_targets(&full, u32::MAX), "count u32::MAX");
}

#[test]
fn status_params_must_be_terminated() {
    let mut b = status_payload(&[target(0, 8, "linear", "8:16 0")]);
    let last = b.len();
    for byte in &mut b[40..last] {
        if *byte == 0 {
            *byte = b'x';
        }
    }
    assert_invalid(decode_targets(&b, 1), "unterminated params");
}

#[test]
fn table_load_encoding_is_what_the_kernel_walks() {
    let targets = mpath_targets();
    let enc = encode_targets(&targets).unwrap();
    // Input `next` is relative to the current spec and 8-aligned.
    let first_next = u32::from_ne_bytes(enc[20..24].try_into().unwrap()) as usize;
    assert_eq!(first_next % 8, 0);
    assert_eq!(first_next, align8(40 + targets[0].params.len() + 1));
    assert_eq!(&enc[24..33], b"multipath");
    assert_eq!(&enc[first_next + 24..first_next + 30], b"linear");
    assert_eq!(enc.len() % 8, 0);
    // A type that does not fit in 16 bytes, and a NUL in params, are refused.
    assert_invalid(
        encode_targets(&[target(0, 1, "a-very-long-type-name", "")]),
        "long type",
    );
    assert_invalid(encode_targets(&[target(0, 1, "linear", "8:16\0 0")]), "NUL");
}

#[test]
fn deps_decode_and_reject_truncation() {
    let mut b = vec![0u8; 8 + 2 * 8];
    put32(&mut b, 0, 2);
    put64(&mut b, 8, buffer::encode_dev(dev(8, 16)));
    put64(&mut b, 16, buffer::encode_dev(dev(8, 32)));
    assert_eq!(decode_deps(&b).unwrap(), vec![dev(8, 16), dev(8, 32)]);
    for len in 0..b.len() {
        assert_invalid(decode_deps(&b[..len]), &format!("deps prefix {len}"));
    }
    put32(&mut b, 0, u32::MAX);
    assert_invalid(decode_deps(&b), "huge count");
}

#[test]
fn message_reply_only_with_data_out() {
    assert_eq!(decode_message(b"ok\0junk", 0).unwrap(), None);
    assert_eq!(
        decode_message(b"ok\0junk", sys::DM_DATA_OUT_FLAG).unwrap(),
        Some("ok".into())
    );
    assert_invalid(decode_message(b"ok", sys::DM_DATA_OUT_FLAG), "unterminated");
}

#[test]
fn header_round_trip_and_payload_bounds() {
    let mut b = vec![0u8; 1024];
    let req = Request {
        id: Some(DevId::Uuid(MPATH_UUID)),
        flags: sys::DM_STATUS_TABLE_FLAG,
        ..Request::default()
    };
    write_request(&mut b, &req).unwrap();
    let h = decode_header(&b).unwrap();
    assert_eq!(h.uuid, MPATH_UUID);
    assert_eq!(h.name, "");
    assert_eq!(h.flags, sys::DM_STATUS_TABLE_FLAG);
    // Pretend a reply: data_size beyond the buffer must be refused.
    put32(&mut b, 12, 4096);
    let h = decode_header(&b).unwrap();
    assert_invalid(buffer::payload(&b, &h), "data_size beyond buffer");
    // data_size below data_start is an empty payload (an empty device list).
    put32(&mut b, 12, 312);
    let h = decode_header(&b).unwrap();
    assert!(buffer::payload(&b, &h).unwrap().is_empty());
    // data_start inside the header is refused.
    put32(&mut b, 16, 8);
    put32(&mut b, 12, 1024);
    let h = decode_header(&b).unwrap();
    assert_invalid(buffer::payload(&b, &h), "data_start in header");
    // Short buffers.
    for len in [0, 1, 100, HEADER_SIZE - 1] {
        assert_invalid(decode_header(&b[..len]), "short header");
    }
    // A name filling all 128 bytes without NUL decodes to all of it.
    b[48..176].fill(b'n');
    assert_eq!(decode_header(&b).unwrap().name.len(), 128);
}

#[test]
fn requests_refuse_bad_names_and_small_buffers() {
    let mut b = vec![0u8; 1024];
    for bad in ["", "a/b", ".", "..", &"x".repeat(128)] {
        let req = Request {
            id: Some(DevId::Name(bad)),
            ..Request::default()
        };
        assert_invalid(write_request(&mut b, &req), bad);
    }
    let mut small = vec![0u8; HEADER_SIZE - 1];
    assert_invalid(write_request(&mut small, &Request::default()), "small");
    let req = Request {
        payload: &[1; 800],
        ..Request::default()
    };
    assert_invalid(write_request(&mut b, &req), "payload does not fit");
}

//! device-mapper ioctl replies: `lunkit::dm::buffer::decode_*` and `payload`.
//!
//! The first byte picks the decoder, the rest is the buffer.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lunkit::dm::buffer::{
    decode_deps, decode_dev, decode_header, decode_message, decode_names, decode_target_versions,
    decode_targets, encode_dev, encode_targets, payload,
};
use lunkit_sys::dm::DM_DATA_OUT_FLAG;

fn targets(buf: &[u8], count: u32) {
    let Ok(ts) = decode_targets(buf, count) else {
        return;
    };
    assert_eq!(ts.len(), count as usize);
    // What decodes re-encodes (when it is loadable at all) and decodes to the same targets.
    if let Ok(enc) = encode_targets(&ts) {
        let status = lunkit_fuzz::load_to_status_layout(enc, ts.len());
        assert_eq!(decode_targets(&status, count).unwrap(), ts);
    }
}

fn names(buf: &[u8], with_event_nr: bool) {
    if let Ok(list) = decode_names(buf, with_event_nr) {
        for d in list {
            assert_eq!(decode_dev(encode_dev(d.dev)), d.dev);
            assert_eq!(d.event_nr.is_some(), with_event_nr);
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&sel, buf)) = data.split_first() else {
        return;
    };
    match sel % 8 {
        0 => {
            // A whole reply: header, then its payload through every decoder.
            let Ok(h) = decode_header(buf) else {
                return;
            };
            let Ok(p) = payload(buf, &h) else {
                return;
            };
            assert!(p.len() <= buf.len());
            names(p, h.version[1] >= 37);
            targets(p, h.target_count);
            let _ = decode_deps(p);
            let _ = decode_message(p, h.flags);
            let _ = decode_target_versions(p);
        }
        1 => names(buf, true),
        2 => names(buf, false),
        3 => {
            let Some((&count, rest)) = buf.split_first() else {
                return;
            };
            targets(rest, u32::from(count % 16));
        }
        4 => {
            if let Ok(deps) = decode_deps(buf) {
                assert!(buf.len() >= 8 + 8 * deps.len());
            }
        }
        5 => {
            assert_eq!(decode_message(buf, 0).unwrap(), None);
            if let Ok(Some(m)) = decode_message(buf, DM_DATA_OUT_FLAG) {
                assert!(m.len() < buf.len() && !m.contains('\0'));
            }
        }
        6 => {
            if let Ok(v) = decode_target_versions(buf) {
                assert!(v.len() <= buf.len() / 16 + 1);
            }
        }
        _ => {
            // A huge target count on a short buffer must fail, not loop or allocate.
            let Some((&hi, rest)) = buf.split_first() else {
                return;
            };
            targets(rest, u32::from(hi) << 24 | 0xff_ffff);
        }
    }
});

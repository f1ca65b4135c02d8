//! PERSISTENT RESERVE IN data: `lunkit::pr::{ReadKeys, ReadReservation}::parse`, and the
//! `IOC_PR_*` return decoding `lunkit::pr::Status::from_ioctl`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lunkit::pr::{ParseError, ReadKeys, ReadReservation, Status};

fuzz_target!(|data: &[u8]| {
    match ReadKeys::parse(data) {
        Ok(k) => {
            // Only whole keys inside both the buffer and ADDITIONAL LENGTH.
            assert!(k.keys.len() * 8 <= data.len() - 8);
            assert!(k.keys.len() * 8 <= k.stated);
            // Asking for more exactly when the buffer stopped short of the stated list.
            let whole = data.len() - 8 >= k.stated - k.stated % 8;
            assert_eq!(k.needed().is_none(), whole, "{k:?}");
            if let Some(n) = k.needed() {
                assert!(n > data.len());
            }
            // The keys are the buffer's bytes, in order.
            for (i, key) in k.keys.iter().enumerate() {
                let at = 8 + i * 8;
                assert_eq!(key.get().to_be_bytes(), data[at..at + 8]);
            }
        }
        Err(ParseError::Short { len }) => assert!(len < 8 && len == data.len()),
    }
    match ReadReservation::parse(data) {
        Ok(r) => {
            if let Some(h) = r.holder {
                assert!(data.len() >= 24 && r.stated >= 16);
                assert_eq!(h.key.get().to_be_bytes(), data[8..16]);
                assert!(h.type_code < 16 && h.scope < 16);
                assert_eq!(h.kind.map(|t| t.spc_code()), h.kind.and(Some(h.type_code)));
            }
            assert_eq!(r.complete, r.stated == 0 || r.holder.is_some());
        }
        Err(ParseError::Short { len }) => assert!(len < 8),
    }
    if data.len() >= 4 {
        let ret = i32::from_ne_bytes([data[0], data[1], data[2], data[3]]).max(0);
        let s = Status::from_ioctl(ret);
        assert_eq!(s == Status::Done, ret == 0);
        assert_eq!(s == Status::Conflict, ret & 0xff == 0x18);
    }
});

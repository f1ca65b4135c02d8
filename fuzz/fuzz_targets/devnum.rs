//! Device numbers: `lunkit::DevNum` from `MAJOR:MINOR`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lunkit::DevNum;
use lunkit::dm::buffer::{decode_dev, encode_dev};

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(d) = s.parse::<DevNum>() {
        assert!(s.bytes().all(|b| b.is_ascii_digit() || b == b':'));
        assert_eq!(d.to_string().parse::<DevNum>().unwrap(), d);
        // The kernel's 64-bit encoding (dm ioctls) carries any 32-bit pair.
        assert_eq!(decode_dev(encode_dev(d)), d);
    }
});

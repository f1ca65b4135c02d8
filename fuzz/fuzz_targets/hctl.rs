//! SCSI addresses: `lunkit::Hctl` from `H:C:T:L`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lunkit::{Error, Hctl};

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    match s.parse::<Hctl>() {
        Ok(h) => {
            // Only plain decimal parts separated by ':' get through (the result names sysfs
            // directories), and the address prints back to itself.
            assert!(s.bytes().all(|b| b.is_ascii_digit() || b == b':'));
            assert_eq!(h.to_string().parse::<Hctl>().unwrap(), h);
        }
        Err(e) => assert!(
            matches!(
                e,
                Error::Invalid {
                    kind: "H:C:T:L",
                    ..
                }
            ),
            "{e:?}"
        ),
    }
});

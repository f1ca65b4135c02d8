//! FC world wide names: `lunkit::Wwn` from `0x…`, bare hex or `aa:bb:…`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lunkit::{Error, Wwn};

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    match s.parse::<Wwn>() {
        Ok(w) => {
            let shown = w.to_string();
            assert_eq!(shown.len(), 18);
            assert_eq!(shown.parse::<Wwn>().unwrap(), w);
            // The digits are the input's, in order.
            let digits: String = s
                .trim_start_matches("0x")
                .trim_start_matches("0X")
                .chars()
                .filter(|c| c.is_ascii_hexdigit())
                .collect();
            assert_eq!(u64::from_str_radix(&digits, 16).unwrap(), w.0);
        }
        Err(e) => assert!(matches!(e, Error::Invalid { kind: "WWN", .. }), "{e:?}"),
    }
});

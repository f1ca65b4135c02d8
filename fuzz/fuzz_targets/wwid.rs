//! Volume WWIDs: `lunkit::Wwid` from the sysfs (`naa.…`) or multipath (`3…`) form.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lunkit::{Error, Wwid};

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    match s.parse::<Wwid>() {
        Ok(w) => {
            // Both forms the library writes parse back to the same volume; neither can
            // climb out of a directory or break a line.
            for form in [w.to_string(), w.as_sysfs().to_owned(), w.to_multipath()] {
                assert!(!form.contains('/') && !form.bytes().any(|b| b.is_ascii_control()));
                assert_eq!(form.parse::<Wwid>().unwrap(), w, "{form:?}");
            }
        }
        Err(e) => assert!(matches!(e, Error::Invalid { kind: "WWID", .. }), "{e:?}"),
    }
});

//! dm-multipath status lines: `lunkit::multipath::Status::parse`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lunkit::multipath::Status;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(st) = Status::parse(s) else {
        return;
    };
    assert!(st.active_paths() <= st.paths().count());
    let line = lunkit_fuzz::format_status(&st);
    assert_eq!(Status::parse(&line).unwrap(), st, "{line}");
});

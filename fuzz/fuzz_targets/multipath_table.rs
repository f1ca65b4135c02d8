//! dm-multipath table lines: `lunkit::multipath::Table::parse`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lunkit::multipath::Table;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(t) = Table::parse(s) else {
        return;
    };
    assert_eq!(
        t.queue_if_no_path(),
        t.features.iter().any(|f| f == "queue_if_no_path")
    );
    let line = lunkit_fuzz::format_table(&t);
    assert_eq!(Table::parse(&line).unwrap(), t, "{line}");
});

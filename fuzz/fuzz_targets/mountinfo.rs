//! `/proc/self/mountinfo`: `lunkit::block::mountinfo::{parse, parse_line, unescape}`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lunkit::block::mountinfo::{escape, parse, parse_line, unescape};

fuzz_target!(|data: &[u8]| {
    // Decoding never grows a field, and undoes escaping exactly.
    assert!(unescape(data).len() <= data.len());
    assert_eq!(unescape(&escape(data)), data);
    // Every entry that parses writes back as a line that parses to the same entry.
    if let Ok(entries) = parse(data) {
        for e in entries {
            assert_eq!(parse_line(&e.to_line()).unwrap(), e);
        }
    }
    if let Ok(e) = parse_line(data) {
        assert_eq!(parse_line(&e.to_line()).unwrap(), e);
    }
});

//! Inputs the fuzz targets under `fuzz/` found to break a parser, kept as plain tests so the
//! fix stays fixed without nightly or libFuzzer. Each test names its target and what was wrong.

use lunkit::Wwid;

/// `wwid`: a 254-byte multipath-form WWID was accepted, but its sysfs form (`3…` becomes
/// `naa.…`, three bytes longer) was over the length limit, so the WWID the library displays
/// did not parse back.
#[test]
fn wwid_at_the_length_limit_parses_back_in_both_forms() {
    let found = concat!(
        "366666666666666666666666666666666666666666666666666666036036001b01bc006666666666",
        "66666666666666666666666666666666666666666666036036001b01bc0066666666666666666666",
        "66666666666666666666666666666666666666666666666666666666666666036036001b01bc001b",
        "c6001bc808A025",
    );
    assert_eq!(found.len(), 254);
    let w: Wwid = found.parse().unwrap();
    assert_eq!(w.to_string().parse::<Wwid>().unwrap(), w);
    assert_eq!(w.to_multipath().parse::<Wwid>().unwrap(), w);

    // The longest T10 designator (255 bytes) in both forms, and one byte more in neither.
    let t10 = "x".repeat(255);
    for s in [format!("1{t10}"), format!("t10.{t10}")] {
        let w: Wwid = s.parse().unwrap();
        assert_eq!(w.as_sysfs().len(), 259);
        assert_eq!(w.to_string().parse::<Wwid>().unwrap(), w);
        assert_eq!(w.to_multipath().parse::<Wwid>().unwrap(), w);
    }
    for s in [format!("1x{t10}"), format!("t10.x{t10}")] {
        assert!(s.parse::<Wwid>().is_err(), "{} bytes", s.len());
    }
}

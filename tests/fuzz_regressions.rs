//! Inputs the fuzz targets under `fuzz/` found to break a parser, kept as plain tests so the
//! fix stays fixed without nightly or libFuzzer. Each test names its target and what was wrong.

use lunkit::Wwid;
use lunkit::block::mountinfo::{parse, parse_line};

/// `mountinfo`: the parser unescapes options and tags (`\040` is a space) but `to_line` wrote
/// them back raw, so a tag holding a space split into two tags when read back.
#[test]
fn mountinfo_tag_with_escaped_space_round_trips() {
    let found = b"36 22 8:33 / /mnt/w$th\\040space rw,relatime shared:2ext4 \
/dev/mapper/mpath\\00 mt/with\\040space rw,relatime shared:10 mast/sdc1 rw,tab rw - ext4 \
/dev/mapper/mpath\\040a rw\n";
    let entries = parse(found).unwrap();
    assert_eq!(entries.len(), 1);
    let e = &entries[0];
    assert!(e.tags.iter().any(|t| t == "mt/with space"), "{:?}", e.tags);
    assert_eq!(&parse_line(&e.to_line()).unwrap(), e);
}

/// `mountinfo`, the same bug in its other shapes: escapes in options and superblock options
/// (filesystems write `\040` and `\134` there with `seq_show_option`), and a tag that decodes
/// to a lone `-`, which read back as the end of the tags.
#[test]
fn mountinfo_escaped_options_and_dash_tag_round_trip() {
    for line in [
        &b"1 1 0:0 / / rw\\040x - ext4 /dev/sda rw"[..],
        b"1 1 0:0 / / rw - overlay overlay rw,upperdir=/a\\040b,workdir=/c\\134d",
        b"1 1 0:0 / / rw - ext4 /dev/sda rw\\012",
        b"1 1 0:0 / / rw \\055 - ext4 /dev/sda rw",
        b"1 1 0:0 / / rw a\\134060b - ext4 /dev/sda rw",
    ] {
        let e = parse_line(line).unwrap();
        assert_eq!(
            parse_line(&e.to_line()).unwrap(),
            e,
            "{}",
            String::from_utf8_lossy(line)
        );
    }
    let e = parse_line(b"1 1 0:0 / / rw \\055 - ext4 /dev/sda rw").unwrap();
    assert_eq!(e.tags, ["-"]);
    let e = parse_line(b"1 1 0:0 / / rw - overlay overlay rw,upperdir=/a\\040b").unwrap();
    assert_eq!(e.super_options, "rw,upperdir=/a b");
    assert!(e.to_line().ends_with(b" rw,upperdir=/a\\040b"));
}

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

//! Property tests of the parsers (issue 7): what the library formats, or what the kernel
//! would write, parses back to the same value; and no input, however mangled, makes a parser
//! panic. The formatters here are written from the kernel's side (dm-ioctl.c, dm-mpath.c,
//! proc_namespace.c, lib/kobject_uevent.c), independently of the parsers they check.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::PathBuf;

use lunkit::block::mountinfo::{self, MountEntry, escape, parse, parse_line, unescape};
use lunkit::dm::buffer::{self, decode_dev, decode_names, decode_targets, encode_dev};
use lunkit::dm::{Device, ListedUuid, Target};
use lunkit::multipath::{
    GroupState, Status, StatusGroup, StatusPath, Table, TableGroup, TablePath,
};
use lunkit::uevent::{Action, Uevent};
use lunkit::{DevNum, Error, Hctl, Wwid, Wwn};
use lunkit_sys::dm as sys;
use proptest::prelude::*;

// ---------------------------------------------------------------------------------------
// Shared strategies
// ---------------------------------------------------------------------------------------

fn devnum() -> impl Strategy<Value = DevNum> {
    (any::<u32>(), any::<u32>()).prop_map(|(major, minor)| DevNum { major, minor })
}

/// A valid input with a few bytes overwritten and maybe cut short: near-misses reach deeper
/// into a parser than random bytes do.
fn mangled(valid: Vec<u8>) -> impl Strategy<Value = Vec<u8>> {
    let len = valid.len().max(1);
    (
        prop::collection::vec((0..len, any::<u8>()), 0..4),
        0..=valid.len(),
    )
        .prop_map(move |(edits, keep)| {
            let mut v = valid.clone();
            for (at, b) in edits {
                if at < v.len() {
                    v[at] = b;
                }
            }
            v.truncate(keep);
            v
        })
}

// ---------------------------------------------------------------------------------------
// H:C:T:L, device numbers, WWNs
// ---------------------------------------------------------------------------------------

proptest! {
    #[test]
    fn hctl_display_parses_back(
        h in any::<u32>(),
        c in any::<u32>(),
        t in any::<u32>(),
        l in any::<u64>(),
    ) {
        let hctl = Hctl::new(h, c, t, l);
        let shown = hctl.to_string();
        prop_assert_eq!(&shown, &format!("{h}:{c}:{t}:{l}"));
        prop_assert_eq!(shown.parse::<Hctl>().unwrap(), hctl);
    }

    #[test]
    fn hctl_never_panics_and_accepts_only_decimal_parts(s in "\\PC{0,40}|[0-9:+ -]{0,40}") {
        match s.parse::<Hctl>() {
            Ok(h) => {
                prop_assert!(s.bytes().all(|b| b.is_ascii_digit() || b == b':'));
                prop_assert_eq!(h.to_string().parse::<Hctl>().unwrap(), h);
            }
            Err(e) => {
                let invalid = matches!(e, Error::Invalid { kind: "H:C:T:L", .. });
                prop_assert!(invalid, "{:?}", e);
            }
        }
    }

    #[test]
    fn devnum_display_parses_back_and_survives_the_dm_encoding(d in devnum()) {
        prop_assert_eq!(d.to_string().parse::<DevNum>().unwrap(), d);
        prop_assert_eq!(decode_dev(encode_dev(d)), d);
    }

    #[test]
    fn devnum_never_panics(s in "\\PC{0,30}|[0-9:-]{0,30}") {
        if let Ok(d) = s.parse::<DevNum>() {
            prop_assert_eq!(d.to_string().parse::<DevNum>().unwrap(), d);
        }
    }

    #[test]
    fn wwn_every_written_form_parses_back(w in any::<u64>(), upper in any::<bool>()) {
        let wwn = Wwn(w);
        let hex = if upper { format!("{w:016X}") } else { format!("{w:016x}") };
        let groups: Vec<&str> = (0..8).map(|i| &hex[2 * i..2 * i + 2]).collect();
        for form in [
            wwn.to_string(),
            hex.clone(),
            format!("0x{hex}"),
            format!("0X{hex}"),
            groups.join(":"),
            groups.join("-"),
        ] {
            prop_assert_eq!(form.parse::<Wwn>().unwrap(), wwn, "{}", form);
        }
        prop_assert_eq!(wwn.to_string(), format!("0x{w:016x}"));
    }

    #[test]
    fn wwn_never_panics(s in "\\PC{0,30}|(0x)?[0-9a-fA-F:-]{0,30}") {
        if let Ok(w) = s.parse::<Wwn>() {
            prop_assert_eq!(w.to_string().parse::<Wwn>().unwrap(), w);
        }
    }
}

// ---------------------------------------------------------------------------------------
// WWIDs
// ---------------------------------------------------------------------------------------

proptest! {
    #[test]
    fn naa_wwid_in_both_forms_is_one_volume(h in "[0-9a-fA-F]{1,32}") {
        let lower = h.to_ascii_lowercase();
        let sysfs: Wwid = format!("naa.{h}").parse().unwrap();
        let mpath: Wwid = format!("3{h}").parse().unwrap();
        prop_assert_eq!(&sysfs, &mpath);
        prop_assert_eq!(sysfs.as_sysfs(), format!("naa.{lower}"));
        prop_assert_eq!(sysfs.to_multipath(), format!("3{lower}"));
        prop_assert_eq!(sysfs.to_string().parse::<Wwid>().unwrap(), sysfs.clone());
        prop_assert_eq!(sysfs.to_multipath().parse::<Wwid>().unwrap(), sysfs);
    }

    #[test]
    fn eui_wwid_in_both_forms_is_one_volume(h in "[0-9a-fA-F]{1,32}") {
        let sysfs: Wwid = format!("eui.{h}").parse().unwrap();
        let mpath: Wwid = format!("2{h}").parse().unwrap();
        prop_assert_eq!(&sysfs, &mpath);
        prop_assert_eq!(sysfs.to_multipath(), format!("2{}", h.to_ascii_lowercase()));
        prop_assert_eq!(sysfs.to_multipath().parse::<Wwid>().unwrap(), sysfs);
    }

    #[test]
    fn t10_wwid_in_both_forms_is_one_volume(t in "[ -.0-~]{1,80}") {
        // Printable ASCII without '/', spaces included (`t10.ATA     QEMU HARDDISK`).
        let sysfs: Wwid = format!("t10.{t}").parse().unwrap();
        let mpath: Wwid = format!("1{t}").parse().unwrap();
        prop_assert_eq!(&sysfs, &mpath);
        prop_assert_eq!(sysfs.as_sysfs(), format!("t10.{t}"));
        prop_assert_eq!(sysfs.to_multipath(), format!("1{t}"));
        prop_assert_eq!(sysfs.to_string().parse::<Wwid>().unwrap(), sysfs);
    }

    #[test]
    fn other_wwids_are_kept_as_they_are(s in "iqn\\.[a-z0-9.:-]{1,60}") {
        let w: Wwid = s.parse().unwrap();
        prop_assert_eq!(w.as_sysfs(), s.as_str());
        prop_assert_eq!(w.to_multipath(), s);
    }

    #[test]
    fn wwid_never_panics_and_what_parses_parses_back(
        s in "\\PC{0,300}|[123]?[0-9a-fA-F]{0,300}|(naa|eui|t10)\\.\\PC{0,40}"
    ) {
        match s.parse::<Wwid>() {
            Ok(w) => {
                prop_assert!(!w.as_sysfs().contains('/'));
                prop_assert_eq!(w.to_string().parse::<Wwid>().unwrap(), w.clone());
                prop_assert_eq!(w.to_multipath().parse::<Wwid>().unwrap(), w);
            }
            Err(e) => {
                let invalid = matches!(e, Error::Invalid { kind: "WWID", .. });
                prop_assert!(invalid, "{:?}", e);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// mountinfo
// ---------------------------------------------------------------------------------------

/// A path as the kernel may hold it: any bytes but NUL, the ones it escapes included.
fn path_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(
        prop_oneof![
            4 => b'!'..=b'~',
            1 => prop::sample::select(vec![b' ', b'\t', b'\n', b'\\', b'/', b'-']),
            1 => 0x80u8..=0xff,
            1 => 1u8..0x20,
        ],
        1..40,
    )
}

/// Options and tags: the kernel never escapes them, and they hold no whitespace.
fn word(re: &'static str) -> impl Strategy<Value = String> {
    proptest::string::string_regex(re).unwrap()
}

fn mount_entry() -> impl Strategy<Value = MountEntry> {
    (
        (any::<u32>(), any::<u32>(), devnum()),
        (path_bytes(), path_bytes()),
        word("r[ow](,[a-z_]{1,10}(=[a-z0-9]{1,5})?){0,4}"),
        prop::collection::vec(
            word("(shared|master|propagate_from):[0-9]{1,4}|unbindable"),
            0..4,
        ),
        // Types are escaped like paths (`fuse.my fs` would be `fuse.my\040fs`).
        word("[a-z0-9]{1,8}(\\.[a-z0-9 \\\\]{1,8})?"),
        prop::option::of(path_bytes()),
        // Superblock options go through `seq_show_option`, which escapes what it must: an
        // overlay's `upperdir=/a b` reads `upperdir=/a\040b`.
        word("(r[ow](,[a-z_]{1,10}(=[a-z0-9/: \\\\]{1,8})?){0,4})?"),
    )
        .prop_map(
            |(
                (id, parent, dev),
                (root, mount_point),
                options,
                tags,
                fs_type,
                source,
                super_options,
            )| {
                MountEntry {
                    id,
                    parent,
                    dev,
                    root: PathBuf::from(OsString::from_vec(root)),
                    mount_point: PathBuf::from(OsString::from_vec(mount_point)),
                    options,
                    tags,
                    fs_type,
                    // Old kernels wrote an empty source.
                    source: OsString::from_vec(source.unwrap_or_default()),
                    super_options,
                }
            },
        )
}

proptest! {
    #[test]
    fn mountinfo_line_parses_back(e in mount_entry()) {
        let line = e.to_line();
        // Escaping leaves exactly the separators: 6 fields, the tags, `-`, 3 fields.
        let fields = line.split(|&b| b == b' ').count();
        prop_assert_eq!(fields, 6 + e.tags.len() + 1 + 3, "{}", String::from_utf8_lossy(&line));
        prop_assert!(!line.contains(&b'\n'));
        prop_assert_eq!(parse_line(&line).unwrap(), e.clone());
        let mut with_newline = line;
        with_newline.push(b'\n');
        prop_assert_eq!(parse_line(&with_newline).unwrap(), e);
    }

    #[test]
    fn mountinfo_file_parses_back(entries in prop::collection::vec(mount_entry(), 0..8)) {
        let mut text = Vec::new();
        for e in &entries {
            text.extend_from_slice(&e.to_line());
            text.push(b'\n');
        }
        prop_assert_eq!(parse(&text).unwrap(), entries.clone());
        let devs: Vec<DevNum> = entries.iter().take(1).map(|e| e.dev).collect();
        let parsed = parse(&text).unwrap();
        let on: Vec<&MountEntry> = mountinfo::on_devices(&parsed, &devs).collect();
        prop_assert!(on.iter().all(|m| devs.contains(&m.dev)));
        prop_assert_eq!(on.len(), entries.iter().filter(|e| devs.contains(&e.dev)).count());
    }

    #[test]
    fn unescape_undoes_escape(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        let escaped = escape(&bytes);
        prop_assert!(!escaped.iter().any(|b| matches!(b, b' ' | b'\t' | b'\n')));
        prop_assert_eq!(unescape(&escaped), bytes);
    }

    #[test]
    fn mountinfo_never_panics_on_bytes(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        prop_assert!(unescape(&bytes).len() <= bytes.len());
        let _ = parse(&bytes);
        if let Ok(e) = parse_line(&bytes) {
            prop_assert_eq!(parse_line(&e.to_line()).unwrap(), e);
        }
    }

    #[test]
    fn mountinfo_never_panics_on_mangled_lines(
        bytes in mount_entry().prop_flat_map(|e| mangled(e.to_line()))
    ) {
        if let Ok(e) = parse_line(&bytes) {
            prop_assert_eq!(parse_line(&e.to_line()).unwrap(), e);
        }
    }
}

// ---------------------------------------------------------------------------------------
// uevents
// ---------------------------------------------------------------------------------------

fn action() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "add", "remove", "change", "move", "online", "offline", "bind", "unbind",
        ])
        .prop_map(str::to_owned),
        word("[a-z_]{1,10}"),
    ]
}

/// `KEY=VALUE` pairs as drivers add them; ACTION, DEVPATH and SEQNUM come from the core.
fn env_pairs() -> impl Strategy<Value = Vec<(String, String)>> {
    prop::collection::vec(
        (
            prop_oneof![
                prop::sample::select(vec![
                    "SUBSYSTEM",
                    "DEVTYPE",
                    "DEVNAME",
                    "MAJOR",
                    "MINOR",
                    "DISKSEQ",
                    "SDEV_UA",
                ])
                .prop_map(str::to_owned),
                word("[A-Z_][A-Z0-9_]{0,12}"),
            ],
            // Values are any text without NUL (`=` and `@` included).
            word("[^\u{0}]{0,24}"),
        )
            .prop_filter("core keys are added separately", |(k, _)| {
                !matches!(k.as_str(), "ACTION" | "DEVPATH" | "SEQNUM")
            }),
        0..8,
    )
}

/// `add@/devices/…\0ACTION=add\0DEVPATH=/devices/…\0…SEQNUM=n\0`, as the kernel sends it.
fn datagram(action: &str, devpath: &str, env: &[(String, String)], seqnum: u64) -> Vec<u8> {
    let mut out = format!("{action}@{devpath}\0ACTION={action}\0DEVPATH={devpath}\0").into_bytes();
    for (k, v) in env {
        out.extend_from_slice(format!("{k}={v}\0").as_bytes());
    }
    out.extend_from_slice(format!("SEQNUM={seqnum}\0").as_bytes());
    out
}

fn devpath() -> impl Strategy<Value = String> {
    word("(/[a-zA-Z0-9:._@-]{1,16}){1,8}")
}

proptest! {
    #[test]
    fn uevent_datagram_parses_back(
        action in action(),
        devpath in devpath(),
        env in env_pairs(),
        seqnum in any::<u64>(),
    ) {
        let ev = Uevent::parse(&datagram(&action, &devpath, &env, seqnum)).unwrap();
        prop_assert_eq!(ev.action.as_str(), action.as_str());
        if action == "add" {
            prop_assert_eq!(&ev.action, &Action::Add);
        }
        prop_assert_eq!(&ev.devpath, &devpath);
        prop_assert_eq!(ev.seqnum, seqnum);
        let last = |key: &str| env.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v.clone());
        prop_assert_eq!(ev.subsystem.clone(), last("SUBSYSTEM"));
        prop_assert_eq!(ev.devtype.clone(), last("DEVTYPE"));
        prop_assert_eq!(ev.devname.clone(), last("DEVNAME"));
        let mut all = vec![
            ("ACTION".to_owned(), action.clone()),
            ("DEVPATH".to_owned(), devpath.clone()),
        ];
        all.extend(env.iter().cloned());
        all.push(("SEQNUM".to_owned(), seqnum.to_string()));
        prop_assert_eq!(&ev.env, &all);
        for (k, v) in &env {
            let first = env.iter().find(|(k2, _)| k2 == k).map(|(_, v)| v.as_str());
            prop_assert_eq!(ev.get(k), first, "{}={}", k, v);
        }
    }

    #[test]
    fn uevent_header_and_keys_must_agree(
        action in action(),
        other in action(),
        devpath in devpath(),
        seqnum in any::<u64>(),
    ) {
        prop_assume!(action != other);
        let mut forged = format!("{action}@{devpath}\0ACTION={other}\0").into_bytes();
        forged.extend_from_slice(format!("SEQNUM={seqnum}\0").as_bytes());
        prop_assert!(Uevent::parse(&forged).is_err());
        // And without SEQNUM nothing is a kernel event.
        let no_seqnum = format!("{action}@{devpath}\0ACTION={action}\0");
        prop_assert!(Uevent::parse(no_seqnum.as_bytes()).is_err());
    }

    #[test]
    fn uevent_never_panics_on_bytes(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        if let Ok(ev) = Uevent::parse(&bytes) {
            prop_assert!(ev.devpath.starts_with('/'));
            prop_assert!(!ev.action.as_str().is_empty());
        }
    }

    #[test]
    fn uevent_never_panics_on_mangled_datagrams(
        bytes in (action(), devpath(), env_pairs(), any::<u64>())
            .prop_flat_map(|(a, d, e, s)| mangled(datagram(&a, &d, &e, s)))
    ) {
        if let Ok(ev) = Uevent::parse(&bytes) {
            prop_assert!(ev.devpath.starts_with('/'));
            if let Some(a) = ev.get("ACTION") {
                prop_assert_eq!(a, ev.action.as_str());
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// device-mapper buffers
// ---------------------------------------------------------------------------------------

const SPEC: usize = 40;
const NEXT: usize = 20;

fn align8(n: usize) -> usize {
    (n + 7) & !7
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes(b[at..at + 4].try_into().unwrap())
}

fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_ne_bytes());
}

fn put64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_ne_bytes());
}

fn target() -> impl Strategy<Value = Target> {
    (
        any::<u64>(),
        any::<u64>(),
        word("[a-z][a-z0-9_-]{0,14}"),
        word("[^\u{0}]{0,80}"),
    )
        .prop_map(|(start, length, target_type, params)| Target {
            start,
            length,
            target_type,
            params,
        })
}

/// Walks a `DM_TABLE_LOAD` payload as `populate_table` does: `next` relative to each spec.
fn kernel_walk_load(buf: &[u8], count: usize) -> Vec<Target> {
    let mut out = Vec::new();
    let mut off = 0;
    for _ in 0..count {
        let spec = &buf[off..off + SPEC];
        let tt = &spec[24..40];
        let tt_len = tt.iter().position(|&b| b == 0).unwrap();
        let params = &buf[off + SPEC..];
        let p_len = params.iter().position(|&b| b == 0).unwrap();
        out.push(Target {
            start: u64::from_ne_bytes(spec[0..8].try_into().unwrap()),
            length: u64::from_ne_bytes(spec[8..16].try_into().unwrap()),
            target_type: String::from_utf8(tt[..tt_len].to_vec()).unwrap(),
            params: String::from_utf8(params[..p_len].to_vec()).unwrap(),
        });
        let next = u32_at(spec, NEXT) as usize;
        assert_eq!(next % 8, 0, "records are 8-byte aligned");
        assert!(
            next > SPEC + p_len,
            "next points past the parameters and their NUL"
        );
        off += next;
    }
    assert_eq!(off, buf.len(), "the last record ends the payload");
    out
}

/// Rewrites a load payload's `next` (relative to each spec) to the status layout
/// (`retrieve_status`: relative to the first spec).
fn to_status_layout(mut buf: Vec<u8>, count: usize) -> Vec<u8> {
    let mut off = 0;
    for _ in 0..count {
        let abs = off + u32_at(&buf, off + NEXT) as usize;
        put32(&mut buf, off + NEXT, abs as u32);
        off = abs;
    }
    buf
}

/// How a `DM_LIST_DEVICES` record carries uuids.
#[derive(Debug, Clone, Copy)]
enum ListLayout {
    /// Before 4.37: the name only.
    NameOnly,
    /// 4.37 to 4.44: `event_nr` and `flags` (0) after the name.
    EventNr,
    /// 4.45+ with `DM_UUID_FLAG`: and the uuid when `flags` says there is one.
    Uuid,
}

/// A `DM_LIST_DEVICES` payload as `list_devices()` in dm-ioctl.c lays it out.
fn name_list(devs: &[(String, DevNum, u32, Option<String>)], layout: ListLayout) -> Vec<u8> {
    let mut out = Vec::new();
    let mut prev: Option<usize> = None;
    for (name, dev, event_nr, uuid) in devs {
        let at = out.len();
        if let Some(p) = prev {
            put32(&mut out, p + 8, (at - p) as u32);
        }
        let name_end = at + sys::DM_NAME_LIST_NAME_OFFSET + name.len() + 1;
        let end = match layout {
            ListLayout::NameOnly => align8(name_end),
            ListLayout::EventNr => align8(align8(name_end) + 8),
            ListLayout::Uuid => {
                let uuid_at = align8(align8(name_end) + 8);
                match uuid {
                    Some(u) => align8(uuid_at + u.len() + 1),
                    None => uuid_at,
                }
            }
        };
        out.resize(end, 0);
        put64(&mut out, at, buffer::encode_dev(*dev));
        let n = at + sys::DM_NAME_LIST_NAME_OFFSET;
        out[n..n + name.len()].copy_from_slice(name.as_bytes());
        if !matches!(layout, ListLayout::NameOnly) {
            let ext = align8(name_end);
            put32(&mut out, ext, *event_nr);
            if matches!(layout, ListLayout::Uuid) {
                let flags = if uuid.is_some() {
                    sys::DM_NAME_LIST_FLAG_HAS_UUID
                } else {
                    sys::DM_NAME_LIST_FLAG_DOESNT_HAVE_UUID
                };
                put32(&mut out, ext + 4, flags);
                if let Some(u) = uuid {
                    let uuid_at = align8(ext + 8);
                    out[uuid_at..uuid_at + u.len()].copy_from_slice(u.as_bytes());
                }
            }
        }
        prev = Some(at);
    }
    out
}

fn listed_device() -> impl Strategy<Value = (String, DevNum, u32, Option<String>)> {
    (
        word("[a-zA-Z0-9_.+-][a-zA-Z0-9_.+:-]{0,126}"),
        // A dm device never has major 0 (and a first record with dev 0 means "no devices").
        (1..=u32::MAX, any::<u32>()).prop_map(|(major, minor)| DevNum { major, minor }),
        any::<u32>(),
        prop::option::of(word("(part[0-9]-)?mpath-3[0-9a-f]{1,100}|[ -~]{1,128}")),
    )
}

proptest! {
    #[test]
    fn encoded_targets_are_what_the_kernel_walks_and_status_decodes(
        targets in prop::collection::vec(target(), 1..6)
    ) {
        let enc = buffer::encode_targets(&targets).unwrap();
        prop_assert_eq!(enc.len() % 8, 0);
        prop_assert_eq!(kernel_walk_load(&enc, targets.len()), targets.clone());
        let status = to_status_layout(enc, targets.len());
        prop_assert_eq!(decode_targets(&status, targets.len() as u32).unwrap(), targets);
    }

    #[test]
    fn target_specs_never_panic(
        bytes in prop::collection::vec(any::<u8>(), 0..400),
        count in 0u32..8,
    ) {
        if let Ok(ts) = decode_targets(&bytes, count) {
            prop_assert_eq!(ts.len(), count as usize);
        }
    }

    #[test]
    fn mangled_target_specs_never_panic(
        (bytes, count) in prop::collection::vec(target(), 1..4).prop_flat_map(|ts| {
            let n = ts.len() as u32;
            let status = to_status_layout(buffer::encode_targets(&ts).unwrap(), ts.len());
            (mangled(status), Just(n))
        })
    ) {
        let _ = decode_targets(&bytes, count);
    }

    #[test]
    fn name_lists_decode_as_the_kernel_wrote_them(
        devs in prop::collection::vec(listed_device(), 0..8),
        layout in prop::sample::select(vec![
            ListLayout::NameOnly,
            ListLayout::EventNr,
            ListLayout::Uuid,
        ]),
    ) {
        let buf = name_list(&devs, layout);
        let with_event_nr = !matches!(layout, ListLayout::NameOnly);
        let expected: Vec<Device> = devs
            .iter()
            .map(|(name, dev, event_nr, uuid)| Device {
                name: name.clone(),
                dev: *dev,
                event_nr: with_event_nr.then_some(*event_nr),
                uuid: match (layout, uuid) {
                    (ListLayout::Uuid, Some(u)) => ListedUuid::Some(u.clone()),
                    (ListLayout::Uuid, None) => ListedUuid::None,
                    _ => ListedUuid::Unknown,
                },
            })
            .collect();
        prop_assert_eq!(decode_names(&buf, with_event_nr).unwrap(), expected);
    }

    #[test]
    fn name_lists_never_panic(
        bytes in prop::collection::vec(any::<u8>(), 0..400),
        with_event_nr in any::<bool>(),
    ) {
        let _ = decode_names(&bytes, with_event_nr);
        let _ = buffer::decode_deps(&bytes);
        let _ = buffer::decode_target_versions(&bytes);
        let _ = buffer::decode_message(&bytes, sys::DM_DATA_OUT_FLAG);
        if let Ok(h) = buffer::decode_header(&bytes) {
            let _ = buffer::payload(&bytes, &h);
        }
    }

    #[test]
    fn mangled_name_lists_never_panic(
        bytes in prop::collection::vec(listed_device(), 1..5)
            .prop_flat_map(|d| mangled(name_list(&d, ListLayout::Uuid))),
        with_event_nr in any::<bool>(),
    ) {
        let _ = decode_names(&bytes, with_event_nr);
    }
}

// ---------------------------------------------------------------------------------------
// multipath table and status lines
// ---------------------------------------------------------------------------------------

fn mp_word() -> impl Strategy<Value = String> {
    word("[!-~]{1,12}")
}

fn words(max: usize) -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec(mp_word(), 0..max)
}

/// Words joined by the kind of whitespace dm-mpath and people put between them.
fn join(ws: &[String], seps: &[&'static str]) -> String {
    let mut out = String::new();
    for (i, w) in ws.iter().enumerate() {
        out.push_str(w);
        out.push_str(seps[i % seps.len()]);
    }
    out
}

fn table() -> impl Strategy<Value = Table> {
    let group = (
        mp_word(),
        words(4),
        0usize..3,
        prop::collection::vec(devnum(), 0..5),
    )
        .prop_flat_map(|(selector, selector_args, n_args, devs)| {
            let n = devs.len();
            (
                Just(selector),
                Just(selector_args),
                Just(devs),
                prop::collection::vec(prop::collection::vec(mp_word(), n_args), n),
            )
        })
        .prop_map(|(selector, selector_args, devs, args)| TableGroup {
            selector,
            selector_args,
            paths: devs
                .into_iter()
                .zip(args)
                .map(|(dev, args)| TablePath { dev, args })
                .collect(),
        });
    (
        words(5),
        words(3),
        any::<u32>(),
        prop::collection::vec(group, 0..4),
    )
        .prop_map(|(features, hw_handler, initial_group, groups)| Table {
            features,
            hw_handler,
            initial_group,
            groups,
        })
}

fn table_words(t: &Table) -> Vec<String> {
    let mut w = Vec::new();
    w.push(t.features.len().to_string());
    w.extend(t.features.iter().cloned());
    w.push(t.hw_handler.len().to_string());
    w.extend(t.hw_handler.iter().cloned());
    w.push(t.groups.len().to_string());
    w.push(t.initial_group.to_string());
    for g in &t.groups {
        w.push(g.selector.clone());
        w.push(g.selector_args.len().to_string());
        w.extend(g.selector_args.iter().cloned());
        w.push(g.paths.len().to_string());
        w.push(g.paths.first().map_or(0, |p| p.args.len()).to_string());
        for p in &g.paths {
            w.push(p.dev.to_string());
            w.extend(p.args.iter().cloned());
        }
    }
    w
}

fn status() -> impl Strategy<Value = Status> {
    let path = |n_info: usize| {
        (
            devnum(),
            any::<bool>(),
            any::<u32>(),
            prop::collection::vec(mp_word(), n_info),
        )
            .prop_map(|(dev, active, fail_count, selector_info)| StatusPath {
                dev,
                active,
                fail_count,
                selector_info,
            })
    };
    let group = (
        prop::sample::select(vec![
            GroupState::Active,
            GroupState::Enabled,
            GroupState::Disabled,
        ]),
        words(3),
        0usize..3,
        0usize..5,
    )
        .prop_flat_map(move |(state, selector_status, n_info, n_paths)| {
            (
                Just(state),
                Just(selector_status),
                prop::collection::vec(path(n_info), n_paths),
            )
        })
        .prop_map(|(state, selector_status, paths)| StatusGroup {
            state,
            selector_status,
            paths,
        });
    (
        any::<bool>(),
        any::<u32>(),
        words(3),
        any::<u32>(),
        prop::collection::vec(group, 0..4),
    )
        .prop_map(
            |(queue_io, pg_init_count, hw_handler, current_group, groups)| Status {
                queue_io,
                pg_init_count,
                hw_handler,
                current_group,
                groups,
            },
        )
}

fn status_words(s: &Status) -> Vec<String> {
    let mut w = vec![
        "2".to_owned(),
        u32::from(s.queue_io).to_string(),
        s.pg_init_count.to_string(),
    ];
    w.push(s.hw_handler.len().to_string());
    w.extend(s.hw_handler.iter().cloned());
    w.push(s.groups.len().to_string());
    w.push(s.current_group.to_string());
    for g in &s.groups {
        w.push(
            match g.state {
                GroupState::Active => "A",
                GroupState::Enabled => "E",
                GroupState::Disabled => "D",
            }
            .to_owned(),
        );
        w.push(g.selector_status.len().to_string());
        w.extend(g.selector_status.iter().cloned());
        w.push(g.paths.len().to_string());
        w.push(
            g.paths
                .first()
                .map_or(0, |p| p.selector_info.len())
                .to_string(),
        );
        for p in &g.paths {
            w.push(p.dev.to_string());
            w.push(if p.active { "A" } else { "F" }.to_owned());
            w.push(p.fail_count.to_string());
            w.extend(p.selector_info.iter().cloned());
        }
    }
    w
}

fn separators() -> impl Strategy<Value = Vec<&'static str>> {
    prop::collection::vec(prop::sample::select(vec![" ", "  ", "\t", " \n"]), 1..4)
}

proptest! {
    #[test]
    fn multipath_table_parses_back(t in table(), seps in separators(), lead in "[ \t]{0,2}") {
        let line = format!("{lead}{}", join(&table_words(&t), &seps));
        let parsed = Table::parse(&line).unwrap();
        prop_assert_eq!(
            parsed.paths().collect::<Vec<_>>(),
            t.groups.iter().flat_map(|g| g.paths.iter().map(|p| p.dev)).collect::<Vec<_>>()
        );
        let queues = t.features.iter().any(|f| f == "queue_if_no_path");
        prop_assert_eq!(parsed.queue_if_no_path(), queues);
        prop_assert_eq!(parsed, t);
    }

    #[test]
    fn multipath_status_parses_back(s in status(), seps in separators()) {
        let line = join(&status_words(&s), &seps);
        let parsed = Status::parse(&line).unwrap();
        let active = s.groups.iter().flat_map(|g| &g.paths).filter(|p| p.active).count();
        prop_assert_eq!(parsed.active_paths(), active);
        prop_assert_eq!(parsed, s);
    }

    #[test]
    fn multipath_lines_with_a_word_missing_or_added_are_invalid(
        t in table(),
        s in status(),
        cut in any::<prop::sample::Index>(),
    ) {
        let tw = table_words(&t);
        let mut shorter = tw.clone();
        shorter.remove(cut.index(tw.len()));
        // Dropping any word shifts every count after it: the line no longer parses to `t`.
        prop_assert_ne!(Table::parse(&shorter.join(" ")).ok(), Some(t.clone()));
        let mut longer = tw;
        longer.push("extra".into());
        let invalid = matches!(Table::parse(&longer.join(" ")), Err(Error::Invalid { .. }));
        prop_assert!(invalid);
        let mut longer = status_words(&s);
        longer.push("extra".into());
        let invalid = matches!(Status::parse(&longer.join(" ")), Err(Error::Invalid { .. }));
        prop_assert!(invalid);
    }

    #[test]
    fn multipath_parsers_never_panic(s in "\\PC{0,200}|[0-9 :AEDF]{0,200}") {
        if let Ok(t) = Table::parse(&s) {
            prop_assert_eq!(Table::parse(&table_words(&t).join(" ")).unwrap(), t);
        }
        if let Ok(st) = Status::parse(&s) {
            prop_assert_eq!(Status::parse(&status_words(&st).join(" ")).unwrap(), st);
        }
    }

    #[test]
    fn mangled_multipath_lines_never_panic(
        bytes in table().prop_flat_map(|t| mangled(table_words(&t).join(" ").into_bytes()))
    ) {
        let s = String::from_utf8_lossy(&bytes);
        let _ = Table::parse(&s);
        let _ = Status::parse(&s);
    }
}

proptest! {
    /// Any 16 bytes, written in each of the three forms an NGUID comes in (either case),
    /// parse back to the same identifier; and no string makes the parser panic.
    #[test]
    fn nguids_round_trip_in_every_written_form(bytes in any::<[u8; 16]>(), upper in any::<bool>()) {
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        let hex = if upper { hex.to_uppercase() } else { hex };
        let dashed = format!(
            "{}-{}-{}-{}-{}",
            &hex[..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..]
        );
        for form in [hex.clone(), dashed, format!("eui.{hex}")] {
            let n: lunkit::id::Nguid = form.parse().unwrap();
            prop_assert_eq!(n.bytes(), bytes);
            prop_assert_eq!(n.to_string(), hex.to_lowercase());
        }
    }

    #[test]
    fn nguid_parser_never_panics(s in "\\PC{0,40}|[0-9a-fA-F.eui-]{0,40}") {
        if let Ok(n) = s.parse::<lunkit::id::Nguid>() {
            prop_assert_eq!(n.to_string().parse::<lunkit::id::Nguid>().unwrap(), n);
        }
    }
}

//! Device-mapper ioctl reply buffers captured from a real 6.1 kernel (tests/fixtures/dm, made
//! by capture.py there in the VM lab: multipathd's maps mpatha and mpathb over two iSCSI
//! sessions) decode to the values the kernel meant, and every truncation of them decodes to a
//! value or an error, never a panic.

use std::path::PathBuf;

use lunkit::dm::ListedUuid;
use lunkit::dm::buffer::{decode_deps, decode_header, decode_names, decode_targets, payload};
use lunkit::multipath::{Status, Table};

fn buf(name: &str) -> Vec<u8> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/dm")
        .join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn version_header() {
    let h = decode_header(&buf("version.bin")).unwrap();
    assert_eq!(h.version[0], 4);
    assert!(h.version[1] >= 47, "6.1 speaks 4.47: {:?}", h.version);
    assert_eq!(h.data_start, 312);
}

#[test]
fn list_has_both_maps_with_uuids() {
    let b = buf("list.bin");
    let h = decode_header(&b).unwrap();
    let devs = decode_names(payload(&b, &h).unwrap(), true).unwrap();
    let mut names: Vec<&str> = devs.iter().map(|d| d.name.as_str()).collect();
    names.sort();
    assert_eq!(names, ["mpatha", "mpathb"]);
    for d in &devs {
        assert_eq!(
            d.dev.major, 254,
            "dm's dynamic major in the lab kernel: {:?}",
            d.dev
        );
        match &d.uuid {
            ListedUuid::Some(u) => assert!(u.starts_with("mpath-360014055e7a1"), "{u}"),
            other => panic!("{}: 6.1 lists uuids when asked, got {other:?}", d.name),
        }
    }
}

#[test]
fn table_status_deps_and_info_of_each_map() {
    for map in ["mpatha", "mpathb"] {
        let b = buf(&format!("table-{map}.bin"));
        let h = decode_header(&b).unwrap();
        assert_eq!(h.name, map);
        let targets = decode_targets(payload(&b, &h).unwrap(), h.target_count).unwrap();
        assert_eq!(targets.len(), 1);
        assert_eq!(targets[0].target_type, "multipath");
        assert_eq!(targets[0].length, 32768, "16 MiB LUN");
        let table = Table::parse(&targets[0].params).unwrap();
        let paths: usize = table.groups.iter().map(|g| g.paths.len()).sum();
        assert_eq!(paths, 2, "{map}: {}", targets[0].params);

        let b = buf(&format!("status-{map}.bin"));
        let h = decode_header(&b).unwrap();
        let targets = decode_targets(payload(&b, &h).unwrap(), h.target_count).unwrap();
        let status = Status::parse(&targets[0].params).unwrap();
        let active = status
            .groups
            .iter()
            .flat_map(|g| &g.paths)
            .filter(|p| p.active)
            .count();
        assert_eq!(active, 2, "{map}: {}", targets[0].params);

        let b = buf(&format!("deps-{map}.bin"));
        let h = decode_header(&b).unwrap();
        let deps = decode_deps(payload(&b, &h).unwrap()).unwrap();
        assert_eq!(deps.len(), 2);
        assert!(
            deps.iter().all(|d| d.major == 8),
            "paths are sd disks: {deps:?}"
        );

        let h = decode_header(&buf(&format!("info-{map}.bin"))).unwrap();
        assert_eq!(h.name, map);
        assert!(h.uuid.starts_with("mpath-"));
        assert_eq!(h.open_count, 0);
    }
}

#[test]
fn every_truncation_decodes_or_errors() {
    for f in [
        "list.bin",
        "table-mpatha.bin",
        "status-mpathb.bin",
        "deps-mpatha.bin",
        "info-mpatha.bin",
    ] {
        let b = buf(f);
        let h = decode_header(&b).unwrap();
        let end = (h.data_size as usize).min(b.len());
        for n in 0..=end {
            let cut = &b[..n];
            let Ok(h) = decode_header(cut) else { continue };
            let Ok(p) = payload(cut, &h) else { continue };
            let _ = decode_names(p, true);
            let _ = decode_targets(p, h.target_count);
            let _ = decode_deps(p);
        }
    }
}

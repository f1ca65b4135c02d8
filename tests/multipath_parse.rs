//! Host tests of the multipath table and status parsers, on lines as dm-mpath prints them.

use lunkit::dm::Target;
use lunkit::multipath::{
    GroupState, Status, Table, is_partition_table, is_partition_uuid, map_or_partition_uuid_wwid,
    uuid_wwid,
};
use lunkit::{DevNum, Error};

fn dev(major: u32, minor: u32) -> DevNum {
    DevNum { major, minor }
}

#[test]
fn table_with_queueing_alua_and_two_groups() {
    // kernel.md §3.6 example.
    let t = Table::parse(
        "1 queue_if_no_path 1 alua 2 1 round-robin 0 1 1 8:16 1 round-robin 0 1 1 8:32 1",
    )
    .unwrap();
    assert_eq!(t.features, ["queue_if_no_path"]);
    assert!(t.queue_if_no_path());
    assert_eq!(t.hw_handler, ["alua"]);
    assert_eq!(t.initial_group, 1);
    assert_eq!(t.groups.len(), 2);
    assert_eq!(t.groups[0].selector, "round-robin");
    assert!(t.groups[0].selector_args.is_empty());
    assert_eq!(t.groups[0].paths[0].dev, dev(8, 16));
    assert_eq!(t.groups[0].paths[0].args, ["1"]);
    assert_eq!(t.paths().collect::<Vec<_>>(), [dev(8, 16), dev(8, 32)]);
}

#[test]
fn table_as_multipathd_loads_it_on_debian() {
    // multipath-tools 0.9 defaults: service-time, one group, two paths, queueing via
    // no_path_retry, as the 6.1 kernel prints it back (trailing space included).
    let t =
        Table::parse("3 queue_if_no_path queue_mode mq 0 1 1 service-time 0 2 1 8:16 1 8:32 1 ")
            .unwrap();
    assert_eq!(t.features, ["queue_if_no_path", "queue_mode", "mq"]);
    assert!(t.queue_if_no_path());
    assert!(t.hw_handler.is_empty());
    assert_eq!(t.groups.len(), 1);
    assert_eq!(t.groups[0].paths.len(), 2);
    assert_eq!(t.groups[0].paths[1].dev, dev(8, 32));
}

#[test]
fn table_without_features_does_not_queue() {
    let t = Table::parse("0 0 1 1 round-robin 0 1 1 253:7 1000").unwrap();
    assert!(!t.queue_if_no_path());
    assert_eq!(t.paths().collect::<Vec<_>>(), [dev(253, 7)]);
    // pg_init_retries takes a value word: the feature list is counted in words.
    let t = Table::parse("2 pg_init_retries 50 0 1 1 round-robin 0 1 1 8:16 1").unwrap();
    assert_eq!(t.features, ["pg_init_retries", "50"]);
    assert!(!t.queue_if_no_path());
}

#[test]
fn malformed_tables_are_invalid() {
    for bad in [
        "",
        "1",
        "1 queue_if_no_path",
        "0 0 1 1 round-robin 0 1 1",
        "0 0 1 1 round-robin 0 1 1 sdb 1",
        "0 0 1 1 round-robin 0 2 1 8:16 1",
        "0 0 1 1 round-robin 0 1 1 8:16 1 extra",
        "99999999999 0 1 1",
        "4294967295 a",
        "0 0 4294967295 1 round-robin 0 1 0 8:16",
        "-1 0 0 0",
    ] {
        match Table::parse(bad) {
            Err(Error::Invalid { .. }) => {}
            other => panic!("{bad:?}: {other:?}"),
        }
    }
}

#[test]
fn status_one_path_failed() {
    // kernel.md §3.6 example.
    let s = Status::parse("2 0 0 0 2 1 A 0 1 0 8:16 A 0 E 0 1 0 8:32 F 1 ").unwrap();
    assert!(!s.queue_io);
    assert_eq!(s.pg_init_count, 0);
    assert_eq!(s.current_group, 1);
    assert_eq!(s.groups[0].state, GroupState::Active);
    assert_eq!(s.groups[1].state, GroupState::Enabled);
    assert!(s.groups[0].paths[0].active);
    assert!(!s.groups[1].paths[0].active);
    assert_eq!(s.groups[1].paths[0].fail_count, 1);
    assert_eq!(s.active_paths(), 1);
}

#[test]
fn status_service_time_with_info_words_and_all_paths_down() {
    // service-time reports 2 info words per path (in-flight size, relative throughput).
    let s = Status::parse("2 1 0 0 1 1 A 0 2 2 8:16 F 3 0 1 8:32 F 2 0 1 ").unwrap();
    assert!(s.queue_io, "all paths failed and queueing");
    assert_eq!(s.active_paths(), 0);
    let p = &s.groups[0].paths[1];
    assert_eq!(p.dev, dev(8, 32));
    assert_eq!(p.fail_count, 2);
    assert_eq!(p.selector_info, ["0", "1"]);
}

#[test]
fn status_disabled_group_and_no_groups() {
    let s = Status::parse("2 0 1 0 2 2 D 0 1 0 8:16 A 0 A 0 1 0 8:32 A 0").unwrap();
    assert_eq!(s.groups[0].state, GroupState::Disabled);
    assert_eq!(s.pg_init_count, 1);
    assert_eq!(s.active_paths(), 2);
    let s = Status::parse("2 0 0 0 0 0").unwrap();
    assert!(s.groups.is_empty());
    assert_eq!(s.active_paths(), 0);
}

#[test]
fn malformed_status_is_invalid() {
    for bad in [
        "",
        "2 0",
        "0 0 1 1",
        "2 0 0 0 1 1 X 0 1 0 8:16 A 0",
        "2 0 0 0 1 1 A 0 1 0 8:16 Q 0",
        "2 0 0 0 1 1 A 0 1 0 8:16 A",
        "2 0 0 0 1 1 A 0 1 2 8:16 A 0 1",
        "2 0 0 0 1 1 A 0 1 0 8:16 A 0 junk",
        "2 x y 0 0 0",
    ] {
        match Status::parse(bad) {
            Err(Error::Invalid { .. }) => {}
            other => panic!("{bad:?}: {other:?}"),
        }
    }
}

#[test]
fn every_prefix_of_a_status_line_parses_or_is_invalid() {
    let full = "2 0 0 0 2 1 A 0 1 0 8:16 A 0 E 0 1 0 8:32 F 1";
    for end in 0..full.len() {
        match Status::parse(&full[..end]) {
            Ok(_) | Err(Error::Invalid { .. }) => {}
            Err(e) => panic!("{end}: {e}"),
        }
    }
    let full = "1 queue_if_no_path 1 alua 2 1 round-robin 0 1 1 8:16 1 round-robin 0 1 1 8:32 1";
    for end in 0..full.len() {
        match Table::parse(&full[..end]) {
            Ok(_) | Err(Error::Invalid { .. }) => {}
            Err(e) => panic!("{end}: {e}"),
        }
    }
}

#[test]
fn partition_maps_are_recognised_like_kpartx_names_them() {
    let map = "mpath-36001405a1b2c3d4e5f60718293a4b5c6";
    assert!(is_partition_uuid(
        "part1-mpath-36001405a1b2c3d4e5f60718293a4b5c6",
        map
    ));
    assert!(is_partition_uuid(
        "part12-mpath-36001405a1b2c3d4e5f60718293a4b5c6",
        map
    ));
    assert!(!is_partition_uuid(
        "part-mpath-36001405a1b2c3d4e5f60718293a4b5c6",
        map
    ));
    assert!(!is_partition_uuid(
        "partx-mpath-36001405a1b2c3d4e5f60718293a4b5c6",
        map
    ));
    assert!(!is_partition_uuid(
        "part1-mpath-36001405a1b2c3d4e5f60718293a4b5c7",
        map
    ));
    assert!(!is_partition_uuid(map, map));

    let lin = |p: &str| Target {
        start: 0,
        length: 2048,
        target_type: "linear".into(),
        params: p.into(),
    };
    assert!(is_partition_table(&[lin("253:0 2048")], dev(253, 0)));
    assert!(!is_partition_table(&[lin("253:00 2048")], dev(253, 0)));
    assert!(!is_partition_table(&[lin("253:1 2048")], dev(253, 0)));
    assert!(!is_partition_table(
        &[lin("253:0 2048"), lin("253:0 4096")],
        dev(253, 0)
    ));
    assert!(!is_partition_table(&[], dev(253, 0)));
}

#[test]
fn a_map_uuid_and_its_partitions_name_one_wwid_and_nothing_else_does() {
    let w = "36001405a1b2c3d4e5f60718293a4b5c6";
    assert_eq!(uuid_wwid(&format!("mpath-{w}")), Some(w));
    assert_eq!(uuid_wwid(&format!("part1-mpath-{w}")), None);
    assert_eq!(uuid_wwid("mpath-"), None);
    assert_eq!(uuid_wwid(&format!("LVM-{w}")), None);
    assert_eq!(map_or_partition_uuid_wwid(&format!("mpath-{w}")), Some(w));
    assert_eq!(
        map_or_partition_uuid_wwid(&format!("part3-mpath-{w}")),
        Some(w)
    );
    assert_eq!(
        map_or_partition_uuid_wwid(&format!("partx-mpath-{w}")),
        None
    );
    assert_eq!(map_or_partition_uuid_wwid(&format!("part-mpath-{w}")), None);
    assert_eq!(map_or_partition_uuid_wwid("part1-mpath-"), None);
    assert_eq!(
        map_or_partition_uuid_wwid(&format!("part1-CRYPT-{w}")),
        None
    );
    assert_eq!(
        lunkit::topology::MPATH_UUID_PREFIX,
        lunkit::multipath::UUID_PREFIX
    );
}

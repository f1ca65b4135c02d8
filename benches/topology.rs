//! Micro-benchmark of the topology walk (`lunkit list` is this plus printing) over a large
//! storage node: 1,024 SCSI devices behind 16 iSCSI sessions (8 targets, two portals each,
//! 64 LUNs per target), 512 two-path multipath maps, with their scsi_host, iscsi_*,
//! scsi_device, scsi_disk, scsi_generic, block and dev/block entries.
//!
//! The tree is generated at bench start in a temporary directory, shaped like the captured
//! tree in tests/fixtures/iscsi-multipath (same directory layout, relative symlinks, the
//! attributes lunkit reads plus the ones a real directory listing walks past). The captured
//! tree itself is walked too, as the small case.
//!
//! `cargo bench --bench topology`

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use lunkit::{Root, Topology};

/// iSCSI targets; each is reached through two portals (one session and SCSI host each).
const TARGETS: u32 = 8;
const LUNS_PER_TARGET: u32 = 64;
const PORTALS: [&str; 2] = ["10.0.0.1", "10.0.0.2"];
/// The first iSCSI SCSI host number (0-9 are the machine's own controllers).
const FIRST_HOST: u32 = 10;
/// device-mapper's dynamic major on the captured kernel.
const DM_MAJOR: u32 = 254;
const IQN_PREFIX: &str = "iqn.2003-01.org.linux-iscsi.lunkit:bench";

/// A generated tree, removed on drop.
struct Tree {
    dir: PathBuf,
    devices: usize,
}

impl Drop for Tree {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// `sd`'s disk name for index `i`: sda..sdz, sdaa..sdzz, sdaaa... (sd_format_disk_name).
fn disk_name(i: u32) -> String {
    let mut suffix = Vec::new();
    let mut n = i as i64;
    loop {
        suffix.push(b'a' + (n % 26) as u8);
        n = n / 26 - 1;
        if n < 0 {
            break;
        }
    }
    suffix.reverse();
    format!("sd{}", String::from_utf8(suffix).expect("ASCII"))
}

/// `sd`'s device number for disk index `i` (sd_major and the minor layout in sd.c).
fn disk_dev(i: u32) -> (u32, u32) {
    let major_idx = (i & 0xf0) >> 4;
    let major = match major_idx {
        0 => 8,
        1..=7 => 64 + major_idx,
        _ => 128 + major_idx - 8,
    };
    let minor = ((i & 0xf) << 4) | ((i & 0xfff00) << 12);
    (major, minor)
}

fn write(path: &Path, content: &str) {
    if let Some(p) = path.parent() {
        fs::create_dir_all(p).unwrap_or_else(|e| panic!("mkdir {}: {e}", p.display()));
    }
    fs::write(path, content).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

/// Writes each `(name, value)` as an attribute file of `dir`.
fn attrs(dir: &Path, list: &[(&str, String)]) {
    fs::create_dir_all(dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
    for (name, value) in list {
        fs::write(dir.join(name), format!("{value}\n"))
            .unwrap_or_else(|e| panic!("write {}/{name}: {e}", dir.display()));
    }
}

/// A relative symlink at `root/link` pointing at `root/target`, as sysfs makes them.
fn link(root: &Path, link: &str, target: &str) {
    let link_path = root.join(link);
    let parent = link_path.parent().expect("link has a parent");
    fs::create_dir_all(parent).unwrap_or_else(|e| panic!("mkdir {}: {e}", parent.display()));
    let depth = Path::new(link).components().count() - 1;
    let rel = format!("{}{target}", "../".repeat(depth));
    symlink(&rel, &link_path).unwrap_or_else(|e| panic!("symlink {}: {e}", link_path.display()));
}

/// Attribute files every whole disk has (sysfs `block/<disk>`), besides `dev` and `size`.
fn disk_attrs(dev: (u32, u32), sectors: u64, diskseq: u32) -> Vec<(&'static str, String)> {
    vec![
        ("dev", format!("{}:{}", dev.0, dev.1)),
        ("size", sectors.to_string()),
        ("ro", "0".into()),
        ("removable", "0".into()),
        ("hidden", "0".into()),
        ("range", "16".into()),
        ("ext_range", "256".into()),
        ("capability", "0".into()),
        ("alignment_offset", "0".into()),
        ("discard_alignment", "0".into()),
        ("diskseq", diskseq.to_string()),
        ("events", String::new()),
        ("events_async", String::new()),
        ("events_poll_msecs", "-1".into()),
        (
            "stat",
            "     157        0     6184       35        0        0        0        0        0       96       35        0        0        0        0        0        0".into(),
        ),
        ("inflight", "       0        0".into()),
        (
            "uevent",
            format!(
                "MAJOR={}\nMINOR={}\nDEVNAME=x\nDEVTYPE=disk\nDISKSEQ={diskseq}",
                dev.0, dev.1
            ),
        ),
    ]
}

/// Generates the node: returns the tree and the number of SCSI devices in it.
fn generate() -> Tree {
    let dir = std::env::temp_dir().join(format!("lunkit-bench-topology-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    let mut tree = Tree { dir, devices: 0 };
    let root = tree.dir.clone();
    let root = root.as_path();
    let mut devices = 0;
    let mut disk_index = 0u32;
    let mut sg_index = 0u32;
    let mut seqnum = 2000u32;
    // (map index) -> its two path disks, filled as the paths are created.
    let mut map_paths: Vec<Vec<(String, String)>> =
        vec![Vec::new(); (TARGETS * LUNS_PER_TARGET) as usize];
    for t in 0..TARGETS {
        let iqn = format!("{IQN_PREFIX}{t}");
        for (p, portal) in PORTALS.iter().enumerate() {
            let sid = 1 + t * 2 + p as u32;
            let host = FIRST_HOST + t * 2 + p as u32;
            let hostdir = format!("sys/devices/platform/host{host}");
            let sh = format!("{hostdir}/scsi_host/host{host}");
            attrs(
                &root.join(&sh),
                &[
                    ("proc_name", "iscsi_tcp".into()),
                    ("state", "running".into()),
                    ("scan", String::new()),
                    ("can_queue", "113".into()),
                    ("cmd_per_lun", "128".into()),
                    ("unique_id", "0".into()),
                    ("uevent", String::new()),
                ],
            );
            link(root, &format!("{sh}/device"), &hostdir);
            link(root, &format!("sys/class/scsi_host/host{host}"), &sh);
            let ih = format!("{hostdir}/iscsi_host/host{host}");
            attrs(
                &root.join(&ih),
                &[
                    ("initiatorname", "iqn.1993-08.org.debian:01:bench".into()),
                    ("ipaddress", format!("10.0.1.{host}")),
                    ("netdev", "<NULL>".into()),
                    ("hwaddress", "<NULL>".into()),
                ],
            );
            link(root, &format!("sys/class/iscsi_host/host{host}"), &ih);
            let sess = format!("{hostdir}/session{sid}");
            let is = format!("{sess}/iscsi_session/session{sid}");
            attrs(
                &root.join(&is),
                &[
                    ("targetname", iqn.clone()),
                    ("tpgt", "1".into()),
                    ("state", "LOGGED_IN".into()),
                    ("target_state", "SCANNED".into()),
                    ("target_id", "0".into()),
                    ("initiatorname", "iqn.1993-08.org.debian:01:bench".into()),
                    ("ifacename", "default".into()),
                    ("recovery_tmo", "120".into()),
                    ("creator", "-1".into()),
                ],
            );
            link(root, &format!("{is}/device"), &sess);
            link(root, &format!("sys/class/iscsi_session/session{sid}"), &is);
            let conn = format!("{sess}/connection{sid}:0");
            let ic = format!("{conn}/iscsi_connection/connection{sid}:0");
            attrs(
                &root.join(&ic),
                &[
                    ("persistent_address", (*portal).into()),
                    ("persistent_port", "3260".into()),
                    ("address", (*portal).into()),
                    ("port", "3260".into()),
                    ("state", "up".into()),
                    ("local_port", (40000 + sid).to_string()),
                ],
            );
            link(root, &format!("{ic}/device"), &conn);
            link(
                root,
                &format!("sys/class/iscsi_connection/connection{sid}:0"),
                &ic,
            );
            let target_dir = format!("{sess}/target{host}:0:0");
            write(
                &root.join(&target_dir).join("uevent"),
                "DEVTYPE=scsi_target\n",
            );
            for lun in 0..LUNS_PER_TARGET {
                let hctl = format!("{host}:0:0:{lun}");
                let sdev = format!("{target_dir}/{hctl}");
                let map = (t * LUNS_PER_TARGET + lun) as usize;
                let serial = format!("{:04x}{:04x}", t, lun);
                attrs(
                    &root.join(&sdev),
                    &[
                        ("state", "running".into()),
                        ("vendor", "LIO-ORG ".into()),
                        ("model", format!("fileio_{lun:<8}")),
                        ("rev", "4.0 ".into()),
                        ("type", "0".into()),
                        ("wwid", format!("naa.6001405{serial}5e7a100000000000")),
                        ("queue_depth", "128".into()),
                        ("queue_type", "simple".into()),
                        ("scsi_level", "7".into()),
                        ("timeout", "30".into()),
                        ("eh_timeout", "10".into()),
                        ("device_blocked", "0".into()),
                        ("iocounterbits", "32".into()),
                        ("iorequest_cnt", "0x4a".into()),
                        ("iodone_cnt", "0x4a".into()),
                        ("ioerr_cnt", "0x0".into()),
                        ("modalias", "scsi:t-0x00".into()),
                        ("dh_state", "detached".into()),
                        ("access_state", "active/optimized".into()),
                        ("delete", String::new()),
                        ("rescan", String::new()),
                        ("uevent", "DEVTYPE=scsi_device\nMODALIAS=scsi:t-0x00".into()),
                    ],
                );
                for class in ["scsi_device", "scsi_disk"] {
                    let d = format!("{sdev}/{class}/{hctl}");
                    write(&root.join(&d).join("uevent"), "");
                    link(root, &format!("{d}/device"), &sdev);
                    link(root, &format!("sys/class/{class}/{hctl}"), &d);
                }
                let sg = format!("sg{sg_index}");
                sg_index += 1;
                let sgd = format!("{sdev}/scsi_generic/{sg}");
                write(
                    &root.join(&sgd).join("dev"),
                    &format!("21:{}\n", sg_index - 1),
                );
                link(root, &format!("{sgd}/device"), &sdev);
                link(root, &format!("sys/class/scsi_generic/{sg}"), &sgd);
                link(root, &format!("{sdev}/generic"), &sgd);
                let name = disk_name(disk_index);
                let dev = disk_dev(disk_index);
                disk_index += 1;
                seqnum += 1;
                let bd = format!("{sdev}/block/{name}");
                attrs(&root.join(&bd), &disk_attrs(dev, 32768, seqnum));
                fs::create_dir_all(root.join(&bd).join("holders")).expect("holders");
                fs::create_dir_all(root.join(&bd).join("slaves")).expect("slaves");
                link(root, &format!("{bd}/device"), &sdev);
                link(root, &format!("sys/class/block/{name}"), &bd);
                link(root, &format!("sys/block/{name}"), &bd);
                link(root, &format!("sys/dev/block/{}:{}", dev.0, dev.1), &bd);
                map_paths[map].push((name, bd));
                devices += 1;
            }
        }
    }
    for (m, paths) in map_paths.iter().enumerate() {
        let dm = format!("dm-{m}");
        let d = format!("sys/devices/virtual/block/{dm}");
        seqnum += 1;
        attrs(
            &root.join(&d),
            &disk_attrs((DM_MAJOR, m as u32), 32768, seqnum),
        );
        let (t, lun) = (m as u32 / LUNS_PER_TARGET, m as u32 % LUNS_PER_TARGET);
        attrs(
            &root.join(&d).join("dm"),
            &[
                ("name", format!("mpath{m}")),
                (
                    "uuid",
                    format!("mpath-36001405{t:04x}{lun:04x}5e7a100000000000"),
                ),
                ("suspended", "0".into()),
                ("use_blk_mq", "1".into()),
                ("rq_based_seq_io_merge_deadline", "0".into()),
            ],
        );
        fs::create_dir_all(root.join(&d).join("holders")).expect("holders");
        for (name, bd) in paths {
            link(root, &format!("{d}/slaves/{name}"), bd);
            link(root, &format!("{bd}/holders/{dm}"), &d);
        }
        link(root, &format!("sys/class/block/{dm}"), &d);
        link(root, &format!("sys/block/{dm}"), &d);
        link(root, &format!("sys/dev/block/{DM_MAJOR}:{m}"), &d);
    }
    write(
        &root.join("sys/kernel/uevent_seqnum"),
        &format!("{seqnum}\n"),
    );
    tree.devices = devices;
    tree
}

fn bench_topology(c: &mut Criterion) {
    let tree = generate();
    let root = Root::new(&tree.dir);
    let topo = Topology::read(&root).expect("generated tree reads");
    assert_eq!(tree.devices, 1024);
    assert_eq!(topo.scsi_devices.len(), tree.devices);
    assert_eq!(topo.scsi_hosts.len(), (TARGETS * 2) as usize);
    assert_eq!(topo.iscsi_sessions.len(), (TARGETS * 2) as usize);
    assert_eq!(topo.multipath_maps().count(), tree.devices / 2);
    assert!(topo.scsi_devices.iter().all(|d| d.block.is_some()));
    assert!(topo.multipath_maps().all(|m| m.paths.len() == 2));

    let captured = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/iscsi-multipath");
    let small = Root::new(&captured);
    let small_devices = Topology::read(&small)
        .expect("captured tree reads")
        .scsi_devices
        .len();

    let mut g = c.benchmark_group("topology");
    g.throughput(Throughput::Elements(small_devices as u64));
    g.bench_function("read_captured_iscsi_multipath", |b| {
        b.iter(|| Topology::read(&small).unwrap())
    });
    g.sample_size(20);
    g.throughput(Throughput::Elements(tree.devices as u64));
    g.bench_function("read_1024_scsi_devices", |b| {
        b.iter(|| Topology::read(&root).unwrap())
    });
    g.finish();
}

criterion_group!(benches, bench_topology);
criterion_main!(benches);

//! Micro-benchmarks of the pure parsers on inputs shaped like what a busy storage node gives
//! them: kernel uevents, a 10,000-line mountinfo, a device-mapper name list of 1,000 maps and
//! multipath status lines.
//!
//! `cargo bench --bench parse` (all), or `cargo bench --bench parse -- uevent` (one group).

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use lunkit::DevNum;
use lunkit::dm::buffer::{self, decode_names};
use lunkit::multipath::Status;
use lunkit::uevent::Uevent;
use lunkit_sys::dm as sys;

// ---------------------------------------------------------------------------------------
// uevents
// ---------------------------------------------------------------------------------------

/// A kernel datagram, `ACTION@DEVPATH\0KEY=VALUE\0...`, as the kernel sends it.
fn datagram(action: &str, devpath: &str, env: &[(&str, &str)]) -> Vec<u8> {
    let mut out = format!("{action}@{devpath}").into_bytes();
    out.push(0);
    for (k, v) in env {
        out.extend_from_slice(format!("{k}={v}").as_bytes());
        out.push(0);
    }
    out
}

/// The events one iSCSI LUN scan makes, as captured in the lab (6.1 kernel): the scsi_device,
/// its class devices and the disk.
fn scan_events() -> Vec<(&'static str, Vec<u8>)> {
    let dev = "/devices/platform/host6/session1/target6:0:0/6:0:0:3";
    let disk = format!("{dev}/block/sdc");
    let scsi = [
        ("ACTION", "add"),
        ("DEVPATH", dev),
        ("SUBSYSTEM", "scsi"),
        ("DEVTYPE", "scsi_device"),
        ("MODALIAS", "scsi:t-0x00"),
        ("SEQNUM", "4242"),
    ];
    let block = [
        ("ACTION", "add"),
        ("DEVPATH", disk.as_str()),
        ("SUBSYSTEM", "block"),
        ("MAJOR", "8"),
        ("MINOR", "32"),
        ("DEVNAME", "sdc"),
        ("DEVTYPE", "disk"),
        ("DISKSEQ", "12"),
        ("SEQNUM", "4247"),
    ];
    let remove = [
        ("ACTION", "remove"),
        ("DEVPATH", disk.as_str()),
        ("SUBSYSTEM", "block"),
        ("MAJOR", "8"),
        ("MINOR", "32"),
        ("DEVNAME", "sdc"),
        ("DEVTYPE", "disk"),
        ("DISKSEQ", "12"),
        ("SEQNUM", "4301"),
    ];
    vec![
        ("scsi_device_add", datagram("add", dev, &scsi)),
        ("block_add", datagram("add", &disk, &block)),
        ("block_remove", datagram("remove", &disk, &remove)),
    ]
}

fn bench_uevent(c: &mut Criterion) {
    let mut g = c.benchmark_group("uevent");
    for (name, buf) in scan_events() {
        assert!(Uevent::parse(&buf).is_ok(), "{name} must parse");
        g.throughput(Throughput::Bytes(buf.len() as u64));
        g.bench_function(name, |b| b.iter(|| Uevent::parse(black_box(&buf))));
    }
    // What a waiter does with every datagram while the socket is busy: parse and filter.
    let storm: Vec<Vec<u8>> = (0..512)
        .map(|i| {
            let dev = format!("/devices/pseudo_0/adapter0/host2/target2:0:0/2:0:0:{i}");
            datagram(
                "add",
                &dev,
                &[
                    ("ACTION", "add"),
                    ("DEVPATH", &dev),
                    ("SUBSYSTEM", "scsi"),
                    ("DEVTYPE", "scsi_device"),
                    ("MODALIAS", "scsi:t-0x00"),
                    ("SEQNUM", &(10_000 + i).to_string()),
                ],
            )
        })
        .collect();
    g.throughput(Throughput::Elements(storm.len() as u64));
    g.bench_function("storm_512_filtered", |b| {
        b.iter(|| {
            storm
                .iter()
                .filter_map(|d| Uevent::parse(black_box(d)).ok())
                .filter(|ev| ev.subsystem.as_deref() == Some("block"))
                .count()
        })
    });
    g.finish();
}

// ---------------------------------------------------------------------------------------
// mountinfo
// ---------------------------------------------------------------------------------------

/// A mountinfo of `lines` lines like a Kubernetes node's: the base system, then per pod
/// tmpfs secrets, overlay roots with long option strings, CSI volumes on sd/dm devices (some
/// with escaped spaces in their paths) and bind mounts of them.
fn mountinfo(lines: usize) -> Vec<u8> {
    let mut out = String::with_capacity(lines * 200);
    let base = [
        "23 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw,errors=remount-ro",
        "22 23 0:20 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw",
        "24 23 0:22 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw",
        "25 23 0:23 / /run rw,nosuid,nodev,relatime shared:2 - tmpfs tmpfs rw,size=1632592k,mode=755,inode64",
        "26 23 0:5 / /dev rw,nosuid,relatime shared:3 - devtmpfs udev rw,size=8132380k,nr_inodes=2033095,mode=755,inode64",
    ];
    let mut n = 0;
    for l in base {
        out.push_str(l);
        out.push('\n');
        n += 1;
    }
    let mut id = 100u32;
    let mut pod = 0u32;
    while n < lines {
        let uid = format!(
            "{pod:08x}-5e7a-4c1d-9a2b-{:012x}",
            pod.wrapping_mul(2_654_435_761)
        );
        let pods = format!("/var/lib/kubelet/pods/{uid}");
        let minor = 16 * (pod % 64);
        let kinds = [
            format!(
                "{id} 25 0:{} / {pods}/volumes/kubernetes.io~projected/kube-api-access-{:05x} rw,relatime shared:{id} - tmpfs tmpfs rw,size=262144k,inode64",
                40 + pod % 200,
                pod
            ),
            format!(
                "{} 23 0:{} / /run/containerd/io.containerd.runtime.v2.task/k8s.io/{:064x}/rootfs rw,relatime - overlay overlay rw,lowerdir=/var/lib/containerd/snapshots/{}/fs:/var/lib/containerd/snapshots/{}/fs,upperdir=/var/lib/containerd/snapshots/{}/fs,workdir=/var/lib/containerd/snapshots/{}/work,index=off",
                id + 1,
                300 + pod % 300,
                u128::from(pod) * 0x9e37_79b9_7f4a_7c15,
                pod * 3,
                pod * 3 + 1,
                pod * 3 + 2,
                pod * 3 + 2
            ),
            format!(
                "{} 23 8:{minor} / /var/lib/kubelet/plugins/kubernetes.io/csi/lunkit.example/{:016x}/globalmount rw,relatime shared:{} - ext4 /dev/sd{} rw,stripe=16",
                id + 2,
                u64::from(pod) * 0x0123_4567,
                id + 2,
                (b'a' + (pod % 26) as u8) as char
            ),
            format!(
                "{} {} 253:{} / {pods}/volumes/kubernetes.io~csi/pvc\\040{pod}/mount rw,relatime shared:{} - xfs /dev/mapper/mpath{} rw,attr2,inode64,logbufs=8,logbsize=32k,noquota",
                id + 3,
                id + 2,
                pod % 1024,
                id + 2,
                pod
            ),
        ];
        for k in kinds {
            if n == lines {
                break;
            }
            out.push_str(&k);
            out.push('\n');
            n += 1;
        }
        id += 4;
        pod += 1;
    }
    out.into_bytes()
}

fn bench_mountinfo(c: &mut Criterion) {
    let text = mountinfo(10_000);
    let parsed = lunkit::block::mountinfo::parse(&text).expect("generated mountinfo parses");
    assert_eq!(parsed.len(), 10_000);
    let sdc = DevNum {
        major: 8,
        minor: 32,
    };
    let mut g = c.benchmark_group("mountinfo");
    g.throughput(Throughput::Elements(parsed.len() as u64));
    g.bench_function("parse_10k_lines", |b| {
        b.iter(|| lunkit::block::mountinfo::parse(black_box(&text)))
    });
    // The in-use check a detach makes: parse, then find mounts of one device number.
    g.bench_function("parse_10k_and_match_dev", |b| {
        b.iter(|| {
            let all = lunkit::block::mountinfo::parse(black_box(&text)).unwrap();
            all.iter().filter(|m| m.dev == sdc).count()
        })
    });
    g.finish();
}

// ---------------------------------------------------------------------------------------
// device-mapper name list
// ---------------------------------------------------------------------------------------

fn align8(n: usize) -> usize {
    (n + 7) & !7
}

fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_ne_bytes());
}

fn put64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_ne_bytes());
}

/// A `DM_LIST_DEVICES` payload with `DM_UUID_FLAG`, laid out as `list_devices()` in
/// drivers/md/dm-ioctl.c writes it (the same layout tests/dm_buffer.rs builds).
fn name_list(devs: &[(String, DevNum, u32, Option<String>)]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut prev: Option<usize> = None;
    for (name, d, event_nr, uuid) in devs {
        let at = out.len();
        if let Some(p) = prev {
            put32(&mut out, p + 8, (at - p) as u32);
        }
        let name_at = at + sys::DM_NAME_LIST_NAME_OFFSET;
        let ext = align8(name_at + name.len() + 1);
        let uuid_at = align8(ext + 8);
        let end = match uuid {
            Some(u) => align8(uuid_at + u.len() + 1),
            None => uuid_at,
        };
        out.resize(end, 0);
        put64(&mut out, at, buffer::encode_dev(*d));
        out[name_at..name_at + name.len()].copy_from_slice(name.as_bytes());
        put32(&mut out, ext, *event_nr);
        let flags = if uuid.is_some() {
            sys::DM_NAME_LIST_FLAG_HAS_UUID
        } else {
            sys::DM_NAME_LIST_FLAG_DOESNT_HAVE_UUID
        };
        put32(&mut out, ext + 4, flags);
        if let Some(u) = uuid {
            out[uuid_at..uuid_at + u.len()].copy_from_slice(u.as_bytes());
        }
        prev = Some(at);
    }
    out
}

/// 1,000 maps: 800 multipath maps, 150 of their partition maps and 50 LVM volumes.
fn thousand_maps() -> Vec<u8> {
    let devs: Vec<(String, DevNum, u32, Option<String>)> = (0..1000u32)
        .map(|i| {
            let dev = DevNum {
                major: 253,
                minor: i,
            };
            let wwid = format!("36001405{:024x}", u64::from(i) * 0x5e7a_1000_0000_0001);
            match i {
                0..800 => (
                    format!("mpath{i}"),
                    dev,
                    i % 7,
                    Some(format!("mpath-{wwid}")),
                ),
                800..950 => (
                    format!("mpath{}-part1", i - 800),
                    dev,
                    1,
                    Some(format!("part1-mpath-{wwid}")),
                ),
                _ => (
                    format!("vg0-lv{}", i - 950),
                    dev,
                    0,
                    Some(format!("LVM-{:064x}", u128::from(i))),
                ),
            }
        })
        .collect();
    name_list(&devs)
}

fn bench_dm_list(c: &mut Criterion) {
    let payload = thousand_maps();
    assert_eq!(decode_names(&payload, true).unwrap().len(), 1000);
    let mut g = c.benchmark_group("dm_list");
    g.throughput(Throughput::Elements(1000));
    g.bench_function("decode_1000_maps", |b| {
        b.iter(|| decode_names(black_box(&payload), true))
    });
    g.finish();
}

// ---------------------------------------------------------------------------------------
// multipath status
// ---------------------------------------------------------------------------------------

fn bench_multipath_status(c: &mut Criterion) {
    let lines = [
        // multipathd's default on Debian: service-time, one group of two paths.
        (
            "two_paths",
            "2 0 0 0 1 1 A 0 2 2 8:16 A 0 0 1 8:32 A 0 0 1 ".to_owned(),
        ),
        // ALUA: an active and an enabled group, one path failed.
        (
            "alua_two_groups",
            "2 0 0 0 2 1 A 0 1 0 8:16 A 0 E 0 1 0 8:32 F 1 ".to_owned(),
        ),
        // A wide array: 4 groups of 4 paths each.
        ("sixteen_paths", {
            let mut s = String::from("2 1 0 0 4 1 ");
            for g in 0..4 {
                s.push_str(if g == 0 { "A 0 4 2 " } else { "E 0 4 2 " });
                for p in 0..4 {
                    s.push_str(&format!("{}:{} A 0 0 1 ", 65 + g, 16 * p));
                }
            }
            s
        }),
    ];
    let mut g = c.benchmark_group("multipath_status");
    for (name, line) in &lines {
        let s = Status::parse(line).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(!s.groups.is_empty());
        g.bench_function(*name, |b| b.iter(|| Status::parse(black_box(line))));
    }
    // A node-wide health check: the status of 1,000 two-path maps.
    let many: Vec<String> = (0..1000)
        .map(|i| {
            format!(
                "2 0 0 0 1 1 A 0 2 2 8:{} A 0 0 1 65:{} {} {} 0 1 ",
                i % 256,
                i % 256,
                if i % 10 == 0 { "F" } else { "A" },
                i % 3
            )
        })
        .collect();
    g.throughput(Throughput::Elements(many.len() as u64));
    g.bench_function("1000_maps_active_paths", |b| {
        b.iter(|| {
            many.iter()
                .map(|l| Status::parse(black_box(l)).unwrap().active_paths())
                .sum::<usize>()
        })
    });
    g.finish();
}

criterion_group!(
    benches,
    bench_uevent,
    bench_mountinfo,
    bench_dm_list,
    bench_multipath_status
);
criterion_main!(benches);

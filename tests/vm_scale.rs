//! Many volumes at once in one process, as a CSI plugin stages and unstages them during a
//! node drain or a StatefulSet's scaling (issue 38): every volume gets all its paths, no
//! operation fails, and nothing is left.
//!
//! Without multipathd: with it, the lab's udevd and multipathd under TCG take minutes to
//! build 32 maps (233 s measured), which is their throughput, not lunkit's; eight volumes
//! at once through multipathd are `vm_detach::many_volumes_in_parallel_and_one_volume_twice`.
#![allow(clippy::disallowed_methods)]

use lunkit_lab as support;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use lunkit::ops::{AttachOptions, DetachOptions, VolumeSpec};
use support::lab::{IscsiLab, LabConfig};
use support::lio::LioConfig;
use support::{require_vm, sysfs};

const IQN: &str = "iqn.2003-01.org.linux-iscsi.lunkit:lab";
const VOLUMES: u32 = 32;

fn spec(lun: u32) -> VolumeSpec {
    VolumeSpec::Iscsi {
        target: IQN.parse().unwrap(),
        lun: u64::from(lun),
    }
}

/// The SCSI addresses on the lab's sessions whose LUN is `lun`.
fn paths_of(lab: &IscsiLab, lun: u32) -> Vec<String> {
    lab.sessions
        .iter()
        .map(|s| format!("{}:0:0:{lun}", s.host))
        .filter(|h| Path::new(&format!("/sys/class/scsi_device/{h}")).exists())
        .collect()
}

#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn thirty_two_volumes_attached_and_detached_at_once_in_one_process() {
    require_vm();
    let lab = IscsiLab::build(LabConfig {
        target: LioConfig {
            luns: VOLUMES,
            lun_size: 4 << 20,
            ..LioConfig::default()
        },
        scan: vec![],
        multipath: None,
    })
    .expect("build the iSCSI lab");
    assert_eq!(lab.sessions.len(), 2, "{:?}", lab.sessions);
    assert!(lab.devices().is_empty(), "{:?}", lab.devices());
    let root = lunkit::Root::default();

    let (t0, cpu0, seq0) = (Instant::now(), cpu(), seqnum());
    let attached: Vec<(Duration, lunkit::ops::Attachment)> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..VOLUMES)
            .map(|lun| {
                let root = &root;
                s.spawn(move || {
                    let began = t0.elapsed();
                    let mut opts = AttachOptions::new(root);
                    opts.scan.min_paths = 2;
                    opts.scan.timeout = Duration::from_secs(300);
                    let a = lunkit::ops::attach(root, &spec(lun), &opts)
                        .unwrap_or_else(|e| panic!("attach LUN {lun}: {e}"));
                    (began, a)
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    let (attach_all, attach_cpu, attach_events) =
        (t0.elapsed(), cpu().since(cpu0), seqnum() - seq0);
    let mut wwids = BTreeSet::new();
    for (lun, (_, a)) in (0..VOLUMES).zip(&attached) {
        let scsi = a.scsi().expect("a SCSI attach");
        assert_eq!(scsi.devices().count(), 2, "LUN {lun}: {a:?}");
        assert_eq!(paths_of(&lab, lun).len(), 2, "LUN {lun}");
        let wwid = a.wwid.clone().expect("a WWID");
        assert!(wwids.insert(wwid.to_string()), "LUN {lun}: {wwid} twice");
    }
    // Exactly the 64 paths asked for: no other LUN came with them.
    assert_eq!(
        lab.devices().len(),
        2 * VOLUMES as usize,
        "{:?}",
        lab.devices()
    );

    eprintln!("{}", attach_timeline(&attached));

    let (t1, cpu1, seq1) = (Instant::now(), cpu(), seqnum());
    let reports: Vec<(Duration, lunkit::ops::DetachReport)> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..VOLUMES)
            .map(|lun| {
                let root = &root;
                s.spawn(move || {
                    let began = t1.elapsed();
                    let report = lunkit::ops::detach(root, &spec(lun), &DetachOptions::new(root))
                        .unwrap_or_else(|e| panic!("detach LUN {lun}: {e}"));
                    (began, report)
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    for (lun, (_, report)) in (0..VOLUMES).zip(&reports) {
        let deleted = report
            .steps
            .iter()
            .filter(|s| {
                s.kind == lunkit::ops::StepKind::DeletePath
                    && s.outcome == lunkit::ops::Outcome::Done
            })
            .count();
        assert_eq!(deleted, 2, "LUN {lun}: {report:?}");
    }
    let (detach_all, detach_cpu, detach_events) =
        (t1.elapsed(), cpu().since(cpu1), seqnum() - seq1);
    eprintln!("{}", timeline(&reports));
    eprintln!(
        "{VOLUMES} volumes of 2 paths in one process: attach-all {attach_all:?} ({attach_cpu} \
         of this process's CPU, {attach_events} uevents), detach-all {detach_all:?} \
         ({detach_cpu}, {detach_events} uevents)"
    );
    assert!(lab.devices().is_empty(), "left: {:?}", lab.devices());
    for name in sysfs::names("/sys/class/scsi_device") {
        let w = sysfs::attr(format!("/sys/class/scsi_device/{name}/device/wwid"));
        assert!(
            w.as_ref().is_none_or(|w| !wwids.contains(w)),
            "{name} with WWID {w:?} is still there"
        );
    }
}

/// The CPU time this process has used, all its threads (`/proc/self/stat`, in clock ticks
/// of 10 ms): user (lunkit's own code) and system (its syscalls, and the kernel's work done
/// in its threads, such as a scan write's probe of its LUN).
#[derive(Debug, Clone, Copy)]
struct Cpu {
    user: Duration,
    system: Duration,
}

impl Cpu {
    fn since(self, before: Cpu) -> Cpu {
        Cpu {
            user: self.user.saturating_sub(before.user),
            system: self.system.saturating_sub(before.system),
        }
    }
}

impl std::fmt::Display for Cpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?} user + {:?} system", self.user, self.system)
    }
}

fn cpu() -> Cpu {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("read /proc/self/stat");
    // Fields after the command's closing parenthesis: utime and stime are the 12th and 13th.
    let rest = &stat[stat.rfind(')').expect("a comm in /proc/self/stat") + 2..];
    let ticks: Vec<u64> = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .map(|f| f.parse::<u64>().expect("a tick count"))
        .collect();
    Cpu {
        user: Duration::from_millis(ticks[0] * 10),
        system: Duration::from_millis(ticks[1] * 10),
    }
}

/// The number of the kernel's last uevent: the difference over a phase is how many it sent,
/// each of which every uevent socket of this process received.
fn seqnum() -> u64 {
    sysfs::attr("/sys/kernel/uevent_seqnum")
        .and_then(|s| s.parse().ok())
        .expect("read /sys/kernel/uevent_seqnum")
}

/// Where the detaches' time went, for the log: each step of each report, from the start of
/// the detach-all.
fn timeline(reports: &[(Duration, lunkit::ops::DetachReport)]) -> String {
    let spans = reports.iter().flat_map(|(began, r)| {
        r.steps
            .iter()
            .map(move |s| (s.kind.as_str(), *began + s.start, s.duration))
    });
    table("detach steps", spans)
}

/// Where the attaches' time went, for the log: before the scan (identify, lock), each path's
/// scan write, its wait for the disk from the write's end, and the scan's end after the last
/// disk, from the start of the attach-all. The scan is taken to begin where the time before
/// it ends (what follows it, a record written, is short).
fn attach_timeline(attached: &[(Duration, lunkit::ops::Attachment)]) -> String {
    let mut spans = Vec::new();
    for (began, a) in attached {
        let scsi = a.scsi().expect("a SCSI attach");
        let before = a.elapsed.saturating_sub(scsi.scan_elapsed);
        spans.push(("before-scan", *began, before));
        let scan0 = *began + before;
        let mut last_ready = Duration::ZERO;
        for p in &scsi.paths {
            let t = &p.timing;
            if let (Some(ws), Some(we)) = (t.write_start, t.write_end) {
                spans.push(("scan-write", scan0 + ws, we.saturating_sub(ws)));
                if let Some(r) = t.ready {
                    spans.push(("disk-wait", scan0 + we, r.saturating_sub(we)));
                    last_ready = last_ready.max(r);
                }
            }
        }
        let tail = scsi.scan_elapsed.saturating_sub(last_ready);
        spans.push(("scan-tail", scan0 + last_ready, tail));
    }
    table("attach phases", spans.into_iter())
}

/// Per kind of span (name, start, length): the length summed, the longest, when the first
/// began and when the last ended.
fn table<'a>(title: &str, spans: impl Iterator<Item = (&'a str, Duration, Duration)>) -> String {
    use std::collections::BTreeMap;
    let mut kinds: BTreeMap<&str, (Duration, Duration, Duration, Duration)> = BTreeMap::new();
    for (kind, from, took) in spans {
        let to = from + took;
        let e = kinds
            .entry(kind)
            .or_insert((Duration::ZERO, Duration::ZERO, from, to));
        e.0 += took;
        e.1 = e.1.max(took);
        e.2 = e.2.min(from);
        e.3 = e.3.max(to);
    }
    let mut out = format!("{title} (sum, longest, first began, last ended):\n");
    for (k, (sum, max, first, last)) in kinds {
        out += &format!("  {k:14} {sum:>10.1?} {max:>10.1?} {first:>10.1?} {last:>10.1?}\n");
    }
    out
}

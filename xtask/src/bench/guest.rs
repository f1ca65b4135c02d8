//! The measurements inside the VM, in one boot: the iSCSI lab (scan and teardown rows), the
//! node row, a growable LUN behind two portals (resize row), an NVMe/TCP namespace over two
//! ports (the nvme rows, in [`nvme`]), 8, 16 and 32 2-path volumes attached and detached at
//! once (the atonce rows, in [`atonce`]), a 256-LUN and a 1-LUN target side by side (scale
//! rows), then 512 scsi_debug devices (listing).
//!
//! Every method of a row runs in rounds (round 0 is an unrecorded warm-up, to fault in the
//! binaries over 9p), interleaved so that drift on this shared machine hits all methods
//! alike, in an order shuffled each round so that what one run leaves behind does not always
//! fall on the same method (`model::round_order`). Between runs the system is brought back
//! to the same state: the devices a run made are deleted and udev settles, then the kernel
//! listener must see no event for a while.

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use lunkit_lab::iscsi::{self, Session};
use lunkit_lab::lab::{IscsiLab, LabConfig};
use lunkit_lab::lio::LioConfig;
use lunkit_lab::lio_extra::ExtraTarget;
use lunkit_lab::lio_grow::GrowTarget;
use lunkit_lab::multipath::{self, Map, Multipathd};
use lunkit_lab::scsi_debug::ScsiDebug;
use lunkit_lab::{VM_ENV, sysfs, udev, wait};

use super::resident::Resident;

use super::listener::{Event, Listener};
use super::model::{Measurement, Recorder, Run, State, round_order};
use super::multipathd;
use super::proc::{self, subcommand_available};
use super::sys;
use super::users;
use super::{ATONCE_VOLUMES, GROUPS, LISTING_HOSTS, LISTING_LUNS, WALK_NODES};
use crate::Result;

mod atonce;
mod fence;
mod nvme;
mod walk;

/// How long the kernel listener must hear nothing before the system counts as quiet.
const QUIET: Duration = Duration::from_millis(500);
/// How long [`warm_cpu`] spins before each measured action.
const WARM_UP: Duration = Duration::from_millis(50);
/// Any single wait for the kernel or a tool.
const TIMEOUT: Duration = Duration::from_secs(60);
/// The LUN the scan row brings in; LUN 0 stays attached (a node already using the target).
const SCAN_LUN: u32 = 3;
/// The LUN of the two-path volume the teardown row removes.
const TEARDOWN_LUN: u32 = 5;
/// Where the exec-from-tmpfs measurement copies the lunkit binary (guest /tmp is tmpfs).
const EXEC_COPY: &str = "/tmp/lunkit-bench-exec";
/// A target no session goes to (the discovery-only measurement).
const ABSENT_IQN: &str = "iqn.2003-01.org.linux-iscsi.lunkit:absent";
/// LUNs exported by the big target of the scale rows.
const SCALE_LUNS: u32 = 256;

struct Ctx {
    lunkit: PathBuf,
    runs: usize,
    listener: Listener,
    rec: Recorder,
}

/// `xtask bench --guest LUNKIT OUT RUNS GROUPS`
pub fn main(args: &[String]) -> Result<u8> {
    if std::env::var(VM_ENV).as_deref() != Ok("1") {
        return Err(
            format!("the guest part runs inside the VM only ({VM_ENV}=1 is not set)").into(),
        );
    }
    let [lunkit, out, runs, groups] = args else {
        return Err("usage: xtask bench --guest LUNKIT OUT RUNS GROUPS".into());
    };
    let groups: Vec<&str> = groups.split(',').collect();
    let lean = groups.iter().all(|g| LEAN_GROUPS.contains(g));
    let _warm = hold_programs_open(Path::new(lunkit), lean);
    let mut ctx = Ctx {
        lunkit: PathBuf::from(lunkit),
        runs: runs
            .parse()
            .map_err(|_| format!("bad run count {runs:?}"))?,
        listener: Listener::start()?,
        rec: Recorder::create(Path::new(out))?,
    };
    let wants = |g: &str| groups.contains(&g);
    let mut failed = false;
    let mut phase = |name: &str, row: &str, f: &mut dyn FnMut(&mut Ctx) -> Result<()>| {
        say(&format!("== {name}"));
        let t0 = Instant::now();
        if let Err(e) = f(&mut ctx) {
            say(&format!("{name} FAILED: {e}"));
            let mut m = Measurement::new(row, "setup", &format!("{name} (setup)"), "");
            m.state = State::Failed(e.to_string());
            let _ = ctx.rec.record(&m);
            failed = true;
        }
        say(&format!(
            "{name} took {:.1} s (listener receive errors so far: {})",
            t0.elapsed().as_secs_f64(),
            ctx.listener.errors()
        ));
    };
    if wants("scan") || wants("teardown") || wants("crowd") {
        phase("iSCSI lab: scan and teardown", "scan", &mut |ctx| {
            lab_phase(ctx, wants("scan"), wants("teardown"), wants("crowd"))
        });
    }
    if wants("node") {
        phase(
            "node: scans with udevd and multipathd running, 2 sessions",
            "node",
            &mut node_phase,
        );
    }
    if wants("busy") {
        phase(
            &format!(
                "busy node: {BUSY_OTHERS} other 2-path volumes, {BUSY_PROCESSES} more \
                 processes, udevd and multipathd running"
            ),
            "busy-teardown",
            &mut busy_phase,
        );
    }
    if wants("fence") {
        phase(
            "fence: a 2-path volume fenced with a persistent reservation at stage and unstage, \
             udevd and multipathd running",
            "fence-stage",
            &mut fence::phase,
        );
    }
    if wants("walk") {
        phase(
            &format!(
                "walk: a 2-path volume's detach on nodes of {WALK_NODES:?} processes of several \
                 kinds, udevd and multipathd running"
            ),
            "walk100",
            &mut walk::phase,
        );
    }
    if wants("resize") {
        phase(
            "resize: grow a 2-path volume online, udevd and multipathd running",
            "resize",
            &mut resize_phase,
        );
    }
    if wants("nvme") {
        phase(
            "nvme: connect and disconnect a namespace over 2 NVMe/TCP ports, udevd and \
             multipathd running",
            "nvme-connect",
            &mut nvme::phase,
        );
    }
    if wants("atonce") {
        phase(
            &format!(
                "atonce: {ATONCE_VOLUMES:?} 2-path volumes attached and detached at once, udevd \
                 running, no multipathd"
            ),
            "atonce8-attach",
            &mut atonce::phase,
        );
    } else if wants("atonce32") {
        phase(
            "atonce32: 32 2-path volumes attached and detached at once, lunkit and the kernel \
             floor only (issue 38's targets), udevd running, no multipathd",
            "atonce32-attach",
            &mut atonce::targets_phase,
        );
    }
    if wants("scale") {
        phase(
            &format!("scale: 1 and {SCALE_LUNS} LUNs exported"),
            "scale1",
            &mut scale_phase,
        );
    }
    if wants("listing") {
        phase(
            "listing: 512 scsi_debug devices",
            "listing",
            &mut listing_phase,
        );
    }
    let unknown: Vec<&&str> = groups
        .iter()
        .filter(|g| !GROUPS.contains(g) || **g == "flush")
        .collect();
    if !unknown.is_empty() {
        say(&format!("ignored groups (not VM rows): {unknown:?}"));
    }
    Ok(if failed { 1 } else { 0 })
}

fn say(msg: &str) {
    println!("bench: {msg}");
}

/// The guest reaches the host root over 9p without a page cache for files nobody has open
/// (an unused inode is dropped with its pages): every exec then reads the whole binary again,
/// ~90 ms more for lunkit's 1.8 MB and seconds when the host is busy. A storage node keeps
/// its programs in the page cache. Holding them (lunkit, every program in /usr/bin and
/// /usr/sbin and every shared library) gives lunkit and the peers alike that.
///
/// They are held by a one-byte mapping each, not by an open descriptor: 2,000 descriptors in
/// one process would be 2,000 more files for lunkit's in-use check to look at, which a
/// storage node does not have (it cost a detach ~500 ms before). Empty files, which cannot be
/// mapped, stay open.
///
/// A mapping costs the check too, since it looks at every process's memory mappings: once per
/// distinct file per walk, a `statx` that on this 9p root is a round trip to the host. With
/// all 2,434 programs and libraries held, the quiet teardown's in-use check took 3.4–7.1 s
/// (2026-11-27, loaded host) instead of about 13 ms, and the NVMe detach's 1.2–2.2 s
/// (2026-11-28) instead of 18–40 ms. So when only the rows that detach run (`lean`:
/// [`LEAN_GROUPS`]), only what they run is held: lunkit, the tools of their peers and the
/// lab, and the libraries those load ([`lean_programs`]).
fn hold_programs_open(lunkit: &Path, lean: bool) -> Vec<fs::File> {
    let limit = super::sys::raise_nofile_limit().unwrap_or(1024);
    let budget = usize::try_from(limit).unwrap_or(1024).saturating_sub(256);
    let mut paths = vec![lunkit.to_path_buf()];
    if lean {
        paths.extend(lean_programs());
        return hold(&paths, budget);
    }
    for dir in [
        "/usr/bin",
        "/usr/sbin",
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/x86_64-linux-gnu/multipath",
    ] {
        let is_lib = dir.contains("/lib/");
        let mut names = sysfs::names(dir);
        names.retain(|n| !is_lib || n.contains(".so"));
        paths.extend(names.into_iter().map(|n| Path::new(dir).join(n)));
    }
    hold(&paths, budget)
}

/// The groups whose rows run only the tools [`lean_programs`] lists.
const LEAN_GROUPS: &[&str] = &[
    "node", "teardown", "crowd", "busy", "fence", "walk", "nvme", "atonce", "atonce32",
];

/// The programs the lean groups run (the bench's, the peers' and the lab's), and the shared
/// libraries each loads, as `ldd` lists them.
fn lean_programs() -> Vec<PathBuf> {
    let programs = [
        "blockdev",
        "lsscsi",
        "multipath",
        "multipathd",
        "nvme",
        "iscsiadm",
        "iscsid",
        "udevadm",
        "python3",
        "sh",
        "dash",
        "bash",
    ];
    let mut paths: Vec<PathBuf> = Vec::new();
    for p in programs {
        let Some(exe) = ["/usr/sbin", "/usr/bin", "/sbin", "/bin"]
            .iter()
            .map(|d| Path::new(d).join(p))
            .find(|f| f.is_file())
        else {
            continue;
        };
        let libs = Command::new("ldd").arg(&exe).output().map_or_else(
            |_| String::new(),
            |o| String::from_utf8_lossy(&o.stdout).into_owned(),
        );
        paths.push(exe);
        // `libfoo.so.1 => /lib/x86_64-linux-gnu/libfoo.so.1 (0x...)`, or the loader alone.
        paths.extend(
            libs.split_whitespace()
                .filter(|w| w.starts_with('/'))
                .map(PathBuf::from),
        );
    }
    paths.sort();
    paths.dedup();
    paths
}

/// Holds `paths` (at most `budget`), mapped where they can be and open otherwise.
fn hold(paths: &[PathBuf], budget: usize) -> Vec<fs::File> {
    let mut mapped = 0;
    let held: Vec<fs::File> = paths
        .iter()
        .filter(|p| p.is_file())
        .take(budget)
        .filter_map(|p| fs::File::open(p).ok())
        .filter(|f| {
            let pinned = super::sys::pin_mapped(f).is_ok();
            mapped += usize::from(pinned);
            !pinned
        })
        .collect();
    say(&format!(
        "holding {} of {} programs and libraries ({mapped} mapped, {} open) so 9p keeps them \
         cached",
        mapped + held.len(),
        paths.len(),
        held.len()
    ));
    held
}

// ---------------------------------------------------------------------------------------
// Shared helpers
// ---------------------------------------------------------------------------------------

fn seqnum() -> Result<u64> {
    let s = fs::read_to_string("/sys/kernel/uevent_seqnum")?;
    Ok(s.trim().parse()?)
}

/// H:C:T:L of the SCSI devices on `host`.
fn devices_on(host: u32) -> BTreeSet<String> {
    let prefix = format!("{host}:");
    sysfs::names("/sys/class/scsi_device")
        .into_iter()
        .filter(|h| h.starts_with(&prefix))
        .collect()
}

/// The disk of `hctl` if its /dev node opens (what lunkit scan waits for).
fn node_opens(hctl: &str) -> Option<String> {
    let name = sysfs::names(format!("/sys/class/scsi_device/{hctl}/device/block"))
        .into_iter()
        .next()?;
    fs::OpenOptions::new()
        .read(true)
        .custom_flags(0o4000) // O_NONBLOCK
        .open(format!("/dev/{name}"))
        .ok()
        .map(|_| name)
}

/// Checks `done` at once and then every `every`, as the peers' wait loops do.
fn poll_every(every: Duration, what: &str, mut done: impl FnMut() -> bool) -> Result<()> {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        if done() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!("timed out after {TIMEOUT:?} waiting for {what}").into());
        }
        std::thread::sleep(every);
    }
}

/// Busy CPU just before a measured action. Under TCG on this (itself virtual) machine, work
/// that starts after an idle spell runs 2-3x slower than right after activity: a scan write
/// from an idle guest took 38 ms to the scsi_device and 60 ms to the disk, after 50 ms of
/// spinning 14 and 22 ms. lunkit's own exec warms the CPU before its scan, so without this
/// the floor (written from an idle guest) would be the slower of the two. Every measured run
/// starts warm.
fn warm_cpu() {
    let end = Instant::now() + WARM_UP;
    let mut x = 0u64;
    while Instant::now() < end {
        x = std::hint::black_box(x.wrapping_add(1));
    }
}

/// udev finished and the kernel silent for [`QUIET`].
fn settle(ctx: &Ctx) -> Result<()> {
    if udev::running() {
        udev::settle(TIMEOUT)?;
    }
    if !ctx.listener.wait_quiet(QUIET, TIMEOUT) {
        return Err(format!("the kernel did not go quiet within {TIMEOUT:?}").into());
    }
    ctx.listener.clear();
    Ok(())
}

/// Writes each `(attribute, value)` on a thread of its own, all at once (a scan write returns
/// only once its host's scan is done); the first failure, naming its attribute.
fn write_side_by_side(writes: &[(String, String)]) -> Result<()> {
    let written: Vec<std::io::Result<()>> = std::thread::scope(|sc| {
        let handles: Vec<_> = writes
            .iter()
            .map(|(attr, value)| sc.spawn(move || fs::write(attr, value)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(std::io::Error::other("writer panicked")))
            })
            .collect()
    });
    for ((attr, value), w) in writes.iter().zip(written) {
        w.map_err(|e| format!("writing {value:?} to {attr}: {e}"))?;
    }
    Ok(())
}

/// Flushes and deletes every disk in `disks` (kernel names) side by side, a thread each: the
/// kernel floor's take-down of paths. A delete returns once the kernel removed the disk.
fn flush_and_delete_side_by_side(disks: &[String]) -> Result<()> {
    std::thread::scope(|s| -> Result<()> {
        let deletes: Vec<_> = disks
            .iter()
            .map(|d| {
                s.spawn(move || -> std::io::Result<()> {
                    sys::flush_buffers(&format!("/dev/{d}"))?;
                    fs::write(format!("/sys/block/{d}/device/delete"), "1")
                })
            })
            .collect();
        for d in deletes {
            d.join().map_err(|_| "a path delete panicked")??;
        }
        Ok(())
    })
}

/// Deletes SCSI devices and waits until they are gone.
fn delete_devices(hctls: &[String]) -> Result<()> {
    for h in hctls {
        let p = format!("/sys/class/scsi_device/{h}/device/delete");
        if let Err(e) = fs::write(&p, "1") {
            if Path::new(&p).exists() {
                return Err(format!("write 1 to {p}: {e}").into());
            }
        }
    }
    wait::until_true("deleted SCSI devices to go", TIMEOUT, || {
        hctls
            .iter()
            .all(|h| !Path::new(&format!("/sys/class/scsi_device/{h}")).exists())
    })
}

/// Deletes whatever appeared on `host` beyond `baseline`, then settles.
fn restore(ctx: &Ctx, host: u32, baseline: &BTreeSet<String>) -> Result<()> {
    let extra: Vec<String> = devices_on(host).difference(baseline).cloned().collect();
    delete_devices(&extra)?;
    settle(ctx)
}

fn ms(us: u64) -> String {
    format!("{:.1} ms", us as f64 / 1000.0)
}

fn progress(m: &Measurement, round: usize, runs: usize, r: &Run) {
    let mut s = format!(
        "{} {}: {}",
        m.id,
        if round == 0 {
            "warm-up".to_owned()
        } else {
            format!("run {round}/{runs}")
        },
        ms(r.wall_us)
    );
    if let Some(l) = r.lib_us {
        s += &format!(" (library {})", ms(l));
    }
    if let Some(w) = r.first_write_us {
        s += &format!(" (first write at {})", ms(w));
    }
    if let Some(a) = r.after_ready_us {
        s += &format!(" ({} after the last disk opened)", ms(a));
    }
    if let Some(c) = r.check_us {
        s += &format!(" (in-use check {})", ms(c));
    }
    if let Some(d) = r.dev_add_us {
        s += &format!(", scsi_device add at {}", ms(d));
    }
    if let Some(a) = r.add_us {
        s += &format!(", disk add at {}", ms(a));
    }
    if let Some(u) = r.uevents {
        s += &format!(", {u} uevents");
    }
    if let Some(x) = r.extra {
        s += &format!(", {x} extra devices");
    }
    if let Some(k) = r.rss_kib {
        s += &format!(", peak RSS {k} KiB");
    }
    say(&s);
}

/// Runs `methods` interleaved for `1 + runs` rounds (round 0 discarded), in a new order each
/// round ([`round_order`]); a method that fails stops (its state says why) while the others
/// go on. `once(ctx, method)` measures one run and leaves the system as it found it.
fn rounds<M: Copy>(
    ctx: &mut Ctx,
    methods: &[(M, Measurement)],
    mut once: impl FnMut(&mut Ctx, M) -> Result<Run>,
) -> Result<Vec<Measurement>> {
    let mut ms: Vec<Measurement> = methods.iter().map(|(_, m)| m.clone()).collect();
    for round in 0..=ctx.runs {
        for i in round_order(methods.len(), round) {
            let method = &methods[i].0;
            if ms[i].state != State::Ok {
                continue;
            }
            match once(ctx, *method) {
                Ok(run) => {
                    progress(&ms[i], round, ctx.runs, &run);
                    if round > 0 {
                        ms[i].runs.push(run);
                    }
                }
                Err(e) => {
                    say(&format!("{} round {round} FAILED: {e}", ms[i].id));
                    ms[i].state = State::Failed(format!("round {round}: {e}"));
                }
            }
        }
    }
    for m in &ms {
        ctx.rec.record(m)?;
    }
    Ok(ms)
}

/// Runs each of `tools` (program and arguments) in turn, output to /dev/null, each required
/// to exit 0: the sum of their spawn-to-exit times. With `record`, each one's time is also
/// a run of its measurement in `parts` (in the same order).
fn tools_in_turn(
    tools: &[(&str, &[&str])],
    parts: &mut [Measurement],
    record: bool,
) -> Result<u64> {
    let mut sum = 0;
    for ((prog, args), part) in tools.iter().zip(parts) {
        let out = proc::timed(Command::new(prog).args(*args), false)?.ok(prog)?;
        let us = out.wall.as_micros() as u64;
        sum += us;
        if record {
            part.runs.push(Run {
                wall_us: us,
                ..Run::default()
            });
        }
    }
    Ok(sum)
}

/// A measurement that cannot be made here, recorded as such.
fn unavailable(ctx: &mut Ctx, mut m: Measurement, why: String) -> Result<()> {
    say(&format!("{}: not available: {why}", m.id));
    m.state = State::Unavailable(why);
    ctx.rec.record(&m)
}

// ---------------------------------------------------------------------------------------
// Scan rows
// ---------------------------------------------------------------------------------------

/// Where the scanned LUN is.
#[derive(Debug, Clone)]
struct Target {
    session: Session,
    lun: u32,
}

impl Target {
    fn hctl(&self) -> String {
        format!("{}:0:0:{}", self.session.host, self.lun)
    }

    fn by_path(&self) -> PathBuf {
        PathBuf::from(format!(
            "/dev/disk/by-path/ip-{}-iscsi-{}-lun-{}",
            self.session.portal, self.session.target, self.lun
        ))
    }

    fn scan_attr(&self) -> String {
        format!("/sys/class/scsi_host/host{}/scan", self.session.host)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scan {
    /// `lunkit --version`: what exec alone costs here, to read the CLI figures by.
    Exec,
    /// The same with the binary copied to the guest's tmpfs: checks that holding the
    /// programs open keeps 9p from reading them again on every exec.
    ExecTmpfs,
    /// `lunkit scan iscsi` of a target with no session: exec plus session discovery, which
    /// fails (exit 3) before any scan is written.
    Discovery,
    Lunkit,
    Floor,
    Poll,
    Iscsiadm,
    RescanScsiBus,
}

fn scan_measurement(row: &str, m: Scan, t: &Target) -> Measurement {
    let (host, lun, sid) = (t.session.host, t.lun, t.session.sid);
    match m {
        Scan::Exec => Measurement::new(
            row,
            "exec",
            "  exec alone: lunkit --version",
            "`lunkit --version`, spawn to exit: the cost of starting the binary in this guest, \
             included in every CLI figure (lunkit's and the peers').",
        ),
        Scan::ExecTmpfs => Measurement::new(
            row,
            "exec-tmpfs",
            "  exec alone, binary on tmpfs",
            &format!(
                "`{EXEC_COPY} --version` (the binary copied into the guest's /tmp), spawn to \
                 exit: the check that the programs held open on the 9p root (see the guest's \
                 log) start as fast as from local memory, as on a node."
            ),
        ),
        Scan::Discovery => Measurement::new(
            row,
            "discovery",
            "  exec + session discovery: scan of an absent target",
            &format!(
                "`lunkit scan iscsi --target {ABSENT_IQN} --lun {lun}`, spawn to exit (status 3, \
                 no session): exec plus reading the iSCSI sessions, without any scan."
            ),
        ),
        Scan::Lunkit => Measurement::new(
            row,
            "lunkit",
            "lunkit scan iscsi",
            &format!(
                "`lunkit scan iscsi --target IQN --portal {} --lun {lun} --json` (release build), \
                 spawn to exit; it returns once the disk's /dev node opens. The library time is \
                 the `elapsed_us` lunkit reports (no exec).",
                t.session.portal
            ),
        ),
        Scan::Floor => Measurement::new(
            row,
            "floor",
            "kernel floor",
            &format!(
                "`0 0 {lun}` written to host{host}/scan from the benchmark process; time until an \
                 independent netlink listener (group 1, its own parser) receives the disk's \
                 `add` uevent."
            ),
        ),
        Scan::Poll => Measurement::new(
            row,
            "poll",
            "sysfs scan + 1 s poll (Kubernetes, os-brick)",
            &format!(
                "`0 0 {lun}` written to host{host}/scan, then the /dev/disk/by-path link checked \
                 at once and every 1 s (Kubernetes' waitForPathToExist; os-brick also rechecks \
                 once a second)."
            ),
        ),
        Scan::Iscsiadm => Measurement::new(
            row,
            "iscsiadm",
            "iscsiadm rescan + 1 s poll (csi-lib-iscsi)",
            &format!(
                "`iscsiadm -m session -r {sid} --rescan`, then the by-path link checked at once \
                 and every 1 s (csi-lib-iscsi's default CheckInterval). The rescan scans the \
                 whole target."
            ),
        ),
        Scan::RescanScsiBus => Measurement::new(
            row,
            "rescan-scsi-bus",
            "rescan-scsi-bus.sh (sg3_utils)",
            &format!(
                "`rescan-scsi-bus.sh --hosts={host} --luns={lun}`, then the disk's /dev node \
                 polled every 10 ms until it opens. (The script only scans targets that already \
                 have a LUN: LUN 0 stays attached in this row.)"
            ),
        ),
    }
}

/// One scan run: the LUN is absent before and deleted after.
fn scan_once(ctx: &mut Ctx, t: &Target, m: Scan, baseline: &BTreeSet<String>) -> Result<Run> {
    if m == Scan::Exec || m == Scan::ExecTmpfs {
        warm_cpu();
        let bin = if m == Scan::Exec {
            ctx.lunkit.clone()
        } else {
            PathBuf::from(EXEC_COPY)
        };
        let out = proc::timed(Command::new(&bin).arg("--version"), true)?.ok("lunkit --version")?;
        return Ok(Run {
            wall_us: out.wall.as_micros() as u64,
            rss_kib: Some(out.rss_kib),
            ..Run::default()
        });
    }
    if m == Scan::Discovery {
        warm_cpu();
        let out = proc::timed(
            Command::new(&ctx.lunkit).args([
                "scan",
                "iscsi",
                "--target",
                ABSENT_IQN,
                "--lun",
                &t.lun.to_string(),
            ]),
            false,
        )?;
        if out.status.code() != Some(3) {
            return Err(format!(
                "scan of an absent target: expected exit 3, got {}: {}",
                out.status,
                out.stderr.trim()
            )
            .into());
        }
        return Ok(Run {
            wall_us: out.wall.as_micros() as u64,
            rss_kib: Some(out.rss_kib),
            ..Run::default()
        });
    }
    let hctl = t.hctl();
    if devices_on(t.session.host) != *baseline {
        restore(ctx, t.session.host, baseline)?;
    }
    let mut run = Run::default();
    let seq0 = seqnum()?;
    warm_cpu();
    let t_start = Instant::now();
    let result = (|| -> Result<()> {
        match m {
            Scan::Exec | Scan::ExecTmpfs | Scan::Discovery => unreachable!("handled above"),
            Scan::Lunkit => {
                let out = proc::timed(
                    Command::new(&ctx.lunkit).args([
                        "scan",
                        "iscsi",
                        "--target",
                        &t.session.target,
                        "--portal",
                        &t.session.portal,
                        "--lun",
                        &t.lun.to_string(),
                        "--timeout",
                        "60",
                        "--json",
                    ]),
                    true,
                )?
                .ok("lunkit scan iscsi")?;
                run.wall_us = out.wall.as_micros() as u64;
                run.lib_us = proc::json_u64(&out.stdout, "elapsed_us");
                scan_split(&mut run, &out.stdout);
                run.rss_kib = Some(out.rss_kib);
            }
            Scan::Floor => run.wall_us = floor_scan(ctx, t, seq0, t_start)?,
            Scan::Poll => {
                fs::write(t.scan_attr(), format!("0 0 {}", t.lun))?;
                let link = t.by_path();
                poll_every(Duration::from_secs(1), "the by-path link", || link.exists())?;
                run.wall_us = t_start.elapsed().as_micros() as u64;
            }
            Scan::Iscsiadm => {
                let sid = t.session.sid.to_string();
                proc::timed(
                    Command::new("iscsiadm").args(["-m", "session", "-r", &sid, "--rescan"]),
                    false,
                )?
                .ok("iscsiadm --rescan")?;
                let link = t.by_path();
                poll_every(Duration::from_secs(1), "the by-path link", || link.exists())?;
                run.wall_us = t_start.elapsed().as_micros() as u64;
            }
            Scan::RescanScsiBus => {
                proc::timed(
                    Command::new("rescan-scsi-bus.sh").args([
                        format!("--hosts={}", t.session.host),
                        format!("--luns={}", t.lun),
                    ]),
                    false,
                )?
                .ok("rescan-scsi-bus.sh")?;
                poll_every(Duration::from_millis(10), "the disk to open", || {
                    node_opens(&hctl).is_some()
                })?;
                run.wall_us = t_start.elapsed().as_micros() as u64;
            }
        }
        Ok(())
    })();
    add_times(ctx, &mut run, seq0, t_start, std::slice::from_ref(&hctl));
    // Count what the action caused (udev's reactions included) before cleaning up.
    ctx.listener.wait_quiet(QUIET, TIMEOUT);
    run.uevents = Some(seqnum()?.saturating_sub(seq0));
    let now = devices_on(t.session.host);
    let appeared: Vec<&String> = now.difference(baseline).collect();
    run.extra = Some(appeared.iter().filter(|h| ***h != hctl).count() as u64);
    let wanted_ok = node_opens(&hctl).is_some();
    restore(ctx, t.session.host, baseline)?;
    result?;
    if !wanted_ok {
        return Err(format!("{hctl} has no disk that opens after the run").into());
    }
    Ok(run)
}

/// The kernel floor of a scan: `0 0 LUN` written to the host's `scan` from this process,
/// until the independent listener receives the disk's `add` uevent; microseconds.
fn floor_scan(ctx: &Ctx, t: &Target, seq0: u64, t_start: Instant) -> Result<u64> {
    let hctl = t.hctl();
    fs::write(t.scan_attr(), format!("0 0 {}", t.lun))?;
    let ev = ctx
        .listener
        .wait_for(seq0, t_start + TIMEOUT, |e| e.is_disk_add_of(&hctl))
        .ok_or_else(|| format!("no disk add uevent for {hctl} within {TIMEOUT:?}"))?;
    Ok(ev.at.saturating_duration_since(t_start).as_micros() as u64)
}

/// The kernel floor of a scan on every session at once: `0 0 LUN` written to each host's
/// `scan` from a thread per session (a write returns only once its path's INQUIRYs are
/// done), until the listener has every disk's `add` uevent; microseconds.
fn floor_scan_all(
    ctx: &Ctx,
    sessions: &[Session],
    lun: u32,
    seq0: u64,
    t_start: Instant,
) -> Result<u64> {
    let targets: Vec<Target> = sessions
        .iter()
        .map(|s| Target {
            session: s.clone(),
            lun,
        })
        .collect();
    let writes: Vec<(String, String)> = targets
        .iter()
        .map(|t| (t.scan_attr(), format!("0 0 {}", t.lun)))
        .collect();
    write_side_by_side(&writes)?;
    let mut last = 0;
    for t in &targets {
        let hctl = t.hctl();
        let ev = ctx
            .listener
            .wait_for(seq0, t_start + TIMEOUT, |e| e.is_disk_add_of(&hctl))
            .ok_or_else(|| format!("no disk add uevent for {hctl} within {TIMEOUT:?}"))?;
        last = last.max(ev.at.saturating_duration_since(t_start).as_micros() as u64);
    }
    Ok(last)
}

/// Where a lunkit scan's library time went, from its `--json`: until its first scan write,
/// and after its last disk opened; between them is the kernel's work as lunkit saw it.
fn scan_split(run: &mut Run, json: &str) {
    run.first_write_us = proc::json_u64s(json, "write_start_us").into_iter().min();
    let last_ready = proc::json_u64s(json, "ready_us").into_iter().max();
    run.after_ready_us = run
        .lib_us
        .zip(last_ready)
        .map(|(lib, ready)| lib.saturating_sub(ready));
}

/// When the disks' and the scsi_devices' `add` uevents of `hctls` came, the last of each,
/// relative to the start of the run (already received by now for every method that
/// succeeded); none when one of them did not come.
fn add_times(ctx: &Ctx, run: &mut Run, seq0: u64, t_start: Instant, hctls: &[String]) {
    let since = |ev: &Event| ev.at.saturating_duration_since(t_start).as_micros() as u64;
    let last = |of: &dyn Fn(&Event, &str) -> bool| -> Option<u64> {
        let each: Option<Vec<u64>> = hctls
            .iter()
            .map(|h| {
                ctx.listener
                    .wait_for(seq0, Instant::now(), |e| of(e, h))
                    .map(|ev| since(&ev))
            })
            .collect();
        each?.into_iter().max()
    };
    run.add_us = last(&|e, h| e.is_disk_add_of(h));
    run.dev_add_us = last(&|e, h| e.is_scsi_device_add_of(h));
}

fn scan_row(
    ctx: &mut Ctx,
    row: &str,
    t: &Target,
    methods: &[Scan],
    baseline: &BTreeSet<String>,
) -> Result<Vec<Measurement>> {
    let list: Vec<(Scan, Measurement)> = methods
        .iter()
        .map(|&m| (m, scan_measurement(row, m, t)))
        .collect();
    restore(ctx, t.session.host, baseline)?;
    rounds(ctx, &list, |ctx, m| scan_once(ctx, t, m, baseline))
}

/// The 8-LUN lab with two portals: the scan row on the first session (LUN 0 attached on
/// both), then the teardown row with multipathd.
fn lab_phase(ctx: &mut Ctx, scan: bool, teardown: bool, crowd: bool) -> Result<()> {
    let lab = IscsiLab::build(LabConfig {
        scan: vec![0],
        multipath: None,
        ..LabConfig::default()
    })?;
    settle(ctx)?;
    if scan {
        fs::copy(&ctx.lunkit, EXEC_COPY)
            .map_err(|e| format!("copy {} to {EXEC_COPY}: {e}", ctx.lunkit.display()))?;
        let t = Target {
            session: lab.sessions[0].clone(),
            lun: SCAN_LUN,
        };
        let baseline = devices_on(t.session.host);
        scan_row(
            ctx,
            "scan",
            &t,
            &[
                Scan::Lunkit,
                Scan::Exec,
                Scan::ExecTmpfs,
                Scan::Discovery,
                Scan::Floor,
                Scan::Poll,
                Scan::Iscsiadm,
                Scan::RescanScsiBus,
            ],
            &baseline,
        )?;
    }
    if teardown {
        teardown_row(ctx, &lab.sessions, None)?;
    }
    if crowd {
        let people = Crowd::start(CROWD_PROCESSES, true)?;
        teardown_row(ctx, &lab.sessions, Some(&people))?;
        people.stop()?;
    }
    lab.teardown()
}

/// The scale rows in one phase, so that drift on this shared machine cannot favour either:
/// the lab's target exports [`SCALE_LUNS`] LUNs, a second target beside it exports one, one
/// session each (same portal), and the same scan of LUN 0 and its floor run interleaved on
/// both.
fn scale_phase(ctx: &mut Ctx) -> Result<()> {
    let t0 = Instant::now();
    let portal = "127.0.0.1:3260";
    let lab = IscsiLab::build(LabConfig {
        target: LioConfig {
            luns: SCALE_LUNS,
            portals: vec![portal.into()],
            ..LioConfig::default()
        },
        scan: Vec::new(),
        multipath: None,
    })?;
    let one_iqn = format!("{}-one", lab.config.target.iqn);
    let one = ExtraTarget::create(&one_iqn, portal, lab.config.target.lun_size)?;
    iscsi::discover(portal)?;
    let one_session = iscsi::login(&one_iqn, portal)?;
    say(&format!(
        "targets with {SCALE_LUNS} LUNs and with 1 LUN built and logged in after {:.1} s",
        t0.elapsed().as_secs_f64()
    ));
    settle(ctx)?;
    let targets = [
        (
            "scale1",
            Target {
                session: one_session,
                lun: 0,
            },
        ),
        (
            "scale256",
            Target {
                session: lab.sessions[0].clone(),
                lun: 0,
            },
        ),
    ];
    let baselines: Vec<BTreeSet<String>> = targets
        .iter()
        .map(|(_, t)| devices_on(t.session.host))
        .collect();
    let mut list = Vec::new();
    for (i, (row, t)) in targets.iter().enumerate() {
        for m in [Scan::Lunkit, Scan::Floor] {
            list.push(((i, m), scan_measurement(row, m, t)));
        }
    }
    for (i, (_, t)) in targets.iter().enumerate() {
        restore(ctx, t.session.host, &baselines[i])?;
    }
    let result = rounds(ctx, &list, |ctx, (i, m)| {
        scan_once(ctx, &targets[i].1, m, &baselines[i])
    });
    // The lab's teardown logs every session out, then the extra target can go.
    let lab_down = lab.teardown();
    one.teardown()?;
    lab_down?;
    result.map(|_| ())
}

// ---------------------------------------------------------------------------------------
// Scan rows on a node as it runs in production
// ---------------------------------------------------------------------------------------

/// How the `node` row brings the LUN in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NodeScan {
    /// `lunkit scan iscsi --portal P`: one path.
    Lunkit,
    /// The kernel alone, one path.
    Floor,
    /// `lunkit scan iscsi` on both sessions at once.
    LunkitBoth,
    /// The kernel alone, both paths at once: what a second path costs the kernel itself.
    FloorBoth,
    /// [`NodeScan::Lunkit`] in the row's `lunkit batch` process.
    Resident,
    /// [`NodeScan::LunkitBoth`] in the row's `lunkit batch` process.
    ResidentBoth,
}

/// The scan rows with what every node runs beside them: udevd (virtme-ng's init starts it)
/// and multipathd with `find_multipaths no`, which maps every new disk at once, two sessions
/// to the target. The bare `scan` row (no multipathd) stays.
fn node_phase(ctx: &mut Ctx) -> Result<()> {
    let lab = IscsiLab::build(LabConfig {
        scan: vec![0],
        multipath: None,
        ..LabConfig::default()
    })?;
    if lab.sessions.len() < 2 {
        return Err(format!(
            "the node row needs 2 sessions, the lab has {}",
            lab.sessions.len()
        )
        .into());
    }
    let mpd = Multipathd::start(multipath::DEFAULT_CONF)?;
    let result = (|| -> Result<()> {
        // LUN 0 is on both sessions: multipathd maps it first; let that finish.
        multipath::wait_maps(1, lab.sessions.len())?;
        settle(ctx)?;
        node_rows(ctx, "node", &lab.sessions, SCAN_LUN)
    })();
    let stopped = mpd.stop();
    result?;
    stopped?;
    lab.teardown()
}

/// The lab's target on both sessions with LUN 0 scanned and mapped by multipathd (the lab's
/// configuration), udevd running, settled; then `rows`, and the lab taken down whatever
/// happened. `what` names the rows in the error when the lab has not 2 sessions.
fn on_mapped_lab(
    ctx: &mut Ctx,
    what: &str,
    rows: impl FnOnce(&mut Ctx, &IscsiLab) -> Result<()>,
) -> Result<()> {
    let lab = IscsiLab::build(LabConfig {
        scan: vec![0],
        multipath: None,
        ..LabConfig::default()
    })?;
    let result = (|| -> Result<()> {
        if lab.sessions.len() != 2 {
            let n = lab.sessions.len();
            return Err(format!("{what} need 2 sessions, the lab has {n}").into());
        }
        let mpd = Multipathd::start(multipath::DEFAULT_CONF)?;
        let measured = multipath::wait_maps(1, 2)
            .and_then(|_| settle(ctx))
            .and_then(|()| rows(ctx, &lab));
        let stopped = mpd.stop();
        measured.and(stopped)
    })();
    let down = lab.teardown();
    result.and(down)
}

/// The node row's scans of LUN `lun` as row `row`, multipathd running already.
fn node_rows(ctx: &mut Ctx, row: &str, sessions: &[Session], lun: u32) -> Result<()> {
    {
        let portal = &sessions[0].portal;
        let list = [
            (
                NodeScan::Lunkit,
                Measurement::new(
                    row,
                    "lunkit",
                    "lunkit scan iscsi, one path",
                    &format!(
                        "`lunkit scan iscsi --target IQN --portal {portal} --lun {lun} \
                         --json`, spawn to exit, with udevd and multipathd (find_multipaths \
                         no) running: multipathd maps the disk as it comes. The library time \
                         is `elapsed_us`."
                    ),
                ),
            ),
            (
                NodeScan::Floor,
                Measurement::new(
                    row,
                    "floor",
                    "kernel floor",
                    &format!(
                        "`0 0 {lun}` written to host{}/scan from the benchmark process; \
                         time until an independent netlink listener receives the disk's `add` \
                         uevent. udevd and multipathd run as for lunkit.",
                        sessions[0].host
                    ),
                ),
            ),
            (
                NodeScan::LunkitBoth,
                Measurement::new(
                    row,
                    "both",
                    "lunkit scan iscsi, both sessions",
                    &format!(
                        "`lunkit scan iscsi --target IQN --lun {lun} --json` (no \
                         --portal: every session, scanned at once), spawn to exit; it returns \
                         once both disks' nodes open. Its library time against the one-path \
                         scan's is what a second path costs."
                    ),
                ),
            ),
            (
                NodeScan::FloorBoth,
                Measurement::new(
                    row,
                    "floor2",
                    "kernel floor, both sessions",
                    &format!(
                        "`0 0 {lun}` written to each session's host{{N}}/scan at once, \
                         from two threads of the benchmark process (each write returns only \
                         after its path's INQUIRYs); time until the independent listener has \
                         both disks' `add` uevents. What the kernel itself takes for a second \
                         path, against the one-path floor."
                    ),
                ),
            ),
        ];
        let mut list = list.to_vec();
        let mut resident = start_resident(ctx)?;
        if resident.is_some() {
            list.extend([
                (
                    NodeScan::Resident,
                    Measurement::new(
                        row,
                        "resident",
                        "lunkit scan iscsi, one path, resident",
                        &format!("The one-path scan as a line to {RESIDENT_NOTE}"),
                    ),
                ),
                (
                    NodeScan::ResidentBoth,
                    Measurement::new(
                        row,
                        "resident-both",
                        "lunkit scan iscsi, both sessions, resident",
                        &format!("The 2-session scan as a line to {RESIDENT_NOTE}"),
                    ),
                ),
            ]);
        }
        node_cleanup(ctx, sessions, lun, node_map(sessions, lun))?;
        rounds(ctx, &list, |ctx, m| {
            node_scan_once(ctx, sessions, lun, m, resident.as_mut())
        })
        .map(|_| ())
    }
}

/// The scanned LUN's address on each session.
fn node_hctls(sessions: &[Session], lun: u32) -> Vec<String> {
    sessions
        .iter()
        .map(|s| format!("{}:0:0:{lun}", s.host))
        .collect()
}

fn node_scan_once(
    ctx: &mut Ctx,
    sessions: &[Session],
    lun: u32,
    m: NodeScan,
    resident: Option<&mut Resident>,
) -> Result<Run> {
    let first = Target {
        session: sessions[0].clone(),
        lun,
    };
    let hctl = first.hctl();
    let both = matches!(
        m,
        NodeScan::LunkitBoth | NodeScan::FloorBoth | NodeScan::ResidentBoth
    );
    let wanted: Vec<String> = if both {
        node_hctls(sessions, lun)
    } else {
        vec![hctl.clone()]
    };
    let mut run = Run::default();
    let seq0 = seqnum()?;
    warm_cpu();
    let t_start = Instant::now();
    let result = (|| -> Result<()> {
        match m {
            NodeScan::Lunkit
            | NodeScan::LunkitBoth
            | NodeScan::Resident
            | NodeScan::ResidentBoth => {
                let lun = lun.to_string();
                let mut args = vec!["scan", "iscsi", "--target", &first.session.target];
                if matches!(m, NodeScan::Lunkit | NodeScan::Resident) {
                    args.extend(["--portal", &first.session.portal]);
                }
                args.extend(["--lun", &lun, "--timeout", "60", "--json"]);
                let resident = match m {
                    NodeScan::Resident | NodeScan::ResidentBoth => {
                        Some(resident.ok_or(NO_RESIDENT)?)
                    }
                    _ => None,
                };
                let out = run_lunkit(ctx, resident, &args, "lunkit scan iscsi")?;
                run.wall_us = out.wall.as_micros() as u64;
                run.lib_us = proc::json_u64(&out.stdout, "elapsed_us");
                scan_split(&mut run, &out.stdout);
                run.rss_kib = out.rss_kib;
            }
            NodeScan::Floor => run.wall_us = floor_scan(ctx, &first, seq0, t_start)?,
            NodeScan::FloorBoth => {
                run.wall_us = floor_scan_all(ctx, sessions, lun, seq0, t_start)?;
            }
        }
        Ok(())
    })();
    add_times(ctx, &mut run, seq0, t_start, &wanted);
    let missing: Vec<String> = wanted
        .into_iter()
        .filter(|h| node_opens(h).is_none())
        .collect();
    // Count what the action caused, multipathd's map included, before cleaning up.
    let mapped = node_map(sessions, lun);
    ctx.listener.wait_quiet(QUIET, TIMEOUT);
    run.uevents = Some(seqnum()?.saturating_sub(seq0));
    let cleaned = node_cleanup(ctx, sessions, lun, mapped);
    result?;
    cleaned?;
    if !missing.is_empty() {
        return Err(format!("{missing:?} have no disk that opens after the run").into());
    }
    Ok(run)
}

/// The scanned LUN's addresses that exist now, and their disks (sorted).
fn node_present(sessions: &[Session], lun: u32) -> (Vec<String>, Vec<String>) {
    let hctls: Vec<String> = node_hctls(sessions, lun)
        .into_iter()
        .filter(|h| Path::new(&format!("/sys/class/scsi_device/{h}")).exists())
        .collect();
    let mut disks: Vec<String> = hctls
        .iter()
        .filter_map(|h| {
            sysfs::names(format!("/sys/class/scsi_device/{h}/device/block"))
                .into_iter()
                .next()
        })
        .collect();
    disks.sort();
    (hctls, disks)
}

/// multipathd's map over every disk of the scanned LUN (it maps each disk as it comes,
/// `find_multipaths no`), once it has them all; `None` when no disk is there.
fn node_map(sessions: &[Session], lun: u32) -> Result<Option<Map>> {
    let (_, disks) = node_present(sessions, lun);
    if disks.is_empty() {
        return Ok(None);
    }
    wait::until(
        &format!("multipathd's map over {}", disks.join(",")),
        TIMEOUT,
        || Ok(multipath::maps().into_iter().find(|m| m.paths == disks)),
    )
    .map(Some)
    .map_err(|e| format!("{e}; multipathd log:\n{}", multipath::log()).into())
}

/// Takes the scanned LUN off again, whatever a run left. `map` is multipathd's map over
/// its disks, awaited by [`node_map`]: multipathd maps every disk that comes
/// (find_multipaths no), and removing the paths while it builds the map races with it.
/// `lunkit detach` takes map and paths down; the devices' deletes and `multipath -f` are
/// the fallback. Settles, and checks nothing is left; a failed wait for the map is the
/// error then.
fn node_cleanup(
    ctx: &mut Ctx,
    sessions: &[Session],
    lun: u32,
    map: Result<Option<Map>>,
) -> Result<()> {
    let (hctls, disks) = node_present(sessions, lun);
    if hctls.is_empty() {
        return settle(ctx).and(map.map(|_| ()));
    }
    let lun = lun.to_string();
    let detached = proc::timed(
        Command::new(&ctx.lunkit).args([
            "detach",
            "--iscsi-target",
            &sessions[0].target,
            "--lun",
            &lun,
            "--timeout",
            "60",
        ]),
        false,
    )
    .and_then(|out| out.ok("lunkit detach (cleanup)").map(|_| ()));
    if let Err(e) = &detached {
        say(&format!(
            "cleanup: {e}; removing the map and paths directly"
        ));
        if let Ok(Some(m)) = &map {
            lunkit_lab::cmd::run_ignoring_failure("multipath", &["-f", &m.name]);
        }
        delete_devices(&hctls)?;
    }
    settle(ctx)?;
    let left: Vec<&String> = hctls
        .iter()
        .filter(|h| Path::new(&format!("/sys/class/scsi_device/{h}")).exists())
        .collect();
    // A map whose paths were all deleted has none left to match: its uuid says it.
    let uuid = map
        .as_ref()
        .ok()
        .and_then(|m| m.as_ref())
        .map(|m| m.uuid.clone());
    let maps_left: Vec<String> = multipath::maps()
        .into_iter()
        .filter(|m| m.paths.iter().any(|p| disks.contains(p)) || Some(&m.uuid) == uuid.as_ref())
        .map(|m| m.name)
        .collect();
    map?;
    if !left.is_empty() || !maps_left.is_empty() {
        return Err(format!("cleanup left devices {left:?} and maps {maps_left:?}").into());
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// The busy node (issue 38)
// ---------------------------------------------------------------------------------------

/// Other 2-path volumes on the busy node: LUNs 0 to 15, mapped by multipathd.
const BUSY_OTHERS: u32 = 16;
/// Processes the busy node runs beyond the guest's own (about 40 without them).
const BUSY_PROCESSES: usize = 100;
/// The LUN the busy node's scan rows bring in, and the one its teardown rows take off.
const BUSY_SCAN_LUN: u32 = BUSY_OTHERS;
const BUSY_TEARDOWN_LUN: u32 = BUSY_OTHERS + 1;

/// The node and teardown rows again on a node that carries what a real one does: the lab's
/// target exports [`BUSY_OTHERS`] more LUNs, each attached on both sessions and mapped by
/// multipathd (the lab's configuration, `find_multipaths no`), with udevd running and
/// [`BUSY_PROCESSES`] more (sleeping) processes. Same boot as the quiet rows, so that the
/// two settings compare as ratios. The doctor row (issue 36) runs first, on the node as it
/// stands.
fn busy_phase(ctx: &mut Ctx) -> Result<()> {
    let t0 = Instant::now();
    let lab = IscsiLab::build(LabConfig {
        target: LioConfig {
            luns: BUSY_OTHERS + 2,
            ..LioConfig::default()
        },
        scan: (0..BUSY_OTHERS).collect(),
        multipath: Some(multipath::DEFAULT_CONF),
    })?;
    if lab.sessions.len() < 2 {
        return Err(format!(
            "the busy node needs 2 sessions, the lab has {}",
            lab.sessions.len()
        )
        .into());
    }
    let result = (|| -> Result<()> {
        settle(ctx)?;
        // The volumes alone first, then with the processes: what each adds.
        say(&format!(
            "busy node without more processes after {:.1} s: {} multipath maps, {} SCSI \
             devices, {} processes",
            t0.elapsed().as_secs_f64(),
            multipath::maps().len(),
            sysfs::names("/sys/class/scsi_device").len(),
            count_processes()
        ));
        teardown_methods(ctx, "busy-maps", &lab.sessions, BUSY_TEARDOWN_LUN, false)?;
        let people = Crowd::start(BUSY_PROCESSES, false)?;
        settle(ctx)?;
        say(&format!(
            "busy node ready after {:.1} s: {} multipath maps, {} SCSI devices, {} processes",
            t0.elapsed().as_secs_f64(),
            multipath::maps().len(),
            sysfs::names("/sys/class/scsi_device").len(),
            count_processes()
        ));
        let measured = doctor_row(ctx)
            .and_then(|()| node_rows(ctx, "busy-node", &lab.sessions, BUSY_SCAN_LUN))
            .and_then(|()| {
                teardown_methods(ctx, "busy-teardown", &lab.sessions, BUSY_TEARDOWN_LUN, true)
            });
        let stopped = people.stop();
        measured.and(stopped)
    })();
    let down = lab.teardown();
    result.and(down)
}

// ---------------------------------------------------------------------------------------
// The doctor row (issue 36), on the busy node
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Doctor {
    /// `lunkit doctor --json`, with its in-use checks (the default).
    UseCheck,
    /// `lunkit doctor --json --no-use-check`.
    NoUseCheck,
    /// [`DOCTOR_TOOLS`], one after the other.
    Tools,
}

/// What an operator runs to see what `lunkit doctor` looks at: the SCSI devices, the
/// multipath maps with their paths' states, the iSCSI sessions.
const DOCTOR_TOOLS: [(&str, &[&str]); 3] = [
    ("lsscsi", &[]),
    ("multipath", &["-ll"]),
    ("iscsiadm", &["-m", "session"]),
];

const DOCTOR_NOTE: &str = "(release build), spawn to exit; library time is its `elapsed_us`. \
     Exit 0 (nothing found), 1 and 4 (findings left) all count as a run; its findings are \
     counted, and named at the end of this note when there were any.";

/// The doctor row's row name.
const DOCTOR_ROW: &str = "busy-doctor";

/// One measurement per tool of [`DOCTOR_TOOLS`]: its share of the tools' time.
fn doctor_parts() -> Vec<Measurement> {
    DOCTOR_TOOLS
        .iter()
        .map(|(prog, args)| {
            let cmd = [*prog]
                .iter()
                .chain(*args)
                .copied()
                .collect::<Vec<_>>()
                .join(" ");
            Measurement::new(
                DOCTOR_ROW,
                &format!("part-{prog}"),
                &format!("  of which {cmd}"),
                &format!("`{cmd}`"),
            )
        })
        .collect()
}

/// The doctor row's methods: lunkit doctor with and without its in-use checks (recorded as
/// not available when this lunkit has no `doctor`), then the tools.
fn doctor_methods(ctx: &mut Ctx) -> Result<Vec<(Doctor, Measurement)>> {
    let tools = Measurement::new(
        DOCTOR_ROW,
        "tools",
        "lsscsi + multipath -ll + iscsiadm -m session",
        "`lsscsi`, `multipath -ll` and `iscsiadm -m session` one after the other, output to \
         /dev/null: the sum of their spawn-to-exit times, so three process starts (under TCG \
         a spawn costs 50–300 ms) against lunkit's one.",
    );
    let mut list = vec![(Doctor::Tools, tools)];
    let lunkit = [
        (
            Doctor::UseCheck,
            "lunkit",
            "lunkit doctor",
            format!(
                "`lunkit doctor --json` {DOCTOR_NOTE} It reads the node once, then runs the \
                 in-use check (a walk of every process in /proc, an `O_EXCL` probe of each \
                 device) on each iSCSI session's devices, which is how it tells an idle session."
            ),
        ),
        (
            Doctor::NoUseCheck,
            "no-use-check",
            "lunkit doctor --no-use-check",
            format!(
                "`lunkit doctor --json --no-use-check` {DOCTOR_NOTE} It reads the node once \
                 and opens nothing; idle sessions are not looked for."
            ),
        ),
    ];
    let available = subcommand_available(&ctx.lunkit, "doctor");
    for (i, (method, id, label, note)) in lunkit.into_iter().enumerate() {
        let m = Measurement::new(DOCTOR_ROW, id, label, &note);
        match &available {
            Ok(()) => list.insert(i, (method, m)),
            Err(why) => unavailable(ctx, m, why.clone())?,
        }
    }
    Ok(list)
}

/// The doctor row on the busy node as it stands, nothing being attached or taken off:
/// `lunkit doctor --json`, with and without its in-use checks, against [`DOCTOR_TOOLS`],
/// interleaved. Nothing is wrong on this node: what doctor finds is printed, counted per
/// run and named in its measurement's note, never hidden.
fn doctor_row(ctx: &mut Ctx) -> Result<()> {
    let list = doctor_methods(ctx)?;
    let mut parts = doctor_parts();
    let mut found = BTreeSet::new();
    let mut tools_round = 0usize;
    let result = rounds(ctx, &list, |ctx, m| {
        settle(ctx)?;
        warm_cpu();
        if m != Doctor::Tools {
            return doctor_once(ctx, m == Doctor::NoUseCheck, &mut found);
        }
        let wall_us = tools_in_turn(&DOCTOR_TOOLS, &mut parts, tools_round > 0)?;
        tools_round += 1;
        Ok(Run {
            wall_us,
            ..Run::default()
        })
    });
    for p in &parts {
        ctx.rec.record(p)?;
    }
    name_findings(ctx, result?, &found)
}

/// One `lunkit doctor --json` (`quick`: with `--no-use-check`): its wall and library time and
/// how many findings it reported; a finding not seen before is said and added to `found`,
/// with whether `quick` found it.
fn doctor_once(ctx: &Ctx, quick: bool, found: &mut BTreeSet<(bool, String)>) -> Result<Run> {
    let mut cmd = Command::new(&ctx.lunkit);
    cmd.args(["doctor", "--json"]);
    if quick {
        cmd.arg("--no-use-check");
    }
    let out = proc::timed(&mut cmd, true)?;
    let out = match out.status.code() {
        Some(1 | 4) => out,
        _ => out.ok("lunkit doctor --json")?,
    };
    let kinds = proc::json_strs(&out.stdout, "kind");
    for (kind, why) in kinds.iter().zip(proc::json_strs(&out.stdout, "why")) {
        let finding = format!("{kind}: {why}");
        if found.insert((quick, finding.clone())) {
            say(&format!(
                "  lunkit doctor FOUND on the healthy busy node: {finding}"
            ));
        }
    }
    Ok(Run {
        wall_us: out.wall.as_micros() as u64,
        lib_us: proc::json_u64(&out.stdout, "elapsed_us"),
        rss_kib: Some(out.rss_kib),
        findings: Some(kinds.len() as u64),
        ..Run::default()
    })
}

/// Records again each lunkit doctor measurement that found something, its note naming what.
fn name_findings(
    ctx: &mut Ctx,
    ms: Vec<Measurement>,
    found: &BTreeSet<(bool, String)>,
) -> Result<()> {
    for mut m in ms {
        let quick = m.method() == "no-use-check";
        let mine: Vec<&str> = found
            .iter()
            .filter(|(q, _)| *q == quick)
            .map(|(_, f)| f.as_str())
            .collect();
        if m.method() == "tools" || mine.is_empty() {
            continue;
        }
        m.note += &format!(
            " Found on the busy node, where nothing is wrong: {}.",
            mine.join("; ")
        );
        ctx.rec.record(&m)?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Teardown row
// ---------------------------------------------------------------------------------------

/// A two-path multipath volume as multipathd built it.
#[derive(Debug, Clone)]
struct Volume {
    map: Map,
    /// Multipath form (`36001405…`), what `lunkit detach --wwid` takes.
    wwid: String,
    hctls: Vec<String>,
}

/// Scans the LUN on every session and waits for multipathd's map over all of them.
fn attach_volume(sessions: &[Session], lun: u32) -> Result<Volume> {
    let mut disks = Vec::new();
    for s in sessions {
        disks.push(iscsi::scan_lun(s, lun)?);
    }
    disks.sort();
    let map = wait::until(
        &format!("a multipath map over {}", disks.join(",")),
        TIMEOUT,
        || Ok(multipath::maps().into_iter().find(|m| m.paths == disks)),
    )
    .map_err(|e| format!("{e}; multipathd log:\n{}", multipath::log()))?;
    let wwid = map
        .uuid
        .strip_prefix("mpath-")
        .ok_or_else(|| format!("map {} has uuid {}", map.name, map.uuid))?
        .to_owned();
    Ok(Volume {
        wwid,
        hctls: sessions
            .iter()
            .map(|s| format!("{}:0:0:{lun}", s.host))
            .collect(),
        map,
    })
}

fn volume_gone(v: &Volume) -> bool {
    !multipath::maps().iter().any(|m| m.uuid == v.map.uuid)
        && v.hctls
            .iter()
            .all(|h| !Path::new(&format!("/sys/class/scsi_device/{h}")).exists())
}

/// Whatever a failed teardown left: the map (through multipath -f) and the paths.
fn force_remove(v: &Volume) {
    lunkit_lab::cmd::run_ignoring_failure("multipath", &["-f", &v.map.name]);
    let _ = delete_devices(&v.hctls);
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Teardown {
    Lunkit,
    /// `lunkit detach` in the row's `lunkit batch` process.
    Resident,
    Floor,
    /// The floor after a plain reading of who uses the volume ([`users`]).
    PlainChecked,
    Shell,
}

fn teardown_once(
    ctx: &mut Ctx,
    sessions: &[Session],
    lun: u32,
    m: Teardown,
    resident: Option<&mut Resident>,
    self_check: bool,
) -> Result<Run> {
    let v = attach_volume(sessions, lun)?;
    // The map first, then its paths, as the plain reading takes them.
    let devices: Vec<String> = std::iter::once(&v.map.dm)
        .chain(&v.map.paths)
        .cloned()
        .collect();
    if self_check {
        users::self_check(&devices)?;
        say("  the plain reading found this process's descriptor and mapping of the map");
    }
    settle(ctx)?;
    let seq0 = seqnum()?;
    let mut run = Run::default();
    warm_cpu();
    let result = (|| -> Result<()> {
        match m {
            Teardown::Lunkit | Teardown::Resident => {
                let args = ["detach", "--wwid", &v.wwid, "--timeout", "60", "--json"];
                let resident = match m {
                    Teardown::Resident => Some(resident.ok_or(NO_RESIDENT)?),
                    _ => None,
                };
                let out = run_lunkit(ctx, resident, &args, "lunkit detach")?;
                run.wall_us = out.wall.as_micros() as u64;
                run.lib_us = proc::json_u64(&out.stdout, "elapsed_us");
                run.check_us = proc::json_step_us(&out.stdout, "check-in-use");
                run.steps = proc::json_steps(&out.stdout).unwrap_or_default();
                run.rss_kib = out.rss_kib;
                say(&step_split(&run));
            }
            Teardown::Floor => {
                // The kernel work every teardown has to wait for, issued straight from this
                // process: no spawn, no lookups, no checks, the paths deleted side by side.
                let t0 = Instant::now();
                sys::flush_buffers(&format!("/dev/{}", v.map.dm))?;
                sys::dm_remove(&v.map.name)?;
                flush_and_delete_side_by_side(&v.map.paths)?;
                run.wall_us = t0.elapsed().as_micros() as u64;
            }
            Teardown::PlainChecked => {
                let t0 = Instant::now();
                let found = users::users(&devices)?;
                run.check_us = Some(t0.elapsed().as_micros() as u64);
                if !found.users.is_empty() {
                    return Err(format!(
                        "the plain reading found {} in use: {}",
                        v.map.name,
                        found.users.join("; ")
                    )
                    .into());
                }
                sys::flush_buffers(&format!("/dev/{}", v.map.dm))?;
                sys::dm_remove(&v.map.name)?;
                flush_and_delete_side_by_side(&v.map.paths)?;
                run.wall_us = t0.elapsed().as_micros() as u64;
                let us = |d: Duration| d.as_micros() as u64;
                say(&format!(
                    "  plain reading: {} of {} in the reading; {} processes, {} distinct mapped \
                     files; thread time {} following descriptors, {} reading maps, {} looking \
                     at the files",
                    ms(run.check_us.unwrap_or(0)),
                    ms(run.wall_us),
                    found.processes,
                    found.files,
                    ms(us(found.descriptors)),
                    ms(us(found.maps)),
                    ms(us(found.looks)),
                ));
            }
            Teardown::Shell => {
                let t0 = Instant::now();
                let dm = format!("/dev/{}", v.map.dm);
                let flush = |dev: &str| -> Result<()> {
                    proc::timed(Command::new("blockdev").args(["--flushbufs", dev]), false)?
                        .ok("blockdev --flushbufs")?;
                    Ok(())
                };
                flush(&dm)?;
                for p in &v.map.paths {
                    flush(&format!("/dev/{p}"))?;
                }
                proc::timed(Command::new("multipath").args(["-f", &v.map.name]), false)?
                    .ok("multipath -f")?;
                for p in &v.map.paths {
                    fs::write(format!("/sys/block/{p}/device/delete"), "1")?;
                }
                let mut nodes = vec![dm.clone()];
                nodes.extend(v.map.paths.iter().map(|p| format!("/dev/{p}")));
                poll_every(Duration::from_millis(500), "the nodes to go", || {
                    nodes.iter().all(|n| !Path::new(n).exists())
                })?;
                run.wall_us = t0.elapsed().as_micros() as u64;
            }
        }
        Ok(())
    })();
    ctx.listener.wait_quiet(QUIET, TIMEOUT);
    run.uevents = Some(seqnum()?.saturating_sub(seq0));
    let gone = volume_gone(&v);
    if !gone {
        force_remove(&v);
    }
    settle(ctx)?;
    result?;
    if !gone {
        return Err(format!(
            "{} ({}) or its paths {:?} are still there after the teardown",
            v.map.name, v.wwid, v.hctls
        )
        .into());
    }
    Ok(run)
}

/// One lunkit detach's steps for the log, from its `--json`: each with its start and length
/// (steps side by side overlap), and the library time no step covers.
fn step_split(run: &Run) -> String {
    let mut s = String::from("  steps:");
    for (label, span) in run.step_labels() {
        s += &format!(" {label} @{} {};", ms(span.start_us), ms(span.dur_us));
    }
    if let Some(out) = run.outside_steps_us() {
        s += &format!(" outside every step {}", ms(out));
    }
    s
}

/// The teardown row: lunkit, the shell sequence and the kernel floor, interleaved. With a
/// `crowd` (the `crowd` row) the shell sequence is left out, since it checks nothing, and
/// the row shows what 20,000 more open descriptors cost lunkit's in-use check.
fn teardown_row(ctx: &mut Ctx, sessions: &[Session], crowd: Option<&Crowd>) -> Result<()> {
    let row = if crowd.is_some() { "crowd" } else { "teardown" };
    let mpd = Multipathd::start(multipath::DEFAULT_CONF)?;
    // LUN 0 is on both sessions: multipathd maps it first; let that finish.
    multipath::wait_maps(1, sessions.len())?;
    settle(ctx)?;
    let result = teardown_methods(ctx, row, sessions, TEARDOWN_LUN, crowd.is_none());
    mpd.stop()?;
    result
}

/// The teardown row's methods on LUN `lun` as row `row`, multipathd running already;
/// `shell` adds the shell sequence.
fn teardown_methods(
    ctx: &mut Ctx,
    row: &str,
    sessions: &[Session],
    lun: u32,
    shell_too: bool,
) -> Result<()> {
    teardown_methods_of(ctx, row, sessions, lun, shell_too, true)
}

/// [`teardown_methods`], the spawned `lunkit detach` only when `spawned_too` (the resident
/// one always, when this lunkit has `batch`).
fn teardown_methods_of(
    ctx: &mut Ctx,
    row: &str,
    sessions: &[Session],
    lun: u32,
    shell_too: bool,
    spawned_too: bool,
) -> Result<()> {
    let lunkit = Measurement::new(
        row,
        "lunkit",
        "lunkit detach",
        "`lunkit detach --wwid WWID --timeout 60 --json` (release build), spawn to exit; it \
         exits 0 once the map and all its paths are gone.",
    );
    let shell = Measurement::new(
        row,
        "shell",
        "shell sequence (os-brick, Kubernetes)",
        "`blockdev --flushbufs` on the map and each path, `multipath -f MAP`, `1` written to \
         each path's device/delete from the benchmark process, then /dev/dm-N and the /dev/sdX \
         nodes checked at once and every 0.5 s (os-brick's wait_for_volumes_removal) until \
         gone.",
    );
    let floor = Measurement::new(
        row,
        "floor",
        "kernel floor",
        "from the benchmark process: `BLKFLSBUF` on the map, `DM_DEV_REMOVE` of it, then for \
         each path at once `BLKFLSBUF` and `1` written to its device/delete, which returns when \
         the kernel has removed the disk and its node. No spawn, no lookup, no check.",
    );
    let checked = Measurement::new(
        row,
        "plain-checked",
        "kernel floor after a plain in-use reading",
        "the kernel floor, after what a detach that refuses a volume in use has to read, read \
         the plain way from the benchmark process with std alone: every process's \
         descriptors (each followed to its file), its `maps` (each distinct mapped file \
         looked at through `map_files/`) and each mount namespace's mount table once, the \
         processes shared out over as many threads as the guest has CPUs. The kernel counts \
         the openers of a map, but of no SCSI disk: this reading is how a path's are known. \
         Not a floor of the reading itself, which lunkit's walk does faster; \"its in-use \
         check\" is the reading.",
    );
    let mut list = vec![(Teardown::Floor, floor), (Teardown::PlainChecked, checked)];
    if shell_too {
        list.push((Teardown::Shell, shell));
    }
    match subcommand_available(&ctx.lunkit, "detach") {
        Ok(()) if spawned_too => list.insert(0, (Teardown::Lunkit, lunkit)),
        Ok(()) => {}
        Err(why) => unavailable(ctx, lunkit, why)?,
    }
    let mut resident = start_resident(ctx)?;
    if resident.is_some() {
        list.insert(
            usize::from(spawned_too),
            (
                Teardown::Resident,
                Measurement::new(
                    row,
                    "resident",
                    "lunkit detach, resident",
                    &format!("The same detach as a line to {RESIDENT_NOTE}"),
                ),
            ),
        );
    }
    // The plain reading is checked to see a user in the row's first run (the warm-up).
    let mut unchecked = true;
    rounds(ctx, &list, |ctx, m| {
        let check = matches!(m, Teardown::PlainChecked) && std::mem::take(&mut unchecked);
        teardown_once(ctx, sessions, lun, m, resident.as_mut(), check)
    })
    .map(|_| ())
}

/// How long the bench waits for a resident command: its own `--timeout 60`, and then some,
/// so that lunkit's deadline, not the bench's, ends a stuck one.
const RESIDENT_TIMEOUT: Duration = Duration::from_secs(90);

/// How the resident rows are measured, after "The same detach as a line to".
const RESIDENT_NOTE: &str = "one `lunkit batch` process (release build) that runs the whole \
     row's commands, as a CSI node plugin linking the library would: its code is warm from the \
     runs before. Library time is the command's `elapsed_us`, as for the spawned command.";

/// What one lunkit command did, spawned or resident.
struct LunkitRun {
    wall: Duration,
    stdout: String,
    /// Its own peak RSS; only a spawned command has one.
    rss_kib: Option<u64>,
}

/// What a resident method says when its row could not start `lunkit batch`.
const NO_RESIDENT: &str = "no resident lunkit for this row";

/// Runs `lunkit ARGS`: spawned, or as a line to the row's `lunkit batch` process
/// (`resident`). It must exit 0.
fn run_lunkit(
    ctx: &Ctx,
    resident: Option<&mut Resident>,
    args: &[&str],
    what: &str,
) -> Result<LunkitRun> {
    match resident {
        None => {
            let out = proc::timed(Command::new(&ctx.lunkit).args(args), true)?.ok(what)?;
            Ok(LunkitRun {
                wall: out.wall,
                stdout: out.stdout,
                rss_kib: Some(out.rss_kib),
            })
        }
        Some(r) => {
            // The arguments are names and numbers, without spaces: a line splits back
            // into the same words.
            let out = r.run(&args.join(" "), RESIDENT_TIMEOUT)?.ok(what)?;
            Ok(LunkitRun {
                wall: out.wall,
                stdout: out.stdout,
                rss_kib: None,
            })
        }
    }
}

/// The row's `lunkit batch` process, `None` when this lunkit has no `batch` (recorded as
/// nothing: the spawned command's rows stand alone then).
fn start_resident(ctx: &Ctx) -> Result<Option<Resident>> {
    match subcommand_available(&ctx.lunkit, "batch") {
        Ok(()) => Ok(Some(Resident::start(&ctx.lunkit)?)),
        Err(why) => {
            say(&format!("no resident rows: {why}"));
            Ok(None)
        }
    }
}

/// What the crowd row adds to the node: 200 processes holding 100 descriptors each (40 opens
/// of files on tmpfs, 20 pipes, 10 socket pairs), as on a busy node, so that the in-use
/// check's walk over `/proc/*/fd` has 20,000 more descriptors to look at. The busy node
/// ([`busy_phase`]) has [`BUSY_PROCESSES`] sleeping ones instead, holding one file each.
/// One `python3` forks them (200 spawns would take minutes under TCG); each dies with it
/// (`PR_SET_PDEATHSIG`). It is Debian's ([`CROWD_PYTHON`]), whichever `python3` the host puts
/// first on PATH.
struct Crowd {
    parent: std::process::Child,
    dir: PathBuf,
}

const CROWD_PROCESSES: usize = 200;

/// The crowd's interpreter: Debian's, the lab's package, not a build on the host's PATH
/// (pyenv's, say). Its executable is not position-independent, as a Kubernetes node's Go
/// programs (kubelet, containerd and its shims) are not, so every crowd process maps it
/// below `0x10000000`, where the in-use walk once missed mappings (5f25b21); a pyenv build
/// is a PIE, mapped high. One crowd on every host keeps the busy rows comparable.
const CROWD_PYTHON: &str = "/usr/bin/python3";

const CROWD_PY: &str = r#"
import ctypes, os, signal, socket, sys
d, n, hold = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "hold"
files = []
for i in range(20):
    p = os.path.join(d, str(i))
    open(p, "w").close()
    files.append(p)
r, w = os.pipe()
me = os.getpid()
for k in range(n):
    if os.fork() == 0:
        # PR_SET_PDEATHSIG, SIGKILL; a parent gone before it took effect ends us too.
        if ctypes.CDLL(None).prctl(1, 9) != 0 or os.getppid() != me:
            os._exit(1)
        os.close(r)
        keep = [os.open(files[i % 20], os.O_RDONLY) for i in range(40 if hold else 1)]
        for _ in range(20 if hold else 0):
            keep.extend(os.pipe())
        socks = [socket.socketpair() for _ in range(10 if hold else 0)]
        os.write(w, b"x")
        os.close(w)
        while True:
            signal.pause()
os.close(w)
got = 0
while got < n:
    b = os.read(r, n - got)
    if not b:
        sys.exit("a crowd process died before it was ready")
    got += len(b)
print("ready", flush=True)
while True:
    signal.pause()
"#;

/// Waits for a child's first line on `stdout` to be `ready`, at most `timeout`. The read
/// gets its own thread, so that a child that never says it costs `timeout`, not the bench.
fn said_ready(stdout: std::process::ChildStdout, timeout: Duration, who: &str) -> Result<()> {
    use std::io::BufRead;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = tx.send(
            std::io::BufReader::new(stdout)
                .read_line(&mut line)
                .map(|_| line),
        );
    });
    let line = rx
        .recv_timeout(timeout)
        .map_err(|_| format!("{who} did not say ready within {timeout:?}"))??;
    if line.trim() != "ready" {
        return Err(format!("{who} did not start: {line:?}").into());
    }
    Ok(())
}

impl Crowd {
    /// `processes` more processes, each holding 100 descriptors (`hold`) or one.
    fn start(processes: usize, hold: bool) -> Result<Crowd> {
        let dir = PathBuf::from("/tmp/lunkit-bench-crowd");
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir)?;
        let mut parent = Command::new(CROWD_PYTHON)
            .args(["-c", CROWD_PY])
            .arg(&dir)
            .arg(processes.to_string())
            .arg(if hold { "hold" } else { "sleep" })
            .stdout(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| format!("{CROWD_PYTHON} for the crowd: {e}"))?;
        let stdout = parent.stdout.take();
        // Owned from here: any return below kills it and its children.
        let crowd = Crowd { parent, dir };
        said_ready(stdout.ok_or("the crowd's stdout")?, TIMEOUT, "the crowd")?;
        let fds = count_fds();
        say(&format!(
            "crowd: {processes} processes ready; {} processes and {fds} open descriptors on \
             the node",
            count_processes()
        ));
        Ok(crowd)
    }

    /// Ends the crowd, and says whether any of it outlived its parent.
    fn stop(mut self) -> Result<()> {
        let _ = self.parent.kill();
        let _ = self.parent.wait();
        let _ = fs::remove_dir_all(&self.dir);
        poll_every(Duration::from_millis(100), "the crowd to exit", || {
            !crowd_alive(&self.dir)
        })
    }
}

impl Drop for Crowd {
    fn drop(&mut self) {
        let _ = self.parent.kill();
        let _ = self.parent.wait();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Whether a process still has a file of the crowd's directory open.
fn crowd_alive(dir: &Path) -> bool {
    let Ok(procs) = fs::read_dir("/proc") else {
        return false;
    };
    procs.flatten().any(|p| {
        fs::read_dir(p.path().join("fd")).is_ok_and(|fds| {
            fds.flatten()
                .any(|f| fs::read_link(f.path()).is_ok_and(|t| t.starts_with(dir)))
        })
    })
}

/// Processes on the node (numeric `/proc` entries).
fn count_processes() -> usize {
    sysfs::names("/proc")
        .iter()
        .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        .count()
}

/// Open descriptors of every process on the node (`/proc/*/fd` entries).
fn count_fds() -> usize {
    fs::read_dir("/proc").map_or(0, |procs| {
        procs
            .flatten()
            .filter_map(|p| fs::read_dir(p.path().join("fd")).ok())
            .map(|fds| fds.count())
            .sum()
    })
}

// ---------------------------------------------------------------------------------------
// Resize row
// ---------------------------------------------------------------------------------------

/// The growable target's own IQN, apart from the lab's (whose phases took it down before).
const GROW_IQN: &str = "iqn.2003-01.org.linux-iscsi.lunkit:bench-grow";
/// One session per portal: the volume's two paths.
const GROW_PORTALS: [&str; 2] = ["127.0.0.1:3260", "127.0.0.2:3260"];
const MIB: u64 = 1 << 20;
/// The LUN's size when the phase starts.
const GROW_FROM: u64 = 64 * MIB;
/// What every run (warm-ups included) adds to the LUN. Sizes only go up: a map is never
/// shrunk, so every run grows the volume from where the run before left it.
const GROW_STEP: u64 = 16 * MIB;

/// How the `resize` row grows the volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Grow {
    /// `lunkit resize /dev/mapper/NAME --expect-size BYTES --json`.
    Lunkit,
    /// The kernel's work from this process: both rescans at once, multipathd's `resize map`.
    Floor,
    /// os-brick's sequence in a shell, then a 1 s poll.
    Shell,
}

/// The growable LUN ([`GrowTarget`]) behind [`GROW_PORTALS`], one manual-scan session per
/// portal, and multipathd (find_multipaths no) with its map over LUN 0 on both: the
/// vm_resize tests' lab. [`GrowLab::teardown`] (or drop) takes it down in the lab's order:
/// multipathd and its maps, the sessions, iscsid if it started it, the target.
struct GrowLab {
    target: Option<GrowTarget>,
    multipathd: Option<Multipathd>,
    started_iscsid: bool,
}

impl GrowLab {
    /// The lab and its volume, once multipathd has mapped both paths.
    fn build() -> Result<(GrowLab, Volume)> {
        let target = GrowTarget::create(GROW_IQN, &GROW_PORTALS, GROW_FROM)?;
        let mut lab = GrowLab {
            target: Some(target),
            multipathd: None,
            started_iscsid: false,
        };
        lab.started_iscsid = iscsi::ensure_iscsid()?;
        let mut sessions = Vec::new();
        for portal in GROW_PORTALS {
            iscsi::discover(portal)?;
            sessions.push(iscsi::login(GROW_IQN, portal)?);
        }
        lab.multipathd = Some(Multipathd::start(multipath::DEFAULT_CONF)?);
        let volume = attach_volume(&sessions, 0)?;
        Ok((lab, volume))
    }

    fn target(&self) -> &GrowTarget {
        self.target
            .as_ref()
            .expect("the target lives until teardown")
    }

    /// Tears down and reports the first failure (drop does the same silently).
    fn teardown(mut self) -> Result<()> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Result<()> {
        let mut first_err = None;
        if let Some(mpd) = self.multipathd.take() {
            // Flushes the map too (`multipath -F` until none is left).
            first_err = mpd.stop().err();
        }
        // As the lab's teardown: the guest has no iSCSI sessions but this phase's.
        iscsi::logout_all();
        if std::mem::take(&mut self.started_iscsid) {
            if let Err(e) = iscsi::stop_iscsid() {
                first_err.get_or_insert(e);
            }
        }
        if let Some(t) = self.target.take() {
            if let Err(e) = t.teardown() {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

impl Drop for GrowLab {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

/// Online resize (issue 16) on a node as it runs in production (udevd, multipathd): the
/// 2-path map over the growable LUN, grown by [`GROW_STEP`] before every run of lunkit, the
/// kernel floor and the shell sequence, interleaved.
fn resize_phase(ctx: &mut Ctx) -> Result<()> {
    let t0 = Instant::now();
    let (lab, v) = GrowLab::build()?;
    say(&format!(
        "growable LUN mapped as {} ({}) over {:?} after {:.1} s",
        v.map.name,
        v.map.dm,
        v.map.paths,
        t0.elapsed().as_secs_f64()
    ));
    let result = resize_row(ctx, &lab, &v);
    let down = lab.teardown();
    result?;
    down
}

fn resize_row(ctx: &mut Ctx, lab: &GrowLab, v: &Volume) -> Result<()> {
    settle(ctx)?;
    let step = GROW_STEP / MIB;
    let lunkit = Measurement::new(
        "resize",
        "lunkit",
        "lunkit resize",
        &format!(
            "`lunkit resize /dev/mapper/NAME --expect-size BYTES --timeout 60 --json` (release \
             build), spawn to exit, with udevd and multipathd running, after the LUN grew by \
             {step} MiB on the target; it returns once both paths and the map (through \
             multipathd, checked in its JSON) have the new size. The library time is \
             `elapsed_us`."
        ),
    );
    let floor = Measurement::new(
        "resize",
        "floor",
        "kernel floor",
        "from the benchmark process: `1` written to both paths' \
         /sys/class/scsi_device/H:C:T:L/device/rescan at once (one thread each; the write \
         returns once sd has re-read the capacity), then `resize map NAME` on multipathd's \
         socket (multipathd owns the map while it runs), until /sys/block/dm-N/size shows the \
         new size. No spawn, no lookup, no check.",
    );
    let shell = Measurement::new(
        "resize",
        "shell",
        "shell sequence (os-brick)",
        "`sh -c 'echo 1 > .../H:C:T:L/device/rescan && echo 1 > ... && multipathd resize map \
         NAME'` (the paths one after the other, as os-brick's extend_volume), then \
         /sys/block/dm-N/size checked at once and every 1 s until it shows the new size; \
         spawn of the shell to the check that sees it.",
    );
    let mut list = vec![(Grow::Floor, floor), (Grow::Shell, shell)];
    match subcommand_available(&ctx.lunkit, "resize") {
        Ok(()) => list.insert(0, (Grow::Lunkit, lunkit)),
        Err(why) => unavailable(ctx, lunkit, why)?,
    }
    let mut size = GROW_FROM;
    rounds(ctx, &list, |ctx, m| {
        resize_once(ctx, lab.target(), v, m, &mut size)
    })
    .map(|_| ())
}

/// A block device's size in bytes, from sysfs.
fn block_bytes(name: &str) -> Option<u64> {
    sysfs::attr(format!("/sys/block/{name}/size"))?
        .parse::<u64>()
        .ok()
        .map(|s| s * 512)
}

/// What of the volume (map and paths) does not have `want` bytes, for messages; `None` when
/// all do.
fn off_size(v: &Volume, want: u64) -> Option<String> {
    let devices = std::iter::once(&v.map.dm).chain(&v.map.paths);
    let off: Vec<String> = devices
        .filter_map(|d| match block_bytes(d) {
            Some(s) if s == want => None,
            Some(s) => Some(format!("{d} has {} MiB", s / MIB)),
            None => Some(format!("{d} has no size")),
        })
        .collect();
    (!off.is_empty()).then(|| format!("{} (want {} MiB)", off.join(", "), want / MIB))
}

/// One run: the target grows by [`GROW_STEP`] (udev's work on that done before the clock
/// starts), then method `m` brings the volume to the new size. A run that leaves the volume
/// short is an error, and the floor's steps catch it up so the next run starts level.
fn resize_once(
    ctx: &mut Ctx,
    target: &GrowTarget,
    v: &Volume,
    m: Grow,
    size: &mut u64,
) -> Result<Run> {
    let from = *size;
    if let Some(off) = off_size(v, from) {
        return Err(format!("before the run: {off}").into());
    }
    let to = from + GROW_STEP;
    target.grow(to)?;
    *size = to;
    // `losetup -c` sends a change uevent for the loop device; udev handles it now.
    settle(ctx)?;
    // Nothing on the initiator may know yet, or the run would measure nothing.
    if let Some(off) = off_size(v, from) {
        return Err(format!("after growing the target, before the run: {off}").into());
    }
    let dev = format!("/dev/mapper/{}", v.map.name);
    let want = to.to_string();
    let mut script: Vec<String> = v
        .hctls
        .iter()
        .map(|h| format!("echo 1 > /sys/class/scsi_device/{h}/device/rescan"))
        .collect();
    script.push(format!("multipathd resize map {}", v.map.name));
    let script = script.join(" && ");
    let seq0 = seqnum()?;
    let mut run = Run::default();
    warm_cpu();
    let t_start = Instant::now();
    let result = (|| -> Result<()> {
        match m {
            Grow::Lunkit => {
                let out = proc::timed(
                    Command::new(&ctx.lunkit).args([
                        "resize",
                        &dev,
                        "--expect-size",
                        &want,
                        "--timeout",
                        "60",
                        "--json",
                    ]),
                    true,
                )?
                .ok("lunkit resize")?;
                run.wall_us = out.wall.as_micros() as u64;
                run.lib_us = proc::json_u64(&out.stdout, "elapsed_us");
                run.rss_kib = Some(out.rss_kib);
                // The floor and the shell go through multipathd: so must lunkit, to compare.
                if !out.stdout.contains("\"by\":\"multipathd\"") {
                    return Err(format!(
                        "lunkit resize did not grow the map through multipathd: {}",
                        out.stdout.trim()
                    )
                    .into());
                }
            }
            Grow::Floor => run.wall_us = floor_resize(v, to, t_start)?,
            Grow::Shell => {
                let out = proc::timed(Command::new("sh").args(["-c", &script]), true)?
                    .ok("the shell sequence")?;
                if out.stdout.trim() != "ok" {
                    return Err(format!(
                        "`multipathd resize map {}` answered {:?}",
                        v.map.name,
                        out.stdout.trim()
                    )
                    .into());
                }
                let shell_done = t_start.elapsed();
                poll_every(Duration::from_secs(1), "the map's new size", || {
                    block_bytes(&v.map.dm) == Some(to)
                })?;
                let wall = t_start.elapsed();
                run.wall_us = wall.as_micros() as u64;
                // multipathd resumes the grown map before it answers: a poll that had to
                // wait says otherwise, and is worth a line in the log.
                if wall - shell_done >= Duration::from_millis(500) {
                    say(&format!(
                        "resize.shell: the map had not grown when the shell exited after {}",
                        ms(shell_done.as_micros() as u64)
                    ));
                }
            }
        }
        Ok(())
    })();
    // Count what the run caused (udev's and multipathd's reactions too) before anything else.
    ctx.listener.wait_quiet(QUIET, TIMEOUT);
    run.uevents = Some(seqnum()?.saturating_sub(seq0));
    let short = off_size(v, to);
    if short.is_some() {
        let _ = floor_resize(v, to, Instant::now());
    }
    settle(ctx)?;
    result?;
    if let Some(off) = short {
        return Err(format!("after the run: {off}").into());
    }
    Ok(run)
}

/// The kernel floor of a resize, from `t_start`: `1` to both paths' `rescan` at once, then
/// `resize map NAME` on multipathd's socket, until the map's size in sysfs is `to`;
/// microseconds.
fn floor_resize(v: &Volume, to: u64, t_start: Instant) -> Result<u64> {
    std::thread::scope(|s| -> Result<()> {
        let writes: Vec<_> = v
            .hctls
            .iter()
            .map(|h| {
                s.spawn(move || {
                    let p = format!("/sys/class/scsi_device/{h}/device/rescan");
                    fs::write(&p, "1").map_err(|e| format!("write 1 to {p}: {e}"))
                })
            })
            .collect();
        for w in writes {
            w.join().map_err(|_| "a rescan panicked")??;
        }
        Ok(())
    })?;
    let command = format!("resize map {}", v.map.name);
    let reply = multipathd::command(multipathd::SOCKET, &command, t_start + TIMEOUT)?;
    if reply.trim_end() != "ok" {
        return Err(format!("multipathd answered {reply:?} to `{command}`").into());
    }
    // multipathd resumes the grown table before it answers: this holds at the first look.
    poll_every(Duration::from_millis(1), "the map's new size", || {
        block_bytes(&v.map.dm) == Some(to)
    })?;
    Ok(t_start.elapsed().as_micros() as u64)
}

// ---------------------------------------------------------------------------------------
// Listing row
// ---------------------------------------------------------------------------------------

const LSBLK_COLUMNS: &str = "NAME,MAJ:MIN,SIZE,RO,TYPE,HCTL,STATE,VENDOR,MODEL,REV,WWN";
/// The peers' listing: the tools an operator runs for what `lunkit list` shows.
const LISTING_TOOLS: [(&str, &[&str]); 3] = [
    ("lsblk", &["--json", "-o", LSBLK_COLUMNS]),
    ("lsscsi", &["--generic"]),
    ("multipath", &["-ll"]),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Listing {
    Lunkit,
    Tools,
}

fn listing_phase(ctx: &mut Ctx) -> Result<()> {
    // udevd would need many minutes under TCG to process 512 disks (each runs scsi_id,
    // blkid and `multipath -u`), and would compete for the CPU during the runs: stop it. All
    // the listing tools read sysfs without it.
    if udev::running() {
        udev::stop()?;
    }
    let t0 = Instant::now();
    let per_host = LISTING_LUNS.to_string();
    let hosts = LISTING_HOSTS.to_string();
    let want = (LISTING_HOSTS * LISTING_LUNS) as usize;
    let sd = ScsiDebug::load(
        &[
            ("add_host", hosts.as_str()),
            ("num_tgts", "1"),
            ("max_luns", per_host.as_str()),
        ],
        want,
    )?;
    let devices = sd.devices().len();
    say(&format!(
        "scsi_debug: {devices} SCSI devices, {} disks after {:.1} s",
        sd.disks().len(),
        t0.elapsed().as_secs_f64()
    ));
    if devices != want {
        return Err(format!("expected {want} scsi_debug devices, got {devices}").into());
    }
    ctx.listener.wait_quiet(QUIET, TIMEOUT);
    let mut parts = [
        Measurement::new(
            "listing",
            "part-lsblk",
            "  of which lsblk",
            &format!("`lsblk --json -o {LSBLK_COLUMNS}`"),
        ),
        Measurement::new(
            "listing",
            "part-lsscsi",
            "  of which lsscsi",
            "`lsscsi --generic`",
        ),
        Measurement::new(
            "listing",
            "part-multipath",
            "  of which multipath -ll",
            "`multipath -ll`",
        ),
    ];
    let list = [
        (
            Listing::Lunkit,
            Measurement::new(
                "listing",
                "lunkit",
                "lunkit list --json",
                "`lunkit list --json` (release build), output to /dev/null, spawn to exit.",
            ),
        ),
        (
            Listing::Tools,
            Measurement::new(
                "listing",
                "tools",
                "lsblk + lsscsi + multipath -ll",
                &format!(
                    "`lsblk --json -o {LSBLK_COLUMNS}`, `lsscsi --generic` and `multipath -ll` \
                     one after the other, output to /dev/null; the sum of their spawn-to-exit \
                     times. udevd is stopped for this row (under TCG it needs many minutes for \
                     512 disks and would compete for the CPU); all these tools read sysfs."
                ),
            ),
        ),
    ];
    let mut round_of_tools = 0usize;
    let result = rounds(ctx, &list, |ctx, m| {
        let mut run = Run::default();
        warm_cpu();
        match m {
            Listing::Lunkit => {
                let out = proc::timed(Command::new(&ctx.lunkit).args(["list", "--json"]), false)?
                    .ok("lunkit list --json")?;
                run.wall_us = out.wall.as_micros() as u64;
                run.rss_kib = Some(out.rss_kib);
            }
            Listing::Tools => {
                run.wall_us = tools_in_turn(&LISTING_TOOLS, &mut parts, round_of_tools > 0)?;
                round_of_tools += 1;
            }
        }
        Ok(run)
    });
    for p in &parts {
        ctx.rec.record(p)?;
    }
    sd.unload()?;
    result.map(|_| ())
}

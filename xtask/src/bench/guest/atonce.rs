//! The at-once rows (issue 38): N volumes of 2 paths each brought in and taken out together,
//! for N in [`ATONCE_VOLUMES`], as a CSI node plugin does when a node drains or a pod with
//! many volumes lands on it.
//!
//! Each N has its own LIO target exporting exactly N LUNs through the lab's two portals,
//! logged in with manual scan (no LUN is scanned at login), udevd running. Rows
//! `atonceN-attach` and `atonceN-detach`, each with three methods:
//!
//! - `lunkit`: one `lunkit batch --at-once` process given N `attach` (or `detach`) lines; the
//!   library time is its closing `lunkit-batch: all in T us`.
//! - `floor`: the kernel alone, driven from this process. Attach: `- - -` written to both
//!   hosts' `scan` side by side (the whole session scanned, every LUN at once), until every
//!   disk's `add` uevent. Detach: every disk flushed and deleted side by side, until every
//!   disk's `remove` uevent.
//! - `peer`: one volume after another, as the peers' drivers stage them: per LUN, per
//!   session, a spawned `sh -c 'echo "0 0 L" > .../scan'` and a wait for its disk; per
//!   volume, `blockdev --flushbufs` and a delete of each path, then a wait for its nodes.
//!
//! No multipathd runs. Under TCG, multipathd with udev took 233 s to build the 32 maps of the
//! largest size: that is multipathd's own throughput, not what these rows measure (how long
//! the paths take to come and go), and it would make every run minutes long.

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use lunkit_lab::iscsi::Session;
use lunkit_lab::lab::{IscsiLab, LabConfig};
use lunkit_lab::lio::LioConfig;
use lunkit_lab::wait;

use super::{
    Ctx, QUIET, TIMEOUT, add_times, delete_devices, devices_on, node_opens, poll_every, restore,
    rounds, say, seqnum, settle, unavailable, warm_cpu,
};
use crate::Result;
use crate::bench::ATONCE_VOLUMES;
use crate::bench::listener::Event;
use crate::bench::model::{Measurement, Run};
use crate::bench::proc::{self, subcommand_available};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Method {
    Lunkit,
    Floor,
    Peer,
}

/// One size's lab as the rows see it: the target, its two sessions and their hosts' devices
/// before any run (none: manual scan).
struct Volumes {
    iqn: String,
    sessions: Vec<Session>,
    luns: u32,
    baselines: Vec<BTreeSet<String>>,
}

impl Volumes {
    /// H:C:T:L of every path of every volume.
    fn hctls(&self) -> Vec<String> {
        (0..self.luns)
            .flat_map(|l| {
                self.sessions
                    .iter()
                    .map(move |s| format!("{}:0:0:{l}", s.host))
            })
            .collect()
    }

    /// Back to "no LUN scanned" on both hosts.
    fn restore(&self, ctx: &Ctx) -> Result<()> {
        for (s, base) in self.sessions.iter().zip(&self.baselines) {
            restore(ctx, s.host, base)?;
        }
        Ok(())
    }

    fn at_baseline(&self) -> bool {
        self.sessions
            .iter()
            .zip(&self.baselines)
            .all(|(s, base)| devices_on(s.host) == *base)
    }
}

/// Every size in turn, each on a lab of its own that is taken down whatever happened.
pub(super) fn phase(ctx: &mut Ctx) -> Result<()> {
    for &n in ATONCE_VOLUMES {
        let t0 = Instant::now();
        one_size(ctx, n, true)?;
        say(&format!(
            "atonce{n}: {n} volumes done in {:.1} s",
            t0.elapsed().as_secs_f64()
        ));
    }
    Ok(())
}

/// Group `atonce32`: issue 38's targets (attach-all ≤1.5× and detach-all ≤2× the kernel's
/// own, over at least 15 runs in one boot) at 32 volumes, lunkit and the floor only. The
/// peers' way, one volume after another, takes minutes a run at this size, and the targets
/// do not compare against it.
pub(super) fn targets_phase(ctx: &mut Ctx) -> Result<()> {
    one_size(ctx, 32, false)
}

/// N volumes' lab, its attach and detach rows (with the peers' way when `peers`), and its
/// teardown.
fn one_size(ctx: &mut Ctx, n: u32, peers: bool) -> Result<()> {
    let t0 = Instant::now();
    let lab = IscsiLab::build(LabConfig {
        target: LioConfig {
            luns: n,
            ..LioConfig::default()
        },
        scan: Vec::new(),
        multipath: None,
    })?;
    if lab.sessions.len() != 2 {
        return Err(format!(
            "atonce{n} needs 2 sessions, the lab has {}",
            lab.sessions.len()
        )
        .into());
    }
    let set = Volumes {
        iqn: lab.config.target.iqn.clone(),
        sessions: lab.sessions.clone(),
        luns: n,
        baselines: lab.sessions.iter().map(|s| devices_on(s.host)).collect(),
    };
    say(&format!(
        "target with {n} LUNs built and logged in on 2 portals after {:.1} s",
        t0.elapsed().as_secs_f64()
    ));
    let result = (|| -> Result<()> {
        set.restore(ctx)?;
        attach_row(ctx, &set, peers)?;
        detach_row(ctx, &set, peers)
    })();
    let restored = set.restore(ctx);
    let down = lab.teardown();
    result.and(restored).and(down)
}

// ---------------------------------------------------------------------------------------
// lunkit batch --at-once
// ---------------------------------------------------------------------------------------

/// What one `lunkit batch --at-once` did: spawn to exit, its library time, its peak RSS.
struct Batch {
    wall_us: u64,
    all_in_us: u64,
    rss_kib: u64,
}

/// Runs `lines` in one `lunkit batch --at-once`; every line must end with exit 0. No deadline
/// of the bench's own: every line has lunkit's `--timeout 60`.
fn batch(ctx: &Ctx, lines: &[String]) -> Result<Batch> {
    // The batch reads every line before it runs any, so the whole input goes in at once.
    let out = proc::timed_with_input(
        Command::new(&ctx.lunkit).args(["batch", "--at-once"]),
        lines.join("\n").as_bytes(),
    )?;
    let (status, stdout, stderr) = (out.status, out.stdout, out.stderr);
    let (wall_us, rss_kib) = (out.wall.as_micros() as u64, out.rss_kib);
    let all_in_us = batch_outcome(&stdout, lines.len()).map_err(|e| {
        format!(
            "lunkit batch --at-once ({status}): {e}; stderr: {}",
            stderr.trim()
        )
    })?;
    if !status.success() {
        return Err(format!("lunkit batch --at-once exited {status}: {}", stderr.trim()).into());
    }
    Ok(Batch {
        wall_us,
        all_in_us,
        rss_kib,
    })
}

/// Checks a batch's stdout: one `lunkit-batch: line K exit 0` for each of the `lines` lines,
/// and the closing `lunkit-batch: all in T us`; its T.
fn batch_outcome(stdout: &str, lines: usize) -> std::result::Result<u64, String> {
    let mut ended = BTreeSet::new();
    let mut all_in = None;
    for l in stdout.lines() {
        if let Some(rest) = l.strip_prefix("lunkit-batch: line ") {
            let (k, code) = rest
                .split_once(" exit ")
                .ok_or_else(|| format!("bad line {l:?}"))?;
            if code != "0" {
                return Err(format!("line {k} exited {code}"));
            }
            ended.insert(k.parse::<usize>().map_err(|_| format!("bad line {l:?}"))?);
        } else if let Some(t) = l
            .strip_prefix("lunkit-batch: all in ")
            .and_then(|r| r.strip_suffix(" us"))
        {
            all_in = Some(t.parse().map_err(|_| format!("bad line {l:?}"))?);
        }
    }
    if ended != (1..=lines).collect() {
        return Err(format!("{} of {lines} lines ended", ended.len()));
    }
    all_in.ok_or_else(|| "no `lunkit-batch: all in` line".to_owned())
}

/// The N batch lines of `verb` (`attach` or `detach`), one per LUN.
fn batch_lines(set: &Volumes, verb: &str, extra: &[&str]) -> Vec<String> {
    (0..set.luns)
        .map(|l| {
            let mut words = vec![
                verb.to_owned(),
                "--iscsi-target".to_owned(),
                set.iqn.clone(),
                "--lun".to_owned(),
                l.to_string(),
            ];
            words.extend(extra.iter().map(|w| (*w).to_owned()));
            words.join(" ")
        })
        .collect()
}

/// The lunkit method of a row: one `lunkit batch --at-once` of `lines`, into `run`.
fn lunkit_once(ctx: &Ctx, lines: &[String], run: &mut Run) -> Result<()> {
    let b = batch(ctx, lines)?;
    run.wall_us = b.wall_us;
    run.lib_us = Some(b.all_in_us);
    run.rss_kib = Some(b.rss_kib);
    Ok(())
}

/// The three methods of `row` (the peers' left out unless `peers`), or the lunkit one
/// recorded as unavailable and left out when this lunkit has no `batch`.
fn methods(
    ctx: &mut Ctx,
    row: &str,
    notes: [(&str, String); 3],
    peers: bool,
) -> Result<Vec<(Method, Measurement)>> {
    let [lk, floor, peer] = notes;
    let lunkit = Measurement::new(row, "lunkit", lk.0, &lk.1);
    let mut list = vec![(
        Method::Floor,
        Measurement::new(row, "floor", floor.0, &floor.1),
    )];
    if peers {
        list.push((Method::Peer, Measurement::new(row, "peer", peer.0, &peer.1)));
    }
    match subcommand_available(&ctx.lunkit, "batch") {
        Ok(()) => list.insert(0, (Method::Lunkit, lunkit)),
        Err(why) => unavailable(ctx, lunkit, why)?,
    }
    Ok(list)
}

// ---------------------------------------------------------------------------------------
// Attach
// ---------------------------------------------------------------------------------------

fn attach_row(ctx: &mut Ctx, set: &Volumes, peers: bool) -> Result<()> {
    let n = set.luns;
    let row = format!("atonce{n}-attach");
    let list = methods(
        ctx,
        &row,
        [
            (
                "lunkit batch --at-once: attach",
                format!(
                    "one `lunkit batch --at-once` (release build) given {n} lines `attach \
                     --iscsi-target IQN --lun L --min-paths 2 --timeout 60 --json`, spawn to \
                     exit; every line must exit 0 and all {} disks open after. Library time \
                     is the batch's `all in` line.",
                    2 * n
                ),
            ),
            (
                "kernel floor: whole-session scan",
                format!(
                    "`- - -` written to both hosts' scan side by side from the benchmark \
                     process (REPORT LUNS, every LUN probed), until the listener has all {} \
                     disks' `add` uevents.",
                    2 * n
                ),
            ),
            (
                "one volume after another (peers)",
                "per LUN, per session: `sh -c 'echo \"0 0 L\" > /sys/class/scsi_host/hostH/scan'` \
                 spawned, then the disk's /dev node polled every 10 ms until it opens. A lower \
                 bound for the peers: Kubernetes and os-brick poll once a second."
                    .to_owned(),
            ),
        ],
        peers,
    )?;
    rounds(ctx, &list, |ctx, m| attach_once(ctx, set, m)).map(|_| ())
}

/// One attach run of every volume: none scanned before, all deleted after.
fn attach_once(ctx: &mut Ctx, set: &Volumes, m: Method) -> Result<Run> {
    if !set.at_baseline() {
        set.restore(ctx)?;
    }
    let hctls = set.hctls();
    let mut run = Run::default();
    let seq0 = seqnum()?;
    warm_cpu();
    let t_start = Instant::now();
    let result = match m {
        Method::Lunkit => {
            let lines = batch_lines(
                set,
                "attach",
                &["--min-paths", "2", "--timeout", "60", "--json"],
            );
            lunkit_once(ctx, &lines, &mut run)
        }
        Method::Floor => floor_attach(ctx, set, &hctls, seq0, t_start).map(|us| run.wall_us = us),
        Method::Peer => {
            peer_attach(set).map(|()| run.wall_us = t_start.elapsed().as_micros() as u64)
        }
    };
    add_times(ctx, &mut run, seq0, t_start, &hctls);
    // Count what the action caused (udev's reactions included) before cleaning up.
    ctx.listener.wait_quiet(QUIET, TIMEOUT);
    run.uevents = Some(seqnum()?.saturating_sub(seq0));
    let missing: Vec<&String> = hctls.iter().filter(|h| node_opens(h).is_none()).collect();
    let missing = (!missing.is_empty()).then(|| format!("{missing:?}"));
    set.restore(ctx)?;
    result?;
    if let Some(missing) = missing {
        return Err(format!("no disk that opens after the run for {missing}").into());
    }
    Ok(run)
}

/// `- - -` written to every session's host side by side (each write returns once its
/// host's scan is done), then every disk's `add` uevent; microseconds to the last one.
fn floor_attach(
    ctx: &Ctx,
    set: &Volumes,
    hctls: &[String],
    seq0: u64,
    t_start: Instant,
) -> Result<u64> {
    scan_whole_sessions(&set.sessions)?;
    last_uevent(ctx, hctls, seq0, t_start, "add", Event::is_disk_add_of)
}

/// Microseconds from `t_start` to the last of the disks' `what` uevents (one per address in
/// `hctls`, `is` telling it), each awaited until [`TIMEOUT`] after `t_start`.
fn last_uevent(
    ctx: &Ctx,
    hctls: &[String],
    seq0: u64,
    t_start: Instant,
    what: &str,
    is: fn(&Event, &str) -> bool,
) -> Result<u64> {
    let mut last = 0;
    for h in hctls {
        let ev = ctx
            .listener
            .wait_for(seq0, t_start + TIMEOUT, |e| is(e, h))
            .ok_or_else(|| format!("no disk {what} uevent for {h} within {TIMEOUT:?}"))?;
        last = last.max(ev.at.saturating_duration_since(t_start).as_micros() as u64);
    }
    Ok(last)
}

/// `- - -` (every channel, target and LUN) to each session's host scan, a thread each.
fn scan_whole_sessions(sessions: &[Session]) -> Result<()> {
    let writes: Vec<(String, String)> = sessions
        .iter()
        .map(|s| {
            (
                format!("/sys/class/scsi_host/host{}/scan", s.host),
                "- - -".into(),
            )
        })
        .collect();
    super::write_side_by_side(&writes)
}

/// The peers' way: each volume in turn, each of its paths scanned by a spawned shell and
/// waited for before the next.
fn peer_attach(set: &Volumes) -> Result<()> {
    for lun in 0..set.luns {
        for s in &set.sessions {
            let script = format!(
                "echo \"0 0 {lun}\" > /sys/class/scsi_host/host{}/scan",
                s.host
            );
            proc::timed(Command::new("sh").args(["-c", &script]), false)?.ok(&script)?;
            let hctl = format!("{}:0:0:{lun}", s.host);
            poll_every(Duration::from_millis(10), &format!("{hctl}'s disk"), || {
                node_opens(&hctl).is_some()
            })?;
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Detach
// ---------------------------------------------------------------------------------------

fn detach_row(ctx: &mut Ctx, set: &Volumes, peers: bool) -> Result<()> {
    let n = set.luns;
    let row = format!("atonce{n}-detach");
    let list = methods(
        ctx,
        &row,
        [
            (
                "lunkit batch --at-once: detach",
                format!(
                    "one `lunkit batch --at-once` (release build) given {n} lines `detach \
                     --iscsi-target IQN --lun L --timeout 60 --json`, spawn to exit; every \
                     line must exit 0 and all {} paths be gone after. Library time is the \
                     batch's `all in` line.",
                    2 * n
                ),
            ),
            (
                "kernel floor: every disk at once",
                format!(
                    "from the benchmark process, for all {} disks side by side: `BLKFLSBUF` and \
                     `1` written to its device/delete, until the listener has every disk's \
                     `remove` uevent. No spawn, no lookup, no check.",
                    2 * n
                ),
            ),
            (
                "one volume after another (shell sequence)",
                "per volume: `blockdev --flushbufs /dev/sdX` on each path, `1` written to each \
                 path's device/delete from the benchmark process, then its /dev nodes checked \
                 at once and every 0.5 s (os-brick's wait_for_volumes_removal) until gone. No \
                 `multipath -f`: there is no map."
                    .to_owned(),
            ),
        ],
        peers,
    )?;
    rounds(ctx, &list, |ctx, m| detach_once(ctx, set, m)).map(|_| ())
}

/// Every volume brought in (unmeasured: the whole sessions scanned) and udev settled; the
/// disk name of every path, in [`Volumes::hctls`] order.
fn attach_all(ctx: &Ctx, set: &Volumes) -> Result<Vec<String>> {
    if !set.at_baseline() {
        set.restore(ctx)?;
    }
    scan_whole_sessions(&set.sessions)?;
    let hctls = set.hctls();
    wait::until_true("every disk to open", TIMEOUT, || {
        hctls.iter().all(|h| node_opens(h).is_some())
    })?;
    settle(ctx)?;
    hctls
        .iter()
        .map(|h| node_opens(h).ok_or_else(|| format!("{h} has no disk").into()))
        .collect()
}

/// One detach run of every volume: all attached before, none after.
fn detach_once(ctx: &mut Ctx, set: &Volumes, m: Method) -> Result<Run> {
    let disks = attach_all(ctx, set)?;
    let hctls = set.hctls();
    let mut run = Run::default();
    let seq0 = seqnum()?;
    warm_cpu();
    let t_start = Instant::now();
    let result = match m {
        Method::Lunkit => {
            let lines = batch_lines(set, "detach", &["--timeout", "60", "--json"]);
            lunkit_once(ctx, &lines, &mut run)
        }
        Method::Floor => {
            floor_detach(ctx, &hctls, &disks, seq0, t_start).map(|us| run.wall_us = us)
        }
        Method::Peer => {
            peer_detach(&disks).map(|()| run.wall_us = t_start.elapsed().as_micros() as u64)
        }
    };
    ctx.listener.wait_quiet(QUIET, TIMEOUT);
    run.uevents = Some(seqnum()?.saturating_sub(seq0));
    let left: Vec<String> = hctls
        .iter()
        .filter(|h| Path::new(&format!("/sys/class/scsi_device/{h}")).exists())
        .cloned()
        .collect();
    if !left.is_empty() {
        delete_devices(&left)?;
    }
    set.restore(ctx)?;
    result?;
    if !left.is_empty() {
        return Err(format!("{left:?} still there after the detach").into());
    }
    Ok(run)
}

/// Every disk flushed and deleted side by side, a thread each (a delete returns once the
/// kernel has removed the disk), then every disk's `remove` uevent; microseconds to the last.
fn floor_detach(
    ctx: &Ctx,
    hctls: &[String],
    disks: &[String],
    seq0: u64,
    t_start: Instant,
) -> Result<u64> {
    super::flush_and_delete_side_by_side(disks)?;
    last_uevent(
        ctx,
        hctls,
        seq0,
        t_start,
        "remove",
        Event::is_disk_remove_of,
    )
}

/// The shell sequence, one volume (its two paths, consecutive in `disks`) after another.
fn peer_detach(disks: &[String]) -> Result<()> {
    for volume in disks.chunks(2) {
        for d in volume {
            proc::timed(
                Command::new("blockdev").args(["--flushbufs", &format!("/dev/{d}")]),
                false,
            )?
            .ok("blockdev --flushbufs")?;
        }
        for d in volume {
            fs::write(format!("/sys/block/{d}/device/delete"), "1")?;
        }
        let nodes: Vec<String> = volume.iter().map(|d| format!("/dev/{d}")).collect();
        poll_every(Duration::from_millis(500), "the nodes to go", || {
            nodes.iter().all(|n| !Path::new(n).exists())
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::batch_outcome;

    #[test]
    fn a_batch_counts_only_when_every_line_exited_0() {
        let ok = "{\"a\":1}\nlunkit-batch: line 2 exit 0\nlunkit-batch: line 1 exit 0\n\
                  lunkit-batch: all in 1234 us\n";
        assert_eq!(batch_outcome(ok, 2), Ok(1234));
        let failed = "lunkit-batch: line 1 exit 3\nlunkit-batch: line 2 exit 0\n\
                      lunkit-batch: all in 9 us\n";
        assert!(
            batch_outcome(failed, 2)
                .unwrap_err()
                .contains("line 1 exited 3")
        );
        let short = "lunkit-batch: line 1 exit 0\nlunkit-batch: all in 9 us\n";
        assert!(batch_outcome(short, 2).is_err());
        assert!(batch_outcome("lunkit-batch: line 1 exit 0\n", 1).is_err());
    }
}

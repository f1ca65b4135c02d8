//! What the lab looked like when something went wrong: device-mapper tables, multipathd's
//! view, iSCSI sessions, SCSI devices and their states, the kernel log and multipathd's log.
//!
//! [`super::require_vm`] installs a panic hook that prints [`dump`] at the moment a VM test
//! panics, before the fixtures' `Drop` tears the lab down (afterwards there is nothing left to
//! look at); the xtask guest runner prints it again after a failed or leaking test. Every
//! command runs under a short bound ([`cmd::run_bounded`]) and is abandoned past it: a tool
//! stuck on dead storage must not hold up the dump, nor the test it explains.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::{cmd, multipath, sysfs};

/// How long one command of the dump may take.
const LIMIT: Duration = Duration::from_secs(5);
/// Lines of the kernel log to show.
const DMESG_LINES: usize = 60;
/// Lines of multipathd's log ([`multipath::LOG`]) to show.
const MULTIPATHD_LOG_LINES: usize = 40;

static DUMPED: AtomicBool = AtomicBool::new(false);

/// Prints [`report`] to stderr, headed by `why`.
pub fn dump(why: &str) {
    eprint!("{}", report(why));
}

/// [`dump`], only the first time in this process: a test whose threads panic one after the
/// other gets one picture, taken at the first panic.
pub fn dump_once(why: &str) {
    if !DUMPED.swap(true, Ordering::SeqCst) {
        dump(why);
    }
}

/// The whole picture as text.
pub fn report(why: &str) -> String {
    let mut out = format!("==== lab diagnostics: {why} ====\n");
    section(&mut out, "daemons", &daemons());
    section(&mut out, "dm devices (sysfs)", &dm_devices());
    section(
        &mut out,
        "dmsetup info -c",
        &tool("dmsetup", &["info", "-c"]),
    );
    section(&mut out, "dmsetup table", &tool("dmsetup", &["table"]));
    section(&mut out, "dmsetup status", &tool("dmsetup", &["status"]));
    if cmd::process_running("multipathd") {
        section(
            &mut out,
            "multipathd show paths",
            &tool("multipathd", &["show", "paths"]),
        );
        section(
            &mut out,
            "multipathd show maps",
            &tool("multipathd", &["show", "maps"]),
        );
    }
    section(&mut out, "iSCSI sessions (sysfs)", &iscsi_sessions());
    if cmd::process_running("iscsid") {
        section(
            &mut out,
            "iscsiadm -m session -P 1",
            &tool("iscsiadm", &["-m", "session", "-P", "1"]),
        );
    }
    section(&mut out, "SCSI devices (sysfs)", &scsi_devices());
    section(&mut out, "mounts of block devices", &block_mounts());
    section(
        &mut out,
        "swaps",
        &std::fs::read_to_string("/proc/swaps").unwrap_or_default(),
    );
    section(
        &mut out,
        &format!("dmesg (last {DMESG_LINES} lines)"),
        &tail(&tool("dmesg", &[]), DMESG_LINES),
    );
    let log = std::fs::read_to_string(multipath::LOG)
        .unwrap_or_else(|e| format!("(cannot read {}: {e})\n", multipath::LOG));
    section(
        &mut out,
        &format!("{} (last {MULTIPATHD_LOG_LINES} lines)", multipath::LOG),
        &tail(&log, MULTIPATHD_LOG_LINES),
    );
    out.push_str("==== end of lab diagnostics ====\n");
    out
}

fn section(out: &mut String, title: &str, body: &str) {
    let _ = writeln!(out, "-- {title}");
    let body = body.trim_end();
    if body.is_empty() {
        out.push_str("(none)\n");
    } else {
        out.push_str(body);
        out.push('\n');
    }
}

/// A tool's output, or why there is none.
fn tool(program: &str, args: &[&str]) -> String {
    cmd::run_bounded(program, args, LIMIT).output_or_reason(LIMIT)
}

fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

fn daemons() -> String {
    ["multipathd", "iscsid", "systemd-udevd"]
        .iter()
        .map(|d| match cmd::pids_of(d) {
            pids if pids.is_empty() => format!("{d}: not running"),
            pids => format!("{d}: pid {pids:?}"),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every dm device with what sysfs says about it: no ioctl, so it cannot block.
fn dm_devices() -> String {
    sysfs::names("/sys/block")
        .into_iter()
        .filter(|n| n.starts_with("dm-"))
        .map(|dm| {
            let base = format!("/sys/block/{dm}");
            let attr = |a: &str| sysfs::attr(format!("{base}/{a}")).unwrap_or_default();
            format!(
                "{dm} name={} uuid={} dev={} suspended={} size={} slaves={} holders={}",
                attr("dm/name"),
                attr("dm/uuid"),
                attr("dev"),
                attr("dm/suspended"),
                attr("size"),
                sysfs::names(format!("{base}/slaves")).join(","),
                sysfs::names(format!("{base}/holders")).join(","),
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn iscsi_sessions() -> String {
    sysfs::names("/sys/class/iscsi_session")
        .into_iter()
        .map(|s| {
            let dir = format!("/sys/class/iscsi_session/{s}");
            let sid = s.trim_start_matches("session");
            let conn = format!("/sys/class/iscsi_connection/connection{sid}:0");
            let attr = |p: String| sysfs::attr(p).unwrap_or_else(|| "?".into());
            let host = sysfs::resolve(format!("{dir}/device"))
                .and_then(|p| Some(p.parent()?.file_name()?.to_str()?.to_owned()))
                .unwrap_or_else(|| "?".into());
            format!(
                "{s} {host} target={} portal={}:{} state={} recovery_tmo={}",
                attr(format!("{dir}/targetname")),
                attr(format!("{conn}/persistent_address")),
                attr(format!("{conn}/persistent_port")),
                attr(format!("{dir}/state")),
                attr(format!("{dir}/recovery_tmo")),
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// An `lsscsi`-like listing from sysfs, with each device's state (`running`, `offline`,
/// `blocked`, `transport-offline`) and WWID.
fn scsi_devices() -> String {
    sysfs::names("/sys/class/scsi_device")
        .into_iter()
        .map(|hctl| {
            let dev = format!("/sys/class/scsi_device/{hctl}/device");
            let attr = |a: &str| sysfs::attr(format!("{dev}/{a}")).unwrap_or_default();
            let disk = sysfs::names(format!("{dev}/block")).join(",");
            format!(
                "[{hctl}] {:<8} {:<16} {} state={} disk={} wwid={}",
                attr("vendor").trim(),
                attr("model").trim(),
                attr("rev").trim(),
                attr("state"),
                if disk.is_empty() { "-" } else { &disk },
                attr("wwid"),
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Mounts whose source is a device node (`/dev/...`), from our mountinfo; the guest's root
/// (9p, source `/dev/root`) is not one.
fn block_mounts() -> String {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let point = left.split(' ').nth(4)?;
            let mut r = right.split(' ');
            let (fstype, source) = (r.next()?, r.next()?);
            (source.starts_with("/dev/") && fstype != "9p")
                .then(|| format!("{source} on {point} type {fstype}"))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

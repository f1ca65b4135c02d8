//! The guest kernel's alarms in the test log: hung tasks, lockups, stalls, oopses.
//!
//! The guest's console is not shown (it would bury the tests' output under the I/O errors
//! many tests cause on purpose), so a guest that froze used to leave nothing but silence. A
//! thread of the guest runner reads `/dev/kmsg` from the boot's start and prints each record
//! that says the kernel itself is in trouble, with the records after it (the call trace),
//! prefixed `xtask: kernel:`. A lockup that stops one vCPU leaves the other to print it.

use std::fs::File;
use std::io::Read;

/// Records printed after an alarm, for its call trace and registers.
const TRACE: usize = 60;

/// Starts the watcher; it runs until the guest powers off.
pub fn watch() {
    let Ok(mut kmsg) = File::open("/dev/kmsg") else {
        eprintln!("xtask: /dev/kmsg unreadable: kernel alarms will not be shown");
        return;
    };
    std::thread::spawn(move || {
        // One record per read; a record longer than the buffer fails the read (EINVAL).
        let mut buf = vec![0u8; 8192];
        let mut trace_left = 0;
        loop {
            let n = match kmsg.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => n,
                // EPIPE: records were overwritten before we read them; go on.
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => continue,
                Err(_) => return,
            };
            let Some((level, text)) = parse(&String::from_utf8_lossy(&buf[..n])) else {
                continue;
            };
            if is_alarm(level, &text) {
                trace_left = TRACE;
            } else if trace_left == 0 {
                continue;
            } else {
                trace_left -= 1;
            }
            eprintln!("xtask: kernel: {text}");
        }
    });
}

/// `(level, message)` of a `/dev/kmsg` record: `PRI,SEQ,USEC,FLAGS;MESSAGE\n` followed by
/// continuation lines (` KEY=VALUE`), which are dropped. The level is `PRI & 7`.
fn parse(record: &str) -> Option<(u8, String)> {
    let (head, rest) = record.split_once(';')?;
    let pri: u32 = head.split(',').next()?.parse().ok()?;
    let message = rest.lines().next().unwrap_or_default();
    Some(((pri & 7) as u8, message.to_owned()))
}

/// Whether a message says the kernel is stuck or broken (not a device's I/O error, which
/// tests cause on purpose): any emergency or alert message, and the hung-task, lockup,
/// stall and oops reports, whatever their level. Critical is not enough: ext4 reports a
/// filesystem whose disk a test deleted under it (`EXT4-fs error`) at that level.
fn is_alarm(level: u8, text: &str) -> bool {
    const SIGNS: &[&str] = &[
        "blocked for more than",
        "soft lockup",
        "hard LOCKUP",
        "rcu_sched detected stall",
        "rcu: INFO:",
        "self-detected stall",
        "BUG:",
        "Oops:",
        "general protection fault",
        "Kernel panic",
        "cut here",
        "WARNING: CPU:",
    ];
    level <= 1 || SIGNS.iter().any(|s| text.contains(s))
}

#[cfg(test)]
mod tests {
    use super::{is_alarm, parse};

    #[test]
    fn a_hung_task_report_is_an_alarm_and_an_io_error_is_not() {
        let r = "3,812,120834567,-;INFO: task lunkit:412 blocked for more than 120 seconds.\n \
                 SUBSYSTEM=block\n";
        let (level, text) = parse(r).unwrap();
        assert_eq!(level, 3);
        assert!(is_alarm(level, &text), "{text}");
        let (level, text) =
            parse("3,900,1,-;I/O error, dev sdb, sector 0 op 0x0:(READ)\n").unwrap();
        assert!(!is_alarm(level, &text));
        let ext4 = "2,901,1,-;EXT4-fs error (device sda): ext4_wait_block_bitmap:571: x\n";
        let (level, text) = parse(ext4).unwrap();
        assert!(!is_alarm(level, &text), "{text}");
        // The facility is in the high bits: 0x1a = daemon (3) at level 2, critical.
        assert_eq!(parse("26,1,1,-;x").map(|(l, _)| l), Some(2));
        assert_eq!(parse("no separator"), None);
    }
}

//! The kernel stacks of a hung test, printed before it is killed.
//!
//! A VM test that overruns its limit is nearly always a task waiting in the kernel (a
//! device-mapper ioctl, an open of a suspended map, a read with no path). Killing it loses
//! where; the guest's log then says only that it timed out. So the runner prints, first,
//! each task of the test's process group and every task of the guest in uninterruptible
//! sleep (`D`), with its `wchan` and `/proc/PID/task/TID/stack` (the guest runs as root).

use std::fs;
use std::path::Path;

/// Prints the stacks of the tasks of process group `pgid` and of every task in `D` state.
pub fn dump(pgid: u32) {
    eprintln!("xtask: kernel stacks before the kill (process group {pgid}, and every D task):");
    let Ok(procs) = fs::read_dir("/proc") else {
        eprintln!("xtask: /proc unreadable: no stacks");
        return;
    };
    for entry in procs.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let in_group = stat(&entry.path()).is_some_and(|(_, _, pgrp)| pgrp == pgid);
        let Ok(tasks) = fs::read_dir(entry.path().join("task")) else {
            continue;
        };
        for task in tasks.flatten() {
            let Some((comm, state, _)) = stat(&task.path()) else {
                continue;
            };
            if in_group || state == 'D' {
                print_task(pid, &task.path(), &comm, state);
            }
        }
    }
}

fn print_task(pid: u32, task: &Path, comm: &str, state: char) {
    let tid = task.file_name().map(|n| n.to_string_lossy().into_owned());
    let wchan = fs::read_to_string(task.join("wchan")).unwrap_or_default();
    eprintln!(
        "xtask: task {pid}/{} ({comm}) state {state} wchan {}",
        tid.unwrap_or_default(),
        wchan.trim()
    );
    match fs::read_to_string(task.join("stack")) {
        Ok(s) => s.lines().for_each(|l| eprintln!("xtask:     {l}")),
        Err(e) => eprintln!("xtask:     (stack unreadable: {e})"),
    }
}

/// `(comm, state, pgrp)` from `DIR/stat`; the comm is in parentheses and may hold spaces
/// and parentheses itself, so the fields after it are found from its last `)`.
fn stat(dir: &Path) -> Option<(String, char, u32)> {
    parse_stat(&fs::read_to_string(dir.join("stat")).ok()?)
}

fn parse_stat(s: &str) -> Option<(String, char, u32)> {
    let open = s.find('(')?;
    let close = s.rfind(')')?;
    let comm = s.get(open + 1..close)?.to_owned();
    let mut rest = s.get(close + 1..)?.split_whitespace();
    let state = rest.next()?.chars().next()?;
    let _ppid = rest.next()?;
    let pgrp = rest.next()?.parse().ok()?;
    Some((comm, state, pgrp))
}

#[cfg(test)]
mod tests {
    use super::parse_stat;

    #[test]
    fn stat_fields_after_a_comm_with_spaces_and_parentheses() {
        let s = "412 (a (b) c) D 1 399 399 0 -1 4194560";
        assert_eq!(parse_stat(s), Some(("a (b) c".to_owned(), 'D', 399)));
        assert_eq!(parse_stat("412 (x) R"), None, "cut short");
    }
}

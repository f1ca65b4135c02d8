//! Running the lab's tools, with their stderr in the error when they fail.

use std::fs::File;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use super::Result;

/// Runs `program args...`, returns its stdout; fails with the command line, exit status and
/// stderr so a broken lab says why.
pub fn run(program: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "`{program} {}` failed ({}): stderr: {}; stdout: {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim(),
            String::from_utf8_lossy(&out.stdout).trim(),
        )
        .into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Like [`run`] for teardown paths where failure is expected or irrelevant (already gone).
pub fn run_ignoring_failure(program: &str, args: &[&str]) {
    let _ = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// Starts a daemon in the foreground of a child process (so we own its pid) with stdout and
/// stderr going to `log`, which a failing test can print.
pub fn spawn_logged(program: &str, args: &[&str], log: &Path) -> Result<Child> {
    let file = File::create(log).map_err(|e| format!("cannot create {}: {e}", log.display()))?;
    let err = file.try_clone()?;
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(file)
        .stderr(err)
        .spawn()
        .map_err(|e| format!("cannot start {program}: {e}").into())
}

/// Whether a process with this command name (`/proc/PID/comm`) is running.
pub fn process_running(comm: &str) -> bool {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return false;
    };
    dir.flatten().any(|e| {
        e.file_name()
            .to_str()
            .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
            && std::fs::read_to_string(e.path().join("comm")).is_ok_and(|c| c.trim_end() == comm)
    })
}

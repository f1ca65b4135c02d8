//! Running programs from xtask: status with a clear error, tee of stdout, and a deadline that
//! kills the whole process group (vng -> virtme-run -> qemu).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::Result;

/// The cargo that runs us (`cargo xtask` sets CARGO), so toolchain overrides carry over.
pub fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

/// Runs with inherited stdio; fails unless it exits 0.
pub fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd
        .status()
        .map_err(|e| format!("cannot run {}: {e}", describe(cmd)))?;
    if !status.success() {
        return Err(format!("`{}` failed ({status})", describe(cmd)).into());
    }
    Ok(())
}

/// Runs with stdout piped through to ours line by line, and returns the status and the lines
/// (the caller reads test counts from them). With a timeout, the command runs in its own
/// process group which is killed when time is up.
pub fn run_tee(cmd: &mut Command, timeout: Option<Duration>) -> Result<(ExitStatus, Vec<String>)> {
    // Both streams go through pipes: virtme-ng reopens the stdio it is given (truncating a
    // log file the caller redirected us to), so it must never see our own descriptors.
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    if timeout.is_some() {
        cmd.process_group(0);
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", describe(cmd)))?;
    let pid = child.id();
    let done = Arc::new(AtomicBool::new(false));
    let timed_out = Arc::new(AtomicBool::new(false));
    if let Some(timeout) = timeout {
        let (done, timed_out) = (done.clone(), timed_out.clone());
        std::thread::spawn(move || {
            let step = Duration::from_millis(200);
            let mut waited = Duration::ZERO;
            while waited < timeout {
                if done.load(Ordering::Relaxed) {
                    return;
                }
                std::thread::sleep(step);
                waited += step;
            }
            if !done.load(Ordering::Relaxed) {
                timed_out.store(true, Ordering::Relaxed);
                eprintln!("xtask: timed out after {timeout:?}, killing process group {pid}");
                // Our own child's group only: -PGID.
                let _ = Command::new("kill")
                    .args(["-KILL", "--", &format!("-{pid}")])
                    .status();
            }
        });
    }
    let mut stderr = child.stderr.take().expect("stderr is piped");
    let forward_err = std::thread::spawn(move || {
        let _ = std::io::copy(&mut stderr, &mut std::io::stderr());
    });
    let mut lines = Vec::new();
    let stdout = child.stdout.take().expect("stdout is piped");
    for line in BufReader::new(stdout).lines() {
        let Ok(line) = line else { break };
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
        lines.push(line);
    }
    let status = child.wait()?;
    let _ = forward_err.join();
    done.store(true, Ordering::Relaxed);
    if timed_out.load(Ordering::Relaxed) {
        return Err(format!(
            "`{}` timed out after {:?}",
            describe(cmd),
            timeout.unwrap_or_default()
        )
        .into());
    }
    Ok((status, lines))
}

/// The command line, for error messages.
pub fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Sums libtest's `test result: ok. 3 passed; 0 failed; 1 ignored; ...` lines.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub passed: u64,
    pub failed: u64,
    pub ignored: u64,
    pub binaries: u64,
}

impl Counts {
    pub fn from_lines(lines: &[String]) -> Self {
        let mut c = Self::default();
        for line in lines {
            let Some(rest) = line.trim().strip_prefix("test result: ") else {
                continue;
            };
            c.binaries += 1;
            for part in rest.split([';', '.']) {
                let mut words = part.split_whitespace();
                let (Some(n), Some(what)) = (words.next(), words.next()) else {
                    continue;
                };
                let Ok(n) = n.parse::<u64>() else { continue };
                match what {
                    "passed" => c.passed += n,
                    "failed" => c.failed += n,
                    "ignored" => c.ignored += n,
                    _ => {}
                }
            }
        }
        c
    }
}

impl std::fmt::Display for Counts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} passed, {} failed, {} ignored ({} test binaries)",
            self.passed, self.failed, self.ignored, self.binaries
        )
    }
}

#[cfg(test)]
mod tests {
    use super::Counts;

    #[test]
    fn sums_libtest_result_lines() {
        let lines = [
            "test result: ok. 3 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.01s",
            "noise",
            "test result: FAILED. 1 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out; finished in 1.2s",
        ]
        .map(String::from);
        let c = Counts::from_lines(&lines);
        assert_eq!(
            c,
            Counts {
                passed: 4,
                failed: 2,
                ignored: 1,
                binaries: 2
            }
        );
    }
}

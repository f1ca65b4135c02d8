//! Running programs from xtask: status with a clear error, tee of stdout, and a deadline that
//! kills the whole process group (vng -> virtme-run -> qemu).

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

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
/// process group which is killed when time is up, and that is an error.
pub fn run_tee(cmd: &mut Command, timeout: Option<Duration>) -> Result<(ExitStatus, Vec<String>)> {
    let tee = tee(
        cmd,
        &TeeOptions {
            timeout,
            ..TeeOptions::default()
        },
    )?;
    match (tee.status, tee.killed) {
        (Some(status), None) => Ok((status, tee.lines)),
        (_, why) => Err(format!(
            "`{}` {}",
            describe(cmd),
            why.unwrap_or_else(|| "was not reaped".into())
        )
        .into()),
    }
}

/// How [`tee`] runs a command.
#[derive(Debug, Default, Clone)]
pub struct TeeOptions {
    /// Kill the command's process group after this long.
    pub timeout: Option<Duration>,
    /// Kill it when it has printed nothing (stdout or stderr) for this long.
    pub idle_timeout: Option<Duration>,
    /// Forward stderr to our stdout and keep its lines too, in arrival order with stdout's
    /// (a test's panic message is on stderr); otherwise stderr goes to our stderr unkept.
    pub merge_stderr: bool,
    /// Put before every forwarded line (not the kept ones), to tell apart the output of
    /// commands that run side by side.
    pub prefix: Option<String>,
    /// Append every line of both streams (unprefixed) to this file too.
    pub log: Option<PathBuf>,
    /// Before a kill at a limit, print the kernel stacks of the command's tasks and of every
    /// task in uninterruptible sleep ([`crate::stacks::dump`]): where a hung test waits.
    pub stacks_on_kill: bool,
    /// Kill it (its whole process group) once this is set: a companion process whose life
    /// ends with another's (node B's guest ends with node A's, twonode.rs).
    pub stop: Option<Arc<AtomicBool>>,
}

/// What [`tee`] saw.
#[derive(Debug)]
pub struct Tee {
    /// `None` when it was killed and did not go away within a grace period (a process stuck in
    /// the kernel dies only when the kernel lets go).
    pub status: Option<ExitStatus>,
    pub lines: Vec<String>,
    /// Why it was killed, if it was (`timed out after 600s`, `printed nothing for 900s`).
    pub killed: Option<String>,
}

/// Runs `cmd` with its output forwarded line by line as it comes and kept; a run past its
/// limits is killed (its whole process group) and reported as such, with the lines printed
/// until then, which a caller needs to tell how far it got.
pub fn tee(cmd: &mut Command, opts: &TeeOptions) -> Result<Tee> {
    // Both streams go through pipes: virtme-ng reopens the stdio it is given (truncating a
    // log file the caller redirected us to), so it must never see our own descriptors.
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let limited = opts.timeout.is_some() || opts.idle_timeout.is_some() || opts.stop.is_some();
    if limited {
        cmd.process_group(0);
    }
    let log = match &opts.log {
        Some(path) => Some(Arc::new(Mutex::new(
            File::options()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|e| format!("cannot open {}: {e}", path.display()))?,
        ))),
        None => None,
    };
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", describe(cmd)))?;
    let start = Instant::now();
    let lines = Arc::new(Mutex::new(Vec::new()));
    let last_output_ms = Arc::new(AtomicU64::new(0));
    let stdout = child.stdout.take().expect("stdout is piped");
    let stderr = child.stderr.take().expect("stderr is piped");
    let forward = |sink, keep| Forward {
        sink,
        keep,
        prefix: opts.prefix.clone(),
        log: log.clone(),
        start,
        last_output_ms: Arc::clone(&last_output_ms),
    };
    let readers = [
        forward(Sink::Stdout, Some(Arc::clone(&lines))).spawn(stdout),
        if opts.merge_stderr {
            forward(Sink::Stdout, Some(Arc::clone(&lines))).spawn(stderr)
        } else {
            forward(Sink::Stderr, None).spawn(stderr)
        },
    ];
    let mut killed = None;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break Some(status);
        }
        if killed.is_none() {
            // Saturating: a reader may store a time later than the `elapsed` read here.
            let last = Duration::from_millis(last_output_ms.load(Ordering::Relaxed));
            let idle = start.elapsed().saturating_sub(last);
            let why = match (opts.timeout, opts.idle_timeout) {
                (Some(t), _) if start.elapsed() >= t => Some(format!("timed out after {t:?}")),
                (_, Some(t)) if idle >= t => Some(format!("printed nothing for {t:?}")),
                _ if opts
                    .stop
                    .as_ref()
                    .is_some_and(|s| s.load(Ordering::Relaxed)) =>
                {
                    Some("was stopped (its run is over)".to_owned())
                }
                _ => None,
            };
            if let Some(why) = why {
                eprintln!(
                    "xtask: {why}, killing process group {} ({})",
                    child.id(),
                    describe(cmd)
                );
                if opts.stacks_on_kill {
                    crate::stacks::dump(child.id());
                }
                // Our own child's group only: -PGID.
                let _ = Command::new("kill")
                    .args(["-KILL", "--", &format!("-{}", child.id())])
                    .status();
                killed = Some((why, Instant::now()));
            }
        } else if killed
            .as_ref()
            .is_some_and(|(_, at)| at.elapsed() > KILL_GRACE)
        {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // A process that escaped the group may hold the pipes: wait a little, not forever.
    let grace = Instant::now() + Duration::from_secs(2);
    while !readers.iter().all(JoinHandle::is_finished) && Instant::now() < grace {
        std::thread::sleep(Duration::from_millis(10));
    }
    let lines = lines.lock().unwrap_or_else(|e| e.into_inner()).clone();
    Ok(Tee {
        status,
        lines,
        killed: killed.map(|(why, _)| why),
    })
}

/// How long a killed process group gets to go away before we stop waiting for it.
const KILL_GRACE: Duration = Duration::from_secs(10);

#[derive(Clone, Copy)]
enum Sink {
    Stdout,
    Stderr,
}

/// Where one of a command's streams goes, line by line.
struct Forward {
    sink: Sink,
    /// Keeps the lines (unprefixed), for the caller.
    keep: Option<Arc<Mutex<Vec<String>>>>,
    prefix: Option<String>,
    log: Option<Arc<Mutex<File>>>,
    start: Instant,
    /// When the last line came, in ms since `start`.
    last_output_ms: Arc<AtomicU64>,
}

impl Forward {
    /// Copies `pipe` line by line to the sink (flushed per line, so the log is live) and the
    /// log file, and keeps the lines.
    fn spawn(self, pipe: impl Read + Send + 'static) -> JoinHandle<()> {
        std::thread::spawn(move || {
            let mut reader = BufReader::new(pipe);
            let mut buf = Vec::new();
            loop {
                buf.clear();
                match reader.read_until(b'\n', &mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
                let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
                self.last_output_ms.store(ms, Ordering::Relaxed);
                let line = String::from_utf8_lossy(&buf);
                self.line(line.trim_end_matches(['\n', '\r']));
            }
        })
    }

    fn line(&self, line: &str) {
        let prefix = self.prefix.as_deref().unwrap_or_default();
        // A failed write to our own output or the log must not stop the forwarding.
        let _ = match self.sink {
            Sink::Stdout => writeln!(std::io::stdout().lock(), "{prefix}{line}"),
            Sink::Stderr => writeln!(std::io::stderr().lock(), "{prefix}{line}"),
        };
        if let Some(log) = &self.log {
            let _ = writeln!(log.lock().unwrap_or_else(|e| e.into_inner()), "{line}");
        }
        if let Some(keep) = &self.keep {
            keep.lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(line.to_owned());
        }
    }
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

#[cfg(test)]
mod tee_tests {
    use super::{TeeOptions, tee};
    use std::process::Command;
    use std::time::Duration;

    /// A command past its limit is killed with its group and reported as such, the lines it
    /// printed before kept; the stacks printed first do not stop the kill.
    #[test]
    fn a_command_past_its_limit_is_killed_with_what_it_printed() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo started; sleep 30 & wait"]);
        let t = tee(
            &mut cmd,
            &TeeOptions {
                timeout: Some(Duration::from_millis(500)),
                stacks_on_kill: true,
                ..TeeOptions::default()
            },
        )
        .unwrap();
        assert_eq!(t.killed.as_deref(), Some("timed out after 500ms"));
        assert_eq!(t.lines, ["started"]);
        assert!(t.status.is_some(), "reaped after the kill");
    }
}

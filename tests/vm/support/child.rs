//! A child process watched against a deadline: its output is drained while it runs (so a full
//! pipe never stalls it), its lines can be read as they come, and a run that overstays is
//! killed and reported as such, with how long it really took.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::Result;

/// A running child with stdout and stderr captured.
#[derive(Debug)]
pub struct Running {
    child: Option<Child>,
    what: String,
    start: Instant,
    stdout: Arc<Mutex<Vec<String>>>,
    readers: Vec<JoinHandle<()>>,
    stderr: Arc<Mutex<Vec<u8>>>,
}

/// How a run ended.
#[derive(Debug)]
pub struct Finished {
    pub what: String,
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    /// From spawn to exit.
    pub took: Duration,
    /// It was still running at the limit and was sent SIGKILL (a process stuck in the kernel
    /// dies only when the kernel lets go, so `took` can be much longer than the limit).
    pub overran: bool,
}

impl Finished {
    /// The exit code; `None` when a signal ended it.
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }

    /// One line for assertion messages.
    pub fn describe(&self) -> String {
        format!(
            "`{}` {} after {:.1?}{}; stdout: {:?}; stderr: {:?}",
            self.what,
            self.status,
            self.took,
            if self.overran {
                " (killed: it overran its limit)"
            } else {
                ""
            },
            self.stdout.trim(),
            self.stderr.trim()
        )
    }
}

impl Running {
    /// Spawns `cmd` with stdin closed and stdout/stderr captured.
    pub fn spawn(cmd: &mut Command) -> Result<Self> {
        let what = format!(
            "{} {}",
            cmd.get_program().to_string_lossy(),
            cmd.get_args()
                .map(|a| a.to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join(" ")
        );
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot run {what}: {e}"))?;
        let stdout = Arc::new(Mutex::new(Vec::new()));
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let mut readers = Vec::new();
        if let Some(out) = child.stdout.take() {
            let lines = Arc::clone(&stdout);
            readers.push(std::thread::spawn(move || {
                for line in BufReader::new(out).lines() {
                    let Ok(line) = line else { break };
                    lines.lock().unwrap().push(line);
                }
            }));
        }
        if let Some(mut err) = child.stderr.take() {
            let buf = Arc::clone(&stderr);
            readers.push(std::thread::spawn(move || {
                let mut chunk = [0u8; 4096];
                while let Ok(n) = err.read(&mut chunk) {
                    if n == 0 {
                        break;
                    }
                    buf.lock().unwrap().extend_from_slice(&chunk[..n]);
                }
            }));
        }
        Ok(Self {
            child: Some(child),
            what,
            start: Instant::now(),
            stdout,
            readers,
            stderr,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// Since spawn.
    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    /// Whether it is still running.
    pub fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// The stdout lines printed so far.
    pub fn lines(&self) -> Vec<String> {
        self.stdout.lock().unwrap().clone()
    }

    /// The stderr printed so far (lossy UTF-8).
    pub fn stderr_so_far(&self) -> String {
        String::from_utf8_lossy(&self.stderr.lock().unwrap()).into_owned()
    }

    /// Waits until it exits; past `limit` from spawn it is killed (and still waited for).
    pub fn wait(mut self, limit: Duration) -> Finished {
        let mut child = self.child.take().expect("waited twice");
        let mut overran = false;
        let status = loop {
            if let Ok(Some(status)) = child.try_wait() {
                break status;
            }
            if self.start.elapsed() >= limit {
                overran = true;
                let _ = child.kill();
                break child.wait().expect("wait for the killed child");
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let took = self.start.elapsed();
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
        Finished {
            what: self.what.clone(),
            status,
            stdout: self.stdout.lock().unwrap().join("\n"),
            stderr: String::from_utf8_lossy(&self.stderr.lock().unwrap()).into_owned(),
            took,
            overran,
        }
    }

    /// Kills it (a watcher that never ends on its own) and collects what it printed.
    pub fn kill(self) -> Finished {
        self.wait(Duration::ZERO)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Runs `cmd` to completion, killed past `limit`.
pub fn run_within(cmd: &mut Command, limit: Duration) -> Result<Finished> {
    Ok(Running::spawn(cmd)?.wait(limit))
}

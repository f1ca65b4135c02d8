//! One `lunkit batch` process kept for a whole row: lunkit as a program that links the
//! library (a CSI node plugin) runs it, one process for every operation.
//!
//! A spawned `lunkit` starts cold every time. Under TCG that costs more than the page faults
//! and cache misses it costs on hardware: QEMU 7.2 keys its translated code by virtual
//! address, and address-space randomisation puts the binary somewhere new in every process,
//! so every command's code is translated again. Here the code stays where it was, and the
//! rounds before a measured run (round 0 is never recorded) have it translated, as a
//! long-lived plugin has.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use crate::Result;

/// The line `lunkit batch` prints after each command's output.
const EXIT_PREFIX: &str = "lunkit-batch: exit ";

/// A running `lunkit batch`.
pub struct Resident {
    child: Child,
    stdin: ChildStdin,
    /// Its stdout, line by line, from a reader thread (so that a hung command costs the
    /// caller's timeout, not the bench).
    lines: Receiver<String>,
    /// Why it cannot be used any more: a command that did not end in time would still be
    /// running, and its output would be read as the next command's.
    dead: Option<String>,
}

/// What one command did in the resident process.
pub struct Reply {
    /// Its output, without the exit line.
    pub stdout: String,
    /// Its exit code.
    pub code: u8,
    /// From writing the line to reading its exit line.
    pub wall: Duration,
}

impl Resident {
    /// Starts `lunkit batch`; its stderr goes to ours.
    pub fn start(lunkit: &Path) -> Result<Resident> {
        let mut child = Command::new(lunkit)
            .arg("batch")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot run {} batch: {e}", lunkit.display()))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            let _ = child.wait();
            return Err("lunkit batch: no stdin or stdout pipe".into());
        };
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Resident {
            child,
            stdin,
            lines,
            dead: None,
        })
    }

    /// Runs one command line (`detach --wwid W --json`) and waits for its exit line, at
    /// most `timeout`. After a command that did not end, or a process that exited, every
    /// later call fails.
    pub fn run(&mut self, line: &str, timeout: Duration) -> Result<Reply> {
        if let Some(why) = &self.dead {
            return Err(format!("lunkit batch is not usable any more: {why}").into());
        }
        let result = self.exchange(line, timeout);
        if let Err(e) = &result {
            self.dead = Some(e.to_string());
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        result
    }

    fn exchange(&mut self, line: &str, timeout: Duration) -> Result<Reply> {
        let t0 = Instant::now();
        writeln!(self.stdin, "{line}")
            .and_then(|()| self.stdin.flush())
            .map_err(|e| format!("lunkit batch: writing {line:?}: {e}"))?;
        let mut stdout = String::new();
        loop {
            let left = timeout.saturating_sub(t0.elapsed());
            let got = match self.lines.recv_timeout(left) {
                Ok(l) => l,
                Err(RecvTimeoutError::Timeout) => {
                    return Err(format!("lunkit batch: {line:?} did not end in {timeout:?}").into());
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(format!("lunkit batch exited during {line:?}").into());
                }
            };
            if let Some(code) = got.strip_prefix(EXIT_PREFIX) {
                let code = code
                    .parse()
                    .map_err(|_| format!("lunkit batch: bad exit line {got:?}"))?;
                return Ok(Reply {
                    stdout,
                    code,
                    wall: t0.elapsed(),
                });
            }
            stdout.push_str(&got);
            stdout.push('\n');
        }
    }
}

impl Reply {
    /// Fails with the output unless the command exited 0.
    pub fn ok(self, what: &str) -> Result<Reply> {
        if self.code == 0 {
            Ok(self)
        } else {
            Err(format!(
                "`{what}` (resident) exited {}: {}",
                self.code,
                self.stdout.trim()
            )
            .into())
        }
    }
}

impl Drop for Resident {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

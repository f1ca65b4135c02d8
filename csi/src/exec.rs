//! The programs the plugin runs, and nothing else: `iscsiadm` to log in and out, `blkid` to
//! probe a device for a signature, `mkfs.ext4`/`mkfs.xfs` to format a blank one, and
//! `resize2fs`/`xfs_growfs` to grow a mounted filesystem. Each run is bounded by a deadline:
//! a program still running then is killed.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// A program the plugin may run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Program {
    /// open-iscsi's `iscsiadm`.
    Iscsiadm,
    /// util-linux's `blkid`.
    Blkid,
    /// e2fsprogs' `mkfs.ext4`.
    MkfsExt4,
    /// xfsprogs' `mkfs.xfs`.
    MkfsXfs,
    /// e2fsprogs' `resize2fs`.
    Resize2fs,
    /// xfsprogs' `xfs_growfs`.
    XfsGrowfs,
}

impl Program {
    /// Its name, looked up on `PATH`.
    pub fn name(self) -> &'static str {
        match self {
            Program::Iscsiadm => "iscsiadm",
            Program::Blkid => "blkid",
            Program::MkfsExt4 => "mkfs.ext4",
            Program::MkfsXfs => "mkfs.xfs",
            Program::Resize2fs => "resize2fs",
            Program::XfsGrowfs => "xfs_growfs",
        }
    }
}

/// What a finished program said.
#[derive(Debug, Clone)]
pub struct Output {
    /// Its exit code (`None`: killed by a signal).
    pub code: Option<i32>,
    /// Its standard output.
    pub stdout: String,
    /// Its standard error.
    pub stderr: String,
}

impl Output {
    /// `iscsiadm -m node ... exited 15: iscsiadm: ...`: the command and what it said.
    pub fn describe(&self, program: Program, args: &[&str]) -> String {
        let code = self
            .code
            .map_or_else(|| "was killed".to_owned(), |c| format!("exited {c}"));
        let said = self.stderr.trim();
        let said = if said.is_empty() {
            self.stdout.trim()
        } else {
            said
        };
        format!("{} {} {code}: {said}", program.name(), args.join(" "))
    }
}

/// Runs `program` with `args`, no standard input, and waits at most `timeout`. Output is
/// returned whatever the exit code; failing to start, or running past the deadline, is an
/// error naming the command.
pub fn run(program: Program, args: &[&str], timeout: Duration) -> Result<Output> {
    let shown = || format!("{} {}", program.name(), args.join(" "));
    // The one place the plugin starts a process: `program` is one of the listed ones.
    #[allow(clippy::disallowed_methods)]
    let mut child = Command::new(program.name())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Error::Program(format!("cannot run {}: {e}", shown())))?;
    // Drain both pipes on threads so that a chatty program cannot block on a full pipe.
    let mut out = child.stdout.take();
    let mut err = child.stderr.take();
    let out_t = std::thread::spawn(move || {
        let mut s = Vec::new();
        if let Some(o) = out.as_mut() {
            let _ = o.read_to_end(&mut s);
        }
        s
    });
    let err_t = std::thread::spawn(move || {
        let mut s = Vec::new();
        if let Some(e) = err.as_mut() {
            let _ = e.read_to_end(&mut s);
        }
        s
    });
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_millis(2);
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(Error::DeadlineExceeded(format!(
                    "{} did not finish in {:.1}s and was killed",
                    shown(),
                    timeout.as_secs_f64()
                )));
            }
            Ok(None) => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            Err(e) => return Err(Error::Program(format!("waiting for {}: {e}", shown()))),
        }
    };
    let stdout = String::from_utf8_lossy(&out_t.join().unwrap_or_default()).into_owned();
    let stderr = String::from_utf8_lossy(&err_t.join().unwrap_or_default()).into_owned();
    Ok(Output {
        code: status.code(),
        stdout,
        stderr,
    })
}

/// Runs `program` and fails unless it exits 0.
pub fn run_ok(program: Program, args: &[&str], timeout: Duration) -> Result<Output> {
    let out = run(program, args, timeout)?;
    if out.code == Some(0) {
        Ok(out)
    } else {
        Err(Error::Program(out.describe(program, args)))
    }
}

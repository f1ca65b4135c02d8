//! Running the lab's tools, with their stderr in the error when they fail.

use std::fs::File;
use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

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

/// `ip -batch -` with `commands` (one `ip` command line each, without `ip`) on its stdin:
/// the commands in order, in one process instead of one each (a process costs 0.1 to 1 s
/// under TCG). It stops at the first that fails, unless `keep_going` (`-force`: each is
/// tried, and the run fails if one did).
pub fn ip_batch(commands: &[String], keep_going: bool) -> Result<String> {
    use std::io::Write;
    let mut ip = Command::new("ip");
    if keep_going {
        ip.arg("-force");
    }
    let mut child = ip
        .args(["-batch", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run ip: {e}"))?;
    let script: String = commands.iter().map(|c| format!("{c}\n")).collect();
    let fed = child
        .stdin
        .take()
        .expect("stdin is piped")
        .write_all(script.as_bytes());
    let out = child.wait_with_output()?;
    if !out.status.success() || fed.is_err() {
        return Err(format!(
            "`ip -batch -` failed ({}) on:\n{script}stderr: {}; stdout: {}",
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

/// Loads each kernel module of `modules` that is not loaded yet (`modprobe`). A module
/// already in `/sys/module` (live, or built in) costs no process: a spawn takes 0.1 to 1 s
/// under TCG, and most tests need the same modules the test before them loaded.
pub fn modprobe(modules: &[&str]) -> Result<()> {
    for m in modules {
        if !module_loaded(m) {
            run("modprobe", &[m])?;
        }
    }
    Ok(())
}

/// Whether module `name` (`-` and `_` alike) is loaded and done initialising, or built in.
pub fn module_loaded(name: &str) -> bool {
    let dir = Path::new("/sys/module").join(name.replace('-', "_"));
    match std::fs::read_to_string(dir.join("initstate")) {
        Ok(state) => state.trim() == "live",
        // Built in: no initstate, but the directory (for its parameters).
        Err(_) => dir.is_dir() && !dir.join("refcnt").exists(),
    }
}

/// Whether a process with this command name (`/proc/PID/comm`) is running.
pub fn process_running(comm: &str) -> bool {
    !pids_of(comm).is_empty()
}

/// How a [`run_bounded`] run ended.
#[derive(Debug)]
pub struct Bounded {
    /// `None` when it could not be started or was still running at the limit.
    pub status: Option<std::process::ExitStatus>,
    pub stdout: String,
    pub stderr: String,
    /// It was still running at the limit: it was sent SIGKILL and abandoned.
    pub timed_out: bool,
}

impl Bounded {
    /// It ran to the end and exited 0.
    pub fn ok(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }

    /// Stdout, or a line saying why there is none worth reading.
    pub fn output_or_reason(&self, limit: Duration) -> String {
        if self.timed_out {
            format!("(no answer within {limit:?}; killed)\n{}", self.stdout)
        } else if self.ok() {
            self.stdout.clone()
        } else {
            let status = self
                .status
                .map_or_else(|| "not started".to_owned(), |s| s.to_string());
            format!("({status}) {}{}", self.stderr, self.stdout)
        }
    }
}

/// Runs `program args...` for at most `limit` and never longer: past it the child is sent
/// SIGKILL and abandoned without waiting, because a program blocked in the kernel on dead
/// storage (a queueing multipath map, a lost iSCSI session) dies only when the kernel lets
/// go. For diagnostics and cleanup, where a hung tool must not hold up everything after it.
pub fn run_bounded(program: &str, args: &[&str], limit: Duration) -> Bounded {
    let spawned = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            return Bounded {
                status: None,
                stdout: String::new(),
                stderr: format!("cannot run {program}: {e}"),
                timed_out: false,
            };
        }
    };
    let out = drain(child.stdout.take());
    let err = drain(child.stderr.take());
    let start = Instant::now();
    let mut pause = Duration::from_millis(5);
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if start.elapsed() < limit => {}
            _ => {
                let _ = child.kill();
                break None;
            }
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(50));
    };
    // A grandchild may hold the pipes open: read what is there, do not wait for the end.
    let grace = Instant::now() + Duration::from_millis(500);
    while status.is_some() && !(out.1.is_finished() && err.1.is_finished()) {
        if Instant::now() >= grace {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let text = |buf: &Arc<Mutex<Vec<u8>>>| {
        String::from_utf8_lossy(&buf.lock().unwrap_or_else(|e| e.into_inner())).into_owned()
    };
    Bounded {
        status,
        stdout: text(&out.0),
        stderr: text(&err.0),
        timed_out: status.is_none(),
    }
}

/// Reads a pipe to its end on a thread; the bytes so far are readable at any time.
fn drain(pipe: Option<impl Read + Send + 'static>) -> (Arc<Mutex<Vec<u8>>>, JoinHandle<()>) {
    let buf = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&buf);
    let handle = std::thread::spawn(move || {
        let Some(mut pipe) = pipe else { return };
        let mut chunk = [0u8; 8192];
        while let Ok(n) = pipe.read(&mut chunk) {
            if n == 0 {
                break;
            }
            sink.lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend_from_slice(&chunk[..n]);
        }
    });
    (buf, handle)
}

/// Pids of the live processes with this command name (`/proc/PID/comm`), ascending. Zombies
/// are left out: they hold nothing and only wait for their parent to reap them.
pub fn pids_of(comm: &str) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut pids: Vec<u32> = dir
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim_end() == comm)
                && !is_zombie(*pid)
        })
        .collect();
    pids.sort_unstable();
    pids
}

/// Whether `pid` has exited and waits to be reaped (state `Z` in `/proc/PID/stat`).
pub fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        // `PID (COMM) STATE ...`: COMM may hold spaces and parentheses, so split at the last `)`.
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            == Some("Z")
    })
}

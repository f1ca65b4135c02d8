//! The programs the plugin runs, and nothing else: `iscsiadm` to log in and out, `blkid` to
//! probe a device for a signature, `mkfs.ext4`/`mkfs.xfs` to format a blank one, and
//! `resize2fs`/`xfs_growfs` to grow a mounted filesystem. Each run is bounded by a deadline:
//! a program still running then is killed.
//!
//! **Secrets.** No secret is ever put on a command line: `/proc/PID/cmdline` is readable by
//! every local user (and any hostPID pod) while the program runs. CHAP passwords go into the
//! node record file instead ([`crate::iscsi::write_secrets`]). As a second line of defence,
//! everything this module writes into a message, the command line it ran and what the
//! program said, is passed through [`redact`] first: the value after `-v` of every `-n` name
//! that is a password ([`is_secret_name`]) is replaced by `<redacted>`, on the command line
//! and wherever it appears in the output.

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

/// What stands in a message for a secret value.
pub const REDACTED: &str = "<redacted>";

/// Whether an iscsiadm setting (`-n NAME`) holds a secret: the CHAP passwords of a node
/// record or a discovery record (`node.session.auth.password`, `..._in`,
/// `discovery.sendtargets.auth.password`, ...).
pub fn is_secret_name(name: &str) -> bool {
    let last = name.rsplit('.').next().unwrap_or(name);
    last == "password" || last == "password_in"
}

/// The secret values in `args`: each `-v VALUE` that follows a `-n NAME` for which
/// [`is_secret_name`] holds.
fn secret_values<'a>(args: &[&'a str]) -> Vec<&'a str> {
    let mut out = Vec::new();
    let mut name: Option<&str> = None;
    let mut i = 0;
    while i < args.len() {
        match args[i] {
            "-n" | "--name" if i + 1 < args.len() => {
                name = Some(args[i + 1]);
                i += 1;
            }
            "-v" | "--value" if i + 1 < args.len() => {
                if name.is_some_and(is_secret_name) && !args[i + 1].is_empty() {
                    out.push(args[i + 1]);
                }
                name = None;
                i += 1;
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// `text` with every occurrence of the secret values of `args` replaced by [`REDACTED`].
pub fn redact(text: &str, args: &[&str]) -> String {
    let mut secrets = secret_values(args);
    // Longest first, so that a secret containing another is replaced whole.
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    let mut out = text.to_owned();
    for s in secrets {
        out = out.replace(s, REDACTED);
    }
    out
}

/// The command line as messages show it: `iscsiadm -m node ... -v <redacted>`.
pub fn command_line(program: Program, args: &[&str]) -> String {
    let secrets = secret_values(args);
    let shown: Vec<&str> = args
        .iter()
        .map(|a| {
            if secrets.iter().any(|s| std::ptr::eq(*s, *a)) {
                REDACTED
            } else {
                *a
            }
        })
        .collect();
    // Whatever else might carry a secret (a value given twice, say) goes too.
    redact(&format!("{} {}", program.name(), shown.join(" ")), args)
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
    /// `iscsiadm -m node ... exited 15: iscsiadm: ...`: the command and what it said, with
    /// secret values [redacted](redact).
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
        format!(
            "{} {code}: {}",
            command_line(program, args),
            redact(said, args)
        )
    }
}

/// Runs `program` with `args`, no standard input, and waits at most `timeout`. Output is
/// returned whatever the exit code; failing to start, or running past the deadline, is an
/// error naming the command.
///
/// Every wait here is bounded. A program still running at the deadline is killed, and its
/// exit waited for at most [`REAP_GRACE`]: one that SIGKILL does not end at once (stuck in
/// the kernel, in `D` state, as an `mkfs` on a map queueing I/O is) is left to a thread that
/// reaps it whenever it ends, and the error says so. A program that exits while something it
/// started still holds its output pipes open is not waited for either: its output is what
/// came within [`REAP_GRACE`] of its exit.
pub fn run(program: Program, args: &[&str], timeout: Duration) -> Result<Output> {
    // The one place the plugin starts a process: `program` is one of the listed ones.
    #[allow(clippy::disallowed_methods)]
    let mut cmd = Command::new(program.name());
    cmd.args(args);
    run_command(cmd, &command_line(program, args), timeout)
}

/// How long a killed program's exit, or a finished program's output pipes, are waited for.
pub const REAP_GRACE: Duration = Duration::from_secs(2);

/// [`run`] of a prepared command, shown in messages as `shown`.
fn run_command(mut cmd: Command, shown: &str, timeout: Duration) -> Result<Output> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Error::Program(format!("cannot run {shown}: {e}")))?;
    // Drain both pipes on threads so that a chatty program cannot block on a full pipe.
    let out = drain(child.stdout.take());
    let err = drain(child.stderr.take());
    let deadline = Instant::now() + timeout;
    let status = match wait_until(&mut child, deadline) {
        Ok(Some(status)) => status,
        Ok(None) => {
            let _ = child.kill();
            let reaped = reap_within(child, REAP_GRACE);
            let what = if reaped {
                "was killed"
            } else {
                "was killed and has not exited (stuck in the kernel?); it is left to end on its own"
            };
            return Err(Error::DeadlineExceeded(format!(
                "{shown} did not finish in {:.1}s and {what}",
                timeout.as_secs_f64()
            )));
        }
        Err(e) => return Err(Error::Program(format!("waiting for {shown}: {e}"))),
    };
    let grace = Instant::now() + REAP_GRACE;
    let stdout = String::from_utf8_lossy(&collect(out, grace)).into_owned();
    let stderr = String::from_utf8_lossy(&collect(err, grace)).into_owned();
    Ok(Output {
        code: status.code(),
        stdout,
        stderr,
    })
}

/// A thread reading `pipe` to its end; what it reads arrives on the receiver as it comes.
fn drain(pipe: Option<impl Read + Send + 'static>) -> std::sync::mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let Some(mut p) = pipe else { return };
        let mut buf = vec![0u8; 8192];
        while let Ok(n) = p.read(&mut buf) {
            if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                break;
            }
        }
    });
    rx
}

/// What [`drain`] read until the pipe ended, or until `deadline` if it did not (a process
/// the program started holds it open).
fn collect(rx: std::sync::mpsc::Receiver<Vec<u8>>, deadline: Instant) -> Vec<u8> {
    let mut all = Vec::new();
    while let Ok(chunk) = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        all.extend(chunk);
    }
    all
}

/// Polls `child` until it exits or `deadline` passes (`None`).
fn wait_until(
    child: &mut std::process::Child,
    deadline: Instant,
) -> std::io::Result<Option<std::process::ExitStatus>> {
    let mut pause = Duration::from_millis(2);
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(None);
        }
        std::thread::sleep(pause.min(left));
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

/// Waits at most `grace` for `child` to exit; whether it did. One that has not is handed to
/// a thread that waits for it without limit, so that it is reaped (not left a zombie)
/// whenever it ends, and the caller goes on.
pub fn reap_within(mut child: std::process::Child, grace: Duration) -> bool {
    if let Ok(Some(_)) = wait_until(&mut child, Instant::now() + grace) {
        return true;
    }
    let pid = child.id();
    std::thread::spawn(move || {
        let status = child.wait();
        crate::log::note(
            crate::log::Level::Warn,
            &format!("process {pid}, left after its deadline, ended: {status:?}"),
        );
    });
    false
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

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWORD: &str = "s3cret-Pa55word";
    const MUTUAL: &str = "an0ther-s3cret";

    fn update_args<'a>() -> Vec<&'a str> {
        vec![
            "-m",
            "node",
            "-T",
            "iqn.2003-01.org.linux-iscsi.lunkit:lab",
            "-p",
            "127.0.0.1:3260",
            "-o",
            "update",
            "-n",
            "node.session.auth.username",
            "-v",
            "node-user",
            "-n",
            "node.session.auth.password",
            "-v",
            PASSWORD,
            "-n",
            "node.session.auth.password_in",
            "-v",
            MUTUAL,
        ]
    }

    #[test]
    fn passwords_are_secret_names_and_usernames_are_not() {
        for n in [
            "node.session.auth.password",
            "node.session.auth.password_in",
            "discovery.sendtargets.auth.password",
            "discovery.sendtargets.auth.password_in",
        ] {
            assert!(is_secret_name(n), "{n}");
        }
        for n in [
            "node.session.auth.username",
            "node.session.auth.password_length",
            "node.startup",
        ] {
            assert!(!is_secret_name(n), "{n}");
        }
    }

    #[test]
    fn the_command_line_shows_every_argument_but_the_passwords() {
        let args = update_args();
        let shown = command_line(Program::Iscsiadm, &args);
        assert!(!shown.contains(PASSWORD), "{shown}");
        assert!(!shown.contains(MUTUAL), "{shown}");
        assert!(
            shown.contains("-n node.session.auth.password -v <redacted>"),
            "{shown}"
        );
        assert!(
            shown.contains("-n node.session.auth.username -v node-user"),
            "{shown}"
        );
        assert!(shown.starts_with("iscsiadm -m node -T iqn."), "{shown}");
    }

    #[test]
    fn a_failing_iscsiadm_calls_error_does_not_contain_the_password() {
        let args = update_args();
        // A program that echoes its arguments back in its error.
        let out = Output {
            code: Some(7),
            stdout: String::new(),
            stderr: format!("iscsiadm: invalid value {PASSWORD} (and {MUTUAL})\n"),
        };
        let said = out.describe(Program::Iscsiadm, &args);
        assert!(!said.contains(PASSWORD), "{said}");
        assert!(!said.contains(MUTUAL), "{said}");
        assert!(
            said.contains("exited 7: iscsiadm: invalid value <redacted>"),
            "{said}"
        );
    }

    /// `sh -c SCRIPT` as [`run_command`] runs a program.
    #[allow(clippy::disallowed_methods)]
    fn sh(script: &str) -> Command {
        let mut c = Command::new("sh");
        c.args(["-c", script]);
        c
    }

    /// Runs `f` on a thread and fails the test if it has not returned after a minute: a
    /// guard against a hang (the runs below take a fraction of a second), not a timing.
    fn returns<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || tx.send(f()));
        rx.recv_timeout(Duration::from_secs(60))
            .expect("the call never returned")
    }

    #[test]
    fn a_program_that_hangs_is_killed_at_its_deadline() {
        let e = returns(|| run_command(sh("exec sleep 1000"), "sleep", Duration::from_millis(200)))
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::DeadlineExceeded, "{e}");
        assert!(e.to_string().contains("was killed"), "{e}");
    }

    #[test]
    fn output_held_open_by_what_a_program_left_running_is_not_waited_for() {
        // The program exits at once; the `sleep` it started keeps both pipes open.
        let out = returns(|| {
            run_command(
                sh("sleep 1000 & echo started $!"),
                "sh",
                Duration::from_secs(600),
            )
        })
        .unwrap();
        assert_eq!(out.code, Some(0));
        let pid: i32 = out
            .stdout
            .trim()
            .strip_prefix("started ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("the output that came: {:?}", out.stdout));
        let _ = rustix::process::kill_process(
            rustix::process::Pid::from_raw(pid).unwrap(),
            rustix::process::Signal::KILL,
        );
    }

    #[test]
    fn a_child_that_does_not_exit_is_left_to_a_reaper_not_waited_for() {
        // A child SIGKILL does not end at once stands in for one stuck in the kernel: this
        // one is not signalled at all.
        #[allow(clippy::disallowed_methods)]
        let child = Command::new("sleep").arg("1000").spawn().unwrap();
        let pid = child.id();
        let reaped = returns(move || reap_within(child, Duration::from_millis(100)));
        assert!(!reaped, "sleep 1000 exited within the grace");
        // Still there, left running; end it so the reaper thread reaps it.
        let gone = rustix::process::kill_process(
            rustix::process::Pid::from_raw(pid as i32).unwrap(),
            rustix::process::Signal::KILL,
        );
        assert!(gone.is_ok(), "the left child was still there: {gone:?}");
        // One that exits in time is reaped and reported so.
        #[allow(clippy::disallowed_methods)]
        let child = Command::new("true").spawn().unwrap();
        assert!(returns(move || reap_within(child, Duration::from_secs(30))));
    }

    #[test]
    fn redaction_leaves_text_without_secrets_alone() {
        let args = ["-m", "node", "-n", "node.startup", "-v", "manual"];
        assert_eq!(
            redact("node.startup = manual", &args),
            "node.startup = manual"
        );
        // An empty password is nothing to hide (and replacing "" would wreck the text).
        let args = ["-n", "node.session.auth.password", "-v", ""];
        assert_eq!(redact("abc", &args), "abc");
    }
}

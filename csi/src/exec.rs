//! The programs the plugin runs, and nothing else: `iscsiadm` to log in and out, `blkid` to
//! probe a device for a signature, `mkfs.ext4`/`mkfs.xfs` to format a blank one, and
//! `resize2fs`/`xfs_growfs` to grow a mounted filesystem. Each run is bounded by a deadline:
//! a program still running then is killed.
//!
//! **Children left in the kernel.** SIGKILL does not end a program blocked in uninterruptible
//! I/O: a `blkid` or `mkfs` on a map that queues with no path stays, with the device open,
//! until the I/O ends. One run on a device ([`run_on`]) is then listed in [`abandoned`] until
//! its reaper thread has reaped it: a later stage refuses to start another program on that
//! device, and an unstage waits for it ([`wait_abandoned`]) and names it, instead of finding
//! the plugin itself among the device's users.
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

use lunkit::block::BlockNode;

mod left;
pub use left::{Abandoned, abandoned, any_abandoned, wait_abandoned};

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
    run_with(program, args, None, timeout)
}

/// [`run`] of a program that opens the block device `device` (`blkid`, `mkfs`). One left at
/// its deadline still in the kernel is [registered](abandoned) with the device until it
/// ends, so that an unstage can tell the plugin's own opener from a user
/// ([`wait_abandoned`]); and while one is, a run of another program on that device is
/// refused ([`Error::Aborted`] naming it) rather than started to block beside it.
pub fn run_on(
    program: Program,
    args: &[&str],
    device: &BlockNode,
    timeout: Duration,
) -> Result<Output> {
    if let Some(stuck) = abandoned(device.dev).first() {
        return Err(Error::Aborted(format!(
            "{stuck}; {} is not run on {} until it ends",
            program.name(),
            device.path.display()
        )));
    }
    run_with(program, args, Some(device), timeout)
}

fn run_with(
    program: Program,
    args: &[&str],
    device: Option<&BlockNode>,
    timeout: Duration,
) -> Result<Output> {
    // The one place the plugin starts a process: `program` is one of the listed ones.
    #[allow(clippy::disallowed_methods)]
    let mut cmd = Command::new(program.name());
    cmd.args(args);
    let on = device.map(|d| (program, d));
    run_command(cmd, &command_line(program, args), on, timeout)
}

/// How long a killed program's exit, or a finished program's output pipes, are waited for.
pub const REAP_GRACE: Duration = Duration::from_secs(2);

/// [`run`] of a prepared command, shown in messages as `shown`.
/// `on`: the program and the device it opens, for [`run_on`].
fn run_command(
    mut cmd: Command,
    shown: &str,
    on: Option<(Program, &BlockNode)>,
    timeout: Duration,
) -> Result<Output> {
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
            let left = on.map(|(program, d)| Abandoned::new(child.id(), program, d));
            let reaped = reap_registered(child, REAP_GRACE, left);
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
pub fn reap_within(child: std::process::Child, grace: Duration) -> bool {
    reap_registered(child, grace, None)
}

/// [`reap_within`], with the child listed as `left` in [`abandoned`] from the moment it is
/// handed to its reaper until it has been reaped.
fn reap_registered(
    mut child: std::process::Child,
    grace: Duration,
    left: Option<Abandoned>,
) -> bool {
    if let Ok(Some(_)) = wait_until(&mut child, Instant::now() + grace) {
        return true;
    }
    let pid = child.id();
    if let Some(a) = &left {
        left::register(a.clone());
    }
    let spawned = std::thread::Builder::new()
        .name("lunkit-csi-reaper".into())
        .spawn(move || {
            let status = child.wait();
            if left.is_some() {
                left::forget(pid);
            }
            crate::log::note(
                crate::log::Level::Warn,
                &format!("process {pid}, left after its deadline, ended: {status:?}"),
            );
        });
    if spawned.is_err() {
        // No reaper: the entry stays, the child a zombie once it ends; an unstage of its
        // device says so rather than taking the device from under it.
        crate::log::note(
            crate::log::Level::Warn,
            &format!("process {pid}, left after its deadline, has no reaper thread"),
        );
    }
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
    use lunkit::DevNum;

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
        let e = returns(|| {
            run_command(
                sh("exec sleep 1000"),
                "sleep",
                None,
                Duration::from_millis(200),
            )
        })
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
                None,
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
    fn a_child_left_stuck_on_a_device_is_waited_for_named_and_blocks_another_run_on_it() {
        let device = BlockNode {
            name: "dm-lunkit-test".into(),
            dev: DevNum {
                major: 253,
                minor: 1 << 19,
            },
            path: "/dev/dm-lunkit-test".into(),
        };
        // `sleep`, not signalled, stands in for an mkfs stuck in the kernel after its kill.
        #[allow(clippy::disallowed_methods)]
        let child = Command::new("sleep").arg("1000").spawn().unwrap();
        let pid = child.id();
        let left = Abandoned::new(pid, Program::MkfsExt4, &device);
        let reaped =
            returns(move || reap_registered(child, Duration::from_millis(100), Some(left)));
        assert!(!reaped);
        assert_eq!(abandoned(device.dev).len(), 1);
        // Another program on the device is refused, naming the stuck one.
        let e = run_on(Program::Blkid, &["-p"], &device, Duration::from_secs(5)).unwrap_err();
        assert_eq!(e.code(), tonic::Code::Aborted, "{e}");
        for part in [&format!("pid {pid}"), "mkfs.ext4", "/dev/dm-lunkit-test"] {
            assert!(e.to_string().contains(part), "{part}: {e}");
        }
        // So is a filesystem grower (an expand while a stage's mkfs is stuck).
        let mnt = std::path::Path::new("/nonexistent-mount");
        let e = crate::fs::grow(&device, mnt, "ext4", Duration::from_secs(5)).unwrap_err();
        assert_eq!(e.code(), tonic::Code::Aborted, "{e}");
        assert!(e.to_string().contains("resize2fs is not run"), "{e}");
        // An unstage's wait ends at its deadline, naming it.
        let soon = Instant::now() + Duration::from_millis(100);
        let e = wait_abandoned(&device, soon).unwrap_err();
        assert_eq!(e.code(), tonic::Code::DeadlineExceeded, "{e}");
        assert!(e.to_string().contains(&format!("pid {pid}")), "{e}");
        // Once it ends, the wait returns and the registry forgets it.
        let _ = rustix::process::kill_process(
            rustix::process::Pid::from_raw(pid as i32).unwrap(),
            rustix::process::Signal::KILL,
        );
        let d = device.clone();
        returns(move || wait_abandoned(&d, Instant::now() + Duration::from_secs(50))).unwrap();
        assert!(abandoned(device.dev).is_empty());
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

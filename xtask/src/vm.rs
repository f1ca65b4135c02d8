//! Booting the guest with virtme-ng: the host root shared read-only, /etc and /var as
//! overlays (iscsid and multipathd state), TCG because /dev/kvm hangs on these machines.

use std::path::PathBuf;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use crate::process::{Tee, TeeOptions};
use crate::provision::{self, Lab};
use crate::{Result, process};

/// One guest run.
#[derive(Debug, Default)]
pub struct Boot {
    /// Host directories the guest may write (same path inside); never the root.
    pub rwdirs: Vec<PathBuf>,
    /// Kill the VM after this long.
    pub timeout: Option<Duration>,
    /// Kill the VM when it has printed nothing for this long (a hung guest).
    pub idle_timeout: Option<Duration>,
    /// More words for the guest kernel's command line (`norandmaps` for the bench).
    pub kernel_args: Vec<String>,
    /// A QEMU human monitor on this Unix socket, for [`crate::jit`] to read the code cache.
    pub monitor: Option<PathBuf>,
    /// The guest's name, put before each line it prints: several guests run side by side
    /// ([`crate::vmtests::run_suites`]).
    pub name: Option<String>,
    /// Append everything the guest prints (both streams) to this file too.
    pub log: Option<PathBuf>,
    /// More QEMU arguments (node A's and B's link, twonode.rs), each one word.
    pub qemu_opts: Vec<String>,
    /// Kill the guest once this is set (node B, when node A's run is over).
    pub stop: Option<Arc<AtomicBool>>,
}

impl Boot {
    /// Boots, runs `argv` as root in the guest, streams its stdout (stderr goes straight
    /// through) and returns its exit status with the stdout lines. A guest killed at a limit
    /// is an error.
    pub fn run(&self, lab: &Lab, argv: &[String]) -> Result<(ExitStatus, Vec<String>)> {
        let tee = self.run_tee(lab, argv)?;
        match (tee.status, tee.killed) {
            (Some(status), None) => Ok((status, tee.lines)),
            (_, why) => {
                Err(format!("the guest {}", why.unwrap_or_else(|| "was killed".into())).into())
            }
        }
    }

    /// [`run`](Self::run), but a guest killed at a limit is reported in the result, with
    /// the lines it printed until then.
    pub fn run_tee(&self, lab: &Lab, argv: &[String]) -> Result<Tee> {
        if argv.is_empty() {
            return Err("no command to run in the guest".into());
        }
        if let Some(why) = provision::kernel_unready(&lab.kernel, &lab.kernel_version) {
            return Err(format!("cannot boot kernel {}: {why}", lab.kernel_version).into());
        }
        let mut vng = vng(lab);
        // vng's argument parser takes a value that starts with '-' only after '='.
        if !self.kernel_args.is_empty() {
            vng.arg(format!("--append={}", self.kernel_args.join(" ")));
        }
        if let Some(sock) = &self.monitor {
            let sock = sock.to_str().filter(|s| !s.contains(',')).ok_or_else(|| {
                format!(
                    "monitor socket path {} is not UTF-8 or has a comma (QEMU's option separator)",
                    sock.display()
                )
            })?;
            vng.arg(format!(
                "--qemu-opts=-monitor unix:{sock},server=on,wait=off"
            ));
        }
        if !self.qemu_opts.is_empty() {
            // vng hands these to a shell: one word each, no quoting needed.
            if let Some(bad) = self.qemu_opts.iter().find(|o| {
                !o.chars()
                    .all(|c| c.is_ascii_alphanumeric() || ",=.:/_-+".contains(c))
            }) {
                return Err(
                    format!("QEMU option {bad:?} has characters the shell would take").into(),
                );
            }
            vng.arg(format!("--qemu-opts={}", self.qemu_opts.join(" ")));
        }
        for dir in &self.rwdirs {
            if dir.as_os_str().is_empty() || dir == &PathBuf::from("/") {
                return Err("refusing to give the guest write access to the host root".into());
            }
            vng.arg(format!("--rwdir={}", dir.display()));
        }
        // The kernel's console on stderr, for a guest that dies before its init says anything.
        if std::env::var_os("LUNKIT_VM_CONSOLE").is_some_and(|v| v == "1") {
            vng.arg("--verbose");
        }
        // vng joins several words with shlex (each stays one argument in the guest) and runs
        // a single word as a shell command line, like `sh -c`.
        vng.arg("--").args(argv);
        let prefix = self.name.as_ref().map(|n| format!("[{n}] "));
        eprintln!(
            "xtask: {}booting {} under TCG (about 15-20 s)",
            prefix.as_deref().unwrap_or_default(),
            lab.kernel_version
        );
        let start = Instant::now();
        let out = process::tee(
            &mut vng,
            &TeeOptions {
                timeout: self.timeout,
                idle_timeout: self.idle_timeout,
                merge_stderr: false,
                prefix: prefix.clone(),
                log: self.log.clone(),
                // The host's own tasks say nothing of where the guest waits.
                stacks_on_kill: false,
                stop: self.stop.clone(),
            },
        );
        eprintln!(
            "xtask: {}guest finished after {:.1} s",
            prefix.as_deref().unwrap_or_default(),
            start.elapsed().as_secs_f64()
        );
        out
    }
}

/// `vng --run KERNEL` with the lab's machine: TCG, 2 GiB, the lab's vCPUs, `/etc` and `/var` as
/// overlays, virtme-run on PATH, no stdin.
fn vng(lab: &Lab) -> Command {
    let mut vng = Command::new(lab.venv_bin.join("vng"));
    vng.arg("--run")
        .arg(&lab.kernel)
        .args(["--disable-kvm", "--memory", "2G", "--cpus"])
        .arg(lab.cpus.to_string())
        .args(["--overlay-rwdir", "/etc", "--overlay-rwdir", "/var"]);
    // vng runs virtme-run from its own bin/.
    let path = std::env::var_os("PATH").unwrap_or_default();
    let dirs = std::iter::once(lab.venv_bin.clone()).chain(std::env::split_paths(&path));
    if let Ok(joined) = std::env::join_paths(dirs) {
        vng.env("PATH", joined);
    }
    // QEMU must not read the terminal: the guest command gets no stdin.
    vng.stdin(Stdio::null());
    vng
}

/// Boots `lab`'s kernel once more with its console shown (`vng --verbose`), running only
/// `true`, and returns the console's last `n` lines with the exit status.
///
/// For a guest that ran nothing: one that panics before its init (no root, no modules)
/// exits 255 having printed nothing, and only the kernel's console says why. This boot is a
/// diagnosis, never a retry: the tests it follows stay failed.
pub fn console_tail(lab: &Lab, n: usize) -> Result<(String, Vec<String>)> {
    let mut cmd = Command::new("timeout");
    cmd.args(["--kill-after=10", "180"]);
    let inner = vng(lab);
    cmd.arg(inner.get_program())
        .args(inner.get_args())
        .arg("--verbose")
        .args(["--", "true"]);
    cmd.envs(inner.get_envs().filter_map(|(k, v)| Some((k, v?))));
    cmd.stdin(Stdio::null());
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run the diagnostic boot: {e}"))?;
    let text = String::from_utf8_lossy(&out.stderr) + String::from_utf8_lossy(&out.stdout);
    let lines: Vec<String> = text.lines().map(str::to_owned).collect();
    let tail = lines[lines.len().saturating_sub(n)..].to_vec();
    Ok((out.status.to_string(), tail))
}

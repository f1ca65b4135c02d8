//! The CSI plugin as the VM tests run it: its socket and state directory under a test's
//! base directory, started (as a binary or through a container), waited for, stopped with
//! a signal. Shared by `vm_csi`, `vm_csi_peers` and `vm_csi_obs` (`mod csi_plugin;`).
#![allow(dead_code)] // each test binary uses its own part of this module

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use lunkit_csi::Client;
use lunkit_csi::proto::{GetPluginInfoRequest, ProbeRequest};
use lunkit_lab::child::{Finished, Running};
use lunkit_lab::{cmd, wait};

/// What [`Plugin::start`] waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ready {
    /// Probe answers ready: the node has what the plugin needs.
    Probe,
    /// The plugin answers Identity at all (Probe may rightly fail: what a test checks).
    Answers,
}

/// A running plugin; dropping it stops it with SIGTERM and prints how it ended.
#[derive(Debug)]
pub struct Plugin {
    running: Option<Running>,
    socket: PathBuf,
}

impl Plugin {
    /// The plugin binary `cargo xtask test` built (`LUNKIT_CSI_BIN`).
    pub fn binary() -> Command {
        let bin =
            std::env::var("LUNKIT_CSI_BIN").expect("LUNKIT_CSI_BIN is set by cargo xtask test");
        Command::new(bin)
    }

    /// Where the plugin of a test based at `base` serves.
    pub fn socket(base: &str) -> PathBuf {
        Path::new(base).join("csi.sock")
    }

    /// Runs `command` (the binary, or a container running it) with its socket and state
    /// directory under `base`, node id `vm`, a 600 s deadline unless `args` name one (multipathd builds a map
    /// slowly under TCG: the plugin's own deadline, not the test's) and `args`; waits up to
    /// `limit` until it is `ready`.
    pub fn start(
        mut command: Command,
        base: &str,
        args: &[&str],
        ready: Ready,
        limit: Duration,
    ) -> Plugin {
        let socket = Plugin::socket(base);
        let endpoint = format!("unix://{}", socket.display());
        let state = format!("{base}/state");
        command.args(["--endpoint", &endpoint, "--nodeid", "vm"]);
        command.args(["--state-dir", &state]);
        // A test that needs a stage to give up soon names its own deadline.
        if !args.contains(&"--timeout") {
            command.args(["--timeout", "600"]);
        }
        let plugin = Plugin {
            running: Some(Running::spawn(command.args(args)).expect("start lunkit-csi")),
            socket,
        };
        wait::until("the plugin to answer", limit, || {
            let Ok(mut c) = Client::connect(&plugin.socket) else {
                return Ok(None);
            };
            Ok(match ready {
                Ready::Probe => c.probe(ProbeRequest {}).ok().map(drop),
                Ready::Answers => c.get_plugin_info(GetPluginInfoRequest {}).ok().map(drop),
            })
        })
        .expect("the plugin answers");
        plugin
    }

    /// A client on the plugin's socket.
    pub fn client(&self) -> Client {
        Client::connect(&self.socket).expect("connect to the plugin")
    }

    /// What the plugin logged so far (its stderr).
    pub fn log(&self) -> String {
        self.running
            .as_ref()
            .map_or_else(String::new, Running::stderr_so_far)
    }

    /// Stops the plugin with `signal` (`TERM`, `KILL`) and returns how it ended, waiting at
    /// most 30 s more.
    pub fn stop(mut self, signal: &str) -> Finished {
        let p = self.running.take().expect("the plugin runs");
        cmd::run_ignoring_failure("kill", &[&format!("-{signal}"), &p.pid().to_string()]);
        let limit = p.elapsed() + Duration::from_secs(30);
        p.wait(limit)
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        if let Some(p) = self.running.take() {
            cmd::run_ignoring_failure("kill", &["-TERM", &p.pid().to_string()]);
            let limit = p.elapsed() + Duration::from_secs(30);
            eprintln!("lunkit-csi: {}", p.wait(limit).describe());
        }
    }
}

/// Unmounts whatever a failed test left mounted under `base`, innermost first (lazily too
/// with `lazy`, for a mount a process still holds).
pub fn unmount_under(base: &str, lazy: bool) {
    let mut left: Vec<String> = fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(str::to_owned))
        .filter(|m| m.starts_with(base))
        .collect();
    left.sort_by_key(|m| std::cmp::Reverse(m.len()));
    for m in left {
        cmd::run_ignoring_failure("umount", &[&m]);
        if lazy {
            cmd::run_ignoring_failure("umount", &["-l", &m]);
        }
    }
}

//! Two nodes: a test binary in [`TWO_NODES`] runs in a boot of its own in which node A (the
//! guest that runs the tests, as every guest does) has a second guest, node B, beside it.
//! The two QEMUs share one virtual Ethernet link and nothing else: a `dgram` netdev over two
//! Unix datagram sockets in a directory of this boot's own under `target/xtask-vm/`, each
//! QEMU sending to the other's socket. Neither waits for the other (a frame sent before the
//! peer's QEMU is up is lost, like on a cable not yet plugged), so both boot at once; no
//! host interface, no TCP port, nothing reachable from the host's network. virtme-ng adds
//! no NIC of its own without `--net` (it passes `-net none`).
//!
//! In the guests: A puts [`node_b::A_ADDR`] on the link and its own initiator name before
//! its runner's baseline and takes the link down after its last test; B does the same with
//! [`node_b::B_ADDR`], takes its own lab baseline and runs the agent ([`agent`]) until the
//! host kills it when A's run is over. B is booted fresh with each boot of A, so whatever
//! B's state is when A ends dies with B's guest; between A's tests the test asks B's agent
//! to check and reset B's lab ([`node_b::NodeB::check_clean`]).

use std::io::BufReader;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use lunkit_lab::node_b::{self, Output, Request};

use crate::labstate::Snapshot;
use crate::overlay::Overlay;
use crate::process::Tee;
use crate::provision::Lab;
use crate::vm::Boot;
use crate::vmtests::VmTest;
use crate::{Result, host, paths, testrun};

/// Test binaries whose tests run with node B beside them.
pub const TWO_NODES: &[&str] = &["vm_two_nodes"];

/// vCPUs of each of the two guests: two guests of one fill the two cores the lab's one
/// guest of two does.
const NODE_CPUS: u8 = 1;

pub fn needs_two_nodes(test: &VmTest) -> bool {
    let krate = test.key.split("::").next().unwrap_or_default();
    TWO_NODES.contains(&krate)
}

/// The name of the guest pair's node A in the run's report (its log too).
pub fn guest_name(kernel_version: &str) -> String {
    format!("{kernel_version}:two-nodes")
}

/// The link's sockets: a directory per boot, removed when the boot is over.
struct Link {
    dir: PathBuf,
}

impl Link {
    fn new(boot_no: usize) -> Result<Link> {
        let dir = paths::target_dir()
            .join("xtask-vm")
            .join(format!("link-{}-{boot_no}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot make the link's directory {}: {e}", dir.display()))?;
        Ok(Link { dir })
    }

    /// QEMU's arguments for the node with `mac` sending from socket `me` to socket `peer`.
    fn qemu_opts(&self, mac: &str, me: &str, peer: &str) -> Vec<String> {
        let (me, peer) = (self.dir.join(me), self.dir.join(peer));
        vec![
            "-device".into(),
            format!("virtio-net-pci,netdev=lklink,mac={mac}"),
            "-netdev".into(),
            format!(
                "dgram,id=lklink,local.type=unix,local.path={},remote.type=unix,remote.path={}",
                me.display(),
                peer.display()
            ),
        ]
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Boots node A (`a`, running `a_argv`) and node B beside it on one link; B is killed when
/// A's guest ends. Returns A's run.
pub fn boot_pair(lab: &Lab, a: Boot, a_argv: &[String], boot_no: usize) -> Result<Tee> {
    let link = Link::new(boot_no)?;
    let lab = Lab {
        cpus: NODE_CPUS,
        ..lab.clone()
    };
    let stop = Arc::new(AtomicBool::new(false));
    let b_log = a.log.as_ref().map(|l| l.with_extension("node-b.log"));
    let b = Boot {
        timeout: a.timeout,
        name: Some("node-b".into()),
        log: b_log,
        qemu_opts: link.qemu_opts(node_b::B_MAC, "b.sock", "a.sock"),
        stop: Some(Arc::clone(&stop)),
        ..Boot::default()
    };
    let b_argv = host::guest_argv(&["node-b"])?;
    let a = Boot {
        qemu_opts: link.qemu_opts(node_b::A_MAC, "a.sock", "b.sock"),
        ..a
    };
    std::thread::scope(|s| {
        let b_run = s.spawn(|| b.run_tee(&lab, &b_argv));
        let a_run = a.run_tee(&lab, a_argv);
        stop.store(true, Ordering::Relaxed);
        match b_run.join() {
            Ok(Ok(tee)) if tee.killed.is_some() => {}
            Ok(Ok(tee)) => eprintln!(
                "xtask: [node-b] its guest ended before node A's run did ({}): node A's \
                 tests that used it failed",
                tee.status
                    .map_or_else(|| "not reaped".into(), |s| s.to_string())
            ),
            Ok(Err(e)) => eprintln!("xtask: [node-b] could not be booted: {e}"),
            Err(_) => eprintln!("xtask: [node-b] the thread running its guest panicked"),
        }
        a_run
    })
}

/// `xtask guest node-a LUNKIT PLAN`: node A joins the link, runs the plan's tests as
/// `run-tests` does, and leaves the link.
pub fn node_a(lunkit: &Path, plan: &Path) -> Result<u8> {
    let dev = node_b::join_link(node_b::A_MAC, node_b::A_ADDR, node_b::A_INITIATOR)?;
    println!(
        "xtask guest: node A on {dev} as {}/{}, initiator {}",
        node_b::A_ADDR,
        node_b::PREFIX,
        node_b::A_INITIATOR
    );
    let code = testrun::run_tests(lunkit, plan);
    node_b::leave_link(node_b::A_MAC);
    code
}

/// `xtask guest node-b`: node B joins the link, takes its lab's baseline and serves node A's
/// requests one at a time until its guest is killed.
pub fn agent() -> Result<u8> {
    let dev = node_b::join_link(node_b::B_MAC, node_b::B_ADDR, node_b::B_INITIATOR)?;
    let overlays = Overlay::baselines(testrun::OVERLAYS)?;
    let base = Snapshot::take();
    // Bound to the link's address only: B has no other interface but lo, and the agent
    // answers node A's address only.
    let listener = TcpListener::bind((node_b::B_ADDR, node_b::AGENT_PORT))
        .map_err(|e| format!("node B's agent cannot listen on its link address: {e}"))?;
    println!(
        "xtask guest: node B on {dev} as {}/{}, initiator {}; its agent listens on port {}, \
         up {:.1} s after its kernel started",
        node_b::B_ADDR,
        node_b::PREFIX,
        node_b::B_INITIATOR,
        node_b::AGENT_PORT,
        uptime()
    );
    for conn in listener.incoming() {
        let result = conn
            .map_err(Into::into)
            .and_then(|s| serve(s, &base, &overlays));
        if let Err(e) = result {
            println!("xtask guest: node B's agent: a request failed: {e}");
        }
    }
    Ok(0)
}

fn uptime() -> f64 {
    std::fs::read_to_string("/proc/uptime")
        .ok()
        .and_then(|u| u.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

/// One request: read, run, answer.
fn serve(mut stream: TcpStream, base: &Snapshot, overlays: &[Overlay]) -> Result<()> {
    let peer = stream.peer_addr()?;
    if peer.ip().to_string() != node_b::A_ADDR {
        return Err(format!("refused a connection from {peer}: only node A may ask").into());
    }
    // A peer that connects and says nothing must not hold the agent for ever.
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let req = Request::read_from(&mut BufReader::new(&stream))?;
    let t0 = Instant::now();
    let (what, out) = match req {
        Request::Run { cmd, deadline } => {
            let out = run(&cmd, deadline)?;
            (format!("`{cmd}`"), out)
        }
        Request::Check => ("the lab check".to_owned(), check(base, overlays)),
    };
    println!(
        "xtask guest: node B ran {what}: {} in {:.1} s",
        out.code
            .map_or_else(|| "killed".to_owned(), |c| format!("exit {c}")),
        t0.elapsed().as_secs_f64()
    );
    out.write_to(&mut stream)?;
    Ok(())
}

/// Runs `cmd` with `sh -c` in a process group of its own, killed (the whole group) at
/// `deadline`. Its output goes to files, not pipes: a daemon it starts (iscsid) keeps them
/// open, and the answer must not wait for that.
fn run(cmd: &str, deadline: Duration) -> Result<Output> {
    use std::os::unix::process::CommandExt;
    let (out_path, err_path) = ("/tmp/xtask-node-b.out", "/tmp/xtask-node-b.err");
    let mut child = Command::new("sh")
        .args(["-c", cmd])
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(out_path)?)
        .stderr(std::fs::File::create(err_path)?)
        .process_group(0)
        .spawn()
        .map_err(|e| format!("cannot run sh: {e}"))?;
    let start = Instant::now();
    let mut overran = false;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if !overran && start.elapsed() >= deadline {
            overran = true;
            // The command's own group only.
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", child.id())])
                .status();
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let read =
        |p: &str| String::from_utf8_lossy(&std::fs::read(p).unwrap_or_default()).into_owned();
    let out = Output {
        code: status.code(),
        overran,
        stdout: read(out_path),
        stderr: read(err_path),
    };
    let _ = std::fs::remove_file(out_path);
    let _ = std::fs::remove_file(err_path);
    Ok(out)
}

/// B's lab against its baseline, as the runner checks A's after each test, then reset: exit
/// 1 with what was left (and what the reset could not clean) on stdout.
fn check(base: &Snapshot, overlays: &[Overlay]) -> Output {
    let leaks = crate::labstate::check(base);
    testrun::reset(base, overlays);
    let left = testrun::still_dirty(base, overlays);
    let mut report = Vec::new();
    if !leaks.is_empty() {
        report.push(format!("LEAK on node B: {}", leaks.join("; ")));
    }
    if !left.is_empty() {
        report.push(format!(
            "not clean after node B's reset: {}",
            left.join("; ")
        ));
    }
    Output {
        code: Some(i32::from(!report.is_empty())),
        overran: false,
        stdout: report.join("\n"),
        stderr: String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_listed_binaries_boot_two_nodes() {
        let t = |key: &str| VmTest {
            key: key.into(),
            bin: "/t/x".into(),
            name: key.split("::").nth(1).unwrap_or("").into(),
        };
        assert!(needs_two_nodes(&t("vm_two_nodes::a_test")));
        assert!(!needs_two_nodes(&t("vm_dm::a_test")));
        assert!(!needs_two_nodes(&t("vm_two_nodes_x::a_test")));
    }

    #[test]
    fn each_node_sends_to_the_other_socket() {
        let link = Link {
            dir: PathBuf::from("/w/link"),
        };
        let a = link.qemu_opts(node_b::A_MAC, "a.sock", "b.sock");
        assert_eq!(a[1], "virtio-net-pci,netdev=lklink,mac=52:54:00:4c:4b:0a");
        assert!(
            a[3].contains("local.path=/w/link/a.sock,remote.type=unix,remote.path=/w/link/b.sock")
        );
        std::mem::forget(link);
    }
}

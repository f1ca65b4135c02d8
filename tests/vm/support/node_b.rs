//! The lab's second node: guest B, booted beside guest A (the one that runs the tests) for a
//! test binary that needs two nodes (`xtask/src/twonode.rs`). The two QEMUs share one
//! virtual Ethernet link and nothing else: A is [`A_ADDR`], B is [`B_ADDR`], on [`PREFIX`].
//! B runs an agent (`xtask guest node-b`) on [`B_ADDR`]:[`AGENT_PORT`] that runs the command
//! lines A's test sends it, as root, one at a time, each under a deadline; [`NodeB`] is A's
//! side of it.
//!
//! The protocol, one request per TCP connection (lengths in bytes, decimal):
//! - `RUN <deadline_ms> <len>\n` then the command line (`sh -c`), or `CHECK 0 0\n` (B's lab
//!   against its baseline, then reset);
//! - the answer: `DONE <code|-> <overran 0|1> <stdout_len> <stderr_len>\n`, then stdout,
//!   then stderr. `-`: no exit code (a signal ended it).

use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use super::{Result, cmd};

/// Guest A's address on the link (the one that runs the tests).
pub const A_ADDR: &str = "10.231.0.1";
/// Guest B's address on the link (the agent's).
pub const B_ADDR: &str = "10.231.0.2";
pub const PREFIX: u8 = 24;
/// The agent's TCP port on [`B_ADDR`].
pub const AGENT_PORT: u16 = 7413;
/// Each guest's link MAC, by which the guest finds its link (whatever udev names it).
pub const A_MAC: &str = "52:54:00:4c:4b:0a";
pub const B_MAC: &str = "52:54:00:4c:4b:0b";
/// Each guest's initiator name (`/etc/iscsi/initiatorname.iscsi`, its own overlay).
pub const A_INITIATOR: &str = "iqn.2026-12.org.lunkit:node-a";
pub const B_INITIATOR: &str = "iqn.2026-12.org.lunkit:node-b";
const INITIATOR_FILE: &str = "/etc/iscsi/initiatorname.iscsi";
/// A command's deadline when the caller gives none.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(120);
/// How long the agent may take to answer, beyond the command's own deadline (its kill, the
/// lab check and reset of `CHECK`).
const ANSWER_SLACK: Duration = Duration::from_secs(120);

/// What a command run on node B did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    /// `None`: a signal ended it (or the deadline's kill).
    pub code: Option<i32>,
    /// It was still running at its deadline and was killed.
    pub overran: bool,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    pub fn success(&self) -> bool {
        self.code == Some(0) && !self.overran
    }

    /// One line for assertion messages.
    pub fn describe(&self) -> String {
        format!(
            "exit {}{}; stdout: {:?}; stderr: {:?}",
            self.code
                .map_or_else(|| "by signal".to_owned(), |c| c.to_string()),
            if self.overran {
                " (killed at its deadline)"
            } else {
                ""
            },
            self.stdout.trim(),
            self.stderr.trim()
        )
    }
}

/// A request to the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    Run { cmd: String, deadline: Duration },
    Check,
}

impl Request {
    pub fn write_to(&self, w: &mut impl Write) -> std::io::Result<()> {
        match self {
            Request::Run { cmd, deadline } => {
                write!(w, "RUN {} {}\n{cmd}", deadline.as_millis(), cmd.len())?
            }
            Request::Check => w.write_all(b"CHECK 0 0\n")?,
        }
        w.flush()
    }

    pub fn read_from(r: &mut impl BufRead) -> Result<Request> {
        let mut head = String::new();
        r.read_line(&mut head)?;
        let words: Vec<&str> = head.split_whitespace().collect();
        let num = |s: &str| -> Result<u64> {
            s.parse()
                .map_err(|_| format!("bad number {s:?} in request {head:?}").into())
        };
        match words.as_slice() {
            ["RUN", ms, len] => {
                let body = read_exact(r, num(len)?)?;
                Ok(Request::Run {
                    cmd: String::from_utf8(body).map_err(|_| "the command is not UTF-8")?,
                    deadline: Duration::from_millis(num(ms)?),
                })
            }
            ["CHECK", ..] => Ok(Request::Check),
            _ => Err(format!("bad request {head:?}").into()),
        }
    }
}

impl Output {
    pub fn write_to(&self, w: &mut impl Write) -> std::io::Result<()> {
        let code = self.code.map_or_else(|| "-".to_owned(), |c| c.to_string());
        write!(
            w,
            "DONE {code} {} {} {}\n{}{}",
            u8::from(self.overran),
            self.stdout.len(),
            self.stderr.len(),
            self.stdout,
            self.stderr
        )?;
        w.flush()
    }

    pub fn read_from(r: &mut impl BufRead) -> Result<Output> {
        let mut head = String::new();
        r.read_line(&mut head)?;
        let bad = || format!("bad answer {head:?} from node B's agent");
        let words: Vec<&str> = head.split_whitespace().collect();
        let ["DONE", code, overran, out, err] = words.as_slice() else {
            return Err(bad().into());
        };
        let len = |s: &str| s.parse::<u64>().map_err(|_| bad());
        let (out, err) = (len(out)?, len(err)?);
        let text = |b: Vec<u8>| String::from_utf8_lossy(&b).into_owned();
        Ok(Output {
            code: if *code == "-" {
                None
            } else {
                Some(code.parse().map_err(|_| bad())?)
            },
            overran: *overran == "1",
            stdout: text(read_exact(r, out)?),
            stderr: text(read_exact(r, err)?),
        })
    }
}

fn read_exact(r: &mut impl Read, len: u64) -> Result<Vec<u8>> {
    if len > 64 << 20 {
        return Err(format!("a message of {len} bytes is more than node B's agent sends").into());
    }
    let mut buf = vec![0; len as usize];
    r.read_exact(&mut buf)?;
    Ok(buf)
}

/// Node B, seen from A's test.
#[derive(Debug, Clone)]
pub struct NodeB {
    addr: String,
}

/// Node B's agent; call [`NodeB::wait_until_up`] before the first command.
pub fn node_b() -> NodeB {
    NodeB {
        addr: format!("{B_ADDR}:{AGENT_PORT}"),
    }
}

impl NodeB {
    /// Runs `cmd` (a shell command line) on node B as root, killed after [`DEFAULT_DEADLINE`].
    pub fn run(&self, cmd: &str) -> Result<Output> {
        self.run_within(cmd, DEFAULT_DEADLINE)
    }

    /// Runs `cmd` on node B as root, killed after `deadline`.
    pub fn run_within(&self, cmd: &str, deadline: Duration) -> Result<Output> {
        self.ask(
            &Request::Run {
                cmd: cmd.to_owned(),
                deadline,
            },
            deadline + ANSWER_SLACK,
        )
        .map_err(|e| format!("node B could not run `{cmd}`: {e}").into())
    }

    /// Runs `cmd` on node B; an error unless it exits 0. Returns its stdout.
    pub fn ok(&self, cmd: &str) -> Result<String> {
        let out = self.run(cmd)?;
        if !out.success() {
            return Err(format!("on node B `{cmd}` failed: {}", out.describe()).into());
        }
        Ok(out.stdout)
    }

    /// Waits until the agent answers (B boots beside A and may come up later).
    pub fn wait_until_up(&self, deadline: Duration) -> Result<()> {
        if !super::sysfs::local_address(A_ADDR) {
            return Err(format!(
                "this guest has no {A_ADDR}: it is not node A of a two-node boot (add the \
                 test binary to TWO_NODES in xtask/src/twonode.rs)"
            )
            .into());
        }
        let start = Instant::now();
        loop {
            let err = match self.ask(
                &Request::Run {
                    cmd: "true".into(),
                    deadline: Duration::from_secs(30),
                },
                Duration::from_secs(60),
            ) {
                Ok(out) if out.success() => return Ok(()),
                Ok(out) => format!("`true` did not succeed: {}", out.describe()),
                Err(e) => e.to_string(),
            };
            if start.elapsed() >= deadline {
                return Err(format!(
                    "node B's agent at {} did not answer within {deadline:?}: {err} (is \
                     this test binary in xtask's TWO_NODES? see node-b's log)",
                    self.addr
                )
                .into());
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Node B's lab against its baseline: an error naming what the test left on B (the
    /// agent resets it either way, so the next test starts clean).
    pub fn check_clean(&self) -> Result<()> {
        let out = self.ask(&Request::Check, ANSWER_SLACK)?;
        if !out.success() {
            return Err(format!("node B's lab is not clean: {}", out.stdout.trim()).into());
        }
        Ok(())
    }

    fn ask(&self, req: &Request, limit: Duration) -> Result<Output> {
        let addr = self.addr.parse()?;
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        s.set_read_timeout(Some(limit))?;
        req.write_to(&mut s)?;
        Output::read_from(&mut BufReader::new(s))
    }
}

/// The network interface whose MAC is `mac`.
pub fn interface_with_mac(mac: &str) -> Option<String> {
    let dir = fs::read_dir("/sys/class/net").ok()?;
    dir.flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| super::sysfs::attr(format!("/sys/class/net/{n}/address")).as_deref() == Some(mac))
}

/// Puts `addr` on the link (the interface with `mac`) and brings it up, IPv6 off (no
/// neighbour discovery chatter); writes `initiator` as this guest's initiator name.
/// Returns the interface's name.
pub fn join_link(mac: &str, addr: &str, initiator: &str) -> Result<String> {
    // virtio_net is a module: udev may not have loaded it yet when the runner starts.
    cmd::modprobe(&["virtio_net"])?;
    let dev = super::wait::until(
        &format!("the link's interface (MAC {mac}; was the guest booted with the link?)"),
        Duration::from_secs(30),
        || Ok(interface_with_mac(mac)),
    )?;
    let _ = fs::write(format!("/proc/sys/net/ipv6/conf/{dev}/disable_ipv6"), "1");
    cmd::run(
        "ip",
        &["addr", "add", &format!("{addr}/{PREFIX}"), "dev", &dev],
    )?;
    cmd::run("ip", &["link", "set", &dev, "up"])?;
    fs::write(INITIATOR_FILE, format!("InitiatorName={initiator}\n"))
        .map_err(|e| format!("write {INITIATOR_FILE}: {e}"))?;
    Ok(dev)
}

/// Takes the link down and its address off (the end of the guest's run).
pub fn leave_link(mac: &str) {
    if let Some(dev) = interface_with_mac(mac) {
        cmd::run_ignoring_failure("ip", &["addr", "flush", "dev", &dev]);
        cmd::run_ignoring_failure("ip", &["link", "set", &dev, "down"]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_answers_round_trip() {
        for req in [
            Request::Run {
                cmd: "echo 'a\nb' | wc -l".into(),
                deadline: Duration::from_millis(1500),
            },
            Request::Check,
        ] {
            let mut buf = Vec::new();
            req.write_to(&mut buf).unwrap();
            assert_eq!(Request::read_from(&mut &buf[..]).unwrap(), req);
        }
        let out = Output {
            code: None,
            overran: true,
            stdout: "x\ny\n".into(),
            stderr: "é".into(),
        };
        let mut buf = Vec::new();
        out.write_to(&mut buf).unwrap();
        assert_eq!(Output::read_from(&mut &buf[..]).unwrap(), out);
        assert!(Output::read_from(&mut &b"DONE x 0 1 1\n"[..]).is_err());
        assert!(Request::read_from(&mut &b"RUN 1 99999999999\n"[..]).is_err());
    }
}

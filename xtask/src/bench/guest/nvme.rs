//! The NVMe/TCP rows (issue 15): one namespace of an nvmet subsystem brought in over two
//! ports and taken out again, on a node with udevd and multipathd running (multipathd leaves
//! NVMe to the kernel's native multipath, as on a real node).
//!
//! - `nvme-connect`: `lunkit attach --nvme-nqn` against both connect strings written to
//!   `/dev/nvme-fabrics` at once from this process (the kernel floor), and against what the
//!   peers do: `nvme connect` once per port, then a 1 s poll for the device.
//! - `nvme-disconnect`: `lunkit detach --nvme-nqn` against `1` written to both controllers'
//!   `delete_controller` at once (the floor), and against `nvme disconnect -n NQN`.
//! - `nvme-connect-all` (issue 35): the same namespace found through discovery, given only
//!   the first port's discovery service, which refers to the second's: `lunkit attach
//!   --discover` against `nvme connect-all` and a 1 s poll, and against the connect floor
//!   (the two connects alone, the entries known): discovery's own cost is in the ratio.
//!
//! The peak RSS column compares lunkit's process with nvme-cli's. Between runs the
//! controllers are made or deleted from this process and udev settles, so every run starts
//! from the same state: nothing connected before a connect, both paths live before a
//! disconnect.

use std::fs;
use std::io::{Read, Write};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use lunkit_lab::multipath::{self, Multipathd};
use lunkit_lab::nvmet::{PortConfig, Target as NvmetTarget};
use lunkit_lab::sysfs;

use super::{
    Ctx, QUIET, TIMEOUT, ms, poll_every, rounds, say, seqnum, settle, step_split, unavailable,
    warm_cpu,
};
use crate::Result;
use crate::bench::model::{Measurement, Run};
use crate::bench::proc::{self, subcommand_available};

/// The benchmark's subsystem: its own, so nothing else on the guest shares its controllers.
const NQN: &str = "nqn.2014-08.org.lunkit:bench-nvme";
/// The namespace every run brings in.
const NSID: u32 = 1;
const NS_BYTES: u64 = 64 << 20;
/// The host identity every method connects with, given explicitly to each.
const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:0b7f2f0e-6a3c-4d1e-9f11-3c9e5e1b2a40";
const HOSTID: &str = "0b7f2f0e-6a3c-4d1e-9f11-3c9e5e1b2a40";
const FABRICS: &str = "/dev/nvme-fabrics";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Connect {
    Lunkit,
    Floor,
    NvmeCli,
    /// `lunkit attach --discover` the first port.
    LunkitDiscover,
    /// `nvme connect-all` at the first port.
    NvmeCliConnectAll,
}

/// The referral on the first port to the second port's discovery service: discovery at the
/// first port then lists both paths (nvmet lists only a port's own subsystems).
const REFERRAL: &str = "bench-second-port";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Disconnect {
    Lunkit,
    Floor,
    NvmeCli,
}

/// The target on the lab's two ports, multipathd running, then both rows; everything is taken
/// down again whatever happened.
pub(super) fn phase(ctx: &mut Ctx) -> Result<()> {
    let ports = PortConfig::lab_pair();
    let mut target = NvmetTarget::builder()
        .nqn(NQN)
        .namespace_id(NSID, NS_BYTES)
        .build()?;
    let portals: Vec<String> = ports
        .iter()
        .map(|p| format!("{}:{}", p.traddr, p.trsvcid))
        .collect();
    let result = (|| -> Result<()> {
        let mpd = Multipathd::start(multipath::DEFAULT_CONF)?;
        let rows = (|| -> Result<()> {
            settle(ctx)?;
            connect_row(ctx, &ports, &portals)?;
            disconnect_row(ctx, &ports)?;
            let second = &ports[1];
            target.add_referral(ports[0].id, REFERRAL, &second.traddr, &second.trsvcid)?;
            let all = connect_all_row(ctx, &ports, &portals);
            target.remove_referral(ports[0].id, REFERRAL)?;
            all
        })();
        delete_controllers()?;
        let stopped = mpd.stop();
        rows?;
        stopped
    })();
    let _ = delete_controllers();
    let down = target.teardown();
    result?;
    down
}

/// The host's controllers of the benchmark's subsystem, from sysfs.
fn controllers() -> Vec<String> {
    sysfs::names("/sys/class/nvme")
        .into_iter()
        .filter(|c| sysfs::attr(format!("/sys/class/nvme/{c}/subsysnqn")).as_deref() == Some(NQN))
        .collect()
}

/// The namespace's native-multipath head (`nvmeXnY`) and how many controllers reach it:
/// its hidden path devices `nvmeXcZnY` under `/sys/block`.
fn head() -> Option<(String, usize)> {
    let subsys = sysfs::names("/sys/class/nvme-subsystem")
        .into_iter()
        .find(|s| {
            sysfs::attr(format!("/sys/class/nvme-subsystem/{s}/subsysnqn")).as_deref() == Some(NQN)
        })?;
    let dir = format!("/sys/class/nvme-subsystem/{subsys}");
    let name = sysfs::names(&dir).into_iter().find(|n| {
        n.starts_with("nvme")
            && sysfs::attr(format!("{dir}/{n}/nsid")).as_deref() == Some(&NSID.to_string())
    })?;
    // nvme0n1's paths are nvme0c<N>n1.
    let (subsys_no, ns) = name.strip_prefix("nvme")?.split_once('n')?;
    let prefix = format!("nvme{subsys_no}c");
    let paths = sysfs::names("/sys/block")
        .iter()
        .filter(|b| {
            b.strip_prefix(&prefix)
                .and_then(|rest| rest.split_once('n'))
                .is_some_and(|(c, n)| {
                    !c.is_empty() && c.bytes().all(|d| d.is_ascii_digit()) && n == ns
                })
        })
        .count();
    Some((name, paths))
}

/// Whether the namespace is there with a path through each of the two ports.
fn complete() -> bool {
    controllers().len() == 2 && head().is_some_and(|(_, paths)| paths == 2)
}

/// Waits until [`complete`], looking at once and then after 1, 2, 4, 8 and every 16 ms: a
/// hidden path sends no uevent to wait for, and a tighter loop would take from the guest's
/// two vCPUs the time the kernel needs to make it.
fn until_complete() -> Result<()> {
    let deadline = Instant::now() + TIMEOUT;
    let mut pause = Duration::from_millis(1);
    while !complete() {
        if Instant::now() >= deadline {
            return Err(format!("the head over both paths: not there after {TIMEOUT:?}").into());
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(16));
    }
    Ok(())
}

/// Deletes every controller of the subsystem and waits until they and the head are gone.
fn delete_controllers() -> Result<()> {
    for c in controllers() {
        let p = format!("/sys/class/nvme/{c}/delete_controller");
        if let Err(e) = fs::write(&p, "1") {
            if Path::new(&p).exists() {
                return Err(format!("write 1 to {p}: {e}").into());
            }
        }
    }
    lunkit_lab::wait::until_true("the subsystem's controllers to go", TIMEOUT, || {
        controllers().is_empty() && head().is_none()
    })
}

/// The option string `nvme connect` and lunkit write for one port.
fn options(port: &PortConfig) -> String {
    format!(
        "transport=tcp,traddr={},trsvcid={},nqn={NQN},hostnqn={HOSTNQN},hostid={HOSTID}",
        port.traddr, port.trsvcid
    )
}

/// One connect written to `/dev/nvme-fabrics` from this process; the kernel's reply
/// (`instance=N,cntlid=M`). The write returns once the controller is live.
fn write_connect(port: &PortConfig) -> Result<String> {
    let mut f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(FABRICS)
        .map_err(|e| format!("open {FABRICS}: {e}"))?;
    let opts = options(port);
    f.write_all(opts.as_bytes())
        .map_err(|e| format!("connect {opts}: {e}"))?;
    let mut reply = String::new();
    f.read_to_string(&mut reply)
        .map_err(|e| format!("read the reply to {opts}: {e}"))?;
    Ok(reply.trim().to_owned())
}

/// Both connects at once from this process, then until the head is there over both paths.
fn connect_floor(ports: &[PortConfig]) -> Result<()> {
    std::thread::scope(|s| -> Result<()> {
        let writes: Vec<_> = ports
            .iter()
            .map(|p| s.spawn(move || write_connect(p)))
            .collect();
        for w in writes {
            w.join().map_err(|_| "a connect write panicked")??;
        }
        Ok(())
    })
}

fn connect_row(ctx: &mut Ctx, ports: &[PortConfig], portals: &[String]) -> Result<()> {
    let lunkit = Measurement::new(
        "nvme-connect",
        "lunkit",
        "lunkit attach --nvme-nqn",
        &format!(
            "`lunkit attach --nvme-nqn NQN --nsid {NSID} --portal {} --portal {} --hostnqn H \
             --hostid I --json` (release build), spawn to exit: both ports connected at once, \
             then it returns once the native-multipath head is there with a path through both \
             controllers. udevd and multipathd run. The library time is `elapsed_us`.",
            portals[0], portals[1]
        ),
    );
    let floor = Measurement::new(
        "nvme-connect",
        "floor",
        "kernel floor",
        "from the benchmark process: both connect strings written to /dev/nvme-fabrics at \
         once (one thread each; a write returns once its controller is live), until an \
         independent netlink listener has the head's block `add` uevent and both hidden path \
         devices are in /sys/block (looked for after 1, 2, 4, 8, then every 16 ms: they send \
         no uevent). No spawn, no lookup, no check.",
    );
    let cli = Measurement::new(
        "nvme-connect",
        "nvme-cli",
        "nvme connect + 1 s poll (csi-driver-nvmf, os-brick)",
        "`nvme connect -t tcp -a ADDR -s PORT -n NQN --hostnqn H --hostid I` once per port, \
         one after the other, as the peers do, then the head and both paths checked at once \
         and every 1 s; spawn of the first to the check that sees them.",
    );
    let methods = [
        (Connect::Lunkit, lunkit),
        (Connect::Floor, floor),
        (Connect::NvmeCli, cli),
    ];
    connect_rounds(ctx, methods, ports, portals)
}

fn connect_all_row(ctx: &mut Ctx, ports: &[PortConfig], portals: &[String]) -> Result<()> {
    let lunkit = Measurement::new(
        "nvme-connect-all",
        "lunkit",
        "lunkit attach --discover",
        &format!(
            "`lunkit attach --nvme-nqn NQN --nsid {NSID} --discover {} --hostnqn H --hostid I \
             --json` (release build), spawn to exit: a discovery controller to the first \
             port, its log page read, the referral to the second port followed (a second \
             discovery controller), both deleted, then both paths connected at once and the \
             head waited for with a path through both. The library time is `elapsed_us`.",
            portals[0]
        ),
    );
    let floor = Measurement::new(
        "nvme-connect-all",
        "floor",
        "kernel floor (connects alone)",
        "as nvme-connect's floor: both connect strings written at once, the entries known \
         without asking discovery, until the head's `add` and both hidden paths.",
    );
    let cli = Measurement::new(
        "nvme-connect-all",
        "nvme-cli",
        "nvme connect-all + 1 s poll",
        "`nvme connect-all -t tcp -a ADDR -s PORT --hostnqn H --hostid I` at the first port \
         (it follows the referral and connects both paths, one after the other), then the \
         head and both paths checked at once and every 1 s; spawn to the check that sees them.",
    );
    let methods = [
        (Connect::LunkitDiscover, lunkit),
        (Connect::Floor, floor),
        (Connect::NvmeCliConnectAll, cli),
    ];
    connect_rounds(ctx, methods, ports, portals)
}

/// The rounds of a connect row whose `methods` are lunkit's, the floor and nvme-cli's, in
/// that order; lunkit's is said unavailable when its `attach` is missing, nvme-cli's when
/// it is not installed.
fn connect_rounds(
    ctx: &mut Ctx,
    methods: [(Connect, Measurement); 3],
    ports: &[PortConfig],
    portals: &[String],
) -> Result<()> {
    let [lunkit, floor, cli] = methods;
    let mut list = vec![floor, cli];
    match subcommand_available(&ctx.lunkit, "attach") {
        Ok(()) => list.insert(0, lunkit),
        Err(why) => unavailable(ctx, lunkit.1, why)?,
    }
    if Command::new("nvme").arg("version").output().is_err() {
        let cli = list.pop().expect("the nvme-cli method").1;
        unavailable(ctx, cli, "nvme-cli is not installed".to_owned())?;
    }
    rounds(ctx, &list, |ctx, m| connect_once(ctx, ports, portals, m)).map(|_| ())
}

/// `lunkit attach --nvme-nqn` with `how` (`--portal` or `--discover` arguments): the run's
/// wall, library time and peak RSS.
fn lunkit_attach(ctx: &Ctx, how: &[&str], run: &mut Run) -> Result<()> {
    let nsid = NSID.to_string();
    let mut cmd = Command::new(&ctx.lunkit);
    cmd.args(["attach", "--nvme-nqn", NQN, "--nsid", &nsid])
        .args(how)
        .args(["--hostnqn", HOSTNQN, "--hostid", HOSTID])
        .args(["--timeout", "60", "--json"]);
    let out = proc::timed(&mut cmd, true)?.ok("lunkit attach --nvme-nqn")?;
    run.wall_us = out.wall.as_micros() as u64;
    run.lib_us = proc::json_u64(&out.stdout, "elapsed_us");
    run.rss_kib = Some(out.rss_kib);
    Ok(())
}

fn connect_once(
    ctx: &mut Ctx,
    ports: &[PortConfig],
    portals: &[String],
    m: Connect,
) -> Result<Run> {
    if !controllers().is_empty() {
        return Err(format!("before the run: {:?} still connected", controllers()).into());
    }
    let seq0 = seqnum()?;
    let mut run = Run::default();
    warm_cpu();
    let t_start = Instant::now();
    let result = (|| -> Result<()> {
        match m {
            Connect::Lunkit => {
                let how = ["--portal", &portals[0], "--portal", &portals[1]];
                lunkit_attach(ctx, &how, &mut run)?;
            }
            Connect::LunkitDiscover => lunkit_attach(ctx, &["--discover", &portals[0]], &mut run)?,
            Connect::NvmeCliConnectAll => {
                let p = &ports[0];
                let out = proc::timed(
                    Command::new("nvme").args([
                        "connect-all",
                        "-t",
                        "tcp",
                        "-a",
                        &p.traddr,
                        "-s",
                        &p.trsvcid,
                        "--hostnqn",
                        HOSTNQN,
                        "--hostid",
                        HOSTID,
                    ]),
                    true,
                )?
                .ok("nvme connect-all")?;
                run.rss_kib = Some(out.rss_kib);
                poll_every(Duration::from_secs(1), "the head over both paths", complete)?;
                run.wall_us = t_start.elapsed().as_micros() as u64;
            }
            Connect::Floor => {
                connect_floor(ports)?;
                let add = ctx
                    .listener
                    .wait_for(seq0, t_start + TIMEOUT, |e| {
                        e.action == "add"
                            && e.subsystem == "block"
                            && e.devpath.contains("/nvme-subsystem/")
                    })
                    .ok_or_else(|| format!("no block add uevent for a head within {TIMEOUT:?}"))?;
                until_complete()?;
                run.add_us = Some(add.at.saturating_duration_since(t_start).as_micros() as u64);
                run.wall_us = t_start.elapsed().as_micros() as u64;
            }
            Connect::NvmeCli => {
                for p in ports {
                    let out = proc::timed(
                        Command::new("nvme").args([
                            "connect",
                            "-t",
                            "tcp",
                            "-a",
                            &p.traddr,
                            "-s",
                            &p.trsvcid,
                            "-n",
                            NQN,
                            "--hostnqn",
                            HOSTNQN,
                            "--hostid",
                            HOSTID,
                        ]),
                        true,
                    )?
                    .ok("nvme connect")?;
                    run.rss_kib = Some(run.rss_kib.unwrap_or(0).max(out.rss_kib));
                }
                poll_every(Duration::from_secs(1), "the head over both paths", complete)?;
                run.wall_us = t_start.elapsed().as_micros() as u64;
            }
        }
        Ok(())
    })();
    // Count what the run caused (udev's reactions too) before taking it down.
    ctx.listener.wait_quiet(QUIET, TIMEOUT);
    run.uevents = Some(seqnum()?.saturating_sub(seq0));
    let whole = complete();
    delete_controllers()?;
    settle(ctx)?;
    result?;
    if !whole {
        return Err("after the run the head did not have both paths".into());
    }
    Ok(run)
}

fn disconnect_row(ctx: &mut Ctx, ports: &[PortConfig]) -> Result<()> {
    let lunkit = Measurement::new(
        "nvme-disconnect",
        "lunkit",
        "lunkit detach --nvme-nqn",
        &format!(
            "`lunkit detach --nvme-nqn NQN --nsid {NSID} --json` (release build), spawn to \
             exit, of the namespace over two live controllers, nothing written: the in-use \
             check (mounts in every namespace, loop devices, holders, the /proc walk), the \
             flush, then `delete_controller` of both. The library time is `elapsed_us`."
        ),
    );
    let floor = Measurement::new(
        "nvme-disconnect",
        "floor",
        "kernel floor",
        "from the benchmark process: `1` written to both controllers' delete_controller at \
         once (one thread each; the write returns once the controller is gone), until both \
         writes returned and the listener has the head's block `remove` uevent. No check, no \
         flush.",
    );
    let cli = Measurement::new(
        "nvme-disconnect",
        "nvme-cli",
        "nvme disconnect -n NQN",
        "`nvme disconnect -n NQN` (deletes every controller of the subsystem; checks nothing), \
         spawn to exit.",
    );
    let mut list = vec![(Disconnect::Floor, floor), (Disconnect::NvmeCli, cli)];
    match subcommand_available(&ctx.lunkit, "detach") {
        Ok(()) => list.insert(0, (Disconnect::Lunkit, lunkit)),
        Err(why) => unavailable(ctx, lunkit, why)?,
    }
    if Command::new("nvme").arg("version").output().is_err() {
        let cli = list.pop().expect("the nvme-cli method").1;
        unavailable(ctx, cli, "nvme-cli is not installed".to_owned())?;
    }
    rounds(ctx, &list, |ctx, m| disconnect_once(ctx, ports, m)).map(|_| ())
}

fn disconnect_once(ctx: &mut Ctx, ports: &[PortConfig], m: Disconnect) -> Result<Run> {
    // Both paths live, made from this process, and udev done with them.
    connect_floor(ports)?;
    until_complete()?;
    settle(ctx)?;
    let seq0 = seqnum()?;
    let mut run = Run::default();
    warm_cpu();
    let t_start = Instant::now();
    let result = (|| -> Result<()> {
        match m {
            Disconnect::Lunkit => {
                let nsid = NSID.to_string();
                let out = proc::timed(
                    Command::new(&ctx.lunkit).args([
                        "detach",
                        "--nvme-nqn",
                        NQN,
                        "--nsid",
                        &nsid,
                        "--timeout",
                        "60",
                        "--json",
                    ]),
                    true,
                )?
                .ok("lunkit detach --nvme-nqn")?;
                run.wall_us = out.wall.as_micros() as u64;
                run.lib_us = proc::json_u64(&out.stdout, "elapsed_us");
                run.check_us = proc::json_step_us(&out.stdout, "check-in-use");
                run.steps = proc::json_steps(&out.stdout).unwrap_or_default();
                run.rss_kib = Some(out.rss_kib);
                say(&step_split(&run));
            }
            Disconnect::Floor => {
                let ctrls = controllers();
                std::thread::scope(|s| -> Result<()> {
                    let writes: Vec<_> = ctrls
                        .iter()
                        .map(|c| {
                            s.spawn(move || {
                                let p = format!("/sys/class/nvme/{c}/delete_controller");
                                fs::write(&p, "1").map_err(|e| format!("write 1 to {p}: {e}"))
                            })
                        })
                        .collect();
                    for w in writes {
                        w.join()
                            .map_err(|_| "a delete_controller write panicked")??;
                    }
                    Ok(())
                })?;
                ctx.listener
                    .wait_for(seq0, t_start + TIMEOUT, |e| {
                        e.action == "remove"
                            && e.subsystem == "block"
                            && e.devpath.contains("/nvme-subsystem/")
                    })
                    .ok_or_else(|| {
                        format!("no block remove uevent of the head within {TIMEOUT:?}")
                    })?;
                run.wall_us = t_start.elapsed().as_micros() as u64;
            }
            Disconnect::NvmeCli => {
                let out = proc::timed(Command::new("nvme").args(["disconnect", "-n", NQN]), true)?
                    .ok("nvme disconnect")?;
                run.wall_us = out.wall.as_micros() as u64;
                run.rss_kib = Some(out.rss_kib);
            }
        }
        Ok(())
    })();
    ctx.listener.wait_quiet(QUIET, TIMEOUT);
    run.uevents = Some(seqnum()?.saturating_sub(seq0));
    let left = controllers();
    if !left.is_empty() || head().is_some() {
        say(&format!(
            "nvme-disconnect: after {} the run left {left:?}",
            ms(run.wall_us)
        ));
        delete_controllers()?;
        settle(ctx)?;
        result?;
        return Err(format!("the run left controllers {left:?} or the head").into());
    }
    settle(ctx)?;
    result?;
    Ok(run)
}

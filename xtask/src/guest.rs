//! `xtask guest ...`: what the host commands run inside the guest. Not for direct use: it
//! loads modules and starts daemons on whatever machine it runs on, so it insists on
//! LUNKIT_VM=1, which only the host side sets.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use lunkit_lab::lab::{IscsiLab, LabConfig};
use lunkit_lab::scsi_debug::ScsiDebug;
use lunkit_lab::{VM_ENV, iscsi, multipath, udev};

use crate::process;
use crate::{Result, capture, testrun};

/// The fixture scenarios `cargo xtask fixtures` captures, by directory name.
pub const SCENARIOS: &[&str] = &["scsi-debug", "iscsi-multipath"];

pub fn main(args: &[String]) -> Result<u8> {
    if std::env::var(VM_ENV).as_deref() != Ok("1") {
        return Err(
            format!("`xtask guest` runs inside the VM only ({VM_ENV}=1 is not set)").into(),
        );
    }
    let (cmd, rest) = args.split_first().ok_or("guest: missing subcommand")?;
    match cmd.as_str() {
        "capture" => {
            let [scenario, dest] = rest else {
                return Err("usage: guest capture SCENARIO DEST".into());
            };
            capture_scenario(scenario, Path::new(dest))
        }
        "lab" => {
            let (lunkit, cmd) = rest
                .split_first()
                .ok_or("usage: guest lab LUNKIT_BIN [CMD...]")?;
            lab(Path::new(lunkit), cmd)
        }
        "run-tests" => {
            let [lunkit, plan] = rest else {
                return Err("usage: guest run-tests LUNKIT_BIN PLAN_FILE".into());
            };
            testrun::run_tests(Path::new(lunkit), Path::new(plan))
        }
        "node-a" => {
            let [lunkit, plan] = rest else {
                return Err("usage: guest node-a LUNKIT_BIN PLAN_FILE".into());
            };
            crate::twonode::node_a(Path::new(lunkit), Path::new(plan))
        }
        "node-b" => crate::twonode::agent(),
        other => Err(format!("unknown guest command {other:?}").into()),
    }
}

/// Builds a scenario, checks it is what the fixture claims, and captures sysfs.
fn capture_scenario(scenario: &str, dest: &Path) -> Result<u8> {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    match scenario {
        "scsi-debug" => {
            let sd = ScsiDebug::load(
                &[("add_host", "2"), ("num_tgts", "1"), ("max_luns", "4")],
                8,
            )?;
            let devices = sd.devices();
            if sd.hosts.len() != 2 || devices.len() != 8 {
                return Err(format!(
                    "expected 2 hosts x 4 LUNs, got hosts {:?} devices {devices:?}",
                    sd.hosts
                )
                .into());
            }
            udev::settle(Duration::from_secs(30))?;
            let note = format!(
                "`modprobe scsi_debug add_host=2 num_tgts=1 max_luns=4` on {}: hosts {:?}, devices {}. \
                 No multipathd.",
                kernel.trim(),
                sd.hosts,
                devices.join(" ")
            );
            let summary = capture::capture(Path::new("/"), dest, &note)?;
            eprintln!("xtask: captured {scenario}: {summary}");
            sd.unload()?;
        }
        "iscsi-multipath" => {
            let lab = IscsiLab::build(LabConfig::default())?;
            udev::settle(Duration::from_secs(30))?;
            let sessions: Vec<String> = lab
                .sessions
                .iter()
                .map(|s| format!("session{} on host{} via {}", s.sid, s.host, s.portal))
                .collect();
            let maps: Vec<String> = lab
                .maps
                .iter()
                .map(|m| format!("{} ({}: {})", m.name, m.dm, m.paths.join(",")))
                .collect();
            let note = format!(
                "LIO iSCSI target {iqn} built through configfs on {k} (tests/vm/support/lio.rs): \
                 {n} fileio LUNs of 16 MiB with vpd_unit_serial set, portals {portals}, \
                 generated node ACLs, no authentication. open-iscsi logged in through both portals \
                 with node.session.scan = manual ({sessions}); LUNs 0 and 1 scanned by hand on each \
                 session (`0 0 L` to hostN/scan); multipathd (user_friendly_names yes, \
                 find_multipaths no) built {maps}.",
                iqn = lab.config.target.iqn,
                k = kernel.trim(),
                n = lab.config.target.luns,
                portals = lab.config.target.portals.join(" and "),
                sessions = sessions.join(", "),
                maps = maps.join(" and "),
            );
            let summary = capture::capture(Path::new("/"), dest, &note)?;
            eprintln!("xtask: captured {scenario}: {summary}");
            lab.teardown()?;
        }
        other => {
            return Err(format!(
                "unknown scenario {other:?} (known: {})",
                SCENARIOS.join(", ")
            )
            .into());
        }
    }
    Ok(0)
}

/// The lab: 8 LUNs behind two portals, LUN 0 scanned on both sessions, multipathd running;
/// `lunkit list`, a one-LUN attach (LUN 1 on both sessions) with its latency, the list again,
/// then `cmd` if given.
fn lab(lunkit: &Path, cmd: &[String]) -> Result<u8> {
    let lab = IscsiLab::build(LabConfig {
        scan: vec![0],
        ..LabConfig::default()
    })?;
    println!(
        "lab: target {} with {} LUNs",
        lab.config.target.iqn, lab.config.target.luns
    );
    for s in iscsi::sessions() {
        println!("lab: session{} host{} portal {}", s.sid, s.host, s.portal);
    }
    for m in multipath::maps() {
        println!(
            "lab: map {} {} {} paths {}",
            m.name,
            m.dm,
            m.uuid,
            m.paths.join(",")
        );
    }
    println!("lab: $ lunkit list");
    let mut ok = run_shown(Command::new(lunkit).arg("list"))?;
    let iqn = lab.config.target.iqn.clone();
    println!("lab: $ lunkit scan iscsi --target {iqn} --lun 1");
    ok &= run_shown(Command::new(lunkit).args(["scan", "iscsi", "--target", &iqn, "--lun", "1"]))?;
    // Attach is done; write through the map multipathd builds, then take the volume off.
    let maps = multipath::wait_maps(2, lab.sessions.len())?;
    let wwid1 = std::fs::read_to_string(format!(
        "/sys/class/scsi_device/{}:0:0:1/device/wwid",
        lab.sessions[0].host
    ))?;
    let uuid1 = format!("mpath-3{}", wwid1.trim().trim_start_matches("naa."));
    let map = maps
        .iter()
        .find(|m| m.uuid == uuid1)
        .ok_or("no map for LUN 1")?;
    let t0 = std::time::Instant::now();
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(format!("/dev/{}", map.dm))?;
        let chunk: Vec<u8> = (0..1u32 << 20).map(|i| (i * 31 + 7) as u8).collect();
        for _ in 0..8 {
            f.write_all(&chunk)?;
        }
    }
    println!(
        "lab: wrote 8 MiB through {} ({}) with buffered writes, no fsync, in {:.1?}",
        map.name,
        map.dm,
        t0.elapsed()
    );
    println!("lab: $ lunkit detach --iscsi-target {iqn} --lun 1");
    ok &= run_shown(Command::new(lunkit).args(["detach", "--iscsi-target", &iqn, "--lun", "1"]))?;
    println!("lab: $ lunkit list");
    ok &= run_shown(Command::new(lunkit).arg("list"))?;
    if let Some((program, args)) = cmd.split_first() {
        println!("lab: $ {}", cmd.join(" "));
        ok &= run_shown(Command::new(program).args(args).env("LUNKIT_BIN", lunkit))?;
    }
    lab.teardown()?;
    Ok(if ok { 0 } else { 1 })
}

fn run_shown(cmd: &mut Command) -> Result<bool> {
    let status = cmd
        .status()
        .map_err(|e| format!("cannot run {}: {e}", process::describe(cmd)))?;
    if !status.success() {
        println!("lab: `{}` failed ({status})", process::describe(cmd));
    }
    Ok(status.success())
}

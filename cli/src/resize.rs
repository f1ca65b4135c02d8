//! `lunkit resize`: grow an attached volume online, on every path and its multipath map.

use std::time::Instant;

use clap::Args;
use lunkit::Root;
use lunkit::ops::{self, ResizeOptions, Resized};

use crate::teardown::VolumeArgs;

/// `lunkit resize`.
#[derive(Args)]
#[command(group = clap::ArgGroup::new("volume").required(true).args(["device", "wwid", "iscsi_target", "fc_wwpn", "nvme_nqn"]))]
#[command(group = clap::ArgGroup::new("nvme_namespace").args(["nsid", "nguid"]))]
pub struct Resize {
    #[command(flatten)]
    volume: VolumeArgs,
    /// Wait until every path reports this size in bytes (fail at the deadline, naming what
    /// each reports); already at it, nothing is rescanned.
    #[arg(long, value_name = "BYTES")]
    expect_size: Option<u64>,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 60.0, value_name = "SECS")]
    timeout: f64,
    /// Reload the map's table directly even when multipathd runs.
    #[arg(long)]
    no_multipathd: bool,
    /// Lock the volume within this process only, not with a file under /run/lunkit/locks.
    #[arg(long)]
    no_lock_file: bool,
    /// Print the result as one JSON object (also on failure).
    #[arg(long)]
    json: bool,
}

pub fn run(root: &Root, cmd: Resize) -> lunkit::Result<()> {
    let spec = cmd.volume.spec()?;
    let mut opts = ResizeOptions::new(root);
    opts.timeout = crate::seconds(cmd.timeout)?;
    opts.expect_size = cmd.expect_size;
    opts.use_multipathd = !cmd.no_multipathd;
    if cmd.no_lock_file {
        opts.lock_dir = None;
    }
    let t0 = Instant::now();
    let result = ops::resize(root, &spec, &opts);
    if cmd.json {
        let elapsed = t0.elapsed();
        let doc = serde_json::json!({
            "version": 1,
            "volume": spec.to_string(),
            "ok": result.is_ok(),
            "error": result.as_ref().err().map(ToString::to_string),
            "elapsed_us": micros(elapsed),
            "result": result.as_ref().ok().map(json),
        });
        println!("{doc}");
    } else if let Ok(r) = &result {
        print(r);
    }
    result.map(drop)
}

fn json(r: &Resized) -> serde_json::Value {
    serde_json::json!({
        "wwid": r.wwid.as_ref().map(|w| w.to_multipath()),
        "size": r.size(),
        "changed": r.changed(),
        "rescanned": r.rescanned,
        "paths": r.paths.iter().map(|p| serde_json::json!({
            "hctl": p.hctl.to_string(),
            "disk": p.disk,
            "before": p.before,
            "after": p.after,
        })).collect::<Vec<_>>(),
        "map": r.map.as_ref().map(|m| serde_json::json!({
            "name": m.name,
            "device": m.device,
            "before": m.before,
            "after": m.after,
            "by": m.by.as_str(),
        })),
        "nvme": r.nvme.as_ref().map(|n| serde_json::json!({
            "devices": n.devices.iter().map(|d| serde_json::json!({
                "device": d.device,
                "before": d.before,
                "after": d.after,
            })).collect::<Vec<_>>(),
            "reported": n.reported.iter().map(|(c, s)| serde_json::json!({
                "controller": c,
                "size": s,
            })).collect::<Vec<_>>(),
        })),
        "elapsed_us": micros(r.elapsed),
        "rescan_us": micros(r.rescan_elapsed),
        "map_us": micros(r.map_elapsed),
    })
}

fn micros(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

fn print(r: &Resized) {
    for p in &r.paths {
        println!("{:<24} {:>16} -> {:>16} bytes", p.device, p.before, p.after);
    }
    if let Some(n) = &r.nvme {
        for d in &n.devices {
            println!("{:<24} {:>16} -> {:>16} bytes", d.device, d.before, d.after);
        }
        for (c, size) in &n.reported {
            println!("{c:<24} reports {size:>16} bytes");
        }
    }
    if let Some(m) = &r.map {
        println!(
            "{:<24} {:>16} -> {:>16} bytes ({})",
            m.device,
            m.before,
            m.after,
            m.by.as_str()
        );
    }
    let what = if r.changed() { "resized" } else { "unchanged" };
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    println!(
        "{what}: {} bytes in {:.1} ms (rescans {:.1} ms, map {:.1} ms)",
        r.size(),
        ms(r.elapsed),
        ms(r.rescan_elapsed),
        ms(r.map_elapsed)
    );
}

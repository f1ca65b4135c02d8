//! `lunkit resize`: grow an attached volume online, on every path and its multipath map.

use std::time::Instant;

use clap::Args;
use lunkit::Root;
use lunkit::ops::{self, ResizeOptions, Resized};

use crate::json::{self, Layout};
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
        json::print(
            &json::resize::report(&spec, &result, t0.elapsed()),
            Layout::Line,
        );
    } else if let Ok(r) = &result {
        print(r);
    }
    result.map(drop)
}

fn print(r: &Resized) {
    let scsi = r.scsi();
    for p in scsi.iter().flat_map(|s| &s.paths) {
        outln!("{:<24} {:>16} -> {:>16} bytes", p.device, p.before, p.after);
    }
    if let Some(n) = r.nvme() {
        for d in &n.devices {
            outln!("{:<24} {:>16} -> {:>16} bytes", d.device, d.before, d.after);
        }
        for (c, size) in &n.reported {
            outln!("{c:<24} reports {size:>16} bytes");
        }
    }
    if let Some(m) = scsi.and_then(|s| s.map.as_ref()) {
        outln!(
            "{:<24} {:>16} -> {:>16} bytes ({})",
            m.device,
            m.before,
            m.after,
            m.by.as_str()
        );
    }
    let what = if r.changed() { "resized" } else { "unchanged" };
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    outln!(
        "{what}: {} bytes in {:.1} ms (rescans {:.1} ms, map {:.1} ms)",
        r.size(),
        ms(r.elapsed),
        ms(r.rescan_elapsed),
        ms(scsi.map_or(std::time::Duration::ZERO, |s| s.map_elapsed))
    );
}

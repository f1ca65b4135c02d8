//! `lunkit attach`: bring a volume in on every path at once, named as for `detach`.

use std::time::Instant;

use clap::Args;
use lunkit::ops::{self, AttachOptions};
use lunkit::{Root, Wwn};

use crate::scan::{Common, print, wait_udev};
use crate::teardown::VolumeArgs;

/// `lunkit attach`.
#[derive(Args)]
#[command(group = clap::ArgGroup::new("volume").required(true).args(["device", "wwid", "iscsi_target", "fc_wwpn"]))]
pub struct Attach {
    #[command(flatten)]
    volume: VolumeArgs,
    /// iSCSI: only sessions through this portal (ADDR:PORT, an IPv6 address in brackets);
    /// repeatable.
    #[arg(long = "portal", value_name = "ADDR:PORT")]
    portals: Vec<String>,
    /// FC: only through this local port (initiator WWPN); repeatable.
    #[arg(long = "initiator", value_name = "WWPN")]
    initiators: Vec<Wwn>,
    /// Also wait until multipathd has built the volume's map with every path that came.
    #[arg(long)]
    wait_map: bool,
    #[command(flatten)]
    common: Common,
}

pub fn run(root: &Root, cmd: Attach) -> lunkit::Result<()> {
    let spec = cmd.volume.spec()?;
    let mut opts = AttachOptions::new(root);
    opts.scan = cmd.common.options()?;
    opts.portals = cmd.portals;
    opts.initiators = cmd.initiators;
    opts.wait_map = cmd.wait_map;
    let start = Instant::now();
    let volume = ops::attach(root, &spec, &opts)?;
    let udev = wait_udev(
        root,
        &cmd.common,
        volume.devices(),
        start,
        opts.scan.timeout,
    )?;
    print(
        &volume.paths,
        volume.map.as_ref(),
        udev,
        start.elapsed(),
        cmd.common.json,
    );
    Ok(())
}

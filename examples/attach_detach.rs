//! Brings one iSCSI LUN onto the node, shows it, and takes it off again: the calls a CSI
//! node plugin makes in NodeStage and NodeUnstage, without the filesystem. Run as root on a
//! node logged in to the target (`iscsiadm -m node -T IQN -p PORTAL --login`, with manual
//! scans: lunkit scans the one LUN itself), with multipathd running:
//!
//! ```text
//! cargo run --example attach_detach -- iqn.2003-01.org.example:array 3
//! ```
//!
//! An NVMe/TCP namespace goes the same way, named
//! `VolumeSpec::Nvme { nqn, namespace: NamespaceSelector::Id(1) }` with the portals to
//! connect in `AttachOptions::nvme.connect`; the report is then `AttachedFamily::Nvme`, with
//! its devices, controllers and each portal's connect.

use std::process::ExitCode;
use std::time::Duration;

use lunkit::Root;
use lunkit::id::IscsiName;
use lunkit::ops::{self, AttachOptions, AttachedFamily, DetachOptions, VolumeSpec};

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let (Some(target), Some(lun)) = (args.next(), args.next()) else {
        eprintln!("usage: attach_detach IQN LUN");
        return ExitCode::from(2);
    };
    // A malformed name is refused here, with the forms an iSCSI name takes.
    let target: IscsiName = match target.parse() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let Ok(lun) = lun.parse::<u64>() else {
        eprintln!("LUN must be a number, not {lun:?}");
        return ExitCode::from(2);
    };
    match run(VolumeSpec::Iscsi { target, lun }) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Every error names what it was about; `kind()` is what a caller branches on
            // (the CLI maps it to its exit codes).
            eprintln!("{e} ({:?})", e.kind());
            ExitCode::FAILURE
        }
    }
}

fn run(spec: VolumeSpec) -> Result<(), lunkit::Error> {
    let root = Root::default();

    // Attach: every path of the LUN scanned at once, then multipathd's map awaited. The
    // timeout bounds the whole call, lock wait and map included.
    let mut attach = AttachOptions::new(&root);
    attach.scan.timeout = Duration::from_secs(30);
    attach.scsi.wait_map = true;
    let volume = ops::attach(&root, &spec, &attach)?;
    // The report says which family the volume is of, with only what applies to it.
    match &volume.family {
        AttachedFamily::Scsi(scsi) => {
            for path in &scsi.paths {
                println!("path {path}");
            }
            if let Some(map) = &scsi.map {
                println!("map  /dev/mapper/{} ({})", map.name, map.node.name);
            }
        }
        AttachedFamily::Nvme(nvme) => {
            for d in &nvme.devices {
                println!("namespace {d} via {}", nvme.controllers.join(", "));
            }
        }
        // Another family, in a later lunkit.
        _ => {}
    }
    println!("attached in {:?}", volume.elapsed);

    // Detach: checked unused, flushed, the map removed, every path deleted, in rounds until
    // nothing is left. Each step is reported as it ends.
    let mut detach = DetachOptions::new(&root);
    detach.timeout = Duration::from_secs(30);
    let report = ops::detach_with(&root, &spec, &detach, &mut |step| {
        println!(
            "{:<17} {:<28} {} ({:?})",
            step.kind.as_str(),
            step.target,
            step.outcome,
            step.duration
        );
    })?;
    println!(
        "detached in {:?} ({} round{})",
        report.duration,
        report.rounds,
        if report.rounds == 1 { "" } else { "s" }
    );
    Ok(())
}

//! Calling lunkit from async code (tokio).
//!
//! Every lunkit call blocks: it writes sysfs files, waits for uevents and issues ioctls,
//! and returns by the deadline its options set (`timeout`). In an async program, run each
//! call with `tokio::task::spawn_blocking`, so that it holds a thread of tokio's blocking
//! pool, never a worker thread that drives other tasks:
//!
//! - **The deadline is the library's.** Wrapping the call in `tokio::time::timeout` only
//!   stops *waiting* for it: a blocking call cannot be cancelled, and keeps its thread (and
//!   the volume's lock) until it returns by its own deadline. Set the option's `timeout`
//!   instead, and await the join handle.
//! - **Helper threads.** A kernel call that cannot be interrupted (a SCSI scan or delete
//!   write, opening a disk that a partition scan holds, `fsync` on a dead transport) runs on
//!   a lunkit helper thread, and at the deadline the call returns while the helper stays
//!   parked in the kernel until it comes back. There is at most one such thread per
//!   operation and device: the next call on that device waits for it (within its own
//!   deadline) instead of starting another. Idle helpers wait for work and exit after 60 s.
//!   A parked thread costs its stack mapping (virtual memory, little resident) and no CPU.
//!
//! This example lists the node's topology and looks up one volume on the blocking pool,
//! and prints the process's thread count before and after, to show what stays behind.
//!
//! ```text
//! cargo run --example async_caller -- 36001405a1b2c3d4e5f60718293a4b5c6
//! ```

use std::time::Duration;

use lunkit::ops::{self, VolumeSpec};
use lunkit::{Root, Topology};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    println!("threads at start: {}", threads());
    let root = Root::default();

    // Reading the topology is quick, but it is file I/O: still off the async workers.
    let r = root.clone();
    let topo = tokio::task::spawn_blocking(move || Topology::read(&r)).await??;
    println!(
        "{} SCSI devices, {} multipath maps, {} NVMe namespaces",
        topo.scsi_devices.len(),
        topo.multipath_maps().count(),
        topo.nvme_namespaces.len()
    );

    // One volume's state: what a CSI plugin checks before staging it. Several such calls
    // run side by side, each on its own blocking thread.
    if let Some(wwid) = std::env::args().nth(1) {
        let spec = VolumeSpec::Wwid(wwid.parse()?);
        let r = root.clone();
        let state = tokio::task::spawn_blocking(move || {
            let id = ops::volume::identify(&r, &spec)?;
            ops::volume::locate(&r, &id)
        })
        .await??;
        if state.is_empty() {
            println!("{wwid}: nothing of it is on the node");
        } else {
            println!("{wwid}: {}", state.describe());
        }
    }

    // An attach or detach goes the same way: its options' `timeout` bounds it, and the
    // join handle returns by then. For example:
    //
    //     let mut opts = ops::DetachOptions::new(&root);
    //     opts.timeout = Duration::from_secs(20);
    //     let report = tokio::task::spawn_blocking(move || ops::detach(&r, &spec, &opts)).await??;

    // tokio keeps idle blocking threads for 10 s, lunkit its idle helpers for 60 s: both
    // are parked, not spinning.
    tokio::time::sleep(Duration::from_millis(100)).await;
    println!("threads after: {}", threads());
    Ok(())
}

/// This process's thread count, from `/proc/self/status`.
fn threads() -> String {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Threads:").map(|n| n.trim().to_owned()))
        })
        .unwrap_or_else(|| "?".to_owned())
}

//! What the node has: SCSI devices, multipath maps and NVMe namespaces, read from sysfs
//! alone (no root needed). `lunkit list` prints the same snapshot with more columns.
//!
//! ```text
//! cargo run --example list            # the live node
//! cargo run --example list -- /host   # a node whose /sys, /dev and /proc are under /host
//! ```

use lunkit::{Root, Topology};

fn main() -> Result<(), lunkit::Error> {
    let root = match std::env::args_os().nth(1) {
        Some(dir) => Root::new(dir),
        None => Root::default(),
    };
    let topo = Topology::read(&root)?;

    println!("SCSI devices:");
    for d in &topo.scsi_devices {
        println!(
            "  {:<12} {:<8} {:<10} {}",
            d.hctl.to_string(),
            d.block.as_deref().unwrap_or("-"),
            d.state.as_deref().unwrap_or("?"),
            d.wwid.as_deref().unwrap_or("(no WWID)"),
        );
    }

    println!("multipath maps:");
    for map in topo.multipath_maps() {
        println!(
            "  {} ({}) WWID {} over {}",
            map.name.unwrap_or("?"),
            map.dm,
            map.wwid,
            map.paths.join(", "),
        );
        // A path that reports another WWID than the map's: a LUN re-mapped under the map.
        for (path, wwid) in &map.foreign_paths {
            println!("    {path} reports another volume: {wwid}");
        }
    }

    println!("NVMe namespaces:");
    for ns in &topo.nvme_namespaces {
        let paths: Vec<&str> = ns.paths.iter().map(|p| p.name.as_str()).collect();
        println!(
            "  {:<10} nsid {:<4} {:>14} bytes  {}  paths: {}",
            ns.name,
            ns.nsid.map_or("?".to_owned(), |n| n.to_string()),
            ns.size_bytes.map_or("?".to_owned(), |s| s.to_string()),
            ns.wwid.as_deref().unwrap_or("(no WWID)"),
            paths.join(", "),
        );
    }
    Ok(())
}

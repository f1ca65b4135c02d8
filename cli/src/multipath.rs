//! `lunkit multipath remove`: `multipath -f` without the tool.

use clap::Subcommand;
use lunkit::Root;
use lunkit::multipath::{self, RemoveOptions};

use crate::json::{self, Layout};

#[derive(Subcommand)]
pub enum Multipath {
    /// Flush and remove one multipath map and its partition maps.
    ///
    /// Exit 0 removed or deferred, 2 bad input, 3 no such map, 4 refused (in use, or no
    /// active path while I/O queues), 5 deadline passed.
    Remove {
        /// The map: a name, a WWID, dm-N, /dev/dm-N, /dev/mapper/NAME, or a path device.
        map: String,
        /// Give up after this many seconds (the map is left as it was found).
        #[arg(long, default_value_t = 30.0, value_name = "SECS")]
        timeout: f64,
        /// If the map is open, mark it for removal on its last close.
        #[arg(long)]
        deferred: bool,
        /// Remove even when no path is active and the map queues I/O: that I/O fails.
        #[arg(long)]
        force: bool,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
    },
}

pub fn run(root: &Root, cmd: Multipath) -> lunkit::Result<()> {
    match cmd {
        Multipath::Remove {
            map,
            timeout,
            deferred,
            force,
            json,
        } => {
            let mut opts = RemoveOptions::default();
            opts.timeout = crate::seconds(timeout)?;
            opts.deferred = deferred;
            opts.force = force;
            let r = multipath::remove(root, &map, &opts)?;
            let outcome = json::multipath::outcome(&r.outcome);
            if json {
                json::print(&json::multipath::Remove::from(&r), Layout::Line);
            } else {
                let via = if r.via_multipathd {
                    " by multipathd"
                } else {
                    ""
                };
                let parts = if r.partitions_removed.is_empty() {
                    String::new()
                } else {
                    format!(" with {}", r.partitions_removed.join(", "))
                };
                outln!("{} ({}) {outcome}{via}{parts}", r.map, r.kernel_name);
                if !r.resumed.is_empty() {
                    errln!(
                        "note: found suspended, resumed first: {}",
                        r.resumed.join(", ")
                    );
                }
                if let Some(why) = &r.multipathd_skipped {
                    errln!("note: done through device-mapper, not multipathd: {why}");
                }
            }
            Ok(())
        }
    }
}

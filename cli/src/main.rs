//! `lunkit`: bring one SCSI LUN in and take it out again, from the command line.

// The arguments' doc comments are clap's `--help` text, written as a user types an argument
// (`nqn.yyyy-mm.<reverse domain>[:<name>]`, `naa.<hex>`), not as HTML or links: rustdoc's
// reading of them as tags and links is of a binary's docs that nobody links to.
#![allow(rustdoc::invalid_html_tags, rustdoc::broken_intra_doc_links)]

// First: its macros (`outln!`, `out!`, `errln!`) are used by every module below.
#[macro_use]
mod out;
mod attach;
mod batch;
mod doctor;
mod human;
mod ids;
mod json;
mod multipath;
mod nvme;
mod pr;
mod resize;
mod scan;
mod teardown;
mod watch;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use lunkit::{ErrorKind, Root, Topology};

/// Exit codes shared by every command (README.md, "Exit codes").
mod exit {
    pub const OTHER: u8 = 1;
    pub const USAGE: u8 = 2;
    pub const NOT_FOUND: u8 = 3;
    pub const BUSY: u8 = 4;
    pub const TIMEOUT: u8 = 5;
}

#[derive(Parser)]
#[command(
    name = "lunkit",
    version,
    about = "Attach, detach and resize SCSI LUNs (iSCSI, FC, H:C:T:L) and NVMe/TCP namespaces, with their multipath maps, without shelling out",
    after_long_help = EXIT_CODES
)]
struct Cli {
    /// Directory that stands for / (where sys/, dev/, proc/, etc/ and run/ are); /host in a container
    /// that mounts the host there.
    #[arg(long, global = true, value_name = "DIR", default_value = "/")]
    root: PathBuf,

    #[command(subcommand)]
    command: Command,
}

/// The exit codes every command shares, at the end of `lunkit --help`.
const EXIT_CODES: &str = "Exit codes: 0 done (or nothing to do), 1 failed, 2 bad input (nothing \
was changed), 3 not found, 4 refused (in use), 5 deadline passed. `lunkit COMMAND --help` says \
which a command uses.";

// Each command's first paragraph is its one line in `lunkit --help` (and `-h`); the rest,
// exit codes included, is shown by `lunkit COMMAND --help` only.
#[derive(Subcommand)]
enum Command {
    /// Show the node's LUNs, devices, multipath maps, sessions, FC ports and NVMe controllers.
    ///
    /// One view of SCSI hosts and their LUNs, block devices, multipath maps, iSCSI sessions,
    /// FC ports and NVMe controllers. Exit 0 shown, 2 or 3 when the node could not be read.
    List {
        /// Print the stable JSON document (schema version 1) instead of the tree.
        #[arg(long)]
        json: bool,
    },
    /// Bring a volume in on every path at once: an iSCSI or FC target's LUN, or an NVMe namespace.
    ///
    /// Scans the LUN on every path at once (an iSCSI target and LUN, an FC target and LUN,
    /// or an H:C:T:L), lists every path's outcome and optionally waits for its multipath map;
    /// or connects an NVMe subsystem's portals and waits for its namespace. Options of
    /// another kind of volume than the one named are refused.
    ///
    /// Exit 0 when at least --min-paths came, 2 bad input, 3 when fewer came (none reported
    /// the LUN, or no session or port leads to the target), 5 when a path timed out.
    Attach(attach::Attach),
    /// Take a whole volume off the node, after checking that nothing uses it.
    ///
    /// Checks nobody uses the volume, flushes and removes its multipath map, flushes and
    /// deletes every path, and verifies nothing is left, retried until the deadline. An NVMe
    /// namespace is flushed and the controllers no other namespace needs are deleted.
    ///
    /// Exit 0 done (or nothing was there), 2 bad input, 4 refused (in use), 5 deadline passed.
    Detach(teardown::Detach),
    /// Grow an attached volume online, on every path and its multipath map.
    ///
    /// Rescans every path at once, checks they agree, then grows the multipath map (through
    /// multipathd when it runs); an NVMe namespace's controllers are asked its size and told
    /// to rescan. The filesystem is the caller's to grow.
    ///
    /// Exit 0 resized (or already the size), 1 refused (a path down, paths that disagree, a
    /// volume that shrank), 2 bad input, 3 no such volume, 4 refused (a path's LUN re-mapped
    /// by the array under the volume), 5 --expect-size not reached.
    Resize(resize::Resize),
    /// Delete one SCSI device after a flush, unless it is in use.
    ///
    /// Refused while the device is in use or a path of a live multipath map. An H:C:T:L that
    /// is already gone is success.
    ///
    /// Exit 0 deleted (or already gone), 2 bad input, 3 no such device, 4 refused (in use),
    /// 5 deadline passed.
    Delete(teardown::Delete),
    /// Write a block device's cached data to it and drop its page cache.
    ///
    /// An fsync, then BLKFLSBUF. Exit 0 flushed, 2 bad input, 3 no such device, 5 deadline
    /// passed.
    Flush(teardown::Flush),
    /// Connect, disconnect, rescan and discover NVMe over Fabrics controllers, without nvme-cli.
    #[command(subcommand)]
    Nvme(nvme::Nvme),
    /// Register, reserve, preempt and show SCSI-3 persistent reservations, without sg_persist.
    #[command(subcommand)]
    Pr(pr::Pr),
    /// Remove multipath maps without `multipath -f`.
    #[command(subcommand)]
    Multipath(multipath::Multipath),
    /// Scan exactly one LUN and wait until its block devices open.
    ///
    /// Exit 0 when at least --min-paths came, 2 bad input, 3 when fewer came, 5 when a path
    /// timed out.
    #[command(subcommand)]
    Scan(scan::Scan),
    /// Run commands read from stdin, one per line, in this one process.
    ///
    /// What a program that links the library (a CSI node plugin) pays per operation, without
    /// a process start each time. A line is split on whitespace (no quoting) and run as
    /// `lunkit LINE`, under this --root (a line cannot set its own); after its output comes
    /// the line `lunkit-batch: exit N`, N its exit code. Errors go to stderr as each command
    /// writes them. Empty lines and lines starting with `#` are skipped; `batch` and `watch`
    /// cannot be run inside. When stdout is closed, the line running ends and no other starts.
    ///
    /// With --at-once, every line is read first and all of them run at once, each on a
    /// thread of its own, as a CSI plugin stages many volumes during a node drain; each
    /// line's end is `lunkit-batch: line K exit N` (K its line number), and the last line is
    /// `lunkit-batch: all in T us`, from the first line's start to the last one's end. The
    /// output of lines running at once interleaves line by line; with --json each document
    /// is written whole.
    ///
    /// Exit 0 at the end of the input; 1 on a line that cannot be read (not UTF-8); 101,
    /// after that line's exit line, when a command panicked.
    Batch {
        /// Run every line at once instead of one after another.
        #[arg(long)]
        at_once: bool,
    },
    /// Find what earlier attaches and detaches left on the node; clean it up with --fix.
    ///
    /// Looks for SCSI devices the kernel set offline, paths an array re-mapped under a map,
    /// maps with no working path, iSCSI sessions nothing uses and NVMe controllers not live,
    /// each with the in-use check a detach makes. Changes nothing unless --fix: then cleans
    /// up what nothing uses (identity checked again before each write) and says for each
    /// finding what it did or why it left it.
    ///
    /// Exit 0 nothing found (or all of it cleaned up), 1 findings left, 2 a kind not known,
    /// 4 a finding left in use.
    Doctor(doctor::Doctor),
    /// Print kernel uevents as they arrive (like `udevadm monitor --kernel`).
    ///
    /// Runs until interrupted, or until stdout is closed.
    Watch {
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let code = if let Command::Batch { at_once } = cli.command {
        batch::run(&cli.root, at_once)
    } else {
        run(cli)
    };
    out::flush();
    // Output lost to a failed write (not a closed pipe) is a failure, as util-linux's.
    ExitCode::from(if code == 0 && out::failed() {
        exit::OTHER
    } else {
        code
    })
}

/// Runs one parsed command line; its exit code.
fn run(cli: Cli) -> u8 {
    let root = Root::new(cli.root);
    let result = match cli.command {
        Command::List { json } => list(&root, json),
        Command::Doctor(cmd) => return doctor::run(&root, cmd),
        Command::Scan(cmd) => scan::run(&root, cmd),
        Command::Multipath(cmd) => multipath::run(&root, cmd),
        Command::Nvme(cmd) => nvme::run(&root, cmd),
        Command::Pr(cmd) => pr::run(&root, cmd),
        Command::Watch { json } => watch::run(json),
        Command::Attach(cmd) => attach::run(&root, cmd),
        Command::Detach(cmd) => teardown::detach(&root, cmd),
        Command::Resize(cmd) => resize::run(&root, cmd),
        Command::Delete(cmd) => teardown::delete(&root, cmd),
        Command::Flush(cmd) => teardown::flush(&root, cmd),
        Command::Batch { .. } => Err(batch::nested("batch")),
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            errln!("lunkit: {}", e);
            exit_code(&e)
        }
    }
}

fn exit_code(e: &lunkit::Error) -> u8 {
    match e.kind() {
        ErrorKind::NotFound => exit::NOT_FOUND,
        ErrorKind::Invalid => exit::USAGE,
        // A RESERVATION CONFLICT is the array refusing, as a device in use is the kernel.
        ErrorKind::Busy | ErrorKind::Unverified | ErrorKind::ReservationConflict => exit::BUSY,
        ErrorKind::Timeout => exit::TIMEOUT,
        // A device that is not the volume expected stays "any other error", as before the
        // library gave it a kind of its own.
        ErrorKind::WwidMismatch => exit::OTHER,
        _ => exit::OTHER,
    }
}

/// The longest `--timeout` accepted: one day. A detach, scan or flush that has not finished
/// in a day is stuck, and a caller who asks for more has most likely typed a wrong unit.
pub(crate) const MAX_TIMEOUT_SECS: f64 = 86_400.0;

/// Parses a `--timeout` in seconds (fractions allowed), at most [`MAX_TIMEOUT_SECS`].
pub(crate) fn seconds(s: f64) -> lunkit::Result<std::time::Duration> {
    if s > MAX_TIMEOUT_SECS {
        return Err(lunkit::Error::invalid(
            "timeout",
            &s.to_string(),
            "must be at most 86400 seconds (one day)",
        ));
    }
    std::time::Duration::try_from_secs_f64(s).map_err(|_| {
        lunkit::Error::invalid(
            "timeout",
            &s.to_string(),
            "must be a non-negative number of seconds",
        )
    })
}

fn list(root: &Root, as_json: bool) -> lunkit::Result<()> {
    let topo = Topology::read(root)?;
    if as_json {
        json::print(&json::list::List::from(&topo), json::Layout::Pretty);
    } else {
        out!("{}", human::render(&topo));
    }
    Ok(())
}

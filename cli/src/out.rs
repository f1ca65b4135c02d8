//! Everything `lunkit` writes goes through here, never through `println!`.
//!
//! `println!` panics when stdout is a closed pipe (`lunkit list --json | head -1`: "failed
//! printing to stdout: Broken pipe", exit 101), and Rust programs ignore SIGPIPE, so the
//! write error is all there is. [`outln!`] and [`out!`] write to stdout and, once a write has
//! failed, drop the rest of the output: the command then ends as it would have, quietly, with
//! its own exit code. It is not cut short where it stands: a `detach` whose reader went away
//! still finishes taking the volume off, rather than leave it half done. `watch`, which never
//! ends by itself, and `batch`, between lines, ask [`closed`] and stop.
//!
//! A failure other than a closed pipe (a full disk behind `> file`) is said once on stderr
//! and turns a success into exit 1 ([`failed`]), as util-linux's `close_stdout` does.
//! [`errln!`] writes to stderr and ignores its failures: there is nowhere left to report them.

use std::fmt;
use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, Ordering};

/// A write to stdout failed: nothing more is written there.
static CLOSED: AtomicBool = AtomicBool::new(false);
/// The failure was not a closed pipe: the output the caller wanted is lost.
static FAILED: AtomicBool = AtomicBool::new(false);

/// Writes `args` to stdout, unless an earlier write failed.
pub fn write_out(args: fmt::Arguments<'_>) {
    if CLOSED.load(Ordering::Relaxed) {
        return;
    }
    // One lock per call: a line written by one thread of `batch --at-once` stays whole.
    let mut out = io::stdout().lock();
    if let Err(e) = out.write_fmt(args) {
        stop(&e);
    }
}

/// Flushes stdout (at the end of the command), so a late failure counts too.
pub fn flush() {
    if CLOSED.load(Ordering::Relaxed) {
        return;
    }
    if let Err(e) = io::stdout().lock().flush() {
        stop(&e);
    }
}

/// Drops the rest of the output after the write error `e`, saying why unless the reader
/// just went away.
fn stop(e: &io::Error) {
    if CLOSED.swap(true, Ordering::Relaxed) {
        return;
    }
    if e.kind() != io::ErrorKind::BrokenPipe {
        FAILED.store(true, Ordering::Relaxed);
        write_err(format_args!(
            "lunkit: writing to stdout failed ({e}): the rest of the output is lost\n"
        ));
    }
}

/// Whether stdout is gone: the reader closed it, or writing to it failed.
pub fn closed() -> bool {
    CLOSED.load(Ordering::Relaxed)
}

/// Whether output was lost for another reason than a closed pipe.
pub fn failed() -> bool {
    FAILED.load(Ordering::Relaxed)
}

/// Writes `args` to stderr; a failure there is ignored (nowhere is left to say it).
pub fn write_err(args: fmt::Arguments<'_>) {
    let _ = io::stderr().lock().write_fmt(args);
}

/// `println!` that never panics: see the module's documentation.
macro_rules! outln {
    () => {
        $crate::out::write_out(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::out::write_out(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `print!` that never panics.
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::out::write_out(format_args!($($arg)*))
    };
}

/// `eprintln!` that never panics.
macro_rules! errln {
    ($($arg:tt)*) => {
        $crate::out::write_err(format_args!("{}\n", format_args!($($arg)*)))
    };
}

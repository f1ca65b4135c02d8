//! `lunkit batch`: commands read from stdin, run in this one process, one after another or
//! all at once (`--at-once`).

use std::ffi::OsStr;
use std::io::BufRead;
use std::path::Path;
use std::time::Instant;

use clap::Parser;

use crate::{Cli, Command, exit};

/// The exit code of a Rust program that panicked.
const PANIC: u8 = 101;

/// Runs stdin's lines under `root`: one after another, or every line at once (`at_once`).
pub(crate) fn run(root: &Path, at_once: bool) -> u8 {
    if at_once {
        return all_at_once(root);
    }
    for line in std::io::stdin().lock().lines() {
        // Nobody reads the answers any more: the line that was running has ended, and the
        // next ones are not started.
        if crate::out::closed() {
            break;
        }
        let Some(line) = read(line) else {
            return exit::OTHER;
        };
        let Some(words) = command(&line) else {
            continue;
        };
        let Some(code) = one_line(root, &words) else {
            // A panic is a bug, after which this process's state is not to be trusted: the
            // line gets its exit line (the panic's own code) and the batch ends.
            outln!("lunkit-batch: exit {PANIC}");
            return PANIC;
        };
        outln!("lunkit-batch: exit {code}");
    }
    0
}

/// Every line read first, then all run at once, each on a thread of its own. A line that
/// panicked gets its exit line like the others; the batch then exits with the panic's code
/// once every line has ended (no thread can be stopped half-way).
fn all_at_once(root: &Path) -> u8 {
    let mut lines = Vec::new();
    for line in std::io::stdin().lock().lines() {
        let Some(line) = read(line) else {
            return exit::OTHER;
        };
        lines.push(line);
    }
    let start = Instant::now();
    let lroot = lunkit::Root::new(root);
    let walks_before = lunkit::block::walks_started(&lroot);
    // The detaches start together: one walk over the processes serves all their checks.
    let _gathering =
        lunkit::block::gather_checks(&lroot, detaches(root, &lines), lunkit::ops::BATCH_GATHER);
    let panicked = std::thread::scope(|s| {
        let threads: Vec<_> = lines
            .iter()
            .enumerate()
            .filter_map(|(i, line)| command(line).map(|words| (i + 1, words)))
            .map(|(number, words)| {
                s.spawn(move || {
                    let code = one_line(root, &words);
                    outln!("lunkit-batch: line {number} exit {}", code.unwrap_or(PANIC));
                    code.is_none()
                })
            })
            .collect();
        // A thread's own panic is caught in `one_line`; a join error is one in the println.
        // Every thread is joined before the answer.
        let ended: Vec<bool> = threads
            .into_iter()
            .map(|t| t.join().unwrap_or(true))
            .collect();
        ended.contains(&true)
    });
    let walks = lunkit::block::walks_started(&lroot) - walks_before;
    let plural = if walks == 1 { "" } else { "s" };
    outln!("lunkit-batch: {walks} walk{plural} over the processes");
    outln!("lunkit-batch: all in {} us", start.elapsed().as_micros());
    if panicked { PANIC } else { 0 }
}

/// A batch line's `words` as the command line of its own `lunkit --root ROOT …`.
fn argv<'a>(root: &'a Path, words: &'a [&'a str]) -> impl Iterator<Item = &'a OsStr> {
    [OsStr::new("lunkit"), OsStr::new("--root"), root.as_os_str()]
        .into_iter()
        .chain(words.iter().map(OsStr::new))
}

/// How many of `lines` are detaches (as `one_line` will parse them).
fn detaches(root: &Path, lines: &[String]) -> usize {
    lines
        .iter()
        .filter_map(|l| command(l))
        .filter(|words| {
            matches!(
                Cli::try_parse_from(argv(root, words)),
                Ok(Cli {
                    command: Command::Detach(_),
                    ..
                })
            )
        })
        .count()
}

/// A line of stdin, or `None` after saying why it could not be read.
fn read(line: std::io::Result<String>) -> Option<String> {
    line.map_err(|e| errln!("lunkit: batch: reading stdin (a line that is not UTF-8?): {e}"))
        .ok()
}

/// A line's words, or `None` for an empty line or a comment.
fn command(line: &str) -> Option<Vec<&str>> {
    let words: Vec<&str> = line.split_whitespace().collect();
    (!words.first().is_none_or(|w| w.starts_with('#'))).then_some(words)
}

/// Runs one batch line (`words`) under `root`: its exit code, `None` if it panicked.
fn one_line(root: &Path, words: &[&str]) -> Option<u8> {
    // The batch's root is every line's: a line of its own would be a second, silent one
    // (clap lets a global option given after the subcommand override the one before it).
    if words
        .iter()
        .any(|w| *w == "--root" || w.starts_with("--root="))
    {
        errln!(
            "lunkit: {}",
            lunkit::Error::invalid(
                "batch line",
                &words.join(" "),
                "sets --root: give it to `lunkit batch` instead",
            )
        );
        return Some(exit::USAGE);
    }
    match Cli::try_parse_from(argv(root, words)) {
        // `watch` never returns, and a batch in a batch would read the same stdin.
        Ok(Cli {
            command: Command::Watch { .. },
            ..
        }) => {
            errln!("lunkit: {}", nested("watch"));
            Some(exit::USAGE)
        }
        Ok(cli) => std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| crate::run(cli))).ok(),
        Err(e) => {
            // Usage errors go to stderr; `--help` and `--version` print to stdout.
            let _ = e.print();
            Some(if e.use_stderr() { exit::USAGE } else { 0 })
        }
    }
}

/// The error for a command that `batch` cannot run.
pub(crate) fn nested(command: &str) -> lunkit::Error {
    lunkit::Error::invalid("batch line", command, "cannot be run inside `lunkit batch`")
}

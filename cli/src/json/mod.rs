//! Every `--json` document the `lunkit` command prints, schema version [`SCHEMA_VERSION`].
//!
//! These structs are the stable contract (documented in README.md, "JSON output"): they are
//! built here from the library's types rather than derived on them, so refactoring the library
//! cannot change the output by accident. Every document carries `"version"` first, the same
//! number for every command; within a version fields are added, never renamed or removed.
//! The commands only build these and hand them to [`print()`]: no JSON is put together anywhere
//! else.
//!
//! One module per command: [`list`], [`scan`] (`scan` and a SCSI `attach`), [`attach`] (an
//! NVMe `attach`), [`detach`], [`resize`], [`teardown`] (`flush`, `delete`), [`multipath`]
//! (`multipath remove`), [`nvme`] (`nvme connect`, `disconnect`, `rescan`), [`discovery`]
//! (`nvme discover`), [`pr`] (`pr show`), [`doctor`] and [`watch`].
//! `batch` prints each line's own document.

pub mod attach;
pub mod detach;
pub mod discovery;
pub mod doctor;
pub mod list;
pub mod multipath;
pub mod nvme;
pub mod pr;
pub mod resize;
pub mod scan;
pub mod teardown;
pub mod watch;

use std::time::Duration;

use serde::Serialize;

/// Version of every document's schema; bumped only on an incompatible change.
pub const SCHEMA_VERSION: u32 = 1;

/// How a document is laid out on stdout. Each command keeps the layout it always had:
/// scripts (and `cargo xtask bench`) read `detach` and `resize` as one line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Indented over several lines (`list`, `scan`, `attach`).
    Pretty,
    /// One line (`detach`, `resize`, `flush`, `delete`, `multipath remove`, `nvme`, each
    /// event of `watch`).
    Line,
}

/// The text of `doc`, laid out as `layout` says.
pub fn to_text<T: Serialize>(doc: &T, layout: Layout) -> String {
    // These documents are plain structs of strings, numbers and string-keyed maps, which
    // serde_json always serializes.
    match layout {
        Layout::Pretty => serde_json::to_string_pretty(doc),
        Layout::Line => serde_json::to_string(doc),
    }
    .expect("a JSON document of plain structs serializes")
}

/// Prints `doc` on stdout, laid out as `layout` says.
pub fn print<T: Serialize>(doc: &T, layout: Layout) {
    outln!("{}", to_text(doc, layout));
}

/// A duration in whole microseconds, the unit of every `*_us` field (saturating: a `u64` of
/// microseconds is over 500,000 years).
pub fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// A duration in milliseconds with fractions, the unit of every `*_ms` field.
pub fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The document of a command that reports also when it fails (`resize`, `nvme connect`,
/// `nvme disconnect`): what it was asked (`subject`, its fields inlined), whether it
/// worked, and its `result` when it did.
#[derive(Debug, Serialize)]
pub struct Report<S, R> {
    pub version: u32,
    #[serde(flatten)]
    pub subject: S,
    pub ok: bool,
    /// The error's message when it failed, else `null`.
    pub error: Option<String>,
    /// The whole command, as the CLI measured it.
    pub elapsed_us: u64,
    /// What the library returned; `null` on failure. It comes after `elapsed_us`, so the
    /// last `elapsed_us` in the text is the library's own (`cargo xtask bench` reads it so).
    pub result: Option<R>,
}

impl<S, R> Report<S, R> {
    /// The report of a call that took `elapsed` and returned `result`, its success turned
    /// into its document by `f`.
    pub fn new<T>(
        subject: S,
        result: &lunkit::Result<T>,
        elapsed: Duration,
        f: impl FnOnce(&T) -> R,
    ) -> Self {
        Report {
            version: SCHEMA_VERSION,
            subject,
            ok: result.is_ok(),
            error: result.as_ref().err().map(ToString::to_string),
            elapsed_us: micros(elapsed),
            result: result.as_ref().ok().map(f),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    #[derive(Serialize)]
    struct Subject {
        nqn: &'static str,
    }

    #[test]
    fn a_report_inlines_its_subject_and_keeps_result_last() {
        let ok: lunkit::Result<u32> = Ok(7);
        let r = Report::new(
            Subject { nqn: "n" },
            &ok,
            Duration::from_micros(1500),
            |v| v * 2,
        );
        let text = to_text(&r, Layout::Line);
        assert_eq!(
            text,
            r#"{"version":1,"nqn":"n","ok":true,"error":null,"elapsed_us":1500,"result":14}"#
        );
        let failed: lunkit::Result<u32> = Err(lunkit::Error::invalid("port", "0", "must be 1"));
        let v: Value = serde_json::to_value(Report::new(
            Subject { nqn: "n" },
            &failed,
            Duration::ZERO,
            |v| *v,
        ))
        .unwrap();
        assert_eq!(v["ok"], json!(false));
        assert_eq!(v["result"], Value::Null);
        let error = v["error"].as_str().unwrap();
        assert!(
            error.contains("port") && error.contains("must be 1"),
            "{error}"
        );
    }

    #[test]
    fn durations_are_whole_microseconds_and_fractional_milliseconds() {
        assert_eq!(micros(Duration::from_nanos(2_999)), 2);
        assert_eq!(micros(Duration::MAX), u64::MAX);
        assert_eq!(millis(Duration::from_micros(1_500)), 1.5);
    }

    #[test]
    fn layouts_differ_only_in_white_space() {
        let doc = json!({"version": SCHEMA_VERSION, "a": [1, 2]});
        let line = to_text(&doc, Layout::Line);
        assert!(!line.contains('\n'));
        assert!(to_text(&doc, Layout::Pretty).contains('\n'));
        let back: Value = serde_json::from_str(&to_text(&doc, Layout::Pretty)).unwrap();
        assert_eq!(back, doc);
    }
}

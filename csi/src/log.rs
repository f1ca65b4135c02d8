//! The plugin's log on standard error: one line per CSI call (method, volume id, gRPC code,
//! duration, the error's message), one per lunkit step of an attach or a detach, and the
//! plugin's notes; as text (the default) or, with `--log-format json`, one JSON object a line.
//!
//! What goes in a line is what the plugin already put in its errors and notes: volume ids,
//! targets, devices, codes, messages. No request's secrets or volume attributes are logged,
//! and errors never carry a secret (the CHAP tests check every line the plugin writes).

use std::io::Write as _;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value, json};

/// How lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Format {
    /// `lunkit-csi: NodeStageVolume pv-1: ok (1.20s)`.
    #[default]
    Text,
    /// `{"time":"2026-11-27T12:00:00.000Z","level":"info","msg":"call",...}`.
    Json,
}

static FORMAT: OnceLock<Format> = OnceLock::new();

/// Sets the format, once, before the first line (later calls are ignored).
pub fn set_format(format: Format) {
    let _ = FORMAT.set(format);
}

fn format() -> Format {
    FORMAT.get().copied().unwrap_or_default()
}

/// How a line is rated: `info` for what went as asked, `warn` for what the plugin worked
/// around, `error` for a failed call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// Done.
    Info,
    /// Worked around.
    Warn,
    /// Failed.
    Error,
}

impl Level {
    fn as_str(self) -> &'static str {
        match self {
            Level::Info => "info",
            Level::Warn => "warn",
            Level::Error => "error",
        }
    }
}

/// A CSI call that ended: its line.
pub fn call(method: &str, volume_id: &str, result: Result<(), &crate::Error>, took: Duration) {
    write(&call_line(format(), now(), method, volume_id, result, took));
}

/// One lunkit step of `operation` on `volume_id`: its line.
pub fn step(
    volume_id: &str,
    operation: &str,
    step: &str,
    target: &str,
    outcome: &str,
    took: Duration,
) {
    let line = match format() {
        Format::Text => format!(
            "lunkit-csi: {volume_id}: {operation} {step} {target}: {outcome} ({:.3}s)",
            took.as_secs_f64()
        ),
        Format::Json => json_line(
            now(),
            Level::Info,
            "step",
            [
                ("volume_id", json!(volume_id)),
                ("operation", json!(operation)),
                ("step", json!(step)),
                ("target", json!(target)),
                ("outcome", json!(outcome)),
                ("duration_seconds", json!(took.as_secs_f64())),
            ],
        ),
    };
    write(&line);
}

/// A note: what the plugin did or worked around, outside a call's outcome.
pub fn note(level: Level, message: &str) {
    let line = match format() {
        Format::Text => format!("lunkit-csi: {message}"),
        Format::Json => json_line(now(), level, message, []),
    };
    write(&line);
}

/// The line of a call that ended with `result` after `took`, at `time`.
pub fn call_line(
    format: Format,
    time: SystemTime,
    method: &str,
    volume_id: &str,
    result: Result<(), &crate::Error>,
    took: Duration,
) -> String {
    let secs = took.as_secs_f64();
    match (format, result) {
        (Format::Text, Ok(())) => format!("lunkit-csi: {method} {volume_id}: ok ({secs:.2}s)"),
        (Format::Text, Err(e)) => {
            format!(
                "lunkit-csi: {method} {volume_id}: {:?}: {e} ({secs:.2}s)",
                e.code()
            )
        }
        (Format::Json, r) => {
            let code = r.map_or_else(|e| e.code(), |()| tonic::Code::Ok);
            let mut fields = vec![
                ("method", json!(method)),
                ("volume_id", json!(volume_id)),
                ("code", json!(crate::metrics::code_name(code))),
                ("duration_seconds", json!(secs)),
            ];
            if let Err(e) = r {
                fields.push(("error", json!(e.to_string())));
            }
            let level = if r.is_ok() { Level::Info } else { Level::Error };
            json_line(time, level, "call", fields)
        }
    }
}

/// `{"time":…,"level":…,"msg":…,<fields>}`.
fn json_line<'a>(
    time: SystemTime,
    level: Level,
    msg: &str,
    fields: impl IntoIterator<Item = (&'a str, Value)>,
) -> String {
    let mut m = Map::new();
    m.insert("time".into(), json!(rfc3339(time)));
    m.insert("level".into(), json!(level.as_str()));
    m.insert("msg".into(), json!(msg));
    for (k, v) in fields {
        m.insert(k.into(), v);
    }
    Value::Object(m).to_string()
}

fn now() -> SystemTime {
    SystemTime::now()
}

/// Writes `line` and its newline in one call, so that lines of concurrent calls never mix.
fn write(line: &str) {
    let mut l = String::with_capacity(line.len() + 1);
    l.push_str(line);
    l.push('\n');
    let _ = std::io::stderr().lock().write_all(l.as_bytes());
}

/// `time` in UTC as RFC 3339 with milliseconds: `2026-11-27T12:00:00.123Z`.
pub fn rfc3339(time: SystemTime) -> String {
    let d = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, mo, da) = civil_from_days(days);
    format!(
        "{y:04}-{mo:02}-{da:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_millis()
    )
}

/// The proleptic Gregorian date of `days` since 1970-01-01 (Howard Hinnant's
/// `civil_from_days`, for days on or after the epoch).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64, millis: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_millis(millis)
    }

    #[test]
    fn times_are_rfc3339_in_utc() {
        assert_eq!(rfc3339(at(0, 0)), "1970-01-01T00:00:00.000Z");
        // date -u -d @951782400: the leap day of a year divisible by 400.
        assert_eq!(rfc3339(at(951_782_400, 5)), "2000-02-29T00:00:00.005Z");
        // date -u -d @1795780983
        assert_eq!(rfc3339(at(1_795_780_983, 999)), "2026-11-27T12:03:03.999Z");
        assert_eq!(rfc3339(at(4_107_542_399, 0)), "2100-02-28T23:59:59.000Z");
    }

    #[test]
    fn a_text_call_line_is_the_one_the_plugin_always_wrote() {
        let t = at(0, 0);
        let took = Duration::from_millis(1234);
        assert_eq!(
            call_line(Format::Text, t, "NodeStageVolume", "pv-1", Ok(()), took),
            "lunkit-csi: NodeStageVolume pv-1: ok (1.23s)"
        );
        let e = crate::Error::NotFound("volume pv-1: no path came".into());
        assert_eq!(
            call_line(Format::Text, t, "NodeStageVolume", "pv-1", Err(&e), took),
            "lunkit-csi: NodeStageVolume pv-1: NotFound: volume pv-1: no path came (1.23s)"
        );
    }

    #[test]
    fn a_json_call_line_is_one_object_with_the_call_s_fields() {
        let e = crate::Error::DeadlineExceeded("volume \"pv-1\": scan\nlate".into());
        let took = Duration::from_millis(2500);
        let line = call_line(
            Format::Json,
            at(0, 0),
            "NodeUnstageVolume",
            "pv-1",
            Err(&e),
            took,
        );
        assert!(!line.contains('\n'), "{line}");
        let v: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["time"], "1970-01-01T00:00:00.000Z");
        assert_eq!(v["level"], "error");
        assert_eq!(v["msg"], "call");
        assert_eq!(v["method"], "NodeUnstageVolume");
        assert_eq!(v["volume_id"], "pv-1");
        assert_eq!(v["code"], "DeadlineExceeded");
        assert_eq!(v["duration_seconds"], 2.5);
        assert_eq!(v["error"], "volume \"pv-1\": scan\nlate");
        let ok = call_line(
            Format::Json,
            at(0, 0),
            "NodePublishVolume",
            "pv-1",
            Ok(()),
            took,
        );
        let v: Value = serde_json::from_str(&ok).unwrap();
        assert_eq!(
            (v["level"].as_str(), v["code"].as_str()),
            (Some("info"), Some("OK"))
        );
        assert!(v.get("error").is_none(), "{ok}");
    }
}

//! The plugin's log on standard error, through [`tracing`]: each CSI call runs in a `call`
//! span carrying its method and volume id, each lunkit step of an attach or a detach is an
//! event with its duration, and the call's end is an event with its gRPC code and duration.
//! [`Lines`], a [`tracing_subscriber`] layer, writes every event as one line: text (the
//! default) or, with `--log-format json`, one flat JSON object with the fields of the event
//! and of the spans it happened in.
//!
//! ```text
//! lunkit-csi: ia01: attach scan iscsi iqn.2003-01.org.example:t1 lun 1: done (0.412s)
//! lunkit-csi: NodeStageVolume ia01: ok (1.20s)
//! {"time":"2026-11-27T12:00:00.000Z","level":"info","msg":"step","method":"NodeStageVolume","volume_id":"ia01","operation":"attach","step":"scan","target":"…","outcome":"done","duration_seconds":0.412}
//! ```
//!
//! What goes in a line is what the plugin already put in its errors and notes: volume ids,
//! targets, devices, codes, messages. No request's secrets or volume attributes are logged,
//! and errors never carry a secret (the CHAP tests check every line the plugin writes).

use std::fmt;
use std::io::Write as _;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value, json};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing::{Event, Metadata, Span, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::{Context, SubscriberExt as _};
use tracing_subscriber::registry::LookupSpan;

/// How lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Format {
    /// `lunkit-csi: NodeStageVolume pv-1: ok (1.20s)`.
    #[default]
    Text,
    /// `{"time":"2026-11-27T12:00:00.000Z","level":"info","msg":"call",...}`.
    Json,
}

/// Makes [`Lines`] on standard error the process's subscriber, once, before the first line
/// (a later call changes nothing).
pub fn init(format: Format) {
    let subscriber = tracing_subscriber::registry().with(Lines::stderr(format));
    let _ = tracing::subscriber::set_global_default(subscriber);
}

/// How a note is rated: `info` for what went as asked, `warn` for what the plugin worked
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

/// The span of one CSI call: every line written inside it carries `method` and `volume_id`.
pub fn call_span(method: &'static str, volume_id: &str) -> Span {
    tracing::info_span!("call", method, volume_id)
}

/// The end of the current call, with its `result` after `took`: its line.
pub fn call(result: Result<(), &crate::Error>, took: Duration) {
    let secs = took.as_secs_f64();
    match result {
        Ok(()) => tracing::info!(code = "OK", duration_seconds = secs, "call"),
        Err(e) => tracing::error!(
            code = crate::metrics::code_name(e.code()),
            duration_seconds = secs,
            error = %e,
            "call"
        ),
    }
}

/// One lunkit step of `operation` (`attach`, `detach`) in the current call: its line.
pub fn step(operation: &str, step: &str, target: &str, outcome: &str, took: Duration) {
    tracing::info!(
        operation,
        step,
        "target" = target,
        outcome,
        duration_seconds = took.as_secs_f64(),
        "step"
    );
}

/// A leftover on the node the background examination found for the first time
/// ([`crate::doctor`]): its line, a warning.
pub fn finding(kind: &str, objects: &str, why: &str) {
    tracing::warn!(kind, objects, why, "doctor finding");
}

/// A note: what the plugin did or worked around, outside a call's outcome.
pub fn note(level: Level, message: &str) {
    match level {
        Level::Info => tracing::info!("{message}"),
        Level::Warn => tracing::warn!("{message}"),
        Level::Error => tracing::error!("{message}"),
    }
}

/// The layer that writes each event as one line of `format` through `out`.
pub struct Lines {
    format: Format,
    out: Arc<dyn Fn(&str) + Send + Sync>,
}

impl Lines {
    /// Lines written to standard error, each line and its newline in one `write`, so that
    /// lines of concurrent calls never mix.
    pub fn stderr(format: Format) -> Lines {
        Lines::to(format, |line| {
            let mut l = String::with_capacity(line.len() + 1);
            l.push_str(line);
            l.push('\n');
            let _ = std::io::stderr().lock().write_all(l.as_bytes());
        })
    }

    /// Lines given to `out`, without their newline.
    pub fn to(format: Format, out: impl Fn(&str) + Send + Sync + 'static) -> Lines {
        Lines {
            format,
            out: Arc::new(out),
        }
    }
}

impl fmt::Debug for Lines {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lines")
            .field("format", &self.format)
            .finish_non_exhaustive()
    }
}

/// Whether a span or an event of `meta` is logged.
fn wanted(meta: &Metadata<'_>) -> bool {
    let limit = if meta.target().starts_with(env!("CARGO_CRATE_NAME")) {
        tracing::Level::INFO
    } else {
        tracing::Level::WARN
    };
    *meta.level() <= limit
}

/// A span's fields, kept in its extensions for the events inside it.
struct SpanFields(Map<String, Value>);

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Lines {
    /// The plugin's own lines, and the warnings and errors of the crates under it (tonic, h2
    /// and hyper trace every frame: that is for their developers, not for a node's log).
    fn register_callsite(&self, meta: &'static Metadata<'static>) -> Interest {
        if wanted(meta) {
            Interest::always()
        } else {
            Interest::never()
        }
    }

    fn enabled(&self, meta: &Metadata<'_>, _: Context<'_, S>) -> bool {
        wanted(meta)
    }

    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = Fields(Map::new());
        attrs.record(&mut fields);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(SpanFields(fields.0));
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut ext = span.extensions_mut();
        if let Some(SpanFields(map)) = ext.get_mut::<SpanFields>() {
            let mut fields = Fields(std::mem::take(map));
            values.record(&mut fields);
            *map = fields.0;
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        // The outermost span's fields first, then the inner ones', then the event's own.
        let mut fields = Fields(Map::new());
        for span in ctx
            .event_scope(event)
            .into_iter()
            .flat_map(|s| s.from_root())
        {
            if let Some(SpanFields(map)) = span.extensions().get::<SpanFields>() {
                fields
                    .0
                    .extend(map.iter().map(|(k, v)| (k.clone(), v.clone())));
            }
        }
        event.record(&mut fields);
        let level = level_name(*event.metadata().level());
        (self.out)(&line(self.format, SystemTime::now(), level, fields.0));
    }
}

/// Field values as JSON; the event's message under `msg`.
struct Fields(Map<String, Value>);

impl Fields {
    fn put(&mut self, field: &Field, value: Value) {
        let key = match field.name() {
            "message" => "msg",
            k => k,
        };
        self.0.insert(key.to_owned(), value);
    }
}

impl Visit for Fields {
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.put(field, json!(value));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, json!(value));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, json!(value));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, json!(value));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, json!(value));
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.put(field, json!(format!("{value:?}")));
    }
}

fn level_name(level: tracing::Level) -> &'static str {
    match level {
        tracing::Level::ERROR => "error",
        tracing::Level::WARN => "warn",
        tracing::Level::INFO => "info",
        tracing::Level::DEBUG => "debug",
        tracing::Level::TRACE => "trace",
    }
}

/// The line of an event at `time`, rated `level`, with `fields` (its spans' and its own).
pub fn line(format: Format, time: SystemTime, level: &str, fields: Map<String, Value>) -> String {
    match format {
        Format::Text => text(&fields),
        Format::Json => {
            let mut m = Map::new();
            m.insert("time".into(), json!(rfc3339(time)));
            m.insert("level".into(), json!(level));
            m.extend(fields);
            Value::Object(m).to_string()
        }
    }
}

/// The text line: the call's and the step's as the plugin always wrote them, a note as
/// `lunkit-csi: <message>`.
fn text(f: &Map<String, Value>) -> String {
    let s = |k: &str| f.get(k).and_then(Value::as_str).unwrap_or("");
    let secs = f
        .get("duration_seconds")
        .and_then(Value::as_f64)
        .unwrap_or(0.0);
    let (method, id) = (s("method"), s("volume_id"));
    match s("msg") {
        "call" if s("code") == "OK" => format!("lunkit-csi: {method} {id}: ok ({secs:.2}s)"),
        "call" => format!(
            "lunkit-csi: {method} {id}: {}: {} ({secs:.2}s)",
            s("code"),
            s("error")
        ),
        "step" => format!(
            "lunkit-csi: {id}: {} {} {}: {} ({secs:.3}s)",
            s("operation"),
            s("step"),
            s("target"),
            s("outcome")
        ),
        msg => format!("lunkit-csi: {msg}"),
    }
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

    /// The lines `f` logs through [`Lines`] of `format`.
    fn logged(format: Format, f: impl FnOnce()) -> Vec<String> {
        let lines = Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = lines.clone();
        let layer = Lines::to(format, move |l| sink.lock().unwrap().push(l.to_owned()));
        tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), f);
        Arc::try_unwrap(lines).unwrap().into_inner().unwrap()
    }

    fn json(line: &str) -> Value {
        assert!(!line.contains('\n'), "{line}");
        serde_json::from_str(line).unwrap_or_else(|e| panic!("{line}: {e}"))
    }

    #[test]
    fn text_lines_are_the_ones_the_plugin_always_wrote() {
        let lines = logged(Format::Text, || {
            let _call = call_span("NodeStageVolume", "pv-1").entered();
            step(
                "attach",
                "scan",
                "hctl 2:0:0:1",
                "done",
                Duration::from_millis(412),
            );
            note(Level::Warn, "multipathd blacklists sdb");
            call(Ok(()), Duration::from_millis(1234));
            let e = crate::Error::NotFound("volume pv-1: no path came".into());
            call(Err(&e), Duration::from_millis(1234));
        });
        assert_eq!(
            lines,
            [
                "lunkit-csi: pv-1: attach scan hctl 2:0:0:1: done (0.412s)",
                "lunkit-csi: multipathd blacklists sdb",
                "lunkit-csi: NodeStageVolume pv-1: ok (1.23s)",
                "lunkit-csi: NodeStageVolume pv-1: NotFound: volume pv-1: no path came (1.23s)",
            ]
        );
    }

    #[test]
    fn every_json_line_of_a_call_carries_its_span_s_method_and_volume() {
        let e = crate::Error::DeadlineExceeded("volume \"pv-1\": scan\nlate".into());
        let lines = logged(Format::Json, || {
            note(Level::Info, "serving on /csi/csi.sock");
            let _call = call_span("NodeUnstageVolume", "pv-1").entered();
            step(
                "detach",
                "flush-map",
                "dm-3",
                "ok",
                Duration::from_millis(250),
            );
            call(Err(&e), Duration::from_millis(2500));
        });
        let [serving, step, end] = lines.as_slice() else {
            panic!("{lines:?}")
        };
        let v = json(serving);
        assert_eq!(
            (v["level"].as_str(), v["msg"].as_str()),
            (Some("info"), Some("serving on /csi/csi.sock"))
        );
        assert!(v.get("volume_id").is_none(), "{serving}");
        let v = json(step);
        assert_eq!(v["msg"], "step");
        assert_eq!(v["method"], "NodeUnstageVolume");
        assert_eq!(v["volume_id"], "pv-1");
        assert_eq!(v["operation"], "detach");
        assert_eq!(v["step"], "flush-map");
        assert_eq!(v["target"], "dm-3");
        assert_eq!(v["outcome"], "ok");
        assert_eq!(v["duration_seconds"], 0.25);
        let v = json(end);
        assert!(
            v["time"].as_str().is_some_and(|t| t.ends_with('Z')),
            "{end}"
        );
        assert_eq!(v["level"], "error");
        assert_eq!(v["msg"], "call");
        assert_eq!(v["method"], "NodeUnstageVolume");
        assert_eq!(v["volume_id"], "pv-1");
        assert_eq!(v["code"], "DeadlineExceeded");
        assert_eq!(v["duration_seconds"], 2.5);
        assert_eq!(v["error"], "volume \"pv-1\": scan\nlate");
    }

    #[test]
    fn other_crates_lines_are_kept_only_from_warnings_up() {
        let lines = logged(Format::Text, || {
            tracing::trace!(target: "h2::codec", "frame");
            tracing::info!(target: "hyper::proto", "connection");
            tracing::warn!(target: "tonic::transport", "refused");
            tracing::debug!("ours, too detailed");
            note(Level::Info, "ours");
        });
        assert_eq!(lines, ["lunkit-csi: refused", "lunkit-csi: ours"]);
    }

    #[test]
    fn concurrent_calls_keep_their_own_volume() {
        let lines = logged(Format::Json, || {
            let a = call_span("NodeStageVolume", "pv-a");
            let b = call_span("NodeStageVolume", "pv-b");
            b.in_scope(|| step("attach", "scan", "t-b", "done", Duration::ZERO));
            a.in_scope(|| call(Ok(()), Duration::ZERO));
            b.in_scope(|| call(Ok(()), Duration::ZERO));
        });
        let got: Vec<_> = lines
            .iter()
            .map(|l| {
                let v = json(l);
                format!("{} {} {}", v["msg"], v["volume_id"], v["code"])
            })
            .collect();
        assert_eq!(
            got,
            [
                r#""step" "pv-b" null"#,
                r#""call" "pv-a" "OK""#,
                r#""call" "pv-b" "OK""#
            ]
        );
    }
}

//! Prometheus metrics, served on `--metrics-address` as plain HTTP (`GET /metrics`, the text
//! exposition format 0.0.4).
//!
//! - `lunkit_csi_rpc_duration_seconds{method,code}`: every CSI call's latency, by method
//!   (`NodeStageVolume`; `other` for any path the plugin does not serve) and gRPC code (`OK`,
//!   `DeadlineExceeded`), a histogram.
//! - `lunkit_csi_rpc_errors_total{method,code}`: the calls that failed, by code.
//! - `lunkit_csi_step_duration_seconds{operation,step,outcome}`: lunkit's own steps, a
//!   histogram: an attach's `scan`, each NVMe `connect`, the whole `attach`; a detach's
//!   steps as its report names them (`flush-map`, `delete-path`...).
//! - `lunkit_csi_rpc_in_flight{method}`: the calls being answered now, a gauge: a stage
//!   waiting for its map shows here while it waits.
//! - `lunkit_csi_volumes_staged`: the stage records in phase `staged`, read from the state
//!   directory at each scrape, so it is right after a restart too.
//! - `lunkit_csi_doctor_findings{kind}`: what the last background examination of the node
//!   found ([`crate::doctor`]), by kind: lunkit's (`scsi-device-down`...) and the plugin's
//!   own (`stale-stage-record`, `published-path-gone`: [`crate::stale`]); a kind once found
//!   stays at 0 after it went. `lunkit_csi_doctor_examinations_total{result}`: examinations made,
//!   `ok` or `error`.
//!
//! The registry is the process's ([`global`]): calls are recorded whether or not anything
//! serves it, at the cost of a lock and a map update per call. The HTTP side is hand-written
//! (one request per connection, the head read within [`REQUEST_TIMEOUT`]): a scrape is one
//! GET, and no web framework is worth its weight for that.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tonic::codegen::http;

use crate::error::{Error, Result};
use crate::state::{Phase, Store};

/// Histogram bucket bounds, in seconds: storage calls take from milliseconds (a probe, a
/// stats call) to minutes (a multipath map under a slow array).
pub const BUCKETS: [f64; 15] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];

/// How long a scraper may take to send its request head.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// The longest request head read; a scrape's is a few hundred bytes.
const MAX_HEAD: usize = 8 << 10;

/// One histogram's counts: per bucket (not cumulative), the sum and the count.
#[derive(Debug, Clone, Default)]
struct Histogram {
    buckets: [u64; BUCKETS.len()],
    sum: f64,
    count: u64,
}

impl Histogram {
    fn observe(&mut self, d: Duration) {
        let s = d.as_secs_f64();
        if let Some(i) = BUCKETS.iter().position(|b| s <= *b) {
            self.buckets[i] += 1;
        }
        self.sum += s;
        self.count += 1;
    }

    /// Appends the `_bucket`, `_sum` and `_count` lines of `name` with `labels`
    /// (`method="X",code="Y"`).
    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let mut cumulative = 0;
        for (b, n) in BUCKETS.iter().zip(self.buckets) {
            cumulative += n;
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{b}\"}} {cumulative}");
        }
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum{{{labels}}} {}", self.sum);
        let _ = writeln!(out, "{name}_count{{{labels}}} {}", self.count);
    }
}

#[derive(Debug, Default)]
struct Series {
    /// (method, code) → latency.
    rpcs: BTreeMap<(&'static str, &'static str), Histogram>,
    /// (operation, step, outcome) → duration.
    steps: BTreeMap<(&'static str, &'static str, &'static str), Histogram>,
    /// method → calls being answered.
    in_flight: BTreeMap<&'static str, u64>,
    /// kind → findings of the last examination.
    findings: BTreeMap<&'static str, usize>,
    /// Examinations that ended well, and those that failed.
    examinations: (u64, u64),
}

/// The plugin's metrics.
#[derive(Debug, Default)]
pub struct Metrics {
    series: Mutex<Series>,
}

/// The process's registry.
pub fn global() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(Metrics::default)
}

impl Metrics {
    fn series(&self) -> std::sync::MutexGuard<'_, Series> {
        // A panic while recording leaves counts, never a broken invariant: go on.
        self.series.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records a CSI call of `method` that ended with `code` after `took`. Labels are static:
    /// no value comes from a client.
    pub fn rpc(&self, method: &'static str, code: tonic::Code, took: Duration) {
        self.series()
            .rpcs
            .entry((method, code_name(code)))
            .or_default()
            .observe(took);
    }

    /// Counts a call of `method` as being answered until the guard is dropped (its answer
    /// sent, or the call cancelled).
    pub fn begin(&'static self, method: &'static str) -> InFlight {
        *self.series().in_flight.entry(method).or_default() += 1;
        InFlight {
            metrics: self,
            method,
        }
    }

    /// Records one lunkit step of `operation` (`attach`, `detach`).
    pub fn step(
        &self,
        operation: &'static str,
        step: &'static str,
        outcome: &'static str,
        took: Duration,
    ) {
        self.series()
            .steps
            .entry((operation, step, outcome))
            .or_default()
            .observe(took);
    }

    /// Records what an attach reports: the scan, each NVMe connect, the whole attach.
    pub fn attached(&self, a: &lunkit::ops::Attachment) {
        if let Some(scsi) = a.scsi() {
            self.step("attach", "scan", "done", scsi.scan_elapsed);
        }
        for p in a.nvme().iter().flat_map(|n| &n.portals) {
            if let Ok(c) = &p.result {
                self.step("attach", "connect", "done", c.elapsed);
            }
        }
        self.step("attach", "attach", "done", a.elapsed);
    }

    /// Records every step a detach reports, and the whole detach.
    pub fn detached(&self, r: &lunkit::ops::DetachReport) {
        for s in &r.steps {
            self.step(
                "detach",
                s.kind.as_str(),
                outcome_name(&s.outcome),
                s.duration,
            );
        }
        self.step("detach", "detach", "done", r.duration);
    }

    /// Records an examination of the node: the kinds of its findings (one entry a finding,
    /// lunkit's and the plugin's), counted by kind, every kind counted before set to 0 first;
    /// `None` for one that failed.
    pub fn examined(&self, kinds: Option<&[&'static str]>) {
        let mut s = self.series();
        let Some(kinds) = kinds else {
            s.examinations.1 += 1;
            return;
        };
        s.examinations.0 += 1;
        s.findings.values_mut().for_each(|n| *n = 0);
        for kind in kinds {
            *s.findings.entry(kind).or_default() += 1;
        }
    }

    /// The exposition text, with `staged` as the staged volumes' gauge.
    pub fn render(&self, staged: usize) -> String {
        let s = self.series();
        let mut out = String::new();
        out.push_str(
            "# HELP lunkit_csi_rpc_duration_seconds CSI calls by method and gRPC code.\n\
             # TYPE lunkit_csi_rpc_duration_seconds histogram\n",
        );
        for ((method, code), h) in &s.rpcs {
            let labels = format!("method=\"{}\",code=\"{code}\"", escape(method));
            h.render(&mut out, "lunkit_csi_rpc_duration_seconds", &labels);
        }
        out.push_str(
            "# HELP lunkit_csi_rpc_errors_total CSI calls that failed, by method and gRPC code.\n\
             # TYPE lunkit_csi_rpc_errors_total counter\n",
        );
        for ((method, code), h) in s.rpcs.iter().filter(|((_, c), _)| *c != "OK") {
            let _ = writeln!(
                out,
                "lunkit_csi_rpc_errors_total{{method=\"{}\",code=\"{code}\"}} {}",
                escape(method),
                h.count
            );
        }
        out.push_str(
            "# HELP lunkit_csi_step_duration_seconds lunkit's steps of an attach or a detach.\n\
             # TYPE lunkit_csi_step_duration_seconds histogram\n",
        );
        for ((op, step, outcome), h) in &s.steps {
            let labels = format!("operation=\"{op}\",step=\"{step}\",outcome=\"{outcome}\"");
            h.render(&mut out, "lunkit_csi_step_duration_seconds", &labels);
        }
        out.push_str(
            "# HELP lunkit_csi_rpc_in_flight CSI calls being answered, by method.\n\
             # TYPE lunkit_csi_rpc_in_flight gauge\n",
        );
        for (method, n) in &s.in_flight {
            let _ = writeln!(
                out,
                "lunkit_csi_rpc_in_flight{{method=\"{}\"}} {n}",
                escape(method)
            );
        }
        let _ = write!(
            out,
            "# HELP lunkit_csi_volumes_staged Volumes staged on this node.\n\
             # TYPE lunkit_csi_volumes_staged gauge\n\
             lunkit_csi_volumes_staged {staged}\n"
        );
        out.push_str(
            "# HELP lunkit_csi_doctor_findings What the last examination of the node found, by kind.\n\
             # TYPE lunkit_csi_doctor_findings gauge\n",
        );
        for (kind, n) in &s.findings {
            let _ = writeln!(out, "lunkit_csi_doctor_findings{{kind=\"{kind}\"}} {n}");
        }
        let _ = write!(
            out,
            "# HELP lunkit_csi_doctor_examinations_total Examinations of the node, by result.\n\
             # TYPE lunkit_csi_doctor_examinations_total counter\n\
             lunkit_csi_doctor_examinations_total{{result=\"ok\"}} {}\n\
             lunkit_csi_doctor_examinations_total{{result=\"error\"}} {}\n",
            s.examinations.0, s.examinations.1
        );
        crate::follow::unconnected::render(&mut out);
        out
    }
}

/// A call of one method being answered ([`Metrics::begin`]); dropping it ends the count.
#[derive(Debug)]
pub struct InFlight {
    metrics: &'static Metrics,
    method: &'static str,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(n) = self.metrics.series().in_flight.get_mut(self.method) {
            *n = n.saturating_sub(1);
        }
    }
}

/// A detach step's outcome as a label: `done`, `already-gone`, `skipped`, `failed`.
pub fn outcome_name(o: &lunkit::ops::Outcome) -> &'static str {
    use lunkit::ops::Outcome;
    match o {
        Outcome::Done => "done",
        Outcome::AlreadyGone => "already-gone",
        Outcome::Skipped(_) => "skipped",
        Outcome::Failed(_) => "failed",
    }
}

/// A label value with `\`, `"` and newlines escaped, as the format asks.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// gRPC's name of `code`, as grpc-go's interceptors label it (`OK`, `NotFound`).
pub fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "Canceled",
        Unknown => "Unknown",
        InvalidArgument => "InvalidArgument",
        DeadlineExceeded => "DeadlineExceeded",
        NotFound => "NotFound",
        AlreadyExists => "AlreadyExists",
        PermissionDenied => "PermissionDenied",
        ResourceExhausted => "ResourceExhausted",
        FailedPrecondition => "FailedPrecondition",
        Aborted => "Aborted",
        OutOfRange => "OutOfRange",
        Unimplemented => "Unimplemented",
        Internal => "Internal",
        Unavailable => "Unavailable",
        DataLoss => "DataLoss",
        Unauthenticated => "Unauthenticated",
    }
}

/// Serves `metrics` on `listener` until the task is dropped, with the staged volumes counted
/// in `store` at each scrape.
pub async fn serve(listener: TcpListener, metrics: &'static Metrics, store: Store) {
    loop {
        let Ok((conn, _)) = listener.accept().await else {
            // EMFILE and the like: the next accept may succeed.
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let store = store.clone();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(REQUEST_TIMEOUT, answer(conn, metrics, store)).await;
        });
    }
}

/// Reads one request head and answers it, then closes the connection.
async fn answer(
    mut conn: TcpStream,
    metrics: &'static Metrics,
    store: Store,
) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = conn.read(&mut buf).await?;
        if n == 0 || head.len() + n > MAX_HEAD {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
    }
    let (status, body) = match request_line(&head) {
        Some(("GET", "/metrics")) => {
            let staged = tokio::task::spawn_blocking(move || staged(&store))
                .await
                .unwrap_or(0);
            ("200 OK", metrics.render(staged))
        }
        Some(("GET", _)) => ("404 Not Found", "only /metrics is served\n".to_owned()),
        _ => ("405 Method Not Allowed", "GET /metrics\n".to_owned()),
    };
    let reply = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(reply.as_bytes()).await?;
    conn.shutdown().await
}

/// The method and path of a request head (`GET /metrics?x HTTP/1.1` → `GET`, `/metrics`).
fn request_line(head: &[u8]) -> Option<(&str, &str)> {
    let line = head.split(|b| *b == b'\n').next()?;
    let line = std::str::from_utf8(line).ok()?.trim_end_matches('\r');
    let mut words = line.split(' ');
    let method = words.next()?;
    let target = words.next()?;
    words.next()?.starts_with("HTTP/1.").then_some(())?;
    Some((method, target.split('?').next().unwrap_or(target)))
}

/// The records in phase staged.
fn staged(store: &Store) -> usize {
    store
        .all()
        .map(|rs| rs.iter().filter(|r| r.phase == Phase::Staged).count())
        .unwrap_or(0)
}

/// Binds the metrics address (`ADDR:PORT`; `[::]:9808` for every address).
pub async fn bind(address: &str) -> Result<TcpListener> {
    TcpListener::bind(address)
        .await
        .map_err(|e| Error::Internal(format!("listen for metrics on {address}: {e}")))
}

/// The tower layer that records every CSI call the server answers in [`global`]: its method
/// (the path's last segment), its gRPC code and its latency. A unary call's error is a
/// trailers-only response whose headers carry `grpc-status`; a success's code is in the
/// trailers, after the whole answer: no `grpc-status` in the headers is `OK`.
#[derive(Debug, Clone, Copy, Default)]
pub struct RpcLayer;

impl<S> tower::Layer<S> for RpcLayer {
    type Service = Rpcs<S>;

    fn layer(&self, inner: S) -> Rpcs<S> {
        Rpcs { inner }
    }
}

/// The service [`RpcLayer`] wraps around the server's routes.
#[derive(Debug, Clone)]
pub struct Rpcs<S> {
    inner: S,
}

type BoxFuture<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>;

impl<S, B, R> tower::Service<http::Request<B>> for Rpcs<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<std::result::Result<S::Response, S::Error>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::result::Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let method = method_of(req.uri().path());
        let start = std::time::Instant::now();
        let in_flight = global().begin(method);
        let answer = self.inner.call(req);
        Box::pin(async move {
            let r = answer.await;
            drop(in_flight);
            let code = match &r {
                Ok(resp) => resp
                    .headers()
                    .get("grpc-status")
                    .map_or(tonic::Code::Ok, |v| tonic::Code::from_bytes(v.as_bytes())),
                Err(_) => tonic::Code::Unknown,
            };
            global().rpc(method, code, start.elapsed());
            r
        })
    }
}

/// The methods the plugin serves, after `/csi.v1.`: their names are the only method label
/// values besides [`OTHER_METHOD`].
const SERVED: &str = "Identity/GetPluginInfo Identity/GetPluginCapabilities Identity/Probe \
    Node/NodeStageVolume Node/NodeUnstageVolume Node/NodePublishVolume Node/NodeUnpublishVolume \
    Node/NodeGetVolumeStats Node/NodeExpandVolume Node/NodeGetCapabilities Node/NodeGetInfo";

/// The method label of every call to a path the plugin does not serve: a client names the
/// path, and a label value per name would grow the registry without bound.
pub const OTHER_METHOD: &str = "other";

/// A gRPC path's method label: `/csi.v1.Node/NodeStageVolume` → `NodeStageVolume`, and
/// [`OTHER_METHOD`] for a path the plugin does not serve.
fn method_of(path: &str) -> &'static str {
    let rest = path.strip_prefix("/csi.v1.").unwrap_or_default();
    let served = SERVED.split_whitespace().find(|m| *m == rest);
    served
        .and_then(|m| m.split_once('/'))
        .map_or(OTHER_METHOD, |(_, name)| name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_lines_parse_and_queries_are_dropped() {
        assert_eq!(
            request_line(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
            Some(("GET", "/metrics"))
        );
        assert_eq!(
            request_line(b"GET /metrics?name[]=a HTTP/1.0\r\n\r\n"),
            Some(("GET", "/metrics"))
        );
        assert_eq!(request_line(b"GET /metrics\r\n\r\n"), None);
        assert_eq!(request_line(b"\xff\xfe HTTP/1.1\r\n\r\n"), None);
    }

    #[test]
    fn histograms_are_cumulative_with_sum_and_count() {
        let m = Metrics::default();
        m.rpc(
            "NodeStageVolume",
            tonic::Code::Ok,
            Duration::from_millis(30),
        );
        m.rpc("NodeStageVolume", tonic::Code::Ok, Duration::from_secs(400));
        m.rpc(
            "NodeStageVolume",
            tonic::Code::NotFound,
            Duration::from_millis(2),
        );
        let text = m.render(3);
        let ok = "method=\"NodeStageVolume\",code=\"OK\"";
        assert!(
            text.contains(&format!("_bucket{{{ok},le=\"0.025\"}} 0\n")),
            "{text}"
        );
        assert!(
            text.contains(&format!("_bucket{{{ok},le=\"0.05\"}} 1\n")),
            "{text}"
        );
        assert!(
            text.contains(&format!("_bucket{{{ok},le=\"300\"}} 1\n")),
            "{text}"
        );
        assert!(
            text.contains(&format!("_bucket{{{ok},le=\"+Inf\"}} 2\n")),
            "{text}"
        );
        assert!(text.contains(&format!("_count{{{ok}}} 2\n")), "{text}");
        assert!(text.contains(&format!("_sum{{{ok}}} 400.03")), "{text}");
        assert!(text.contains(
            "lunkit_csi_rpc_errors_total{method=\"NodeStageVolume\",code=\"NotFound\"} 1\n"
        ));
        assert!(
            !text.contains("lunkit_csi_rpc_errors_total{method=\"NodeStageVolume\",code=\"OK\"}")
        );
        assert!(text.contains("lunkit_csi_volumes_staged 3\n"), "{text}");
    }

    #[test]
    fn examinations_count_findings_by_kind_and_a_kind_gone_shows_zero() {
        let m = Metrics::default();
        m.examined(Some(&[
            "nvme-controller-down",
            "nvme-controller-down",
            "idle-session",
        ]));
        let text = m.render(0);
        for line in [
            "lunkit_csi_doctor_findings{kind=\"nvme-controller-down\"} 2\n",
            "lunkit_csi_doctor_findings{kind=\"idle-session\"} 1\n",
            "lunkit_csi_doctor_examinations_total{result=\"ok\"} 1\n",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
        m.examined(None);
        m.examined(Some(&["idle-session", "stale-stage-record"]));
        let text = m.render(0);
        for line in [
            "lunkit_csi_doctor_findings{kind=\"nvme-controller-down\"} 0\n",
            "lunkit_csi_doctor_findings{kind=\"idle-session\"} 1\n",
            "lunkit_csi_doctor_examinations_total{result=\"ok\"} 2\n",
            "lunkit_csi_doctor_examinations_total{result=\"error\"} 1\n",
            "lunkit_csi_doctor_findings{kind=\"stale-stage-record\"} 1\n",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
    }

    #[test]
    fn calls_in_flight_are_counted_until_their_guard_goes() {
        let m: &'static Metrics = Box::leak(Box::default());
        let a = m.begin("NodeStageVolume");
        let b = m.begin("NodeStageVolume");
        assert!(
            m.render(0)
                .contains("lunkit_csi_rpc_in_flight{method=\"NodeStageVolume\"} 2\n")
        );
        drop(a);
        drop(b);
        let text = m.render(0);
        assert!(
            text.contains("lunkit_csi_rpc_in_flight{method=\"NodeStageVolume\"} 0\n"),
            "{text}"
        );
    }

    #[test]
    fn methods_are_those_served_and_any_other_path_is_other() {
        assert_eq!(method_of("/csi.v1.Node/NodeStageVolume"), "NodeStageVolume");
        assert_eq!(method_of("/csi.v1.Identity/Probe"), "Probe");
        for path in
            "/ /x/a\"b /csi.v1.Node/Probe /x.Y/Probe /csi.v1.Node/ Node/NodeGetInfo".split(' ')
        {
            assert_eq!(method_of(path), OTHER_METHOD, "{path}");
        }
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}

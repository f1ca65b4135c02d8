//! The metrics endpoint scraped over real HTTP while the plugin serves calls on its socket:
//! each call counted by method and code, the failures by code, the staged volumes counted
//! from the state directory (`csi/src/metrics.rs`). One test: the registry is the process's.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};

use lunkit_csi::proto::*;
use lunkit_csi::state::{Access, Phase, RECORD_VERSION, Record, Target};
use lunkit_csi::{Config, IdentityService, NodeService, metrics, server};
use tonic::Code;

/// `GET path` on `addr`: the status line and the body.
fn get(addr: SocketAddr, path: &str) -> (String, String) {
    let mut c = TcpStream::connect(addr).unwrap();
    write!(
        c,
        "GET {path} HTTP/1.1\r\nHost: lunkit\r\nAccept: text/plain\r\n\r\n"
    )
    .unwrap();
    let mut reply = String::new();
    c.read_to_string(&mut reply).unwrap();
    let (head, body) = reply.split_once("\r\n\r\n").expect("a head and a body");
    let status = head.lines().next().unwrap().to_owned();
    if status.contains("200") {
        assert!(
            head.contains("Content-Type: text/plain; version=0.0.4"),
            "{head}"
        );
    }
    (status, body.to_owned())
}

/// The value of the sample `series` (name and labels exactly as exposed), if present.
fn sample(body: &str, series: &str) -> Option<f64> {
    body.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map(|v| v.parse().unwrap())
}

fn record(id: &str) -> Record {
    Record {
        version: RECORD_VERSION,
        volume_id: id.into(),
        staging_path: format!("/staging/{id}").into(),
        phase: Phase::Staged,
        target: Target::Fc {
            wwpns: vec!["0x500a098188888888".into()],
            lun: 1,
            fence: None,
        },
        access: Access::Block,
        wwid: None,
        expected_wwid: None,
        device: None,
        map: false,
        published: Vec::new(),
    }
}

#[tokio::test]
async fn a_scrape_shows_each_call_by_method_and_code_and_the_volumes_staged() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::new("node-a");
    config.state_dir = dir.path().join("state");
    let node = NodeService::new(config).unwrap();
    let store = node.store().clone();
    let http = metrics::bind("127.0.0.1:0").await.unwrap();
    let addr = http.local_addr().unwrap();
    let scraper = tokio::spawn(metrics::serve(http, metrics::global(), store.clone()));
    let sock = dir.path().join("csi.sock");
    let listener = server::bind(&sock).unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(server::serve(
        listener,
        IdentityService::new("csi.lunkit.invalid"),
        node,
        async {
            let _ = stopped.await;
        },
    ));
    let (mut identity, mut node) = server::clients(&sock).await.unwrap();

    let (status, body) = tokio::task::spawn_blocking(move || get(addr, "/metrics"))
        .await
        .unwrap();
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    assert_eq!(
        sample(&body, "lunkit_csi_volumes_staged"),
        Some(0.0),
        "{body}"
    );
    assert!(!body.contains("method=\"Probe\""), "{body}");

    identity.probe(ProbeRequest {}).await.unwrap();
    identity.probe(ProbeRequest {}).await.unwrap();
    let bad = node
        .node_stage_volume(NodeStageVolumeRequest::default())
        .await
        .unwrap_err();
    assert_eq!(bad.code(), Code::InvalidArgument);
    // Nothing staged under that id, nothing mounted there: done, through the blocking pool.
    node.node_unstage_volume(NodeUnstageVolumeRequest {
        volume_id: "pv-none".into(),
        staging_target_path: dir.path().join("nowhere").display().to_string(),
    })
    .await
    .unwrap();
    store.save(&record("pv-1")).unwrap();
    let mut attaching = record("pv-2");
    attaching.phase = Phase::Attaching;
    store.save(&attaching).unwrap();

    let (status, body) = tokio::task::spawn_blocking(move || get(addr, "/metrics?x=1"))
        .await
        .unwrap();
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    let count = |method: &str, code: &str| {
        sample(
            &body,
            &format!(
                "lunkit_csi_rpc_duration_seconds_count{{method=\"{method}\",code=\"{code}\"}}"
            ),
        )
    };
    assert_eq!(count("Probe", "OK"), Some(2.0), "{body}");
    assert_eq!(
        count("NodeStageVolume", "InvalidArgument"),
        Some(1.0),
        "{body}"
    );
    assert_eq!(count("NodeStageVolume", "OK"), None, "{body}");
    assert_eq!(count("NodeUnstageVolume", "OK"), Some(1.0), "{body}");
    assert_eq!(
        sample(
            &body,
            "lunkit_csi_rpc_errors_total{method=\"NodeStageVolume\",code=\"InvalidArgument\"}"
        ),
        Some(1.0),
        "{body}"
    );
    assert!(
        !body.contains("lunkit_csi_rpc_errors_total{method=\"Probe\""),
        "{body}"
    );
    assert_eq!(
        sample(
            &body,
            "lunkit_csi_rpc_duration_seconds_bucket{method=\"Probe\",code=\"OK\",le=\"+Inf\"}"
        ),
        Some(2.0),
        "{body}"
    );
    // Only the record in phase staged.
    assert_eq!(
        sample(&body, "lunkit_csi_volumes_staged"),
        Some(1.0),
        "{body}"
    );

    let (status, _) = tokio::task::spawn_blocking(move || get(addr, "/"))
        .await
        .unwrap();
    assert!(status.starts_with("HTTP/1.1 404"), "{status}");

    let _ = stop.send(());
    served.await.unwrap().unwrap();
    scraper.abort();
}

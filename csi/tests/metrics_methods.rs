//! The method label of the call metrics over a real socket (`csi/src/metrics.rs`): calls to
//! paths the plugin does not serve, however many and whatever they are named, are one label
//! value, `other`; the methods it serves keep theirs. One test: the registry is the
//! process's.

use std::io::{Read, Write};
use std::net::TcpStream;

use lunkit_csi::proto::{ProbeRequest, ProbeResponse};
use lunkit_csi::{Config, IdentityService, NodeService, metrics, server};
use tonic::Code;
use tonic::codegen::http::uri::PathAndQuery;

#[tokio::test]
async fn calls_to_paths_not_served_are_one_label_value() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::new("node-a");
    config.state_dir = dir.path().join("state");
    let node = NodeService::new(config).unwrap();
    let http = metrics::bind("127.0.0.1:0").await.unwrap();
    let addr = http.local_addr().unwrap();
    let scraper = tokio::spawn(metrics::serve(
        http,
        metrics::global(),
        node.store().clone(),
    ));
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

    let mut grpc = tonic::client::Grpc::new(server::connect(&sock).await.unwrap());
    let paths = (0..200)
        .map(|i| format!("/csi.v1.Identity/Probe{i}"))
        .chain([
            "/csi.v1.Controller/CreateVolume".into(),
            "/x.Y/Probe".into(),
        ])
        .chain(["/csi.v1.Identity/Probe".into()]);
    for path in paths {
        grpc.ready().await.unwrap();
        let codec = tonic::codec::ProstCodec::<ProbeRequest, ProbeResponse>::default();
        let path = PathAndQuery::try_from(path).unwrap();
        let answer = grpc
            .unary(tonic::Request::new(ProbeRequest {}), path.clone(), codec)
            .await;
        match answer {
            Ok(_) => assert_eq!(path.path(), "/csi.v1.Identity/Probe"),
            Err(e) => assert_eq!(e.code(), Code::Unimplemented, "{path}: {e}"),
        }
    }

    let body = tokio::task::spawn_blocking(move || {
        let mut c = TcpStream::connect(addr).unwrap();
        c.write_all(b"GET /metrics HTTP/1.1\r\nHost: lunkit\r\n\r\n")
            .unwrap();
        let mut reply = String::new();
        c.read_to_string(&mut reply).unwrap();
        reply
    })
    .await
    .unwrap();
    let counts: Vec<&str> = body
        .lines()
        .filter(|l| l.starts_with("lunkit_csi_rpc_duration_seconds_count"))
        .collect();
    assert_eq!(
        counts,
        [
            "lunkit_csi_rpc_duration_seconds_count{method=\"Probe\",code=\"OK\"} 1",
            "lunkit_csi_rpc_duration_seconds_count{method=\"other\",code=\"Unimplemented\"} 202",
        ],
        "{body}"
    );
    assert!(
        body.contains("lunkit_csi_rpc_in_flight{method=\"other\"} 0\n"),
        "{body}"
    );
    assert!(
        !body.contains("Probe1") && !body.contains("CreateVolume"),
        "{body}"
    );

    let _ = stop.send(());
    served.await.unwrap().unwrap();
    scraper.abort();
}

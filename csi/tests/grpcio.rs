//! A gRPC client other than grpc-go: PyPI's grpcio (grpc-core, as Python, C++, Ruby and C#
//! clients are) with its default channel options drives the Identity and Node services over
//! the plugin's Unix socket. For `unix:///PATH` grpc-core sends the percent-encoded path as
//! `:authority`, which the HTTP/2 server under tonic refused with RST_STREAM
//! (PROTOCOL_ERROR) until the plugin relayed its connections (`authority.rs`).
//!
//! grpcio comes from PyPI into a virtualenv under the target directory, made by this test on
//! a machine that has none yet (`python3 -m venv`, then pip), so a fresh CI machine installs
//! it the same way.

// The test starts python and pip; the plugin itself runs programs only through exec.rs.
#![allow(clippy::disallowed_methods)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use lunkit_csi::{Config, IdentityService, NodeService, server};

/// The grpcio release the test installs.
const GRPCIO: &str = "grpcio==1.85.1";

/// `<target>/grpcio-venv`, made (once, atomically: built beside and renamed) when missing.
fn venv() -> PathBuf {
    let target = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target");
    let venv = target.join("grpcio-venv");
    if venv.join("bin/python").exists() {
        return venv;
    }
    let building = target.join(format!("grpcio-venv.{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&building);
    let ok = |c: &mut Command, what: &str| {
        let out = c.stdin(Stdio::null()).output().expect(what);
        assert!(
            out.status.success(),
            "{what}: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    ok(
        Command::new("python3").args(["-m", "venv"]).arg(&building),
        "python3 -m venv (Debian: python3-venv)",
    );
    ok(
        Command::new(building.join("bin/pip")).args([
            "install",
            "--quiet",
            "--disable-pip-version-check",
            GRPCIO,
        ]),
        "pip install grpcio from PyPI",
    );
    // Another test run may have finished first: either venv is as good.
    if std::fs::rename(&building, &venv).is_err() {
        let _ = std::fs::remove_dir_all(&building);
    }
    assert!(
        venv.join("bin/python").exists(),
        "no venv at {}",
        venv.display()
    );
    venv
}

#[tokio::test(flavor = "multi_thread")]
async fn grpcio_with_default_options_gets_identity_and_node_answers() {
    let venv = tokio::task::spawn_blocking(venv).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("csi/csi.sock");
    let mut config = Config::new("node-a");
    config.state_dir = dir.path().join("state");
    config.max_volumes = 17;
    let node = NodeService::new(config).unwrap();
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
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/grpcio_client.py");
    let out = tokio::task::spawn_blocking(move || {
        Command::new(venv.join("bin/python"))
            .arg(script)
            .arg(&sock)
            .stdin(Stdio::null())
            .output()
            .expect("run the grpcio client")
    })
    .await
    .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the grpcio client failed: {said}\n{err}"
    );
    let v: serde_json::Value = serde_json::from_str(said.trim()).expect(&said);
    assert_eq!(v["name"], "csi.lunkit.invalid", "{v}");
    assert_eq!(v["node_id"], "node-a", "{v}");
    assert_eq!(v["max_volumes"], 17, "{v}");
    // STAGE_UNSTAGE_VOLUME, GET_VOLUME_STATS, EXPAND_VOLUME, VOLUME_CONDITION.
    assert_eq!(
        v["node_capabilities"],
        serde_json::json!([1, 2, 3, 4]),
        "{v}"
    );
    // Probe's answer: `ready` (field 1), a BoolValue holding true.
    assert_eq!(v["probe"], "0a020801", "{v}");
    let _ = stop.send(());
    served.await.unwrap().unwrap();
}

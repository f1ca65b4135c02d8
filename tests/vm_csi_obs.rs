//! VM tests of the CSI node plugin's observability (issue 37, item 5): Probe checks what the
//! node needs (iscsid here, a real one stopped and started again).
//!
//! Run by `cargo xtask test` inside the QEMU guest (ignored on the host); the plugin binary
//! comes from `LUNKIT_CSI_BIN`.

// The tests start the plugin and iscsid with the fixtures' tools.
#![allow(clippy::disallowed_methods)]

use lunkit_lab as support;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use lunkit_csi::proto::*;
use lunkit_csi::{Client, Code};
use support::child::Running;
use support::iscsi;
use support::{cmd, require_vm, wait};

const BASE: &str = "/tmp/lunkit-csi-obs";

/// iscsid's control socket as `/proc/net/unix` shows it (`@` for the abstract namespace).
const ISCSID_SOCKET: &str = "@ISCSIADM_ABSTRACT_NAMESPACE";

/// iscsid and the plugin (started with `args` besides its socket and state directory);
/// dropping it stops the plugin and what the lab started.
struct Lab {
    plugin: Option<Running>,
    started_iscsid: bool,
}

impl Lab {
    fn build(args: &[&str]) -> Lab {
        let _ = fs::remove_dir_all(BASE);
        fs::create_dir_all(BASE).unwrap();
        let mut lab = Lab {
            plugin: None,
            started_iscsid: false,
        };
        lab.started_iscsid = iscsi::ensure_iscsid().expect("iscsid");
        let bin =
            std::env::var("LUNKIT_CSI_BIN").expect("LUNKIT_CSI_BIN is set by cargo xtask test");
        let endpoint = format!("unix://{}", Lab::socket().display());
        let state = format!("{BASE}/state");
        let mut command = Command::new(bin);
        command.args([
            "--endpoint",
            &endpoint,
            "--nodeid",
            "vm",
            "--state-dir",
            &state,
        ]);
        command.args(["--timeout", "600"]).args(args);
        lab.plugin = Some(Running::spawn(&mut command).expect("start lunkit-csi"));
        // Up: it answers Identity (Probe may rightly fail, which is what is tested).
        wait::until("the plugin to answer", Duration::from_secs(60), || {
            Ok(Client::connect(&Lab::socket())
                .ok()
                .and_then(|mut c| c.get_plugin_info(GetPluginInfoRequest {}).ok()))
        })
        .expect("the plugin answers");
        lab
    }

    fn socket() -> PathBuf {
        Path::new(BASE).join("csi.sock")
    }

    fn client(&self) -> Client {
        Client::connect(&Lab::socket()).expect("connect to the plugin")
    }

    /// Probe's answer: `Ok` when ready, else its code and message.
    fn probe(&self) -> Result<(), (Code, String)> {
        match self.client().probe(ProbeRequest {}) {
            Ok(r) => {
                assert_eq!(r.ready, Some(BoolValue { value: true }), "{r:?}");
                Ok(())
            }
            Err(s) => Err((s.code(), s.message().to_owned())),
        }
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if let Some(p) = self.plugin.take() {
            cmd::run_ignoring_failure("kill", &["-TERM", &p.pid().to_string()]);
            let limit = p.elapsed() + Duration::from_secs(30);
            eprintln!("lunkit-csi: {}", p.wait(limit).describe());
        }
        iscsi::logout_all();
        if self.started_iscsid {
            let _ = iscsi::stop_iscsid();
        }
        let _ = fs::remove_dir_all(BASE);
    }
}

/// Whether something listens on iscsid's abstract socket, as the kernel lists it.
fn iscsid_listening() -> bool {
    fs::read_to_string("/proc/net/unix")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split_whitespace().last() == Some(ISCSID_SOCKET))
}

#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn probe_fails_naming_iscsid_while_it_is_stopped() {
    require_vm();
    let lab = Lab::build(&["--transports", "iscsi"]);
    assert!(iscsid_listening(), "iscsid runs");
    assert_eq!(lab.probe(), Ok(()));

    iscsi::stop_iscsid().expect("stop iscsid");
    assert!(!iscsid_listening(), "iscsid's socket is gone with it");
    let (code, message) = lab
        .probe()
        .expect_err("probe answered ready without iscsid");
    assert_eq!(code, Code::FailedPrecondition, "{message}");
    assert!(message.contains("iscsid"), "{message}");
    assert!(message.contains(ISCSID_SOCKET), "{message}");
    // The other checks pass: only iscsid is named.
    assert!(!message.contains("state directory"), "{message}");

    // Started again; the lab stops it at the end only if it started it at first.
    iscsi::ensure_iscsid().expect("start iscsid");
    wait::until_true(
        "iscsid to listen on its socket",
        Duration::from_secs(30),
        iscsid_listening,
    )
    .expect("iscsid listens");
    assert_eq!(lab.probe(), Ok(()));
}

//! Probe through a real tonic client on the plugin's socket: ready when the node has what the
//! plugin needs, `FAILED_PRECONDITION` naming each thing missing otherwise (`csi/src/probe.rs`).

use std::collections::BTreeSet;
use std::os::unix::net::UnixListener;

use lunkit::Root;
use lunkit_csi::probe::{self, Transport};
use lunkit_csi::proto::identity_client::IdentityClient;
use lunkit_csi::proto::*;
use lunkit_csi::{Config, IdentityService, NodeService, server};
use tonic::Code;
use tonic::transport::Channel;

struct Plugin {
    dir: tempfile::TempDir,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<lunkit_csi::Result<()>>>,
}

/// The plugin on a node whose root is `<dir>/root`, checking `transports`.
async fn start(transports: &[Transport]) -> Plugin {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("root/dev")).unwrap();
    let mut config = Config::new("node-a");
    config.root = Root::new(dir.path().join("root"));
    config.state_dir = dir.path().join("state");
    config.transports = transports.iter().copied().collect::<BTreeSet<_>>();
    let node = NodeService::new(config).unwrap();
    let identity = IdentityService::new("csi.lunkit.invalid").checks(node.checks());
    let listener = server::bind(&dir.path().join("csi.sock")).unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(server::serve(listener, identity, node, async {
        let _ = rx.await;
    }));
    Plugin {
        dir,
        stop: Some(tx),
        task: Some(task),
    }
}

impl Plugin {
    fn path(&self, rel: &str) -> std::path::PathBuf {
        self.dir.path().join(rel)
    }

    async fn identity(&self) -> IdentityClient<Channel> {
        server::clients(&self.path("csi.sock")).await.unwrap().0
    }

    /// Probe's answer: `Ok(())` when ready, else the status's code and message.
    async fn probe(&self) -> Result<(), (Code, String)> {
        match self.identity().await.probe(ProbeRequest {}).await {
            Ok(r) => {
                assert_eq!(r.into_inner().ready, Some(BoolValue { value: true }));
                Ok(())
            }
            Err(s) => Err((s.code(), s.message().to_owned())),
        }
    }

    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.task.take().unwrap().await.unwrap().unwrap();
    }
}

fn failed(r: Result<(), (Code, String)>) -> String {
    let (code, message) = r.expect_err("probe answered ready");
    assert_eq!(code, Code::FailedPrecondition, "{message}");
    message
}

#[tokio::test]
async fn ready_with_a_writable_state_directory_and_no_transport_in_use() {
    let p = start(&[]).await;
    assert_eq!(p.probe().await, Ok(()));
    // No file of the write check is left among the records.
    let left: Vec<_> = std::fs::read_dir(p.path("state/volumes"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "{left:?}");
    p.stop().await;
}

#[tokio::test]
async fn a_missing_state_directory_is_named() {
    let p = start(&[]).await;
    std::fs::remove_dir_all(p.path("state")).unwrap();
    let m = failed(p.probe().await);
    assert!(m.contains("state directory"), "{m}");
    assert!(
        m.contains(&p.path("state/volumes").display().to_string()),
        "{m}"
    );
    p.stop().await;
}

#[tokio::test]
async fn nvme_needs_nvme_fabrics_under_the_root() {
    let p = start(&[Transport::Nvme]).await;
    let m = failed(p.probe().await);
    assert!(
        m.contains(&p.path("root/dev/nvme-fabrics").display().to_string()),
        "{m}"
    );
    assert!(m.contains("NVMe"), "{m}");
    // A regular file is not the kernel's device.
    std::fs::write(p.path("root/dev/nvme-fabrics"), "").unwrap();
    let m = failed(p.probe().await);
    assert!(m.contains("not a character device"), "{m}");
    // A character device is (the test's /dev/null stands for it).
    std::fs::remove_file(p.path("root/dev/nvme-fabrics")).unwrap();
    std::os::unix::fs::symlink("/dev/null", p.path("root/dev/nvme-fabrics")).unwrap();
    assert_eq!(p.probe().await, Ok(()));
    p.stop().await;
}

/// A stage record of an NVMe volume makes NVMe used, with no `--transports`.
#[tokio::test]
async fn a_staged_nvme_volume_makes_nvme_checked() {
    let p = start(&[]).await;
    assert_eq!(p.probe().await, Ok(()));
    use lunkit_csi::state::{Access, Phase, RECORD_VERSION, Record, Store, Target};
    let r = Record {
        version: RECORD_VERSION,
        volume_id: "pv-nvme".into(),
        staging_path: "/staging/pv-nvme".into(),
        phase: Phase::Staged,
        target: Target::Nvme {
            nqn: "nqn.2014-08.org.example:a".into(),
            portals: vec!["127.0.0.1:4420".into()],
            discovery: Vec::new(),
            nsid: Some(1),
            device_uuid: None,
            device_wwid: None,
            host_nqn: None,
            host_id: None,
            dhchap: Default::default(),
        },
        access: Access::Block,
        wwid: None,
        expected_wwid: None,
        device: None,
        map: false,
        published: Vec::new(),
    };
    let store = Store::open(&p.path("state")).unwrap();
    store.save(&r).unwrap();
    let m = failed(p.probe().await);
    assert!(m.contains("nvme-fabrics"), "{m}");
    store.remove("pv-nvme").unwrap();
    assert_eq!(p.probe().await, Ok(()));
    p.stop().await;
}

/// iSCSI needs something listening on iscsid's abstract socket. The build machine runs no
/// iscsid (the VM test stops and starts a real one): the test listens there itself.
#[tokio::test]
async fn iscsi_needs_iscsid_listening_on_its_abstract_socket() {
    let p = start(&[Transport::Iscsi]).await;
    let addr = probe::abstract_addr(probe::ISCSID_SOCKET).unwrap();
    let listener = match UnixListener::bind_addr(&addr) {
        Ok(l) => l,
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
            // An iscsid runs on this machine: only the ready half can be tested here.
            assert_eq!(p.probe().await, Ok(()));
            return p.stop().await;
        }
        Err(e) => panic!("listen on @{}: {e}", probe::ISCSID_SOCKET),
    };
    assert_eq!(p.probe().await, Ok(()));
    drop(listener);
    let m = failed(p.probe().await);
    assert!(m.contains("@ISCSIADM_ABSTRACT_NAMESPACE"), "{m}");
    assert!(m.contains("iscsid"), "{m}");
    p.stop().await;
}

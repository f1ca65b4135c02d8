//! The plugin served on a Unix socket in a temporary directory and called through a real tonic
//! client: identity, capabilities, and every bad request answered with the code the CSI spec
//! names, before anything touches the node.

use std::collections::HashMap;
use std::path::Path;

use lunkit_csi::proto::node_client::NodeClient;
use lunkit_csi::proto::volume_capability::{
    AccessMode, AccessType, BlockVolume, MountVolume, access_mode::Mode,
};
use lunkit_csi::proto::*;
use lunkit_csi::{Config, IdentityService, NodeService, server};
use tonic::Code;
use tonic::transport::Channel;

struct Plugin {
    dir: tempfile::TempDir,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<lunkit_csi::Result<()>>>,
}

async fn start() -> Plugin {
    start_with_topology(&[]).await
}

/// The plugin, reporting `topology` (as `--topology` would give it) when not empty.
async fn start_with_topology(topology: &[(&str, &str)]) -> Plugin {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("csi/csi.sock");
    let mut config = Config::new("node-a");
    config.state_dir = dir.path().join("state");
    config.max_volumes = 17;
    let pairs: Vec<(String, String)> = topology
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    config.topology = lunkit_csi::topology::segments(&pairs).unwrap();
    let constrained = !config.topology.is_empty();
    let node = NodeService::new(config).unwrap();
    let listener = server::bind(&sock).unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(server::serve(
        listener,
        IdentityService::new("csi.lunkit.invalid").accessibility_constraints(constrained),
        node,
        async {
            let _ = rx.await;
        },
    ));
    Plugin {
        dir,
        stop: Some(tx),
        task: Some(task),
    }
}

impl Plugin {
    fn socket(&self) -> std::path::PathBuf {
        self.dir.path().join("csi/csi.sock")
    }

    async fn node(&self) -> NodeClient<Channel> {
        server::clients(&self.socket()).await.unwrap().1
    }

    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.task.take().unwrap().await.unwrap().unwrap();
    }
}

fn mount_cap(mode: Mode) -> Option<VolumeCapability> {
    Some(VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume::default())),
        access_mode: Some(AccessMode { mode: mode as i32 }),
    })
}

fn block_cap(mode: Mode) -> Option<VolumeCapability> {
    Some(VolumeCapability {
        access_type: Some(AccessType::Block(BlockVolume {})),
        access_mode: Some(AccessMode { mode: mode as i32 }),
    })
}

fn attrs() -> HashMap<String, String> {
    [
        ("targetPortal", "127.0.0.1:3260"),
        ("iqn", "iqn.2003-01.org.linux-iscsi.lunkit:lab"),
        ("lun", "0"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

fn stage_req(dir: &Path) -> NodeStageVolumeRequest {
    NodeStageVolumeRequest {
        volume_id: "pv-1".into(),
        staging_target_path: dir.join("staging").display().to_string(),
        volume_capability: mount_cap(Mode::SingleNodeWriter),
        volume_context: attrs(),
        ..Default::default()
    }
}

#[tokio::test]
async fn identity_and_node_info_over_the_socket() {
    let p = start().await;
    let (mut id, mut node) = server::clients(&p.socket()).await.unwrap();
    let info = id
        .get_plugin_info(GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, "csi.lunkit.invalid");
    assert_eq!(info.vendor_version, env!("CARGO_PKG_VERSION"));
    let probe = id.probe(ProbeRequest {}).await.unwrap().into_inner();
    assert_eq!(probe.ready, Some(BoolValue { value: true }));
    let caps = id
        .get_plugin_capabilities(GetPluginCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        caps.capabilities.len(),
        1,
        "online expansion only, no controller"
    );

    let ni = node
        .node_get_info(NodeGetInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ni.node_id, "node-a");
    assert_eq!(ni.max_volumes_per_node, 17);
    assert_eq!(ni.accessible_topology, None, "no --topology, no topology");
    let nc = node
        .node_get_capabilities(NodeGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    use node_service_capability::{Type, rpc::Type as T};
    let got: Vec<i32> = nc
        .capabilities
        .iter()
        .map(|c| match c.r#type {
            Some(Type::Rpc(r)) => r.r#type,
            None => -1,
        })
        .collect();
    assert_eq!(
        got,
        [
            T::StageUnstageVolume,
            T::GetVolumeStats,
            T::ExpandVolume,
            T::VolumeCondition
        ]
        .map(|t| t as i32)
    );
    p.stop().await;
}

#[tokio::test]
async fn node_info_reports_the_topology_and_the_plugin_its_constraints() {
    let p = start_with_topology(&[
        ("topology.kubernetes.io/zone", "eu-1a"),
        ("topology.kubernetes.io/region", "eu-1"),
    ])
    .await;
    let (mut id, mut node) = server::clients(&p.socket()).await.unwrap();
    let ni = node
        .node_get_info(NodeGetInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    let segments = ni.accessible_topology.expect("a topology").segments;
    assert_eq!(
        segments,
        HashMap::from([
            ("topology.kubernetes.io/zone".to_owned(), "eu-1a".to_owned()),
            (
                "topology.kubernetes.io/region".to_owned(),
                "eu-1".to_owned()
            ),
        ])
    );
    // A plugin that reports a node's topology MUST offer VOLUME_ACCESSIBILITY_CONSTRAINTS.
    use plugin_capability::{Service, Type, service};
    let caps = id
        .get_plugin_capabilities(GetPluginCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner()
        .capabilities;
    assert_eq!(caps.len(), 2, "{caps:?}");
    assert!(
        caps.iter().any(|c| c.r#type
            == Some(Type::Service(Service {
                r#type: service::Type::VolumeAccessibilityConstraints as i32
            }))),
        "{caps:?}"
    );
    p.stop().await;
}

#[tokio::test]
async fn bad_stage_requests_are_invalid_argument_naming_the_field() {
    let p = start().await;
    let mut node = p.node().await;
    let base = stage_req(p.dir.path());
    let cases: Vec<(NodeStageVolumeRequest, &str)> = vec![
        (
            NodeStageVolumeRequest {
                volume_id: String::new(),
                ..base.clone()
            },
            "volume_id is missing",
        ),
        (
            NodeStageVolumeRequest {
                staging_target_path: String::new(),
                ..base.clone()
            },
            "staging_target_path is missing",
        ),
        (
            NodeStageVolumeRequest {
                volume_capability: None,
                ..base.clone()
            },
            "volume_capability is missing",
        ),
        (
            NodeStageVolumeRequest {
                volume_capability: Some(VolumeCapability {
                    access_type: None,
                    ..base.volume_capability.clone().unwrap()
                }),
                ..base.clone()
            },
            "no access type",
        ),
        (
            NodeStageVolumeRequest {
                volume_capability: mount_cap(Mode::Unknown),
                ..base.clone()
            },
            "access mode Unknown",
        ),
        (
            NodeStageVolumeRequest {
                volume_capability: mount_cap(Mode::MultiNodeMultiWriter),
                ..base.clone()
            },
            "access mode MultiNodeMultiWriter is not supported for mount access",
        ),
        (
            NodeStageVolumeRequest {
                volume_capability: Some(VolumeCapability {
                    access_type: Some(AccessType::Mount(MountVolume {
                        fs_type: "ntfs".into(),
                        ..Default::default()
                    })),
                    access_mode: Some(AccessMode {
                        mode: Mode::SingleNodeWriter as i32,
                    }),
                }),
                ..base.clone()
            },
            "filesystem type \"ntfs\" is not supported",
        ),
        (
            NodeStageVolumeRequest {
                volume_context: HashMap::new(),
                ..base.clone()
            },
            "volume pv-1: volume attribute iqn: missing",
        ),
    ];
    for (req, message) in cases {
        let status = node.node_stage_volume(req).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{}", status.message());
        assert!(
            status.message().contains(message),
            "{:?} lacks {message:?}",
            status.message()
        );
    }
    // Nothing was recorded for any of them.
    let records = std::fs::read_dir(p.dir.path().join("state/volumes"))
        .unwrap()
        .count();
    assert_eq!(records, 0);
    p.stop().await;
}

#[tokio::test]
async fn bad_publish_unpublish_unstage_stats_and_expand_requests() {
    let p = start().await;
    let mut node = p.node().await;
    let target = p.dir.path().join("pod/vol").display().to_string();
    let staging = p.dir.path().join("staging").display().to_string();
    let publish = NodePublishVolumeRequest {
        volume_id: "pv-1".into(),
        staging_target_path: staging.clone(),
        target_path: target.clone(),
        volume_capability: block_cap(Mode::SingleNodeWriter),
        ..Default::default()
    };
    for (req, message) in [
        (
            NodePublishVolumeRequest {
                target_path: String::new(),
                ..publish.clone()
            },
            "target_path is missing",
        ),
        (
            NodePublishVolumeRequest {
                staging_target_path: String::new(),
                ..publish.clone()
            },
            "staging_target_path is missing",
        ),
        (
            NodePublishVolumeRequest {
                volume_id: String::new(),
                ..publish.clone()
            },
            "volume_id is missing",
        ),
        (
            NodePublishVolumeRequest {
                volume_capability: None,
                ..publish.clone()
            },
            "volume_capability is missing",
        ),
    ] {
        let s = node.node_publish_volume(req).await.unwrap_err();
        assert_eq!(s.code(), Code::InvalidArgument, "{}", s.message());
        assert!(
            s.message().contains(message),
            "{:?} lacks {message:?}",
            s.message()
        );
    }
    // Well-formed, but the volume was never staged here.
    let s = node.node_publish_volume(publish).await.unwrap_err();
    assert_eq!(s.code(), Code::FailedPrecondition, "{}", s.message());
    assert!(
        s.message().contains("volume pv-1 is not staged"),
        "{}",
        s.message()
    );

    let s = node
        .node_unpublish_volume(NodeUnpublishVolumeRequest {
            volume_id: "pv-1".into(),
            target_path: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::InvalidArgument);
    let s = node
        .node_unstage_volume(NodeUnstageVolumeRequest {
            volume_id: String::new(),
            staging_target_path: staging.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::InvalidArgument);
    let s = node
        .node_unstage_volume(NodeUnstageVolumeRequest {
            volume_id: "pv-1".into(),
            staging_target_path: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::InvalidArgument);

    // Unpublish and unstage of what is not there succeed (idempotent), twice.
    for _ in 0..2 {
        node.node_unpublish_volume(NodeUnpublishVolumeRequest {
            volume_id: "pv-1".into(),
            target_path: target.clone(),
        })
        .await
        .unwrap();
        node.node_unstage_volume(NodeUnstageVolumeRequest {
            volume_id: "pv-1".into(),
            staging_target_path: staging.clone(),
        })
        .await
        .unwrap();
    }

    let stats = |path: &str| NodeGetVolumeStatsRequest {
        volume_id: "pv-1".into(),
        volume_path: path.into(),
        staging_target_path: String::new(),
    };
    let s = node.node_get_volume_stats(stats("")).await.unwrap_err();
    assert_eq!(s.code(), Code::InvalidArgument);
    let s = node
        .node_get_volume_stats(stats(&target))
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::NotFound, "{}", s.message());
    assert!(s.message().contains("does not exist"), "{}", s.message());
    // The path exists, the volume is not staged.
    let s = node
        .node_get_volume_stats(stats(&p.dir.path().display().to_string()))
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::NotFound, "{}", s.message());

    let expand = NodeExpandVolumeRequest {
        volume_id: "pv-1".into(),
        volume_path: target.clone(),
        capacity_range: Some(CapacityRange {
            required_bytes: -1,
            limit_bytes: 0,
        }),
        ..Default::default()
    };
    let s = node
        .node_expand_volume(NodeExpandVolumeRequest {
            volume_path: String::new(),
            ..expand.clone()
        })
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::InvalidArgument);
    let s = node.node_expand_volume(expand.clone()).await.unwrap_err();
    assert_eq!(s.code(), Code::InvalidArgument);
    assert!(s.message().contains("negative"), "{}", s.message());
    let s = node
        .node_expand_volume(NodeExpandVolumeRequest {
            capacity_range: None,
            ..expand
        })
        .await
        .unwrap_err();
    // The spec's code for a volume the node does not know.
    assert_eq!(s.code(), Code::NotFound, "{}", s.message());
    p.stop().await;
}

#[tokio::test]
async fn a_stale_socket_is_replaced_and_a_file_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("csi.sock");
    drop(server::bind(&sock).unwrap());
    assert!(sock.exists(), "the listener leaves its socket file behind");
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&sock).unwrap().permissions().mode() & 0o7777;
        assert_eq!(
            mode, 0o660,
            "the socket is open to its owner and group only"
        );
    }
    drop(server::bind(&sock).unwrap());
    let file = dir.path().join("file");
    std::fs::write(&file, b"x").unwrap();
    let e = server::bind(&file).unwrap_err();
    assert!(e.to_string().contains("is not a socket"), "{e}");
    assert_eq!(std::fs::read(&file).unwrap(), b"x");
    assert!(server::socket_path("tcp://127.0.0.1:1").is_err());
    assert_eq!(
        server::socket_path("unix:///run/csi.sock").unwrap(),
        Path::new("/run/csi.sock")
    );
}

/// A stage record as an earlier NodeStageVolume left it, written straight into the state
/// directory: the plugin must answer from it without touching the node.
fn seed(dir: &Path, record: lunkit_csi::state::Record) {
    lunkit_csi::state::Store::open(&dir.join("state"))
        .unwrap()
        .save(&record)
        .unwrap();
}

fn staged_record(dir: &Path, access: lunkit_csi::state::Access) -> lunkit_csi::state::Record {
    lunkit_csi::state::Record {
        version: lunkit_csi::state::RECORD_VERSION,
        volume_id: "pv-1".into(),
        staging_path: dir.join("staging"),
        phase: lunkit_csi::state::Phase::Staged,
        target: lunkit_csi::state::Target::Iscsi {
            iqn: "iqn.2003-01.org.linux-iscsi.lunkit:lab".into(),
            portals: vec!["127.0.0.1:3260".into()],
            iface: None,
            lun: 0,
            discovered: Vec::new(),
            fence: None,
        },
        access,
        wwid: Some("36001405a1b2c3d4e5f60718293a4b5c6".into()),
        expected_wwid: None,
        device: Some("/dev/lunkit-csi-test-no-such-device".into()),
        map: false,
        published: Vec::new(),
    }
}

#[tokio::test]
async fn requests_that_disagree_with_the_stage_record_are_refused() {
    use lunkit_csi::state::Access;
    let p = start().await;
    let mut node = p.node().await;
    let dir = p.dir.path();
    seed(
        dir,
        staged_record(
            dir,
            Access::Mount {
                fs_type: "ext4".into(),
            },
        ),
    );

    // Staged elsewhere, or as something else: ALREADY_EXISTS, naming where it is staged.
    let mut other_path = stage_req(dir);
    other_path.staging_target_path = dir.join("elsewhere").display().to_string();
    let s = node.node_stage_volume(other_path).await.unwrap_err();
    assert_eq!(s.code(), Code::AlreadyExists, "{}", s.message());
    assert!(
        s.message()
            .contains(&dir.join("staging").display().to_string()),
        "{}",
        s.message()
    );
    let mut other_lun = stage_req(dir);
    other_lun.volume_context.insert("lun".into(), "1".into());
    let s = node.node_stage_volume(other_lun).await.unwrap_err();
    assert_eq!(s.code(), Code::AlreadyExists, "{}", s.message());

    // Published as block while staged as a filesystem; published from another staging path.
    let target = dir.join("pod/vol").display().to_string();
    let publish = NodePublishVolumeRequest {
        volume_id: "pv-1".into(),
        staging_target_path: dir.join("staging").display().to_string(),
        target_path: target.clone(),
        volume_capability: block_cap(Mode::SingleNodeWriter),
        ..Default::default()
    };
    let s = node.node_publish_volume(publish.clone()).await.unwrap_err();
    assert_eq!(s.code(), Code::InvalidArgument, "{}", s.message());
    assert!(s.message().contains("staged for Mount"), "{}", s.message());
    let s = node
        .node_publish_volume(NodePublishVolumeRequest {
            staging_target_path: dir.join("elsewhere").display().to_string(),
            volume_capability: mount_cap(Mode::SingleNodeWriter),
            ..publish
        })
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::FailedPrecondition, "{}", s.message());
    assert!(
        !Path::new(&target).exists(),
        "nothing was made at the target path"
    );

    // Unstaged from another staging path than it was staged at.
    let s = node
        .node_unstage_volume(NodeUnstageVolumeRequest {
            volume_id: "pv-1".into(),
            staging_target_path: dir.join("elsewhere").display().to_string(),
        })
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::InvalidArgument, "{}", s.message());
    let store = lunkit_csi::state::Store::open(&dir.join("state")).unwrap();
    assert!(store.load("pv-1").unwrap().is_some(), "the record stays");
    p.stop().await;
}

#[tokio::test]
/// NodeExpandVolume of an NVMe volume goes to lunkit's NVMe resize, and a namespace that is
/// not on the node (this fixture root has none) is NOT_FOUND, naming it; a staged record
/// whose namespace id was never learned is FAILED_PRECONDITION. (Growing one is
/// tests/vm_csi.rs.)
async fn expanding_an_nvme_volume_resizes_that_namespace() {
    use lunkit_csi::state::{Access, Target};
    let p = start().await;
    let mut node = p.node().await;
    let dir = p.dir.path();
    let mut r = staged_record(dir, Access::Block);
    r.target = Target::Nvme {
        nqn: "nqn.2014-08.org.lunkit:lab".into(),
        portals: vec!["127.0.0.1:4420".into()],
        discovery: Vec::new(),
        nsid: Some(1),
        device_uuid: None,
        device_wwid: None,
        host_nqn: None,
        host_id: None,
        dhchap: Default::default(),
    };
    seed(dir, r);
    let s = node
        .node_expand_volume(NodeExpandVolumeRequest {
            volume_id: "pv-1".into(),
            volume_path: dir.display().to_string(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::NotFound, "{}", s.message());
    assert!(
        s.message()
            .contains("NVMe nqn.2014-08.org.lunkit:lab namespace 1"),
        "{}",
        s.message()
    );

    let mut r = staged_record(dir, Access::Block);
    r.target = Target::Nvme {
        nqn: "nqn.2014-08.org.lunkit:lab".into(),
        portals: vec!["127.0.0.1:4420".into()],
        discovery: Vec::new(),
        nsid: None,
        device_uuid: Some("963dcb64-5e7a-4000-8000-000000000001".into()),
        device_wwid: None,
        host_nqn: None,
        host_id: None,
        dhchap: Default::default(),
    };
    seed(dir, r);
    let s = node
        .node_expand_volume(NodeExpandVolumeRequest {
            volume_id: "pv-1".into(),
            volume_path: dir.display().to_string(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::FailedPrecondition, "{}", s.message());
    p.stop().await;
}

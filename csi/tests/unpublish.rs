//! NodeUnpublishVolume removes only what the volume's stage record lists as published: any
//! other `target_path` is one the volume is not published at, answered with success (as the
//! spec answers an unpublish that is done already) and left as it is.

use std::fs;
use std::path::{Path, PathBuf};

use lunkit_csi::proto::NodeUnpublishVolumeRequest;
use lunkit_csi::proto::node_server::Node;
use lunkit_csi::state::{Access, Phase, RECORD_VERSION, Record, Store, Target};
use lunkit_csi::{Config, NodeService};

fn record(dir: &Path, published: Vec<PathBuf>) -> Record {
    Record {
        version: RECORD_VERSION,
        volume_id: "pv-1".into(),
        staging_path: dir.join("staging"),
        phase: Phase::Staged,
        target: Target::Iscsi {
            iqn: "iqn.2003-01.org.linux-iscsi.lunkit:lab".into(),
            portals: vec!["127.0.0.1:3260".into()],
            iface: None,
            lun: 0,
            discovered: Vec::new(),
            fence: None,
        },
        access: Access::Mount {
            fs_type: "ext4".into(),
        },
        wwid: Some("36001405a1b2c3d4e5f60718293a4b5c6".into()),
        expected_wwid: None,
        device: Some("/dev/lunkit-csi-test-no-such-device".into()),
        map: false,
        published,
    }
}

async fn unpublish(node: &NodeService, id: &str, target: &Path) {
    node.node_unpublish_volume(tonic::Request::new(NodeUnpublishVolumeRequest {
        volume_id: id.into(),
        target_path: target.display().to_string(),
    }))
    .await
    .unwrap_or_else(|e| panic!("unpublish {id} at {}: {e:?}", target.display()));
}

#[tokio::test]
async fn unpublish_removes_only_the_paths_the_record_lists() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let mut config = Config::new("node-a");
    config.state_dir = dir.join("state");
    config.follow_discovery = false;
    let node = NodeService::new(config).unwrap();

    let ours = dir.join("pods/a/volumes/pv-1");
    fs::create_dir_all(&ours).unwrap();
    // Another pod's directory, and a file of a pod's: never published here by this plugin.
    let other = dir.join("pods/b/volumes/pv-9");
    fs::create_dir_all(&other).unwrap();
    let file = dir.join("pods/c/data");
    fs::create_dir_all(file.parent().unwrap()).unwrap();
    fs::write(&file, b"a pod's data").unwrap();
    let store = Store::open(&dir.join("state")).unwrap();
    store.save(&record(dir, vec![ours.clone()])).unwrap();

    for _ in 0..2 {
        unpublish(&node, "pv-1", &other).await;
        unpublish(&node, "pv-1", &file).await;
        // A volume with no record lists nothing.
        unpublish(&node, "pv-2", &other).await;
    }
    assert!(other.is_dir(), "{} was removed", other.display());
    assert_eq!(fs::read(&file).unwrap(), b"a pod's data");
    assert_eq!(
        store.load("pv-1").unwrap().unwrap().published,
        vec![ours.clone()],
        "the record is unchanged"
    );

    // The listed path is removed and forgotten; again, it is done already.
    unpublish(&node, "pv-1", &ours).await;
    assert!(!ours.exists(), "{} is left", ours.display());
    assert!(store.load("pv-1").unwrap().unwrap().published.is_empty());
    unpublish(&node, "pv-1", &ours).await;
}

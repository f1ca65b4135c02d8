//! The one place a node path becomes the plugin's view of it, and back.
//!
//! With `--root /host` the node's `/dev/dm-3` is `/host/dev/dm-3` to the plugin. lunkit hands
//! out devices under the root (`BlockNode::path`), and looks up the node paths it is given
//! under the root again ([`lunkit::block::resolve`]). So what the plugin keeps (the stage
//! record's device) is the node path, and what it opens, probes, formats, mounts or binds is
//! the plugin's view; every conversion goes through [`to_node`] or [`in_plugin`], never a
//! string join, so a path is never put under the root twice (`/host/host/dev/dm-3`).
//!
//! Paths kubelet gives (staging and target paths) are used as given: a DaemonSet mounts the
//! kubelet directory at the same path in the plugin's container, with bidirectional
//! propagation, so that its mounts reach the pods.

use std::path::{Component, Path, PathBuf};

use lunkit::Root;

use crate::error::{Error, Result};

/// The node path of `path`, a path in the plugin's view under `root`: `/host/dev/dm-3` is
/// `/dev/dm-3` under the root `/host`. A path outside the root has no node path: `None`.
pub fn to_node(root: &Root, path: &Path) -> Option<PathBuf> {
    let rel = path.strip_prefix(root.path()).ok()?;
    if rel.components().any(|c| c == Component::ParentDir) {
        return None;
    }
    Some(Path::new("/").join(rel))
}

/// The plugin's view of the node path `node`: `/dev/dm-3` is `/host/dev/dm-3` under the root
/// `/host`. `node` must be absolute and free of `..`.
pub fn in_plugin(root: &Root, node: &Path) -> Result<PathBuf> {
    let rel = node
        .strip_prefix("/")
        .map_err(|_| Error::Internal(format!("node path {} is not absolute", node.display())))?;
    if rel.components().any(|c| c == Component::ParentDir) {
        return Err(Error::Internal(format!(
            "node path {} contains '..'",
            node.display()
        )));
    }
    Ok(root.path().join(rel))
}

/// Checks at start that `root` can stand for the node's `/`: a directory with `sys/` and
/// `dev/` in it. A root that is not there would make every call fail `NOT_FOUND` later.
pub fn check_root(root: &Root) -> Result<()> {
    for sub in ["", "sys", "dev"] {
        let p = root.path().join(sub);
        match std::fs::metadata(&p) {
            Ok(md) if md.is_dir() => {}
            Ok(_) => {
                return Err(Error::InvalidArgument(format!(
                    "--root {}: {} is not a directory",
                    root.path().display(),
                    p.display()
                )));
            }
            Err(e) => {
                return Err(Error::InvalidArgument(format!(
                    "--root {}: {}: {e}",
                    root.path().display(),
                    p.display()
                )));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_under_the_root_is_recorded_as_its_node_path_and_found_again_once() {
        let root = Root::new("/host");
        let node = to_node(&root, Path::new("/host/dev/dm-3")).unwrap();
        assert_eq!(node, Path::new("/dev/dm-3"));
        assert_eq!(
            in_plugin(&root, &node).unwrap(),
            Path::new("/host/dev/dm-3")
        );
        // Converting twice does not nest the root.
        assert_eq!(
            to_node(&root, &in_plugin(&root, &node).unwrap()).unwrap(),
            node
        );
        let slash = Root::new("/");
        assert_eq!(
            to_node(&slash, Path::new("/dev/sdb")).unwrap(),
            Path::new("/dev/sdb")
        );
        assert_eq!(
            in_plugin(&slash, Path::new("/dev/sdb")).unwrap(),
            Path::new("/dev/sdb")
        );
    }

    #[test]
    fn paths_outside_the_root_or_climbing_out_are_refused() {
        let root = Root::new("/host");
        assert_eq!(to_node(&root, Path::new("/dev/dm-3")), None);
        assert_eq!(to_node(&root, Path::new("/hostile/dev/dm-3")), None);
        assert_eq!(to_node(&root, Path::new("/host/../etc/passwd")), None);
        assert!(in_plugin(&root, Path::new("dev/dm-3")).is_err());
        assert!(in_plugin(&root, Path::new("/dev/../../etc")).is_err());
    }

    #[test]
    fn a_root_that_is_not_there_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let missing = Root::new(dir.path().join("nothing"));
        let e = check_root(&missing).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(e.to_string().contains("nothing"), "{e}");
        // A directory without sys/ and dev/ is not a node's root either.
        let e = check_root(&Root::new(dir.path())).unwrap_err();
        assert!(e.to_string().contains("sys"), "{e}");
        std::fs::create_dir(dir.path().join("sys")).unwrap();
        std::fs::create_dir(dir.path().join("dev")).unwrap();
        check_root(&Root::new(dir.path())).unwrap();
        check_root(&Root::default()).unwrap();
    }
}

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
//! propagation, so that its mounts reach the pods. That directory is kubelet's `--root-dir`,
//! `/var/lib/kubelet` unless the distribution moves it (k0s: `/var/lib/k0s/kubelet`;
//! microk8s: `/var/snap/microk8s/common/var/lib/kubelet`): `--kubelet-dir` names it, and
//! [`kubelet_dir_problem`] says at start what would keep the plugin's mounts there from
//! reaching kubelet.

use std::path::{Component, Path, PathBuf};

use lunkit::Root;
use lunkit::block::mountinfo::MountEntry;

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

/// kubelet's directory unless `--kubelet-dir` names another.
pub const KUBELET_DIR: &str = "/var/lib/kubelet";

/// `--kubelet-dir`: an absolute path with no `.` or `..` in it (kubelet's staging and target
/// paths are compared with it as given, so it must be written the way kubelet writes them).
pub fn kubelet_dir(text: &str) -> std::result::Result<PathBuf, String> {
    let path = Path::new(text);
    if !path.is_absolute() {
        return Err(format!(
            "{text:?} is not an absolute path (kubelet's --root-dir, {KUBELET_DIR} by default)"
        ));
    }
    // Split by hand: `Path::components` drops a `.` and collapses `//`.
    let plain = text == "/"
        || text
            .split('/')
            .skip(1)
            .all(|part| !part.is_empty() && part != "." && part != "..");
    if !plain {
        return Err(format!(
            "{text:?} is not written plainly: give it as kubelet's --root-dir names it, with no \
             '.', '..', '//' or trailing '/'"
        ));
    }
    Ok(path.to_path_buf())
}

/// What would keep the plugin's staging and publish mounts under kubelet's directory `dir`
/// from reaching kubelet and the pods, given whether `dir` is a directory here and this
/// mount namespace's table `mounts`; `None` when nothing does. The mount `dir` is on must
/// propagate to the host (a `shared:` tag: `mountPropagation: Bidirectional` in a pod):
/// without it every mount the plugin makes stays in its own namespace, and pods get an
/// empty directory.
pub fn kubelet_dir_problem(dir: &Path, is_dir: bool, mounts: &[MountEntry]) -> Option<String> {
    if !is_dir {
        return Some(format!(
            "--kubelet-dir {}: not a directory here, so kubelet's staging and target paths \
             will not be found: mount kubelet's directory at the same path, or name it with \
             --kubelet-dir",
            dir.display()
        ));
    }
    // The mount `dir` is on: the last-mounted one whose mount point is `dir` or above it.
    let on = mounts
        .iter()
        .rev()
        .filter(|m| dir.starts_with(&m.mount_point))
        .max_by_key(|m| m.mount_point.components().count())?;
    if on.tags.iter().any(|t| t.starts_with("shared:")) {
        return None;
    }
    Some(format!(
        "--kubelet-dir {}: its mount ({}) does not propagate to the host, so the volumes the \
         plugin mounts there never reach kubelet or the pods: mount it with \
         mountPropagation: Bidirectional",
        dir.display(),
        on.mount_point.display()
    ))
}

/// [`kubelet_dir_problem`] for this process's mount namespace.
pub fn check_kubelet_dir(dir: &Path) -> Option<String> {
    let mounts = match crate::mounts::table() {
        Ok(m) => m,
        Err(e) => return Some(format!("--kubelet-dir {}: {e}", dir.display())),
    };
    kubelet_dir_problem(dir, dir.is_dir(), &mounts)
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

    #[test]
    fn the_kubelet_dir_must_be_absolute_and_plain() {
        assert_eq!(
            kubelet_dir("/var/lib/k0s/kubelet").unwrap(),
            Path::new("/var/lib/k0s/kubelet")
        );
        kubelet_dir(KUBELET_DIR).unwrap();
        for bad in [
            "var/lib/kubelet",
            "",
            "/var/lib/../kubelet",
            "/var/./lib",
            "/var//lib",
            "/var/lib/kubelet/",
        ] {
            let e = kubelet_dir(bad).unwrap_err();
            assert!(e.contains(&format!("{bad:?}")), "{e}");
        }
    }

    #[test]
    fn a_kubelet_dir_on_a_mount_that_does_not_propagate_is_a_problem() {
        let table = |text: &str| lunkit::block::mountinfo::parse_table(text.as_bytes()).mounts;
        let dir = Path::new("/var/lib/kubelet");
        // A pod's hostPath with Bidirectional propagation: shared.
        let pod = table(
            "1 0 0:30 / / ro - overlay overlay rw\n\
             2 1 8:1 /var/lib/kubelet /var/lib/kubelet rw shared:4 - ext4 /dev/sda1 rw\n",
        );
        assert_eq!(kubelet_dir_problem(dir, true, &pod), None);
        // The same with HostToContainer (a slave) or none: nothing reaches kubelet.
        let slave = table(
            "1 0 0:30 / / rw shared:1 - overlay overlay rw\n\
             2 1 8:1 /var/lib/kubelet /var/lib/kubelet rw master:4 - ext4 /dev/sda1 rw\n",
        );
        let why = kubelet_dir_problem(dir, true, &slave).unwrap();
        assert!(why.contains("Bidirectional"), "{why}");
        assert!(why.contains("(/var/lib/kubelet)"), "{why}");
        // On the host, the directory on a shared / is fine.
        let host = table("1 0 8:1 / / rw shared:1 - ext4 /dev/sda1 rw\n");
        assert_eq!(
            kubelet_dir_problem(Path::new("/var/lib/k0s/kubelet"), true, &host),
            None
        );
        let why = kubelet_dir_problem(dir, false, &host).unwrap();
        assert!(why.contains("not a directory"), "{why}");
    }
}

//! Where the node's `/sys`, `/dev`, `/proc`, `/etc` and `/run` are.
//!
//! Every file lunkit touches is reached through a [`Root`]: `/` on a node, a fixture directory in
//! tests, `/host` in a container that bind-mounts the host's root there. Paths below the root are
//! always built from validated components, never from raw user strings.

use std::path::{Path, PathBuf};

/// The directory that stands for `/` on the node lunkit manages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Root {
    path: PathBuf,
}

impl Default for Root {
    fn default() -> Self {
        Root::new("/")
    }
}

impl Root {
    /// A root at `path` (`/` for the running system).
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Root { path: path.into() }
    }

    /// The root directory itself.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `<root>/sys/<rel>`.
    pub fn sys(&self, rel: impl AsRef<Path>) -> PathBuf {
        self.join("sys", rel.as_ref())
    }

    /// `<root>/dev/<rel>`.
    pub fn dev(&self, rel: impl AsRef<Path>) -> PathBuf {
        self.join("dev", rel.as_ref())
    }

    /// `<root>/proc/<rel>`.
    pub fn proc(&self, rel: impl AsRef<Path>) -> PathBuf {
        self.join("proc", rel.as_ref())
    }

    /// `<root>/etc/<rel>`: the node's configuration (`/etc/nvme/hostnqn`).
    pub fn etc(&self, rel: impl AsRef<Path>) -> PathBuf {
        self.join("etc", rel.as_ref())
    }

    /// `<root>/run/<rel>`.
    pub fn run(&self, rel: impl AsRef<Path>) -> PathBuf {
        self.join("run", rel.as_ref())
    }

    fn join(&self, top: &str, rel: &Path) -> PathBuf {
        // `Path::join` with an absolute argument would replace the root: strip it so that
        // `sys("/class")` still lands below the root.
        let rel = rel.strip_prefix("/").unwrap_or(rel);
        let mut p = self.path.join(top);
        if !rel.as_os_str().is_empty() {
            p.push(rel);
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn joins_below_root() {
        let r = Root::new("/host");
        assert_eq!(
            r.sys("class/scsi_host"),
            Path::new("/host/sys/class/scsi_host")
        );
        assert_eq!(r.sys("/class"), Path::new("/host/sys/class"));
        assert_eq!(r.dev(""), Path::new("/host/dev"));
        assert_eq!(
            r.proc("self/mountinfo"),
            Path::new("/host/proc/self/mountinfo")
        );
        assert_eq!(r.run("lunkit"), Path::new("/host/run/lunkit"));
        assert_eq!(Root::default().sys("block"), Path::new("/sys/block"));
    }
}

//! What Probe checks: that the node has what the plugin needs to serve its volumes.
//!
//! - The state directory is there and writable (a file is made in it and removed): without
//!   it no stage can be recorded, and no unstage after a restart knows what to undo.
//! - `<root>/dev/nvme-fabrics` exists when NVMe/TCP is used: the kernel's `nvme-fabrics`
//!   module makes it, and every connect goes through it.
//! - iscsid answers on its control socket when iSCSI is used: every login and logout goes
//!   through it. The socket is open-iscsi's abstract Unix socket `@ISCSIADM_ABSTRACT_NAMESPACE`
//!   (what `iscsiadm` connects to, and `iscsid.socket` listens on); it is connected to and
//!   closed again, no request is sent, no program runs. Abstract sockets belong to the
//!   network namespace: the plugin runs in the host's (`hostNetwork`).
//!
//! A transport is *used* when the operator says so (`--transports`, for a node that must be
//! ready before its first volume comes), or when a stage record of that transport is in the
//! state directory (a volume staged or being staged: its unstage needs the transport too).
//! FC needs nothing the plugin can check beyond the HBA's driver, which the kernel reports.
//!
//! An unhealthy node is a `FAILED_PRECONDITION` naming everything missing, as the CSI spec
//! asks of Probe ("the plugin is not in a healthy state"); kubernetes-csi's livenessprobe
//! answers its `/healthz` with 500 then, and kubelet restarts the container after the
//! DaemonSet's `failureThreshold`.

use std::collections::BTreeSet;
use std::fs;
use std::io::Write;
use std::os::unix::net::{SocketAddr, UnixStream};
use std::path::Path;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};

use lunkit::Root;

use crate::state::{Store, Target};

/// iscsid's control socket, an abstract Unix socket name (open-iscsi's
/// `ISCSIADM_NAMESPACE`: `usr/mgmt_ipc.h`).
pub const ISCSID_SOCKET: &str = "ISCSIADM_ABSTRACT_NAMESPACE";

/// A transport whose node-side prerequisites Probe checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Transport {
    /// iSCSI: iscsid must answer.
    Iscsi,
    /// NVMe/TCP: `/dev/nvme-fabrics` must exist.
    Nvme,
}

impl FromStr for Transport {
    type Err = String;

    fn from_str(s: &str) -> Result<Transport, String> {
        match s {
            "iscsi" => Ok(Transport::Iscsi),
            "nvme" => Ok(Transport::Nvme),
            _ => Err(format!("{s:?} is not a transport: iscsi or nvme")),
        }
    }
}

/// The transport of a stage record's target; `None` for FC.
fn transport_of(target: &Target) -> Option<Transport> {
    match target {
        Target::Iscsi { .. } => Some(Transport::Iscsi),
        Target::Nvme { .. } => Some(Transport::Nvme),
        Target::Fc { .. } => None,
    }
}

/// What Probe checks on this node.
#[derive(Debug, Clone)]
pub struct Checks {
    root: Root,
    records: Store,
    transports: BTreeSet<Transport>,
}

impl Checks {
    /// Checks of the node at `root`, the stage records in `records` (whose directory must be
    /// writable) and the `transports` used whatever is staged.
    pub fn new(root: Root, records: Store, transports: BTreeSet<Transport>) -> Checks {
        Checks {
            root,
            records,
            transports,
        }
    }

    /// Every check that failed, each a sentence naming what is missing; empty when the node
    /// is ready. Blocking (file system, a socket connect): run it off the async runtime.
    pub fn missing(&self) -> Vec<String> {
        let mut missing = Vec::new();
        let state = self.records.dir();
        if let Err(e) = writable(state) {
            missing.push(format!(
                "the state directory {} is not writable: {e}",
                state.display()
            ));
        }
        for t in self.used() {
            let problem = match t {
                Transport::Nvme => self.nvme_fabrics(),
                Transport::Iscsi => iscsid().err(),
            };
            missing.extend(problem);
        }
        missing
    }

    /// The transports used: those configured, and those of the records.
    fn used(&self) -> BTreeSet<Transport> {
        let mut used = self.transports.clone();
        // An unreadable directory is reported by the write check.
        if let Ok(records) = self.records.all() {
            used.extend(records.iter().filter_map(|r| transport_of(&r.target)));
        }
        used
    }

    fn nvme_fabrics(&self) -> Option<String> {
        use std::os::unix::fs::FileTypeExt;
        let path = self.root.path().join("dev/nvme-fabrics");
        match fs::metadata(&path) {
            Ok(m) if m.file_type().is_char_device() => None,
            Ok(_) => Some(format!(
                "{} is not a character device (NVMe/TCP)",
                path.display()
            )),
            Err(e) => Some(format!(
                "{} is missing (NVMe/TCP; is the nvme-fabrics module loaded?): {e}",
                path.display()
            )),
        }
    }
}

/// Tells files made by concurrent probes apart.
static PROBES: AtomicU64 = AtomicU64::new(0);

/// Makes, writes and removes a file in `dir`: what saving a record does, short of renaming.
fn writable(dir: &Path) -> std::io::Result<()> {
    let n = PROBES.fetch_add(1, Ordering::Relaxed);
    // Not `.json`: a probe's file is never taken for a record.
    let path = dir.join(format!(".probe-{}-{n}", std::process::id()));
    let written = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
        .and_then(|mut f| f.write_all(b"probe\n"));
    let removed = fs::remove_file(&path);
    written.and(removed)
}

/// Connects to iscsid's control socket and closes the connection again.
fn iscsid() -> Result<(), String> {
    let fail = |e: std::io::Error| {
        format!("iscsid does not answer on its socket @{ISCSID_SOCKET} (iSCSI): {e}")
    };
    let addr = abstract_addr(ISCSID_SOCKET).map_err(fail)?;
    UnixStream::connect_addr(&addr).map(drop).map_err(fail)
}

/// The address of the abstract Unix socket `name` (without the leading NUL).
pub fn abstract_addr(name: &str) -> std::io::Result<SocketAddr> {
    use std::os::linux::net::SocketAddrExt;
    SocketAddr::from_abstract_name(name.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transports_parse_by_their_flag_names() {
        assert_eq!("iscsi".parse(), Ok(Transport::Iscsi));
        assert_eq!("nvme".parse(), Ok(Transport::Nvme));
        assert!("fc".parse::<Transport>().is_err());
        assert!("ISCSI".parse::<Transport>().is_err());
    }
}

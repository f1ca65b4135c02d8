//! `/sys/class/nvme`: NVMe controllers (PCIe and fabrics).

use super::{Confine, attr, entries};
use crate::error::Result;
use crate::root::Root;

/// One NVMe controller, `/sys/class/nvme/nvmeX`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvmeController {
    /// `nvmeX`.
    pub name: String,
    /// `pcie`, `tcp`, `rdma`, `fc` or `loop`.
    pub transport: Option<String>,
    /// Fabrics address (`traddr=…,trsvcid=…`) or PCI address.
    pub address: Option<String>,
    /// `live`, `connecting`, `resetting`, `deleting`, `dead`...
    pub state: Option<String>,
    /// The subsystem NQN.
    pub subsysnqn: Option<String>,
    /// Model string.
    pub model: Option<String>,
    /// Serial number.
    pub serial: Option<String>,
    /// Namespace block devices below the controller (`nvme0n1`, or `nvme0c0n1` paths under
    /// native multipath).
    pub namespaces: Vec<String>,
}

/// Whether `name` looks like `nvme<X>n<N>` or `nvme<S>c<X>n<N>`.
fn is_namespace(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("nvme") else {
        return false;
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let Some((ctrl, ns)) = rest.split_once('n') else {
        return false;
    };
    let ctrl_ok = match ctrl.split_once('c') {
        Some((s, c)) => digits(s) && digits(c),
        None => digits(ctrl),
    };
    ctrl_ok && digits(ns)
}

/// Reads every NVMe controller.
pub fn controllers(root: &Root) -> Result<Vec<NvmeController>> {
    let class = root.sys("class/nvme");
    let confine = Confine::new(root);
    let mut out = Vec::new();
    for name in entries(&class)? {
        let Some(d) = confine.dir(&class.join(&name)) else {
            continue;
        };
        out.push(NvmeController {
            transport: attr(&d, "transport"),
            address: attr(&d, "address"),
            state: attr(&d, "state"),
            subsysnqn: attr(&d, "subsysnqn"),
            model: attr(&d, "model"),
            serial: attr(&d, "serial"),
            namespaces: entries(&d)?
                .into_iter()
                .filter(|n| is_namespace(n))
                .collect(),
            name,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_names() {
        for yes in ["nvme0n1", "nvme12n3", "nvme0c1n1"] {
            assert!(is_namespace(yes), "{yes}");
        }
        for no in [
            "nvme0",
            "nvme0n",
            "nvmen1",
            "nvme0n1p1",
            "nvme-subsys0",
            "ng0n1",
        ] {
            assert!(!is_namespace(no), "{no}");
        }
    }
}

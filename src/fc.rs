//! Fibre Channel transport discovery: which hosts, channels and target ids lead to a target
//! WWPN.
//!
//! The kernel's `fc_user_scan` skips remote ports without a SCSI target id and ports that are
//! not Online (or Marginal), so lunkit selects the same ports and scans `C T L` on exactly
//! their hosts.

use crate::error::{Error, Result};
use crate::hctl::Hctl;
use crate::root::Root;
use crate::scsi::{self, PathDevice, ScanOptions, ScanTarget};
use crate::sysfs::fc::{FcRemotePort, hosts, remote_ports};
use crate::wwn::Wwn;

/// The remote ports a scan for `target` goes through: that port name, the `FCP Target` role,
/// a bound SCSI target id, `Online` or `Marginal`, and, when `initiators` is not empty, seen
/// by one of those local ports.
pub fn target_ports(root: &Root, target: Wwn, initiators: &[Wwn]) -> Result<Vec<FcRemotePort>> {
    let local = hosts(root)?;
    let found: Vec<FcRemotePort> = remote_ports(root)?
        .into_iter()
        .filter(|r| r.port_name == Some(target) && r.is_fcp_target() && r.scsi_target_id.is_some())
        .filter(|r| matches!(r.port_state.as_deref(), Some("Online" | "Marginal")))
        .filter(|r| {
            initiators.is_empty()
                || local.iter().any(|h| {
                    h.host == r.host && h.port_name.is_some_and(|p| initiators.contains(&p))
                })
        })
        .collect();
    if found.is_empty() {
        return Err(Error::NotFound {
            what: format!("online FC target port {target}"),
        });
    }
    Ok(found)
}

/// Scans LUN `lun` through every port that leads to `target` and returns one path device per
/// port. With `wildcard`, writes `- - L` (every channel and target of the host) instead of the
/// exact `C T L`; only the paths of `target` are waited for and returned either way.
pub fn scan(
    root: &Root,
    target: Wwn,
    initiators: &[Wwn],
    lun: u64,
    wildcard: bool,
    opts: &ScanOptions,
) -> Result<Vec<PathDevice>> {
    let targets: Vec<ScanTarget> = target_ports(root, target, initiators)?
        .iter()
        .filter_map(|r| {
            let hctl = Hctl::new(r.host, r.channel, r.scsi_target_id?, lun);
            Some(if wildcard {
                ScanTarget {
                    hctl,
                    request: format!("- - {lun}"),
                }
            } else {
                ScanTarget::exact(hctl)
            })
        })
        .collect();
    scsi::scan_targets(root, &targets, opts)
}

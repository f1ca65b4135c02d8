//! Fibre Channel transport discovery: which hosts, channels and target ids lead to a target
//! WWPN.
//!
//! The kernel's `fc_user_scan` skips remote ports without a SCSI target id and ports that are
//! not Online (or Marginal), so lunkit selects the same ports and scans `C T L` on exactly
//! their hosts.

use std::time::Instant;

use self::sysfs::{FcPortState, FcRemotePort, hosts, remote_ports};
use crate::error::{Error, Result};
use crate::id::Hctl;
use crate::id::Wwn;
use crate::root::Root;
use crate::scsi::ScanTarget;
use crate::scsi::scan::{Candidate, ScanOptions, ScanReport};

pub mod sysfs;

/// No remote port leads to any of `targets`.
fn no_port(targets: &[Wwn]) -> Error {
    Error::NotFound {
        what: format!(
            "no FC remote port {} is on this node; check the target's zoning and LUN \
             masking, and the ports the node sees (`lunkit list`)",
            list(targets)
        ),
    }
}

/// `targets` as people read them: `0x…` or `0x…, 0x…`.
pub(crate) fn list(targets: &[Wwn]) -> String {
    targets
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The most target ports one LUN may be named through. An array has a few per controller;
/// the bound keeps a request from making one scan write per entry of an unbounded list.
pub const MAX_TARGET_PORTS: usize = 64;

/// Checks a list of target ports naming one LUN: at least one, at most
/// [`MAX_TARGET_PORTS`]. Returns them sorted, each once.
pub fn check_target_ports(wwpns: &[Wwn]) -> Result<Vec<Wwn>> {
    if wwpns.is_empty() {
        return Err(Error::invalid(
            "FC target ports",
            "",
            "name at least one target port WWPN",
        ));
    }
    let mut v = wwpns.to_vec();
    v.sort_unstable();
    v.dedup();
    if v.len() > MAX_TARGET_PORTS {
        return Err(Error::invalid(
            "FC target ports",
            &format!("{} ports", v.len()),
            "more target ports than lunkit scans for one LUN (64)",
        ));
    }
    Ok(v)
}

/// Which LUN an FC scan brings in, and through which ports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FcLun {
    /// The target's port names (WWPNs): an array answers on a port per controller, and the
    /// LUN is reached through every one of them the fabric shows. One at least.
    pub wwpns: Vec<Wwn>,
    /// Only through these local ports (initiator WWPNs); empty for every port.
    pub initiators: Vec<Wwn>,
    /// The LUN.
    pub lun: u64,
    /// Write `- - L` (every channel and target of each host) instead of the exact `C T L`;
    /// only this target's paths are waited for and reported either way.
    pub wildcard: bool,
}

impl FcLun {
    /// LUN `lun` behind the target ports `wwpns`, through every local port, with exact
    /// scans.
    pub fn new(wwpns: impl Into<Vec<Wwn>>, lun: u64) -> FcLun {
        FcLun {
            wwpns: wwpns.into(),
            initiators: Vec::new(),
            lun,
            wildcard: false,
        }
    }
}

/// Scans the LUN through every remote port that leads to its target, all at once, and
/// reports every port's outcome; ports the kernel would not scan (not Online or Marginal, no
/// SCSI target id) are listed as skipped and never written to.
///
/// It succeeds when [`ScanOptions::min_paths`] ports brought the LUN; see [`crate::scsi`](crate::scsi#every-path-at-once)
/// for the outcomes and errors.
///
/// An empty or over-long [`FcLun::wwpns`] is [`Error::Invalid`], before anything is read.
pub fn scan(root: &Root, lun: &FcLun, opts: &ScanOptions) -> Result<ScanReport> {
    let start = Instant::now();
    let wwpns = check_target_ports(&lun.wwpns)?;
    // Each path's scan write runs on a helper thread: start them while sysfs is read.
    crate::helper::prewarm(2);
    let local = hosts(root)?;
    let candidates: Vec<Candidate> = remote_ports(root)?
        .into_iter()
        .filter(|r| r.port_name.is_some_and(|p| wwpns.contains(&p)) && r.is_fcp_target())
        .filter(|r| through(r, &local, &lun.initiators))
        .map(|r| {
            // With several target ports, say which one this path leads to.
            let via = match (wwpns.len(), r.port_name) {
                (2.., Some(p)) => format!("host{} {} ({p})", r.host, r.name),
                _ => format!("host{} {}", r.host, r.name),
            };
            let hctl = r
                .scsi_target_id
                .map(|t| Hctl::new(r.host, r.channel, t, lun.lun));
            match (online(&r), hctl) {
                (true, Some(hctl)) => Candidate::Scan {
                    via,
                    target: if lun.wildcard {
                        ScanTarget {
                            hctl,
                            request: format!("- - {}", lun.lun),
                        }
                    } else {
                        ScanTarget::exact(hctl)
                    },
                },
                (_, hctl) => Candidate::Skip {
                    via,
                    hctl,
                    why: match (&r.port_state, hctl) {
                        (_, None) => "the port has no SCSI target id".into(),
                        (Some(st), _) => format!("port state {st}"),
                        (None, _) => "the port state cannot be read".into(),
                    },
                },
            }
        })
        .collect();
    let what = format!("LUN {} of FC target {}", lun.lun, list(&wwpns));
    crate::scsi::scan::scan_paths(
        root,
        &what,
        start,
        candidates,
        &crate::scsi::scan::named,
        &|| no_port(&wwpns),
        opts,
    )
}

/// The port states in which the kernel's `fc_user_scan` scans a remote port.
fn online(r: &FcRemotePort) -> bool {
    matches!(
        r.parsed_port_state,
        Some(FcPortState::Online | FcPortState::Marginal)
    )
}

/// Whether `r` hangs off one of the local ports `initiators` (any, when empty).
fn through(r: &FcRemotePort, local: &[crate::FcHost], initiators: &[Wwn]) -> bool {
    initiators.is_empty()
        || local
            .iter()
            .any(|h| h.host == r.host && h.port_name.is_some_and(|p| initiators.contains(&p)))
}

//! The connects of an NVMe attach: the discovery services asked for the subsystem's paths,
//! the portals given and the paths found connected side by side, and, when the attach
//! fails, the controllers it made deleted again.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::helper;
use crate::id::Nqn;
use crate::nvme::discovery::{self, DiscoverOptions, Discovered, ListedPath, Service};
use crate::nvme::sysfs as sysnvme;
use crate::nvme::{self as fabrics_nvme, ConnectOptions, Connected, Host};
use crate::root::Root;

use crate::ops::options::NvmeAttachOptions;
use crate::ops::report::{DiscoveryService, PortalConnect};

/// How long a failed attach may take to delete the controllers it made, past its own
/// deadline (which may be what failed it): a controller just made is live, and goes at once.
const UNDO_TIMEOUT: Duration = Duration::from_secs(10);

/// The most an attach's discovery may take of its deadline. A read takes well under a
/// second (two services and a referral: 450 ms under TCG); a service that does not answer
/// must not use up the time the portals given and the device's wait need.
const DISCOVERY_TIMEOUT: Duration = Duration::from_secs(30);

/// What an attach connected, and what discovery said.
#[derive(Debug)]
pub(super) struct Connects {
    /// Each portal given, then each path discovered, with its connect.
    pub portals: Vec<PortalConnect>,
    /// Each discovery service asked.
    pub discovery: Vec<DiscoveryService>,
}

impl Connects {
    /// Whether the attach was asked to connect anything.
    pub fn asked(&self) -> bool {
        !self.portals.is_empty() || !self.discovery.is_empty()
    }

    /// ` (portals: …; discovery at …)`, for an error's text; empty when nothing was asked.
    pub fn describe(&self) -> String {
        let said: Vec<String> = self
            .portals
            .iter()
            .map(ToString::to_string)
            .chain(self.discovery.iter().map(ToString::to_string))
            .collect();
        if said.is_empty() {
            return String::new();
        }
        format!(" (portals: {})", said.join("; "))
    }
}

/// A path to connect: a portal given, or one a discovery log listed.
#[derive(Debug, PartialEq, Eq)]
struct Planned {
    portal: String,
    discovered: bool,
    /// Where to connect, or why not (a port that requires TLS).
    addr: std::result::Result<SocketAddr, String>,
}

/// Connects the portals given while the discovery services of `opts` are asked, then the
/// paths they list that were not given, each within what is left of `deadline`. Discovery
/// has at most [`DISCOVERY_TIMEOUT`] of it: a service that hangs is reported, and leaves
/// the attach time for its device.
pub(super) fn connect(
    root: &Root,
    nqn: &Nqn,
    opts: &NvmeAttachOptions,
    host: Option<&Host>,
    deadline: Instant,
) -> Connects {
    let given = plan(&opts.connect, Vec::new());
    let discovery_deadline = deadline.min(Instant::now() + DISCOVERY_TIMEOUT);
    let (mut portals, (discovery, listed)) = if opts.discover.is_empty() {
        let portals = connect_all(root, nqn, &given, host, opts, deadline);
        (portals, (Vec::new(), Vec::new()))
    } else {
        std::thread::scope(|s| {
            let asking =
                s.spawn(|| discover_all(root, nqn, &opts.discover, host, discovery_deadline));
            let portals = connect_all(root, nqn, &given, host, opts, deadline);
            let found = asking
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            (portals, found)
        })
    };
    let rest: Vec<Planned> = plan(&opts.connect, listed)
        .into_iter()
        .filter(|p| p.discovered)
        .collect();
    portals.extend(connect_all(root, nqn, &rest, host, opts, deadline));
    Connects { portals, discovery }
}

/// Reads the log of every discovery address side by side (an unreachable one must not
/// hold the others up), and takes the subsystem's paths from all of them.
fn discover_all(
    root: &Root,
    nqn: &Nqn,
    addrs: &[SocketAddr],
    host: Option<&Host>,
    deadline: Instant,
) -> (Vec<DiscoveryService>, Vec<ListedPath>) {
    let found = helper::fan_out("lunkit-nvme-discover", addrs, |a| {
        let mut o = DiscoverOptions::new(a.ip(), a.port());
        o.host = host.cloned();
        o.timeout = deadline.saturating_duration_since(Instant::now());
        discovery::discover(root, &o)
    });
    let mut services = Vec::new();
    for (a, r) in addrs.iter().zip(&found) {
        match r {
            Ok(d) => services.extend(d.services.iter().map(|s| asked(s, a, nqn))),
            Err(e) => services.push(DiscoveryService {
                service: a.to_string(),
                via: a.to_string(),
                result: Err(e.to_string()),
            }),
        }
    }
    let entries = found.iter().flatten().flat_map(Discovered::entries);
    (services, discovery::paths_of(entries, nqn))
}

/// What service `s`, reached through discovery address `via`, said of subsystem `nqn`.
fn asked(s: &Service, via: &SocketAddr, nqn: &Nqn) -> DiscoveryService {
    DiscoveryService {
        service: SocketAddr::new(s.traddr, s.trsvcid).to_string(),
        via: via.to_string(),
        result: match &s.result {
            Ok(l) => Ok(discovery::paths_of(&l.log.entries, nqn)
                .into_iter()
                .map(|p| p.portal)
                .collect()),
            Err(e) => Err(e.to_string()),
        },
    }
}

/// The portals given, then the paths listed that are not among them, each once. A path
/// also given is connected as given, whatever its listing says.
fn plan(given: &[SocketAddr], listed: Vec<ListedPath>) -> Vec<Planned> {
    let mut planned: Vec<Planned> = Vec::new();
    let given = given.iter().map(|a| Planned {
        portal: a.to_string(),
        discovered: false,
        addr: Ok(*a),
    });
    let listed = listed.into_iter().map(|p| Planned {
        portal: p.portal,
        discovered: true,
        addr: p.result.map_err(|e| e.to_string()),
    });
    for p in given.chain(listed) {
        if !planned.iter().any(|q| q.portal == p.portal) {
            planned.push(p);
        }
    }
    planned
}

/// Connects every planned path side by side as `host`, with the DH-HMAC-CHAP secrets of
/// `opts`, each with what is left of `deadline`, and says how each went; a refused one is
/// not connected.
fn connect_all(
    root: &Root,
    nqn: &Nqn,
    planned: &[Planned],
    host: Option<&Host>,
    opts: &NvmeAttachOptions,
    deadline: Instant,
) -> Vec<PortalConnect> {
    let results = helper::fan_out("lunkit-nvme-connect", planned, |p| {
        let Ok(a) = &p.addr else {
            return Ok(None);
        };
        let mut o = ConnectOptions::new(a.ip(), a.port(), nqn.clone());
        o.host = host.cloned();
        o.dhchap_secret.clone_from(&opts.dhchap_secret);
        o.dhchap_ctrl_secret.clone_from(&opts.dhchap_ctrl_secret);
        o.timeout = deadline.saturating_duration_since(Instant::now());
        fabrics_nvme::connect(root, &o).map(Some)
    });
    planned
        .iter()
        .zip(results)
        .map(|(p, r)| PortalConnect {
            portal: p.portal.clone(),
            discovered: p.discovered,
            failure: r.as_ref().err().map(Error::kind),
            result: match (r, &p.addr) {
                (Ok(Some(c)), _) => Ok(c),
                (Err(e), _) => Err(e.to_string()),
                (Ok(None), Err(refusal)) => Err(refusal.clone()),
                (Ok(None), Ok(_)) => Err("not connected".to_owned()),
            },
        })
        .collect()
}

/// Deletes the controllers a failed attach made, so that it leaves the node as it found
/// it; those it found connected belong to someone else (another namespace's attach, an
/// administrator's connect) and stay. What cannot be deleted is left to the kernel's own
/// `ctrl_loss_tmo` and to a detach: the attach's own error is what the caller needs.
///
/// None is deleted while a namespace of the subsystem is marked attached in `lock_dir`
/// (this one again, or another): a controller made now may have replaced one the kernel
/// reaped, and is a path that volume may be using already; its detach decides.
pub(super) fn undo(root: &Root, nqn: &Nqn, portals: &[PortalConnect], lock_dir: Option<&Path>) {
    if let Some(dir) = lock_dir {
        if !crate::ops::names::marked(dir, nqn).is_ok_and(|m| m.is_empty()) {
            return;
        }
    }
    let deadline = Instant::now() + UNDO_TIMEOUT;
    let made: Vec<&Connected> = portals
        .iter()
        .filter_map(|p| p.result.as_ref().ok())
        .filter(|c| !c.existing)
        .collect();
    let _ = helper::fan_out("lunkit-nvme-undo", &made, |c| {
        delete_made(root, nqn, c, deadline)
    });
}

/// Deletes controller `c` while it is still the one made: its name may be another's since
/// (the kernel hands out the lowest free instance).
fn delete_made(root: &Root, nqn: &Nqn, c: &Connected, deadline: Instant) -> Result<()> {
    match sysnvme::controller(root, &c.controller)? {
        Some(now)
            if now.subsysnqn.as_deref() == Some(nqn.as_str()) && now.cntlid == Some(c.cntlid) =>
        {
            fabrics_nvme::delete_controller(root, &now, deadline)
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed(portal: &str, refused: bool) -> ListedPath {
        ListedPath {
            portal: portal.to_owned(),
            result: if refused {
                Err(Error::invalid("discovery entry", portal, "TLS"))
            } else {
                Ok(portal.parse().unwrap())
            },
        }
    }

    fn show(planned: &[Planned]) -> Vec<String> {
        planned
            .iter()
            .map(|p| {
                let how = match (&p.addr, p.discovered) {
                    (Err(_), _) => "refused",
                    (Ok(_), true) => "discovered",
                    (Ok(_), false) => "given",
                };
                format!("{} {how}", p.portal)
            })
            .collect()
    }

    #[test]
    fn given_portals_come_first_and_a_discovered_one_given_too_is_connected_as_given() {
        let given: Vec<SocketAddr> = vec!["192.0.2.2:4420".parse().unwrap()];
        let planned = plan(
            &given,
            vec![
                listed("192.0.2.1:4420", false),
                listed("192.0.2.2:4420", true),
                listed("192.0.2.3:4420", true),
            ],
        );
        assert_eq!(
            show(&planned),
            [
                "192.0.2.2:4420 given",
                "192.0.2.1:4420 discovered",
                "192.0.2.3:4420 refused",
            ]
        );
        assert!(plan(&[], Vec::new()).is_empty());
        // A portal given twice is connected once.
        assert_eq!(show(&plan(&[given[0], given[0]], Vec::new())).len(), 1);
    }
}

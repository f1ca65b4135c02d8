//! NVMe over Fabrics controllers: connect one path, disconnect a subsystem, rescan, all
//! through the kernel alone (no `nvme` command, no libnvme).
//!
//! - [`connect`] creates one controller, i.e. one path, by writing its options to
//!   `/dev/nvme-fabrics` ([`fabrics`]). A controller of the same subsystem, transport,
//!   address, port and host that is already there is returned instead: a second connect
//!   never makes a duplicate path.
//! - [`disconnect`] takes a subsystem's controllers away with `delete_controller`, after the
//!   same in-use check a SCSI detach makes on its namespaces, and a flush of each.
//! - [`rescan`] asks each controller of a subsystem to look for new or resized namespaces
//!   (`rescan_controller`).
//! - [`identify_namespace`] asks one controller what a namespace is now (Identify, through
//!   its character device): what a resize brings the namespace's device to.
//! - [`discovery::discover`] asks a discovery service which subsystems this host may reach
//!   (the Discovery Log Page, through a discovery controller connected for the purpose),
//!   following its referrals; [`dhchap::Secret`] checks a DH-HMAC-CHAP secret's form.
//!
//! The kernel reconnects a controller whose link was lost on its own, every
//! `reconnect_delay` seconds until `ctrl_loss_tmo` passes; nothing here polls.
//!
//! ```no_run
//! use lunkit::Root;
//! use lunkit::nvme::{self, ConnectOptions};
//!
//! let root = Root::default();
//! let nqn: lunkit::id::Nqn = "nqn.2016-06.io.spdk:cnode1".parse()?;
//! for addr in ["192.0.2.10", "192.0.2.11"] {
//!     let c = nvme::connect(&root, &ConnectOptions::new(addr.parse()?, 4420, nqn.clone()))?;
//!     println!("{} cntlid {} (existing: {})", c.controller, c.cntlid, c.existing);
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod delete;
pub mod dhchap;
pub mod discovery;
pub mod fabrics;
pub mod identify;
pub mod sysfs;

pub use delete::delete_controller;

pub use fabrics::{ConnectOptions, Host, Interface, Transport};
pub use identify::{IdentifyNamespace, identify_namespace};

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use crate::block::{self, BlockNode, UsageScope};
use crate::error::{Error, Result};
use crate::helper::{self, Subject};
use crate::id::Nqn;
use crate::nvme::sysfs as sysnvme;
use crate::root::Root;
use crate::wait;
use sysfs::CtrlState;

/// Default time a [`disconnect`] may take.
pub const DEFAULT_DISCONNECT_TIMEOUT: Duration = Duration::from_secs(60);

/// The controller a [`connect`] made or found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connected {
    /// Its name (`nvme0`).
    pub controller: String,
    /// The controller id the subsystem gave it.
    pub cntlid: u16,
    /// Whether it was there already (nothing was written).
    pub existing: bool,
    /// Its state when this returned (`live`, or `connecting` for an existing one that is
    /// reconnecting).
    pub state: Option<String>,
    /// How long the call took.
    pub elapsed: Duration,
}

/// Parses a portal as a caller writes it, `addr:port` or `[v6addr]:port` (an IP address, no
/// host name): what [`crate::ops::NvmeAttachOptions::connect`] holds.
///
/// ```
/// let p = lunkit::nvme::parse_portal("[fd00::1]:4420")?;
/// assert_eq!((p.ip().to_string(), p.port()), ("fd00::1".to_owned(), 4420));
/// assert!(lunkit::nvme::parse_portal("array.example:4420").is_err());
/// # Ok::<(), lunkit::Error>(())
/// ```
pub fn parse_portal(s: &str) -> Result<SocketAddr> {
    s.parse().map_err(|_| {
        Error::invalid(
            "NVMe portal",
            s,
            "expected ADDR:PORT with an IP address (IPv6 in brackets)",
        )
    })
}

/// Connects one path to a subsystem, or returns the controller already connected there.
///
/// The host's identity is [`ConnectOptions::host`], or the node's ([`Host::from_node`]). Every
/// option is checked against what this kernel supports ([`fabrics::supported_options`])
/// before anything is written.
///
/// # Errors
///
/// - [`Error::Invalid`] for options the kernel would refuse or does not know;
/// - [`Error::NotFound`] without a host NQN, or without `/dev/nvme-fabrics`;
/// - [`Error::Connect`] with the kernel's errno when it refused the connect;
/// - [`Error::Timeout`] at [`ConnectOptions::timeout`] (the kernel may still finish the
///   controller afterwards; connecting again returns it).
pub fn connect(root: &Root, opts: &ConnectOptions) -> Result<Connected> {
    let start = Instant::now();
    let deadline = wait::deadline_from(start, opts.timeout);
    let host = match &opts.host {
        Some(h) => h.clone(),
        None => Host::from_node(root)?,
    };
    let controllers = sysnvme::controllers(root)?;
    let host = with_host_id(host, &controllers);
    let (options, names) = fabrics::option_string(opts, &host)?;
    if let Some(c) = matching(controllers, opts, &host).filter(|_| !opts.duplicate_connect) {
        return Ok(existing(c, start));
    }
    let supported = fabrics::supported_options(root)?;
    if let Some(missing) = names.iter().find(|n| !supported.iter().any(|s| s == *n)) {
        return Err(Error::invalid(
            "connect option",
            missing,
            "this kernel's nvme-fabrics does not know it",
        ));
    }
    let describe = opts.describe();
    match fabrics::write(root, &options, &describe, deadline) {
        Ok(reply) => {
            let controller = format!("nvme{}", reply.instance);
            let state = sysnvme::controller(root, &controller)?.and_then(|c| c.state);
            Ok(Connected {
                controller,
                cntlid: reply.cntlid,
                existing: false,
                state,
                elapsed: start.elapsed(),
            })
        }
        // Another caller connected the same path between the look and the write.
        Err(e) if e.errno() == Some(libc::EALREADY) => match find_controller(root, opts, &host)? {
            Some(c) => Ok(existing(c, start)),
            None => Err(e),
        },
        Err(e) => Err(e),
    }
}

/// `host` with the host id its connect sends, never `None` (newer kernels refuse a host NQN
/// without one: [`Host::id_from_nqn`]): the one given; else the id a controller connected
/// as this NQN already holds (the kernel keeps one id per NQN, whoever chose it); else
/// [`Host::id_from_nqn`].
pub fn with_host_id(host: Host, controllers: &[sysnvme::NvmeController]) -> Host {
    if host.id.is_some() {
        return host;
    }
    let held = controllers
        .iter()
        .filter(|c| c.hostnqn.as_deref() == Some(host.nqn.as_str()))
        .find_map(|c| c.hostid.as_deref()?.parse().ok());
    let id = held.unwrap_or_else(|| host.id_from_nqn());
    Host {
        id: Some(id),
        ..host
    }
}

fn existing(c: sysnvme::NvmeController, start: Instant) -> Connected {
    Connected {
        cntlid: c.cntlid.unwrap_or_default(),
        existing: true,
        state: c.state,
        controller: c.name,
        elapsed: start.elapsed(),
    }
}

/// The controller already connected for `opts` as `host`, if any: same transport, subsystem,
/// address, port, host interface, no source address (`host_traddr`, which lunkit does not
/// set), the same host NQN, the same host id when both are known, and not being taken away.
/// The kernel's own check before it answers `EALREADY` is close to this; where `host.id` is
/// `None` it compares with its default host id, which this cannot read, so any id matches.
pub fn find_controller(
    root: &Root,
    opts: &ConnectOptions,
    host: &Host,
) -> Result<Option<sysnvme::NvmeController>> {
    Ok(matching(sysnvme::controllers(root)?, opts, host))
}

/// [`find_controller`] among `controllers`.
fn matching(
    controllers: Vec<sysnvme::NvmeController>,
    opts: &ConnectOptions,
    host: &Host,
) -> Option<sysnvme::NvmeController> {
    controllers.into_iter().find(|c| {
        c.transport.as_deref() == Some(opts.transport.as_str())
            && c.subsysnqn.as_deref() == Some(opts.nqn.as_str())
            && c.address_field("traddr")
                .and_then(|a| a.parse::<IpAddr>().ok())
                == Some(opts.traddr)
            && c.address_field("trsvcid")
                .and_then(|p| p.parse::<u16>().ok())
                == Some(opts.trsvcid)
            && c.address_field("host_iface") == opts.host_iface.as_ref().map(|i| i.as_str())
            && c.address_field("host_traddr").is_none()
            && c.hostnqn.as_deref().is_none_or(|n| n == host.nqn.as_str())
            && match (&c.hostid, host.id) {
                (Some(have), Some(want)) => have.eq_ignore_ascii_case(&want.to_string()),
                _ => true,
            }
            && !c.parsed_state.as_ref().is_some_and(CtrlState::is_going)
    })
}

/// The controllers of subsystem `nqn` on this node.
pub fn controllers_of(root: &Root, nqn: &Nqn) -> Result<Vec<sysnvme::NvmeController>> {
    Ok(sysnvme::controllers(root)?
        .into_iter()
        .filter(|c| c.subsysnqn.as_deref() == Some(nqn.as_str()))
        .collect())
}

/// One block device of an NVMe namespace: what users open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamespaceDevice {
    /// The device (`nvme0n1`).
    pub node: BlockNode,
    /// Its WWID (`uuid.…`, `eui.…`, `nvme.…`).
    pub wwid: Option<crate::id::Wwid>,
    /// The controllers it is reached through: a head's paths', or its own controller.
    pub controllers: Vec<String>,
}

/// Every namespace device of subsystem `nqn` on the node, with what sysfs says of it: the
/// native-multipath heads of the subsystem, and, without native multipath, each controller's
/// own namespaces (with it, a controller's namespaces are hidden paths no one can open).
pub fn namespace_devices(
    root: &Root,
    nqn: &Nqn,
) -> Result<Vec<(sysnvme::NvmeNamespace, NamespaceDevice)>> {
    let mut names: Vec<(String, Option<String>)> = Vec::new();
    for s in sysnvme::subsystems(root)? {
        if s.nqn.as_deref() == Some(nqn.as_str()) {
            names.extend(s.namespaces.into_iter().map(|n| (n, None)));
        }
    }
    for c in controllers_of(root, nqn)? {
        for n in &c.namespaces {
            if matches!(sysnvme::parse_namespace_name(n), Some((_, None, _))) {
                names.push((n.clone(), Some(c.name.clone())));
            }
        }
    }
    names.sort();
    names.dedup_by(|a, b| a.0 == b.0);
    let mut out = Vec::new();
    for (name, own_controller) in names {
        let Some(ns) = sysnvme::namespace(root, &name)? else {
            continue;
        };
        let Some(node) = block::by_name(root, &name)? else {
            continue;
        };
        let controllers = match own_controller {
            Some(c) => vec![c],
            None => ns.paths.iter().map(|p| p.controller.clone()).collect(),
        };
        let wwid = ns.wwid.as_deref().and_then(|w| w.parse().ok());
        out.push((
            ns,
            NamespaceDevice {
                node,
                wwid,
                controllers,
            },
        ));
    }
    Ok(out)
}

/// How [`disconnect`] behaves.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DisconnectOptions {
    /// How long the whole disconnect may take.
    pub timeout: Duration,
    /// Take the controllers away while none is live and the kernel is reconnecting one,
    /// failing the I/O that waits in the namespaces (the in-use check still refuses).
    pub force: bool,
}

impl Default for DisconnectOptions {
    fn default() -> Self {
        DisconnectOptions {
            timeout: DEFAULT_DISCONNECT_TIMEOUT,
            force: false,
        }
    }
}

/// What [`disconnect`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disconnected {
    /// The namespace devices that were checked and flushed (`nvme0n1`).
    pub namespaces: Vec<String>,
    /// The controllers deleted (`nvme0`, `nvme1`); empty when none was connected.
    pub controllers: Vec<String>,
    /// How long the call took.
    pub elapsed: Duration,
}

/// Takes every controller of subsystem `nqn` away: refuses while anything uses one of its
/// namespaces (mounts in any namespace, kubelet's loop devices and bind mounts, holders,
/// swap, open descriptors: [`block::usage`]), flushes each namespace, then writes
/// `delete_controller` on each controller and waits until it is gone.
///
/// Nothing connected is success with no controller: a disconnect can be repeated.
///
/// # Errors
///
/// [`Error::Busy`] or [`Error::Unverified`] (nothing was changed), [`Error::Step`] naming the
/// namespace whose flush or the controller whose deletion failed, [`Error::Timeout`].
pub fn disconnect(root: &Root, nqn: &Nqn, opts: &DisconnectOptions) -> Result<Disconnected> {
    let start = Instant::now();
    let deadline = wait::deadline_from(start, opts.timeout);
    let controllers = controllers_of(root, nqn)?;
    let nodes: Vec<BlockNode> = namespace_devices(root, nqn)?
        .into_iter()
        .map(|(_, d)| d.node)
        .collect();
    let names: Vec<String> = nodes.iter().map(|n| n.name.clone()).collect();
    if !nodes.is_empty() {
        let device = format!("subsystem {nqn} ({})", names.join(", "));
        if let Some(refusal) = in_use(root, &nodes, deadline)?.refusal(&device) {
            return Err(refusal);
        }
    }
    // A controller that is not live cannot take a flush (it would wait for a reconnect); a
    // namespace that nothing has open has nothing cached (the in-use check found no opener).
    let live = controllers
        .iter()
        .any(|c| c.parsed_state == Some(CtrlState::Live));
    // No controller live but one reconnecting: I/O to the namespaces queues until a path
    // comes back, and what waits there (a writer's last close writing back, which /proc no
    // longer shows) would fail with the controllers. Refused unless forced.
    let reconnecting: Vec<&str> = controllers
        .iter()
        .filter(|c| {
            c.parsed_state
                .as_ref()
                .is_some_and(CtrlState::is_reconnecting)
        })
        .map(|c| c.name.as_str())
        .collect();
    if !live && !reconnecting.is_empty() && !nodes.is_empty() && !opts.force {
        return Err(Error::Busy {
            device: format!("subsystem {nqn} ({})", names.join(", ")),
            reason: format!(
                "no controller is live and the kernel is reconnecting {}: I/O to the \
                 namespaces queues until one is, and would fail if they went; wait for the \
                 target, or force it",
                reconnecting.join(", ")
            ),
            usage: None,
        });
    }
    for node in nodes.iter().filter(|_| live) {
        block::flush(node, deadline).map_err(|e| Error::Step {
            step: "flush-namespace",
            target: node.to_string(),
            source: Box::new(e),
        })?;
    }
    let mut deleted = Vec::new();
    for c in &controllers {
        delete_controller(root, c, deadline).map_err(|e| Error::Step {
            step: "delete-controller",
            target: c.name.clone(),
            source: Box::new(e),
        })?;
        deleted.push(c.name.clone());
    }
    Ok(Disconnected {
        namespaces: names,
        controllers: deleted,
        elapsed: start.elapsed(),
    })
}

/// Who uses `nodes`; processes that only have them open (udev probes every new namespace)
/// are given [`block::OPENER_GRACE`] to let go ([`block::usage_after_grace`]).
pub(crate) fn in_use(root: &Root, nodes: &[BlockNode], deadline: Instant) -> Result<block::Usage> {
    block::usage_after_grace(root, nodes, &usage_scope(), deadline)
}

/// Not users: a verified udev worker or multipathd with a namespace open read-only (udev's
/// probe), listed in [`Usage::managers`](block::Usage::managers).
pub(crate) fn usage_scope() -> UsageScope<'static> {
    UsageScope {
        own: &[],
        ignore_openers: crate::scsi::PATH_MANAGERS,
    }
}

/// Writes `1` to `rescan_controller` of every live controller of subsystem `nqn`, so that
/// each looks for namespaces that came, went or changed size; returns the controllers asked.
///
/// [`Error::NotFound`] when no controller of `nqn` is connected.
pub fn rescan(root: &Root, nqn: &Nqn, timeout: Duration) -> Result<Vec<String>> {
    let deadline = wait::deadline_after(timeout);
    let live: Vec<_> = controllers_of(root, nqn)?
        .into_iter()
        .filter(|c| c.parsed_state == Some(CtrlState::Live))
        .collect();
    if live.is_empty() {
        return Err(Error::NotFound {
            what: format!(
                "no NVMe controller of subsystem {nqn} is live; connect one first \
                 (`lunkit nvme connect --traddr ADDR --nvme-nqn {nqn}`, or an attach)"
            ),
        });
    }
    let mut asked = Vec::new();
    for c in live {
        let Some(dir) =
            crate::sysfs::Confine::new(root).dir(&sysnvme::controller_dir(root, &c.name))
        else {
            continue;
        };
        let path = dir.join("rescan_controller");
        let value = "1";
        let what = || format!("write to {}", path.display());
        let p = path.clone();
        helper::bounded(Subject::write(&path, value), deadline, &what, move || {
            crate::sysfs::write_attr(&p, value)
        })?;
        asked.push(c.name);
    }
    Ok(asked)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    /// A node where controller nvme0 connected as `hostnqn` with `hostid`.
    fn node(name: &str, hostnqn: &str, hostid: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("lunkit-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let d = dir.join("sys/class/nvme/nvme0");
        fs::create_dir_all(&d).unwrap();
        for (f, v) in [
            ("transport", "tcp"),
            ("state", "live"),
            ("subsysnqn", "nqn.2014-08.org.lunkit:lab"),
            ("hostnqn", hostnqn),
            ("hostid", hostid),
        ] {
            fs::write(d.join(f), format!("{v}\n")).unwrap();
        }
        dir
    }

    fn named(nqn: &str, id: Option<&str>) -> Host {
        Host {
            nqn: nqn.parse().unwrap(),
            id: id.map(|i| i.parse().unwrap()),
        }
    }

    #[test]
    fn a_connect_sends_the_id_given_else_the_one_the_kernel_holds_else_the_nqns() {
        const HELD: &str = "0e1f2a3b-4c5d-4e6f-8a9b-0c1d2e3f4a5b";
        const GIVEN: &str = "11111111-2222-4333-8444-555555555555";
        let dir = node("hostid", "nqn.2010-06.com.example:node-a", HELD);
        let controllers = sysnvme::controllers(&Root::new(&dir)).unwrap();
        let _ = fs::remove_dir_all(&dir);
        assert_eq!(controllers.len(), 1);

        let a = "nqn.2010-06.com.example:node-a";
        let given = with_host_id(named(a, Some(GIVEN)), &controllers);
        assert_eq!(given.id.unwrap().to_string(), GIVEN);
        // The kernel pairs one id with one NQN: reuse the pairing it holds.
        let held = with_host_id(named(a, None), &controllers);
        assert_eq!(held.id.unwrap().to_string(), HELD);
        // Another NQN gets its own id, never the one paired with node-a.
        let b = named("nqn.2010-06.com.example:node-b", None);
        let own = with_host_id(b.clone(), &controllers);
        assert_eq!(own.id, Some(b.id_from_nqn()));
        assert_ne!(own.id.unwrap().to_string(), HELD);
    }
}

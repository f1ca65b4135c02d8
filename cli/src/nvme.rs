//! `lunkit nvme connect|disconnect|rescan|discover`: NVMe over Fabrics controllers and
//! discovery, with no nvme-cli.

use std::time::Instant;

use clap::{Args, Subcommand};
use lunkit::Root;
use lunkit::id::{Nqn, Uuid};
use lunkit::nvme::dhchap::Secret;
use lunkit::nvme::discovery::{self, DiscoverOptions, Subtype};
use lunkit::nvme::{self, ConnectOptions, DisconnectOptions, Host};

use crate::json::{self, Layout};

/// `lunkit nvme`.
#[derive(Subcommand)]
pub enum Nvme {
    /// Connect one path (one controller) to a subsystem.
    ///
    /// Run it once per path. A path that is connected already is returned, never duplicated.
    ///
    /// Exit 0 connected (or already), 2 bad input (nothing written), 3 nothing listens there
    /// or no host NQN, 5 deadline passed.
    Connect(Connect),
    /// Take every controller of a subsystem away, after checking nothing uses its namespaces.
    ///
    /// The namespaces are flushed first. Nothing connected is success.
    ///
    /// Exit 0 disconnected (or nothing was), 2 bad input, 4 refused (in use), 5 deadline
    /// passed.
    Disconnect(Disconnect),
    /// Ask every live controller of a subsystem to look for new or resized namespaces.
    ///
    /// Exit 0 asked, 2 bad input, 3 no live controller of the subsystem, 5 deadline passed.
    Rescan(Rescan),
    /// Ask a discovery service which subsystems this host may reach, and on which ports.
    ///
    /// Reads the Discovery Log Page, following its referrals; the discovery controllers made
    /// for it are disconnected after.
    ///
    /// Exit 0 answered, 2 bad input, 3 nothing listens there, 5 deadline passed.
    Discover(Discover),
}

/// `lunkit nvme connect`.
#[derive(Args)]
pub struct Connect {
    /// The transport; only tcp today.
    #[arg(long, default_value = "tcp")]
    transport: String,
    /// The target's IP address.
    #[arg(long, value_name = "ADDR")]
    traddr: String,
    /// The target's port.
    #[arg(long, value_name = "PORT", default_value = "4420")]
    trsvcid: String,
    /// The subsystem's NQN: nqn.yyyy-mm.<reverse domain>[:<name>].
    #[arg(long = "nvme-nqn", alias = "nqn", value_name = "NQN")]
    nqn: String,
    /// This host's NQN (default: /etc/nvme/hostnqn under --root).
    #[arg(long, value_name = "NQN")]
    hostnqn: Option<String>,
    /// This host's id, a UUID (default: /etc/nvme/hostid under --root, if any).
    #[arg(long, value_name = "UUID")]
    hostid: Option<String>,
    /// Seconds to keep reconnecting a lost link before the kernel deletes the controller;
    /// -1 reconnects forever.
    #[arg(long, value_name = "SECS", allow_hyphen_values = true)]
    ctrl_loss_tmo: Option<i32>,
    /// Seconds between reconnect attempts.
    #[arg(long, value_name = "SECS")]
    reconnect_delay: Option<u32>,
    /// How many I/O queues to ask for.
    #[arg(long, value_name = "N")]
    nr_io_queues: Option<u32>,
    /// Keep-alive timeout in seconds.
    #[arg(long, value_name = "SECS")]
    keep_alive_tmo: Option<u32>,
    /// Connect through this network interface only.
    #[arg(long, value_name = "IFACE")]
    host_iface: Option<String>,
    /// A file holding the host's DH-HMAC-CHAP secret (`DHHC-1:…`, as `nvme gen-dhchap-key`
    /// prints it): read here, never taken on the command line, where any user could read it.
    #[arg(long, value_name = "FILE")]
    dhchap_secret_file: Option<std::path::PathBuf>,
    /// A file holding the controller's secret: the controller must prove itself with it.
    #[arg(long, value_name = "FILE")]
    dhchap_ctrl_secret_file: Option<std::path::PathBuf>,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 30.0, value_name = "SECS")]
    timeout: f64,
    /// Print the result as one JSON object (also on failure).
    #[arg(long)]
    json: bool,
}

/// `lunkit nvme disconnect`.
#[derive(Args)]
pub struct Disconnect {
    /// The subsystem's NQN: nqn.yyyy-mm.<reverse domain>[:<name>].
    #[arg(long = "nvme-nqn", alias = "nqn", value_name = "NQN")]
    nqn: String,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 60.0, value_name = "SECS")]
    timeout: f64,
    /// Go on while no controller is live and one is reconnecting: I/O waiting in the
    /// namespaces fails.
    #[arg(long)]
    force: bool,
    /// Print the result as one JSON object (also on failure).
    #[arg(long)]
    json: bool,
}

/// `lunkit nvme rescan`.
#[derive(Args)]
pub struct Rescan {
    /// The subsystem's NQN: nqn.yyyy-mm.<reverse domain>[:<name>].
    #[arg(long = "nvme-nqn", alias = "nqn", value_name = "NQN")]
    nqn: String,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 30.0, value_name = "SECS")]
    timeout: f64,
    /// Print the controllers asked as one JSON object.
    #[arg(long)]
    json: bool,
}

/// `lunkit nvme discover`.
#[derive(Args)]
pub struct Discover {
    /// The discovery service's IP address.
    #[arg(long, value_name = "ADDR")]
    traddr: String,
    /// Its port (8009 is NVMe/TCP discovery's; many targets answer on 4420 too).
    #[arg(long, value_name = "PORT", default_value = "8009")]
    trsvcid: String,
    /// This host's NQN (default: /etc/nvme/hostnqn under --root): the log lists what this
    /// host may reach.
    #[arg(long, value_name = "NQN")]
    hostnqn: Option<String>,
    /// This host's id, a UUID (default: /etc/nvme/hostid under --root, if any).
    #[arg(long, value_name = "UUID")]
    hostid: Option<String>,
    /// Ask only this service; do not follow its referrals.
    #[arg(long)]
    no_referrals: bool,
    /// Ask at most this many services, the first included.
    #[arg(long, value_name = "N", default_value_t = 8)]
    max_services: usize,
    /// Give up after this many seconds (every connect, read and disconnect).
    #[arg(long, default_value_t = 30.0, value_name = "SECS")]
    timeout: f64,
    /// Print the result as one JSON object (also on failure).
    #[arg(long)]
    json: bool,
}

pub fn run(root: &Root, cmd: Nvme) -> lunkit::Result<()> {
    match cmd {
        Nvme::Connect(c) => connect(root, c),
        Nvme::Disconnect(d) => disconnect(root, d),
        Nvme::Rescan(r) => rescan(root, r),
        Nvme::Discover(d) => discover(root, d),
    }
}

/// `traddr` and `trsvcid` as typed, parsed.
fn address(traddr: &str, trsvcid: &str) -> lunkit::Result<(std::net::IpAddr, u16)> {
    let ip = traddr
        .parse()
        .map_err(|_| lunkit::Error::invalid("address", traddr, "not an IPv4 or IPv6 address"))?;
    let port = Some(trsvcid)
        .filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|p| p.parse::<u16>().ok())
        .filter(|&p| p != 0)
        .ok_or_else(|| lunkit::Error::invalid("port", trsvcid, "must be 1 to 65535"))?;
    Ok((ip, port))
}

/// The host as given (`--hostnqn`, `--hostid`), or the node's, with `--hostid` over its id.
fn host(root: &Root, hostnqn: Option<&str>, hostid: Option<&str>) -> lunkit::Result<Host> {
    let id = hostid.map(str::parse::<Uuid>).transpose()?;
    Ok(match hostnqn {
        Some(n) => Host {
            nqn: n.parse()?,
            id,
        },
        None => {
            let node = Host::from_node(root)?;
            Host {
                id: id.or(node.id),
                ..node
            }
        }
    })
}

fn discover_options(root: &Root, d: &Discover) -> lunkit::Result<DiscoverOptions> {
    let (ip, port) = address(&d.traddr, &d.trsvcid)?;
    let mut opts = DiscoverOptions::new(ip, port);
    opts.host = Some(host(root, d.hostnqn.as_deref(), d.hostid.as_deref())?);
    opts.follow_referrals = !d.no_referrals;
    opts.max_services = d.max_services;
    opts.timeout = crate::seconds(d.timeout)?;
    Ok(opts)
}

fn discover(root: &Root, d: Discover) -> lunkit::Result<()> {
    let t0 = Instant::now();
    let result = discover_options(root, &d).and_then(|o| discovery::discover(root, &o));
    if d.json {
        let target = json::discovery::Target {
            traddr: d.traddr.clone(),
            trsvcid: d.trsvcid.clone(),
        };
        json::print(
            &json::discovery::discover(target, &result, t0.elapsed()),
            Layout::Line,
        );
    } else if let Ok(found) = &result {
        print_discovered(found);
    }
    result.map(drop)
}

/// One line per service, then one per entry beneath it.
fn print_discovered(found: &discovery::Discovered) {
    for s in &found.services {
        let l = match &s.result {
            Ok(l) => l,
            Err(e) => {
                outln!("{}:{}: {e}", s.traddr, s.trsvcid);
                continue;
            }
        };
        outln!(
            "{}:{}: generation {}, {} entries (through {})",
            s.traddr,
            s.trsvcid,
            l.log.generation,
            l.log.entries.len(),
            l.controller
        );
        for e in &l.log.entries {
            let kind = match e.subtype {
                Subtype::Nvm => "subsystem",
                Subtype::Referral => "referral",
                Subtype::CurrentDiscovery => "discovery",
                Subtype::Other(_) => "other",
            };
            outln!(
                "  {kind:<9} {} {}:{} port {}",
                e.subsystem,
                e.address,
                e.service_id,
                e.port_id
            );
        }
        for r in &l.log.rejected {
            outln!("  rejected  {r}");
        }
    }
}

/// Every value is parsed into its type before anything is looked at or written.
fn connect_options(root: &Root, c: &Connect) -> lunkit::Result<ConnectOptions> {
    let (traddr, port) = address(&c.traddr, &c.trsvcid)?;
    let mut opts = ConnectOptions::new(traddr, port, c.nqn.parse()?);
    opts.transport = c.transport.parse()?;
    opts.host = Some(host(root, c.hostnqn.as_deref(), c.hostid.as_deref())?);
    opts.ctrl_loss_tmo = c.ctrl_loss_tmo;
    opts.reconnect_delay = c.reconnect_delay;
    opts.nr_io_queues = c.nr_io_queues;
    opts.keep_alive_tmo = c.keep_alive_tmo;
    opts.host_iface = c.host_iface.as_deref().map(str::parse).transpose()?;
    opts.dhchap_secret = c.dhchap_secret_file.as_deref().map(secret).transpose()?;
    opts.dhchap_ctrl_secret = c
        .dhchap_ctrl_secret_file
        .as_deref()
        .map(secret)
        .transpose()?;
    opts.timeout = crate::seconds(c.timeout)?;
    Ok(opts)
}

/// The DH-HMAC-CHAP secret in `path`: its one line, checked. An error names the file and
/// what is wrong, never the content.
pub(crate) fn secret(path: &std::path::Path) -> lunkit::Result<Secret> {
    let text = std::fs::read_to_string(path).map_err(|e| lunkit::Error::io(path, e))?;
    text.trim_end_matches(['\n', '\r'])
        .parse::<Secret>()
        .map_err(|e| match e {
            lunkit::Error::Invalid { reason, .. } => lunkit::Error::Invalid {
                kind: "DH-HMAC-CHAP secret file",
                input: path.display().to_string(),
                reason,
            },
            e => e,
        })
}

fn connect(root: &Root, c: Connect) -> lunkit::Result<()> {
    let t0 = Instant::now();
    let result = connect_options(root, &c).and_then(|o| nvme::connect(root, &o));
    if c.json {
        let portal = json::nvme::Portal {
            nqn: c.nqn.clone(),
            traddr: c.traddr.clone(),
            trsvcid: c.trsvcid.clone(),
        };
        json::print(
            &json::nvme::connect(portal, &result, t0.elapsed()),
            Layout::Line,
        );
    } else if let Ok(r) = &result {
        let how = if r.existing {
            "already connected"
        } else {
            "connected"
        };
        outln!(
            "{}: {how} (cntlid {}, {}) in {:.1} ms",
            r.controller,
            r.cntlid,
            r.state.as_deref().unwrap_or("state unknown"),
            r.elapsed.as_secs_f64() * 1e3
        );
    }
    result.map(drop)
}

fn rescan(root: &Root, r: Rescan) -> lunkit::Result<()> {
    let nqn: Nqn = r.nqn.parse()?;
    let t0 = Instant::now();
    let asked = nvme::rescan(root, &nqn, crate::seconds(r.timeout)?)?;
    if r.json {
        let doc = json::nvme::Rescan::new(&r.nqn, asked, t0.elapsed());
        json::print(&doc, Layout::Line);
    } else {
        for c in asked {
            outln!("{c}: rescan asked");
        }
    }
    Ok(())
}

fn disconnect(root: &Root, d: Disconnect) -> lunkit::Result<()> {
    let t0 = Instant::now();
    let result = d.nqn.parse::<Nqn>().and_then(|nqn| {
        let mut opts = DisconnectOptions::default();
        opts.timeout = crate::seconds(d.timeout)?;
        opts.force = d.force;
        nvme::disconnect(root, &nqn, &opts)
    });
    if d.json {
        json::print(
            &json::nvme::disconnect(&d.nqn, &result, t0.elapsed()),
            Layout::Line,
        );
    } else if let Ok(r) = &result {
        if r.controllers.is_empty() {
            outln!("{}: nothing connected", d.nqn);
        }
        for c in &r.controllers {
            outln!("{c}: deleted");
        }
    }
    result.map(drop)
}

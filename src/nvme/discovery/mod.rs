//! NVMe over Fabrics discovery, from the kernel alone: connect to a discovery controller
//! through `/dev/nvme-fabrics`, read its Discovery Log Page with Get Log Page through the
//! controller's character device, follow its referrals, and disconnect.
//!
//! A discovery controller lists, for the host that asks, the NVM subsystems it may reach
//! through each port (subtype 2), the discovery service itself (subtype 3) and referrals to
//! other discovery services (subtype 1). The log is read as libnvme reads it: the header's
//! first 20 bytes (generation counter, record count, record format), then the records from
//! byte 1024, then the header again; a generation that changed in between means the log
//! changed under the read, which is then made again.
//!
//! ```no_run
//! use lunkit::Root;
//! use lunkit::nvme::discovery::{self, DiscoverOptions};
//!
//! let found = discovery::discover(&Root::default(), &DiscoverOptions::new("192.0.2.10".parse()?, 8009))?;
//! for e in found.subsystems() {
//!     println!("{} at {}:{}", e.subsystem, e.address, e.service_id);
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod log;
mod paths;

pub use log::{
    AddressFamily, ENTRY_LEN, Entry, HEADER_LEN, HEADER_READ_LEN, Header, LOG_ID, Log, MAX_RECORDS,
    Subtype, TransportType,
};
pub use paths::{DEFAULT_PORT, ListedPath, parse_address, paths_of, tls_refusal};

use std::collections::{HashSet, VecDeque};
use std::net::IpAddr;
use std::os::fd::AsFd;
use std::path::Path;
use std::time::{Duration, Instant};

use super::fabrics::{ConnectOptions, Host};
use super::identify::{controller_node, open_controller};
use super::sysfs as sysnvme;
use crate::error::{Error, Result};
use crate::helper::{self, Subject};
use crate::root::Root;
use crate::wait;

/// The well-known discovery NQN: every discovery service answers to it.
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";

/// How many times a log whose generation changed during the read is read again.
const READS: usize = 8;

/// Bytes per Get Log Page command: one page, which every controller's transfer size allows.
const CHUNK: usize = 4096;

/// What [`discover`] asks, and of whom.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DiscoverOptions {
    /// The discovery service's address.
    pub traddr: IpAddr,
    /// Its port: 8009 is the IANA port for NVMe/TCP discovery, though many targets serve
    /// discovery on their I/O port (4420) too.
    pub trsvcid: u16,
    /// This node's identity; `None` reads it with [`Host::from_node`]. The log lists what
    /// this host may reach.
    pub host: Option<Host>,
    /// Whether referrals (subtype 1 entries over TCP) are followed to the services they
    /// name. Each service is asked once, however the referrals loop.
    pub follow_referrals: bool,
    /// The most services asked, the first included.
    pub max_services: usize,
    /// How long the whole discovery may take: every connect, read and disconnect.
    pub timeout: Duration,
}

impl DiscoverOptions {
    /// Discovery at `traddr`:`trsvcid` as this node, following up to 7 referrals, within
    /// 30 seconds.
    pub fn new(traddr: IpAddr, trsvcid: u16) -> DiscoverOptions {
        DiscoverOptions {
            traddr,
            trsvcid,
            host: None,
            follow_referrals: true,
            max_services: 8,
            timeout: Duration::from_secs(30),
        }
    }
}

/// One discovery service asked, and what it answered.
#[derive(Debug)]
pub struct Service {
    /// Its address.
    pub traddr: IpAddr,
    /// Its port.
    pub trsvcid: u16,
    /// Its log, or why there is none (an unreachable referral does not fail the discovery).
    pub result: Result<ServiceLog>,
}

/// What one discovery service answered.
#[derive(Debug)]
pub struct ServiceLog {
    /// The discovery controller the log was read through (`nvme3`): deleted since, unless
    /// it was the one [`discover_via`] was given.
    pub controller: String,
    /// The log.
    pub log: Log,
}

/// What [`discover`] found.
#[derive(Debug)]
pub struct Discovered {
    /// Every service asked, the first one first, then the referrals in the order found.
    pub services: Vec<Service>,
    /// How long it took.
    pub elapsed: Duration,
}

impl Discovered {
    /// The NVM subsystem entries of every service, each port once (the same subsystem,
    /// transport, address and port listed by two services counts once).
    pub fn subsystems(&self) -> impl Iterator<Item = &Entry> {
        let mut seen = HashSet::new();
        self.entries().filter(move |e| {
            e.subtype == Subtype::Nvm
                && seen.insert((&e.subsystem, e.transport, &e.address, &e.service_id))
        })
    }

    /// Every entry of every service that answered.
    pub fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.services
            .iter()
            .filter_map(|s| s.result.as_ref().ok())
            .flat_map(|l| &l.log.entries)
    }
}

/// Asks the discovery service at `opts.traddr`:`opts.trsvcid` which subsystems this host
/// may reach, and, with [`DiscoverOptions::follow_referrals`], the services it refers to.
///
/// Each service is asked through a discovery controller connected for the purpose
/// (`duplicate_connect`: never one another caller's discovery made and may delete under this
/// read) and deleted after the read.
///
/// # Errors
///
/// Those of the first service: [`Error::Connect`] when it refuses or cannot be reached,
/// [`Error::Timeout`] at the deadline, [`Error::Invalid`] for a log that cannot be parsed,
/// [`Error::Replaced`] for a log that changed during every read. A referral's failure is
/// in its [`Service::result`].
pub fn discover(root: &Root, opts: &DiscoverOptions) -> Result<Discovered> {
    discover_with(root, opts, None)
}

/// [`discover`], the first service read through discovery controller `controller` (`nvme3`,
/// connected to it already, as a persistent one is) and left connected; the services it
/// refers to are asked as [`discover`] asks them.
///
/// A persistent controller's log must be read through that controller: the target sends
/// its next discovery-change event only once the host has read the log there (the event is
/// masked until then, NVMe Base 5.2), so a read through another controller would leave it
/// silent after its first change.
///
/// # Errors
///
/// As [`discover`]; [`Error::NotFound`] when `controller` is gone.
pub fn discover_via(root: &Root, controller: &str, opts: &DiscoverOptions) -> Result<Discovered> {
    discover_with(root, opts, Some(controller))
}

fn discover_with(root: &Root, opts: &DiscoverOptions, via: Option<&str>) -> Result<Discovered> {
    let start = Instant::now();
    let deadline = wait::deadline_from(start, opts.timeout);
    let host = opts
        .host
        .clone()
        .map_or_else(|| Host::from_node(root), Ok)?;
    let mut queue = VecDeque::from([(opts.traddr, opts.trsvcid)]);
    let mut asked = HashSet::new();
    let mut services = Vec::new();
    while let Some((traddr, trsvcid)) = queue.pop_front() {
        if services.len() >= opts.max_services.max(1) || !asked.insert((traddr, trsvcid)) {
            continue;
        }
        let result = match (services.is_empty(), via) {
            (true, Some(controller)) => {
                read_log(root, controller, deadline).map(|log| ServiceLog {
                    controller: controller.to_owned(),
                    log,
                })
            }
            _ => ask(root, &host, traddr, trsvcid, deadline),
        };
        let result = match result {
            Err(e) if services.is_empty() => return Err(e),
            r => r,
        };
        if let (Ok(l), true) = (&result, opts.follow_referrals) {
            queue.extend(referrals(&l.log));
        }
        services.push(Service {
            traddr,
            trsvcid,
            result,
        });
    }
    Ok(Discovered {
        services,
        elapsed: start.elapsed(),
    })
}

/// The services `log` refers to over TCP, by IP address and port.
fn referrals(log: &Log) -> impl Iterator<Item = (IpAddr, u16)> + '_ {
    log.entries
        .iter()
        .filter(|e| e.subtype == Subtype::Referral && e.transport == TransportType::Tcp)
        .filter_map(|e| Some((e.ip().ok()?, e.port().ok()?)))
}

/// Connects to the discovery service at `traddr`:`trsvcid`, reads its log, and disconnects
/// the controller unless it was there before.
fn ask(
    root: &Root,
    host: &Host,
    traddr: IpAddr,
    trsvcid: u16,
    deadline: Instant,
) -> Result<ServiceLog> {
    let nqn = DISCOVERY_NQN.parse()?;
    let mut opts = ConnectOptions::new(traddr, trsvcid, nqn);
    opts.host = Some(host.clone());
    opts.duplicate_connect = true;
    opts.timeout = deadline.saturating_duration_since(Instant::now());
    let c = super::connect(root, &opts)?;
    let log = read_log(root, &c.controller, deadline);
    if let Some(ctrl) = sysnvme::controller(root, &c.controller)? {
        super::delete_controller(root, &ctrl, deadline)?;
    }
    Ok(ServiceLog {
        controller: c.controller,
        log: log?,
    })
}

/// Reads the Discovery Log Page of discovery controller `name` (`nvme3`) through its
/// character device, bounded by `deadline` (the kernel waits for each command's
/// completion).
pub fn read_log(root: &Root, name: &str, deadline: Instant) -> Result<Log> {
    let (node, dev) = controller_node(root, name)?;
    let what = || format!("the Discovery Log Page through {}", node.display());
    let path = node.clone();
    helper::bounded(
        Subject::char_device("get log page", dev),
        deadline,
        &what,
        move || {
            let fd = open_controller(&path, dev)?;
            read_whole(&fd, &path)
        },
    )
}

/// Header, entries, header again, until the two headers agree.
fn read_whole(fd: impl AsFd, path: &Path) -> Result<Log> {
    let get = |offset: usize, buf: &mut [u8]| {
        crate::ioctl::nvme_get_log(&fd, LOG_ID, offset as u64, buf).map_err(|e| Error::io(path, e))
    };
    for _ in 0..READS {
        let mut head = [0u8; HEADER_READ_LEN];
        get(0, &mut head)?;
        let header = Header::parse(&head)?;
        let mut entries = vec![0u8; header.entries_len()];
        for (i, chunk) in entries.chunks_mut(CHUNK).enumerate() {
            get(HEADER_LEN + i * CHUNK, chunk)?;
        }
        get(0, &mut head)?;
        if Header::parse(&head)?.generation == header.generation {
            return Log::from_parts(&header, &entries);
        }
    }
    Err(Error::Replaced {
        device: format!("the Discovery Log Page of {}", path.display()),
        reason: format!("its generation changed during each of {READS} reads"),
    })
}

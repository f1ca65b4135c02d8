//! From discovery logs to the paths of one subsystem: what an attach given discovery
//! addresses connects ([`crate::ops::NvmeAttachOptions::discover`]).
//!
//! Pure: the logs are read by [`super::discover`]; this only chooses among their entries.

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};

use super::{Entry, Subtype, TransportType};
use crate::error::{Error, Result};
use crate::id::Nqn;

/// The IANA port of NVMe/TCP discovery, taken when an address names none.
pub const DEFAULT_PORT: u16 = 8009;

/// One path to a subsystem that a discovery log listed.
#[derive(Debug)]
pub struct ListedPath {
    /// `addr:port`: the address as connected, or as the log wrote it when it is not one.
    pub portal: String,
    /// Where to connect; or why lunkit does not: the port requires TLS
    /// ([`tls_refusal`]), or its address or port is not one (a log's own odd entry).
    pub result: Result<SocketAddr>,
}

/// The TCP paths of subsystem `nqn` among `entries`, in the order listed, each address and
/// port once (a port listed by two services, or twice by one, is one path: the first
/// listing says whether it is refused).
///
/// Entries of other subsystems, referrals and discovery entries are not paths. Nor are
/// entries of other transports (RDMA, FC): lunkit connects over TCP only, and a mixed
/// array's other ports are not this host's to fail on.
pub fn paths_of<'a>(entries: impl IntoIterator<Item = &'a Entry>, nqn: &Nqn) -> Vec<ListedPath> {
    let mut seen = HashSet::new();
    entries
        .into_iter()
        .filter(|e| {
            e.subtype == Subtype::Nvm
                && e.transport == TransportType::Tcp
                && e.subsystem == nqn.as_str()
        })
        .filter_map(|e| {
            let (key, path) = listed(e);
            seen.insert(key).then_some(path)
        })
        .collect()
}

/// The path of one entry of the subsystem, and the key it is deduplicated by: the parsed
/// address where there is one (`fd00:0::1` and `fd00::1` are one port), else the text as
/// written, which never stands for a parsed one (a port listed once with a wrong family
/// still counts where it is listed right).
fn listed(e: &Entry) -> ((Option<SocketAddr>, String), ListedPath) {
    let addr = e.ip().and_then(|ip| Ok(SocketAddr::new(ip, e.port()?)));
    let portal = addr.as_ref().map_or_else(
        |_| format!("{}:{}", e.address, e.service_id),
        ToString::to_string,
    );
    let key = (addr.as_ref().ok().copied(), portal.clone());
    let result = match tls_refusal(e) {
        Some(refusal) => Err(refusal),
        None => addr,
    };
    (key, ListedPath { portal, result })
}

/// Parses a discovery service's address as a caller writes it: `addr`, `addr:port`,
/// `[v6addr]` or `[v6addr]:port`, an IP address (no host name); the port is
/// [`DEFAULT_PORT`] when none is given.
///
/// ```
/// use lunkit::nvme::discovery::parse_address;
/// assert_eq!(parse_address("192.0.2.10")?.to_string(), "192.0.2.10:8009");
/// assert_eq!(parse_address("[fd00::1]:4420")?.to_string(), "[fd00::1]:4420");
/// assert!(parse_address("array.example").is_err());
/// # Ok::<(), lunkit::Error>(())
/// ```
pub fn parse_address(s: &str) -> Result<SocketAddr> {
    const KIND: &str = "NVMe discovery address";
    if let Ok(a) = s.parse::<SocketAddr>() {
        if a.port() == 0 {
            return Err(Error::invalid(KIND, s, "port 0 is no port"));
        }
        return Ok(a);
    }
    // A bare IPv6 address is all colons: it is read as an address, never as `addr:port`.
    let (bare, bracketed) = match s.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
        Some(inner) => (inner, true),
        None => (s, false),
    };
    bare.parse::<IpAddr>()
        .ok()
        .filter(|ip| !bracketed || ip.is_ipv6())
        .map(|ip| SocketAddr::new(ip, DEFAULT_PORT))
        .ok_or_else(|| {
            Error::invalid(
                KIND,
                s,
                "expected ADDR or ADDR:PORT with an IP address (IPv6 in brackets with a port)",
            )
        })
}

/// The refusal of a path whose port requires a secure channel (`TREQ`): lunkit does not set
/// up NVMe/TCP TLS, which needs a handshake daemon (tlshd) Debian 12 does not package.
pub fn tls_refusal(e: &Entry) -> Option<Error> {
    e.secure_channel_required().then(|| {
        Error::invalid(
            "discovery entry",
            &format!("{} at {}:{}", e.subsystem, e.address, e.service_id),
            "the port requires a secure channel (NVMe/TCP TLS), which lunkit does not set up: \
             it needs a TLS handshake daemon (tlshd) that Debian 12 does not package",
        )
    })
}

#[cfg(test)]
mod tests;

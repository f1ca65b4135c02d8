//! The Discovery Log Page (Get Log Page, log identifier 70h): pure parsers of its header
//! and its 1024-byte entries.
//!
//! Everything here comes from the network: every string is checked before it can reach an
//! option string written to `/dev/nvme-fabrics` (a `,` or `=` in an address would add an
//! option of its own), and a record count that would make the host read megabytes is
//! refused before anything is allocated.
//!
//! ```
//! use lunkit::nvme::discovery::{self, Subtype};
//!
//! # let page = {
//! #     let mut p = vec![0u8; 2048];
//! #     p[8] = 1;
//! #     let e = &mut p[1024..];
//! #     e[0] = 3; e[1] = 1; e[2] = 2; e[6..8].copy_from_slice(&0xffffu16.to_le_bytes());
//! #     e[32..36].copy_from_slice(b"4420");
//! #     let n = b"nqn.2014-08.org.example:vol1";
//! #     e[256..256 + n.len()].copy_from_slice(n);
//! #     e[512..521].copy_from_slice(b"192.0.2.1");
//! #     p
//! # };
//! let log = discovery::Log::parse(&page)?;
//! for e in log.entries.iter().filter(|e| e.subtype == Subtype::Nvm) {
//!     println!("{} at {}:{}", e.subsystem, e.address, e.service_id);
//! }
//! # Ok::<(), lunkit::Error>(())
//! ```

use std::net::IpAddr;

use crate::error::{Error, Result};
use crate::id::Nqn;

/// The log identifier of the Discovery Log Page (`NVME_LOG_LID_DISCOVER`).
pub const LOG_ID: u8 = 0x70;

/// The header's size in the log: the first entry starts here.
pub const HEADER_LEN: usize = 1024;

/// How much of the header is read: the generation counter (8 bytes), the record count (8)
/// and the record format (2), rounded up to whole dwords as Get Log Page transfers them.
pub const HEADER_READ_LEN: usize = 20;

/// The size of one entry.
pub const ENTRY_LEN: usize = 1024;

/// The most records a log may claim: 4 MiB of entries. A discovery service lists a host's
/// subsystems times their ports; a count beyond this is a broken or hostile answer, and is
/// refused before the host allocates and reads it.
pub const MAX_RECORDS: u64 = 4096;

/// The log's header: what the first read gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// `GENCTR`: changes whenever the log does; a read is only whole if it is the same
    /// before and after the entries were read.
    pub generation: u64,
    /// `NUMREC`: how many entries the log holds.
    pub records: u64,
    /// `RECFMT`: the entries' format; 0 is the only one defined.
    pub format: u16,
}

impl Header {
    /// Parses the header from the first [`HEADER_READ_LEN`] (or more) bytes of the log.
    /// A format other than 0, or more than [`MAX_RECORDS`] records, is an error.
    pub fn parse(buf: &[u8]) -> Result<Header> {
        const KIND: &str = "Discovery Log Page header";
        if buf.len() < 18 {
            return Err(Error::invalid(KIND, &hex(buf), "shorter than 18 bytes"));
        }
        let header = Header {
            generation: u64::from_le_bytes(array(&buf[0..8])),
            records: u64::from_le_bytes(array(&buf[8..16])),
            format: u16::from_le_bytes(array(&buf[16..18])),
        };
        if header.format != 0 {
            return Err(Error::invalid(
                KIND,
                &hex(&buf[..18]),
                "record format is not 0",
            ));
        }
        if header.records > MAX_RECORDS {
            return Err(Error::invalid(
                KIND,
                &hex(&buf[..18]),
                "claims more than 4096 records",
            ));
        }
        Ok(header)
    }

    /// The bytes the header's records take, read from [`HEADER_LEN`] on.
    pub fn entries_len(&self) -> usize {
        // At most MAX_RECORDS × 1024: no overflow.
        self.records as usize * ENTRY_LEN
    }
}

/// `TRTYPE`: the transport an entry's port is reached by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TransportType {
    /// 1: RDMA.
    Rdma,
    /// 2: Fibre Channel.
    FibreChannel,
    /// 3: TCP.
    Tcp,
    /// 254: the kernel's loop transport (nvmet's intra-host ports).
    Loop,
    /// Another value, as read.
    Other(u8),
}

impl TransportType {
    fn from_byte(b: u8) -> TransportType {
        match b {
            1 => TransportType::Rdma,
            2 => TransportType::FibreChannel,
            3 => TransportType::Tcp,
            254 => TransportType::Loop,
            b => TransportType::Other(b),
        }
    }
}

/// `ADRFAM`: the family of an entry's address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AddressFamily {
    /// 1: an IPv4 address in dotted decimal.
    Ipv4,
    /// 2: an IPv6 address.
    Ipv6,
    /// 3: InfiniBand.
    InfiniBand,
    /// 4: Fibre Channel.
    FibreChannel,
    /// 254: intra-host (the loop transport).
    IntraHost,
    /// Another value, as read.
    Other(u8),
}

impl AddressFamily {
    fn from_byte(b: u8) -> AddressFamily {
        match b {
            1 => AddressFamily::Ipv4,
            2 => AddressFamily::Ipv6,
            3 => AddressFamily::InfiniBand,
            4 => AddressFamily::FibreChannel,
            254 => AddressFamily::IntraHost,
            b => AddressFamily::Other(b),
        }
    }
}

/// `SUBTYPE`: what an entry leads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Subtype {
    /// 1: another discovery service (a referral).
    Referral,
    /// 2: an NVM subsystem, i.e. volumes.
    Nvm,
    /// 3: the discovery service that answered, on one of its ports.
    CurrentDiscovery,
    /// Another value, as read.
    Other(u8),
}

impl Subtype {
    fn from_byte(b: u8) -> Subtype {
        match b {
            1 => Subtype::Referral,
            2 => Subtype::Nvm,
            3 => Subtype::CurrentDiscovery,
            b => Subtype::Other(b),
        }
    }
}

/// One entry of the log: a port through which a subsystem (or a discovery service) is
/// reached.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Entry {
    /// `TRTYPE`.
    pub transport: TransportType,
    /// `ADRFAM`.
    pub family: AddressFamily,
    /// `SUBTYPE`.
    pub subtype: Subtype,
    /// `TREQ`: the transport's requirements; bits 1:0 say whether a secure channel is
    /// required ([`Entry::secure_channel_required`]).
    pub requirements: u8,
    /// `PORTID`: the port's number in its subsystem.
    pub port_id: u16,
    /// `CNTLID`: the controller a connect gets, or `0xFFFF` for the dynamic model.
    pub controller_id: u16,
    /// `ASQSZ`: the largest admin submission queue the port takes.
    pub admin_queue_size: u16,
    /// `EFLAGS`: the entry's flags (duplicate returned information, explicit persistent
    /// connection support).
    pub flags: u16,
    /// `TRSVCID`: the transport service, for TCP the port number as text.
    pub service_id: String,
    /// `SUBNQN`: the subsystem's NQN, as read (see [`Entry::nqn`]).
    pub subsystem: String,
    /// `TRADDR`: the transport address, for TCP an IP address as text.
    pub address: String,
    /// For TCP, the first byte of `TSAS`: the security type (0 or 1: none; 2: TLS 1.3).
    pub tcp_security: u8,
}

impl Entry {
    /// Whether the port requires a secure channel (TLS): `TREQ` bits 1:0 are `01b`.
    pub fn secure_channel_required(&self) -> bool {
        self.requirements & 0b11 == 0b01
    }

    /// The subsystem's NQN, checked as every NQN lunkit writes is.
    pub fn nqn(&self) -> Result<Nqn> {
        self.subsystem.parse()
    }

    /// The port's IP address, for an entry of the IPv4 or IPv6 family.
    pub fn ip(&self) -> Result<IpAddr> {
        const KIND: &str = "discovery entry address";
        match self.family {
            AddressFamily::Ipv4 | AddressFamily::Ipv6 => {}
            _ => return Err(Error::invalid(KIND, &self.address, "not an IP family")),
        }
        let ip: IpAddr = self
            .address
            .parse()
            .map_err(|_| Error::invalid(KIND, &self.address, "not an IP address"))?;
        if ip.is_ipv4() != (self.family == AddressFamily::Ipv4) {
            return Err(Error::invalid(
                KIND,
                &self.address,
                "not of the entry's family",
            ));
        }
        Ok(ip)
    }

    /// The port's TCP port number, from its service id.
    pub fn port(&self) -> Result<u16> {
        self.service_id
            .parse()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| {
                Error::invalid("discovery entry port", &self.service_id, "not 1 to 65535")
            })
    }

    /// Parses one 1024-byte entry; `index` names it in errors.
    pub fn parse(buf: &[u8], index: usize) -> Result<Entry> {
        let Some(e) = buf.get(..ENTRY_LEN) else {
            return Err(Error::invalid(
                "Discovery Log Page entry",
                &format!("#{index}: {} bytes", buf.len()),
                "shorter than 1024 bytes",
            ));
        };
        let u16_at = |o: usize| u16::from_le_bytes([e[o], e[o + 1]]);
        let transport = TransportType::from_byte(e[0]);
        Ok(Entry {
            transport,
            family: AddressFamily::from_byte(e[1]),
            subtype: Subtype::from_byte(e[2]),
            requirements: e[3],
            port_id: u16_at(4),
            controller_id: u16_at(6),
            admin_queue_size: u16_at(8),
            flags: u16_at(10),
            service_id: text(&e[32..64], index, "TRSVCID")?,
            subsystem: text(&e[256..512], index, "SUBNQN")?,
            address: text(&e[512..768], index, "TRADDR")?,
            tcp_security: if transport == TransportType::Tcp {
                e[768]
            } else {
                0
            },
        })
    }
}

/// A whole log: its generation and entries.
#[derive(Debug)]
pub struct Log {
    /// The header's generation counter.
    pub generation: u64,
    /// The entries that parsed, in the log's order.
    pub entries: Vec<Entry>,
    /// The entries that did not, each error naming the entry's index and field: one bad
    /// entry does not hide the others.
    pub rejected: Vec<Error>,
}

impl Log {
    /// Parses a whole page: the header at 0 and its records from [`HEADER_LEN`] on. The page
    /// must hold every record the header counts.
    pub fn parse(page: &[u8]) -> Result<Log> {
        let header = Header::parse(page)?;
        let entries = page.get(HEADER_LEN..).unwrap_or_default();
        Log::from_parts(&header, entries)
    }

    /// The log of `header` with the `entries` bytes read after it (exactly the records
    /// the header counts; more bytes are ignored).
    pub fn from_parts(header: &Header, entries: &[u8]) -> Result<Log> {
        let Some(bytes) = entries.get(..header.entries_len()) else {
            return Err(Error::invalid(
                "Discovery Log Page",
                &format!("{} records in {} bytes", header.records, entries.len()),
                "truncated: fewer bytes than its records need",
            ));
        };
        let mut log = Log {
            generation: header.generation,
            entries: Vec::with_capacity(header.records as usize),
            rejected: Vec::new(),
        };
        for (i, chunk) in bytes.chunks_exact(ENTRY_LEN).enumerate() {
            match Entry::parse(chunk, i) {
                Ok(e) => log.entries.push(e),
                Err(e) => log.rejected.push(e),
            }
        }
        Ok(log)
    }
}

/// A fixed-size text field: up to its first NUL, trailing spaces cut (the two paddings
/// the specification and targets use). Only printable ASCII other than `,` and `=` is
/// taken: the field may end up in an option string written to `/dev/nvme-fabrics`.
fn text(field: &[u8], index: usize, name: &'static str) -> Result<String> {
    let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    let s = field[..end].trim_ascii_end();
    if let Some(&bad) = s
        .iter()
        .find(|&&b| !b.is_ascii_graphic() || b == b',' || b == b'=')
    {
        let reason = if bad == b',' || bad == b'=' {
            "contains ',' or '='"
        } else {
            "contains a byte that is not printable ASCII"
        };
        return Err(Error::invalid(
            "Discovery Log Page entry",
            &format!(
                "#{index} {name} {}",
                String::from_utf8_lossy(s).escape_debug()
            ),
            reason,
        ));
    }
    // Printable ASCII: valid UTF-8.
    Ok(String::from_utf8_lossy(s).into_owned())
}

fn array<const N: usize>(b: &[u8]) -> [u8; N] {
    let mut a = [0; N];
    a.copy_from_slice(&b[..N]);
    a
}

fn hex(b: &[u8]) -> String {
    b.iter().take(32).map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An entry as nvmet writes it (`nvmet_format_discovery_entry`): space-padded service
    /// id, address and TSAS, NUL-padded NQN, dynamic controller id.
    pub(super) fn entry(subtype: u8, nqn: &str, addr: &str, port: &str) -> Vec<u8> {
        let mut e = vec![0u8; ENTRY_LEN];
        e[0] = 3;
        e[1] = if addr.contains(':') { 2 } else { 1 };
        e[2] = subtype;
        e[3] = 0b10; // a secure channel is not required
        e[4..6].copy_from_slice(&2u16.to_le_bytes());
        e[6..8].copy_from_slice(&0xffffu16.to_le_bytes());
        e[8..10].copy_from_slice(&32u16.to_le_bytes());
        e[32..64].fill(b' ');
        e[32..32 + port.len()].copy_from_slice(port.as_bytes());
        e[256..256 + nqn.len()].copy_from_slice(nqn.as_bytes());
        e[512..768].fill(b' ');
        e[512..512 + addr.len()].copy_from_slice(addr.as_bytes());
        e[768..1024].fill(b' ');
        e[768] = 0;
        e
    }

    fn page(generation: u64, entries: &[Vec<u8>]) -> Vec<u8> {
        let mut p = vec![0u8; HEADER_LEN];
        p[0..8].copy_from_slice(&generation.to_le_bytes());
        p[8..16].copy_from_slice(&(entries.len() as u64).to_le_bytes());
        for e in entries {
            p.extend_from_slice(e);
        }
        p
    }

    const VOL: &str = "nqn.2014-08.org.example:vol1";
    const DISC: &str = "nqn.2014-08.org.nvmexpress.discovery";

    #[test]
    fn a_log_of_nvmet_s_form_parses_every_field() {
        let p = page(
            7,
            &[
                entry(3, DISC, "192.0.2.1", "8009"),
                entry(2, VOL, "192.0.2.1", "4420"),
                entry(2, VOL, "2001:db8::2", "4421"),
                entry(1, DISC, "192.0.2.3", "8009"),
            ],
        );
        let log = Log::parse(&p).unwrap();
        assert_eq!(log.generation, 7);
        assert!(log.rejected.is_empty(), "{:?}", log.rejected);
        let kinds: Vec<_> = log.entries.iter().map(|e| e.subtype).collect();
        assert_eq!(
            kinds,
            [
                Subtype::CurrentDiscovery,
                Subtype::Nvm,
                Subtype::Nvm,
                Subtype::Referral
            ]
        );
        let e = &log.entries[1];
        assert_eq!(e.transport, TransportType::Tcp);
        assert_eq!(e.family, AddressFamily::Ipv4);
        assert_eq!(
            (e.port_id, e.controller_id, e.admin_queue_size),
            (2, 0xffff, 32)
        );
        assert_eq!(e.subsystem, VOL);
        assert_eq!(e.nqn().unwrap().as_str(), VOL);
        assert_eq!(e.ip().unwrap(), "192.0.2.1".parse::<IpAddr>().unwrap());
        assert_eq!(e.port().unwrap(), 4420);
        assert!(!e.secure_channel_required());
        let v6 = &log.entries[2];
        assert_eq!(v6.family, AddressFamily::Ipv6);
        assert_eq!(v6.ip().unwrap(), "2001:db8::2".parse::<IpAddr>().unwrap());
        assert_eq!(v6.service_id, "4421");
    }

    #[test]
    fn the_header_is_read_from_its_first_twenty_bytes() {
        let p = page(0x0102_0304_0506_0708, &[entry(2, VOL, "192.0.2.1", "4420")]);
        let h = Header::parse(&p[..HEADER_READ_LEN]).unwrap();
        assert_eq!(
            h,
            Header {
                generation: 0x0102_0304_0506_0708,
                records: 1,
                format: 0
            }
        );
        assert_eq!(h.entries_len(), 1024);
        let log = Log::from_parts(&h, &p[HEADER_LEN..]).unwrap();
        assert_eq!(log.entries.len(), 1);
    }

    #[test]
    fn broken_headers_are_refused_before_anything_is_read() {
        let short = Header::parse(&[0; 17]).unwrap_err();
        assert!(
            short.to_string().contains("shorter than 18 bytes"),
            "{short}"
        );
        let mut h = [0u8; 20];
        h[16] = 1;
        let e = Header::parse(&h).unwrap_err();
        assert!(e.to_string().contains("record format"), "{e}");
        let mut h = [0u8; 20];
        h[8..16].copy_from_slice(&(MAX_RECORDS + 1).to_le_bytes());
        let e = Header::parse(&h).unwrap_err();
        assert!(e.to_string().contains("more than 4096"), "{e}");
        h[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(Header::parse(&h).is_err());
    }

    #[test]
    fn a_truncated_page_is_an_error_not_fewer_entries() {
        let one = entry(2, VOL, "192.0.2.1", "4420");
        let mut p = page(1, &[one.clone(), one]);
        p.truncate(HEADER_LEN + ENTRY_LEN + 100);
        let e = Log::parse(&p).unwrap_err();
        assert!(e.to_string().contains("truncated"), "{e}");
        assert!(Log::parse(&p[..20]).is_err());
    }

    #[test]
    fn an_entry_that_would_smuggle_an_option_is_rejected_alone() {
        let bad_addr = entry(2, VOL, "192.0.2.1,hostnqn=x", "4420");
        let bad_port = entry(2, VOL, "192.0.2.2", "44\x0720");
        let mut bad_nqn = entry(2, VOL, "192.0.2.3", "4420");
        bad_nqn[256 + 3] = 0xc3;
        let good = entry(2, VOL, "192.0.2.4", "4420");
        let log = Log::parse(&page(1, &[bad_addr, bad_port, bad_nqn, good])).unwrap();
        assert_eq!(log.entries.len(), 1);
        assert_eq!(log.entries[0].address, "192.0.2.4");
        let msgs: Vec<String> = log.rejected.iter().map(ToString::to_string).collect();
        assert_eq!(msgs.len(), 3, "{msgs:?}");
        assert!(
            msgs[0].contains("#0 TRADDR") && msgs[0].contains("',' or '='"),
            "{msgs:?}"
        );
        assert!(
            msgs[1].contains("#1 TRSVCID") && msgs[1].contains("printable"),
            "{msgs:?}"
        );
        assert!(msgs[2].contains("#2 SUBNQN"), "{msgs:?}");
    }

    #[test]
    fn addresses_and_ports_are_checked_against_the_entry_s_family() {
        let mut e = Entry::parse(&entry(2, VOL, "2001:db8::2", "4420"), 0).unwrap();
        e.family = AddressFamily::Ipv4;
        assert!(e.ip().is_err());
        e.family = AddressFamily::FibreChannel;
        assert!(e.ip().is_err());
        for bad in ["0", "65536", "", "http"] {
            e.service_id = bad.into();
            assert!(e.port().is_err(), "{bad}");
        }
    }

    #[test]
    fn tls_and_other_transports_are_told_apart() {
        let mut raw = entry(2, VOL, "192.0.2.1", "4420");
        raw[3] = 0b01;
        raw[768] = 2;
        let e = Entry::parse(&raw, 0).unwrap();
        assert!(e.secure_channel_required());
        assert_eq!(e.tcp_security, 2);
        raw[0] = 1;
        let rdma = Entry::parse(&raw, 0).unwrap();
        assert_eq!(rdma.transport, TransportType::Rdma);
        assert_eq!(rdma.tcp_security, 0);
        raw[0] = 9;
        raw[2] = 7;
        let other = Entry::parse(&raw, 0).unwrap();
        assert_eq!(
            (other.transport, other.subtype),
            (TransportType::Other(9), Subtype::Other(7))
        );
    }
}

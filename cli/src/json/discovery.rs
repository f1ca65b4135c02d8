//! `lunkit nvme discover --json`: a [`Report`] of the discovery service asked for, with every
//! service asked (the referrals followed) and each one's log.

use std::time::Duration;

use lunkit::nvme::discovery::{
    AddressFamily, Discovered, Entry as LogEntry, Service as Asked, Subtype, TransportType,
};
use serde::Serialize;

use super::{Report, micros};

/// `lunkit nvme discover --json`.
pub type Discover = Report<Target, Discovery>;

/// What `discover` was asked for, as typed.
#[derive(Debug, Serialize)]
pub struct Target {
    pub traddr: String,
    pub trsvcid: String,
}

/// Every service asked, the first one first.
#[derive(Debug, Serialize)]
pub struct Discovery {
    pub services: Vec<Service>,
    /// The library's own time.
    pub elapsed_us: u64,
}

/// One discovery service and its answer.
#[derive(Debug, Serialize)]
pub struct Service {
    pub traddr: String,
    pub trsvcid: u16,
    /// Why there is no log (a referral that could not be reached), else `null`.
    pub error: Option<String>,
    /// The discovery controller read through (`nvme3`).
    pub controller: Option<String>,
    /// The log's generation counter.
    pub generation: Option<u64>,
    pub entries: Vec<Entry>,
    /// Entries that did not parse, each with why.
    pub rejected: Vec<String>,
}

/// One log entry, its numbers named.
#[derive(Debug, Serialize)]
pub struct Entry {
    /// `nvm`, `referral`, `current-discovery`, or the number.
    pub subtype: String,
    /// `tcp`, `rdma`, `fc`, `loop`, or the number.
    pub transport: String,
    /// `ipv4`, `ipv6`, `ib`, `fc`, `intra-host`, or the number.
    pub family: String,
    pub subnqn: String,
    pub traddr: String,
    pub trsvcid: String,
    pub portid: u16,
    pub cntlid: u16,
    pub secure_channel_required: bool,
}

/// The report of a discovery of `target` that took `elapsed`.
pub fn discover(
    target: Target,
    result: &lunkit::Result<Discovered>,
    elapsed: Duration,
) -> Discover {
    Report::new(target, result, elapsed, |d| Discovery {
        services: d.services.iter().map(service).collect(),
        elapsed_us: micros(d.elapsed),
    })
}

fn service(s: &Asked) -> Service {
    let log = s.result.as_ref().ok();
    Service {
        traddr: s.traddr.to_string(),
        trsvcid: s.trsvcid,
        error: s.result.as_ref().err().map(ToString::to_string),
        controller: log.map(|l| l.controller.clone()),
        generation: log.map(|l| l.log.generation),
        entries: log.map_or_else(Vec::new, |l| l.log.entries.iter().map(entry).collect()),
        rejected: log.map_or_else(Vec::new, |l| {
            l.log.rejected.iter().map(ToString::to_string).collect()
        }),
    }
}

/// An entry's document.
pub fn entry(e: &LogEntry) -> Entry {
    Entry {
        subtype: subtype_name(e.subtype),
        transport: transport_name(e.transport),
        family: family_name(e.family),
        subnqn: e.subsystem.clone(),
        traddr: e.address.clone(),
        trsvcid: e.service_id.clone(),
        portid: e.port_id,
        cntlid: e.controller_id,
        secure_channel_required: e.secure_channel_required(),
    }
}

/// The names nvme-cli's `discover` prints, shortened.
pub fn subtype_name(s: Subtype) -> String {
    match s {
        Subtype::Referral => "referral".into(),
        Subtype::Nvm => "nvm".into(),
        Subtype::CurrentDiscovery => "current-discovery".into(),
        Subtype::Other(n) => n.to_string(),
    }
}

pub fn transport_name(t: TransportType) -> String {
    match t {
        TransportType::Rdma => "rdma".into(),
        TransportType::FibreChannel => "fc".into(),
        TransportType::Tcp => "tcp".into(),
        TransportType::Loop => "loop".into(),
        TransportType::Other(n) => n.to_string(),
    }
}

pub fn family_name(f: AddressFamily) -> String {
    match f {
        AddressFamily::Ipv4 => "ipv4".into(),
        AddressFamily::Ipv6 => "ipv6".into(),
        AddressFamily::InfiniBand => "ib".into(),
        AddressFamily::FibreChannel => "fc".into(),
        AddressFamily::IntraHost => "intra-host".into(),
        AddressFamily::Other(n) => n.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_entry_names_its_numbers() {
        let mut raw = vec![0u8; 1024];
        raw[0] = 3;
        raw[1] = 1;
        raw[2] = 2;
        raw[3] = 0b01;
        raw[4] = 7;
        raw[6..8].copy_from_slice(&0xffffu16.to_le_bytes());
        raw[32..36].copy_from_slice(b"4420");
        let nqn = b"nqn.2014-08.org.example:vol1";
        raw[256..256 + nqn.len()].copy_from_slice(nqn);
        raw[512..521].copy_from_slice(b"192.0.2.1");
        let e = LogEntry::parse(&raw, 0).unwrap();
        assert_eq!(
            serde_json::to_value(entry(&e)).unwrap(),
            json!({
                "subtype": "nvm", "transport": "tcp", "family": "ipv4",
                "subnqn": "nqn.2014-08.org.example:vol1", "traddr": "192.0.2.1", "trsvcid": "4420",
                "portid": 7, "cntlid": 65535, "secure_channel_required": true,
            })
        );
        assert_eq!(subtype_name(Subtype::Other(9)), "9");
    }

    #[test]
    fn a_refused_discovery_keeps_what_was_typed() {
        let target = Target {
            traddr: "192.0.2.9".into(),
            trsvcid: "8009".into(),
        };
        let failed = Err(lunkit::Error::invalid("port", "0", "must be 1 to 65535"));
        let v = serde_json::to_value(discover(target, &failed, Duration::from_micros(3))).unwrap();
        assert_eq!(
            v,
            json!({
                "version": 1, "traddr": "192.0.2.9", "trsvcid": "8009", "ok": false,
                "error": "invalid port \"0\": must be 1 to 65535", "elapsed_us": 3, "result": null,
            })
        );
    }
}

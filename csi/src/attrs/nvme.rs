//! An NVMe/TCP volume's attributes (csi-driver-nvmf's keys and lunkit's own) and its
//! DH-HMAC-CHAP secrets, read from the stage's secrets.

// The parts of the attributes module share its imports and helpers.
use super::*;

/// The default NVMe/TCP port.
pub const NVME_PORT: u16 = 4420;

/// An NVMe/TCP namespace, as its attributes name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvmeVolume {
    /// The subsystem NQN.
    pub nqn: lunkit::Nqn,
    /// Every port, `ip:port` (`[v6]:port`), `targetTrAddr` first, without duplicates
    /// (empty when the volume gives only discovery addresses).
    pub portals: Vec<String>,
    /// The discovery services to ask for the subsystem's ports (`discoveryAddrs`), `ip:port`,
    /// without duplicates: stage connects every TCP port their logs list, with `portals`.
    pub discovery: Vec<String>,
    /// The namespace id, when given.
    pub nsid: Option<u32>,
    /// The namespace UUID (lower case), when given (`deviceUUID`, or `deviceID: uuid.…`).
    pub device_uuid: Option<String>,
    /// The namespace's kernel identity (`eui.…`, `nvme.…`, lower case) when given instead
    /// of a UUID (`deviceEUI`, or `deviceID`): the namespace is found by it after connecting.
    pub device_wwid: Option<String>,
    /// The identity the namespace must report.
    pub wwid: Option<Wwid>,
    /// The host NQN to connect as (`hostNqn`), instead of the node's.
    pub host_nqn: Option<lunkit::Nqn>,
    /// The host id to connect with (`hostId`), instead of the node's.
    pub host_id: Option<lunkit::id::Uuid>,
    /// The DH-HMAC-CHAP secrets, from the request's secrets.
    pub auth: NvmeAuth,
}

/// DH-HMAC-CHAP secrets of an NVMe volume, from NodeStageVolume's `secrets` (the PV's
/// `nodeStageSecretRef`), in the `DHHC-1:…` form `nvme gen-dhchap-key` prints:
///
/// | secret key | meaning |
/// |---|---|
/// | `dhchapSecret` | the host's secret: the node proves itself with it |
/// | `dhchapCtrlSecret` | the controller's secret: with it the subsystem must prove itself too (needs `dhchapSecret`) |
///
/// Each is checked (form, length, CRC) before any connect; an error names the key, never the
/// value. The values go to the kernel in the connect's option string only, never on a
/// command line or in a log. In the volume attributes, where anyone who reads the PV reads
/// them, they are refused.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NvmeAuth {
    /// `dhchapSecret`.
    pub secret: Option<lunkit::nvme::dhchap::Secret>,
    /// `dhchapCtrlSecret`.
    pub ctrl_secret: Option<lunkit::nvme::dhchap::Secret>,
}

/// The stage secret keys of [`NvmeAuth`].
pub const DHCHAP_KEYS: [&str; 2] = ["dhchapSecret", "dhchapCtrlSecret"];

/// Reads an NVMe volume's DH-HMAC-CHAP secrets from a request's `secrets` ([`NvmeAuth`]).
/// `INVALID_ARGUMENT` names the volume and the key for a bad value, a controller secret
/// without the host's, or a secret found in the volume attributes.
pub fn nvme_auth(
    volume_id: &str,
    ctx: &HashMap<String, String>,
    secrets: &HashMap<String, String>,
) -> Result<NvmeAuth> {
    if let Some(k) = DHCHAP_KEYS.iter().find(|k| ctx.contains_key(**k)) {
        return Err(Error::InvalidArgument(format!(
            "volume {volume_id}: volume attribute {k}: a secret is not taken from the volume \
             attributes (anyone who can read the PV reads them); put it in the \
             nodeStageSecretRef secret under the same key"
        )));
    }
    let read = |key: &str| -> Result<Option<lunkit::nvme::dhchap::Secret>> {
        let Some(v) = secrets.get(key).map(|v| v.trim()).filter(|v| !v.is_empty()) else {
            return Ok(None);
        };
        v.parse().map(Some).map_err(|e: lunkit::Error| {
            Error::InvalidArgument(format!("volume {volume_id}: stage secret {key}: {e}"))
        })
    };
    let auth = NvmeAuth {
        secret: read(DHCHAP_KEYS[0])?,
        ctrl_secret: read(DHCHAP_KEYS[1])?,
    };
    if auth.ctrl_secret.is_some() && auth.secret.is_none() {
        return Err(Error::InvalidArgument(format!(
            "volume {volume_id}: stage secret dhchapCtrlSecret: given without dhchapSecret \
             (authentication both ways needs the host's secret too)"
        )));
    }
    Ok(auth)
}

/// How the attributes name a namespace beside (or instead of) its id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum DeviceId {
    /// The namespace UUID, lower case.
    Uuid(String),
    /// The kernel's `wwid` of the namespace (`eui.…`, `nvme.…`), lower case.
    Wwid(String),
}

/// csi-driver-nvmf's `deviceID`, `deviceUUID` and `deviceEUI`. That driver waits for
/// `/dev/disk/by-id/nvme-<deviceID>`, a link udev names after the namespace's `wwid`
/// (`uuid.…`, `eui.…` for an NGUID or EUI-64, `nvme.…` when the namespace reports neither)
/// or after the subsystem's model and serial; `deviceUUID: X` is `deviceID: uuid.X` and
/// `deviceEUI: X` is `deviceID: eui.X`. lunkit-csi takes the `wwid` forms, which name one
/// namespace, and refuses the model-and-serial forms, which name a subsystem (with or
/// without a namespace id that may be reused). Given more than once, they must agree.
pub(super) fn device_id(
    ctx: &HashMap<String, String>,
) -> std::result::Result<Option<DeviceId>, (&'static str, String)> {
    let get = |key: &str| ctx.get(key).map(|v| v.trim()).filter(|v| !v.is_empty());
    let hex = |s: &str, lens: &[usize]| {
        lens.contains(&s.len()) && s.bytes().all(|b| b.is_ascii_hexdigit())
    };
    let mut named: Vec<(&'static str, DeviceId)> = Vec::new();
    if let Some(id) = get("deviceID") {
        let lower = id.to_ascii_lowercase();
        let eui = lower
            .strip_prefix("eui.")
            .is_some_and(|e| hex(e, &[16, 32]));
        let nvme = lower.strip_prefix("nvme.").is_some_and(|n| {
            !n.is_empty() && n.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
        });
        let parsed = if let Some(u) = lower.strip_prefix("uuid.").filter(|u| is_uuid(u)) {
            DeviceId::Uuid(u.to_owned())
        } else if eui || nvme {
            DeviceId::Wwid(lower)
        } else {
            return Err((
                "deviceID",
                format!(
                    "{id:?} is not a namespace identity (uuid.…, eui.… or nvme.…, as \
                     /sys/block/nvme*/wwid shows it); a udev model-and-serial name names the \
                     subsystem, not the namespace: give deviceUUID, deviceEUI or nsid"
                ),
            ));
        };
        named.push(("deviceID", parsed));
    }
    if let Some(u) = get("deviceUUID") {
        if !is_uuid(u) {
            return Err(("deviceUUID", format!("{u:?} is not a UUID")));
        }
        named.push(("deviceUUID", DeviceId::Uuid(u.to_ascii_lowercase())));
    }
    if let Some(e) = get("deviceEUI") {
        if !hex(e, &[16, 32]) {
            return Err((
                "deviceEUI",
                format!("{e:?} is not an EUI-64 or NGUID (16 or 32 hex digits)"),
            ));
        }
        named.push((
            "deviceEUI",
            DeviceId::Wwid(format!("eui.{}", e.to_ascii_lowercase())),
        ));
    }
    match named.as_slice() {
        [] => Ok(None),
        [(_, first), rest @ ..] => match rest.iter().find(|(_, d)| d != first) {
            Some((key, _)) => Err((key, format!("names another namespace than {}", named[0].0))),
            None => Ok(Some(first.clone())),
        },
    }
}

/// Reads an NVMe/TCP volume from its attributes, and its DH-HMAC-CHAP secrets from `secrets`
/// ([`nvme_auth`]).
pub fn parse_nvme(
    volume_id: &str,
    ctx: &HashMap<String, String>,
    secrets: &HashMap<String, String>,
) -> Result<NvmeVolume> {
    let bad = |key: &str, why: String| {
        Error::InvalidArgument(format!("volume {volume_id}: volume attribute {key}: {why}"))
    };
    let get = |key: &str| ctx.get(key).map(|v| v.trim()).filter(|v| !v.is_empty());
    let nqn_text = get("nqn").ok_or_else(|| bad("nqn", "missing".into()))?;
    let nqn: lunkit::Nqn = nqn_text
        .parse()
        .map_err(|e: lunkit::Error| bad("nqn", e.to_string()))?;
    check_transport(volume_id, ctx)?;
    scsi_only(volume_id, ctx, "NVMe")?;
    let discovery = match get("discoveryAddrs") {
        None => Vec::new(),
        Some(list) => discovery_addrs(list).map_err(|why| bad("discoveryAddrs", why))?,
    };
    let portals = nvme_portals(volume_id, ctx, !discovery.is_empty())?;
    let nsid = match get("nsid") {
        None => None,
        Some(n) => Some(
            n.parse::<u32>()
                .ok()
                .filter(|&n| n != 0 && n != u32::MAX)
                .ok_or_else(|| bad("nsid", format!("{n:?} is not a namespace id")))?,
        ),
    };
    let (device_uuid, device_wwid) = match device_id(ctx).map_err(|(k, why)| bad(k, why))? {
        None => (None, None),
        Some(DeviceId::Uuid(u)) => (Some(u), None),
        Some(DeviceId::Wwid(w)) => (None, Some(w)),
    };
    if nsid.is_none() && device_uuid.is_none() && device_wwid.is_none() {
        return Err(bad(
            "deviceID",
            "missing (give deviceID, deviceUUID, deviceEUI or nsid)".into(),
        ));
    }
    let wwid = match get("wwid") {
        None => None,
        Some(w) => Some(w.parse::<Wwid>().map_err(|e| bad("wwid", e.to_string()))?),
    };
    let host_nqn = match get("hostNqn") {
        None => None,
        Some(n) => Some(
            n.parse::<lunkit::Nqn>()
                .map_err(|e| bad("hostNqn", e.to_string()))?,
        ),
    };
    let host_id = match get("hostId") {
        None => None,
        Some(i) => Some(
            i.parse::<lunkit::id::Uuid>()
                .map_err(|e| bad("hostId", e.to_string()))?,
        ),
    };
    Ok(NvmeVolume {
        nqn,
        portals,
        discovery,
        nsid,
        device_uuid,
        device_wwid,
        wwid,
        host_nqn,
        host_id,
        auth: nvme_auth(volume_id, ctx, secrets)?,
    })
}

/// Refuses a transport other than TCP (`targetTrType`), and TLS: NVMe/TCP TLS needs a TLS
/// handshake daemon (tlshd) that Debian 12 does not package, so it is refused by name rather
/// than connected in the clear.
fn check_transport(volume_id: &str, ctx: &HashMap<String, String>) -> Result<()> {
    let get = |key: &str| ctx.get(key).map(|v| v.trim()).filter(|v| !v.is_empty());
    match get("targetTrType") {
        None => {}
        Some(t) if t.eq_ignore_ascii_case("tcp") => {}
        Some(t) => {
            return Err(Error::Unimplemented(format!(
                "volume {volume_id}: volume attribute targetTrType: transport {t:?} is not supported (only tcp)"
            )));
        }
    }
    for key in ["tls", "tlsKey"] {
        if get(key).is_some_and(|v| !v.eq_ignore_ascii_case("false")) {
            return Err(Error::Unimplemented(format!(
                "volume {volume_id}: volume attribute {key}: NVMe/TCP TLS is not supported \
                 (it needs a TLS handshake daemon, tlshd, which lunkit does not set up)"
            )));
        }
    }
    Ok(())
}

/// The volume's ports as `ip:port`, each once: `targetTrAddr` (and `targetTrPort`) first,
/// then those of `portals`. With discovery addresses the first port is optional: the logs
/// list the ports.
fn nvme_portals(
    volume_id: &str,
    ctx: &HashMap<String, String>,
    discovery: bool,
) -> Result<Vec<String>> {
    let bad = |key: &str, why: String| {
        Error::InvalidArgument(format!("volume {volume_id}: volume attribute {key}: {why}"))
    };
    let get = |key: &str| ctx.get(key).map(|v| v.trim()).filter(|v| !v.is_empty());
    let mut portals = match get("targetTrAddr") {
        Some(addr) => vec![first_port(addr, get("targetTrPort")).map_err(|(k, why)| bad(k, why))?],
        None if discovery => Vec::new(),
        None => {
            return Err(bad(
                "targetTrAddr",
                "missing (give it, or discoveryAddrs)".into(),
            ));
        }
    };
    if let Some(list) = get("portals") {
        let more: Vec<String> = serde_json::from_str(list)
            .map_err(|e| bad("portals", format!("not a JSON array of strings: {e}")))?;
        for p in more {
            let sa: std::net::SocketAddr = p
                .trim()
                .parse()
                .map_err(|_| bad("portals", format!("{p:?} is not ip:port")))?;
            let sa = sa.to_string();
            if !portals.contains(&sa) {
                portals.push(sa);
            }
        }
    }
    Ok(portals)
}

/// The first port, `ip:port`, from csi-driver-nvmf's `targetTrAddr` and `targetTrPort`; an
/// error names the key at fault.
pub(super) fn first_port(
    addr: &str,
    port: Option<&str>,
) -> std::result::Result<String, (&'static str, String)> {
    let ip: std::net::IpAddr = addr
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .map_err(|_| ("targetTrAddr", format!("{addr:?} is not an IP address")))?;
    let port = match port {
        None => NVME_PORT,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|&p| p != 0)
            .ok_or_else(|| ("targetTrPort", format!("{p:?} is not a port")))?,
    };
    Ok(std::net::SocketAddr::new(ip, port).to_string())
}

/// `discoveryAddrs`: a JSON array of strings or a comma-separated list, each `addr`,
/// `addr:port` or `[v6addr]:port` (port 8009 when left out), as `ip:port`, each once.
pub(super) fn discovery_addrs(list: &str) -> std::result::Result<Vec<String>, String> {
    // `[fd00::1]:8009` starts with a bracket too; a JSON array's next character is a quote.
    let json = list
        .strip_prefix('[')
        .map(str::trim_start)
        .is_some_and(|r| r.starts_with('"') || r.starts_with(']'));
    let items: Vec<String> = if json {
        serde_json::from_str(list).map_err(|e| format!("not a JSON array of strings: {e}"))?
    } else {
        list.split(',').map(str::to_owned).collect()
    };
    let mut addrs = Vec::new();
    for item in items {
        let a = lunkit::nvme::discovery::parse_address(item.trim())
            .map_err(|e| e.to_string())?
            .to_string();
        if !addrs.contains(&a) {
            addrs.push(a);
        }
    }
    if addrs.is_empty() {
        return Err("no address".into());
    }
    Ok(addrs)
}

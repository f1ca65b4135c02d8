//! `/sys/class/fc_host` and `/sys/class/fc_remote_ports` (the FC transport class).

use crate::error::Result;
use crate::id::Wwn;
use crate::id::decimal;
use crate::root::Root;
use crate::sysfs::{Confine, attr, attr_parse, entries, resolve};

crate::sysfs::kernel_state! {
    /// An FC remote port's state (`/sys/class/fc_remote_ports/rport-H:C-N/port_state`,
    /// `fc_port_state_names`).
    FcPortState {
        /// Not known.
        Unknown = "Unknown",
        /// Not present.
        NotPresent = "Not Present",
        /// Logged in: the midlayer scans and uses it.
        Online = "Online",
        /// Offline.
        Offline = "Offline",
        /// Lost; its SCSI devices are blocked until it comes back or `dev_loss_tmo` passes.
        Blocked = "Blocked",
        /// Bypassed.
        Bypassed = "Bypassed",
        /// In diagnostics.
        Diagnostics = "Diagnostics",
        /// Its link is down.
        Linkdown = "Linkdown",
        /// In error.
        Error = "Error",
        /// In loopback.
        Loopback = "Loopback",
        /// Deleted.
        Deleted = "Deleted",
        /// Online, but marked marginal by the fabric (FPIN): still scanned and used.
        Marginal = "Marginal",
    }
}

/// One local FC port (HBA), `/sys/class/fc_host/hostN`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FcHost {
    /// SCSI host number.
    pub host: u32,
    /// The initiator's WWPN.
    pub port_name: Option<Wwn>,
    /// The initiator's WWNN.
    pub node_name: Option<Wwn>,
    /// Fabric address (`0x%06x`).
    pub port_id: Option<String>,
    /// `Online`, `Linkdown`, `Offline`, `Blocked`...
    pub port_state: Option<String>,
    /// Link speed as the driver reports it (`16 Gbit`).
    pub speed: Option<String>,
}

/// One remote FC port seen by a local port, `/sys/class/fc_remote_ports/rport-H:C-N`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FcRemotePort {
    /// `rport-H:C-N`.
    pub name: String,
    /// The local SCSI host it hangs off.
    pub host: u32,
    /// The channel on that host.
    pub channel: u32,
    /// The rport's index on the channel.
    pub number: u32,
    /// The remote WWPN (the target's, for storage).
    pub port_name: Option<Wwn>,
    /// The remote WWNN.
    pub node_name: Option<Wwn>,
    /// Fabric address.
    pub port_id: Option<String>,
    /// Roles, e.g. `["FCP Target"]`.
    pub roles: Vec<String>,
    /// SCSI target id bound to the rport; `None` for -1 (not a target, or not bound).
    pub scsi_target_id: Option<u32>,
    /// `Online`, `Blocked`, `Not Present`, `Marginal`..., as the kernel wrote it (what
    /// `lunkit list` shows).
    pub port_state: Option<String>,
    /// [`port_state`](Self::port_state) parsed, for the workflows to decide on.
    pub parsed_port_state: Option<FcPortState>,
    /// `(host, channel, target)` of the SCSI target below the rport, once it exists.
    pub target: Option<(u32, u32, u32)>,
}

impl FcRemotePort {
    /// Whether the rport advertises the `FCP Target` role.
    pub fn is_fcp_target(&self) -> bool {
        self.roles.iter().any(|r| r == "FCP Target")
    }
}

/// Reads every FC host port.
pub fn hosts(root: &Root) -> Result<Vec<FcHost>> {
    let class = root.sys("class/fc_host");
    let confine = Confine::new(root);
    let mut out = Vec::new();
    for name in entries(&class)? {
        let Some(host) = name.strip_prefix("host").and_then(decimal) else {
            continue;
        };
        let Some(d) = confine.dir(&class.join(&name)) else {
            continue;
        };
        out.push(FcHost {
            host,
            port_name: attr_parse(&d, "port_name"),
            node_name: attr_parse(&d, "node_name"),
            port_id: attr(&d, "port_id"),
            port_state: attr(&d, "port_state"),
            speed: attr(&d, "speed"),
        });
    }
    Ok(out)
}

/// Parses `rport-H:C-N` into `(H, C, N)`.
pub fn parse_rport_name(name: &str) -> Option<(u32, u32, u32)> {
    let rest = name.strip_prefix("rport-")?;
    let (hc, n) = rest.split_once('-')?;
    let (h, c) = hc.split_once(':')?;
    Some((decimal(h)?, decimal(c)?, decimal(n)?))
}

/// Parses `targetH:C:T` into `(H, C, T)`.
fn parse_target_name(name: &str) -> Option<(u32, u32, u32)> {
    let mut it = name.strip_prefix("target")?.split(':');
    let t = (
        decimal(it.next()?)?,
        decimal(it.next()?)?,
        decimal(it.next()?)?,
    );
    it.next().is_none().then_some(t)
}

/// What the FC transport writes in `port_id` of a remote port it keeps only for its target
/// binding once `dev_loss_tmo` has passed (`Not Present`): `-1`, printed as a 24-bit
/// address cannot be.
const NO_PORT_ID: &str = "0xffffffff";

/// A WWN as a remote port shows it, without the transport's `-1` placeholder: after
/// `dev_loss_tmo` the kernel keeps the rport for its binding and sets the names the binding
/// does not use (`node_name` when bound by WWPN) to all ones, which no port has.
fn known_wwn(w: Option<Wwn>) -> Option<Wwn> {
    w.filter(|w| w.0 != u64::MAX)
}

/// Reads every remote port, ordered by host, channel and index. A port the kernel keeps past
/// `dev_loss_tmo` (`Not Present`) shows what it still knows: its placeholder names and port
/// id are `None`, and its `unknown` role is no role.
pub fn remote_ports(root: &Root) -> Result<Vec<FcRemotePort>> {
    let class = root.sys("class/fc_remote_ports");
    let confine = Confine::new(root);
    let mut out = Vec::new();
    for name in entries(&class)? {
        let Some((host, channel, number)) = parse_rport_name(&name) else {
            continue;
        };
        let Some(d) = confine.dir(&class.join(&name)) else {
            continue;
        };
        let target = resolve(root, &d.join("device"))
            .and_then(|dev| entries(&dev).ok())
            .and_then(|names| names.iter().find_map(|n| parse_target_name(n)));
        let port_state = attr(&d, "port_state");
        out.push(FcRemotePort {
            host,
            channel,
            number,
            port_name: known_wwn(attr_parse(&d, "port_name")),
            node_name: known_wwn(attr_parse(&d, "node_name")),
            port_id: attr(&d, "port_id").filter(|id| id != NO_PORT_ID),
            roles: attr(&d, "roles")
                .map(|r| {
                    r.split(',')
                        .map(|s| s.trim().to_owned())
                        .filter(|s| !s.is_empty() && s != "unknown")
                        .collect()
                })
                .unwrap_or_default(),
            scsi_target_id: attr_parse::<i64>(&d, "scsi_target_id")
                .and_then(|t| u32::try_from(t).ok()),
            parsed_port_state: port_state.as_deref().map(FcPortState::parse),
            port_state,
            target,
            name,
        });
    }
    out.sort_by_key(|r| (r.host, r.channel, r.number));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse() {
        assert_eq!(parse_rport_name("rport-5:0-12"), Some((5, 0, 12)));
        assert_eq!(parse_rport_name("rport-5:0"), None);
        assert_eq!(parse_rport_name("rport-5-0-1"), None);
        assert_eq!(parse_target_name("target5:0:3"), Some((5, 0, 3)));
        assert_eq!(parse_target_name("target5:0:3:1"), None);
    }

    #[test]
    fn port_states_parse_and_keep_their_spelling() {
        for (raw, state) in [
            ("Online", FcPortState::Online),
            ("Marginal", FcPortState::Marginal),
            ("Blocked", FcPortState::Blocked),
            ("Not Present", FcPortState::NotPresent),
            ("Linkdown", FcPortState::Linkdown),
            ("Deleted", FcPortState::Deleted),
        ] {
            assert_eq!(FcPortState::parse(raw), state);
            assert_eq!(state.as_str(), raw);
        }
        assert_eq!(
            FcPortState::parse("online"),
            FcPortState::Other("online".into())
        );
        assert_eq!(FcPortState::parse("Fenced").to_string(), "Fenced");
    }
}

//! `/sys/class/iscsi_session` and `/sys/class/iscsi_connection` (open-iscsi's kernel side).

use super::{Confine, attr, attr_parse, entries, file_name, resolve};
use crate::error::Result;
use crate::id::decimal;
use crate::root::Root;

/// One iSCSI session, `/sys/class/iscsi_session/sessionN`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IscsiSession {
    /// Session id, `N` of `sessionN` (what `iscsiadm -m session -r N` takes).
    pub sid: u32,
    /// Target IQN.
    pub target: Option<String>,
    /// Target portal group tag.
    pub tpgt: Option<u32>,
    /// `LOGGED_IN`, `FAILED` or `FREE`.
    pub state: Option<String>,
    /// The SCSI host the session created (iscsi_tcp makes one host per session).
    pub host: Option<u32>,
    /// The SCSI target id of the session on its host (0 for iscsi_tcp).
    pub target_id: Option<u32>,
    /// Initiator name the session logged in with.
    pub initiator: Option<String>,
    /// Its connections (one for iscsi_tcp).
    pub connections: Vec<IscsiConnection>,
}

impl IscsiSession {
    /// The portal the session was configured with, `addr:port` (`[addr]:port` for IPv6), taken
    /// from the first connection's persistent address.
    pub fn portal(&self) -> Option<String> {
        let c = self.connections.first()?;
        Some(format_portal(
            c.persistent_address.as_deref()?,
            c.persistent_port?,
        ))
    }
}

/// One connection of a session, `/sys/class/iscsi_connection/connectionS:C`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IscsiConnection {
    /// `connectionS:C`.
    pub name: String,
    /// The configured portal address.
    pub persistent_address: Option<String>,
    /// The configured portal port.
    pub persistent_port: Option<u16>,
    /// The live socket's peer address; absent (ENOTCONN) while the connection is down.
    pub address: Option<String>,
    /// The live socket's peer port; absent while the connection is down.
    pub port: Option<u16>,
    /// `up`, `down`, `failed` or `bound` (kernels from 5.18 on).
    pub state: Option<String>,
}

/// Formats a portal the way iscsiadm does: `addr:port`, with brackets around IPv6 addresses.
pub fn format_portal(addr: &str, port: u16) -> String {
    if addr.contains(':') {
        format!("[{addr}]:{port}")
    } else {
        format!("{addr}:{port}")
    }
}

/// Reads every iSCSI session with its connections, in sid order.
pub fn sessions(root: &Root) -> Result<Vec<IscsiSession>> {
    read_sessions(root, None)
}

/// Reads the sessions to `target` only, with their connections, in sid order.
///
/// A session to another target costs one read (its `targetname`), not the dozen attributes of
/// a full session: the scan path asks this on nodes logged in to many targets.
pub fn sessions_to(root: &Root, target: &str) -> Result<Vec<IscsiSession>> {
    read_sessions(root, Some(target))
}

fn read_sessions(root: &Root, only_target: Option<&str>) -> Result<Vec<IscsiSession>> {
    let class = root.sys("class/iscsi_session");
    let conn_class = root.sys("class/iscsi_connection");
    // Listed once, and only when a session needs its connections.
    let mut conns: Option<Vec<String>> = None;
    let confine = Confine::new(root);
    let mut out = Vec::new();
    for name in entries(&class)? {
        let Some(sid) = name.strip_prefix("session").and_then(decimal::<u32>) else {
            continue;
        };
        let Some(dir) = confine.dir(&class.join(&name)) else {
            continue;
        };
        let target = attr(&dir, "targetname");
        if only_target.is_some_and(|want| target.as_deref() != Some(want)) {
            continue;
        }
        // The session device sits directly below its host: .../hostM/sessionN.
        let session_dev = resolve(root, &dir.join("device"));
        let host = session_dev
            .as_deref()
            .and_then(|p| p.parent())
            .and_then(file_name)
            .and_then(|h| h.strip_prefix("host"))
            .and_then(decimal);
        // `target_id` is an attribute since 5.x; older kernels only show it in the name of
        // the targetH:0:T directory, which exists once a LUN has been scanned.
        let target_id = attr_parse(&dir, "target_id").or_else(|| {
            let dev = session_dev.as_deref()?;
            entries(dev).ok()?.iter().find_map(|e| {
                let t = e.strip_prefix("target")?;
                decimal(t.rsplit(':').next()?)
            })
        });
        let conns = match &mut conns {
            Some(c) => c,
            None => conns.insert(entries(&conn_class)?),
        };
        let prefix = format!("connection{sid}:");
        let connections = conns
            .iter()
            .filter(|c| c.starts_with(&prefix))
            .filter_map(|c| {
                let d = confine.dir(&conn_class.join(c))?;
                Some(IscsiConnection {
                    name: c.clone(),
                    persistent_address: attr(&d, "persistent_address"),
                    persistent_port: attr_parse(&d, "persistent_port"),
                    address: attr(&d, "address"),
                    port: attr_parse(&d, "port"),
                    state: attr(&d, "state"),
                })
            })
            .collect();
        out.push(IscsiSession {
            sid,
            target,
            tpgt: attr_parse(&dir, "tpgt"),
            state: attr(&dir, "state"),
            host,
            target_id,
            initiator: attr(&dir, "initiatorname"),
            connections,
        });
    }
    out.sort_by_key(|s| s.sid);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn portals_bracket_ipv6() {
        assert_eq!(format_portal("127.0.0.1", 3260), "127.0.0.1:3260");
        assert_eq!(format_portal("fe80::1", 3260), "[fe80::1]:3260");
    }
}

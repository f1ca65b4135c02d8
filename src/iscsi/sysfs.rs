//! `/sys/class/iscsi_session` and `/sys/class/iscsi_connection` (open-iscsi's kernel side).

use std::fs;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::id::{IscsiName, decimal};
use crate::root::Root;
use crate::sysfs::{Confine, attr, attr_parse, entries, file_name, resolve};

crate::sysfs::kernel_state! {
    /// An iSCSI session's state (`/sys/class/iscsi_session/sessionN/state`,
    /// `iscsi_session_state_names`).
    IscsiState {
        /// Logged in: its SCSI host takes commands.
        LoggedIn = "LOGGED_IN",
        /// The connection failed; iscsid is recovering it (its devices are blocked).
        Failed = "FAILED",
        /// Being torn down.
        Free = "FREE",
    }
}

/// One iSCSI session, `/sys/class/iscsi_session/sessionN`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IscsiSession {
    /// Session id, `N` of `sessionN` (what `iscsiadm -m session -r N` takes).
    pub sid: u32,
    /// The target's name, as the kernel reports it (`targetname`).
    ///
    /// Kept as text, not an [`IscsiName`]: this is a reading of what is on the node, and a
    /// session to a target whose name lunkit's parser refuses (an array that names itself
    /// outside RFC 3720) must still be listed, so that it can be seen and logged out, rather
    /// than fail the whole listing or be dropped from it. [`IscsiSession::target_name`] parses
    /// it, with an error naming the session; a spec's [`IscsiName`] matches it byte for byte.
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
    /// The target's name as an [`IscsiName`], to address the session's LUNs with
    /// ([`VolumeSpec::Iscsi`](crate::ops::VolumeSpec::Iscsi)); an error naming the session
    /// when the kernel reports none or one that is no `iqn.`, `eui.` or `naa.` name.
    pub fn target_name(&self) -> Result<IscsiName> {
        let name = self.target.as_deref().ok_or_else(|| Error::NotFound {
            what: format!(
                "iSCSI session {} has no targetname in sysfs (the session is being torn down, or the transport class did not fill it)",
                self.sid
            ),
        })?;
        name.parse().map_err(|e| match e {
            // The parser's reason (the accepted forms), with the session in the input.
            Error::Invalid { reason, .. } => Error::Invalid {
                kind: "targetname of an iSCSI session",
                input: format!("session{}: {name}", self.sid),
                reason,
            },
            other => other,
        })
    }

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
pub fn sessions_to(root: &Root, target: &IscsiName) -> Result<Vec<IscsiSession>> {
    read_sessions(root, Some(target.as_str()))
}

/// What a scan or a detach needs of one session: where its LUNs are and whether it is logged
/// in, and its portal when asked for. Read by [`paths_to`], without the rest of a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionPath {
    /// Session id, `N` of `sessionN`.
    pub sid: u32,
    /// `LOGGED_IN`, `FAILED` or `FREE`.
    pub state: Option<IscsiState>,
    /// The SCSI host the session created.
    pub host: Option<u32>,
    /// The SCSI target id of the session on its host.
    pub target_id: Option<u32>,
    /// The portal, as [`IscsiSession::portal`]; `None` when not asked for ([`portal_of`]
    /// reads it later) or when it cannot be read.
    pub portal: Option<String>,
}

/// Which sessions [`paths_to`] reads, beyond their target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Portals<'a> {
    /// Every session, without its portal.
    Any,
    /// Only the sessions through these portals (`addr:port`, as [`format_portal`] writes
    /// them), with their portal.
    Only(&'a [String]),
}

/// The sessions to `target`, in sid order, with only what addresses their LUNs (state, host,
/// target id) and, as `portals` asks, each one's portal: four attribute reads and a
/// `readlink` a session (two reads more for the portal) instead of a full session's dozen and
/// a path resolution. A scan reads this before its writes, so every read here is on its
/// critical path: a session through a portal not asked for costs its target name and portal
/// only, and a portal a scan only reports is read with [`portal_of`] once the writes are in
/// flight.
pub fn paths_to(root: &Root, target: &IscsiName, portals: Portals<'_>) -> Result<Vec<SessionPath>> {
    let confine = Confine::new(root);
    let mut conns: Option<Vec<String>> = None;
    let mut out = Vec::new();
    for SessionDir { sid, entry, dir } in session_dirs(root, &confine)? {
        if attr(&dir, "targetname").as_deref() != Some(target.as_str()) {
            continue;
        }
        let portal = match portals {
            Portals::Any => None,
            Portals::Only(wanted) => match session_portal(root, &confine, sid, &mut conns)? {
                Some(p) if wanted.contains(&p) => Some(p),
                _ => continue,
            },
        };
        out.push(SessionPath {
            sid,
            state: attr(&dir, "state").map(|s| IscsiState::parse(&s)),
            host: session_host(root, &entry, &dir, sid),
            target_id: session_target_id(root, &dir),
            portal,
        });
    }
    out.sort_by_key(|s| s.sid);
    Ok(out)
}

/// One `sessionN` of `/sys/class/iscsi_session`.
struct SessionDir {
    sid: u32,
    /// The class entry (a symlink on a live system).
    entry: PathBuf,
    /// Where to read its attributes, confined to the root ([`Confine::dir`]).
    dir: PathBuf,
}

/// Every session directory, in listing order; entries that are no session or lead out of
/// the root are passed over.
fn session_dirs(root: &Root, confine: &Confine) -> Result<Vec<SessionDir>> {
    let class = root.sys("class/iscsi_session");
    Ok(entries(&class)?
        .into_iter()
        .filter_map(|name| {
            let sid = name.strip_prefix("session").and_then(decimal::<u32>)?;
            let entry = class.join(&name);
            let dir = confine.dir(&entry)?;
            Some(SessionDir { sid, entry, dir })
        })
        .collect())
}

/// The portal of session `sid` ([`IscsiSession::portal`]), read alone.
pub fn portal_of(root: &Root, sid: u32) -> Option<String> {
    session_portal(root, &Confine::new(root), sid, &mut None)
        .ok()
        .flatten()
}

/// The iface session `sid` logged in through (its `ifacename`: `default`, or the name of an
/// open-iscsi iface record), read alone; `None` when it cannot be read. Two sessions to one
/// target through one portal differ by it: a caller that works on the sessions of one iface
/// tells the others apart with it.
pub fn iface_of(root: &Root, sid: u32) -> Option<String> {
    let entry = root
        .sys("class/iscsi_session")
        .join(format!("session{sid}"));
    attr(&Confine::new(root).dir(&entry)?, "ifacename")
}

/// The portal of session `sid`, its first connection's. iscsi_tcp gives a session one
/// connection, `connectionN:0`, read straight away; only a session without a readable one
/// has the class listed (`conns`, listed once for every session that needs it).
fn session_portal(
    root: &Root,
    confine: &Confine,
    sid: u32,
    conns: &mut Option<Vec<String>>,
) -> Result<Option<String>> {
    let zero = format!("connection{sid}:0");
    if let Some(p) = connection_portal(root, confine, &zero) {
        return Ok(Some(p));
    }
    let conns = match conns {
        Some(c) => c,
        None => conns.insert(entries(&root.sys("class/iscsi_connection"))?),
    };
    Ok(first_connection(conns, sid)
        .filter(|c| *c != zero)
        .and_then(|c| connection_portal(root, confine, c)))
}

/// The first of session `sid`'s connections (`connectionN:0` for iscsi_tcp) among `conns`,
/// the names in `/sys/class/iscsi_connection` in natural order.
fn first_connection(conns: &[String], sid: u32) -> Option<&str> {
    let prefix = format!("connection{sid}:");
    conns
        .iter()
        .find(|c| c.starts_with(&prefix))
        .map(String::as_str)
}

/// A connection's configured portal, `addr:port`.
fn connection_portal(root: &Root, confine: &Confine, conn: &str) -> Option<String> {
    let d = confine.dir(&root.sys("class/iscsi_connection").join(conn))?;
    Some(format_portal(
        &attr(&d, "persistent_address")?,
        attr_parse(&d, "persistent_port")?,
    ))
}

/// The SCSI host a session hangs from. The class directory's real place is
/// `.../hostM/sessionN/iscsi_session/sessionN`, so the host is the third directory up: on
/// the live root one `readlink` of the class entry `entry` says so; below another root,
/// `dir` is the entry already resolved. A tree shaped otherwise falls back to resolving the
/// session's `device` link, whose parent is the host.
fn session_host(root: &Root, entry: &Path, dir: &Path, sid: u32) -> Option<u32> {
    let session = format!("session{sid}");
    let real = if dir == entry {
        fs::read_link(entry).ok()
    } else {
        Some(dir.to_owned())
    };
    let from_link = real.as_deref().and_then(|r| {
        let class_dir = r.parent()?;
        let session_dev = class_dir.parent()?;
        let fits = file_name(r) == Some(session.as_str())
            && file_name(class_dir) == Some("iscsi_session")
            && file_name(session_dev) == Some(session.as_str());
        if fits {
            host_number(session_dev.parent()?)
        } else {
            None
        }
    });
    from_link.or_else(|| host_number(resolve(root, &dir.join("device"))?.parent()?))
}

/// `M` of a `.../hostM` directory.
fn host_number(dir: &Path) -> Option<u32> {
    file_name(dir)?.strip_prefix("host").and_then(decimal)
}

/// The session's SCSI target id: its `target_id` attribute (kernels from 5.x on), or, on
/// older kernels, the name of the `targetH:0:T` directory below the session device, which
/// exists once a LUN has been scanned.
fn session_target_id(root: &Root, dir: &Path) -> Option<u32> {
    attr_parse(dir, "target_id").or_else(|| {
        let dev = resolve(root, &dir.join("device"))?;
        entries(&dev).ok()?.iter().find_map(|e| {
            let t = e.strip_prefix("target")?;
            decimal(t.rsplit(':').next()?)
        })
    })
}

fn read_sessions(root: &Root, only_target: Option<&str>) -> Result<Vec<IscsiSession>> {
    let conn_class = root.sys("class/iscsi_connection");
    // Listed once, and only when a session needs its connections.
    let mut conns: Option<Vec<String>> = None;
    let confine = Confine::new(root);
    let mut out = Vec::new();
    for SessionDir { sid, entry, dir } in session_dirs(root, &confine)? {
        let target = attr(&dir, "targetname");
        if only_target.is_some_and(|want| target.as_deref() != Some(want)) {
            continue;
        }
        let host = session_host(root, &entry, &dir, sid);
        let target_id = session_target_id(root, &dir);
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

    /// On the live root the host comes from the class entry's own link, relative as sysfs
    /// makes it; an entry shaped otherwise gives no host rather than a wrong one.
    #[test]
    fn the_host_is_read_from_the_class_link() {
        let dir = std::env::temp_dir().join(format!("lunkit-sess-{}", std::process::id()));
        let class = dir.join("sys/class/iscsi_session");
        fs::create_dir_all(&class).unwrap();
        let root = Root::new(&dir);
        let link = |name: &str, to: &str| {
            let entry = class.join(name);
            std::os::unix::fs::symlink(to, &entry).unwrap();
            entry
        };
        let good = link(
            "session3",
            "../../devices/platform/host12/session3/iscsi_session/session3",
        );
        assert_eq!(session_host(&root, &good, &good, 3), Some(12));
        // Another session's directory, or no iscsi_session class dir between: no host.
        assert_eq!(session_host(&root, &good, &good, 4), None);
        let odd = link(
            "session5",
            "../../devices/platform/host12/session5/other/session5",
        );
        assert_eq!(session_host(&root, &odd, &odd, 5), None);
        fs::remove_dir_all(&dir).unwrap();
    }

    /// A session's portal is its connection 0's, read without listing the class; a session
    /// whose connection has another id is found by listing it.
    #[test]
    fn a_portal_is_the_first_connections() {
        let dir = std::env::temp_dir().join(format!("lunkit-portal-{}", std::process::id()));
        let conns = dir.join("sys/class/iscsi_connection");
        let conn = |name: &str, addr: &str| {
            let d = conns.join(name);
            fs::create_dir_all(&d).unwrap();
            fs::write(d.join("persistent_address"), format!("{addr}\n")).unwrap();
            fs::write(d.join("persistent_port"), "3260\n").unwrap();
        };
        conn("connection3:0", "10.0.0.1");
        conn("connection3:1", "10.0.0.2");
        conn("connection4:2", "fe80::4");
        conn("connection44:0", "10.0.0.44");
        let root = Root::new(&dir);
        assert_eq!(portal_of(&root, 3).as_deref(), Some("10.0.0.1:3260"));
        assert_eq!(portal_of(&root, 4).as_deref(), Some("[fe80::4]:3260"));
        assert_eq!(portal_of(&root, 5), None);
        fs::remove_dir_all(&dir).unwrap();
    }

    /// The iface of a session, as the captured tree of a live node has it; a session that is
    /// not there has none.
    #[test]
    fn a_sessions_iface_is_read_alone() {
        let root =
            Root::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/iscsi-multipath"));
        assert_eq!(iface_of(&root, 1).as_deref(), Some("default"));
        assert_eq!(iface_of(&root, 2).as_deref(), Some("default"));
        assert_eq!(iface_of(&root, 9), None);
        let dir = std::env::temp_dir().join(format!("lunkit-iface-{}", std::process::id()));
        let sess = dir.join("sys/class/iscsi_session/session4");
        fs::create_dir_all(&sess).unwrap();
        fs::write(sess.join("ifacename"), "other\n").unwrap();
        assert_eq!(iface_of(&Root::new(&dir), 4).as_deref(), Some("other"));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn portals_bracket_ipv6() {
        assert_eq!(format_portal("127.0.0.1", 3260), "127.0.0.1:3260");
        assert_eq!(format_portal("fe80::1", 3260), "[fe80::1]:3260");
    }

    #[test]
    fn session_states_parse_and_keep_their_spelling() {
        for (raw, state) in [
            ("LOGGED_IN", IscsiState::LoggedIn),
            ("FAILED", IscsiState::Failed),
            ("FREE", IscsiState::Free),
        ] {
            assert_eq!(IscsiState::parse(raw), state);
            assert_eq!(state.as_str(), raw);
        }
        assert_eq!(
            IscsiState::parse("logged_in"),
            IscsiState::Other("logged_in".into())
        );
        assert_eq!(IscsiState::parse("").as_str(), "");
    }

    /// A name the kernel reports is kept as it is in the listing, and only its parse fails,
    /// naming the session and the forms; no name is a not-found naming the session.
    #[test]
    fn a_session_target_name_that_is_no_iscsi_name_is_an_error_naming_the_session() {
        let session = |target: Option<&str>| IscsiSession {
            sid: 7,
            target: target.map(str::to_owned),
            tpgt: None,
            state: None,
            host: None,
            target_id: None,
            initiator: None,
            connections: Vec::new(),
        };
        let good = "iqn.2003-01.org.example:array";
        assert_eq!(session(Some(good)).target_name().unwrap().as_str(), good);
        let e = session(Some("array 1")).target_name().unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Invalid);
        let said = e.to_string();
        assert!(said.contains("session7: array 1"), "{said}");
        assert!(
            said.contains("iqn.yyyy-mm") && said.contains("naa."),
            "{said}"
        );
        let e = session(None).target_name().unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::NotFound);
        assert!(e.to_string().contains("iSCSI session 7"), "{e}");
    }
}

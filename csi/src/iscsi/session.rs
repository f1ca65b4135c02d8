//! Which sessions are a volume's: those through its iface that present the initiator name
//! that iface logs in with; and the node's initiator name, which a volume's `initiatorName`
//! must be.

// The parts of the iSCSI module share its imports, constants and runner.
use super::*;

/// Which sessions are a volume's: those through the iface its PV names that present the
/// initiator name that iface logs in with. Any other session to the same target and portal
/// is someone else's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// The open-iscsi iface ([`DEFAULT_IFACE`] when the volume names none).
    pub iface: String,
    /// The initiator name sessions through it present: the iface record's
    /// `iface.initiatorname`, else the node's; `None` when neither names one (the iface
    /// decides alone).
    pub initiator: Option<String>,
}

impl Owner {
    /// The owner of the sessions a volume logs in through `iface` makes, with open-iscsi's
    /// node records in `nodes` (its iface records are in `ifaces/` beside them).
    pub fn of(root: &Root, nodes: &Path, iface: Option<&str>) -> Result<Owner> {
        let iface = iface.unwrap_or(DEFAULT_IFACE).to_owned();
        let initiator = match iface_initiator(nodes, &iface) {
            Some(name) => Some(name),
            None => node_initiator_name(root)?,
        };
        Ok(Owner { iface, initiator })
    }

    /// Whether a session on `iface` presenting `initiator` is the volume's. A session whose
    /// iface (or, when one is expected, initiator name) cannot be read is not.
    pub fn owns(&self, iface: Option<&str>, initiator: Option<&str>) -> bool {
        let name_fits = match &self.initiator {
            None => true,
            Some(want) => initiator.is_some_and(|n| n.eq_ignore_ascii_case(want)),
        };
        iface == Some(self.iface.as_str()) && name_fits
    }
}

/// The `iface.initiatorname` of open-iscsi's iface record `iface` (`<db>/ifaces/IFACE`, the
/// node records `nodes` being `<db>/nodes`), when it sets one.
pub(super) fn iface_initiator(nodes: &Path, iface: &str) -> Option<String> {
    if iface == DEFAULT_IFACE || iface.contains('/') || iface.starts_with('.') {
        return None;
    }
    let text = std::fs::read_to_string(nodes.parent()?.join("ifaces").join(iface)).ok()?;
    text.lines()
        .filter_map(|l| l.split_once('='))
        .find(|(k, _)| k.trim() == "iface.initiatorname")
        .map(|(_, v)| v.trim().to_owned())
        .filter(|v| !v.is_empty() && v != "<empty>")
}

/// The sessions to `iqn` through `portal` that are `owner`'s, in sid order.
pub(super) fn sessions_via(
    root: &Root,
    iqn: &str,
    portal: &str,
    owner: &Owner,
) -> Result<Vec<IscsiSession>> {
    let read = match iqn.parse::<IscsiName>() {
        Ok(name) => sessions_to(root, &name),
        // A record kept from before the plugin checked a target's form may name one that is
        // no iSCSI name: its sessions are still found (by every session's text), so that an
        // unstage can log them out rather than fail on the name for ever.
        Err(_) => sessions(root).map(|all| {
            all.into_iter()
                .filter(|s| s.target.as_deref() == Some(iqn))
                .collect()
        }),
    };
    let all = read.map_err(|e| Error::lunkit(format!("reading the iSCSI sessions to {iqn}"), e))?;
    Ok(all
        .into_iter()
        .filter(|s| s.portal().as_deref() == Some(portal))
        .filter(|s| owner.owns(iface_of(root, s.sid).as_deref(), s.initiator.as_deref()))
        .collect())
}

/// The node's initiator name: `InitiatorName=` in `<root>/etc/iscsi/initiatorname.iscsi`,
/// which iscsid reads at start; `None` when the file is not there or names none.
pub fn node_initiator_name(root: &Root) -> Result<Option<String>> {
    let path = root.etc("iscsi/initiatorname.iscsi");
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::Internal(format!("{}: {e}", path.display()))),
    };
    Ok(initiator_name_in(&text))
}

/// The `InitiatorName=` of an `initiatorname.iscsi` file's text (comments skipped).
pub fn initiator_name_in(text: &str) -> Option<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix("InitiatorName="))
        .map(|n| n.trim().to_owned())
        .filter(|n| !n.is_empty())
}

/// Checks a volume's `initiatorName` against the node's. lunkit-csi logs in with the
/// node's name only: open-iscsi keeps one session per target, portal and iface, a LUN
/// number means what the target's ACL for the initiator name maps it to, and lunkit's scan
/// of a volume's LUN goes through every session to the target through its portals. A second
/// initiator name (an iface with its own `iface.initiatorname`, as Kubernetes' in-tree plugin
/// makes) would put two sessions through one portal, each seeing its own LUN behind the same
/// number, and the scan would mix them. So another name is refused, `FAILED_PRECONDITION`
/// naming both, before anything is done; the node's own name (or none) goes ahead.
pub fn check_initiator(root: &Root, volume_id: &str, wanted: &str) -> Result<()> {
    let node = node_initiator_name(root)?;
    if node
        .as_deref()
        .is_some_and(|n| n.eq_ignore_ascii_case(wanted))
    {
        return Ok(());
    }
    Err(Error::FailedPrecondition(format!(
        "volume {volume_id}: volume attribute initiatorName {wanted:?} is not this node's \
         initiator name ({}, from {}): lunkit-csi logs in as the node only (a LUN number means \
         what the target maps it to for each initiator name, and two names' sessions through \
         one portal would mix); leave initiatorName out or set it to the node's name, and \
         give the target's ACL the node's name",
        node.as_deref()
            .map_or("none set".to_owned(), |n| format!("{n:?}")),
        root.etc("iscsi/initiatorname.iscsi").display()
    )))
}

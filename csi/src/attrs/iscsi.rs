//! An iSCSI volume's attributes (csi-driver-iscsi's keys) and its CHAP credentials, read from
//! the stage's secrets.

// The parts of the attributes module share its imports and helpers.
use super::*;

/// The default iSCSI port.
pub const ISCSI_PORT: u16 = 3260;

/// An iSCSI volume, as its attributes name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IscsiVolume {
    /// The target IQN.
    pub iqn: String,
    /// Every portal, `addr:port` (`[v6]:port`), `targetPortal` first, without duplicates.
    pub portals: Vec<String>,
    /// The LUN.
    pub lun: u64,
    /// The open-iscsi interface, when not `default`.
    pub iface: Option<String>,
    /// The WWID the LUN must report.
    pub wwid: Option<Wwid>,
    /// Session CHAP, when `sessionCHAPAuth` is `true`.
    pub chap: Option<Chap>,
    /// `discovery: true`: ask the portals for the target's other portals (SendTargets)
    /// before logging in, and log in to those too.
    pub discovery: bool,
    /// Discovery CHAP, when `discovery` and `discoveryCHAPAuth` are both `true`.
    pub discovery_chap: Option<Chap>,
    /// The initiator name the volume's logins must present (`initiatorName`), when given:
    /// staging checks it is the node's own ([`crate::iscsi::check_initiator`]).
    pub initiator_name: Option<String>,
    /// `fencing`, `fencingPreempt`.
    pub fencing: Fencing,
}

/// Which login CHAP authenticates, and so which keys name its credentials.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChapScope {
    /// The session's login (`sessionCHAPAuth`): keys `node.session.auth.*`, set in the
    /// target's node record.
    Session,
    /// The SendTargets discovery session's login (`discoveryCHAPAuth` with `discovery`): keys
    /// `discovery.sendtargets.auth.*` (those of Kubernetes' `kubernetes.io/iscsi-chap`
    /// Secrets), set in the portal's discovery record.
    Discovery,
}

/// The five setting names of one [`ChapScope`], which are also its secret keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChapKeys {
    /// `….authmethod`.
    pub authmethod: &'static str,
    /// `….username`.
    pub username: &'static str,
    /// `….password`.
    pub password: &'static str,
    /// `….username_in`.
    pub username_in: &'static str,
    /// `….password_in`.
    pub password_in: &'static str,
}

/// CHAP credentials, from NodeStageVolume's `secrets`. Session CHAP's keys:
///
/// | secret key | meaning |
/// |---|---|
/// | `node.session.auth.username` | the name this node logs in with (required) |
/// | `node.session.auth.password` | its secret (required) |
/// | `node.session.auth.username_in` | mutual CHAP: the name the target answers with |
/// | `node.session.auth.password_in` | mutual CHAP: the target's secret |
/// | `node.session.auth.authmethod` | optional; `CHAP` if given |
///
/// Discovery CHAP's are the same under `discovery.sendtargets.auth.` ([`ChapScope`]).
/// `username_in` and `password_in` come together or not at all. Every value must be 1 to 255
/// bytes ([`MAX_CHAP_LEN`]), without control characters, without spaces at either end (the
/// record's parser strips them) and not starting with `-`.
#[derive(Clone, PartialEq, Eq)]
pub struct Chap {
    /// Which login the credentials are for.
    pub scope: ChapScope,
    /// `node.session.auth.username`.
    pub username: String,
    /// `node.session.auth.password`.
    pub password: Secret,
    /// `node.session.auth.username_in` and `password_in`: the target authenticates itself too.
    pub mutual: Option<(String, Secret)>,
}

impl std::fmt::Debug for Chap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Chap")
            .field("scope", &self.scope)
            .field("username", &self.username)
            .field("password", &self.password)
            .field("mutual", &self.mutual)
            .finish()
    }
}

impl Chap {
    /// The node-record settings without a secret, which iscsiadm's `-o update` sets on its
    /// command line, in the order they are set: `(name, value)`.
    pub fn settings(&self) -> Vec<(&'static str, &str)> {
        let k = self.scope.keys();
        let mut s = vec![(k.authmethod, "CHAP"), (k.username, self.username.as_str())];
        if let Some((user, _)) = &self.mutual {
            s.push((k.username_in, user.as_str()));
        }
        s
    }

    /// The secret settings, which never go on a command line: they are written into the
    /// node or discovery record itself ([`crate::iscsi::write_secrets`]).
    pub fn secrets(&self) -> Vec<(&'static str, &str)> {
        let k = self.scope.keys();
        let mut s = vec![(k.password, self.password.expose())];
        if let Some((_, password)) = &self.mutual {
            s.push((k.password_in, password.expose()));
        }
        s
    }
}

/// The longest CHAP name or secret open-iscsi keeps: its buffers are `AUTH_STR_MAX_LEN`
/// (256) bytes with the terminating NUL, and a longer value is cut short without a word
/// (`strlcpy` in idbm.c), which would log in with another secret than the one given.
pub const MAX_CHAP_LEN: usize = 255;

/// The secret keys of session CHAP.
pub const CHAP_USERNAME: &str = "node.session.auth.username";

/// See [`CHAP_USERNAME`].
pub const CHAP_PASSWORD: &str = "node.session.auth.password";

/// See [`CHAP_USERNAME`].
pub const CHAP_USERNAME_IN: &str = "node.session.auth.username_in";

/// See [`CHAP_USERNAME`].
pub const CHAP_PASSWORD_IN: &str = "node.session.auth.password_in";

/// See [`CHAP_USERNAME`].
pub const CHAP_AUTHMETHOD: &str = "node.session.auth.authmethod";

/// Reads session CHAP credentials from a request's secrets. Every problem is
/// `INVALID_ARGUMENT` naming the volume and the key, never the value.
pub fn chap(volume_id: &str, secrets: &HashMap<String, String>) -> Result<Chap> {
    chap_of(ChapScope::Session, volume_id, secrets)
}

/// Reads the CHAP credentials of `scope` from a request's secrets (see [`chap`]).
pub fn chap_of(
    scope: ChapScope,
    volume_id: &str,
    secrets: &HashMap<String, String>,
) -> Result<Chap> {
    let keys = scope.keys();
    let bad = |key: &str, why: &str| {
        Error::InvalidArgument(format!(
            "volume {volume_id}: secret {key}: {why} ({} is true)",
            scope.attribute()
        ))
    };
    let value = |key: &str| -> Result<Option<String>> {
        let Some(v) = secrets.get(key) else {
            return Ok(None);
        };
        if v.is_empty() {
            return Err(bad(key, "is empty"));
        }
        if v.len() > MAX_CHAP_LEN {
            return Err(bad(
                key,
                &format!(
                    "is {} bytes; open-iscsi keeps at most {MAX_CHAP_LEN}",
                    v.len()
                ),
            ));
        }
        if v.chars().any(char::is_control) {
            return Err(bad(
                key,
                "contains a control character (a newline, say); refused",
            ));
        }
        if v.starts_with('-') {
            return Err(bad(
                key,
                "starts with '-', which iscsiadm could take for an option; refused",
            ));
        }
        if v.trim() != v {
            return Err(bad(
                key,
                "starts or ends with white space, which the node record would lose; refused",
            ));
        }
        Ok(Some(v.clone()))
    };
    let need = |key: &str| -> Result<String> {
        value(key)?.ok_or_else(|| bad(key, "missing from the request's secrets"))
    };
    if let Some(m) = value(keys.authmethod)? {
        if !m.eq_ignore_ascii_case("CHAP") {
            return Err(bad(
                keys.authmethod,
                "must be CHAP when given (the secret names another method)",
            ));
        }
    }
    let username = need(keys.username)?;
    let password = Secret(need(keys.password)?);
    let mutual = match (value(keys.username_in)?, value(keys.password_in)?) {
        (None, None) => None,
        (Some(u), Some(p)) => Some((u, Secret(p))),
        (Some(_), None) => {
            return Err(bad(
                keys.password_in,
                "missing: mutual CHAP needs both username_in and password_in",
            ));
        }
        (None, Some(_)) => {
            return Err(bad(
                keys.username_in,
                "missing: mutual CHAP needs both username_in and password_in",
            ));
        }
    };
    Ok(Chap {
        scope,
        username,
        password,
        mutual,
    })
}

/// Reads an iSCSI volume from its attributes, and its CHAP credentials from `secrets` when
/// `sessionCHAPAuth` is `true`. Every problem is `INVALID_ARGUMENT` naming the volume, the key
/// and what is wrong with it (never a secret's value).
pub fn parse_iscsi(
    volume_id: &str,
    ctx: &HashMap<String, String>,
    secrets: &HashMap<String, String>,
) -> Result<IscsiVolume> {
    let bad = |key: &str, why: String| bad_attr(volume_id, key, why);
    let required = |key: &str| required_attr(volume_id, ctx, key);
    let iqn = iscsi_iqn(volume_id, ctx)?;
    let lun_text = required("lun")?;
    let lun = lun_number(lun_text)
        .ok_or_else(|| bad("lun", format!("{lun_text:?} is not a LUN number")))?;
    let portals = iscsi_portals(volume_id, ctx)?;
    if ctx.contains_key("secret") {
        return Err(bad(
            "secret",
            "credentials in volume attributes are not read (anyone who can read the PV \
             reads them); name a Secret in the PV's nodeStageSecretRef instead"
                .into(),
        ));
    }
    let [discovery, discovery_chap, session_chap] = iscsi_flags(volume_id, ctx)?;
    let chap = if session_chap {
        Some(chap(volume_id, secrets)?)
    } else {
        None
    };
    // Discovery CHAP authenticates the SendTargets session only: without `discovery` none is
    // opened, and there is nothing to authenticate (as in csi-lib-iscsi, which reads it only
    // when it discovers).
    let discovery_chap = if discovery && discovery_chap {
        Some(chap_of(ChapScope::Discovery, volume_id, secrets)?)
    } else {
        None
    };
    let initiator_name = match ctx
        .get("initiatorName")
        .map(|v| v.trim())
        .filter(|v| !v.is_empty())
    {
        None => None,
        Some(n) => {
            lunkit::iscsi::check_target_name(n).map_err(|e| bad("initiatorName", e.to_string()))?;
            Some(n.to_owned())
        }
    };
    let iface = match ctx.get("iscsiInterface").map(|v| v.trim()) {
        None | Some("") | Some("default") => None,
        Some(i) if valid_word(i) => Some(i.to_owned()),
        Some(i) => {
            return Err(bad(
                "iscsiInterface",
                format!("{i:?} is not an interface name"),
            ));
        }
    };
    let wwid = match ctx.get("wwid").map(|v| v.trim()).filter(|v| !v.is_empty()) {
        None => None,
        Some(w) => Some(w.parse::<Wwid>().map_err(|e| bad("wwid", e.to_string()))?),
    };
    Ok(IscsiVolume {
        iqn,
        portals,
        lun,
        iface,
        wwid,
        chap,
        discovery,
        discovery_chap,
        initiator_name,
        fencing: parse_fencing(volume_id, ctx)?,
    })
}

/// The target name (`iqn`), checked.
fn iscsi_iqn(volume_id: &str, ctx: &HashMap<String, String>) -> Result<String> {
    let bad = |key: &str, why: String| bad_attr(volume_id, key, why);
    let required = |key: &str| required_attr(volume_id, ctx, key);
    let iqn = required("iqn")?.to_owned();
    // The library's iSCSI name: one of the three forms (the refusal names them), printable,
    // no '/' and at most 223 bytes. It also keeps out `.` and `..`, which would be the node
    // database's directory itself or its parent (open-iscsi names a target's directory after
    // it). Checked here so that a malformed name is the CO's InvalidArgument at once, and
    // the stage's conversion to the library's type (`attach_iscsi`) cannot fail.
    iqn.parse::<lunkit::id::IscsiName>()
        .map_err(|e| bad("iqn", e.to_string()))?;
    Ok(iqn)
}

/// The volume's portals as sysfs shows them, each once: `targetPortal` first, then those of
/// `portals`.
fn iscsi_portals(volume_id: &str, ctx: &HashMap<String, String>) -> Result<Vec<String>> {
    let bad = |key: &str, why: String| bad_attr(volume_id, key, why);
    let required = |key: &str| required_attr(volume_id, ctx, key);
    let mut portals = vec![portal(required("targetPortal")?).map_err(|w| bad("targetPortal", w))?];
    if let Some(list) = ctx
        .get("portals")
        .map(|v| v.trim())
        .filter(|v| !v.is_empty())
    {
        let more: Vec<String> = serde_json::from_str(list)
            .map_err(|e| bad("portals", format!("not a JSON array of strings: {e}")))?;
        for p in more {
            let p = portal(&p).map_err(|w| bad("portals", w))?;
            if !portals.contains(&p) {
                portals.push(p);
            }
        }
    }
    Ok(portals)
}

/// The `discovery`, `discoveryCHAPAuth` and `sessionCHAPAuth` switches, in that order.
fn iscsi_flags(volume_id: &str, ctx: &HashMap<String, String>) -> Result<[bool; 3]> {
    let bad = |key: &str, why: String| {
        Error::InvalidArgument(format!("volume {volume_id}: volume attribute {key}: {why}"))
    };
    let mut flags = [false; 3];
    for (flag, key) in flags
        .iter_mut()
        .zip(["discovery", "discoveryCHAPAuth", "sessionCHAPAuth"])
    {
        *flag = match ctx.get(key).map(|v| v.trim()) {
            None | Some("") | Some("false") => false,
            Some("true") => true,
            Some(v) => return Err(bad(key, format!("{v:?} is neither true nor false"))),
        };
    }
    Ok(flags)
}

/// A portal in the form iscsiadm and sysfs show it: `addr:port`, `[v6addr]:port`. A bare
/// address gets port 3260 (as csi-driver-iscsi does); a bare IPv6 address must be in brackets.
pub fn portal(input: &str) -> Result<String, String> {
    let input = input.trim();
    let (addr, port) = if let Some(rest) = input.strip_prefix('[') {
        let (addr, after) = rest
            .split_once(']')
            .ok_or_else(|| format!("{input:?}: '[' without ']'"))?;
        let port = match after {
            "" => None,
            p => Some(
                p.strip_prefix(':')
                    .ok_or_else(|| format!("{input:?}: expected ':' after ']'"))?,
            ),
        };
        if addr.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(format!("{input:?}: {addr:?} is not an IPv6 address"));
        }
        (format!("[{addr}]"), port)
    } else {
        match input.split_once(':') {
            Some((_, rest)) if rest.contains(':') => {
                return Err(format!(
                    "{input:?}: an IPv6 address must be in brackets: [addr]:port"
                ));
            }
            Some((a, p)) => (a.to_owned(), Some(p)),
            None => (input.to_owned(), None),
        }
    };
    let host = addr.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty()
        || !host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".-:".contains(&b))
    {
        return Err(format!("{input:?}: {addr:?} is not an address"));
    }
    let port = match port {
        None => ISCSI_PORT,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|&p| p != 0)
            .ok_or_else(|| format!("{input:?}: {p:?} is not a port"))?,
    };
    Ok(format!("{addr}:{port}"))
}

//! Volume attributes (the PV's `volumeAttributes`, CSI's `volume_context`): which target,
//! portals and LUN a statically provisioned volume is.
//!
//! The keys are those of kubernetes-csi's `csi-driver-iscsi`, so existing PVs work unchanged:
//!
//! | key | meaning |
//! |---|---|
//! | `targetPortal` | the first portal, `addr[:port]` (port 3260 when left out), `[v6addr]:port` |
//! | `portals` | more portals, a JSON array of strings: `["10.0.0.2:3260"]` (optional) |
//! | `iqn` | the target IQN |
//! | `lun` | the LUN number |
//! | `iscsiInterface` | the open-iscsi interface (`iscsiadm -I`), `default` when left out |
//! | `sessionCHAPAuth` | `true`: log in with CHAP, credentials from the request's secrets ([`Chap`]) |
//! | `discovery` | `true`: ask the portals for the target's other portals (SendTargets) and log in to them too |
//! | `discoveryCHAPAuth` | with `discovery`: the discovery login uses CHAP, credentials from the request's secrets (`discovery.sendtargets.auth.*`, [`ChapScope::Discovery`]) |
//! | `initiatorName` | must be the node's initiator name; another is refused ([`crate::iscsi::check_initiator`]) |
//! | `wwid` | lunkit's own, optional: the WWID the LUN must report; a different one is refused |
//!
//! NVMe over TCP volumes use the keys of kubernetes-csi's `csi-driver-nvmf`, and lunkit's own
//! `nsid` and `portals`:
//!
//! | key | meaning |
//! |---|---|
//! | `targetTrAddr` | the first port's IP address (optional with `discoveryAddrs`) |
//! | `targetTrPort` | its TCP port (4420 when left out) |
//! | `targetTrType` | the transport: `tcp` (others are refused) |
//! | `nqn` | the subsystem NQN |
//! | `deviceID` | the namespace's identity as `/sys/block/nvme*/wwid` shows it: `uuid.…`, `eui.…` (NGUID or EUI-64), `nvme.…`; found by it after connecting |
//! | `deviceUUID` | the namespace's UUID (`deviceID: uuid.…`) |
//! | `deviceEUI` | its NGUID or EUI-64 (`deviceID: eui.…`) |
//! | `nsid` | lunkit's own: the namespace id, instead of (or checked against) the above |
//! | `hostNqn`, `hostId` | the host identity this volume's connects present, instead of the node's |
//! | `portals` | lunkit's own: more ports, a JSON array of `addr:port` strings |
//! | `discoveryAddrs` | lunkit's own: discovery services whose logs list the ports (connect-all), a JSON array or a comma-separated list of `addr[:port]` (port 8009 when left out; `[v6addr]:port`) |
//! | `wwid` | as for iSCSI: the identity the namespace must report (`uuid.…`, `eui.…`) |
//!
//! An NVMe subsystem that requires in-band authentication (DH-HMAC-CHAP) gets its secrets
//! from NodeStageVolume's `secrets` ([`NvmeAuth`]), never from the attributes.
//!
//! Fibre Channel volumes use the names of Kubernetes' in-tree FC volume (`targetWWNs`, `lun`):
//!
//! | key | meaning |
//! |---|---|
//! | `targetWWNs` | the target's port names, a JSON array (`["500a0981891b8dc5"]`) or a comma-separated list; each 16 hex digits, `0x…` or colon-separated |
//! | `lun` | the LUN number |
//! | `wwid` | as for iSCSI |
//!
//! A volume is NVMe when its attributes have `nqn` or `targetTrAddr`, FC when they have
//! `targetWWNs`, iSCSI when they have `iqn`; two of them at once is refused. Nothing is parsed
//! out of the volume id.
//!
//! CHAP credentials never come from the attributes (anyone who can read the PV reads them):
//! csi-driver-iscsi's `secret` attribute, a JSON map of credentials, is refused. They come
//! from NodeStageVolume's `secrets` (the PV's `nodeStageSecretRef`), with the keys of
//! Kubernetes' `kubernetes.io/iscsi-chap` secrets, which are open-iscsi's setting names (see
//! [`Chap`]).

use std::collections::HashMap;

use lunkit::Wwid;

use crate::error::{Error, Result};

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
}

/// A secret value (a CHAP password): never shown by `Debug`, and with no `Display`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// The value, for the one place that writes it into the node record.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
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

impl ChapScope {
    /// The setting names (and secret keys) of this scope.
    pub fn keys(self) -> ChapKeys {
        match self {
            ChapScope::Session => ChapKeys {
                authmethod: CHAP_AUTHMETHOD,
                username: CHAP_USERNAME,
                password: CHAP_PASSWORD,
                username_in: CHAP_USERNAME_IN,
                password_in: CHAP_PASSWORD_IN,
            },
            ChapScope::Discovery => ChapKeys {
                authmethod: "discovery.sendtargets.auth.authmethod",
                username: "discovery.sendtargets.auth.username",
                password: "discovery.sendtargets.auth.password",
                username_in: "discovery.sendtargets.auth.username_in",
                password_in: "discovery.sendtargets.auth.password_in",
            },
        }
    }

    /// The attribute that asks for it, for messages.
    fn attribute(self) -> &'static str {
        match self {
            ChapScope::Session => "sessionCHAPAuth",
            ChapScope::Discovery => "discoveryCHAPAuth",
        }
    }
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
enum DeviceId {
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
fn device_id(
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

/// A Fibre Channel LUN, as its attributes name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FcVolume {
    /// The target's port names, sorted, each once.
    pub wwpns: Vec<lunkit::Wwn>,
    /// The LUN.
    pub lun: u64,
    /// The WWID the LUN must report.
    pub wwid: Option<Wwid>,
}

/// A volume of any transport.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Volume {
    /// An iSCSI LUN.
    Iscsi(IscsiVolume),
    /// An NVMe/TCP namespace.
    Nvme(NvmeVolume),
    /// A Fibre Channel LUN.
    Fc(FcVolume),
}

/// Reads a volume of any transport from its attributes and, for iSCSI CHAP, the
/// request's secrets (see the module docs for the keys).
pub fn parse(
    volume_id: &str,
    ctx: &HashMap<String, String>,
    secrets: &HashMap<String, String>,
) -> Result<Volume> {
    let has = |k: &str| ctx.get(k).is_some_and(|v| !v.trim().is_empty());
    let named: Vec<&str> = [
        ("an iSCSI target (iqn)", has("iqn")),
        (
            "an NVMe subsystem (nqn, targetTrAddr)",
            has("nqn") || has("targetTrAddr"),
        ),
        ("an FC target (targetWWNs)", has("targetWWNs")),
    ]
    .into_iter()
    .filter_map(|(what, there)| there.then_some(what))
    .collect();
    match named.as_slice() {
        [a, b, ..] => Err(Error::InvalidArgument(format!(
            "volume {volume_id}: volume attributes name both {a} and {b}"
        ))),
        [w] if w.contains("NVMe") => parse_nvme(volume_id, ctx, secrets).map(Volume::Nvme),
        [w] if w.contains("FC") => parse_fc(volume_id, ctx).map(Volume::Fc),
        _ => parse_iscsi(volume_id, ctx, secrets).map(Volume::Iscsi),
    }
}

/// Reads an FC volume from its attributes.
pub fn parse_fc(volume_id: &str, ctx: &HashMap<String, String>) -> Result<FcVolume> {
    let bad = |key: &str, why: String| {
        Error::InvalidArgument(format!("volume {volume_id}: volume attribute {key}: {why}"))
    };
    let get = |key: &str| ctx.get(key).map(|v| v.trim()).filter(|v| !v.is_empty());
    let list = get("targetWWNs").ok_or_else(|| bad("targetWWNs", "missing".into()))?;
    let names: Vec<String> = if list.starts_with('[') {
        serde_json::from_str(list)
            .map_err(|e| bad("targetWWNs", format!("not a JSON array of strings: {e}")))?
    } else {
        list.split(',').map(str::to_owned).collect()
    };
    let wwpns = names
        .iter()
        .map(|n| n.trim().parse::<lunkit::Wwn>())
        .collect::<lunkit::Result<Vec<_>>>()
        .and_then(|w| lunkit::fc::check_target_ports(&w))
        .map_err(|e| bad("targetWWNs", e.to_string()))?;
    let lun_text = get("lun").ok_or_else(|| bad("lun", "missing".into()))?;
    let lun = lun_number(lun_text)
        .ok_or_else(|| bad("lun", format!("{lun_text:?} is not a LUN number")))?;
    let wwid = match get("wwid") {
        None => None,
        Some(w) => Some(w.parse::<Wwid>().map_err(|e| bad("wwid", e.to_string()))?),
    };
    Ok(FcVolume { wwpns, lun, wwid })
}

/// A LUN number as the attributes give it: decimal, below 2^32 (what Kubernetes' volume
/// sources and the drivers take).
fn lun_number(text: &str) -> Option<u64> {
    text.parse::<u64>().ok().filter(|&l| l < (1 << 32))
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
    match get("targetTrType") {
        None => {}
        Some(t) if t.eq_ignore_ascii_case("tcp") => {}
        Some(t) => {
            return Err(Error::Unimplemented(format!(
                "volume {volume_id}: volume attribute targetTrType: transport {t:?} is not supported (only tcp)"
            )));
        }
    }
    // NVMe/TCP TLS needs a TLS handshake daemon (tlshd) that Debian 12 does not package:
    // refused by name rather than connected in the clear.
    for key in ["tls", "tlsKey"] {
        if get(key).is_some_and(|v| !v.eq_ignore_ascii_case("false")) {
            return Err(Error::Unimplemented(format!(
                "volume {volume_id}: volume attribute {key}: NVMe/TCP TLS is not supported \
                 (it needs a TLS handshake daemon, tlshd, which lunkit does not set up)"
            )));
        }
    }
    let discovery = match get("discoveryAddrs") {
        None => Vec::new(),
        Some(list) => discovery_addrs(list).map_err(|why| bad("discoveryAddrs", why))?,
    };
    // With discovery addresses the first port is optional: the logs list the ports.
    let mut portals = match get("targetTrAddr") {
        Some(addr) => vec![first_port(addr, get("targetTrPort")).map_err(|(k, why)| bad(k, why))?],
        None if !discovery.is_empty() => Vec::new(),
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

/// The first port, `ip:port`, from csi-driver-nvmf's `targetTrAddr` and `targetTrPort`; an
/// error names the key at fault.
fn first_port(
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
fn discovery_addrs(list: &str) -> std::result::Result<Vec<String>, String> {
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

/// `8-4-4-4-12` hex digits.
fn is_uuid(s: &str) -> bool {
    let groups: Vec<&str> = s.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| g.len() == n && g.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Reads an iSCSI volume from its attributes, and its CHAP credentials from `secrets` when
/// `sessionCHAPAuth` is `true`. Every problem is `INVALID_ARGUMENT` naming the volume, the key
/// and what is wrong with it (never a secret's value).
pub fn parse_iscsi(
    volume_id: &str,
    ctx: &HashMap<String, String>,
    secrets: &HashMap<String, String>,
) -> Result<IscsiVolume> {
    let bad = |key: &str, why: String| {
        Error::InvalidArgument(format!("volume {volume_id}: volume attribute {key}: {why}"))
    };
    let required = |key: &str| -> Result<&str> {
        match ctx.get(key).map(|v| v.trim()) {
            Some(v) if !v.is_empty() => Ok(v),
            _ => Err(bad(key, "missing".into())),
        }
    };
    let iqn = required("iqn")?.to_owned();
    lunkit::iscsi::check_target_name(&iqn).map_err(|e| bad("iqn", e.to_string()))?;
    // open-iscsi keeps a target's node records in a directory named after the IQN: `.` and
    // `..` would be the nodes directory itself or its parent.
    if iqn == "." || iqn == ".." {
        return Err(bad(
            "iqn",
            format!(
                "{iqn:?} is not a target name (it would be a path component of iscsiadm's node database)"
            ),
        ));
    }
    let lun_text = required("lun")?;
    let lun = lun_number(lun_text)
        .ok_or_else(|| bad("lun", format!("{lun_text:?} is not a LUN number")))?;
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
    if ctx.contains_key("secret") {
        return Err(bad(
            "secret",
            "credentials in volume attributes are not read (anyone who can read the PV \
             reads them); name a Secret in the PV's nodeStageSecretRef instead"
                .into(),
        ));
    }
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
    let [discovery, discovery_chap, session_chap] = flags;
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
    })
}

/// A name iscsiadm gets as one argument: letters, digits and `._-:`, at most 64 bytes.
fn valid_word(s: &str) -> bool {
    // `.` and `..` pass the character test, and would be path components (an interface's
    // file in iscsiadm's `ifaces/`).
    !s.is_empty()
        && s != "."
        && s != ".."
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-:".contains(&b))
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

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    fn ctx(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    const IQN: &str = "iqn.2003-01.org.linux-iscsi.lunkit:lab";

    #[test]
    fn reads_csi_driver_iscsi_attributes() {
        let v = parse_iscsi(
            "pv-1",
            &ctx(&[
                ("targetPortal", "10.0.0.1"),
                (
                    "portals",
                    r#"["10.0.0.2:3261", "10.0.0.1:3260", "[fd00::1]:3260"]"#,
                ),
                ("iqn", IQN),
                ("lun", "7"),
                ("iscsiInterface", "default"),
                ("discoveryCHAPAuth", "false"),
                ("wwid", "36001405a1b2c3d4e5f60718293a4b5c6"),
            ]),
            &HashMap::new(),
        )
        .unwrap();
        assert_eq!(v.iqn, IQN);
        assert_eq!(v.lun, 7);
        assert_eq!(
            v.portals,
            ["10.0.0.1:3260", "10.0.0.2:3261", "[fd00::1]:3260"],
            "targetPortal first, the default port added, the duplicate dropped"
        );
        assert_eq!(v.iface, None);
        assert!(v.wwid.is_some());
    }

    #[test]
    fn refuses_missing_and_malformed_attributes_naming_the_key() {
        let base = [
            ("targetPortal", "10.0.0.1:3260"),
            ("iqn", IQN),
            ("lun", "1"),
        ];
        for missing in ["targetPortal", "iqn", "lun"] {
            let pairs: Vec<_> = base
                .iter()
                .copied()
                .filter(|(k, _)| *k != missing)
                .collect();
            let e = parse_iscsi("pv-1", &ctx(&pairs), &HashMap::new()).unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument);
            assert_eq!(
                e.to_string(),
                format!("volume pv-1: volume attribute {missing}: missing")
            );
        }
        let cases: &[(&str, &str)] = &[
            ("lun", "-1"),
            ("lun", "4294967296"),
            ("lun", "one"),
            ("iqn", "iqn with space"),
            ("iqn", "."),
            ("iqn", ".."),
            ("iscsiInterface", "."),
            ("iscsiInterface", ".."),
            ("targetPortal", "10.0.0.1:0"),
            ("targetPortal", "10.0.0.1:99999"),
            ("targetPortal", "fd00::1"),
            ("targetPortal", "[fd00::1"),
            ("targetPortal", "10.0.0.1,10.0.0.2"),
            ("portals", "10.0.0.2:3260"),
            ("portals", r#"["10.0.0.2:x"]"#),
            ("iscsiInterface", "eth0 -o delete"),
            ("wwid", "naa.xyz"),
            ("wwid", "a/b"),
            ("sessionCHAPAuth", "yes"),
            ("discoveryCHAPAuth", "True"),
            ("secret", r#"{"node.session.auth.username":"u"}"#),
        ];
        for (key, value) in cases {
            let mut m = ctx(&base);
            m.insert((*key).to_owned(), (*value).to_owned());
            let e = parse_iscsi("pv-1", &m, &HashMap::new()).unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument, "{key}={value}: {e}");
            assert!(
                e.to_string()
                    .starts_with(&format!("volume pv-1: volume attribute {key}: ")),
                "{key}={value}: {e}"
            );
        }
    }

    const PASSWORD: &str = "s3cret-Pa55word";

    fn chap_attrs() -> HashMap<String, String> {
        ctx(&[
            ("targetPortal", "10.0.0.1"),
            ("iqn", IQN),
            ("lun", "0"),
            ("sessionCHAPAuth", "true"),
            ("discoveryCHAPAuth", "true"),
        ])
    }

    fn secrets(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        ctx(pairs)
    }

    #[test]
    fn session_chap_reads_kubernetes_iscsi_chap_secret_keys() {
        let s = secrets(&[
            (CHAP_USERNAME, "node-user"),
            (CHAP_PASSWORD, PASSWORD),
            // Discovery keys are not needed and not read.
            ("discovery.sendtargets.auth.username", "x"),
            ("discovery.sendtargets.auth.password", "-\n"),
        ]);
        let v = parse_iscsi("pv", &chap_attrs(), &s).unwrap();
        let chap = v.chap.expect("CHAP asked for");
        assert_eq!(chap.username, "node-user");
        assert_eq!(chap.password.expose(), PASSWORD);
        assert_eq!(chap.mutual, None);
        assert_eq!(
            chap.settings(),
            [
                ("node.session.auth.authmethod", "CHAP"),
                ("node.session.auth.username", "node-user"),
            ]
        );
        assert_eq!(chap.secrets(), [("node.session.auth.password", PASSWORD)]);
        let dbg = format!("{v:?}", v = chap);
        assert!(!dbg.contains(PASSWORD), "{dbg}");

        let mut s = s;
        s.insert(CHAP_USERNAME_IN.into(), "target-user".into());
        s.insert(CHAP_PASSWORD_IN.into(), "target-s3cret".into());
        s.insert(CHAP_AUTHMETHOD.into(), "CHAP".into());
        let chap = parse_iscsi("pv", &chap_attrs(), &s).unwrap().chap.unwrap();
        let (user_in, password_in) = chap.mutual.clone().expect("mutual CHAP");
        assert_eq!(user_in, "target-user");
        assert_eq!(password_in.expose(), "target-s3cret");
        assert_eq!(chap.settings().len(), 3);
        assert_eq!(
            chap.secrets(),
            [
                ("node.session.auth.password", PASSWORD),
                ("node.session.auth.password_in", "target-s3cret"),
            ]
        );
        let dbg = format!("{chap:?}");
        assert!(
            !dbg.contains("target-s3cret") && !dbg.contains(PASSWORD),
            "{dbg}"
        );
    }

    #[test]
    fn without_session_chap_secrets_are_not_read() {
        let mut m = chap_attrs();
        m.insert("sessionCHAPAuth".into(), "false".into());
        let v = parse_iscsi("pv", &m, &secrets(&[(CHAP_PASSWORD, "-bad\n")])).unwrap();
        assert_eq!(v.chap, None);
        m.remove("sessionCHAPAuth");
        assert_eq!(parse_iscsi("pv", &m, &HashMap::new()).unwrap().chap, None);
    }

    #[test]
    fn bad_chap_secrets_are_refused_naming_the_key_never_the_value() {
        let good = [(CHAP_USERNAME, "node-user"), (CHAP_PASSWORD, PASSWORD)];
        let long = "x".repeat(MAX_CHAP_LEN + 1);
        let at_limit = "y".repeat(MAX_CHAP_LEN);
        let with = |key: &'static str, value: &str| {
            let mut s = secrets(&good);
            s.insert(key.into(), value.into());
            s
        };
        let without = |key: &str| {
            let mut s = secrets(&good);
            s.remove(key);
            s
        };
        let cases: Vec<(HashMap<String, String>, &str, &str)> = vec![
            (without(CHAP_USERNAME), CHAP_USERNAME, "missing"),
            (without(CHAP_PASSWORD), CHAP_PASSWORD, "missing"),
            (with(CHAP_PASSWORD, ""), CHAP_PASSWORD, "is empty"),
            (with(CHAP_USERNAME, ""), CHAP_USERNAME, "is empty"),
            (with(CHAP_PASSWORD, &long), CHAP_PASSWORD, "at most 255"),
            (
                with(CHAP_PASSWORD, "pass\nnode.startup = automatic"),
                CHAP_PASSWORD,
                "control character",
            ),
            (
                with(CHAP_USERNAME, "user\r"),
                CHAP_USERNAME,
                "control character",
            ),
            (
                with(CHAP_PASSWORD, "-o delete"),
                CHAP_PASSWORD,
                "starts with '-'",
            ),
            (
                with(CHAP_USERNAME, "--login"),
                CHAP_USERNAME,
                "starts with '-'",
            ),
            (
                with(CHAP_PASSWORD, " padded "),
                CHAP_PASSWORD,
                "white space",
            ),
            (
                with(CHAP_USERNAME_IN, "target-user"),
                CHAP_PASSWORD_IN,
                "mutual CHAP",
            ),
            (
                with(CHAP_PASSWORD_IN, "target-s3cret"),
                CHAP_USERNAME_IN,
                "mutual CHAP",
            ),
            (
                with(CHAP_PASSWORD_IN, "-x"),
                CHAP_PASSWORD_IN,
                "starts with '-'",
            ),
            (
                with(CHAP_AUTHMETHOD, "None"),
                CHAP_AUTHMETHOD,
                "must be CHAP",
            ),
        ];
        for (s, key, why) in cases {
            let e = parse_iscsi("pv-9", &chap_attrs(), &s).unwrap_err();
            let m = e.to_string();
            assert_eq!(e.code(), Code::InvalidArgument, "{m}");
            assert!(
                m.starts_with(&format!("volume pv-9: secret {key}: ")),
                "{m}"
            );
            assert!(m.contains(why), "{key}: {m}");
            for v in s.values().filter(|v| v.len() > 2) {
                assert!(!m.contains(v.as_str()), "the value is in {m:?}");
            }
        }
        // 255 bytes is the most open-iscsi keeps whole, and is taken.
        let v = parse_iscsi("pv", &chap_attrs(), &with(CHAP_PASSWORD, &at_limit)).unwrap();
        assert_eq!(v.chap.unwrap().password.expose().len(), MAX_CHAP_LEN);
    }

    #[test]
    fn reads_fc_attributes_in_either_list_form() {
        for list in [
            r#"["500a0981891b8dc5", "0x500A0982891B8DC5", "50:0a:09:81:89:1b:8d:c5"]"#,
            "500a0982891b8dc5, 500a0981891b8dc5",
        ] {
            let m = ctx(&[("targetWWNs", list), ("lun", "4")]);
            let Volume::Fc(v) = parse("pv-fc", &m, &HashMap::new()).unwrap() else {
                panic!("not FC: {list}")
            };
            assert_eq!(
                v.wwpns,
                [
                    lunkit::Wwn(0x500a0981891b8dc5),
                    lunkit::Wwn(0x500a0982891b8dc5)
                ],
                "sorted, each once: {list}"
            );
            assert_eq!((v.lun, v.wwid), (4, None));
        }
    }

    #[test]
    fn refuses_bad_fc_attributes_naming_the_key() {
        let base = [("targetWWNs", "500a0981891b8dc5"), ("lun", "1")];
        let cases: &[(&str, &str)] = &[
            ("targetWWNs", "[]"),
            ("targetWWNs", "[500a0981891b8dc5]"),
            ("targetWWNs", "500a0981891b8dc5,"),
            ("targetWWNs", "500a0981891b8dc5/../x"),
            ("targetWWNs", r#"["500a0981891b8dc5ff"]"#),
            ("lun", "-1"),
            ("lun", "4294967296"),
            ("wwid", "naa.xyz"),
        ];
        for (key, value) in cases {
            let mut m = ctx(&base);
            m.insert((*key).to_owned(), (*value).to_owned());
            let e = parse("pv-fc", &m, &HashMap::new()).unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument, "{key}={value}: {e}");
            assert!(
                e.to_string()
                    .starts_with(&format!("volume pv-fc: volume attribute {key}: ")),
                "{key}={value}: {e}"
            );
        }
        let mut m = ctx(&base);
        m.remove("lun");
        assert!(
            parse("pv-fc", &m, &HashMap::new())
                .unwrap_err()
                .to_string()
                .ends_with("lun: missing")
        );
        // An FC target and an iSCSI one (or an NVMe subsystem) at once is no volume.
        for (k, v) in [("iqn", IQN), ("nqn", "nqn.2014-08.org.lunkit:lab")] {
            let mut m = ctx(&base);
            m.insert(k.into(), v.into());
            let e = parse("pv-fc", &m, &HashMap::new()).unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument, "{e}");
            assert!(e.to_string().contains("name both"), "{e}");
        }
    }

    #[test]
    fn reads_csi_driver_nvmf_attributes() {
        let m = ctx(&[
            ("targetTrAddr", "127.0.0.1"),
            ("targetTrPort", "4420"),
            ("targetTrType", "tcp"),
            ("nqn", "nqn.2014-08.org.lunkit:lab"),
            ("deviceUUID", "0A1B2C3D-5e7a-4000-8000-000000000001"),
            ("portals", r#"["127.0.0.2:4420", "127.0.0.1:4420"]"#),
        ]);
        let Volume::Nvme(v) = parse("pv-n", &m, &HashMap::new()).unwrap() else {
            panic!("not NVMe")
        };
        assert_eq!(v.nqn.to_string(), "nqn.2014-08.org.lunkit:lab");
        assert_eq!(v.portals, ["127.0.0.1:4420", "127.0.0.2:4420"]);
        assert_eq!(v.nsid, None);
        assert_eq!(
            v.device_uuid.as_deref(),
            Some("0a1b2c3d-5e7a-4000-8000-000000000001")
        );
        let mut with_nsid = m.clone();
        with_nsid.remove("deviceUUID");
        with_nsid.insert("nsid".into(), "3".into());
        with_nsid.remove("targetTrPort");
        let Volume::Nvme(v) = parse("pv-n", &with_nsid, &HashMap::new()).unwrap() else {
            panic!("not NVMe")
        };
        assert_eq!((v.nsid, v.portals[0].as_str()), (Some(3), "127.0.0.1:4420"));
    }

    #[test]
    fn refuses_bad_nvme_attributes() {
        let base = [
            ("targetTrAddr", "127.0.0.1"),
            ("nqn", "nqn.2014-08.org.lunkit:lab"),
            ("nsid", "1"),
        ];
        let cases: &[(&str, &str, Code)] = &[
            ("targetTrAddr", "san.example.invalid", Code::InvalidArgument),
            ("targetTrPort", "0", Code::InvalidArgument),
            ("targetTrType", "rdma", Code::Unimplemented),
            ("tls", "true", Code::Unimplemented),
            ("tlsKey", "NVMeTLSkey-1:01:abc:", Code::Unimplemented),
            ("nqn", "not an nqn", Code::InvalidArgument),
            ("nsid", "0", Code::InvalidArgument),
            ("deviceUUID", "1234", Code::InvalidArgument),
            ("portals", r#"["127.0.0.2"]"#, Code::InvalidArgument),
            ("iqn", IQN, Code::InvalidArgument),
        ];
        for (key, value, code) in cases {
            let mut m = ctx(&base);
            m.insert((*key).to_owned(), (*value).to_owned());
            let e = parse("pv-n", &m, &HashMap::new()).unwrap_err();
            assert_eq!(e.code(), *code, "{key}={value}: {e}");
            assert!(
                e.to_string().starts_with("volume pv-n: volume attribute"),
                "{e}"
            );
        }
        let mut m = ctx(&base);
        m.remove("nsid");
        let e = parse("pv-n", &m, &HashMap::new()).unwrap_err();
        assert!(e.to_string().contains("deviceID: missing"), "{e}");
    }

    #[test]
    fn reads_discovery_addresses_with_or_without_a_first_port() {
        let nqn = ("nqn", "nqn.2014-08.org.lunkit:lab");
        let nvme = |attrs: &[(&str, &str)]| match parse("pv-d", &ctx(attrs), &HashMap::new()) {
            Ok(Volume::Nvme(v)) => Ok(v),
            Ok(other) => panic!("not NVMe: {other:?}"),
            Err(e) => Err(e),
        };
        // Alone: the logs list the ports. Port 8009 unless given, each address once, in
        // either list form, IPv6 in brackets.
        for list in [
            r#"["192.0.2.10", "192.0.2.11:4420", "192.0.2.10:8009", "[fd00::1]:8009"]"#,
            "192.0.2.10, 192.0.2.11:4420,192.0.2.10:8009,[fd00::1]:8009",
            "192.0.2.10,192.0.2.11:4420,fd00::1",
        ] {
            let v = nvme(&[nqn, ("nsid", "1"), ("discoveryAddrs", list)]).unwrap();
            assert_eq!(
                v.discovery,
                ["192.0.2.10:8009", "192.0.2.11:4420", "[fd00::1]:8009"],
                "{list}"
            );
            assert!(v.portals.is_empty(), "{v:?}");
        }
        // With csi-driver-nvmf's first port: both are connected.
        let v = nvme(&[
            nqn,
            ("nsid", "1"),
            ("targetTrAddr", "192.0.2.20"),
            ("discoveryAddrs", "[fd00::1]"),
        ])
        .unwrap();
        assert_eq!(
            (v.portals, v.discovery),
            (
                vec!["192.0.2.20:4420".to_owned()],
                vec!["[fd00::1]:8009".to_owned()]
            )
        );
        // Neither a port nor a discovery address: nothing to connect.
        let e = nvme(&[nqn, ("nsid", "1")]).unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{e}");
        assert!(e.to_string().contains("targetTrAddr: missing"), "{e}");
        for bad in [
            "array.example",
            "192.0.2.10:0",
            "192.0.2.10,,192.0.2.11",
            r#"["192.0.2.10", 8009]"#,
            "[]",
            ",",
        ] {
            let e = nvme(&[nqn, ("nsid", "1"), ("discoveryAddrs", bad)]).unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument, "{bad}: {e}");
            assert!(
                e.to_string()
                    .starts_with("volume pv-d: volume attribute discoveryAddrs:"),
                "{e}"
            );
        }
    }

    /// csi-driver-nvmf's example PVs (examples/kubernetes/*/pv.yaml), with the forms their
    /// comments offer.
    #[test]
    fn reads_csi_driver_nvmf_example_pvs_device_ids_and_host_identity() {
        let base = [
            ("targetTrAddr", "192.168.122.18"),
            ("targetTrPort", "49153"),
            ("targetTrType", "tcp"),
            ("nqn", "nqn.2022-08.org.test-nvmf.example"),
        ];
        let with = |extra: &[(&str, &str)]| {
            let mut m = ctx(&base);
            m.extend(ctx(extra));
            match parse("pv", &m, &HashMap::new()) {
                Ok(Volume::Nvme(v)) => Ok(v),
                Ok(other) => panic!("not NVMe: {other:?}"),
                Err(e) => Err(e),
            }
        };
        let uuid = "58668891-c3e4-45d0-b90e-824525c16080";
        for attrs in [
            &[("deviceID", "uuid.58668891-c3e4-45d0-b90e-824525c16080")][..],
            &[("deviceUUID", uuid)],
            &[
                ("deviceID", "uuid.58668891-C3E4-45d0-b90e-824525c16080"),
                ("deviceUUID", uuid),
            ],
        ] {
            let v = with(attrs).unwrap();
            assert_eq!(v.device_uuid.as_deref(), Some(uuid), "{attrs:?}");
            assert_eq!((v.device_wwid, v.nsid), (None, None));
            assert_eq!(v.portals, ["192.168.122.18:49153"]);
        }
        // An NGUID and an EUI-64 both show as eui.…; the kernel's own nvme.… form too.
        for (attrs, wwid) in [
            (
                &[("deviceEUI", "00000000000000000042AA42AA42AA42")][..],
                "eui.00000000000000000042aa42aa42aa42",
            ),
            (
                &[("deviceID", "eui.00000000000000000042aa42aa42aa42")],
                "eui.00000000000000000042aa42aa42aa42",
            ),
            (
                &[("deviceID", "eui.0025384c41a0b2c1")],
                "eui.0025384c41a0b2c1",
            ),
            (
                &[("deviceID", "nvme.1b36-6c756e6b6974-51454d55-00000001")],
                "nvme.1b36-6c756e6b6974-51454d55-00000001",
            ),
        ] {
            let v = with(attrs).unwrap();
            assert_eq!(v.device_wwid.as_deref(), Some(wwid), "{attrs:?}");
            assert_eq!(v.device_uuid, None);
        }
        // udev's model-and-serial names, a malformed id, and two that disagree are refused,
        // naming the key.
        for (attrs, key) in [
            (
                &[("deviceID", "INTEL_SSDPF2KX038T9N_PHAB2261050P3P9EGN")][..],
                "deviceID",
            ),
            (
                &[("deviceID", "Pure_Storage_FlashArray_AA00000000000AAA_42")],
                "deviceID",
            ),
            (&[("deviceID", "eui.12345")], "deviceID"),
            (&[("deviceEUI", "xyz")], "deviceEUI"),
            (
                &[
                    ("deviceID", "uuid.58668891-c3e4-45d0-b90e-824525c16080"),
                    ("deviceEUI", "0025384c41a0b2c1"),
                ],
                "deviceEUI",
            ),
            (&[("nsid", "1"), ("hostNqn", "not an nqn")], "hostNqn"),
            (&[("nsid", "1"), ("hostId", "1234")], "hostId"),
        ] {
            let e = with(attrs).unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument, "{attrs:?}: {e}");
            assert!(
                e.to_string()
                    .starts_with(&format!("volume pv: volume attribute {key}: ")),
                "{attrs:?}: {e}"
            );
        }
        let v = with(&[
            ("deviceUUID", uuid),
            (
                "hostNqn",
                "nqn.2014-08.org.nvmexpress:uuid:0f8fad5b-d9cb-469f-a165-70867728950e",
            ),
            ("hostId", "0F8FAD5B-D9CB-469F-A165-70867728950E"),
        ])
        .unwrap();
        assert_eq!(
            v.host_nqn.map(|n| n.to_string()).as_deref(),
            Some("nqn.2014-08.org.nvmexpress:uuid:0f8fad5b-d9cb-469f-a165-70867728950e")
        );
        assert_eq!(
            v.host_id.map(|i| i.to_string()).as_deref(),
            Some("0f8fad5b-d9cb-469f-a165-70867728950e")
        );
    }

    /// csi-driver-iscsi's example PV (examples/pv.yaml): SendTargets discovery, discovery
    /// CHAP from the stage secrets.
    #[test]
    fn reads_csi_driver_iscsi_example_pv_with_discovery() {
        let m = ctx(&[
            ("targetPortal", "192.168.0.107:3260"),
            ("portals", "[]"),
            ("iqn", "iqn.2015-06.com.example.test:target1"),
            ("lun", "0"),
            ("iscsiInterface", "default"),
            ("discovery", "true"),
            ("discoveryCHAPAuth", "true"),
            ("sessionCHAPAuth", "false"),
            ("initiatorName", "iqn.2016-04.com.example:node-1"),
        ]);
        let s = secrets(&[
            ("discovery.sendtargets.auth.username", "disc-user"),
            ("discovery.sendtargets.auth.password", PASSWORD),
        ]);
        let v = parse_iscsi("pv", &m, &s).unwrap();
        assert!(v.discovery);
        assert_eq!(v.portals, ["192.168.0.107:3260"]);
        assert_eq!(v.chap, None);
        assert_eq!(
            v.initiator_name.as_deref(),
            Some("iqn.2016-04.com.example:node-1")
        );
        let c = v.discovery_chap.expect("discovery CHAP");
        assert_eq!(c.scope, ChapScope::Discovery);
        assert_eq!(
            c.settings(),
            [
                ("discovery.sendtargets.auth.authmethod", "CHAP"),
                ("discovery.sendtargets.auth.username", "disc-user"),
            ]
        );
        assert_eq!(
            c.secrets(),
            [("discovery.sendtargets.auth.password", PASSWORD)]
        );
        // Without its secrets, the key is named; session CHAP's keys are not taken for it.
        let e = parse_iscsi(
            "pv",
            &m,
            &secrets(&[(CHAP_USERNAME, "u"), (CHAP_PASSWORD, PASSWORD)]),
        )
        .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert!(
            e.to_string()
                .starts_with("volume pv: secret discovery.sendtargets.auth.username: missing")
                && e.to_string().contains("discoveryCHAPAuth is true"),
            "{e}"
        );
        // discoveryCHAPAuth without discovery opens no discovery session: nothing is read.
        let mut m2 = m.clone();
        m2.insert("discovery".into(), "false".into());
        let v = parse_iscsi("pv", &m2, &HashMap::new()).unwrap();
        assert!(!v.discovery && v.discovery_chap.is_none());
        for (k, bad) in [("discovery", "yes"), ("initiatorName", "iqn with space")] {
            let mut m3 = m.clone();
            m3.insert(k.into(), bad.into());
            let e = parse_iscsi("pv", &m3, &s).unwrap_err();
            assert!(
                e.to_string()
                    .starts_with(&format!("volume pv: volume attribute {k}: ")),
                "{e}"
            );
        }
    }

    #[test]
    fn portals_take_the_form_sysfs_shows() {
        assert_eq!(portal("127.0.0.1").unwrap(), "127.0.0.1:3260");
        assert_eq!(portal(" 127.0.0.2:3261 ").unwrap(), "127.0.0.2:3261");
        assert_eq!(portal("[::1]").unwrap(), "[::1]:3260");
        assert_eq!(portal("[::1]:860").unwrap(), "[::1]:860");
        assert_eq!(
            portal("san.example.invalid").unwrap(),
            "san.example.invalid:3260"
        );
        assert!(portal("").is_err());
        assert!(portal("[::1]x").is_err());
        assert!(portal("[nothex]:3260").is_err());
    }

    /// Printed by `nvme gen-dhchap-key --hmac=1` and `--hmac=2` (nvme-cli 2.3).
    const HOST_KEY: &str = "DHHC-1:01:09GFUL+L04EJzFZN2elQGibBeBw1RuITyd7jlFaOZAJwwOLq:";
    const CTRL_KEY: &str =
        "DHHC-1:02:qsB+HoiBIHLENgMh7Azb0yY7CSO1/fBCrqiqru1/4OXqsdkcG+UeondUvX166gT7al+LeQ==:";

    fn nvme_attrs() -> HashMap<String, String> {
        ctx(&[
            ("targetTrAddr", "10.0.0.1"),
            ("nqn", "nqn.2026-11.invalid.lunkit:auth"),
            ("nsid", "1"),
        ])
    }

    #[test]
    fn dhchap_secrets_come_from_the_stage_secrets_checked() {
        let none = parse_nvme("pv-n", &nvme_attrs(), &HashMap::new()).unwrap();
        assert_eq!(none.auth, NvmeAuth::default());
        let both = ctx(&[("dhchapSecret", HOST_KEY), ("dhchapCtrlSecret", CTRL_KEY)]);
        let v = parse_nvme("pv-n", &nvme_attrs(), &both).unwrap();
        assert_eq!(v.auth.secret.as_ref().map(|s| s.expose()), Some(HOST_KEY));
        assert_eq!(
            v.auth.ctrl_secret.as_ref().map(|s| s.expose()),
            Some(CTRL_KEY)
        );
        // Through `parse`, as NodeStageVolume reads them.
        let Volume::Nvme(v) = parse("pv-n", &nvme_attrs(), &both).unwrap() else {
            panic!("not NVMe");
        };
        assert!(v.auth.secret.is_some() && v.auth.ctrl_secret.is_some());
    }

    #[test]
    fn bad_or_misplaced_dhchap_secrets_are_refused_naming_the_key_not_the_value() {
        // One character of the key changed: the CRC no longer matches.
        let typo = HOST_KEY.replacen("09GF", "09GG", 1);
        type Case<'a> = (HashMap<String, String>, HashMap<String, String>, &'a str);
        let cases: Vec<Case> = vec![
            (
                nvme_attrs(),
                ctx(&[("dhchapSecret", &typo)]),
                "stage secret dhchapSecret",
            ),
            (
                nvme_attrs(),
                ctx(&[("dhchapSecret", "DHHC-1:01:short:")]),
                "stage secret dhchapSecret",
            ),
            (
                nvme_attrs(),
                ctx(&[("dhchapCtrlSecret", CTRL_KEY)]),
                "given without dhchapSecret",
            ),
            (
                {
                    let mut a = nvme_attrs();
                    a.insert("dhchapSecret".into(), HOST_KEY.into());
                    a
                },
                HashMap::new(),
                "volume attribute dhchapSecret: a secret is not taken",
            ),
        ];
        for (attrs, secrets, says) in cases {
            let e = parse_nvme("pv-n", &attrs, &secrets).unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument, "{e}");
            let text = e.to_string();
            assert!(
                text.starts_with("volume pv-n: ") && text.contains(says),
                "{text}"
            );
            for secret in [HOST_KEY, CTRL_KEY, typo.as_str()] {
                let key_part = &secret[10..30];
                assert!(
                    !text.contains(key_part),
                    "the error shows the secret: {text}"
                );
            }
        }
    }
}

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
//! iSCSI and FC volumes may ask to be fenced ([`Fencing`], [`crate::fence`]):
//!
//! | key | meaning |
//! |---|---|
//! | `fencing` | `none` (the default) or `scsi-pr`: SCSI-3 persistent reservations, this node's key registered on every path and the volume reserved (*Write Exclusive, Registrants Only* for a single-node access mode, *Write Exclusive, All Registrants* for a multi-node one); refused on NVMe volumes |
//! | `fencingPreempt` | `always` (the default): a stage of a single-node volume preempts and aborts another node's key holding the reservation; `never`: it is refused instead (FAILED_PRECONDITION naming the key) |
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

mod fc;
mod fencing;
mod iscsi;
mod nvme;
#[cfg(test)]
mod tests;

pub use fc::*;
pub use fencing::*;
pub use iscsi::*;
pub use nvme::*;

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

/// A LUN number as the attributes give it: decimal, below 2^32 (what Kubernetes' volume
/// sources and the drivers take).
/// `INVALID_ARGUMENT` for volume attribute `key` of `volume_id`: what is wrong with it.
fn bad_attr(volume_id: &str, key: &str, why: String) -> Error {
    Error::InvalidArgument(format!("volume {volume_id}: volume attribute {key}: {why}"))
}

/// Attribute `key`, trimmed; missing or blank is [`bad_attr`]'s "missing".
fn required_attr<'a>(
    volume_id: &str,
    ctx: &'a HashMap<String, String>,
    key: &str,
) -> Result<&'a str> {
    match ctx.get(key).map(|v| v.trim()) {
        Some(v) if !v.is_empty() => Ok(v),
        _ => Err(bad_attr(volume_id, key, "missing".into())),
    }
}

fn lun_number(text: &str) -> Option<u64> {
    text.parse::<u64>().ok().filter(|&l| l < (1 << 32))
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

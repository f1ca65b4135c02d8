//! NVMe over Fabrics volumes: how the attributes name a namespace, and the stage's connect
//! and the unstage's disconnect through lunkit (no `nvme` command). Imports no other
//! transport's module.

use lunkit::ops::NamespaceSelector;

mod device;
mod stage;

pub(crate) use device::{condition, device_of, presence};
pub(crate) use stage::target_of;
#[cfg(test)]
mod tests;

/// The namespace the attributes name by what it is rather than by its id, as lunkit selects
/// it: the UUID (`deviceUUID`, `deviceID: uuid.…`); an NGUID or EUI-64 (`deviceEUI`,
/// `deviceID: eui.…`, 32 or 16 hex digits), matched against the namespace's own `nguid` or
/// `eui` whichever form its `wwid` took (a namespace that also reports a UUID shows
/// `uuid.…` there); or `nvme.…`, the kernel's name for a namespace that reports none of
/// them, which is the subsystem's vendor, serial and model and the namespace id, so it
/// selects that id ([`names_namespace`] checks the rest). `None` when the attributes name
/// none of them (or the form is not one of these).
pub(crate) fn identity_selector(
    uuid: Option<&str>,
    wwid: Option<&str>,
) -> Option<NamespaceSelector> {
    if let Some(u) = uuid.or_else(|| wwid.and_then(|w| w.strip_prefix("uuid."))) {
        return u.parse().ok().map(NamespaceSelector::Uuid);
    }
    let wwid = wwid?;
    if let Some(nsid) = wwid.strip_prefix("nvme.") {
        // `nvme.%04x-%*phN-%*phN-%08x`: the id is the last group.
        let (_, nsid) = nsid.rsplit_once('-')?;
        return (nsid.len() == 8)
            .then(|| u32::from_str_radix(nsid, 16).ok())
            .flatten()
            .map(NamespaceSelector::Id);
    }
    wwid.parse::<lunkit::id::Nguid>()
        .map(NamespaceSelector::Nguid)
        .or_else(|_| {
            wwid.parse::<lunkit::id::Eui64>()
                .map(NamespaceSelector::Eui64)
        })
        .ok()
}

/// Whether `ns` is the namespace the attributes named by UUID or kernel identity (either
/// may be absent: then nothing is checked): lunkit's selector of [`identity_selector`], and
/// for an `nvme.…` identity the whole of it, not only the id it carries.
pub(crate) fn names_namespace(
    uuid: Option<&str>,
    wwid: Option<&str>,
    ns: &lunkit::NvmeNamespace,
) -> bool {
    if uuid.is_none() && wwid.is_none() {
        return true;
    }
    let synthesized = wwid.filter(|w| w.starts_with("nvme."));
    identity_selector(uuid, wwid).is_some_and(|s| s.matches(ns))
        && synthesized.is_none_or(|w| {
            ns.wwid
                .as_deref()
                .is_some_and(|k| k.eq_ignore_ascii_case(w))
        })
}

//! NVMe over Fabrics volumes: how the attributes name a namespace, and the stage's connect
//! and the unstage's disconnect through lunkit (no `nvme` command). Imports no other
//! transport's module.

use lunkit::ops::NamespaceSelector;
use lunkit::ops::volume::NamespaceCheck;

mod device;
mod stage;

pub(crate) use device::{condition, device_of, presence};
pub(crate) use stage::target_of;
#[cfg(test)]
mod tests;

/// The namespace the attributes name by what it is rather than by its id, as lunkit selects
/// it: the UUID when they give one (`deviceUUID`), else the kernel WWID they give
/// (`deviceID`, `deviceEUI`: `uuid.…`, `eui.…`, or `nvme.…`, which selects only the id it
/// ends with, so [`named_check`] checks the rest), read as
/// [`NamespaceSelector::from_kernel_wwid`] reads it. `None` when the attributes name none of
/// them (or the form is not one of these).
pub(crate) fn named_selector(uuid: Option<&str>, wwid: Option<&str>) -> Option<NamespaceSelector> {
    match uuid {
        Some(u) => u.parse().ok().map(NamespaceSelector::Uuid),
        None => wwid.and_then(NamespaceSelector::from_kernel_wwid),
    }
}

/// What a namespace must show, beyond the selector it is looked up by, to be the volume: the
/// identity the attributes named ([`named_selector`]; nothing when they named none), the
/// whole of an `nvme.…` identity (its selector is only the id), and the WWID the stage saw
/// (`seen`). `None` when the attributes name an identity lunkit cannot select by: then no
/// namespace is the volume.
pub(crate) fn named_check(
    uuid: Option<&str>,
    wwid: Option<&str>,
    seen: Option<&str>,
) -> Option<NamespaceCheck> {
    let mut check = NamespaceCheck::default();
    if uuid.is_some() || wwid.is_some() {
        check.also.push(named_selector(uuid, wwid)?);
    }
    check
        .wwids
        .extend(wwid.filter(|w| w.starts_with("nvme.")).map(str::to_owned));
    check.wwids.extend(seen.map(str::to_owned));
    Some(check)
}

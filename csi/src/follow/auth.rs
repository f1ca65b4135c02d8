//! The DH-HMAC-CHAP secrets a follower connects a volume's new paths with.
//!
//! NodeStageVolume hands the secrets to the kernel (`/dev/nvme-fabrics`) and nowhere else:
//! the stage record says only which ones the volume was staged with ([`Dhchap`]). The kernel
//! keeps them with each controller it connected with them, in the controller's
//! `dhchap_secret` and `dhchap_ctrl_secret` sysfs attributes (the kernel shows them there
//! whatever the plugin does; `S_IRUGO` in the kernel sources read), so the followers take
//! them from there: after a stage and after a plugin restart alike, with no secret written to
//! disk by the plugin. A follower's paths are only of subsystems that have a controller as
//! the volume's host already (the library connects no other), so there is always one to read
//! them from when there is a path to connect.

use std::cmp::Ordering;
use std::fmt;

use lunkit::Root;
use lunkit::id::Nqn;
use lunkit::nvme::dhchap::Secret;
use lunkit::nvme::sysfs::CtrlState;

use crate::state::Dhchap;

/// A volume's DH-HMAC-CHAP secrets: never shown (its `Debug` says only which are there),
/// ordered by their text so that followers can be keyed by them, in memory only.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Auth {
    /// The host's secret (`dhchapSecret`).
    pub secret: Option<Secret>,
    /// The controller's secret (`dhchapCtrlSecret`).
    pub ctrl_secret: Option<Secret>,
}

impl Auth {
    /// Which secrets these are.
    pub fn dhchap(&self) -> Dhchap {
        Dhchap::of(self.secret.is_some(), self.ctrl_secret.is_some())
    }

    /// Whether these secrets are all a volume staged with `wanted` gave: a volume staged
    /// with a controller secret is never followed without one.
    pub fn satisfies(&self, wanted: Dhchap) -> bool {
        match wanted {
            Dhchap::None => true,
            Dhchap::Host => self.secret.is_some(),
            Dhchap::Bidirectional => self.secret.is_some() && self.ctrl_secret.is_some(),
        }
    }

    fn texts(&self) -> (Option<&str>, Option<&str>) {
        (
            self.secret.as_ref().map(Secret::expose),
            self.ctrl_secret.as_ref().map(Secret::expose),
        )
    }
}

impl Ord for Auth {
    fn cmp(&self, other: &Auth) -> Ordering {
        self.texts().cmp(&other.texts())
    }
}

impl PartialOrd for Auth {
    fn partial_cmp(&self, other: &Auth) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Debug for Auth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Auth")
            .field("secret", &self.secret.is_some())
            .field("ctrl_secret", &self.ctrl_secret.is_some())
            .finish()
    }
}

/// The secrets the kernel holds for subsystem `nqn`'s controllers as host `host_nqn`: those
/// of a live one first, else of any; none when no controller is there (nothing for a
/// follower to connect then). An error names the controller, never what it read.
pub fn from_kernel(root: &Root, nqn: &Nqn, host_nqn: &str) -> Result<Auth, String> {
    let mut ctrls: Vec<_> = lunkit::nvme::controllers_of(root, nqn)
        .map_err(|e| format!("the controllers of {nqn}: {e}"))?
        .into_iter()
        .filter(|c| c.hostnqn.as_deref() == Some(host_nqn))
        .collect();
    ctrls.sort_by_key(|c| c.parsed_state != Some(CtrlState::Live));
    let Some(c) = ctrls.first() else {
        return Ok(Auth::default());
    };
    let read = |attr: &str| -> Result<Option<Secret>, String> {
        let path = root.sys(format!("class/nvme/{}/{attr}", c.name));
        match std::fs::read_to_string(&path) {
            // A kernel without in-band authentication has no such attribute.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(format!("{}: {e}", path.display())),
            Ok(t) if t.trim() == "none" || t.trim().is_empty() => Ok(None),
            Ok(t) => t.trim().parse().map(Some).map_err(|_| {
                format!(
                    "{}: not a DH-HMAC-CHAP secret in the DHHC-1 form",
                    path.display()
                )
            }),
        }
    };
    Ok(Auth {
        secret: read("dhchap_secret")?,
        ctrl_secret: read("dhchap_ctrl_secret")?,
    })
}

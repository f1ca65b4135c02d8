//! The Identity service: the plugin's name and version, its capabilities, and readiness.

use std::time::Duration;

use tonic::{Request, Response, Status};

use crate::probe::Checks;
use crate::proto::identity_server::Identity;
use crate::proto::plugin_capability::{Service, Type, VolumeExpansion, service, volume_expansion};
use crate::proto::*;

/// The plugin's default name. CSI wants domain notation; `.invalid` is reserved (RFC 2606), so
/// this name can never belong to someone else. Override it with `--driver-name`: it must match
/// the `CSIDriver` object's name.
pub const DEFAULT_NAME: &str = "csi.lunkit.invalid";

/// The Identity service.
#[derive(Debug, Clone)]
pub struct IdentityService {
    name: String,
    accessibility_constraints: bool,
    checks: Option<Checks>,
}

impl IdentityService {
    /// Answers with `name`.
    pub fn new(name: impl Into<String>) -> IdentityService {
        IdentityService {
            name: name.into(),
            accessibility_constraints: false,
            checks: None,
        }
    }

    /// Probe runs `checks` ([`crate::probe`]) and answers `FAILED_PRECONDITION` naming what
    /// is missing; without them it answers ready whatever the node's state.
    pub fn checks(mut self, checks: Checks) -> IdentityService {
        self.checks = Some(checks);
        self
    }

    /// Offers `VOLUME_ACCESSIBILITY_CONSTRAINTS` when `on`: the CSI spec says a plugin whose
    /// NodeGetInfo returns `accessible_topology` MUST set it, so it goes with a non-empty
    /// [`Config::topology`](crate::Config::topology).
    pub fn accessibility_constraints(mut self, on: bool) -> IdentityService {
        self.accessibility_constraints = on;
        self
    }
}

/// How long Probe's checks may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Whether `name` is a CSI plugin name: at most 63 characters of letters, digits, `-` and `.`,
/// starting and ending with a letter or digit.
pub fn valid_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || *c == b'-' || *c == b'.')
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
}

#[tonic::async_trait]
impl Identity for IdentityService {
    async fn get_plugin_info(
        &self,
        _: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        Ok(Response::new(GetPluginInfoResponse {
            name: self.name.clone(),
            vendor_version: env!("CARGO_PKG_VERSION").to_owned(),
            manifest: Default::default(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        // No controller service: volumes are statically provisioned. Online expansion: the
        // node grows a mounted volume.
        let mut capabilities = vec![PluginCapability {
            r#type: Some(Type::VolumeExpansion(VolumeExpansion {
                r#type: volume_expansion::Type::Online as i32,
            })),
        }];
        // The node reports where it is (`--topology`): the CO must match it against the
        // volumes' topology.
        if self.accessibility_constraints {
            capabilities.push(PluginCapability {
                r#type: Some(Type::Service(Service {
                    r#type: service::Type::VolumeAccessibilityConstraints as i32,
                })),
            });
        }
        Ok(Response::new(GetPluginCapabilitiesResponse {
            capabilities,
        }))
    }

    async fn probe(&self, _: Request<ProbeRequest>) -> Result<Response<ProbeResponse>, Status> {
        if let Some(checks) = self.checks.clone() {
            // The checks block (a connect, a file written); a hung one must not hang the
            // probe: livenessprobe's own timeout is 3 s in deploy/.
            let run = tokio::task::spawn_blocking(move || checks.missing());
            let missing = match tokio::time::timeout(PROBE_TIMEOUT, run).await {
                Ok(Ok(m)) => m,
                Ok(Err(e)) => return Err(Status::internal(format!("the probe failed: {e}"))),
                Err(_) => vec![format!(
                    "the node's checks did not end within {}s",
                    PROBE_TIMEOUT.as_secs()
                )],
            };
            if !missing.is_empty() {
                return Err(Status::failed_precondition(format!(
                    "not healthy: {}",
                    missing.join("; ")
                )));
            }
        }
        Ok(Response::new(ProbeResponse {
            ready: Some(BoolValue { value: true }),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plugin_names_follow_the_spec() {
        assert!(valid_name(DEFAULT_NAME));
        assert!(valid_name("a"));
        assert!(!valid_name(""));
        assert!(!valid_name("-a"));
        assert!(!valid_name("a."));
        assert!(!valid_name("a_b"));
        assert!(!valid_name(&"a".repeat(64)));
    }
}

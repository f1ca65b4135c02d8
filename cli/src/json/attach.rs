//! An NVMe `lunkit attach --json`: what each discovery service listed, each portal's
//! connect, then the namespace's devices. (A SCSI attach prints [`super::scan::Scan`].)

use std::time::Duration;

use lunkit::Wwid;
use lunkit::ops::{DiscoveryService, NvmeAttachment, PortalConnect};
use serde::Serialize;

use super::scan::Udev;
use super::{SCHEMA_VERSION, micros};

#[derive(Debug, Serialize)]
pub struct NvmeAttach {
    pub version: u32,
    /// The namespace's WWID as the kernel gives it (`uuid.…`, `eui.…`, `nvme.…`).
    pub wwid: Option<String>,
    pub devices: Vec<Device>,
    /// The controllers through which the namespace came (`nvme0`).
    pub controllers: Vec<String>,
    /// Every portal asked for, then every path discovery found.
    pub portals: Vec<Portal>,
    /// Every discovery service asked (`--discover`, and those their logs refer to).
    pub discovery: Vec<Service>,
    pub elapsed_us: u64,
}

#[derive(Debug, Serialize)]
pub struct Device {
    pub name: String,
    pub path: String,
    pub major: u32,
    pub minor: u32,
    /// With `--wait-udev` only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub udev: Option<Udev>,
}

#[derive(Debug, Serialize)]
pub struct Portal {
    /// `addr:port`.
    pub portal: String,
    /// Whether a discovery log listed it (not `--portal`).
    pub discovered: bool,
    /// `connected`, `existing` or `failed`.
    pub outcome: &'static str,
    /// The controller made or found.
    pub controller: Option<String>,
    /// Why it failed.
    pub detail: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct Service {
    /// `addr:port`.
    pub service: String,
    /// The `--discover` address through which it was reached (itself, or the one whose log
    /// referred to it).
    pub via: String,
    /// `answered` or `failed`.
    pub outcome: &'static str,
    /// The subsystem's paths its log listed (`addr:port`), when it answered.
    pub paths: Vec<String>,
    /// Why it failed.
    pub detail: Option<String>,
}

impl NvmeAttach {
    /// The document of an NVMe attach that took `elapsed`; `udev`, with `--wait-udev`, has
    /// one entry per device.
    pub fn new(
        wwid: Option<&Wwid>,
        nvme: &NvmeAttachment,
        udev: Option<Vec<Udev>>,
        elapsed: Duration,
    ) -> Self {
        let mut udev = udev.map(Vec::into_iter);
        NvmeAttach {
            version: SCHEMA_VERSION,
            wwid: wwid.map(ToString::to_string),
            devices: nvme
                .devices
                .iter()
                .map(|d| Device {
                    name: d.name.clone(),
                    path: d.path.display().to_string(),
                    major: d.dev.major,
                    minor: d.dev.minor,
                    udev: udev.as_mut().and_then(Iterator::next),
                })
                .collect(),
            controllers: nvme.controllers.clone(),
            portals: nvme.portals.iter().map(Portal::new).collect(),
            discovery: nvme.discovery.iter().map(Service::new).collect(),
            elapsed_us: micros(elapsed),
        }
    }
}

impl Portal {
    fn new(p: &PortalConnect) -> Self {
        let (outcome, controller, detail) = match &p.result {
            Ok(c) if c.existing => ("existing", Some(c.controller.clone()), None),
            Ok(c) => ("connected", Some(c.controller.clone()), None),
            Err(e) => ("failed", None, Some(e.clone())),
        };
        Portal {
            portal: p.portal.clone(),
            discovered: p.discovered,
            outcome,
            controller,
            detail,
        }
    }
}

impl Service {
    fn new(d: &DiscoveryService) -> Self {
        let (outcome, paths, detail) = match &d.result {
            Ok(paths) => ("answered", paths.clone(), None),
            Err(e) => ("failed", Vec::new(), Some(e.clone())),
        };
        Service {
            service: d.service.clone(),
            via: d.via.clone(),
            outcome,
            paths,
            detail,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lunkit::DevNum;
    use lunkit::block::BlockNode;
    use lunkit::nvme::Connected;
    use serde_json::json;

    fn connected(controller: &str, existing: bool) -> Result<Connected, String> {
        Ok(Connected {
            controller: controller.into(),
            cntlid: 1,
            existing,
            state: Some("live".into()),
            elapsed: Duration::from_millis(3),
        })
    }

    #[test]
    fn an_nvme_attach_names_each_portals_outcome_and_what_each_discovery_service_listed() {
        let nvme = NvmeAttachment {
            nsid: Some(1),
            devices: vec![BlockNode {
                name: "nvme0n1".into(),
                dev: DevNum {
                    major: 259,
                    minor: 0,
                },
                path: "/dev/nvme0n1".into(),
            }],
            controllers: vec!["nvme0".into(), "nvme1".into()],
            portals: vec![
                PortalConnect {
                    portal: "127.0.0.1:4420".into(),
                    discovered: false,
                    result: connected("nvme0", false),
                    failure: None,
                },
                PortalConnect {
                    portal: "127.0.0.2:4420".into(),
                    discovered: true,
                    result: connected("nvme1", true),
                    failure: None,
                },
                PortalConnect {
                    portal: "127.0.0.3:4420".into(),
                    discovered: true,
                    result: Err("connection refused".into()),
                    failure: Some(lunkit::ErrorKind::NotFound),
                },
            ],
            discovery: vec![
                DiscoveryService {
                    service: "127.0.0.1:8009".into(),
                    via: "127.0.0.1:8009".into(),
                    result: Ok(vec!["127.0.0.2:4420".into()]),
                },
                DiscoveryService {
                    service: "127.0.0.3:8009".into(),
                    via: "127.0.0.1:8009".into(),
                    result: Ok(vec!["127.0.0.3:4420".into()]),
                },
                DiscoveryService {
                    service: "127.0.0.9:8009".into(),
                    via: "127.0.0.9:8009".into(),
                    result: Err("connection refused".into()),
                },
            ],
        };
        let wwid: Wwid = "uuid.963dcb64-5e7a-4000-8000-000000000001".parse().unwrap();
        let v = serde_json::to_value(NvmeAttach::new(
            Some(&wwid),
            &nvme,
            None,
            Duration::from_micros(42),
        ))
        .unwrap();
        assert_eq!(
            v,
            json!({
                "version": 1,
                "wwid": "uuid.963dcb64-5e7a-4000-8000-000000000001",
                "devices": [{"name": "nvme0n1", "path": "/dev/nvme0n1", "major": 259, "minor": 0}],
                "controllers": ["nvme0", "nvme1"],
                "portals": [
                    {"portal": "127.0.0.1:4420", "discovered": false, "outcome": "connected", "controller": "nvme0", "detail": null},
                    {"portal": "127.0.0.2:4420", "discovered": true, "outcome": "existing", "controller": "nvme1", "detail": null},
                    {"portal": "127.0.0.3:4420", "discovered": true, "outcome": "failed", "controller": null, "detail": "connection refused"},
                ],
                "discovery": [
                    {"service": "127.0.0.1:8009", "via": "127.0.0.1:8009", "outcome": "answered", "paths": ["127.0.0.2:4420"], "detail": null},
                    {"service": "127.0.0.3:8009", "via": "127.0.0.1:8009", "outcome": "answered", "paths": ["127.0.0.3:4420"], "detail": null},
                    {"service": "127.0.0.9:8009", "via": "127.0.0.9:8009", "outcome": "failed", "paths": [], "detail": "connection refused"},
                ],
                "elapsed_us": 42,
            })
        );
    }
}

//! `lunkit list --json`: the whole node in one document.
//!
//! Its fields are frozen as they were first published (README.md's table); new ones are
//! only ever added.

use lunkit::Topology;
use serde::Serialize;

use super::SCHEMA_VERSION;

#[derive(Serialize)]
pub struct List {
    pub version: u32,
    pub scsi_hosts: Vec<ScsiHost>,
    pub scsi_devices: Vec<ScsiDevice>,
    pub block_devices: Vec<BlockDevice>,
    pub dm_devices: Vec<DmDevice>,
    pub multipath_maps: Vec<MultipathMap>,
    pub iscsi_sessions: Vec<IscsiSession>,
    pub fc_hosts: Vec<FcHost>,
    pub fc_rports: Vec<FcRport>,
    pub nvme_controllers: Vec<NvmeController>,
    pub nvme_subsystems: Vec<NvmeSubsystem>,
    pub nvme_namespaces: Vec<NvmeNamespace>,
}

#[derive(Serialize)]
pub struct ScsiHost {
    pub host: u32,
    pub name: String,
    pub transport: &'static str,
    pub proc_name: Option<String>,
    pub state: Option<String>,
}

#[derive(Serialize)]
pub struct ScsiDevice {
    pub hctl: String,
    pub state: Option<String>,
    pub vendor: Option<String>,
    pub model: Option<String>,
    pub rev: Option<String>,
    #[serde(rename = "type")]
    pub device_type: Option<u8>,
    pub wwid: Option<String>,
    pub block: Option<String>,
    pub sg: Option<String>,
}

#[derive(Serialize)]
pub struct BlockDevice {
    pub name: String,
    pub major: Option<u32>,
    pub minor: Option<u32>,
    pub size_bytes: Option<u64>,
    pub read_only: Option<bool>,
    pub holders: Vec<String>,
    pub slaves: Vec<String>,
    pub partitions: Vec<String>,
}

#[derive(Serialize)]
pub struct DmDevice {
    pub name: Option<String>,
    pub dm: String,
    pub uuid: Option<String>,
    pub slaves: Vec<String>,
}

#[derive(Serialize)]
pub struct MultipathMap {
    pub name: Option<String>,
    pub dm: String,
    pub uuid: String,
    pub wwid: String,
    pub paths: Vec<String>,
    /// Paths that report another WWID than the map's (a LUN re-mapped under the map).
    pub foreign_paths: Vec<ForeignPath>,
}

#[derive(Serialize)]
pub struct ForeignPath {
    pub path: String,
    pub wwid: String,
}

#[derive(Serialize)]
pub struct IscsiSession {
    pub sid: u32,
    pub target: Option<String>,
    pub tpgt: Option<u32>,
    pub state: Option<String>,
    pub host: Option<u32>,
    pub target_id: Option<u32>,
    pub portal: Option<String>,
    pub connections: Vec<IscsiConnection>,
}

#[derive(Serialize)]
pub struct IscsiConnection {
    pub name: String,
    pub persistent_address: Option<String>,
    pub persistent_port: Option<u16>,
    pub address: Option<String>,
    pub port: Option<u16>,
    pub state: Option<String>,
}

#[derive(Serialize)]
pub struct FcHost {
    pub host: u32,
    pub port_name: Option<String>,
    pub node_name: Option<String>,
    pub port_id: Option<String>,
    pub port_state: Option<String>,
    pub speed: Option<String>,
}

#[derive(Serialize)]
pub struct FcRport {
    pub name: String,
    pub host: u32,
    pub channel: u32,
    pub number: u32,
    pub port_name: Option<String>,
    pub node_name: Option<String>,
    pub port_id: Option<String>,
    pub roles: Vec<String>,
    pub scsi_target_id: Option<u32>,
    pub port_state: Option<String>,
    pub target: Option<String>,
}

#[derive(Serialize)]
pub struct NvmeController {
    pub name: String,
    pub transport: Option<String>,
    pub address: Option<String>,
    pub state: Option<String>,
    pub subsysnqn: Option<String>,
    pub model: Option<String>,
    pub serial: Option<String>,
    pub namespaces: Vec<String>,
    pub cntlid: Option<u16>,
    pub hostnqn: Option<String>,
    pub hostid: Option<String>,
}

#[derive(Serialize)]
pub struct NvmeSubsystem {
    pub name: String,
    pub nqn: Option<String>,
    pub model: Option<String>,
    pub serial: Option<String>,
    pub iopolicy: Option<String>,
    pub controllers: Vec<String>,
    pub namespaces: Vec<String>,
}

#[derive(Serialize)]
pub struct NvmeNamespace {
    pub name: String,
    pub nsid: Option<u32>,
    pub wwid: Option<String>,
    pub uuid: Option<String>,
    pub nguid: Option<String>,
    pub eui: Option<String>,
    pub size_bytes: Option<u64>,
    pub paths: Vec<NvmePath>,
}

#[derive(Serialize)]
pub struct NvmePath {
    pub name: String,
    pub controller: String,
    pub ana_state: Option<String>,
}

impl From<&Topology> for List {
    fn from(t: &Topology) -> Self {
        List {
            version: SCHEMA_VERSION,
            scsi_hosts: scsi_hosts(t),
            scsi_devices: scsi_devices(t),
            block_devices: block_devices(t),
            dm_devices: dm_devices(t),
            multipath_maps: multipath_maps(t),
            iscsi_sessions: iscsi_sessions(t),
            fc_hosts: fc_hosts(t),
            fc_rports: fc_rports(t),
            nvme_controllers: nvme_controllers(t),
            nvme_subsystems: nvme_subsystems(t),
            nvme_namespaces: nvme_namespaces(t),
        }
    }
}

// Each array of the document from the topology's own, one function each, so that `from`
// reads as the list of the document's fields.

fn scsi_hosts(t: &Topology) -> Vec<ScsiHost> {
    t.scsi_hosts
        .iter()
        .map(|h| ScsiHost {
            host: h.number,
            name: format!("host{}", h.number),
            transport: h.transport.as_str(),
            proc_name: h.proc_name.clone(),
            state: h.state.clone(),
        })
        .collect()
}

fn scsi_devices(t: &Topology) -> Vec<ScsiDevice> {
    t.scsi_devices
        .iter()
        .map(|d| ScsiDevice {
            hctl: d.hctl.to_string(),
            state: d.state.clone(),
            vendor: d.vendor.clone(),
            model: d.model.clone(),
            rev: d.rev.clone(),
            device_type: d.device_type,
            wwid: d.wwid.clone(),
            block: d.block.clone(),
            sg: d.sg.clone(),
        })
        .collect()
}

fn block_devices(t: &Topology) -> Vec<BlockDevice> {
    t.block_devices
        .iter()
        .map(|b| BlockDevice {
            name: b.name.clone(),
            major: b.dev.map(|d| d.major),
            minor: b.dev.map(|d| d.minor),
            size_bytes: b.size_bytes,
            read_only: b.read_only,
            holders: b.holders.clone(),
            slaves: b.slaves.clone(),
            partitions: b.partitions.clone(),
        })
        .collect()
}

fn dm_devices(t: &Topology) -> Vec<DmDevice> {
    t.dm_devices()
        .map(|d| DmDevice {
            name: d.name.map(str::to_owned),
            dm: d.dm.to_owned(),
            uuid: d.uuid.map(str::to_owned),
            slaves: d.slaves.to_vec(),
        })
        .collect()
}

fn multipath_maps(t: &Topology) -> Vec<MultipathMap> {
    t.multipath_maps()
        .map(|m| MultipathMap {
            name: m.name.map(str::to_owned),
            dm: m.dm.to_owned(),
            uuid: m.uuid.to_owned(),
            wwid: m.wwid.to_owned(),
            paths: m.paths.to_vec(),
            foreign_paths: m
                .foreign_paths
                .iter()
                .map(|(p, w)| ForeignPath {
                    path: (*p).to_owned(),
                    wwid: w.clone(),
                })
                .collect(),
        })
        .collect()
}

fn iscsi_sessions(t: &Topology) -> Vec<IscsiSession> {
    t.iscsi_sessions
        .iter()
        .map(|s| IscsiSession {
            sid: s.sid,
            target: s.target.clone(),
            tpgt: s.tpgt,
            state: s.state.clone(),
            host: s.host,
            target_id: s.target_id,
            portal: s.portal(),
            connections: s
                .connections
                .iter()
                .map(|c| IscsiConnection {
                    name: c.name.clone(),
                    persistent_address: c.persistent_address.clone(),
                    persistent_port: c.persistent_port,
                    address: c.address.clone(),
                    port: c.port,
                    state: c.state.clone(),
                })
                .collect(),
        })
        .collect()
}

fn fc_hosts(t: &Topology) -> Vec<FcHost> {
    t.fc_hosts
        .iter()
        .map(|h| FcHost {
            host: h.host,
            port_name: h.port_name.map(|w| w.to_string()),
            node_name: h.node_name.map(|w| w.to_string()),
            port_id: h.port_id.clone(),
            port_state: h.port_state.clone(),
            speed: h.speed.clone(),
        })
        .collect()
}

fn fc_rports(t: &Topology) -> Vec<FcRport> {
    t.fc_rports
        .iter()
        .map(|r| FcRport {
            name: r.name.clone(),
            host: r.host,
            channel: r.channel,
            number: r.number,
            port_name: r.port_name.map(|w| w.to_string()),
            node_name: r.node_name.map(|w| w.to_string()),
            port_id: r.port_id.clone(),
            roles: r.roles.clone(),
            scsi_target_id: r.scsi_target_id,
            port_state: r.port_state.clone(),
            target: r.target.map(|(h, c, t)| format!("{h}:{c}:{t}")),
        })
        .collect()
}

fn nvme_controllers(t: &Topology) -> Vec<NvmeController> {
    t.nvme_controllers
        .iter()
        .map(|n| NvmeController {
            name: n.name.clone(),
            transport: n.transport.clone(),
            address: n.address.clone(),
            state: n.state.clone(),
            subsysnqn: n.subsysnqn.clone(),
            model: n.model.clone(),
            serial: n.serial.clone(),
            namespaces: n.namespaces.clone(),
            cntlid: n.cntlid,
            hostnqn: n.hostnqn.clone(),
            hostid: n.hostid.clone(),
        })
        .collect()
}

fn nvme_subsystems(t: &Topology) -> Vec<NvmeSubsystem> {
    t.nvme_subsystems
        .iter()
        .map(|s| NvmeSubsystem {
            name: s.name.clone(),
            nqn: s.nqn.clone(),
            model: s.model.clone(),
            serial: s.serial.clone(),
            iopolicy: s.iopolicy.clone(),
            controllers: s.controllers.clone(),
            namespaces: s.namespaces.clone(),
        })
        .collect()
}

fn nvme_namespaces(t: &Topology) -> Vec<NvmeNamespace> {
    t.nvme_namespaces
        .iter()
        .map(|n| NvmeNamespace {
            name: n.name.clone(),
            nsid: n.nsid,
            wwid: n.wwid.clone(),
            uuid: n.uuid.clone(),
            nguid: n.nguid.clone(),
            eui: n.eui.clone(),
            size_bytes: n.size_bytes,
            paths: n
                .paths
                .iter()
                .map(|p| NvmePath {
                    name: p.name.clone(),
                    controller: p.controller.clone(),
                    ana_state: p.ana_state.clone(),
                })
                .collect(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use lunkit::Root;
    use serde_json::Value;

    /// The frozen schema: every section and the keys of its entries, as README.md lists them.
    const SCHEMA: &[(&str, &[&str])] = &[
        (
            "scsi_hosts",
            &["host", "name", "transport", "proc_name", "state"],
        ),
        (
            "scsi_devices",
            &[
                "hctl", "state", "vendor", "model", "rev", "type", "wwid", "block", "sg",
            ],
        ),
        (
            "block_devices",
            &[
                "name",
                "major",
                "minor",
                "size_bytes",
                "read_only",
                "holders",
                "slaves",
                "partitions",
            ],
        ),
        ("dm_devices", &["name", "dm", "uuid", "slaves"]),
        (
            "multipath_maps",
            &["name", "dm", "uuid", "wwid", "paths", "foreign_paths"],
        ),
        (
            "iscsi_sessions",
            &[
                "sid",
                "target",
                "tpgt",
                "state",
                "host",
                "target_id",
                "portal",
                "connections",
            ],
        ),
        (
            "fc_hosts",
            &[
                "host",
                "port_name",
                "node_name",
                "port_id",
                "port_state",
                "speed",
            ],
        ),
        (
            "fc_rports",
            &[
                "name",
                "host",
                "channel",
                "number",
                "port_name",
                "node_name",
                "port_id",
                "roles",
                "scsi_target_id",
                "port_state",
                "target",
            ],
        ),
        (
            "nvme_controllers",
            &[
                "name",
                "transport",
                "address",
                "state",
                "subsysnqn",
                "model",
                "serial",
                "namespaces",
                "cntlid",
                "hostnqn",
                "hostid",
            ],
        ),
        (
            "nvme_subsystems",
            &[
                "name",
                "nqn",
                "model",
                "serial",
                "iopolicy",
                "controllers",
                "namespaces",
            ],
        ),
        (
            "nvme_namespaces",
            &[
                "name",
                "nsid",
                "wwid",
                "uuid",
                "nguid",
                "eui",
                "size_bytes",
                "paths",
            ],
        ),
    ];

    fn keys(v: &Value) -> Vec<String> {
        let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        k.sort();
        k
    }

    fn sorted(names: &[&str]) -> Vec<String> {
        let mut k: Vec<String> = names.iter().map(|s| (*s).to_owned()).collect();
        k.sort();
        k
    }

    #[test]
    fn the_captured_trees_list_exactly_the_frozen_fields() {
        let mut seen = Vec::new();
        for tree in ["fc", "iscsi-multipath"] {
            let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../tests/fixtures")
                .join(tree);
            let topo = Topology::read(&Root::new(dir)).expect("the fixture tree reads");
            let v = serde_json::to_value(List::from(&topo)).unwrap();
            let mut top: Vec<&str> = SCHEMA.iter().map(|(s, _)| *s).collect();
            top.push("version");
            assert_eq!(keys(&v), sorted(&top), "{tree}: top-level keys");
            assert_eq!(v["version"], 1);
            for (section, fields) in SCHEMA {
                for entry in v[section].as_array().unwrap() {
                    assert_eq!(keys(entry), sorted(fields), "{tree}: an entry of {section}");
                    seen.push(*section);
                }
            }
        }
        // The trees hold SCSI, block, multipath, iSCSI and FC entries (NVMe's are checked in
        // the VM), so those keys were compared above and not skipped for want of entries.
        for section in [
            "scsi_devices",
            "block_devices",
            "multipath_maps",
            "iscsi_sessions",
            "fc_rports",
        ] {
            assert!(seen.contains(&section), "no fixture has {section}");
        }
    }
}

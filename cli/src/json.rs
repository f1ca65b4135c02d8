//! The `--json` schema of `lunkit list`, version 1.
//!
//! These structs are the stable contract (documented in README.md): they are built from the
//! library's model here rather than derived on it, so refactoring the library cannot change
//! the output by accident. Fields are added, never renamed or removed, within a version.

use lunkit::Topology;
use serde::Serialize;

/// Version of this schema; bumped only on an incompatible change.
pub const SCHEMA_VERSION: u32 = 1;

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
            scsi_hosts: t
                .scsi_hosts
                .iter()
                .map(|h| ScsiHost {
                    host: h.number,
                    name: format!("host{}", h.number),
                    transport: h.transport.as_str(),
                    proc_name: h.proc_name.clone(),
                    state: h.state.clone(),
                })
                .collect(),
            scsi_devices: t
                .scsi_devices
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
                .collect(),
            block_devices: t
                .block_devices
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
                .collect(),
            dm_devices: t
                .dm_devices()
                .map(|d| DmDevice {
                    name: d.name.map(str::to_owned),
                    dm: d.dm.to_owned(),
                    uuid: d.uuid.map(str::to_owned),
                    slaves: d.slaves.to_vec(),
                })
                .collect(),
            multipath_maps: t
                .multipath_maps()
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
                .collect(),
            iscsi_sessions: t
                .iscsi_sessions
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
                .collect(),
            fc_hosts: t
                .fc_hosts
                .iter()
                .map(|h| FcHost {
                    host: h.host,
                    port_name: h.port_name.map(|w| w.to_string()),
                    node_name: h.node_name.map(|w| w.to_string()),
                    port_id: h.port_id.clone(),
                    port_state: h.port_state.clone(),
                    speed: h.speed.clone(),
                })
                .collect(),
            fc_rports: t
                .fc_rports
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
                .collect(),
            nvme_controllers: t
                .nvme_controllers
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
                .collect(),
            nvme_subsystems: t
                .nvme_subsystems
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
                .collect(),
            nvme_namespaces: t
                .nvme_namespaces
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
                .collect(),
        }
    }
}

//! The CSI 1.x messages this plugin speaks, written by hand as prost structs with the field
//! numbers of the CSI specification's `csi.proto` (package `csi.v1`), and the generated gRPC
//! code of the Identity and Node services ([`identity_server`], [`node_server`] and their
//! clients).
//!
//! Only the Identity and Node messages are here. Fields of messages this plugin does not read
//! are left out: protobuf skips unknown fields, so a CO that sends them is still understood.
//! The Controller service, snapshots and groups are not served.
//!
//! Secrets are kept out of `Debug` output (the spec's `csi_secret` fields).

// prost's derives generate code this crate's lints would otherwise flag.
#![allow(missing_docs, clippy::derive_partial_eq_without_eq)]

use std::collections::HashMap;
use std::fmt;

/// A map of strings (`map<string, string>`), as volume contexts and secrets are.
pub type StringMap = HashMap<String, String>;

/// `google.protobuf.BoolValue`: a bool that may be absent.
#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct BoolValue {
    #[prost(bool, tag = "1")]
    pub value: bool,
}

// ---- Identity -----------------------------------------------------------------------------

#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct GetPluginInfoRequest {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct GetPluginInfoResponse {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub vendor_version: String,
    #[prost(map = "string, string", tag = "3")]
    pub manifest: StringMap,
}

#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct GetPluginCapabilitiesRequest {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct GetPluginCapabilitiesResponse {
    #[prost(message, repeated, tag = "1")]
    pub capabilities: Vec<PluginCapability>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PluginCapability {
    #[prost(oneof = "plugin_capability::Type", tags = "1, 2")]
    pub r#type: Option<plugin_capability::Type>,
}

pub mod plugin_capability {
    #[derive(Clone, Copy, PartialEq, prost::Message)]
    pub struct Service {
        #[prost(enumeration = "service::Type", tag = "1")]
        pub r#type: i32,
    }

    pub mod service {
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
        #[repr(i32)]
        pub enum Type {
            Unknown = 0,
            ControllerService = 1,
            VolumeAccessibilityConstraints = 2,
            GroupControllerService = 3,
        }
    }

    #[derive(Clone, Copy, PartialEq, prost::Message)]
    pub struct VolumeExpansion {
        #[prost(enumeration = "volume_expansion::Type", tag = "1")]
        pub r#type: i32,
    }

    pub mod volume_expansion {
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
        #[repr(i32)]
        pub enum Type {
            Unknown = 0,
            Online = 1,
            Offline = 2,
        }
    }

    #[derive(Clone, Copy, PartialEq, prost::Oneof)]
    pub enum Type {
        #[prost(message, tag = "1")]
        Service(Service),
        #[prost(message, tag = "2")]
        VolumeExpansion(VolumeExpansion),
    }
}

#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct ProbeRequest {}

#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct ProbeResponse {
    #[prost(message, optional, tag = "1")]
    pub ready: Option<BoolValue>,
}

// ---- Volumes ------------------------------------------------------------------------------

#[derive(Clone, PartialEq, prost::Message)]
pub struct VolumeCapability {
    #[prost(oneof = "volume_capability::AccessType", tags = "1, 2")]
    pub access_type: Option<volume_capability::AccessType>,
    #[prost(message, optional, tag = "3")]
    pub access_mode: Option<volume_capability::AccessMode>,
}

pub mod volume_capability {
    #[derive(Clone, Copy, PartialEq, prost::Message)]
    pub struct BlockVolume {}

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct MountVolume {
        #[prost(string, tag = "1")]
        pub fs_type: String,
        #[prost(string, repeated, tag = "2")]
        pub mount_flags: Vec<String>,
        #[prost(string, tag = "3")]
        pub volume_mount_group: String,
    }

    #[derive(Clone, Copy, PartialEq, prost::Message)]
    pub struct AccessMode {
        #[prost(enumeration = "access_mode::Mode", tag = "1")]
        pub mode: i32,
    }

    pub mod access_mode {
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
        #[repr(i32)]
        pub enum Mode {
            Unknown = 0,
            SingleNodeWriter = 1,
            SingleNodeReaderOnly = 2,
            MultiNodeReaderOnly = 3,
            MultiNodeSingleWriter = 4,
            MultiNodeMultiWriter = 5,
            SingleNodeSingleWriter = 6,
            SingleNodeMultiWriter = 7,
        }
    }

    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum AccessType {
        #[prost(message, tag = "1")]
        Block(BlockVolume),
        #[prost(message, tag = "2")]
        Mount(MountVolume),
    }
}

#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct CapacityRange {
    #[prost(int64, tag = "1")]
    pub required_bytes: i64,
    #[prost(int64, tag = "2")]
    pub limit_bytes: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Topology {
    #[prost(map = "string, string", tag = "1")]
    pub segments: StringMap,
}

// ---- Node ---------------------------------------------------------------------------------

#[derive(Clone, PartialEq, prost::Message)]
#[prost(skip_debug)]
pub struct NodeStageVolumeRequest {
    #[prost(string, tag = "1")]
    pub volume_id: String,
    #[prost(map = "string, string", tag = "2")]
    pub publish_context: StringMap,
    #[prost(string, tag = "3")]
    pub staging_target_path: String,
    #[prost(message, optional, tag = "4")]
    pub volume_capability: Option<VolumeCapability>,
    #[prost(map = "string, string", tag = "5")]
    pub secrets: StringMap,
    #[prost(map = "string, string", tag = "6")]
    pub volume_context: StringMap,
}

impl fmt::Debug for NodeStageVolumeRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodeStageVolumeRequest")
            .field("volume_id", &self.volume_id)
            .field("publish_context", &self.publish_context)
            .field("staging_target_path", &self.staging_target_path)
            .field("volume_capability", &self.volume_capability)
            .field("secrets", &Redacted(self.secrets.len()))
            .field("volume_context", &self.volume_context)
            .finish()
    }
}

#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct NodeStageVolumeResponse {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeUnstageVolumeRequest {
    #[prost(string, tag = "1")]
    pub volume_id: String,
    #[prost(string, tag = "2")]
    pub staging_target_path: String,
}

#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct NodeUnstageVolumeResponse {}

#[derive(Clone, PartialEq, prost::Message)]
#[prost(skip_debug)]
pub struct NodePublishVolumeRequest {
    #[prost(string, tag = "1")]
    pub volume_id: String,
    #[prost(map = "string, string", tag = "2")]
    pub publish_context: StringMap,
    #[prost(string, tag = "3")]
    pub staging_target_path: String,
    #[prost(string, tag = "4")]
    pub target_path: String,
    #[prost(message, optional, tag = "5")]
    pub volume_capability: Option<VolumeCapability>,
    #[prost(bool, tag = "6")]
    pub readonly: bool,
    #[prost(map = "string, string", tag = "7")]
    pub secrets: StringMap,
    #[prost(map = "string, string", tag = "8")]
    pub volume_context: StringMap,
}

impl fmt::Debug for NodePublishVolumeRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodePublishVolumeRequest")
            .field("volume_id", &self.volume_id)
            .field("publish_context", &self.publish_context)
            .field("staging_target_path", &self.staging_target_path)
            .field("target_path", &self.target_path)
            .field("volume_capability", &self.volume_capability)
            .field("readonly", &self.readonly)
            .field("secrets", &Redacted(self.secrets.len()))
            .field("volume_context", &self.volume_context)
            .finish()
    }
}

#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct NodePublishVolumeResponse {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeUnpublishVolumeRequest {
    #[prost(string, tag = "1")]
    pub volume_id: String,
    #[prost(string, tag = "2")]
    pub target_path: String,
}

#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct NodeUnpublishVolumeResponse {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeGetVolumeStatsRequest {
    #[prost(string, tag = "1")]
    pub volume_id: String,
    #[prost(string, tag = "2")]
    pub volume_path: String,
    #[prost(string, tag = "3")]
    pub staging_target_path: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeGetVolumeStatsResponse {
    #[prost(message, repeated, tag = "1")]
    pub usage: Vec<VolumeUsage>,
    #[prost(message, optional, tag = "2")]
    pub volume_condition: Option<VolumeCondition>,
}

#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct VolumeUsage {
    #[prost(int64, tag = "1")]
    pub available: i64,
    #[prost(int64, tag = "2")]
    pub total: i64,
    #[prost(int64, tag = "3")]
    pub used: i64,
    #[prost(enumeration = "volume_usage::Unit", tag = "4")]
    pub unit: i32,
}

pub mod volume_usage {
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
    #[repr(i32)]
    pub enum Unit {
        Unknown = 0,
        Bytes = 1,
        Inodes = 2,
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct VolumeCondition {
    #[prost(bool, tag = "1")]
    pub abnormal: bool,
    #[prost(string, tag = "2")]
    pub message: String,
}

#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct NodeGetCapabilitiesRequest {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeGetCapabilitiesResponse {
    #[prost(message, repeated, tag = "1")]
    pub capabilities: Vec<NodeServiceCapability>,
}

#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct NodeServiceCapability {
    #[prost(oneof = "node_service_capability::Type", tags = "1")]
    pub r#type: Option<node_service_capability::Type>,
}

pub mod node_service_capability {
    #[derive(Clone, Copy, PartialEq, prost::Message)]
    pub struct Rpc {
        #[prost(enumeration = "rpc::Type", tag = "1")]
        pub r#type: i32,
    }

    pub mod rpc {
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
        #[repr(i32)]
        pub enum Type {
            Unknown = 0,
            StageUnstageVolume = 1,
            GetVolumeStats = 2,
            ExpandVolume = 3,
            VolumeCondition = 4,
            SingleNodeMultiWriter = 5,
            VolumeMountGroup = 6,
        }
    }

    #[derive(Clone, Copy, PartialEq, prost::Oneof)]
    pub enum Type {
        #[prost(message, tag = "1")]
        Rpc(Rpc),
    }
}

#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct NodeGetInfoRequest {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeGetInfoResponse {
    #[prost(string, tag = "1")]
    pub node_id: String,
    #[prost(int64, tag = "2")]
    pub max_volumes_per_node: i64,
    #[prost(message, optional, tag = "3")]
    pub accessible_topology: Option<Topology>,
}

#[derive(Clone, PartialEq, prost::Message)]
#[prost(skip_debug)]
pub struct NodeExpandVolumeRequest {
    #[prost(string, tag = "1")]
    pub volume_id: String,
    #[prost(string, tag = "2")]
    pub volume_path: String,
    #[prost(message, optional, tag = "3")]
    pub capacity_range: Option<CapacityRange>,
    #[prost(string, tag = "4")]
    pub staging_target_path: String,
    #[prost(message, optional, tag = "5")]
    pub volume_capability: Option<VolumeCapability>,
    #[prost(map = "string, string", tag = "6")]
    pub secrets: StringMap,
}

impl fmt::Debug for NodeExpandVolumeRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodeExpandVolumeRequest")
            .field("volume_id", &self.volume_id)
            .field("volume_path", &self.volume_path)
            .field("capacity_range", &self.capacity_range)
            .field("staging_target_path", &self.staging_target_path)
            .field("volume_capability", &self.volume_capability)
            .field("secrets", &Redacted(self.secrets.len()))
            .finish()
    }
}

#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct NodeExpandVolumeResponse {
    #[prost(int64, tag = "1")]
    pub capacity_bytes: i64,
}

/// How secrets show in `Debug`: their count, never their keys or values.
struct Redacted(usize);

impl fmt::Debug for Redacted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "<{} redacted>", self.0)
    }
}

include!(concat!(env!("OUT_DIR"), "/csi.v1.Identity.rs"));
include!(concat!(env!("OUT_DIR"), "/csi.v1.Node.rs"));

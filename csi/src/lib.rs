//! `lunkit-csi`: a CSI 1.x node plugin on lunkit, for statically provisioned iSCSI and
//! NVMe/TCP volumes.
//!
//! It serves the Identity and Node services on a Unix socket ([`server`]). NodeStageVolume
//! logs in to the volume's portals with `iscsiadm` (manual scan, so no LUN is scanned by the
//! login), brings exactly the volume's LUN in on every session with [`lunkit::ops::attach()`]
//! (waiting for multipathd's map when multipathd runs), formats a blank device for mount
//! access and mounts it at the staging path. What it learned is kept in a record
//! ([`state`]), so NodeUnstageVolume, which gets only the volume id and the staging path,
//! works after a restart too: it unmounts (never lazily), takes the volume out with
//! [`lunkit::ops::detach()`] under the volume's lock, and logs out of the sessions that carry
//! no LUN any more. NodePublishVolume bind-mounts the staging path (filesystem) or the device
//! node (raw block) at the target path.
//!
//! An NVMe/TCP volume is connected through lunkit (no `nvme` command) and found by its
//! namespace UUID or id; unstage deletes the controllers no other namespace needs.
//!
//! Volume attributes use csi-driver-iscsi's and csi-driver-nvmf's keys ([`attrs`]). Errors
//! carry the gRPC code the CSI spec names ([`error`]).
//!
//! NodeGetInfo reports the node's topology as `--topology` gives it ([`topology`]); the
//! Identity service then offers `VOLUME_ACCESSIBILITY_CONSTRAINTS`, as the spec requires of a
//! plugin that reports topology.
//!
//! Probe checks what the node needs for the transports in use ([`probe`]); every call is
//! timed and counted for Prometheus ([`metrics`], served on `--metrics-address`) and logged as
//! text or JSON ([`log`]), with lunkit's attach and detach steps.
//!
//! The library never spawns a process; the plugin runs exactly the programs [`exec`] lists.

pub mod attrs;
pub mod authority;
pub mod client;
pub mod doctor;
pub mod error;
pub mod exec;
pub mod fc;
pub mod fence;
pub mod fence_join;
pub mod follow;
pub mod fs;
pub mod identity;
pub mod iscsi;
pub mod log;
pub mod metrics;
pub mod mounts;
pub mod mpath;
pub mod node;
pub mod nvme;
pub mod paths;
pub mod probe;
pub mod proto;
pub mod scsi;
pub mod server;
pub mod stale;
pub mod state;
pub mod topology;

pub use client::Client;
pub use error::{Error, Result};
pub use identity::IdentityService;
pub use node::{Config, NodeService};
pub use tonic::{Code, Status};

//! # lunkit
//!
//! Bring one SCSI LUN onto a Linux node and take it off again, talking to the kernel directly:
//! sysfs, netlink uevents and device-mapper ioctls, never `iscsiadm`, `multipath` or
//! `blockdev`. Built for CSI node plugins and for anyone who needs LUN attach and detach to be
//! fast, precise and safe.
//!
//! This release reads the node's storage topology:
//!
//! ```no_run
//! use lunkit::{Root, Topology};
//!
//! let topo = Topology::read(&Root::default())?;
//! for map in topo.multipath_maps() {
//!     println!("{} {} paths={:?}", map.name.unwrap_or("?"), map.wwid, map.paths);
//! }
//! # Ok::<(), lunkit::Error>(())
//! ```
//!
//! Every file access goes through a [`Root`], so the same code runs against the live system
//! (`/`), a container that mounts the host at `/host`, or a fixture tree in tests.
// `unsafe` is denied everywhere but in `ioctl`, the one module that issues raw ioctls.
#![deny(unsafe_code)]
#![deny(missing_docs)]
// docs.rs builds with `--cfg docsrs` on nightly (Cargo.toml, `package.metadata.docs.rs`) and
// marks feature-gated items with the feature they need.
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod block;
pub mod dm;
pub mod error;
pub mod fc;
mod helper;
pub mod id;
mod ioctl;
pub mod iscsi;
pub mod multipath;
pub mod nvme;
pub mod ops;
mod root;
pub mod scsi;
mod sysfs;
pub mod topology;
#[cfg(feature = "udev")]
#[cfg_attr(docsrs, doc(cfg(feature = "udev")))]
pub mod udev;
pub mod uevent;
pub mod wait;

pub use crate::block::sysfs::{BlockDevice, DmInfo};
pub use crate::fc::sysfs::{FcHost, FcRemotePort};
pub use crate::iscsi::sysfs::{IscsiConnection, IscsiSession};
pub use crate::nvme::sysfs::{NvmeController, NvmeNamespace, NvmePath, NvmeSubsystem};
pub use crate::scsi::sysfs::{ScsiDevice, ScsiHost, Transport};
pub use error::{Error, ErrorKind, ResizeFailure, Result};
pub use id::{DevNum, Hctl, Nqn, Wwid, Wwn};
pub use root::Root;
pub use scsi::{PathDevice, PathOutcome, PathScan, ScanOptions, ScanReport};
pub use topology::{DmDevice, MultipathMap, Topology};

/// The README's examples, compiled as doctests so they cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// The docs pages' examples, compiled as doctests too.
#[cfg(doctest)]
#[doc = include_str!("../docs/LIBRARY.md")]
#[doc = include_str!("../docs/IN-USE.md")]
#[doc = include_str!("../docs/CLI.md")]
pub struct DocsDoctests;

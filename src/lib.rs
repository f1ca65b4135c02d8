//! # lunkit
//!
//! Bring one volume onto a Linux node and take it off again, talking to the kernel directly
//! (sysfs, netlink uevents, device-mapper and NVMe ioctls, `/dev/nvme-fabrics`), never
//! spawning `iscsiadm`, `multipath`, `nvme` or `blockdev`. A volume is an iSCSI, Fibre
//! Channel or any H:C:T:L SCSI LUN (with its dm-multipath map), or an NVMe/TCP namespace.
//! Built for CSI node plugins: fast, exact (only the LUN asked for is scanned, on every path
//! at once), and safe (nothing is taken away while anything uses it, nothing is handed out
//! that another volume still holds, identity is checked at every destructive write).
//!
//! ## The three calls
//!
//! [`ops::attach`], [`ops::detach`] and [`ops::resize`] take the same [`ops::VolumeSpec`]:
//! an iSCSI target and LUN, an FC target's WWPNs and LUN, an H:C:T:L, a WWID, or an NVMe
//! subsystem NQN and namespace.
//!
//! ```no_run
//! use lunkit::Root;
//! use lunkit::ops::{self, AttachOptions, DetachOptions, NamespaceSelector, VolumeSpec};
//!
//! let root = Root::default();
//! // A SCSI LUN on every iSCSI session to its target, with multipathd's map over the paths.
//! let lun = VolumeSpec::Iscsi { target: "iqn.2003-01.org.example:array".parse()?, lun: 3 };
//! let mut opts = AttachOptions::new(&root);
//! opts.scsi.wait_map = true;
//! let attached = ops::attach(&root, &lun, &opts)?;
//! println!("{}", attached.device().expect("its map").display());
//! ops::detach(&root, &lun, &DetachOptions::new(&root))?;
//!
//! // An NVMe/TCP namespace, connected through two portals.
//! let ns = VolumeSpec::Nvme {
//!     nqn: "nqn.2014-08.org.example:vol1".parse()?,
//!     namespace: NamespaceSelector::Id(1),
//! };
//! let mut opts = AttachOptions::new(&root);
//! opts.nvme.connect = vec!["192.0.2.10:4420".parse()?, "192.0.2.11:4420".parse()?];
//! let attached = ops::attach(&root, &ns, &opts)?;
//! println!("{}", attached.device().expect("its head").display());
//! ops::detach(&root, &ns, &DetachOptions::new(&root))?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## Root
//!
//! Every file access goes through a [`Root`]: `/` on the node, `/host` in a container that
//! mounts the host there (`Root::new("/host")`), a fixture tree in tests. The paths the
//! library returns (such as [`ops::Attachment::device`]) are under it.
//!
//! ## Errors
//!
//! One [`Error`], classified by [`Error::kind`]: [`ErrorKind::Busy`] (refused: something
//! uses the volume, or another volume holds its LUN number; [`Error::usage`] says who),
//! [`ErrorKind::Unverified`] (whether it is in use could not be checked completely),
//! [`ErrorKind::NotFound`], [`ErrorKind::Invalid`] (malformed input, nothing changed),
//! [`ErrorKind::Timeout`] (the deadline passed, naming what was awaited),
//! [`ErrorKind::PermissionDenied`], [`ErrorKind::WwidMismatch`] (a device is not the volume
//! expected: a reused LUN number; [`Error::new_paths`] says what the scan brought in) and
//! [`ErrorKind::Other`]. Messages name the device and the cause.
//!
//! ## Blocking and async
//!
//! The calls block until done or until the deadline their options set (`timeout`): a kernel
//! call that cannot be interrupted runs on a helper thread, and the call returns at its
//! deadline while the helper finishes on its own. From async code, run them with
//! `tokio::task::spawn_blocking`, bounded by the option's `timeout` (not by
//! `tokio::time::timeout`, which stops waiting but not the call); `examples/async_caller.rs`
//! shows it.
//!
//! ## Reading the node
//!
//! [`Topology::read`] reads SCSI hosts and devices, block devices, multipath maps, iSCSI
//! sessions, FC ports and NVMe controllers in one pass:
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
pub mod pr;
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
pub use id::{DevNum, Hctl, IscsiName, Nqn, Wwid, Wwn};
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

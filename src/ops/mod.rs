//! The workflows a CSI node plugin calls, built from everything below: bringing a volume
//! onto the node ([`attach()`]), growing it online ([`resize()`]) and taking it off
//! ([`detach()`]), with per-volume locking ([`lock`]) and volume discovery ([`volume`]). All
//! three name the volume the same way ([`VolumeSpec`]).
//!
//! ```no_run
//! use lunkit::Root;
//! use lunkit::ops::{DetachOptions, VolumeSpec, detach};
//!
//! let root = Root::default();
//! let spec = VolumeSpec::Wwid("36001405a1b2c3d4e5f60718293a4b5c6".parse()?);
//! let report = detach(&root, &spec, &DetachOptions::new(&root))?;
//! for step in &report.steps {
//!     println!("{:<13} {:<24} {} ({:?})", step.kind.as_str(), step.target, step.outcome, step.duration);
//! }
//! # Ok::<(), lunkit::Error>(())
//! ```

pub mod attach;
pub mod detach;
pub mod lock;
mod names;
pub mod nvme;
pub mod resize;
pub mod volume;

pub use attach::{AttachOptions, Attachment, attach};
pub use detach::{
    DEFAULT_DETACH_TIMEOUT, DetachOptions, DetachReport, Outcome, Step, StepKind, detach,
    detach_with,
};
pub use nvme::{NamespaceDevice, NvmeAttachment, PortalConnect};
pub use resize::{
    DEFAULT_RESIZE_TIMEOUT, MapSize, NamespaceSize, NvmeResize, PathSize, ResizeOptions, Resized,
    resize,
};
pub use volume::{
    ForeignMap, Identity, MapDevice, NamespaceSelector, OrphanMap, VolumeSpec, VolumeState,
};

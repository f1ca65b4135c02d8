//! How the workflows behave: one option struct per verb, shared by both families.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::id::Wwn;
use crate::nvme::Host;
use crate::nvme::dhchap::Secret;
use crate::root::Root;
use crate::scsi::scan::ScanOptions;

/// Default time a resize may take, rescans and the map included.
pub const DEFAULT_RESIZE_TIMEOUT: Duration = Duration::from_secs(60);

/// While waiting for [`ResizeOptions::expect_size`], a path still short of it is rescanned
/// again after this long: the target announces a new capacity only to an initiator that
/// sends it a command, so without a new rescan a path would never learn it.
pub const RESCAN_INTERVAL: Duration = Duration::from_secs(1);

/// How [`resize`](super::resize()) behaves. [`ResizeOptions::new`] locks in `<root>/run/lunkit/locks`, as
/// detach does.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ResizeOptions {
    /// How long the whole resize may take.
    pub timeout: Duration,
    /// The size in bytes the volume must reach at least (CSI's `required_bytes`): wait until
    /// every path reports that much, or fail at the deadline naming what each one reports.
    /// `None` takes what the paths report after one rescan.
    pub expect_size: Option<u64>,
    /// Grow the map through multipathd when it runs (the default); `false` always reloads
    /// the table directly (only for nodes whose maps multipathd does not manage).
    pub use_multipathd: bool,
    /// The directory of the per-volume lock files, shared with detach; `None` locks within
    /// this process only.
    pub lock_dir: Option<PathBuf>,
}

// No `Default`: the lock directory is under the caller's root, which a default cannot know,
// and a default that locked within the process only would not exclude the CLI or a second
// plugin. One way to make the options, [`ResizeOptions::new`]; set `lock_dir` to `None` for
// that.
impl ResizeOptions {
    /// The defaults for `root`: 60 s, no expected size, multipathd used when it runs, and
    /// locks in `<root>/run/lunkit/locks` like [`crate::ops::DetachOptions::new`].
    pub fn new(root: &Root) -> ResizeOptions {
        ResizeOptions {
            timeout: DEFAULT_RESIZE_TIMEOUT,
            expect_size: None,
            use_multipathd: true,
            lock_dir: Some(root.run("lunkit/locks")),
        }
    }
}

/// Default time a detach may take.
pub const DEFAULT_DETACH_TIMEOUT: Duration = Duration::from_secs(60);

/// How [`detach`](super::detach()) behaves. Made with [`DetachOptions::new`], which puts the lock files under
/// the root; then set what differs:
///
/// ```
/// let root = lunkit::Root::default();
/// let mut opts = lunkit::ops::DetachOptions::new(&root);
/// opts.timeout = std::time::Duration::from_secs(20);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DetachOptions {
    /// How long the whole detach may take, lock wait included.
    pub timeout: Duration,
    /// Go on past refusals and errors: a volume in use is taken away anyway (its I/O fails),
    /// queued I/O of a map no path can serve is failed (and what it held is lost), a flush
    /// that fails is passed over. Every step skipped this way is in the report.
    pub force: bool,
    /// Where the cross-process lock files go; `None` locks within this process only.
    pub lock_dir: Option<PathBuf>,
    /// Ask multipathd to remove the map when it runs (so it does not re-create it).
    pub use_multipathd: bool,
}

impl DetachOptions {
    /// The defaults for `root`: 60 s, not forced, locks in `<root>/run/lunkit/locks`,
    /// multipathd used when it runs.
    pub fn new(root: &Root) -> DetachOptions {
        DetachOptions {
            timeout: DEFAULT_DETACH_TIMEOUT,
            force: false,
            lock_dir: Some(root.run("lunkit/locks")),
            use_multipathd: true,
        }
    }
}

/// How [`attach`](super::attach()) behaves. Made with [`AttachOptions::new`], which remembers
/// names in the lock directory under the root, as detach expects (there is no `Default`: it
/// could not know the root); then set what differs.
///
/// What applies to every volume is here; what applies to one protocol family only is in
/// [`AttachOptions::scsi`] or [`AttachOptions::nvme`], and the other family's part is not
/// read:
///
/// ```
/// let root = lunkit::Root::default();
/// let mut opts = lunkit::ops::AttachOptions::new(&root);
/// opts.scan.min_paths = 2;
/// // An iSCSI or FC LUN: wait for multipathd's map too.
/// opts.scsi.wait_map = true;
/// // An NVMe namespace: connect this portal if it is not connected yet.
/// opts.nvme.connect.push("192.0.2.10:4420".parse().unwrap());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct AttachOptions {
    /// The deadline (which also bounds the map wait), the expected WWID and how many paths
    /// must come: SCSI paths, or NVMe controllers the namespace is reached through.
    pub scan: ScanOptions,
    /// The directory of detach's lock files ([`crate::ops::DetachOptions::lock_dir`]). Attach
    /// remembers there which WWID an iSCSI or FC target and LUN named, and which NVMe
    /// namespaces are attached, so that a later detach by the same name finds the volume's
    /// multipath map even once every path is gone, and a detach of another namespace keeps
    /// the controllers this one needs. [`AttachOptions::new`] sets `<root>/run/lunkit/locks`;
    /// `None` remembers nothing (and locks within this process only).
    pub lock_dir: Option<PathBuf>,
    /// For a SCSI LUN ([`VolumeSpec::Iscsi`](super::VolumeSpec::Iscsi),
    /// [`VolumeSpec::Fc`](super::VolumeSpec::Fc), an H:C:T:L): which paths, and the map.
    pub scsi: ScsiAttachOptions,
    /// For an NVMe namespace ([`VolumeSpec::Nvme`](super::VolumeSpec::Nvme)): what to
    /// connect, and as whom.
    pub nvme: NvmeAttachOptions,
}

impl AttachOptions {
    /// The defaults, remembering names in `<root>/run/lunkit/locks`, where
    /// [`crate::ops::DetachOptions::new`] puts its lock files.
    pub fn new(root: &Root) -> AttachOptions {
        AttachOptions {
            scan: ScanOptions::default(),
            lock_dir: Some(root.run("lunkit/locks")),
            scsi: ScsiAttachOptions::default(),
            nvme: NvmeAttachOptions::default(),
        }
    }
}

/// The part of [`AttachOptions`] that applies to a SCSI LUN only. The default scans through
/// every session and every local port, and does not wait for a map.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct ScsiAttachOptions {
    /// iSCSI: scan only through the sessions logged in through these portals (`addr:port`,
    /// `[v6addr]:port`, as the session shows its connection); empty for every session to
    /// the target. Attach never logs in.
    pub iscsi_portals: Vec<String>,
    /// iSCSI: scan only through the sessions of these open-iscsi ifaces (`default`, or an
    /// iface record's name); empty for every session to the target. A plugin that logs in
    /// through one iface names it here, so that another iface's session to the same target
    /// (another driver's, or one made by hand) gets no device from this attach.
    pub iscsi_ifaces: Vec<String>,
    /// FC: scan only through these local ports (initiator WWPNs); empty for every port that
    /// sees one of the target's ports.
    pub fc_initiators: Vec<Wwn>,
    /// Also wait until multipathd has built the volume's map with every path that came.
    pub wait_map: bool,
}

/// The part of [`AttachOptions`] that applies to an NVMe namespace only. The default
/// connects nothing and uses the controllers already connected.
///
/// An attach that connects (given portals or discovery addresses) knows every path it can
/// have once its connects are done: it fails at once, rather than at its deadline, when the
/// subsystem then has no controller or fewer than
/// [`ScanOptions::min_paths`](crate::ScanOptions::min_paths). A failed attach deletes the
/// controllers it made; those it found connected stay.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct NvmeAttachOptions {
    /// Connect to the subsystem through these portals (TCP, each one controller), all at
    /// once, where no controller is connected yet; empty to use the controllers already
    /// connected. [`NvmeAttachment::portals`](super::NvmeAttachment::portals) says how each
    /// went; a portal that fails does not fail the attach while the namespace comes through
    /// the others.
    pub connect: Vec<SocketAddr>,
    /// Discovery services to ask for the subsystem's paths (NVMe/TCP discovery listens on
    /// 8009; many targets answer on 4420 too): each one's Discovery Log Page is read, its
    /// referrals followed ([`crate::nvme::discovery::discover`]), and every TCP path it
    /// lists for the subsystem is connected with those of [`NvmeAttachOptions::connect`],
    /// all at once. A path whose port requires TLS is not connected, but reported failed.
    /// A service that does not answer is reported
    /// ([`NvmeAttachment::discovery`](super::NvmeAttachment::discovery)), and fails the
    /// attach only when no path comes at all. Its discovery controller is disconnected
    /// after the read.
    pub discover: Vec<SocketAddr>,
    /// This node's identity for the connects and the discovery; `None` reads
    /// `/etc/nvme/hostnqn` and `/etc/nvme/hostid` under the root
    /// ([`crate::nvme::Host::from_node`]).
    pub host: Option<Host>,
    /// The host's DH-HMAC-CHAP secret for every connect to the subsystem
    /// ([`ConnectOptions::dhchap_secret`](crate::nvme::ConnectOptions::dhchap_secret)); the
    /// discovery controllers of [`discover`](Self::discover) connect without one.
    pub dhchap_secret: Option<Secret>,
    /// The controller's secret, for authentication both ways
    /// ([`ConnectOptions::dhchap_ctrl_secret`](crate::nvme::ConnectOptions::dhchap_ctrl_secret)).
    pub dhchap_ctrl_secret: Option<Secret>,
}

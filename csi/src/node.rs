//! The Node service: staging, publishing, stats and expansion of iSCSI volumes.
//!
//! Every call checks its arguments first (`INVALID_ARGUMENT` naming what is missing), then
//! takes the volume's in-flight slot (a second call on the same volume while one runs is
//! `ABORTED`, as the spec recommends), then does its blocking work on tokio's blocking pool.
//! Every call is idempotent: repeating it after success, or after a crash part way, converges.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lunkit::block::BlockNode;
use lunkit::nvme::sysfs::CtrlState;
use lunkit::ops::{
    self, AttachOptions, DetachOptions, NamespaceSelector, ResizeOptions, VolumeSpec,
};
use lunkit::scsi::sysfs::ScsiState;
use lunkit::{Root, Wwid};
use tonic::{Request, Response, Status};

use crate::attrs::{self, FcVolume, IscsiVolume, NvmeVolume, Volume};
use crate::error::{Error, Result};
use crate::follow::Followers;
use crate::log::{self, Level};
use crate::probe::{Checks, Transport};
use crate::proto::node_server::Node;
use crate::proto::volume_capability::access_mode::Mode;
use crate::proto::volume_capability::{AccessType, MountVolume};
use crate::proto::*;
use crate::stale::Presence;
use crate::state::{Access, Phase, RECORD_VERSION, Record, Store, Target};
use crate::{fs as vfs, iscsi, mounts, mpath, paths};

/// The directory of the state directory where binds that need flags (read-only, the
/// publish's mount options) are made before they are bound at the publish path ([`mounts::bind`]).
const SCRATCH: &str = "binds";

/// How the plugin runs: where the node's `/sys`, `/dev` and `/proc` are, where it keeps its
/// records, and its deadlines.
#[derive(Debug, Clone)]
pub struct Config {
    /// The node's root (`/`, or `/host` in a container that mounts the host there).
    pub root: Root,
    /// Where the stage records are kept.
    pub state_dir: PathBuf,
    /// This node's id (NodeGetInfo).
    pub node_id: String,
    /// NodeGetInfo's `max_volumes_per_node`; 0 for no limit.
    pub max_volumes: i64,
    /// Deadline of a stage: logins, the scan, the map, formatting.
    pub stage_timeout: Duration,
    /// Deadline of an unstage: the detach and the logouts.
    pub unstage_timeout: Duration,
    /// NodeGetInfo's `accessible_topology` segments; none reported when empty. Checked by
    /// [`crate::topology::segments`] (the binary refuses bad ones at startup).
    pub topology: BTreeMap<String, String>,
    /// open-iscsi's node database, where CHAP secrets are written into the node records
    /// (`/etc/iscsi/nodes` on Debian and Ubuntu; `/var/lib/iscsi/nodes` on some others). The
    /// plugin's own view: iscsiadm runs in the plugin's mount namespace, not under `root`.
    pub iscsi_nodes: PathBuf,
    /// Transports Probe checks even with none of their volumes staged ([`crate::probe`]).
    pub transports: BTreeSet<Transport>,
    /// Whether the discovery services staged NVMe volumes name (`discoveryAddrs`) are
    /// followed, so that ports the array adds or removes later reach the volumes
    /// ([`crate::follow`]).
    pub follow_discovery: bool,
}

impl Config {
    /// The defaults for `node_id`: root `/`, records in `/var/lib/lunkit-csi`, two minutes
    /// for a stage and for an unstage.
    pub fn new(node_id: impl Into<String>) -> Config {
        Config {
            root: Root::default(),
            state_dir: PathBuf::from("/var/lib/lunkit-csi"),
            node_id: node_id.into(),
            max_volumes: 0,
            stage_timeout: Duration::from_secs(120),
            unstage_timeout: Duration::from_secs(120),
            topology: BTreeMap::new(),
            iscsi_nodes: PathBuf::from("/etc/iscsi/nodes"),
            transports: BTreeSet::new(),
            follow_discovery: true,
        }
    }
}

/// The Node service.
#[derive(Debug, Clone)]
pub struct NodeService {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    config: Config,
    store: Store,
    /// Volumes with a call in progress.
    busy: Mutex<HashSet<String>>,
    /// One lock per iSCSI target: logins, and the decision to log out, never interleave.
    targets: Mutex<HashMap<String, Arc<Mutex<()>>>>,
    /// The persistent discovery followers, when `follow_discovery`.
    followers: Option<Followers>,
}

/// A volume's in-flight slot, freed on drop.
struct Slot {
    inner: Arc<Inner>,
    volume_id: String,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Ok(mut b) = self.inner.busy.lock() {
            b.remove(&self.volume_id);
        }
    }
}

fn required<'a>(value: &'a str, what: &str, call: &str) -> Result<&'a str> {
    if value.is_empty() {
        Err(Error::InvalidArgument(format!("{call}: {what} is missing")))
    } else {
        Ok(value)
    }
}

/// The access type and mode of a capability; `INVALID_ARGUMENT` when either is missing or the
/// mode is not one this plugin can give.
fn capability<'a>(
    cap: Option<&'a VolumeCapability>,
    call: &str,
    volume_id: &str,
) -> Result<(&'a AccessType, Mode)> {
    let cap = cap.ok_or_else(|| {
        Error::InvalidArgument(format!(
            "{call}: volume {volume_id}: volume_capability is missing"
        ))
    })?;
    let access = cap.access_type.as_ref().ok_or_else(|| {
        Error::InvalidArgument(format!(
            "{call}: volume {volume_id}: volume_capability has no access type (block or mount)"
        ))
    })?;
    let mode = cap
        .access_mode
        .and_then(|m| Mode::try_from(m.mode).ok())
        .unwrap_or(Mode::Unknown);
    let ok = match (access, mode) {
        (_, Mode::Unknown) => false,
        // A filesystem written from two nodes is corrupted: only a raw block device may be.
        (AccessType::Mount(_), Mode::MultiNodeMultiWriter | Mode::MultiNodeSingleWriter) => false,
        _ => true,
    };
    if !ok {
        return Err(Error::InvalidArgument(format!(
            "{call}: volume {volume_id}: access mode {mode:?} is not supported for {} access",
            match access {
                AccessType::Block(_) => "block",
                AccessType::Mount(_) => "mount",
            }
        )));
    }
    Ok((access, mode))
}

fn fs_type_of(m: &MountVolume) -> Result<String> {
    let t = if m.fs_type.is_empty() {
        vfs::DEFAULT_FS
    } else {
        m.fs_type.as_str()
    };
    if vfs::SUPPORTED.contains(&t) {
        Ok(t.to_owned())
    } else {
        Err(Error::InvalidArgument(format!(
            "filesystem type {t:?} is not supported (only {})",
            vfs::SUPPORTED.join(", ")
        )))
    }
}

/// How a filesystem is mounted at the staging path.
struct MountHow<'a> {
    fs_type: &'a str,
    flags: &'a [String],
    /// A read-only access mode: mounted read-only, and a blank device is not formatted.
    readonly: bool,
}

/// Whether a stage request names the volume a record was made for. The record's nsid may
/// have been found by UUID after the request that made it, which named none.
fn same_volume(recorded: &Target, asked: &Target) -> bool {
    match (recorded, asked) {
        (
            Target::Nvme {
                nqn: a,
                portals: pa,
                discovery: da,
                nsid: na,
                device_uuid: ua,
                device_wwid: wa,
                host_nqn: ha,
                host_id: ia,
            },
            Target::Nvme {
                nqn: b,
                portals: pb,
                discovery: db,
                nsid: nb,
                device_uuid: ub,
                device_wwid: wb,
                host_nqn: hb,
                host_id: ib,
            },
        ) => {
            // A record written before hosts were recorded has none: it says nothing of them.
            let hosts = (ha.is_none() && ia.is_none()) || (ha == hb && ia == ib);
            a == b
                && pa == pb
                && da == db
                && ua == ub
                && wa == wb
                && hosts
                && (nb.is_none() || na == nb)
        }
        // The portals discovery found are what the array advertised then, not what the
        // request names.
        (
            Target::Iscsi {
                iqn: a,
                portals: pa,
                iface: fa,
                lun: la,
                ..
            },
            Target::Iscsi {
                iqn: b,
                portals: pb,
                iface: fb,
                lun: lb,
                ..
            },
        ) => a == b && pa == pb && fa == fb && la == lb,
        _ => recorded == asked,
    }
}

/// The namespace the attributes name by what it is rather than by its id, as lunkit selects
/// it: the UUID (`deviceUUID`, `deviceID: uuid.…`); an NGUID or EUI-64 (`deviceEUI`,
/// `deviceID: eui.…`, 32 or 16 hex digits), matched against the namespace's own `nguid` or
/// `eui` whichever form its `wwid` took (a namespace that also reports a UUID shows
/// `uuid.…` there); or `nvme.…`, the kernel's name for a namespace that reports none of
/// them, which is the subsystem's vendor, serial and model and the namespace id, so it
/// selects that id ([`names_namespace`] checks the rest). `None` when the attributes name
/// none of them (or the form is not one of these).
fn identity_selector(uuid: Option<&str>, wwid: Option<&str>) -> Option<NamespaceSelector> {
    if let Some(u) = uuid.or_else(|| wwid.and_then(|w| w.strip_prefix("uuid."))) {
        return u.parse().ok().map(NamespaceSelector::Uuid);
    }
    let wwid = wwid?;
    if let Some(nsid) = wwid.strip_prefix("nvme.") {
        // `nvme.%04x-%*phN-%*phN-%08x`: the id is the last group.
        let (_, nsid) = nsid.rsplit_once('-')?;
        return (nsid.len() == 8)
            .then(|| u32::from_str_radix(nsid, 16).ok())
            .flatten()
            .map(NamespaceSelector::Id);
    }
    wwid.parse::<lunkit::id::Nguid>()
        .map(NamespaceSelector::Nguid)
        .or_else(|_| {
            wwid.parse::<lunkit::id::Eui64>()
                .map(NamespaceSelector::Eui64)
        })
        .ok()
}

/// Whether `ns` is the namespace the attributes named by UUID or kernel identity (either
/// may be absent: then nothing is checked): lunkit's selector of [`identity_selector`], and
/// for an `nvme.…` identity the whole of it, not only the id it carries.
fn names_namespace(uuid: Option<&str>, wwid: Option<&str>, ns: &lunkit::NvmeNamespace) -> bool {
    if uuid.is_none() && wwid.is_none() {
        return true;
    }
    let synthesized = wwid.filter(|w| w.starts_with("nvme."));
    identity_selector(uuid, wwid).is_some_and(|s| s.matches(ns))
        && synthesized.is_none_or(|w| {
            ns.wwid
                .as_deref()
                .is_some_and(|k| k.eq_ignore_ascii_case(w))
        })
}

fn io_err(what: String) -> impl FnOnce(std::io::Error) -> Error {
    move |e| Error::Internal(format!("{what}: {e}"))
}

/// The node path of `device` (`/dev/dm-3`), as records keep it: see [`paths`].
fn node_path(root: &Root, device: &BlockNode) -> PathBuf {
    paths::to_node(root, &device.path)
        .unwrap_or_else(|| PathBuf::from(format!("/dev/{}", device.name)))
}

/// The device number of the block device node at `path` (a raw-block publish target is a
/// bind mount of one); `None` for anything else.
pub(crate) fn rdev_of(path: &Path) -> Option<lunkit::DevNum> {
    let st = rustix::fs::stat(path).ok()?;
    (rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::BlockDevice).then(
        || lunkit::DevNum {
            major: rustix::fs::major(st.st_rdev),
            minor: rustix::fs::minor(st.st_rdev),
        },
    )
}

/// The volume's device now, found by its identity (a SCSI volume's WWID; an NVMe
/// namespace's subsystem, id, UUID and WWID), never by the name recorded: after a reboot
/// or a rescan that name may be another disk's. `None` when the volume is not on the node
/// (or, staged on a map, only its paths are).
pub(crate) fn device_of(root: &Root, record: &Record) -> Result<Option<BlockNode>> {
    let what = || {
        format!(
            "volume {}: find {}",
            record.volume_id,
            record.target.describe()
        )
    };
    if let Target::Nvme {
        nqn,
        nsid,
        device_uuid,
        device_wwid,
        ..
    } = &record.target
    {
        let Some(nsid) = nsid else { return Ok(None) };
        let nqn: lunkit::Nqn = nqn.parse().map_err(|e| Error::lunkit(what(), e))?;
        let found = lunkit::nvme::namespace_devices(root, &nqn)
            .map_err(|e| Error::lunkit(what(), e))?
            .into_iter()
            .find(|(ns, d)| {
                ns.nsid == Some(*nsid)
                    && names_namespace(device_uuid.as_deref(), device_wwid.as_deref(), ns)
                    && record
                        .wwid
                        .as_deref()
                        .is_none_or(|w| d.wwid.as_ref().is_some_and(|f| f.to_string() == w))
            });
        return Ok(found.map(|(_, d)| d.node));
    }
    let Some(wwid) = record.wwid.as_deref() else {
        return Ok(None);
    };
    let wwid: Wwid = wwid
        .parse()
        .map_err(|e| Error::lunkit(format!("volume {}: its record", record.volume_id), e))?;
    let state = ops::volume::identify(root, &VolumeSpec::Wwid(wwid))
        .and_then(|i| ops::volume::locate(root, &i))
        .map_err(|e| Error::lunkit(what(), e))?;
    if let Some(m) = state.maps.first() {
        return Ok(Some(m.node.clone()));
    }
    if record.map {
        return Ok(None);
    }
    Ok(state.paths.into_iter().find_map(|p| p.disk))
}

/// Whether the volume of `record` is on the node, found by its identity as
/// [`device_of`] finds it, never by the name recorded: a SCSI volume by any path or map with
/// its known WWID (the one its paths reported, else the one its attributes named); an NVMe
/// namespace by its subsystem and id (and the WWID stage saw), or, before stage learned the
/// id, by the UUID or WWID the attributes named. [`Presence::Here`] carries the device
/// [`device_of`] hands out, when there is one.
pub(crate) fn presence(root: &Root, record: &Record) -> Result<Presence> {
    let what = || {
        format!(
            "volume {}: find {}",
            record.volume_id,
            record.target.describe()
        )
    };
    match &record.target {
        Target::Nvme {
            nqn,
            nsid,
            device_uuid,
            device_wwid,
            ..
        } => {
            if nsid.is_some() {
                return Ok(match device_of(root, record)? {
                    Some(d) => Presence::Here(Some(d.dev)),
                    None => Presence::Gone,
                });
            }
            if device_uuid.is_none() && device_wwid.is_none() {
                return Ok(Presence::Unknown);
            }
            let nqn: lunkit::Nqn = nqn.parse().map_err(|e| Error::lunkit(what(), e))?;
            let here = lunkit::nvme::namespace_devices(root, &nqn)
                .map_err(|e| Error::lunkit(what(), e))?
                .iter()
                .any(|(ns, _)| names_namespace(device_uuid.as_deref(), device_wwid.as_deref(), ns));
            Ok(if here {
                Presence::Here(None)
            } else {
                Presence::Gone
            })
        }
        Target::Iscsi { .. } | Target::Fc { .. } => {
            let Some(Ok(wwid)) = record.known_wwid().map(str::parse::<Wwid>) else {
                return Ok(Presence::Unknown);
            };
            let state = ops::volume::identify(root, &VolumeSpec::Wwid(wwid))
                .and_then(|i| ops::volume::locate(root, &i))
                .map_err(|e| Error::lunkit(what(), e))?;
            if state.maps.is_empty() && state.paths.is_empty() {
                return Ok(Presence::Gone);
            }
            let dev = match state.maps.first() {
                Some(m) => Some(m.node.dev),
                None if record.map => None,
                None => state
                    .paths
                    .iter()
                    .find_map(|p| p.disk.as_ref().map(|d| d.dev)),
            };
            Ok(Presence::Here(dev))
        }
    }
}

/// The WWID the volume must have this time: the attributes', else the one an earlier stage
/// of this volume saw (after a reboot the LUN number may hold another volume).
fn expected(attr: Option<&Wwid>, record: &Record) -> Result<Option<Wwid>> {
    if let Some(w) = attr {
        return Ok(Some(w.clone()));
    }
    // An NVMe namespace's identity (`uuid.…`, `eui.…`) is expected when it parses; one in a
    // form lunkit does not name (`nvme.…`) is still checked by the UUID and the recorded
    // WWID when the device is looked up.
    if matches!(record.target, Target::Nvme { .. }) {
        return Ok(record.wwid.as_deref().and_then(|w| w.parse().ok()));
    }
    record
        .wwid
        .as_deref()
        .map(str::parse)
        .transpose()
        .map_err(|e| Error::lunkit(format!("volume {}: its record", record.volume_id), e))
}

/// The SCSI addresses with a device now.
fn scsi_addresses(root: &Root) -> Result<HashSet<lunkit::Hctl>> {
    Ok(lunkit::scsi::sysfs::devices(root)
        .map_err(|e| Error::lunkit("reading the SCSI devices", e))?
        .into_iter()
        .map(|d| d.hctl)
        .collect())
}

/// The WWID of the LUN found at the volume's address when a scan refused it for not being
/// the volume.
fn mismatched_wwid(e: &lunkit::Error) -> Option<&Wwid> {
    match e {
        lunkit::Error::WwidMismatch { actual, .. } => actual.as_ref(),
        lunkit::Error::Step { source, .. } => mismatched_wwid(source),
        _ => None,
    }
}

/// [`ops::attach()`], its steps recorded in the metrics and in the current call's log.
fn attach_recorded(
    root: &Root,
    spec: &VolumeSpec,
    opts: &AttachOptions,
) -> lunkit::Result<ops::Attachment> {
    let a = ops::attach(root, spec, opts)?;
    crate::metrics::global().attached(&a);
    let target = spec.to_string();
    if let Some(scsi) = a.scsi() {
        log::step("attach", "scan", &target, "done", scsi.scan_elapsed);
    }
    for p in a.nvme().iter().flat_map(|n| &n.portals) {
        if let Ok(c) = &p.result {
            log::step("attach", "connect", &p.portal, "done", c.elapsed);
        }
    }
    Ok(a)
}

/// [`ops::detach()`], its steps recorded in the metrics and in the current call's log.
fn detach_recorded(
    root: &Root,
    spec: &VolumeSpec,
    opts: &DetachOptions,
) -> lunkit::Result<ops::DetachReport> {
    let r = ops::detach(root, spec, opts)?;
    crate::metrics::global().detached(&r);
    for s in &r.steps {
        let outcome = crate::metrics::outcome_name(&s.outcome);
        log::step("detach", s.kind.as_str(), &s.target, outcome, s.duration);
    }
    Ok(r)
}

/// `e` with `what` (`volume pv-1: attach …`) before its message.
fn prefix(what: &str, e: Error) -> Error {
    match e {
        Error::DeadlineExceeded(m) => Error::DeadlineExceeded(format!("{what}: {m}")),
        Error::Internal(m) => Error::Internal(format!("{what}: {m}")),
        other => other,
    }
}

impl NodeService {
    /// The service for `config`; opens (creates) the state directory.
    pub fn new(config: Config) -> Result<NodeService> {
        let store = Store::open(&config.state_dir)?;
        // A read-only publish that a crash cut short leaves its first bind here.
        mounts::clear_scratch(
            &config.state_dir.join(SCRATCH),
            Instant::now() + Duration::from_secs(10),
        )?;
        let followers = if config.follow_discovery {
            let f = Followers::spawn(config.root.clone(), store.clone()).map_err(|e| {
                Error::Internal(format!("cannot start the discovery followers' thread: {e}"))
            })?;
            Some(f)
        } else {
            None
        };
        Ok(NodeService {
            inner: Arc::new(Inner {
                config,
                store,
                busy: Mutex::new(HashSet::new()),
                targets: Mutex::new(HashMap::new()),
                followers,
            }),
        })
    }

    /// What Probe checks for this service: its state directory, the transports configured
    /// and those of its records. Give it to [`crate::IdentityService::checks`].
    pub fn checks(&self) -> Checks {
        let c = &self.inner.config;
        Checks::new(
            c.root.clone(),
            self.inner.store.clone(),
            c.transports.clone(),
        )
    }

    /// The stage records (the staged volumes' gauge of [`crate::metrics`] counts them).
    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    /// Whether a call on `volume_id` is in progress now: the background doctor leaves such
    /// a volume's record alone ([`crate::stale`]), its devices and mounts being changed.
    pub fn in_progress(&self, volume_id: &str) -> bool {
        self.inner
            .busy
            .lock()
            .map_or(true, |b| b.contains(volume_id))
    }

    /// How long a call may keep a record in phase attaching: the longer of the stage's and
    /// the unstage's deadline. A record left so longer is stuck ([`crate::stale`]).
    pub fn settle(&self) -> Duration {
        let c = &self.inner.config;
        c.stage_timeout.max(c.unstage_timeout)
    }

    /// The node's root (`--root`).
    pub fn root(&self) -> &Root {
        &self.inner.config.root
    }

    /// Takes the in-flight slot of `volume_id`, or `ABORTED` while another call holds it.
    fn slot(&self, volume_id: &str) -> Result<Slot> {
        let mut busy = self
            .inner
            .busy
            .lock()
            .map_err(|_| Error::Internal("the in-flight table is poisoned".into()))?;
        if !busy.insert(volume_id.to_owned()) {
            return Err(Error::Aborted(format!(
                "an operation on volume {volume_id} is already in progress"
            )));
        }
        Ok(Slot {
            inner: self.inner.clone(),
            volume_id: volume_id.to_owned(),
        })
    }

    /// Runs `f` on the blocking pool, holding `slot` until it ends, inside the log's span of
    /// `call` on the slot's volume, and logs the call's outcome (its gRPC code and message,
    /// the time taken).
    async fn blocking<T: Send + 'static>(
        &self,
        call: &'static str,
        slot: Slot,
        f: impl FnOnce(&Inner) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let inner = self.inner.clone();
        let span = log::call_span(call, &slot.volume_id);
        let worker = span.clone();
        let start = Instant::now();
        let r = tokio::task::spawn_blocking(move || {
            let r = worker.in_scope(|| f(&inner));
            drop(slot);
            r
        })
        .await
        .map_err(|e| Error::Internal(format!("the worker failed: {e}")))
        .and_then(|r| r);
        span.in_scope(|| log::call(r.as_ref().map(|_| ()), start.elapsed()));
        r
    }
}

impl Inner {
    /// Tells the discovery followers the records may have changed (a stage or unstage ran,
    /// whether it worked or not).
    fn follow(&self) {
        if let Some(f) = &self.followers {
            f.notify();
        }
    }

    fn target_lock(&self, iqn: &str) -> Arc<Mutex<()>> {
        let mut t = self.targets.lock().unwrap_or_else(|p| p.into_inner());
        t.entry(iqn.to_owned()).or_default().clone()
    }

    fn root(&self) -> &Root {
        &self.config.root
    }

    /// The deadline of a publish's or unpublish's mount call: a stage's time, from now.
    fn mount_deadline(&self) -> Instant {
        Instant::now() + self.config.stage_timeout
    }

    /// Brings an NVMe namespace onto the node through lunkit: connects every port, and
    /// every port the discovery addresses list (connect-all), and waits for the namespace's
    /// device, named by its nsid or, without one, by what the
    /// attributes say it is ([`identity_selector`]). Records the nsid as soon as the attach
    /// says it, then checks the namespace is the one the attributes name. Returns its device.
    fn attach_nvme(
        &self,
        id: &str,
        vol: &NvmeVolume,
        record: &mut Record,
        deadline: Instant,
    ) -> Result<BlockNode> {
        let root = self.root();
        let what = format!("volume {id}: attach NVMe {}", vol.nqn);
        let host = self.nvme_host(&what, vol)?;
        let (uuid, wwid) = (vol.device_uuid.as_deref(), vol.device_wwid.as_deref());
        let namespace = match vol.nsid {
            Some(n) => NamespaceSelector::Id(n),
            None => identity_selector(uuid, wwid).ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "{what}: neither nsid nor a deviceID lunkit can find the namespace by"
                ))
            })?,
        };
        let mut opts = AttachOptions::new(root);
        opts.scan.timeout = deadline.saturating_duration_since(Instant::now());
        opts.scan.expect_wwid = expected(vol.wwid.as_ref(), record)?;
        opts.nvme.connect = vol
            .portals
            .iter()
            .map(|p| lunkit::nvme::parse_portal(p))
            .collect::<lunkit::Result<_>>()
            .map_err(|e| Error::lunkit(what.clone(), e))?;
        opts.nvme.discover = vol
            .discovery
            .iter()
            .map(|a| lunkit::nvme::discovery::parse_address(a))
            .collect::<lunkit::Result<_>>()
            .map_err(|e| Error::lunkit(what.clone(), e))?;
        opts.nvme.host = host;
        opts.nvme.dhchap_secret.clone_from(&vol.auth.secret);
        opts.nvme
            .dhchap_ctrl_secret
            .clone_from(&vol.auth.ctrl_secret);
        let spec = VolumeSpec::Nvme {
            nqn: vol.nqn.clone(),
            namespace,
        };
        let what = format!("{what} {namespace}");
        let a = attach_recorded(root, &spec, &opts).map_err(|e| Error::lunkit(what.clone(), e))?;
        let nvme = a
            .nvme()
            .ok_or_else(|| Error::Internal(format!("{what}: not attached as NVMe")))?;
        let nsid = nvme
            .nsid
            .ok_or_else(|| Error::NotFound(format!("{what}: the namespace shows no id")))?;
        if let Target::Nvme { nsid: n, .. } = &mut record.target {
            *n = Some(nsid);
        }
        self.store.save(record)?;
        let device = nvme
            .devices
            .first()
            .cloned()
            .ok_or_else(|| Error::NotFound(format!("{what}: no device came")))?;
        if uuid.is_some() || wwid.is_some() {
            let found = lunkit::nvme::namespace_devices(root, &vol.nqn)
                .map_err(|e| Error::lunkit(what.clone(), e))?
                .into_iter()
                .find(|(ns, _)| ns.nsid == Some(nsid))
                .map(|(ns, _)| ns);
            if !found
                .as_ref()
                .is_some_and(|ns| names_namespace(uuid, wwid, ns))
            {
                let said =
                    |v: Option<&String>| v.map_or_else(|| "not reported".to_owned(), Clone::clone);
                return Err(Error::FailedPrecondition(format!(
                    "{what}: the namespace reports UUID {} and identity {}, not the {} the \
                     volume attributes name",
                    said(found.as_ref().and_then(|n| n.uuid.as_ref())),
                    said(found.as_ref().and_then(|n| n.wwid.as_ref())),
                    uuid.or(wwid).unwrap_or_default()
                )));
            }
        }
        record.wwid = a.wwid.map(|w| w.to_string());
        self.record_device(record, &device, false)?;
        Ok(device)
    }

    /// Records the device handed out (its node path: see [`paths`]) and whether it is
    /// multipathd's map.
    fn record_device(&self, record: &mut Record, device: &BlockNode, map: bool) -> Result<()> {
        record.device = Some(node_path(self.root(), device));
        record.map = map;
        self.store.save(record)
    }

    /// The volume's device now, found by its identity: see [`device_of`].
    fn device_of(&self, record: &Record) -> Result<Option<BlockNode>> {
        device_of(self.root(), record)
    }

    /// [`device_of`](Self::device_of), or `NOT_FOUND` naming the volume's identity when no
    /// device of it is on the node; `FAILED_PRECONDITION` when the record has no identity
    /// to look for (its stage never learned one).
    fn device_now(&self, record: &Record, call: &str) -> Result<BlockNode> {
        let id = &record.volume_id;
        let known = match &record.target {
            Target::Nvme { nsid, .. } => nsid.is_some(),
            _ => record.wwid.is_some(),
        };
        if !known {
            return Err(Error::FailedPrecondition(format!(
                "{call}: volume {id}: the identity of {} is not known (its stage did not finish)",
                record.target.describe()
            )));
        }
        self.device_of(record)?.ok_or_else(|| {
            Error::NotFound(format!(
                "{call}: volume {id}: no device of {} (WWID {}) is on the node; stage it again",
                record.target.describe(),
                record.known_wwid().unwrap_or("not known")
            ))
        })
    }

    /// The host identity a volume's connects present: the node's (`None`: lunkit reads
    /// `/etc/nvme` under the root), or the volume's `hostNqn`/`hostId`. A volume that names
    /// only its `hostId` gets the node's host NQN with it, as csi-driver-nvmf gives it. One
    /// that names only its `hostNqn` gets no id here, and lunkit's connect chooses it
    /// ([`lunkit::nvme::with_host_id`]: the id the kernel already pairs with that NQN, the
    /// UUID in a `nqn.2014-08.org.nvmexpress:uuid:<id>` NQN, or one derived from the NQN).
    /// csi-driver-nvmf gives such a volume the node's host id, which newer kernels (6.12)
    /// refuse under a second NQN (`EINVAL`).
    fn nvme_host(&self, what: &str, vol: &NvmeVolume) -> Result<Option<lunkit::nvme::Host>> {
        crate::follow::volume_host(self.root(), vol.host_nqn.clone(), vol.host_id)
            .map_err(|e| Error::lunkit(format!("{what}: the node's host NQN (for hostId)"), e))
    }

    /// The volume with the portals SendTargets discovery found added (`discovery: true`),
    /// recorded before any is logged in to; the volume as it is otherwise. Checks its
    /// `initiatorName` first ([`iscsi::check_initiator`]).
    fn discover_iscsi(
        &self,
        id: &str,
        vol: &IscsiVolume,
        record: &mut Record,
        deadline: Instant,
    ) -> Result<IscsiVolume> {
        if let Some(name) = &vol.initiator_name {
            iscsi::check_initiator(self.root(), id, name)?;
        }
        if !vol.discovery {
            return Ok(vol.clone());
        }
        let found = iscsi::discover(
            &self.config.iscsi_nodes,
            &vol.iqn,
            &vol.portals,
            vol.iface.as_deref(),
            vol.discovery_chap.as_ref(),
            deadline,
        )
        .map_err(|e| match e {
            Error::Program(m) => Error::Program(format!("volume {id}: {m}")),
            Error::PermissionDenied(m) => Error::PermissionDenied(format!("volume {id}: {m}")),
            other => other,
        })?;
        let mut all = vol.clone();
        let new: Vec<String> = found
            .into_iter()
            .filter(|p| !vol.portals.contains(p))
            .collect();
        all.portals.extend(new.iter().cloned());
        if let Target::Iscsi { discovered, .. } = &mut record.target {
            for p in new {
                if !discovered.contains(&p) {
                    discovered.push(p);
                }
            }
        }
        self.store.save(record)?;
        Ok(all)
    }

    /// Logs in to the volume's portals that have no session yet (with session CHAP when the
    /// volume asks for it), under the target's lock.
    fn login_iscsi(&self, id: &str, vol: &IscsiVolume, deadline: Instant) -> Result<()> {
        let lock = self.target_lock(&vol.iqn);
        let _g = lock.lock().unwrap_or_else(|p| p.into_inner());
        iscsi::login(
            self.root(),
            &self.config.iscsi_nodes,
            &vol.iqn,
            &vol.portals,
            vol.iface.as_deref(),
            vol.chap.as_ref(),
            deadline,
        )
        .map(drop)
        .map_err(|e| match e {
            Error::Program(m) => Error::Program(format!("volume {id}: {m}")),
            Error::PermissionDenied(m) => Error::PermissionDenied(format!("volume {id}: {m}")),
            other => other,
        })
    }

    /// Brings the volume onto the node once it is logged in: scan, map; returns its device
    /// and WWID.
    fn attach_iscsi(
        &self,
        id: &str,
        vol: &IscsiVolume,
        record: &mut Record,
        deadline: Instant,
    ) -> Result<BlockNode> {
        let spec = VolumeSpec::Iscsi {
            target: vol.iqn.clone(),
            lun: vol.lun,
        };
        let mut opts = AttachOptions::new(self.root());
        opts.scan.expect_wwid = expected(vol.wwid.as_ref(), record)?;
        opts.scsi.iscsi_portals = vol.portals.clone();
        self.attach_scsi(id, &spec, opts, record, deadline)
    }

    /// Brings an FC LUN onto the node: the fabric's logins are the HBA's, so this is the scan
    /// through every port that leads to one of the target's ports, and the map.
    fn attach_fc(
        &self,
        id: &str,
        vol: &FcVolume,
        record: &mut Record,
        deadline: Instant,
    ) -> Result<BlockNode> {
        let spec = VolumeSpec::Fc {
            wwpns: vol.wwpns.clone(),
            lun: vol.lun,
        };
        let mut opts = AttachOptions::new(self.root());
        opts.scan.expect_wwid = expected(vol.wwid.as_ref(), record)?;
        self.attach_scsi(id, &spec, opts, record, deadline)
    }

    /// `ops::attach` of a SCSI LUN on every path, then multipathd's map when multipathd
    /// runs; returns the device to hand out (the map, or the single path). The WWID the
    /// scan found is recorded before the map is waited for, so that an unstage after a
    /// timeout there detaches by it. A LUN that reports another WWID than expected is
    /// refused, and its devices this call brought in are taken out again.
    fn attach_scsi(
        &self,
        id: &str,
        spec: &VolumeSpec,
        mut opts: AttachOptions,
        record: &mut Record,
        deadline: Instant,
    ) -> Result<BlockNode> {
        let root = self.root();
        let mut multipathd =
            lunkit::multipath::Multipathd::connect(root, Instant::now() + Duration::from_secs(2))
                .ok()
                .flatten();
        opts.scan.timeout = deadline.saturating_duration_since(Instant::now());
        opts.scsi.wait_map = false;
        let what = format!("volume {id}: attach {spec}");
        let before = scsi_addresses(root)?;
        let a = match attach_recorded(root, spec, &opts) {
            Ok(a) => a,
            Err(e) => return Err(self.refused_attach(id, &what, e, &before)),
        };
        let wwid = a.wwid.clone();
        record.wwid = wwid.as_ref().map(Wwid::to_multipath);
        self.store.save(record)?;
        let disks: Vec<String> = a
            .scsi()
            .iter()
            .flat_map(|s| s.devices())
            .map(|p| p.name.clone())
            .collect();
        if let Some(md) = multipathd.as_mut() {
            let wwid = wwid.ok_or_else(|| {
                Error::FailedPrecondition(format!(
                    "{what}: {} report no WWID (no VPD page 0x83), and multipathd keys its maps by it",
                    disks.join(", ")
                ))
            })?;
            // Whatever find_multipaths says: multipathd is asked for the map, and a path it
            // blacklists is never waited for.
            match mpath::map_of(root, md, &wwid, &disks, deadline).map_err(|e| prefix(&what, e))? {
                Some(map) => {
                    self.record_device(record, &map, true)?;
                    return Ok(map);
                }
                None => log::note(
                    Level::Warn,
                    &format!(
                        "{what}: multipathd blacklists {}; the volume is used on its path device",
                        disks.join(", ")
                    ),
                ),
            }
        }
        let first = disks
            .first()
            .ok_or_else(|| Error::NotFound(format!("{what}: no path came")))?;
        let device = lunkit::block::by_name(root, first)
            .map_err(|e| Error::lunkit(what.clone(), e))?
            .ok_or_else(|| Error::NotFound(format!("{what}: {first} went away")))?;
        self.record_device(record, &device, false)?;
        Ok(device)
    }

    /// The error of an attach that failed. A LUN with another WWID than the volume's is
    /// `FAILED_PRECONDITION`, and the devices of that WWID are taken out again when every
    /// one of them came in this call (an address `before` did not have) and no other
    /// volume of this node is known by that WWID.
    fn refused_attach(
        &self,
        id: &str,
        what: &str,
        e: lunkit::Error,
        before: &HashSet<lunkit::Hctl>,
    ) -> Error {
        let Some(actual) = mismatched_wwid(&e).cloned() else {
            return Error::lunkit(what.to_owned(), e);
        };
        let root = self.root();
        let key = actual.to_multipath();
        let mut cleanup = String::new();
        let ours = self.store.all().map(|all| {
            !all.iter()
                .any(|r| r.volume_id != id && r.known_wwid() == Some(key.as_str()))
        });
        let state = ops::volume::identify(root, &VolumeSpec::Wwid(actual.clone()))
            .and_then(|i| ops::volume::locate(root, &i));
        match (ours, state) {
            (Ok(true), Ok(s)) if s.paths.iter().all(|p| !before.contains(&p.hctl)) => {
                let opts = DetachOptions::new(root);
                cleanup = match detach_recorded(root, &VolumeSpec::Wwid(actual), &opts) {
                    Ok(_) => "; its devices that this stage brought in were taken out".into(),
                    Err(d) => format!("; taking its devices out again failed: {d}"),
                };
            }
            _ => cleanup.push_str("; its devices were there before this stage and are left"),
        }
        Error::FailedPrecondition(format!("{what}: refused: {e}{cleanup}"))
    }

    fn stage(
        &self,
        req: &NodeStageVolumeRequest,
        vol: Volume,
        access: Access,
        readonly: bool,
    ) -> Result<()> {
        let id = req.volume_id.as_str();
        let staging = PathBuf::from(&req.staging_target_path);
        let deadline = Instant::now() + self.config.stage_timeout;
        let (target, expected_wwid) = match &vol {
            Volume::Iscsi(v) => (
                Target::Iscsi {
                    iqn: v.iqn.clone(),
                    portals: v.portals.clone(),
                    iface: v.iface.clone(),
                    lun: v.lun,
                    discovered: Vec::new(),
                },
                v.wwid.as_ref().map(Wwid::to_multipath),
            ),
            Volume::Nvme(v) => (
                Target::Nvme {
                    nqn: v.nqn.to_string(),
                    portals: v.portals.clone(),
                    discovery: v.discovery.clone(),
                    nsid: v.nsid,
                    device_uuid: v.device_uuid.clone(),
                    device_wwid: v.device_wwid.clone(),
                    host_nqn: v.host_nqn.as_ref().map(ToString::to_string),
                    host_id: v.host_id.as_ref().map(ToString::to_string),
                },
                v.wwid.as_ref().map(ToString::to_string),
            ),
            Volume::Fc(v) => (
                Target::Fc {
                    wwpns: v.wwpns.iter().map(ToString::to_string).collect(),
                    lun: v.lun,
                },
                v.wwid.as_ref().map(Wwid::to_multipath),
            ),
        };
        let earlier = self.store.load(id)?;
        let first = earlier.is_none();
        let mut record = match earlier {
            Some(mut r) => {
                if r.staging_path != staging
                    || !same_volume(&r.target, &target)
                    || r.access != access
                {
                    return Err(Error::AlreadyExists(format!(
                        "volume {id} is staged at {} as {:?} over {:?}; this request differs",
                        r.staging_path.display(),
                        r.access,
                        r.target
                    )));
                }
                if r.phase == Phase::Staged && self.stage_in_place(&mut r)? {
                    return Ok(());
                }
                r
            }
            None => Record {
                version: RECORD_VERSION,
                volume_id: id.to_owned(),
                staging_path: staging.clone(),
                phase: Phase::Attaching,
                target,
                access: access.clone(),
                wwid: None,
                expected_wwid,
                device: None,
                map: false,
                published: Vec::new(),
            },
        };
        // Written before anything is done, so that an unstage after a crash knows what to undo.
        record.phase = Phase::Attaching;
        self.store.save(&record)?;
        let device = match &vol {
            Volume::Iscsi(v) => {
                // A refused initiatorName, a discovery that failed on every portal, or every
                // portal's login failed (those are the errors these give then): no portal
                // has a session and nothing of the volume is on the node, so a record this
                // call made would only wait for an unstage that a CO need not send after a
                // stage that failed this way.
                let logged_in = self
                    .discover_iscsi(id, v, &mut record, deadline)
                    .and_then(|v| self.login_iscsi(id, &v, deadline).map(|()| v));
                let v = match logged_in {
                    Ok(v) => v,
                    Err(e) => {
                        if first
                            && matches!(
                                e,
                                Error::PermissionDenied(_)
                                    | Error::Program(_)
                                    | Error::FailedPrecondition(_)
                            )
                        {
                            self.store.remove(id)?;
                        }
                        return Err(e);
                    }
                };
                self.attach_iscsi(id, &v, &mut record, deadline)?
            }
            Volume::Nvme(v) => self.attach_nvme(id, v, &mut record, deadline)?,
            Volume::Fc(v) => self.attach_fc(id, v, &mut record, deadline)?,
        };
        if let (Access::Mount { fs_type }, Some(AccessType::Mount(m))) = (
            &access,
            req.volume_capability
                .as_ref()
                .and_then(|c| c.access_type.as_ref()),
        ) {
            let how = MountHow {
                fs_type,
                flags: &m.mount_flags,
                readonly,
            };
            self.mount_staging(id, &device, &staging, &how, deadline)?;
        }
        record.phase = Phase::Staged;
        self.store.save(&record)
    }

    /// Whether a staged volume is still in place: its device, found by identity, is on the
    /// node (and, for mount access, is what is mounted at the staging path). The recorded
    /// name is brought up to date when the device has another one now.
    fn stage_in_place(&self, r: &mut Record) -> Result<bool> {
        let Some(device) = self.device_of(r)? else {
            return Ok(false);
        };
        if let Access::Mount { .. } = r.access {
            match mounts::at(&r.staging_path)? {
                Some(m) if m.dev == device.dev => {}
                _ => return Ok(false),
            }
        }
        let map = r.map;
        if r.device.as_deref() != Some(node_path(self.root(), &device).as_path()) {
            self.record_device(r, &device, map)?;
        }
        Ok(true)
    }

    fn mount_staging(
        &self,
        id: &str,
        dev: &BlockNode,
        staging: &Path,
        how: &MountHow<'_>,
        deadline: Instant,
    ) -> Result<()> {
        let fs_type = how.fs_type;
        let device = dev.path.as_path();
        fs::create_dir_all(staging).map_err(io_err(format!(
            "volume {id}: create staging path {}",
            staging.display()
        )))?;
        if let Some(m) = mounts::at(staging)? {
            if m.dev == dev.dev {
                return Ok(());
            }
            return Err(Error::AlreadyExists(format!(
                "volume {id}: staging path {} has another filesystem mounted ({} {})",
                staging.display(),
                m.source.to_string_lossy(),
                m.dev
            )));
        }
        let left = || deadline.saturating_duration_since(Instant::now());
        match vfs::probe(dev, left())? {
            // A volume asked for read-only is never written, not even formatted.
            vfs::Signature::Blank if how.readonly => {
                return Err(Error::FailedPrecondition(format!(
                    "volume {id}: {} is blank and the access mode is read-only: it is not formatted",
                    device.display()
                )));
            }
            vfs::Signature::Blank => vfs::format(dev, fs_type, left()).map_err(|e| {
                Error::Program(format!("volume {id}: format {}: {e}", device.display()))
            })?,
            vfs::Signature::Filesystem(t) if t == fs_type => {}
            vfs::Signature::Filesystem(t) => {
                return Err(Error::FailedPrecondition(format!(
                    "volume {id}: {} holds a {t} filesystem, not the {fs_type} asked for; it is not formatted over",
                    device.display()
                )));
            }
            vfs::Signature::PartitionTable(t) => {
                return Err(Error::FailedPrecondition(format!(
                    "volume {id}: {} holds a {t} partition table; it is not formatted over",
                    device.display()
                )));
            }
        }
        let (mut mflags, data) = mounts::split_options(how.flags)?;
        if how.readonly {
            mflags |= rustix::mount::MountFlags::RDONLY;
        }
        mounts::mount_fs(device, staging, fs_type, mflags, &data, deadline)
            .map_err(|e| Error::Internal(format!("volume {id}: {e}")))
    }

    fn unstage(&self, id: &str, staging: &Path) -> Result<()> {
        let deadline = Instant::now() + self.config.unstage_timeout;
        let Some(mut record) = self.store.load(id)? else {
            if let Some(m) = mounts::at(staging)? {
                return Err(Error::FailedPrecondition(format!(
                    "volume {id}: this node has no record of staging it, but {} is mounted at {}; not touched",
                    m.source.to_string_lossy(),
                    staging.display()
                )));
            }
            return Ok(());
        };
        if record.staging_path != staging {
            return Err(Error::InvalidArgument(format!(
                "volume {id} is staged at {}, not at {}",
                record.staging_path.display(),
                staging.display()
            )));
        }
        if matches!(record.access, Access::Mount { .. }) {
            if let Some(m) = mounts::at(staging)? {
                // Under `--root /host` mounted with HostToContainer propagation, the node's
                // mounts show up a second time under the root: those are this same mount
                // (and the pods' publishes, which show at their own paths too), not others.
                let mirror = |p: &Path| {
                    self.root().path() != Path::new("/") && p.starts_with(self.root().path())
                };
                let elsewhere: Vec<String> = mounts::table()?
                    .into_iter()
                    .filter(|o| {
                        o.dev == m.dev && o.mount_point != m.mount_point && !mirror(&o.mount_point)
                    })
                    .map(|o| o.mount_point.display().to_string())
                    .collect();
                if !elsewhere.is_empty() {
                    return Err(Error::FailedPrecondition(format!(
                        "volume {id} is still published at {}; nothing was removed",
                        elsewhere.join(", ")
                    )));
                }
                mounts::unmount_all(staging, deadline).map_err(|e| match e {
                    Error::FailedPrecondition(m) => {
                        Error::FailedPrecondition(format!("volume {id}: {m}; nothing was removed"))
                    }
                    other => other,
                })?;
            }
            record.phase = Phase::Attaching;
            self.store.save(&record)?;
        }
        // Another volume's record names the same identity: what is on the node is that
        // volume's, and this unstage only forgets its own record. (Two such records unstaged
        // at once may both leave the devices: a leak, never a removal under the other.)
        if let Some(other) = self
            .store
            .all()?
            .into_iter()
            .find(|r| record.same_volume_as(r))
        {
            log::note(
                Level::Info,
                &format!(
                    "volume {id}: volume {} names the same volume (WWID {}); its devices are left to it",
                    other.volume_id,
                    record.known_wwid().unwrap_or("not known")
                ),
            );
            return self.store.remove(id);
        }
        // The plugin's own blkid or mkfs, left in the kernel on the device at a stage's
        // deadline, is waited for and named, never found as a user of the device.
        if crate::exec::any_abandoned() {
            if let Some(dev) = self.device_of(&record)? {
                crate::exec::wait_abandoned(&dev, deadline)?;
            }
        }
        let root = self.root();
        let others = |store: &Store| -> Result<bool> {
            Ok(store
                .all()?
                .into_iter()
                .any(|r| r.volume_id != id && r.target.same_target(&record.target)))
        };
        let what = format!("volume {id}: detach {}", record.target.describe());
        let mut opts = DetachOptions::new(root);
        opts.timeout = deadline.saturating_duration_since(Instant::now());
        match &record.target {
            Target::Iscsi {
                iqn,
                portals,
                iface,
                lun,
                discovered,
            } => {
                // By identity whenever it is known: the address may hold another volume now.
                let spec = match record.known_wwid().map(str::parse) {
                    Some(Ok(w)) => VolumeSpec::Wwid(w),
                    _ => VolumeSpec::Iscsi {
                        target: iqn.clone(),
                        lun: *lun,
                    },
                };
                detach_recorded(root, &spec, &opts).map_err(|e| Error::lunkit(what.clone(), e))?;
                let lock = self.target_lock(iqn);
                let _g = lock.lock().unwrap_or_else(|p| p.into_inner());
                if !others(&self.store)? {
                    let mut all = portals.clone();
                    all.extend(discovered.iter().filter(|p| !portals.contains(p)).cloned());
                    let nodes = &self.config.iscsi_nodes;
                    iscsi::logout_unused(root, nodes, iqn, &all, iface.as_deref(), deadline)
                        .map_err(|e| Error::Program(format!("volume {id}: logout: {e}")))?;
                }
                // Gone from the records before the lock is let go: two volumes of one target
                // unstaged together must not each see the other's record and both skip the
                // logout.
                self.store.remove(id)?;
            }
            // No session to log out of: the HBAs' logins to the fabric are nobody's to end.
            Target::Fc { wwpns, lun } => {
                // By identity whenever it is known: the address may hold another volume now.
                let spec = match record.known_wwid().map(str::parse) {
                    Some(Ok(w)) => VolumeSpec::Wwid(w),
                    _ => VolumeSpec::Fc {
                        wwpns: wwpns
                            .iter()
                            .map(|w| w.parse())
                            .collect::<lunkit::Result<_>>()
                            .map_err(|e| Error::lunkit(format!("volume {id}: its record"), e))?,
                        lun: *lun,
                    },
                };
                detach_recorded(root, &spec, &opts).map_err(|e| Error::lunkit(what.clone(), e))?;
            }
            Target::Nvme { nqn, nsid, .. } => {
                let nqn: lunkit::Nqn = nqn.parse().map_err(|e| Error::lunkit(what.clone(), e))?;
                match nsid {
                    // Deletes the controllers no other attached or used namespace needs.
                    Some(n) if self.nsid_reassigned(&record, &nqn, *n)? => log::note(
                        Level::Warn,
                        &format!(
                            "volume {id}: namespace {n} of {nqn} reports another identity than its WWID {}; left as it is",
                            record.wwid.as_deref().unwrap_or("")
                        ),
                    ),
                    Some(n) => {
                        let spec = VolumeSpec::Nvme {
                            nqn,
                            namespace: NamespaceSelector::Id(*n),
                        };
                        detach_recorded(root, &spec, &opts)
                            .map_err(|e| Error::lunkit(what.clone(), e))?;
                    }
                    // Stopped before the namespace was found: only connections may be left.
                    None => {
                        let lock = self.target_lock(&nqn.to_string());
                        let _g = lock.lock().unwrap_or_else(|p| p.into_inner());
                        // The lock lunkit's attach, detach and discovery followers take on
                        // the subsystem: no follower connects a path while this decides.
                        let _subsystem = lunkit::ops::lock::lock(
                            &lunkit::ops::nvme::subsystem_lock_key(&nqn),
                            opts.lock_dir.as_deref(),
                            Instant::now() + opts.timeout,
                        )
                        .map_err(|e| Error::lunkit(what.clone(), e))?;
                        if !others(&self.store)? {
                            let mut d = lunkit::nvme::DisconnectOptions::default();
                            d.timeout = opts.timeout;
                            lunkit::nvme::disconnect(root, &nqn, &d)
                                .map_err(|e| Error::lunkit(what.clone(), e))?;
                        }
                        self.store.remove(id)?;
                    }
                }
            }
        }
        // Idempotent: the branches above that decide on a logout removed it under the lock.
        self.store.remove(id)
    }

    /// Whether namespace `nsid` of `nqn` is on the node with another identity than the WWID
    /// `record` saw at stage: the target gave the nsid to another namespace since, and
    /// detaching "namespace `nsid`" would take that one.
    fn nsid_reassigned(&self, record: &Record, nqn: &lunkit::Nqn, nsid: u32) -> Result<bool> {
        let Some(ours) = record.wwid.as_deref() else {
            return Ok(false);
        };
        let what = format!("volume {}: find {nqn} namespace {nsid}", record.volume_id);
        Ok(lunkit::nvme::namespace_devices(self.root(), nqn)
            .map_err(|e| Error::lunkit(what, e))?
            .into_iter()
            .filter(|(ns, _)| ns.nsid == Some(nsid))
            .any(|(_, d)| d.wwid.as_ref().is_some_and(|w| w.to_string() != ours)))
    }

    fn staged(&self, id: &str, call: &str) -> Result<Record> {
        match self.store.load(id)? {
            Some(r) if r.phase == Phase::Staged => Ok(r),
            _ => Err(Error::FailedPrecondition(format!(
                "{call}: volume {id} is not staged on this node"
            ))),
        }
    }

    /// Publishes the staged volume of `req` at its target path, a bind with the per-mount
    /// flags `want` (`RDONLY` for a read-only publish) added to the staging mount's own.
    fn publish(
        &self,
        req: &NodePublishVolumeRequest,
        block: bool,
        want: rustix::mount::MountFlags,
    ) -> Result<()> {
        let id = req.volume_id.as_str();
        let readonly = want.contains(rustix::mount::MountFlags::RDONLY);
        let record = self.staged(id, "NodePublishVolume")?;
        if record.staging_path != Path::new(&req.staging_target_path) {
            return Err(Error::FailedPrecondition(format!(
                "volume {id} is staged at {}, not at {}",
                record.staging_path.display(),
                req.staging_target_path
            )));
        }
        if block != matches!(record.access, Access::Block) {
            return Err(Error::InvalidArgument(format!(
                "volume {id} was staged for {:?} access, and is published for {} access",
                record.access,
                if block { "block" } else { "mount" }
            )));
        }
        let target = Path::new(&req.target_path);
        // The device found by identity now, whatever name the record has: a reboot may
        // have given that name to another disk.
        let device = self.device_now(&record, "NodePublishVolume")?;
        let source = if block {
            device.path.clone()
        } else {
            match mounts::at(&record.staging_path)? {
                Some(m) if m.dev == device.dev => record.staging_path.clone(),
                _ => {
                    return Err(Error::FailedPrecondition(format!(
                        "volume {id}: its device {} is not what is mounted at the staging path {}; stage it again",
                        node_path(self.root(), &device).display(),
                        record.staging_path.display()
                    )));
                }
            }
        };
        if let Some(m) = mounts::at(target)? {
            // Published here already: the same source is success, another is a conflict.
            let same = if block {
                rdev_of(target) == Some(device.dev)
            } else {
                m.dev == device.dev
            };
            if !same {
                return Err(Error::AlreadyExists(format!(
                    "volume {id}: {} has something else mounted ({})",
                    target.display(),
                    m.source.to_string_lossy()
                )));
            }
            let was_readonly = m.options.split(',').any(|o| o == "ro");
            if was_readonly != readonly {
                return Err(Error::AlreadyExists(format!(
                    "volume {id}: published at {} {}, and this request asks for {}",
                    target.display(),
                    if was_readonly {
                        "read-only"
                    } else {
                        "read-write"
                    },
                    if readonly { "read-only" } else { "read-write" }
                )));
            }
            // Published by a plugin that did not record its publishes yet, or whose save
            // failed: recorded now.
            return self.remember_published(record, target);
        }
        if block {
            if let Some(parent) = target.parent() {
                fs::create_dir_all(parent)
                    .map_err(io_err(format!("volume {id}: create {}", parent.display())))?;
            }
            fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .open(target)
                .map_err(io_err(format!("volume {id}: create {}", target.display())))?;
        } else {
            fs::create_dir_all(target)
                .map_err(io_err(format!("volume {id}: create {}", target.display())))?;
        }
        let scratch = self.config.state_dir.join(SCRATCH);
        mounts::bind(&source, target, want, &scratch, self.mount_deadline())
            .map_err(|e| Error::Internal(format!("volume {id}: {e}")))?;
        self.remember_published(record, target)
    }

    /// Adds `target` to the published paths of `record` (the background doctor looks at
    /// them: [`crate::stale`]), unless it is there already.
    fn remember_published(&self, mut record: Record, target: &Path) -> Result<()> {
        if record.published.iter().any(|p| p == target) {
            return Ok(());
        }
        record.published.push(target.to_owned());
        self.store.save(&record)
    }

    /// Unpublishes volume `id` at `target`: only a path its record lists as published, or one
    /// that holds a publish of this very volume all the same ([`Self::unlisted_publish`]).
    /// Any other path is one the volume is not published at, which the spec answers with
    /// success: whatever is there (another volume's mount, a pod's files, a directory) is not
    /// this plugin's, and is left as it is.
    fn unpublish(&self, id: &str, target: &Path) -> Result<()> {
        // The record says which paths are ours: one that cannot be read is an error, not a
        // licence to remove whatever path the call names.
        let record = self.store.load(id)?;
        let listed = record
            .as_ref()
            .is_some_and(|r| r.published.iter().any(|p| p == target));
        if !listed && !self.unlisted_publish(record.as_ref(), target)? {
            if let Ok(Some(m)) = mounts::at(target) {
                log::note(
                    Level::Warn,
                    &format!(
                        "NodeUnpublishVolume: volume {id} is not published at {}, where {} is \
                         mounted: left as it is",
                        target.display(),
                        m.source.to_string_lossy()
                    ),
                );
            }
            return Ok(());
        }
        mounts::unmount_all(target, self.mount_deadline()).map_err(|e| match e {
            Error::FailedPrecondition(m) => Error::FailedPrecondition(format!("volume {id}: {m}")),
            other => Error::Internal(format!("volume {id}: {other}")),
        })?;
        let removed = match fs::symlink_metadata(target) {
            Ok(md) if md.is_dir() => fs::remove_dir(target),
            Ok(_) => fs::remove_file(target),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        };
        removed.map_err(io_err(format!("volume {id}: remove {}", target.display())))?;
        // Forgotten once nothing is there.
        if let Some(mut record) = record.filter(|_| listed) {
            record.published.retain(|p| p != target);
            self.store.save(&record)?;
        }
        Ok(())
    }

    /// Whether `target`, which `record` does not list, holds a publish of its volume all the
    /// same: one made by a plugin that did not record its publishes yet, or whose record was
    /// not saved after the bind. Proven by what is mounted there: a bind of the staging mount
    /// (the same filesystem), or of the volume's device node as found by identity now.
    fn unlisted_publish(&self, record: Option<&Record>, target: &Path) -> Result<bool> {
        let Some(record) = record else {
            return Ok(false);
        };
        let Some(m) = mounts::at(target)? else {
            return Ok(false);
        };
        Ok(match record.access {
            Access::Block => self
                .device_now(record, "NodeUnpublishVolume")
                .is_ok_and(|d| rdev_of(target) == Some(d.dev)),
            Access::Mount { .. } => {
                mounts::at(&record.staging_path)?.is_some_and(|s| s.dev == m.dev)
            }
        })
    }

    fn stats(&self, id: &str, path: &Path) -> Result<NodeGetVolumeStatsResponse> {
        if !path.exists() {
            return Err(Error::NotFound(format!(
                "volume {id}: volume path {} does not exist",
                path.display()
            )));
        }
        let record = self
            .store
            .load(id)?
            .ok_or_else(|| Error::NotFound(format!("volume {id} is not staged on this node")))?;
        let device = self.device_now(&record, "NodeGetVolumeStats")?;
        self.check_volume_path(&record, &device, path)?;
        let mut usage = Vec::new();
        match record.access {
            Access::Mount { .. } => {
                let st = rustix::fs::statvfs(path).map_err(|e| {
                    Error::Internal(format!("volume {id}: statvfs {}: {e}", path.display()))
                })?;
                let frsize = st.f_frsize;
                let clamp = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
                usage.push(VolumeUsage {
                    total: clamp(st.f_blocks.saturating_mul(frsize)),
                    available: clamp(st.f_bavail.saturating_mul(frsize)),
                    used: clamp(
                        st.f_blocks
                            .saturating_sub(st.f_bfree)
                            .saturating_mul(frsize),
                    ),
                    unit: volume_usage::Unit::Bytes as i32,
                });
                usage.push(VolumeUsage {
                    total: clamp(st.f_files),
                    available: clamp(st.f_favail),
                    used: clamp(st.f_files.saturating_sub(st.f_ffree)),
                    unit: volume_usage::Unit::Inodes as i32,
                });
            }
            Access::Block => {
                let size = lunkit::block::size(&device)
                    .map_err(|e| Error::lunkit(format!("volume {id}: size of {device}"), e))?;
                usage.push(VolumeUsage {
                    total: i64::try_from(size).unwrap_or(i64::MAX),
                    available: 0,
                    used: 0,
                    unit: volume_usage::Unit::Bytes as i32,
                });
            }
        }
        Ok(NodeGetVolumeStatsResponse {
            usage,
            volume_condition: Some(self.condition(&record)),
        })
    }

    /// Checks that `path` is where the volume is: the staging path, a mount of its
    /// filesystem, or its device node (raw block); `NOT_FOUND` otherwise.
    fn check_volume_path(&self, record: &Record, device: &BlockNode, path: &Path) -> Result<()> {
        if path == record.staging_path {
            return Ok(());
        }
        let ok = match record.access {
            Access::Mount { .. } => mounts::at(path)?.is_some_and(|m| m.dev == device.dev),
            Access::Block => rdev_of(path) == Some(device.dev),
        };
        if ok {
            return Ok(());
        }
        Err(Error::NotFound(format!(
            "volume {}: {} is not where the volume is (its device is {}, staged at {})",
            record.volume_id,
            path.display(),
            node_path(self.root(), device).display(),
            record.staging_path.display()
        )))
    }

    /// Abnormal when a path is not running, or no path is left.
    fn condition(&self, record: &Record) -> VolumeCondition {
        let abnormal = |message: String| VolumeCondition {
            abnormal: true,
            message,
        };
        let root = self.root();
        if let Target::Nvme { nqn, .. } = &record.target {
            let controllers = nqn
                .parse::<lunkit::Nqn>()
                .and_then(|n| lunkit::nvme::controllers_of(root, &n));
            return match controllers {
                Err(e) => abnormal(format!("cannot look at the subsystem's controllers: {e}")),
                Ok(c) if c.is_empty() => abnormal("no controller of the subsystem is left".into()),
                Ok(c) => {
                    let down: Vec<String> = c
                        .iter()
                        .filter(|c| c.parsed_state != Some(CtrlState::Live))
                        .map(|c| {
                            format!("{} is {}", c.name, c.state.as_deref().unwrap_or("unknown"))
                        })
                        .collect();
                    if down.is_empty() {
                        VolumeCondition {
                            abnormal: false,
                            message: format!("{} controllers live", c.len()),
                        }
                    } else {
                        abnormal(format!("controller {}", down.join(", ")))
                    }
                }
            };
        }
        let Some(Ok(wwid)) = record.wwid.as_deref().map(str::parse) else {
            return abnormal("the volume's WWID is not known".into());
        };
        let state = ops::volume::identify(root, &VolumeSpec::Wwid(wwid))
            .and_then(|id| ops::volume::locate(root, &id));
        match state {
            Err(e) => abnormal(format!("cannot look at the volume's paths: {e}")),
            Ok(s) if s.paths.is_empty() => abnormal("no path of the volume is left".into()),
            Ok(s) => {
                let down: Vec<String> = s
                    .paths
                    .iter()
                    .filter(|p| p.state != Some(ScsiState::Running))
                    .map(|p| {
                        let state = p.state.as_ref().map_or("unknown", ScsiState::as_str);
                        format!("{} is {state}", p.hctl)
                    })
                    .collect();
                if down.is_empty() {
                    VolumeCondition {
                        abnormal: false,
                        message: format!("{} paths running", s.paths.len()),
                    }
                } else {
                    abnormal(format!("path {}", down.join(", ")))
                }
            }
        }
    }

    fn expand(&self, id: &str, path: &Path, required: i64) -> Result<i64> {
        let record = match self.store.load(id)? {
            None => {
                return Err(Error::NotFound(format!(
                    "NodeExpandVolume: volume {id} is not known on this node"
                )));
            }
            Some(r) if r.phase != Phase::Staged => {
                return Err(Error::FailedPrecondition(format!(
                    "NodeExpandVolume: volume {id} is not staged on this node (its stage did not finish)"
                )));
            }
            Some(r) => r,
        };
        let device = self.device_now(&record, "NodeExpandVolume")?;
        self.check_volume_path(&record, &device, path)?;
        let size = lunkit::block::size(&device)
            .map_err(|e| Error::lunkit(format!("volume {id}: size of {device}"), e))?;
        let clamp = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        // Nothing asked, or the device is that large already: no rescan, no wait. A
        // filesystem smaller than its device (an earlier expand cut short) is still grown.
        if required == 0 || u64::try_from(required).is_ok_and(|r| r <= size) {
            self.grow_fs(&record, &device, path)?;
            return Ok(clamp(size));
        }
        let spec = match (&record.target, record.wwid.as_deref().map(str::parse)) {
            // The namespace by its id: its controllers say what it is now.
            (Target::Nvme { nqn, nsid, .. }, _) => {
                let nsid = nsid.ok_or_else(|| {
                    Error::FailedPrecondition(format!(
                        "volume {id}: its namespace id is not known (stage did not finish)"
                    ))
                })?;
                VolumeSpec::Nvme {
                    nqn: nqn
                        .parse()
                        .map_err(|e| Error::lunkit(format!("volume {id}: its record"), e))?,
                    namespace: NamespaceSelector::Id(nsid),
                }
            }
            (_, Some(Ok(w))) => VolumeSpec::Wwid(w),
            _ => {
                return Err(Error::FailedPrecondition(format!(
                    "volume {id}: its WWID is not known"
                )));
            }
        };
        let root = self.root();
        let mut opts = ResizeOptions::new(root);
        if required > 0 {
            opts.expect_size = u64::try_from(required).ok();
        }
        let resized = ops::resize(root, &spec, &opts)
            .map_err(|e| Error::lunkit(format!("volume {id}: resize"), e))?;
        self.grow_fs(&record, &device, path)?;
        Ok(clamp(resized.size()))
    }

    /// Grows a mounted filesystem volume's filesystem to its device (nothing for raw block).
    fn grow_fs(&self, record: &Record, device: &BlockNode, path: &Path) -> Result<()> {
        let Access::Mount { fs_type } = &record.access else {
            return Ok(());
        };
        vfs::grow(&device.path, path, fs_type, self.config.stage_timeout).map_err(|e| {
            Error::Program(format!(
                "volume {}: grow the filesystem: {e}",
                record.volume_id
            ))
        })
    }
}

type Reply<T> = std::result::Result<Response<T>, Status>;

#[tonic::async_trait]
impl Node for NodeService {
    async fn node_stage_volume(
        &self,
        request: Request<NodeStageVolumeRequest>,
    ) -> Reply<NodeStageVolumeResponse> {
        const CALL: &str = "NodeStageVolume";
        let req = request.into_inner();
        let id = required(&req.volume_id, "volume_id", CALL)?.to_owned();
        required(&req.staging_target_path, "staging_target_path", CALL)?;
        let (access, mode) = capability(req.volume_capability.as_ref(), CALL, &id)?;
        let readonly = matches!(mode, Mode::SingleNodeReaderOnly | Mode::MultiNodeReaderOnly);
        let access = match access {
            AccessType::Block(_) => Access::Block,
            AccessType::Mount(m) => Access::Mount {
                fs_type: fs_type_of(m)?,
            },
        };
        let vol = attrs::parse(&id, &req.volume_context, &req.secrets)?;
        let slot = self.slot(&id)?;
        self.blocking(CALL, slot, move |inner| {
            let staged = inner.stage(&req, vol, access, readonly);
            inner.follow();
            staged
        })
        .await?;
        Ok(Response::new(NodeStageVolumeResponse {}))
    }

    async fn node_unstage_volume(
        &self,
        request: Request<NodeUnstageVolumeRequest>,
    ) -> Reply<NodeUnstageVolumeResponse> {
        const CALL: &str = "NodeUnstageVolume";
        let req = request.into_inner();
        let id = required(&req.volume_id, "volume_id", CALL)?.to_owned();
        let staging = PathBuf::from(required(
            &req.staging_target_path,
            "staging_target_path",
            CALL,
        )?);
        let slot = self.slot(&id)?;
        self.blocking(CALL, slot, move |inner| {
            let unstaged = inner.unstage(&id, &staging);
            inner.follow();
            unstaged
        })
        .await?;
        Ok(Response::new(NodeUnstageVolumeResponse {}))
    }

    async fn node_publish_volume(
        &self,
        request: Request<NodePublishVolumeRequest>,
    ) -> Reply<NodePublishVolumeResponse> {
        const CALL: &str = "NodePublishVolume";
        let req = request.into_inner();
        let id = required(&req.volume_id, "volume_id", CALL)?.to_owned();
        required(&req.staging_target_path, "staging_target_path", CALL)?;
        required(&req.target_path, "target_path", CALL)?;
        let (access, mode) = capability(req.volume_capability.as_ref(), CALL, &id)?;
        let block = matches!(access, AccessType::Block(_));
        // The publish's mount options: their per-mount flags go on the bind; the rest (the
        // filesystem's own options) the stage's mount applied, from the same list.
        let mut want = match access {
            AccessType::Mount(m) => mounts::split_options(&m.mount_flags)?.0 & mounts::PER_MOUNT,
            AccessType::Block(_) => rustix::mount::MountFlags::empty(),
        };
        if req.readonly || matches!(mode, Mode::SingleNodeReaderOnly | Mode::MultiNodeReaderOnly) {
            want |= rustix::mount::MountFlags::RDONLY;
        }
        let slot = self.slot(&id)?;
        self.blocking(CALL, slot, move |inner| inner.publish(&req, block, want))
            .await?;
        Ok(Response::new(NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<NodeUnpublishVolumeRequest>,
    ) -> Reply<NodeUnpublishVolumeResponse> {
        const CALL: &str = "NodeUnpublishVolume";
        let req = request.into_inner();
        let id = required(&req.volume_id, "volume_id", CALL)?.to_owned();
        let target = PathBuf::from(required(&req.target_path, "target_path", CALL)?);
        let slot = self.slot(&id)?;
        self.blocking(CALL, slot, move |inner| inner.unpublish(&id, &target))
            .await?;
        Ok(Response::new(NodeUnpublishVolumeResponse {}))
    }

    async fn node_get_volume_stats(
        &self,
        request: Request<NodeGetVolumeStatsRequest>,
    ) -> Reply<NodeGetVolumeStatsResponse> {
        const CALL: &str = "NodeGetVolumeStats";
        let req = request.into_inner();
        let id = required(&req.volume_id, "volume_id", CALL)?.to_owned();
        let path = PathBuf::from(required(&req.volume_path, "volume_path", CALL)?);
        // Stats take no slot: they change nothing and must not make a stage or unstage abort.
        let inner = self.inner.clone();
        let r = tokio::task::spawn_blocking(move || inner.stats(&id, &path))
            .await
            .map_err(|e| Status::internal(format!("the worker failed: {e}")))??;
        Ok(Response::new(r))
    }

    async fn node_expand_volume(
        &self,
        request: Request<NodeExpandVolumeRequest>,
    ) -> Reply<NodeExpandVolumeResponse> {
        const CALL: &str = "NodeExpandVolume";
        let req = request.into_inner();
        let id = required(&req.volume_id, "volume_id", CALL)?.to_owned();
        let path = PathBuf::from(required(&req.volume_path, "volume_path", CALL)?);
        let want = req.capacity_range.map_or(0, |c| c.required_bytes);
        if want < 0 {
            return Err(Error::InvalidArgument(format!(
                "{CALL}: volume {id}: required_bytes is negative"
            ))
            .into());
        }
        let slot = self.slot(&id)?;
        let capacity_bytes = self
            .blocking(CALL, slot, move |inner| inner.expand(&id, &path, want))
            .await?;
        Ok(Response::new(NodeExpandVolumeResponse { capacity_bytes }))
    }

    async fn node_get_capabilities(
        &self,
        _: Request<NodeGetCapabilitiesRequest>,
    ) -> Reply<NodeGetCapabilitiesResponse> {
        use node_service_capability::{Rpc, Type, rpc::Type as T};
        let capabilities = [
            T::StageUnstageVolume,
            T::GetVolumeStats,
            T::ExpandVolume,
            T::VolumeCondition,
        ]
        .into_iter()
        .map(|t| NodeServiceCapability {
            r#type: Some(Type::Rpc(Rpc { r#type: t as i32 })),
        })
        .collect();
        Ok(Response::new(NodeGetCapabilitiesResponse { capabilities }))
    }

    async fn node_get_info(&self, _: Request<NodeGetInfoRequest>) -> Reply<NodeGetInfoResponse> {
        Ok(Response::new(NodeGetInfoResponse {
            node_id: self.inner.config.node_id.clone(),
            max_volumes_per_node: self.inner.config.max_volumes,
            // Where the node is, when the operator said; without it the CO may take the node
            // to reach every volume (the spec's reading of an absent topology).
            accessible_topology: (!self.inner.config.topology.is_empty()).then(|| Topology {
                segments: self.inner.config.topology.clone().into_iter().collect(),
            }),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::{identity_selector, names_namespace};
    use lunkit::ops::NamespaceSelector;

    fn namespace() -> lunkit::NvmeNamespace {
        lunkit::NvmeNamespace {
            name: "nvme0n1".into(),
            nsid: Some(1),
            wwid: Some("uuid.58668891-c3e4-45d0-b90e-824525c16080".into()),
            uuid: Some("58668891-c3e4-45d0-b90e-824525c16080".into()),
            nguid: Some("00000000-0000-0000-0042-aa42aa42aa42".into()),
            eui: Some("00 00 00 00 00 00 00 00".into()),
            size_bytes: None,
            paths: Vec::new(),
        }
    }

    #[test]
    fn a_namespace_is_named_by_its_uuid_its_wwid_or_its_nguid() {
        let ns = namespace();
        let uuid = "58668891-c3e4-45d0-b90e-824525c16080";
        assert!(names_namespace(Some(uuid), None, &ns));
        assert!(names_namespace(None, Some(&format!("uuid.{uuid}")), &ns));
        // The kernel's wwid is the UUID form, and the NGUID still names it (deviceEUI).
        assert!(names_namespace(
            None,
            Some("eui.00000000000000000042aa42aa42aa42"),
            &ns
        ));
        assert!(!names_namespace(
            None,
            Some("eui.00000000000000000042aa42aa42aa43"),
            &ns
        ));
        // An all-zero EUI-64 is "not reported", never an identity.
        assert!(!names_namespace(None, Some("eui.0000000000000000"), &ns));
        assert!(!names_namespace(
            Some("58668891-c3e4-45d0-b90e-824525c16081"),
            None,
            &ns
        ));
        assert!(names_namespace(None, None, &ns));
    }

    #[test]
    fn each_identity_form_is_a_lunkit_selector() {
        let ns = namespace();
        let uuid = "58668891-c3e4-45d0-b90e-824525c16080";
        assert_eq!(
            identity_selector(Some(uuid), None),
            Some(NamespaceSelector::Uuid(uuid.parse().unwrap()))
        );
        assert_eq!(
            identity_selector(None, Some("eui.00000000000000000042aa42aa42aa42")),
            Some(NamespaceSelector::Nguid(
                "00000000000000000042aa42aa42aa42".parse().unwrap()
            ))
        );
        // An EUI-64 is found by the namespace's `eui`, even though its `wwid` is the UUID.
        let mut with_eui = namespace();
        with_eui.eui = Some("00 25 38 5b 71 b0 e7 a1".into());
        let eui = identity_selector(None, Some("eui.0025385b71b0e7a1")).unwrap();
        assert_eq!(
            eui,
            NamespaceSelector::Eui64("0025385b71b0e7a1".parse().unwrap())
        );
        assert!(eui.matches(&with_eui) && !eui.matches(&ns));
        assert!(names_namespace(
            None,
            Some("eui.0025385b71b0e7a1"),
            &with_eui
        ));
        // The kernel's own name for a namespace without ids carries its nsid; the rest of it
        // (vendor, serial, model) is checked against the namespace's `wwid`.
        let synthesized = "nvme.1b36-6465616462656566-51454d55-00000002";
        assert_eq!(
            identity_selector(None, Some(synthesized)),
            Some(NamespaceSelector::Id(2))
        );
        let mut plain = namespace();
        plain.nsid = Some(2);
        plain.wwid = Some(synthesized.into());
        assert!(names_namespace(None, Some(synthesized), &plain));
        plain.wwid = Some("nvme.1b36-6465616462656567-51454d55-00000002".into());
        assert!(
            !names_namespace(None, Some(synthesized), &plain),
            "another subsystem's namespace 2"
        );
        assert_eq!(identity_selector(None, Some("nvme.1b36-00")), None);
        assert_eq!(identity_selector(None, None), None);
    }
}

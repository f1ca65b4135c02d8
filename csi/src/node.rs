//! The Node service: staging, publishing, stats and expansion of iSCSI volumes.
//!
//! Every call checks its arguments first (`INVALID_ARGUMENT` naming what is missing), then
//! takes the volume's in-flight slot (a second call on the same volume while one runs is
//! `ABORTED`, as the spec recommends), then does its blocking work on tokio's blocking pool.
//! Every call is idempotent: repeating it after success, or after a crash part way, converges.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lunkit::Root;
use lunkit::block::BlockNode;
use tonic::{Request, Response, Status};

use crate::attrs::{self};
use crate::error::{Error, Result};
use crate::follow::Followers;
use crate::log::{self};
use crate::probe::{Checks, Transport};
use crate::proto::node_server::Node;
use crate::proto::volume_capability::access_mode::Mode;
use crate::proto::volume_capability::{AccessType, MountVolume};
use crate::proto::*;
use crate::state::{Access, Phase, Record, Store, Target};
use crate::{fs as vfs, mounts, paths};

pub(crate) mod device;
mod publish;
mod stage;
pub(crate) mod volume;

pub(crate) use device::{device_of, presence, rdev_of};

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

/// How long a stats or expand call waits for the device's size ([`Inner::query_deadline`]).
const QUERY_TIMEOUT: Duration = Duration::from_secs(10);

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

/// The service's state, shared by its calls. Each transport's module (`crate::iscsi`,
/// `crate::fc`, `crate::nvme`) adds its stage and unstage steps to it, so that this file
/// holds only what every transport shares.
#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) config: Config,
    pub(crate) store: Store,
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
pub(crate) struct MountHow<'a> {
    fs_type: &'a str,
    flags: &'a [String],
    /// A read-only access mode: mounted read-only, and a blank device is not formatted.
    readonly: bool,
}

pub(crate) fn io_err(what: String) -> impl FnOnce(std::io::Error) -> Error {
    move |e| Error::Internal(format!("{what}: {e}"))
}

/// The node path of `device` (`/dev/dm-3`), as records keep it: see [`paths`].
pub(crate) fn node_path(root: &Root, device: &BlockNode) -> PathBuf {
    paths::to_node(root, &device.path)
        .unwrap_or_else(|| PathBuf::from(format!("/dev/{}", device.name)))
}

/// `e` with `what` (`volume pv-1: attach …`) before its message.
pub(crate) fn prefix(what: &str, e: Error) -> Error {
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
    pub(crate) fn follow(&self) {
        if let Some(f) = &self.followers {
            f.notify();
        }
    }

    pub(crate) fn target_lock(&self, iqn: &str) -> Arc<Mutex<()>> {
        let mut t = self.targets.lock().unwrap_or_else(|p| p.into_inner());
        t.entry(iqn.to_owned()).or_default().clone()
    }

    pub(crate) fn root(&self) -> &Root {
        &self.config.root
    }

    /// The deadline of a publish's or unpublish's mount call: a stage's time, from now.
    pub(crate) fn mount_deadline(&self) -> Instant {
        Instant::now() + self.config.stage_timeout
    }

    /// The deadline of a stats or expand call's look at the device (its size): a few
    /// seconds, since kubelet asks for stats of every volume every minute and a device
    /// whose open is stuck behind a partition scan must not hold a call, or a thread, for
    /// longer than that; the call answers `DEADLINE_EXCEEDED` and kubelet asks again.
    pub(crate) fn query_deadline(&self) -> Instant {
        Instant::now() + QUERY_TIMEOUT.min(self.config.stage_timeout)
    }

    /// Records the device handed out (its node path: see [`paths`]) and whether it is
    /// multipathd's map.
    pub(crate) fn record_device(
        &self,
        record: &mut Record,
        device: &BlockNode,
        map: bool,
    ) -> Result<()> {
        record.device = Some(node_path(self.root(), device));
        record.map = map;
        self.store.save(record)
    }

    /// The volume's device now, found by its identity: see [`device_of`].
    pub(crate) fn device_of(&self, record: &Record) -> Result<Option<BlockNode>> {
        device_of(self.root(), record)
    }

    /// [`device_of`](Self::device_of), or `NOT_FOUND` naming the volume's identity when no
    /// device of it is on the node; `FAILED_PRECONDITION` when the record has no identity
    /// to look for (its stage never learned one).
    pub(crate) fn device_now(&self, record: &Record, call: &str) -> Result<BlockNode> {
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

    pub(crate) fn staged(&self, id: &str, call: &str) -> Result<Record> {
        match self.store.load(id)? {
            Some(r) if r.phase == Phase::Staged => Ok(r),
            _ => Err(Error::FailedPrecondition(format!(
                "{call}: volume {id} is not staged on this node"
            ))),
        }
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

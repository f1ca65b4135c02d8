//! NodeStageVolume and NodeUnstageVolume: the record written before anything is done, the
//! transport's attach or detach (each in its own module), and the staging mount.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

use lunkit::block::BlockNode;
use lunkit::ops::{BeforeRemoval, DetachOptions, VolumeState};

use super::{Inner, MountHow, io_err, node_path};
use crate::attrs::Volume;
use crate::error::{Error, Result};
use crate::fence::Release;
use crate::log::{self, Level};
use crate::node::device::same_volume;
use crate::proto::volume_capability::AccessType;
use crate::proto::*;
use crate::state::{Access, Phase, RECORD_VERSION, Record, Target};
use crate::{fs as vfs, mounts};

impl Inner {
    pub(crate) fn stage(
        &self,
        req: &NodeStageVolumeRequest,
        vol: Volume,
        access: Access,
        readonly: bool,
    ) -> Result<()> {
        let id = req.volume_id.as_str();
        let staging = PathBuf::from(&req.staging_target_path);
        let deadline = Instant::now() + self.config.stage_timeout;
        let (mut target, expected_wwid) = match &vol {
            Volume::Iscsi(v) => crate::iscsi::target_of(v),
            Volume::Nvme(v) => crate::nvme::target_of(v),
            Volume::Fc(v) => crate::fc::target_of(v),
        };
        let fencing = crate::fence::wanted(self.root(), &vol, req)?;
        target.set_fence(fencing.as_ref().map(|(f, _)| f.clone()));
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
                if let Some((f, _)) = &fencing {
                    r.target.set_fence(Some(f.clone()));
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
            Volume::Iscsi(v) => self.stage_iscsi(id, v, &mut record, first, deadline)?,
            Volume::Nvme(v) => self.attach_nvme(id, v, &mut record, deadline)?,
            Volume::Fc(v) => self.attach_fc(id, v, &mut record, deadline)?,
        };
        let registered = match fencing {
            Some((_, preempt)) => self
                .fence_stage(&record, &device, preempt, deadline)
                .map_err(|e| self.fence_refused(id, &staging, e))?,
            None => Vec::new(),
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
        self.store.save(&record)?;
        // A path that joined after the fencing's registrations and before the record said
        // `Staged` was passed over by the joining paths' thread: registered here.
        if record.target.fence().is_some() {
            crate::fence_join::after_stage(self.root(), &record, &registered, deadline);
        }
        Ok(())
    }

    /// Whether a staged volume is still in place: its device, found by identity, is on the
    /// node (and, for mount access, is what is mounted at the staging path). The recorded
    /// name is brought up to date when the device has another one now.
    pub(crate) fn stage_in_place(&self, r: &mut Record) -> Result<bool> {
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

    pub(crate) fn mount_staging(
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

    pub(crate) fn unstage(&self, id: &str, staging: &Path) -> Result<()> {
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
        self.take_off(&record, deadline)?;
        // Idempotent: the branches above that decide on a logout removed it under the lock.
        self.store.remove(id)
    }

    /// The detach of an unstage, by transport; a fenced volume's reservation is released and
    /// its key unregistered inside it, after its in-use check and before its devices go.
    fn take_off(&self, record: &Record, deadline: Instant) -> Result<()> {
        let id = record.volume_id.as_str();
        let mut release = Release::of(record, deadline)?;
        let fenced = release.is_some();
        let mut step = |v: &VolumeState| release.as_mut().map_or(Ok(()), |r| r.step(v));
        let before: Option<&mut BeforeRemoval<'_>> = fenced.then_some(&mut step);
        let what = format!("volume {id}: detach {}", record.target.describe());
        let mut opts = DetachOptions::new(self.root());
        opts.timeout = deadline.saturating_duration_since(Instant::now());
        let detached = match &record.target {
            Target::Iscsi { .. } => self.unstage_iscsi(record, &opts, &what, deadline, before),
            Target::Fc { .. } => crate::fc::unstage(self.root(), record, &opts, &what, before),
            Target::Nvme { .. } => self.unstage_nvme(record, &opts, &what),
        };
        detached.map_err(|e| match release.as_mut() {
            Some(r) => r.error(e),
            None => e,
        })
    }

    /// Whether another volume's record names the same target as `record` (its sessions or
    /// controllers are still needed). Asked under the target's lock.
    pub(crate) fn others_on_target(&self, record: &Record) -> Result<bool> {
        Ok(self
            .store
            .all()?
            .into_iter()
            .any(|r| r.volume_id != record.volume_id && r.target.same_target(&record.target)))
    }
}

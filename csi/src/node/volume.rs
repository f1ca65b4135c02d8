//! NodeGetVolumeStats and NodeExpandVolume: the volume's device found by identity, its
//! condition, and growing it and its filesystem.

use std::path::Path;

use lunkit::block::BlockNode;
use lunkit::ops::{self, NamespaceSelector, ResizeOptions, VolumeSpec};

use super::{Inner, node_path, rdev_of};
use crate::error::{Error, Result};
use crate::proto::*;
use crate::state::{Access, Phase, Record, Target};
use crate::{fs as vfs, mounts};

impl Inner {
    pub(crate) fn stats(&self, id: &str, path: &Path) -> Result<NodeGetVolumeStatsResponse> {
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
                let size = lunkit::block::size_within(&device, self.query_deadline())
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
    pub(crate) fn check_volume_path(
        &self,
        record: &Record,
        device: &BlockNode,
        path: &Path,
    ) -> Result<()> {
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

    /// Abnormal when a path is not running, or no path is left: each family says which of
    /// its paths ([`crate::nvme::condition`], [`crate::scsi::condition`]).
    pub(crate) fn condition(&self, record: &Record) -> VolumeCondition {
        match &record.target {
            Target::Nvme { nqn, .. } => crate::nvme::condition(self.root(), nqn),
            Target::Iscsi { .. } | Target::Fc { .. } => crate::scsi::condition(self.root(), record),
        }
    }

    pub(crate) fn expand(&self, id: &str, path: &Path, required: i64) -> Result<i64> {
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
        let size = lunkit::block::size_within(&device, self.query_deadline())
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
    pub(crate) fn grow_fs(&self, record: &Record, device: &BlockNode, path: &Path) -> Result<()> {
        let Access::Mount { fs_type } = &record.access else {
            return Ok(());
        };
        vfs::grow(device, path, fs_type, self.config.stage_timeout).map_err(|e| {
            Error::Program(format!(
                "volume {}: grow the filesystem: {e}",
                record.volume_id
            ))
        })
    }
}

/// An abnormal condition with `message`.
pub(crate) fn abnormal(message: String) -> VolumeCondition {
    VolumeCondition {
        abnormal: true,
        message,
    }
}

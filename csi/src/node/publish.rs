//! NodePublishVolume and NodeUnpublishVolume: binds of the staging mount (filesystem) or of
//! the device node (raw block) at the target path, and only those the record lists removed.

use std::fs;
use std::path::Path;

use super::{Inner, SCRATCH, io_err, node_path, rdev_of};
use crate::error::{Error, Result};
use crate::log::{self, Level};
use crate::mounts;
use crate::proto::*;
use crate::state::{Access, Record};

impl Inner {
    /// Publishes the staged volume of `req` at its target path, a bind with the per-mount
    /// flags `want` (`RDONLY` for a read-only publish) added to the staging mount's own.
    pub(crate) fn publish(
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
    pub(crate) fn remember_published(&self, mut record: Record, target: &Path) -> Result<()> {
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
    pub(crate) fn unpublish(&self, id: &str, target: &Path) -> Result<()> {
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
    pub(crate) fn unlisted_publish(&self, record: Option<&Record>, target: &Path) -> Result<bool> {
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
}

//! A second LIO iSCSI target beside the lab's ([`super::lio`]): its own IQN and a
//! single fileio LUN 0, on a portal the lab's target may share (LIO lets several TPGs listen
//! on one address). The benchmark uses it to scan the same way on a target that exports one
//! LUN and, interleaved, on the lab's target with 256, in one phase.
//!
//! Build the lab's target first (it loads the modules and mounts configfs); log the initiator
//! out of this target before tearing it down.

use std::fs;
use std::path::{Path, PathBuf};

use super::{Result, lio};

const TARGET: &str = "/sys/kernel/config/target";
/// The HBA index of the extra backstore, clear of the lab's `fileio_<lun>` HBAs.
const HBA: u32 = 4096;

/// A one-LUN target; [`ExtraTarget::teardown`] (or drop) removes it from configfs.
#[derive(Debug)]
pub struct ExtraTarget {
    pub iqn: String,
    pub portal: String,
    live: bool,
}

/// The unit serial of the extra LUN: differs from every [`super::lio::unit_serial`].
pub const UNIT_SERIAL: &str = "5e7a20000000";

impl ExtraTarget {
    /// Creates `iqn` with one `size`-byte fileio LUN 0, listening on `portal`.
    pub fn create(iqn: &str, portal: &str, size: u64) -> Result<Self> {
        if !Path::new(TARGET).join("iscsi").is_dir() {
            return Err(
                format!("{TARGET}/iscsi is missing: build the lab's LIO target first").into(),
            );
        }
        fs::create_dir_all(lio::IMAGES)?;
        let mut me = Self {
            iqn: iqn.to_owned(),
            portal: portal.to_owned(),
            live: true,
        };
        if let Err(e) = me.build(size) {
            me.remove();
            me.live = false;
            return Err(e);
        }
        Ok(me)
    }

    fn tpg(&self) -> PathBuf {
        Path::new(TARGET)
            .join("iscsi")
            .join(&self.iqn)
            .join("tpgt_1")
    }

    fn backstore() -> PathBuf {
        Path::new(TARGET).join(format!("core/fileio_{HBA}/extra"))
    }

    fn image() -> String {
        format!("{}/extra-{HBA}.img", lio::IMAGES)
    }

    fn build(&mut self, size: u64) -> Result<()> {
        let bs = Self::backstore();
        lio::fileio(&bs, &Self::image(), size, UNIT_SERIAL)?;
        let tpg = self.tpg();
        lio::export(&bs, &tpg, 0)?;
        lio::mkdir(&tpg.join("np").join(&self.portal))?;
        lio::open_to_all(&tpg)
    }

    /// Removes the target and its backstore. Log the initiator out of it first.
    pub fn teardown(mut self) -> Result<()> {
        self.live = false;
        self.remove();
        let left = Path::new(TARGET).join("iscsi").join(&self.iqn);
        if left.exists() {
            return Err(format!("{} still exists after teardown", left.display()).into());
        }
        Ok(())
    }

    /// Best effort, children before parents (configfs refuses otherwise).
    fn remove(&mut self) {
        let tpg = self.tpg();
        let _ = fs::write(tpg.join("enable"), "0");
        let _ = fs::remove_dir(tpg.join("np").join(&self.portal));
        lio::unexport(&tpg, 0);
        let _ = fs::remove_dir(&tpg);
        let _ = fs::remove_dir(tpg.parent().expect("tpg has a parent"));
        lio::remove_fileio(&Self::backstore(), &Self::image());
    }
}

impl Drop for ExtraTarget {
    fn drop(&mut self) {
        if self.live {
            self.remove();
        }
    }
}

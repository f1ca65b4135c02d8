//! A second LIO iSCSI target beside the lab's ([`super::lio`]): its own IQN and a
//! single fileio LUN 0, on a portal the lab's target may share (LIO lets several TPGs listen
//! on one address). The benchmark uses it to scan the same way on a target that exports one
//! LUN and, interleaved, on the lab's target with 256, in one phase.
//!
//! Build the lab's target first (it loads the modules and mounts configfs); log the initiator
//! out of this target before tearing it down.

use std::fs;
use std::path::{Path, PathBuf};

use super::Result;

const TARGET: &str = "/sys/kernel/config/target";
const IMAGES: &str = "/tmp/lunkit-lio";
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
        fs::create_dir_all(IMAGES)?;
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
        format!("{IMAGES}/extra-{HBA}.img")
    }

    fn build(&mut self, size: u64) -> Result<()> {
        let bs = Self::backstore();
        mkdir(&bs)?;
        write(
            &bs.join("control"),
            &format!("fd_dev_name={},fd_dev_size={size}", Self::image()),
        )?;
        write(&bs.join("enable"), "1")?;
        write(&bs.join("wwn/vpd_unit_serial"), UNIT_SERIAL)?;
        let tpg = self.tpg();
        let lun_dir = tpg.join("lun/lun_0");
        mkdir(&lun_dir)?;
        std::os::unix::fs::symlink(&bs, lun_dir.join("lunkit"))
            .map_err(|e| format!("cannot map {} to {}: {e}", bs.display(), lun_dir.display()))?;
        mkdir(&tpg.join("np").join(&self.portal))?;
        write(&tpg.join("attrib/authentication"), "0")?;
        write(&tpg.join("attrib/generate_node_acls"), "1")?;
        write(&tpg.join("attrib/cache_dynamic_acls"), "1")?;
        write(&tpg.join("attrib/demo_mode_write_protect"), "0")?;
        write(&tpg.join("enable"), "1")?;
        Ok(())
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
        let lun_dir = tpg.join("lun/lun_0");
        let _ = fs::remove_file(lun_dir.join("lunkit"));
        let _ = fs::remove_dir(&lun_dir);
        let _ = fs::remove_dir(&tpg);
        let _ = fs::remove_dir(tpg.parent().expect("tpg has a parent"));
        let bs = Self::backstore();
        let _ = fs::remove_dir(&bs);
        let _ = fs::remove_dir(bs.parent().expect("backstore has a parent"));
        let _ = fs::remove_file(Self::image());
    }
}

impl Drop for ExtraTarget {
    fn drop(&mut self) {
        if self.live {
            self.remove();
        }
    }
}

fn mkdir(p: &Path) -> Result<()> {
    fs::create_dir_all(p).map_err(|e| format!("mkdir {}: {e}", p.display()).into())
}

fn write(p: &Path, v: &str) -> Result<()> {
    fs::write(p, v).map_err(|e| format!("write {v:?} to {}: {e}", p.display()).into())
}

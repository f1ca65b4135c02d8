//! An LIO iSCSI target whose one LUN can grow: an `iblock` backstore on a loop device over a
//! file in a tmpfs of its own. iblock reports the backing device's size on every READ
//! CAPACITY, so growing the file and telling the loop device (`losetup -c`,
//! `LOOP_SET_CAPACITY`) grows the LUN as an array grows a volume. (A fileio backstore on a
//! regular file keeps the size it was created with.)
//!
//! Independent of the lab's target ([`super::lio`]): its own IQN, HBA and portals; it loads
//! the modules and mounts configfs itself.

use std::fs;
use std::path::{Path, PathBuf};

use super::{Result, cmd, lio};

const TARGET: &str = "/sys/kernel/config/target";
/// The iblock HBA index, clear of the lab's `fileio_<lun>` HBAs and lio_extra's.
const HBA: u32 = 4097;
/// The tmpfs the backing file lives in: its own, so the file is a plain tmpfs file whatever
/// the guest's /tmp is, and teardown leaves nothing.
const DIR: &str = "/run/lunkit-grow";
const IMAGE: &str = "/run/lunkit-grow/lun0.img";

/// The unit serial of the growable LUN: differs from the lab's and lio_extra's.
pub const UNIT_SERIAL: &str = "5e7a30000000";

/// A one-LUN target on a growable backstore; [`GrowTarget::teardown`] (or drop) removes it,
/// the loop device and the tmpfs.
#[derive(Debug)]
pub struct GrowTarget {
    pub iqn: String,
    pub portals: Vec<String>,
    /// `/dev/loopN` under the backstore.
    pub loop_dev: String,
    live: bool,
}

impl GrowTarget {
    /// Creates `iqn` with LUN 0 of `size` bytes, listening on every portal of `portals`.
    pub fn create(iqn: &str, portals: &[&str], size: u64) -> Result<Self> {
        cmd::modprobe(&[
            "loop",
            "target_core_mod",
            "target_core_iblock",
            "iscsi_target_mod",
        ])?;
        if !Path::new(TARGET).is_dir() {
            cmd::run(
                "mount",
                &["-t", "configfs", "configfs", "/sys/kernel/config"],
            )?;
        }
        for portal in portals {
            lio::ensure_loopback_address(portal)?;
        }
        fs::create_dir_all(DIR)?;
        cmd::run(
            "mount",
            &["-t", "tmpfs", "-o", "size=2g", "lunkit-grow", DIR],
        )?;
        let mut me = Self {
            iqn: iqn.to_owned(),
            portals: portals.iter().map(|p| (*p).to_owned()).collect(),
            loop_dev: String::new(),
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
        Path::new(TARGET).join(format!("core/iblock_{HBA}/grow"))
    }

    fn build(&mut self, size: u64) -> Result<()> {
        fs::File::create(IMAGE)?.set_len(size)?;
        self.loop_dev = cmd::run("losetup", &["-f", "--show", IMAGE])?
            .trim()
            .to_owned();
        let bs = Self::backstore();
        lio::mkdir(&bs)?;
        lio::write(&bs.join("control"), &format!("udev_path={}", self.loop_dev))?;
        lio::write(&bs.join("enable"), "1")?;
        lio::write(&bs.join("wwn/vpd_unit_serial"), UNIT_SERIAL)?;
        let tpg = self.tpg();
        lio::export(&bs, &tpg, 0)?;
        for portal in &self.portals {
            lio::mkdir(&tpg.join("np").join(portal))?;
        }
        lio::open_to_all(&tpg)
    }

    /// Grows the LUN to `size` bytes, as an array does: the file, then the loop device's
    /// capacity. Initiators see it on their next READ CAPACITY.
    pub fn grow(&self, size: u64) -> Result<()> {
        fs::OpenOptions::new()
            .write(true)
            .open(IMAGE)?
            .set_len(size)?;
        cmd::run("losetup", &["-c", &self.loop_dev]).map(drop)
    }

    /// The backing file, read directly (what the target stores).
    pub fn image() -> &'static str {
        IMAGE
    }

    /// Removes the target, the backstore, the loop device, the file and the tmpfs. Log the
    /// initiator out first.
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
        for portal in &self.portals {
            let _ = fs::remove_dir(tpg.join("np").join(portal));
        }
        lio::unexport(&tpg, 0);
        let _ = fs::remove_dir(&tpg);
        let _ = fs::remove_dir(tpg.parent().expect("tpg has a parent"));
        let bs = Self::backstore();
        let _ = fs::remove_dir(&bs);
        let _ = fs::remove_dir(bs.parent().expect("backstore has a parent"));
        if !self.loop_dev.is_empty() {
            cmd::run_ignoring_failure("losetup", &["-d", &self.loop_dev]);
        }
        let _ = fs::remove_file(IMAGE);
        cmd::run_ignoring_failure("umount", &[DIR]);
        let _ = fs::remove_dir(DIR);
    }
}

impl Drop for GrowTarget {
    fn drop(&mut self) {
        if self.live {
            self.remove();
        }
    }
}

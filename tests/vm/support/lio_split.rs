//! A target whose LUN only some portals see: one IQN, one fileio backstore exported as LUN 1
//! by TPG 1 and by no TPG 2. An initiator logged in through both portals has two sessions to
//! one target, and a scan of LUN 1 finds it on the first and gets "not reported" on the
//! second: a LUN masked on one path, as arrays do with host groups.
//!
//! Build the lab's target first (it loads the modules and mounts configfs); log the initiator
//! out of this target before tearing it down.

use std::fs;
use std::path::{Path, PathBuf};

use super::{Result, lio};

const TARGET: &str = "/sys/kernel/config/target";
/// The HBA index of the backstore, clear of the lab's and of [`super::lio_extra`]'s.
const HBA: u32 = 4097;
/// The LUN number TPG 1 exports the backstore as.
pub const LUN: u32 = 1;
/// Its unit serial: differs from every other lab LUN's.
pub const UNIT_SERIAL: &str = "5e7a30000000";

/// The target; [`SplitTarget::teardown`] (or drop) removes it from configfs.
#[derive(Debug)]
pub struct SplitTarget {
    pub iqn: String,
    /// The portal of TPG 1, which exports [`LUN`].
    pub seeing: String,
    /// The portal of TPG 2, which exports nothing.
    pub blind: String,
    live: bool,
}

impl SplitTarget {
    /// Creates `iqn` with TPG 1 on `seeing` exporting a `size`-byte LUN 1 and TPG 2 on
    /// `blind` exporting none.
    pub fn create(iqn: &str, seeing: &str, blind: &str, size: u64) -> Result<Self> {
        if !Path::new(TARGET).join("iscsi").is_dir() {
            return Err(
                format!("{TARGET}/iscsi is missing: build the lab's LIO target first").into(),
            );
        }
        fs::create_dir_all(lio::IMAGES)?;
        let mut me = Self {
            iqn: iqn.to_owned(),
            seeing: seeing.to_owned(),
            blind: blind.to_owned(),
            live: true,
        };
        if let Err(e) = me.build(size) {
            me.remove();
            me.live = false;
            return Err(e);
        }
        Ok(me)
    }

    fn tpg(&self, n: u32) -> PathBuf {
        Path::new(TARGET)
            .join("iscsi")
            .join(&self.iqn)
            .join(format!("tpgt_{n}"))
    }

    fn backstore() -> PathBuf {
        Path::new(TARGET).join(format!("core/fileio_{HBA}/split"))
    }

    fn image() -> String {
        format!("{}/split-{HBA}.img", lio::IMAGES)
    }

    fn build(&mut self, size: u64) -> Result<()> {
        let bs = Self::backstore();
        lio::fileio(&bs, &Self::image(), size, UNIT_SERIAL)?;
        lio::export(&bs, &self.tpg(1), LUN)?;
        for (n, portal) in [(1, &self.seeing), (2, &self.blind)] {
            let tpg = self.tpg(n);
            lio::mkdir(&tpg.join("np").join(portal))?;
            lio::open_to_all(&tpg)?;
        }
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
        for (n, portal) in [(1, self.seeing.clone()), (2, self.blind.clone())] {
            let tpg = self.tpg(n);
            let _ = fs::write(tpg.join("enable"), "0");
            let _ = fs::remove_dir(tpg.join("np").join(portal));
        }
        lio::unexport(&self.tpg(1), LUN);
        for n in [1, 2] {
            let _ = fs::remove_dir(self.tpg(n));
        }
        let _ = fs::remove_dir(Path::new(TARGET).join("iscsi").join(&self.iqn));
        lio::remove_fileio(&Self::backstore(), &Self::image());
    }
}

impl Drop for SplitTarget {
    fn drop(&mut self) {
        if self.live {
            self.remove();
        }
    }
}

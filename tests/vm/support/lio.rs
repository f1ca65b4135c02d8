//! An LIO iSCSI target built through configfs, without targetcli: fileio backstores on sparse
//! files in the guest's /tmp, one target IQN, one TPG listening on several portals, demo mode
//! (generated node ACLs) without authentication, or, after [`LioTarget::require_chap`], one
//! node ACL that must log in with CHAP.

use std::fs;
use std::path::{Path, PathBuf};

use super::{Result, cmd};

const CONFIGFS: &str = "/sys/kernel/config";
const TARGET: &str = "/sys/kernel/config/target";
pub(crate) const IMAGES: &str = "/tmp/lunkit-lio";

/// What to build.
#[derive(Debug, Clone)]
pub struct LioConfig {
    pub iqn: String,
    pub luns: u32,
    pub lun_size: u64,
    /// `address:port`; addresses other than 127.0.0.1 are added to `lo`.
    pub portals: Vec<String>,
}

impl Default for LioConfig {
    fn default() -> Self {
        Self {
            iqn: "iqn.2003-01.org.linux-iscsi.lunkit:lab".into(),
            luns: 8,
            lun_size: 16 << 20,
            portals: vec!["127.0.0.1:3260".into(), "127.0.0.2:3260".into()],
        }
    }
}

/// A configured target; [`LioTarget::teardown`] (or drop) removes it from configfs.
#[derive(Debug)]
pub struct LioTarget {
    pub config: LioConfig,
    live: bool,
    /// Node ACLs [`LioTarget::require_chap`] made, by initiator name.
    acls: Vec<String>,
}

/// The CHAP one initiator must log in with (its node ACL's `auth/`).
#[derive(Debug, Clone)]
pub struct ChapAcl<'a> {
    /// The initiator's IQN (`/etc/iscsi/initiatorname.iscsi`).
    pub initiator: &'a str,
    /// The CHAP name and secret the initiator must give.
    pub userid: &'a str,
    pub password: &'a str,
    /// Mutual CHAP: the name and secret the target answers with, when the initiator asks.
    pub mutual: Option<(&'a str, &'a str)>,
}

/// The unit serial of backstore `lun`. LIO builds the NAA (and so the `wwid`) from its hex
/// digits, so they must differ per LUN; without a serial there is no VPD page 0x83 at all.
pub fn unit_serial(lun: u32) -> String {
    format!("5e7a1000{lun:04x}")
}

impl LioTarget {
    pub fn create(config: LioConfig) -> Result<Self> {
        cmd::modprobe(&["target_core_mod", "target_core_file", "iscsi_target_mod"])?;
        if !is_mountpoint(CONFIGFS) {
            cmd::run("mount", &["-t", "configfs", "configfs", CONFIGFS])?;
        }
        for portal in &config.portals {
            ensure_loopback_address(portal)?;
        }
        fs::create_dir_all(IMAGES)?;
        let mut me = Self {
            config,
            live: true,
            acls: Vec::new(),
        };
        if let Err(e) = me.build() {
            me.remove();
            me.live = false;
            return Err(e);
        }
        Ok(me)
    }

    fn tpg(&self) -> PathBuf {
        Path::new(TARGET)
            .join("iscsi")
            .join(&self.config.iqn)
            .join("tpgt_1")
    }

    fn backstore(lun: u32) -> PathBuf {
        Path::new(TARGET).join(format!("core/fileio_{lun}/lun{lun}"))
    }

    fn build(&mut self) -> Result<()> {
        let tpg = self.tpg();
        mkdir(&tpg)?;
        for lun in 0..self.config.luns {
            let bs = Self::backstore(lun);
            let image = format!("{IMAGES}/lun{lun}.img");
            fileio(&bs, &image, self.config.lun_size, &unit_serial(lun))?;
            export(&bs, &tpg, lun)?;
        }
        for portal in &self.config.portals {
            mkdir(&tpg.join("np").join(portal))?;
        }
        open_to_all(&tpg)
    }

    /// Maps backstore `from` (LUN `from`'s) as LUN `lun` as well, in place of `lun`'s own: a
    /// LUN number re-mapped to another volume on the array. The initiator sees it after its
    /// device at that LUN is deleted and scanned again. [`teardown`](Self::teardown) undoes it.
    pub fn remap(&self, lun: u32, from: u32) -> Result<()> {
        let tpg = self.tpg();
        unexport(&tpg, lun);
        export(&Self::backstore(from), &tpg, lun)
    }

    /// Enables or disables the TPG: disabled, LIO closes its sessions and refuses logins, as
    /// an array that went away does; the initiator's devices stay blocked while its sessions
    /// recover (`recovery_tmo`). Enabled again, iscsid logs back in.
    pub fn set_enabled(&self, on: bool) -> Result<()> {
        write(&self.tpg().join("enable"), if on { "1" } else { "0" })
    }

    /// Takes LUN `lun` out of the TPG, as an array does when it deletes or unmaps a volume:
    /// the initiator's device for it stays, and every command to it is answered with CHECK
    /// CONDITION, ILLEGAL REQUEST, LOGICAL UNIT NOT SUPPORTED (25/00). Not LUN 0: without
    /// a mapped LUN 0, LIO answers for it with its virtual LUN 0 instead.
    /// [`teardown`](Self::teardown) removes the backstore as usual.
    pub fn unmap(&self, lun: u32) -> Result<()> {
        let tpg = self.tpg();
        unexport(&tpg, lun);
        let left = tpg.join(format!("lun/lun_{lun}"));
        if left.exists() {
            return Err(format!("{} still exists after unmapping", left.display()).into());
        }
        Ok(())
    }

    /// Ends demo mode: only `acl.initiator` gets in, with CHAP (`attrib/authentication` 1), and
    /// sees every LUN through its node ACL. [`teardown`](Self::teardown) removes the ACL.
    pub fn require_chap(&mut self, acl: &ChapAcl<'_>) -> Result<()> {
        let tpg = self.tpg();
        let dir = tpg.join("acls").join(acl.initiator);
        mkdir(&dir)?;
        self.acls.push(acl.initiator.to_owned());
        for lun in 0..self.config.luns {
            let mapped = dir.join(format!("lun_{lun}"));
            mkdir(&mapped)?;
            let tpg_lun = tpg.join(format!("lun/lun_{lun}"));
            std::os::unix::fs::symlink(&tpg_lun, mapped.join("lunkit")).map_err(|e| {
                format!("cannot map {} in {}: {e}", tpg_lun.display(), dir.display())
            })?;
        }
        write(&dir.join("auth/userid"), acl.userid)?;
        write(&dir.join("auth/password"), acl.password)?;
        if let Some((user, password)) = acl.mutual {
            write(&dir.join("auth/userid_mutual"), user)?;
            write(&dir.join("auth/password_mutual"), password)?;
        }
        write(&tpg.join("attrib/generate_node_acls"), "0")?;
        write(&tpg.join("attrib/authentication"), "1")
    }

    /// Removes the target, portals, LUNs and backstores. Log the initiator out first: tearing
    /// down a TPG under live sessions leaves them reconnecting for the replacement timeout.
    pub fn teardown(mut self) -> Result<()> {
        self.live = false;
        self.remove();
        let left = Path::new(TARGET).join("iscsi").join(&self.config.iqn);
        if left.exists() {
            return Err(format!("{} still exists after teardown", left.display()).into());
        }
        Ok(())
    }

    /// Best effort, in the reverse order of [`build`](Self::build): configfs refuses to remove
    /// a directory that still has children, and a failed step must not stop the others.
    fn remove(&mut self) {
        let tpg = self.tpg();
        let _ = fs::write(tpg.join("enable"), "0");
        // Node ACLs first: their mapped LUNs link the TPG's LUNs.
        for initiator in &self.acls {
            let dir = tpg.join("acls").join(initiator);
            for lun in 0..self.config.luns {
                let _ = fs::remove_file(dir.join(format!("lun_{lun}/lunkit")));
                let _ = fs::remove_dir(dir.join(format!("lun_{lun}")));
            }
            let _ = fs::remove_dir(&dir);
        }
        for portal in &self.config.portals {
            let _ = fs::remove_dir(tpg.join("np").join(portal));
        }
        for lun in 0..self.config.luns {
            unexport(&tpg, lun);
        }
        let _ = fs::remove_dir(&tpg);
        let _ = fs::remove_dir(tpg.parent().expect("tpg has a parent"));
        for lun in 0..self.config.luns {
            remove_fileio(&Self::backstore(lun), &format!("{IMAGES}/lun{lun}.img"));
        }
    }
}

impl Drop for LioTarget {
    fn drop(&mut self) {
        if self.live {
            self.remove();
        }
    }
}

/// Creates the fileio backstore `bs` on `image` (`size` bytes) with unit serial `serial`,
/// and enables it.
pub(crate) fn fileio(bs: &Path, image: &str, size: u64, serial: &str) -> Result<()> {
    mkdir(bs)?;
    // fileio creates the file itself; it stays sparse in tmpfs.
    write(
        &bs.join("control"),
        &format!("fd_dev_name={image},fd_dev_size={size}"),
    )?;
    write(&bs.join("enable"), "1")?;
    // Before the LUN is exported: LIO refuses to change the serial of an exported LUN.
    write(&bs.join("wwn/vpd_unit_serial"), serial)
}

/// Exports backstore `bs` as LUN `lun` of `tpg`.
pub(crate) fn export(bs: &Path, tpg: &Path, lun: u32) -> Result<()> {
    let lun_dir = tpg.join(format!("lun/lun_{lun}"));
    mkdir(&lun_dir)?;
    std::os::unix::fs::symlink(bs, lun_dir.join("lunkit"))
        .map_err(|e| format!("cannot map {} to {}: {e}", bs.display(), lun_dir.display()).into())
}

/// Lets every initiator in without authentication (demo mode: generated node ACLs, writable
/// LUNs), then enables `tpg`.
pub(crate) fn open_to_all(tpg: &Path) -> Result<()> {
    write(&tpg.join("attrib/authentication"), "0")?;
    write(&tpg.join("attrib/generate_node_acls"), "1")?;
    write(&tpg.join("attrib/cache_dynamic_acls"), "1")?;
    write(&tpg.join("attrib/demo_mode_write_protect"), "0")?;
    write(&tpg.join("enable"), "1")
}

/// Removes what [`export`] made (best effort, as every removal here).
pub(crate) fn unexport(tpg: &Path, lun: u32) {
    let lun_dir = tpg.join(format!("lun/lun_{lun}"));
    let _ = fs::remove_file(lun_dir.join("lunkit"));
    let _ = fs::remove_dir(&lun_dir);
}

/// Removes what [`fileio`] made, its HBA directory and its image (best effort).
pub(crate) fn remove_fileio(bs: &Path, image: &str) {
    let _ = fs::remove_dir(bs);
    let _ = fs::remove_dir(bs.parent().expect("backstore has a parent"));
    let _ = fs::remove_file(image);
}

pub(crate) fn mkdir(p: &Path) -> Result<()> {
    fs::create_dir_all(p).map_err(|e| format!("mkdir {}: {e}", p.display()).into())
}

pub(crate) fn write(p: &Path, v: &str) -> Result<()> {
    fs::write(p, v).map_err(|e| format!("write {v:?} to {}: {e}", p.display()).into())
}

fn is_mountpoint(dir: &str) -> bool {
    fs::read_to_string("/proc/self/mountinfo")
        .is_ok_and(|m| m.lines().any(|l| l.split(' ').nth(4) == Some(dir)))
}

/// 127.0.0.2 answers on Linux anyway (lo owns 127/8), but iscsid and LIO bind and report the
/// address: put it on `lo` so both portals are real addresses.
pub(crate) fn ensure_loopback_address(portal: &str) -> Result<()> {
    let addr = portal.rsplit_once(':').map_or(portal, |(a, _)| a);
    if addr == "127.0.0.1" || super::sysfs::local_address(addr) {
        return Ok(());
    }
    let shown = cmd::run("ip", &["-o", "addr", "show", "dev", "lo"])?;
    if !shown.contains(&format!("inet {addr}/")) {
        cmd::run("ip", &["addr", "add", &format!("{addr}/8"), "dev", "lo"])?;
    }
    Ok(())
}

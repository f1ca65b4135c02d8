//! The iSCSI multipath lab: an LIO target with N LUNs behind two portals, one manual-scan
//! session per portal, chosen LUNs scanned by hand on every session, optionally multipathd
//! with a map per scanned LUN. `cargo xtask lab`, the sysfs capture and the tests build it
//! with this one recipe.

use super::iscsi::{self, Session};
use super::lio::{LioConfig, LioTarget};
use super::multipath::{self, Map, Multipathd};
use super::{Result, sysfs};

#[derive(Debug, Clone)]
pub struct LabConfig {
    pub target: LioConfig,
    /// LUNs to scan on every session.
    pub scan: Vec<u32>,
    /// Start multipathd with this /etc/multipath.conf and wait for one map per scanned LUN;
    /// `None` runs no multipathd.
    pub multipath: Option<&'static str>,
}

impl Default for LabConfig {
    fn default() -> Self {
        Self {
            target: LioConfig::default(),
            scan: vec![0, 1],
            multipath: Some(multipath::DEFAULT_CONF),
        }
    }
}

/// The running lab. Dropping it tears everything down in the safe order: maps, sessions,
/// iscsid (if the lab started it), target.
#[derive(Debug)]
pub struct IscsiLab {
    pub config: LabConfig,
    /// One session per portal, in portal order.
    pub sessions: Vec<Session>,
    /// The multipath maps multipathd built, by name.
    pub maps: Vec<Map>,
    multipathd: Option<Multipathd>,
    target: Option<LioTarget>,
    /// The lab started iscsid (it was not running before), so teardown stops it.
    started_iscsid: bool,
}

impl IscsiLab {
    pub fn build(config: LabConfig) -> Result<Self> {
        let target = LioTarget::create(config.target.clone())?;
        let mut lab = Self {
            config,
            sessions: Vec::new(),
            maps: Vec::new(),
            multipathd: None,
            target: Some(target),
            started_iscsid: false,
        };
        lab.started_iscsid = iscsi::ensure_iscsid()?;
        lab.sessions =
            iscsi::discover_and_login(&lab.config.target.iqn, &lab.config.target.portals)?;
        for session in &lab.sessions {
            for &lun in &lab.config.scan {
                iscsi::scan_lun(session, lun)?;
            }
        }
        if let Some(conf) = lab.config.multipath {
            lab.multipathd = Some(Multipathd::start(conf)?);
            lab.maps = multipath::wait_maps(lab.config.scan.len(), lab.sessions.len())?;
        }
        Ok(lab)
    }

    /// The LIO target (until teardown).
    pub fn target(&self) -> &LioTarget {
        self.target
            .as_ref()
            .expect("the lab's target lives until teardown")
    }

    /// H:C:T:L of every SCSI device on the lab's sessions.
    pub fn devices(&self) -> Vec<String> {
        let hosts: Vec<String> = self
            .sessions
            .iter()
            .map(|s| format!("{}:", s.host))
            .collect();
        sysfs::names("/sys/class/scsi_device")
            .into_iter()
            .filter(|hctl| hosts.iter().any(|h| hctl.starts_with(h.as_str())))
            .collect()
    }

    /// Tears down and reports the first failure (drop does the same silently).
    pub fn teardown(mut self) -> Result<()> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Result<()> {
        let mut first_err = None;
        if let Some(mpd) = self.multipathd.take() {
            first_err = mpd.stop().err();
        }
        // Always: a login that succeeded but timed out in our wait is not in `sessions`, and
        // the guest has no iSCSI sessions but the lab's.
        iscsi::logout_all();
        self.sessions.clear();
        if std::mem::take(&mut self.started_iscsid) {
            if let Err(e) = iscsi::stop_iscsid() {
                first_err.get_or_insert(e);
            }
        }
        if let Some(target) = self.target.take() {
            if let Err(e) = target.teardown() {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

impl Drop for IscsiLab {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

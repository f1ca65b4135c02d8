//! `/sys/class/scsi_host` and `/sys/class/scsi_device`.

use std::fmt;
use std::path::PathBuf;

use crate::error::Result;
use crate::id::{Hctl, Wwid, decimal};
use crate::root::Root;
use crate::sysfs::{Confine, attr, attr_parse, entries, sub_entries};

crate::sysfs::kernel_state! {
    /// A SCSI device's state (`/sys/class/scsi_device/H:C:T:L/device/state`, the midlayer's
    /// `scsi_device_state`).
    ScsiState {
        /// Being set up by the scan.
        Created = "created",
        /// Taking commands.
        Running = "running",
        /// Being removed.
        Cancel = "cancel",
        /// Removed.
        Deleted = "deleted",
        /// Quiesced (suspend, a SPI domain validation).
        Quiesce = "quiesce",
        /// Set offline: commands fail (the error handler gave up, or `echo offline`).
        Offline = "offline",
        /// Its transport lost it for good: commands fail.
        TransportOffline = "transport-offline",
        /// Its transport is recovering (an iSCSI session or FC port down): commands wait.
        Blocked = "blocked",
        /// Blocked while still being set up.
        CreatedBlocked = "created-blocked",
    }
}

/// How a SCSI host reaches its storage, decided by which transport class claims it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// An iSCSI session host (`/sys/class/iscsi_host/hostN` exists).
    Iscsi,
    /// A Fibre Channel HBA port (`/sys/class/fc_host/hostN` exists).
    Fc,
    /// Anything else: SAS, virtio-scsi, scsi_debug, USB...
    Other,
}

impl Transport {
    /// `iscsi`, `fc` or `other`.
    pub fn as_str(self) -> &'static str {
        match self {
            Transport::Iscsi => "iscsi",
            Transport::Fc => "fc",
            Transport::Other => "other",
        }
    }
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One SCSI host, `/sys/class/scsi_host/hostN`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScsiHost {
    /// `N` of `hostN`.
    pub number: u32,
    /// The driver's name (`proc_name`): `iscsi_tcp`, `scsi_debug`, `qla2xxx`...
    pub proc_name: Option<String>,
    /// Host state (`running`, `recovery`...).
    pub state: Option<String>,
    /// The transport class that claims the host.
    pub transport: Transport,
}

/// Reads every SCSI host.
pub fn hosts(root: &Root) -> Result<Vec<ScsiHost>> {
    let class = root.sys("class/scsi_host");
    let confine = Confine::new(root);
    let mut hosts = Vec::new();
    for name in entries(&class)? {
        let Some(number) = name.strip_prefix("host").and_then(decimal) else {
            continue;
        };
        // Class entries are symlinks into /sys/devices; one leading outside the root is skipped.
        let Some(dir) = confine.dir(&class.join(&name)) else {
            continue;
        };
        let transport = if root.sys("class/iscsi_host").join(&name).exists() {
            Transport::Iscsi
        } else if root.sys("class/fc_host").join(&name).exists() {
            Transport::Fc
        } else {
            Transport::Other
        };
        hosts.push(ScsiHost {
            number,
            proc_name: attr(&dir, "proc_name"),
            state: attr(&dir, "state"),
            transport,
        });
    }
    Ok(hosts)
}

/// One SCSI device (a LUN on a path), `/sys/class/scsi_device/H:C:T:L/device`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScsiDevice {
    /// Its address.
    pub hctl: Hctl,
    /// Device state: `running`, `offline`, `blocked`, `transport-offline`, `cancel`...
    pub state: Option<String>,
    /// INQUIRY vendor, trimmed.
    pub vendor: Option<String>,
    /// INQUIRY product, trimmed.
    pub model: Option<String>,
    /// INQUIRY revision, trimmed.
    pub rev: Option<String>,
    /// Peripheral device type (0 disk, 5 CD/DVD, 0xc RAID, 0xd enclosure...).
    pub device_type: Option<u8>,
    /// The kernel's WWID from VPD page 0x83 (`naa.…`, `eui.…`, `t10.…`); absent without 0x83.
    pub wwid: Option<String>,
    /// The block device bound to it (`sda`), if `sd` has probed it.
    pub block: Option<String>,
    /// Its SCSI generic node (`sg2`).
    pub sg: Option<String>,
}

/// Reads every SCSI device, in H:C:T:L order.
pub fn devices(root: &Root) -> Result<Vec<ScsiDevice>> {
    let class = root.sys("class/scsi_device");
    let confine = Confine::new(root);
    let mut devs = Vec::new();
    for name in entries(&class)? {
        let Ok(hctl) = name.parse::<Hctl>() else {
            continue;
        };
        if let Some(dir) = confine.dir(&class.join(&name).join("device")) {
            devs.push(read_device(&dir, hctl)?);
        }
    }
    devs.sort_by_key(|d| d.hctl);
    Ok(devs)
}

/// Reads the SCSI device at `hctl`, `None` if it does not exist.
pub fn device(root: &Root, hctl: Hctl) -> Result<Option<ScsiDevice>> {
    let dir = device_dir(root, hctl);
    if !dir.exists() {
        return Ok(None);
    }
    match Confine::new(root).dir(&dir) {
        Some(dir) => read_device(&dir, hctl).map(Some),
        None => Ok(None),
    }
}

/// `/sys/class/scsi_device/<hctl>/device`: the SCSI device's own directory, where its
/// attributes (`wwid`, `state`, `rescan`, `delete`) and its disk (`block/`) are.
pub(crate) fn device_dir(root: &Root, hctl: Hctl) -> PathBuf {
    root.sys("class/scsi_device")
        .join(hctl.to_string())
        .join("device")
}

/// `/sys/class/scsi_host/host<n>`: a SCSI host's directory (its `scan` attribute).
pub(crate) fn host_dir(root: &Root, host: u32) -> PathBuf {
    root.sys("class/scsi_host").join(format!("host{host}"))
}

/// The addresses of every SCSI device, in listing order.
pub(crate) fn addresses(root: &Root) -> Result<Vec<Hctl>> {
    Ok(entries(&root.sys("class/scsi_device"))?
        .iter()
        .filter_map(|n| n.parse().ok())
        .collect())
}

/// Whether a SCSI device is at `hctl`.
pub(crate) fn exists(root: &Root, hctl: Hctl) -> bool {
    device_dir(root, hctl).exists()
}

/// The WWID the kernel read from the device at `hctl` (VPD page 0x83), if it parses.
pub(crate) fn wwid(root: &Root, hctl: Hctl) -> Option<Wwid> {
    attr_parse(&device_dir(root, hctl), "wwid")
}

/// The device's state now (`running`, `blocked`, `offline`, `transport-offline`...).
pub(crate) fn state(root: &Root, hctl: Hctl) -> Option<ScsiState> {
    attr(&device_dir(root, hctl), "state").map(|s| ScsiState::parse(&s))
}

/// The kernel name of the disk `sd` bound to the device at `hctl` (its `block/` entry).
pub(crate) fn disk(root: &Root, hctl: Hctl) -> Result<Option<String>> {
    Ok(sub_entries(&device_dir(root, hctl), "block")?
        .into_iter()
        .next())
}

fn read_device(dir: &std::path::Path, hctl: Hctl) -> Result<ScsiDevice> {
    let first =
        |sub: &str| -> Result<Option<String>> { Ok(sub_entries(dir, sub)?.into_iter().next()) };
    Ok(ScsiDevice {
        hctl,
        state: attr(dir, "state"),
        vendor: attr(dir, "vendor"),
        model: attr(dir, "model"),
        rev: attr(dir, "rev"),
        device_type: attr_parse(dir, "type"),
        wwid: attr(dir, "wwid"),
        block: first("block")?,
        sg: first("scsi_generic")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_states_parse_and_keep_their_spelling() {
        for (raw, state) in [
            ("created", ScsiState::Created),
            ("running", ScsiState::Running),
            ("cancel", ScsiState::Cancel),
            ("deleted", ScsiState::Deleted),
            ("quiesce", ScsiState::Quiesce),
            ("offline", ScsiState::Offline),
            ("transport-offline", ScsiState::TransportOffline),
            ("blocked", ScsiState::Blocked),
            ("created-blocked", ScsiState::CreatedBlocked),
        ] {
            assert_eq!(ScsiState::parse(raw), state);
            assert_eq!(state.as_str(), raw);
        }
        let odd = ScsiState::parse("Running");
        assert_eq!(odd, ScsiState::Other("Running".into()));
        assert_ne!(odd, ScsiState::Running);
        assert_eq!(odd.to_string(), "Running");
    }
}

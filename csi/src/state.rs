//! What NodeStageVolume learned about a volume, kept on disk so that NodeUnstageVolume (which
//! gets only the volume id and the staging path) can take the volume out again, after a
//! plugin restart too.
//!
//! One JSON file per volume in `<state-dir>/volumes/`, written atomically (a temporary file in
//! the same directory, fsynced, renamed over the old one, the directory fsynced). The file
//! name is derived from the volume id but never read back for meaning: the record holds the id
//! and is checked against it.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The version of the record's layout; a record of another version is refused, not guessed.
pub const RECORD_VERSION: u32 = 1;

/// How far staging got: a record is written before anything is done to the node, so that an
/// unstage after a crash midway knows what to undo.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    /// Sessions may be logged in and the LUN scanned; nothing is mounted.
    Attaching,
    /// The volume is on the node (and mounted at the staging path, for mount access).
    Staged,
}

/// How the volume is used.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum Access {
    /// A raw block device.
    Block,
    /// A filesystem mounted at the staging path.
    Mount {
        /// Its type (`ext4`, `xfs`).
        fs_type: String,
    },
}

/// Which DH-HMAC-CHAP secrets an NVMe volume was staged with (`dhchapSecret`,
/// `dhchapCtrlSecret`). A record written before it was kept says `None`.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum Dhchap {
    /// No secret: the subsystem lets the host in unauthenticated.
    #[default]
    None,
    /// `dhchapSecret`: the host proves itself.
    Host,
    /// `dhchapSecret` and `dhchapCtrlSecret`: the subsystem's controllers prove themselves
    /// too, and a path whose controller cannot is never connected.
    Bidirectional,
}

impl Dhchap {
    /// What a volume with `secret` and `ctrl_secret` given asks for.
    pub fn of(secret: bool, ctrl_secret: bool) -> Dhchap {
        match (secret, ctrl_secret) {
            (_, true) => Dhchap::Bidirectional,
            (true, false) => Dhchap::Host,
            (false, false) => Dhchap::None,
        }
    }

    /// Whether no secret was given.
    pub fn is_none(&self) -> bool {
        *self == Dhchap::None
    }
}

/// The transport and address of the volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "transport")]
pub enum Target {
    /// An iSCSI LUN.
    Iscsi {
        /// The target IQN.
        iqn: String,
        /// The portals staging logs in to.
        portals: Vec<String>,
        /// The open-iscsi interface, when not `default`.
        iface: Option<String>,
        /// The LUN.
        lun: u64,
        /// The target's other portals SendTargets discovery found (`discovery: true`),
        /// logged in to like `portals` and logged out of at unstage.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        discovered: Vec<String>,
        /// Its reservation when fenced ([`crate::fence`]), recorded before any is made.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        fence: Option<crate::fence::Fence>,
    },
    /// An NVMe/TCP namespace.
    Nvme {
        /// The subsystem NQN.
        nqn: String,
        /// The ports staging connects.
        portals: Vec<String>,
        /// The discovery services whose logs' ports staging connects too (`discoveryAddrs`).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        discovery: Vec<String>,
        /// The namespace id: given, or the one the attach by `device_uuid` or `device_wwid` found.
        nsid: Option<u32>,
        /// The namespace UUID the volume attributes named.
        device_uuid: Option<String>,
        /// The namespace's kernel identity the attributes named instead of a UUID
        /// (`eui.…`, `nvme.…`: csi-driver-nvmf's `deviceID`, `deviceEUI`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        device_wwid: Option<String>,
        /// The host NQN the volume connects as (`hostNqn`), when not the node's: the
        /// discovery services are followed as that host ([`crate::follow`]).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        host_nqn: Option<String>,
        /// The host id the volume connects with (`hostId`), when given.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        host_id: Option<String>,
        /// Which DH-HMAC-CHAP secrets the volume was staged with (never the secrets: those
        /// go to the kernel only), so that a follower never connects a path without them.
        #[serde(default, skip_serializing_if = "Dhchap::is_none")]
        dhchap: Dhchap,
    },
    /// A Fibre Channel LUN.
    Fc {
        /// The target's port names (`0x…`), sorted.
        wwpns: Vec<String>,
        /// The LUN.
        lun: u64,
        /// As for iSCSI.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        fence: Option<crate::fence::Fence>,
    },
}

impl Target {
    /// `iSCSI iqn… LUN 3`, `NVMe nqn… namespace 1`: for messages.
    pub fn describe(&self) -> String {
        match self {
            Target::Iscsi { iqn, lun, .. } => format!("iSCSI {iqn} LUN {lun}"),
            Target::Nvme {
                nqn, nsid: Some(n), ..
            } => format!("NVMe {nqn} namespace {n}"),
            Target::Nvme {
                nqn,
                device_uuid: Some(u),
                ..
            } => format!("NVMe {nqn} namespace uuid {u}"),
            Target::Nvme {
                nqn,
                device_wwid: Some(w),
                ..
            } => format!("NVMe {nqn} namespace {w}"),
            Target::Nvme { nqn, .. } => format!("NVMe {nqn}"),
            Target::Fc { wwpns, lun, .. } => format!("FC {} LUN {lun}", wwpns.join(", ")),
        }
    }

    /// Whether two records name the same target (IQN or subsystem), so that one's teardown
    /// must not log out of or disconnect what the other uses.
    pub fn same_target(&self, other: &Target) -> bool {
        match (self, other) {
            (Target::Iscsi { iqn: a, .. }, Target::Iscsi { iqn: b, .. }) => a == b,
            (Target::Nvme { nqn: a, .. }, Target::Nvme { nqn: b, .. }) => a == b,
            (Target::Fc { wwpns: a, .. }, Target::Fc { wwpns: b, .. }) => {
                a.iter().any(|w| b.contains(w))
            }
            _ => false,
        }
    }
}

/// One staged (or being staged) volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// [`RECORD_VERSION`].
    pub version: u32,
    /// The CO's volume id.
    pub volume_id: String,
    /// The staging path the CO gave.
    pub staging_path: PathBuf,
    /// How far staging got.
    pub phase: Phase,
    /// Where the volume is.
    pub target: Target,
    /// How it is used.
    pub access: Access,
    /// The WWID the volume's paths reported (multipath form, `36…`; an NVMe namespace's
    /// `uuid.…`/`eui.…`), recorded as soon as the scan saw it, before anything else is done.
    pub wwid: Option<String>,
    /// The WWID the volume attributes said it must have (`wwid`), recorded before anything
    /// is done to the node: unstage detaches by it when no WWID was seen yet, never by the
    /// target and LUN (which may hold another volume by then).
    #[serde(default)]
    pub expected_wwid: Option<String>,
    /// The node path (`/dev/dm-N`, `/dev/sdX`, `/dev/nvmeNnM`, never under `--root`) of the
    /// device stage last handed out. A cache for messages only: kernel names are reused
    /// after a reboot or a rescan, so every call finds the device again by identity.
    pub device: Option<PathBuf>,
    /// Whether the device handed out was multipathd's map (not a single path): a volume
    /// staged on a map is not in place while only its paths are there.
    #[serde(default)]
    pub map: bool,
    /// The target paths the volume is published at (kubelet's paths, as given), added by
    /// each NodePublishVolume and removed by its NodeUnpublishVolume: the background doctor
    /// looks at these ([`crate::stale`]), so that it counts this plugin's publishes only.
    /// A record written before this field, or a publish made before it, lists none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub published: Vec<PathBuf>,
}

impl Record {
    /// The WWID the volume is known by: the one its paths reported, else the one its
    /// attributes named.
    pub fn known_wwid(&self) -> Option<&str> {
        self.wwid.as_deref().or(self.expected_wwid.as_deref())
    }

    /// Whether `other`, another volume's record, names the same volume: the same known WWID,
    /// or the same NVMe subsystem and namespace. Two PVs can (one whose `wwid` attribute is
    /// wrong, or one whose stage was refused because its LUN now serves another volume), and
    /// then one's unstage must not take away what the other staged.
    pub fn same_volume_as(&self, other: &Record) -> bool {
        if self.volume_id == other.volume_id {
            return false;
        }
        let wwid = matches!((self.known_wwid(), other.known_wwid()), (Some(a), Some(b)) if a == b);
        let namespace = match (&self.target, &other.target) {
            (
                Target::Nvme {
                    nqn: a,
                    nsid: Some(x),
                    ..
                },
                Target::Nvme {
                    nqn: b,
                    nsid: Some(y),
                    ..
                },
            ) => a == b && x == y,
            _ => false,
        };
        wwid || namespace
    }
}

/// The records in a state directory.
#[derive(Debug, Clone)]
pub struct Store {
    dir: PathBuf,
}

impl Store {
    /// The records under `<state_dir>/volumes`. Both directories are created if missing and
    /// made mode 0700 whatever they were: the records name targets and devices, which no
    /// other user of the node need read.
    pub fn open(state_dir: &Path) -> Result<Store> {
        let dir = state_dir.join("volumes");
        fs::create_dir_all(&dir).map_err(|e| {
            Error::Internal(format!(
                "cannot create state directory {}: {e}",
                dir.display()
            ))
        })?;
        for d in [state_dir, dir.as_path()] {
            owner_only(d)?;
        }
        Ok(Store { dir })
    }

    /// The directory the records are in (`<state_dir>/volumes`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the record of `volume_id` is.
    pub fn path(&self, volume_id: &str) -> PathBuf {
        self.dir.join(file_name(volume_id))
    }

    /// The record of `volume_id`, `None` if there is none. A record that does not parse, or
    /// is of another volume or version, is an error naming the file.
    pub fn load(&self, volume_id: &str) -> Result<Option<Record>> {
        let path = self.path(volume_id);
        let text = match fs::read(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => {
                return Err(Error::Internal(format!(
                    "volume {volume_id}: cannot read state record {}: {e}",
                    path.display()
                )));
            }
        };
        let record: Record = serde_json::from_slice(&text).map_err(|e| {
            Error::Internal(format!(
                "volume {volume_id}: state record {} does not parse: {e}",
                path.display()
            ))
        })?;
        if record.version != RECORD_VERSION || record.volume_id != volume_id {
            return Err(Error::Internal(format!(
                "volume {volume_id}: state record {} is of volume {:?}, version {} (expected version {RECORD_VERSION})",
                path.display(),
                record.volume_id,
                record.version
            )));
        }
        Ok(Some(record))
    }

    /// Writes `record` atomically: after a crash the old record or the new one is there,
    /// never a torn one.
    pub fn save(&self, record: &Record) -> Result<()> {
        let path = self.path(&record.volume_id);
        let fail = |what: &str, e: std::io::Error| {
            Error::Internal(format!(
                "volume {}: cannot {what} state record {}: {e}",
                record.volume_id,
                path.display()
            ))
        };
        let tmp = path.with_extension("json.tmp");
        let text = serde_json::to_vec_pretty(record)
            .map_err(|e| Error::Internal(format!("volume {}: {e}", record.volume_id)))?;
        let mut f = fs::File::create(&tmp).map_err(|e| fail("create", e))?;
        f.write_all(&text).map_err(|e| fail("write", e))?;
        f.sync_all().map_err(|e| fail("sync", e))?;
        drop(f);
        fs::rename(&tmp, &path).map_err(|e| fail("rename", e))?;
        sync_dir(&self.dir).map_err(|e| fail("sync the directory of", e))
    }

    /// Removes the record of `volume_id`; none is not an error.
    pub fn remove(&self, volume_id: &str) -> Result<()> {
        let path = self.path(volume_id);
        match fs::remove_file(&path) {
            Ok(()) => sync_dir(&self.dir).map_err(|e| {
                Error::Internal(format!(
                    "volume {volume_id}: sync {}: {e}",
                    self.dir.display()
                ))
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::Internal(format!(
                "volume {volume_id}: cannot remove state record {}: {e}",
                path.display()
            ))),
        }
    }

    /// Every record that parses; the others are skipped (each is found by its own volume's
    /// calls, which report it).
    pub fn all(&self) -> Result<Vec<Record>> {
        Ok(self.all_dated()?.into_iter().map(|(r, _)| r).collect())
    }

    /// [`all`](Self::all), each record with when it was last written (`None` where the
    /// file system does not say).
    pub fn all_dated(&self) -> Result<Vec<(Record, Option<std::time::SystemTime>)>> {
        let entries = fs::read_dir(&self.dir).map_err(|e| {
            Error::Internal(format!(
                "cannot list state directory {}: {e}",
                self.dir.display()
            ))
        })?;
        let mut out = Vec::new();
        for entry in entries.flatten() {
            let p = entry.path();
            if p.extension().and_then(|e| e.to_str()) != Some("json") {
                continue;
            }
            let Ok(mut f) = fs::File::open(&p) else {
                continue;
            };
            let written = f.metadata().and_then(|m| m.modified()).ok();
            let mut text = Vec::new();
            if std::io::Read::read_to_end(&mut f, &mut text).is_ok() {
                if let Ok(r) = serde_json::from_slice::<Record>(&text) {
                    out.push((r, written));
                }
            }
        }
        Ok(out)
    }
}

/// Makes the directory `dir` mode 0700, and checks that it is.
fn owner_only(dir: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let fail = |e: std::io::Error| {
        Error::Internal(format!(
            "cannot make state directory {} mode 0700: {e}",
            dir.display()
        ))
    };
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700)).map_err(fail)?;
    let mode = fs::metadata(dir).map_err(fail)?.permissions().mode() & 0o7777;
    if mode != 0o700 {
        return Err(Error::Internal(format!(
            "state directory {} is mode {mode:04o} after chmod 0700",
            dir.display()
        )));
    }
    Ok(())
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    fs::File::open(dir)?.sync_all()
}

/// A file name for `volume_id`: its safe characters (at most 64) and a 64-bit FNV-1a hash of
/// the whole id, so that ids differing only in unsafe characters or past the 64th get their
/// own files, and no id can name a path outside the directory.
pub fn file_name(volume_id: &str) -> String {
    let safe: String = volume_id
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        .take(64)
        .collect();
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in volume_id.bytes() {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{safe}-{hash:016x}.json")
}

#[cfg(test)]
#[path = "state_tests.rs"]
mod tests;

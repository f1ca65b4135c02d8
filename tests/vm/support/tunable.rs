//! Guest-wide knobs a test turns for a while (a sysfs module parameter, a sysctl, a device
//! node's mode), put back on drop so a failing assertion does not leak into the next test.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::Result;

/// A file under /sys or /proc written with a new value; the old one is written back on drop.
#[derive(Debug)]
pub struct Tunable {
    path: PathBuf,
    old: String,
}

impl Tunable {
    /// Remembers `path`'s value and writes `value` (without a newline: some string
    /// parameters, like `scsi_mod.scan`, count it against their length).
    pub fn set(path: impl AsRef<Path>, value: &str) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let old = std::fs::read_to_string(&path)
            .map_err(|e| format!("read {}: {e}", path.display()))?
            .trim_end_matches('\n')
            .to_owned();
        std::fs::write(&path, value)
            .map_err(|e| format!("write {value:?} to {}: {e}", path.display()))?;
        Ok(Self { path, old })
    }

    /// The value it had before.
    pub fn old(&self) -> &str {
        &self.old
    }
}

impl Drop for Tunable {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.path, &self.old);
    }
}

/// A file whose permission bits are changed; the old mode is restored on drop.
#[derive(Debug)]
pub struct Mode {
    path: PathBuf,
    old: u32,
}

impl Mode {
    pub fn set(path: impl AsRef<Path>, mode: u32) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let old = std::fs::metadata(&path)
            .map_err(|e| format!("stat {}: {e}", path.display()))?
            .permissions()
            .mode()
            & 0o7777;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
            .map_err(|e| format!("chmod {mode:o} {}: {e}", path.display()))?;
        Ok(Self { path, old })
    }
}

impl Drop for Mode {
    fn drop(&mut self) {
        let _ = std::fs::set_permissions(&self.path, std::fs::Permissions::from_mode(self.old));
    }
}

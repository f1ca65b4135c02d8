//! Every SCSI device's WWID, read once for all the lookups that overlap in time.
//!
//! Finding a volume by its identity means reading the WWID of every SCSI device on the
//! node: a LUN the array re-mapped is found wherever it is now. A CSI plugin draining a
//! node detaches tens of volumes at once, and each reading every device of its own is a
//! whole-node scan per volume: with 32 volumes of two paths, 32 × 64 sysfs reads side by
//! side, which kept a TCG guest's two CPUs busy for 2.8 s. Each lookup here takes the first
//! read of the node that *started after it asked* ([`helper::Shared`]), so what it sees is
//! as fresh as a read of its own, and every lookup that asked meanwhile shares it.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::error::{Error, Result};
use crate::helper;
use crate::id::{Hctl, Wwid};
use crate::root::Root;

use super::sysfs;

/// Every SCSI device's address and WWID (`None`: not readable, or not parsed), in listing
/// order, as one read saw them.
pub(crate) type Wwids = Vec<(Hctl, Option<Wwid>)>;

/// Every SCSI device's WWID under `root`, read no earlier than this call: from a read this
/// caller runs, or one another caller started after this one asked. Waits for another
/// caller's read until `deadline` at most.
pub(crate) fn wwids(root: &Root, deadline: Instant) -> Result<Arc<Wwids>> {
    static READS: helper::Registry<Wwids> = Mutex::new(Vec::new());
    let shared = helper::keyed(&READS, &root.sys("class/scsi_device"));
    let asked = Instant::now();
    let mut failed = None;
    let read = || match read_all(root) {
        Ok(w) => Some(w),
        Err(e) => {
            failed = Some(e);
            None
        }
    };
    match shared.ask().take(shared, deadline, read) {
        helper::Taken::Shared(w) => Ok(w),
        helper::Taken::Failed => Err(failed.unwrap_or_else(|| Error::Internal {
            what: "the read of every SCSI device's WWID failed without saying why".into(),
        })),
        helper::Taken::TimedOut => Err(Error::Timeout {
            what: "another lookup's read of every SCSI device's WWID to end (this one \
                   shares the next)"
                .into(),
            waited: asked.elapsed(),
        }),
    }
}

/// One read of every device: `/sys/class/scsi_device/*/device/wwid`.
fn read_all(root: &Root) -> Result<Wwids> {
    Ok(sysfs::addresses(root)?
        .into_iter()
        .map(|h| (h, sysfs::wwid(root, h)))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::{Path, PathBuf};
    use std::time::Duration;

    /// Adds a SCSI device at `hctl` with WWID attribute `wwid` (none if empty) to the tree at
    /// `dir`.
    fn device(dir: &Path, hctl: &str, wwid: &str) {
        let d = dir.join("sys/class/scsi_device").join(hctl).join("device");
        std::fs::create_dir_all(&d).unwrap();
        if !wwid.is_empty() {
            std::fs::write(d.join("wwid"), format!("{wwid}\n")).unwrap();
        }
    }

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("lunkit-wwids-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    const A: &str = "naa.6001405aaaaaaaaaaaaaaaaaaaaaaaaa";
    const B: &str = "naa.6001405bbbbbbbbbbbbbbbbbbbbbbbbb";

    #[test]
    fn every_device_is_read_and_a_later_call_sees_a_device_added_since() {
        let dir = scratch("later");
        device(&dir, "2:0:0:1", A);
        device(&dir, "3:0:0:1", "");
        let root = Root::new(&dir);
        let deadline = Instant::now() + Duration::from_secs(10);
        let first = wwids(&root, deadline).unwrap();
        let seen: Vec<(String, Option<String>)> = first
            .iter()
            .map(|(h, w)| (h.to_string(), w.as_ref().map(ToString::to_string)))
            .collect();
        assert_eq!(
            seen,
            [("2:0:0:1".into(), Some(A.into())), ("3:0:0:1".into(), None)]
        );
        device(&dir, "4:0:0:2", B);
        // A read that ended before this call asked is never handed out again.
        let second = wwids(&root, deadline).unwrap();
        assert_eq!(second.len(), 3, "{second:?}");
        assert_eq!(
            wwids(&Root::new(dir.join("none")), deadline).unwrap().len(),
            0
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn lookups_at_once_each_get_every_device() {
        let dir = scratch("once");
        for lun in 0..16 {
            device(
                &dir,
                &format!("2:0:0:{lun}"),
                &format!("naa.6001405{lun:025x}"),
            );
        }
        let root = Root::new(&dir);
        let deadline = Instant::now() + Duration::from_secs(30);
        std::thread::scope(|s| {
            let all: Vec<_> = (0..8).map(|_| s.spawn(|| wwids(&root, deadline))).collect();
            for t in all {
                let w = t.join().unwrap().unwrap();
                assert_eq!(w.len(), 16);
                assert!(w.iter().all(|(_, w)| w.is_some()), "{w:?}");
            }
        });
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

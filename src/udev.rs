//! Waiting for udevd (the opt-in `udev` feature): has it processed a device yet?
//!
//! lunkit itself needs only the kernel: a scan is complete when the block device's node opens.
//! Callers that go on to use `/dev/disk/by-id` links or udev properties must also wait for
//! udevd, which runs its rules after the kernel event. udevd records each processed device in
//! its database, `/run/udev/data/b<major>:<minor>`, with one `S:` line per symlink it created;
//! the device is processed once that record exists and every link it names is in `/dev`.
//!
//! Without udevd (no `/run/udev/control`) nothing will ever be processed, so that is reported
//! at once rather than waited for. This needs no libudev: the database format is stable
//! (systemd's `device-private.c` has written it the same way for a decade).

use std::fs;
use std::path::PathBuf;
use std::time::Instant;

use rustix::event::{PollFd, PollFlags, Timespec, poll};
use rustix::net::netlink::{self, SocketAddrNetlink};
use rustix::net::{AddressFamily, RecvFlags, SocketFlags, SocketType, recvfrom};

use crate::error::Result;
use crate::id::DevNum;
use crate::root::Root;
use crate::wait;

/// udevd's multicast group: it re-broadcasts each event there after running its rules.
const UDEV_GROUP: u32 = 2;

/// What udevd has done with a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UdevState {
    /// udevd processed it; these are the links it made (`<root>/dev/disk/by-id/...`).
    Processed {
        /// Symlinks udevd created for the device, all present.
        links: Vec<PathBuf>,
    },
    /// udevd is not running here (`/run/udev/control` is absent): nothing will process it.
    NotRunning,
}

/// Whether udevd runs: its control socket exists.
pub fn running(root: &Root) -> bool {
    root.run("udev/control").exists()
}

/// The links udevd's database lists for `dev`, if it has a record: `None` before udevd has
/// processed the device.
pub fn links(root: &Root, dev: DevNum) -> Option<Vec<PathBuf>> {
    let db = fs::read_to_string(root.run(format!("udev/data/b{dev}"))).ok()?;
    Some(parse_links(&db).map(|l| root.dev(l)).collect())
}

/// The `S:` (symlink) entries of a udev database record, relative to `/dev`. Entries that try
/// to leave `/dev` (`..`, absolute paths) are dropped.
pub fn parse_links(db: &str) -> impl Iterator<Item = &str> {
    db.lines().filter_map(|l| l.strip_prefix("S:")).filter(|l| {
        !l.is_empty() && !l.starts_with('/') && !l.split('/').any(|c| c == ".." || c == ".")
    })
}

/// Waits until udevd has processed every device in `devs` (database record present, every link
/// it lists exists), or reports [`UdevState::NotRunning`] at once. Ends with
/// [`Error::Timeout`](crate::Error::Timeout) at `deadline`.
pub fn wait_processed(
    root: &Root,
    devs: &[(String, DevNum)],
    deadline: Instant,
) -> Result<Vec<UdevState>> {
    if !running(root) {
        return Ok(vec![UdevState::NotRunning; devs.len()]);
    }
    // udevd's re-broadcasts only wake the re-check; what counts is the database.
    let hints = open_hint_socket();
    let mut sleep = |wake: Instant| -> Result<()> {
        let left = wake.saturating_duration_since(Instant::now());
        match &hints {
            Some(fd) => {
                let mut fds = [PollFd::new(fd, PollFlags::IN)];
                let ts = Timespec::try_from(left).unwrap_or(Timespec {
                    tv_sec: 0,
                    tv_nsec: 100_000_000,
                });
                if poll(&mut fds, Some(&ts)).unwrap_or(0) > 0 {
                    let mut buf = [0u8; 8192];
                    while recvfrom(fd, &mut buf[..], RecvFlags::DONTWAIT).is_ok() {}
                }
            }
            None => std::thread::sleep(left),
        }
        Ok(())
    };
    let what = || {
        let names: Vec<&str> = devs.iter().map(|(n, _)| n.as_str()).collect();
        format!("udevd to process {}", names.join(", "))
    };
    wait::until_with(deadline, &what, &mut sleep, || {
        Ok(devs
            .iter()
            .map(|(_, dev)| {
                let links = links(root, *dev)?;
                links
                    .iter()
                    .all(|l| l.exists())
                    .then_some(UdevState::Processed { links })
            })
            .collect::<Option<Vec<_>>>())
    })
}

fn open_hint_socket() -> Option<std::os::fd::OwnedFd> {
    let fd = rustix::net::socket_with(
        AddressFamily::NETLINK,
        SocketType::RAW,
        SocketFlags::CLOEXEC,
        Some(netlink::KOBJECT_UEVENT),
    )
    .ok()?;
    rustix::net::bind(&fd, &SocketAddrNetlink::new(0, 1 << (UDEV_GROUP - 1))).ok()?;
    Some(fd)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::error::Error;

    #[test]
    fn database_links_stay_below_dev() {
        let db = "S:disk/by-id/scsi-36001405abc\nS:disk/by-path/ip-127.0.0.1:3260-iscsi-iqn-lun-1\n\
W:3\nI:123\nE:ID_SERIAL=36001405abc\nS:../etc/passwd\nS:/etc/shadow\nS:disk/./x\nG:systemd\n";
        let l: Vec<&str> = parse_links(db).collect();
        assert_eq!(
            l,
            [
                "disk/by-id/scsi-36001405abc",
                "disk/by-path/ip-127.0.0.1:3260-iscsi-iqn-lun-1"
            ]
        );
    }

    #[test]
    fn not_running_is_reported_not_awaited() {
        let root = Root::new(std::env::temp_dir().join("lunkit-no-udev-root"));
        let t0 = Instant::now();
        let s = wait_processed(
            &root,
            &[("sda".into(), DevNum { major: 8, minor: 0 })],
            t0 + Duration::from_secs(30),
        )
        .unwrap();
        assert_eq!(s, [UdevState::NotRunning]);
        assert!(t0.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn waits_for_record_and_links() {
        let dir = std::env::temp_dir().join(format!("lunkit-udev-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("run/udev/data")).unwrap();
        fs::create_dir_all(dir.join("dev/disk/by-id")).unwrap();
        fs::write(dir.join("run/udev/control"), "").unwrap();
        let root = Root::new(&dir);
        let dev = DevNum {
            major: 8,
            minor: 16,
        };
        let devs = [("sdb".to_owned(), dev)];
        let soon = || Instant::now() + Duration::from_millis(100);
        // No record yet: times out naming the device.
        let err = wait_processed(&root, &devs, soon()).unwrap_err();
        assert!(err.to_string().contains("udevd to process sdb"), "{err}");
        // Record listing a link that does not exist yet: still not processed.
        fs::write(
            dir.join("run/udev/data/b8:16"),
            "S:disk/by-id/wwn-0x6001405abc\nE:ID_BUS=scsi\n",
        )
        .unwrap();
        assert!(matches!(
            wait_processed(&root, &devs, soon()),
            Err(Error::Timeout { .. })
        ));
        fs::write(dir.join("dev/disk/by-id/wwn-0x6001405abc"), "").unwrap();
        let s = wait_processed(&root, &devs, soon()).unwrap();
        assert_eq!(
            s,
            [UdevState::Processed {
                links: vec![dir.join("dev/disk/by-id/wwn-0x6001405abc")]
            }]
        );
        fs::remove_dir_all(&dir).unwrap();
    }
}

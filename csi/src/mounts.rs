//! Mounting and unmounting with mount(2) and umount2(2), and finding mounts in this process's
//! mount table. Unmounts are never lazy: a busy filesystem is reported, not hidden.

use std::ffi::CString;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::Instant;

use lunkit::block::mountinfo::{MountEntry, parse_table};
use rustix::fs::StatVfsMountFlags;
use rustix::mount::{MountFlags, UnmountFlags};

use crate::error::{Error, Result};

/// This process's mount table (`/proc/self/mountinfo`): the mount namespace it mounts in.
pub fn table() -> Result<Vec<MountEntry>> {
    let path = "/proc/self/mountinfo";
    let text =
        std::fs::read(path).map_err(|e| Error::Internal(format!("cannot read {path}: {e}")))?;
    Ok(parse_table(&text).mounts)
}

/// The path as the mount table shows it: resolved, if it exists.
fn canonical(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())
}

/// The topmost mount at `path`, if something is mounted there.
pub fn at(path: &Path) -> Result<Option<MountEntry>> {
    let want = canonical(path);
    Ok(table()?.into_iter().rev().find(|m| m.mount_point == want))
}

/// The mount flags and the filesystem-specific data of a CSI `mount_flags` list: the generic
/// flags (`ro`, `noatime`, `nodev`...) become flags, everything else is handed to the
/// filesystem, comma-separated.
pub fn split_options(options: &[String]) -> Result<(MountFlags, String)> {
    let mut flags = MountFlags::empty();
    let mut data: Vec<&str> = Vec::new();
    for o in options.iter().flat_map(|o| o.split(',')).map(str::trim) {
        match o {
            "" | "defaults" | "rw" => {}
            "ro" => flags |= MountFlags::RDONLY,
            "noatime" => flags |= MountFlags::NOATIME,
            "nodiratime" => flags |= MountFlags::NODIRATIME,
            "relatime" => flags |= MountFlags::RELATIME,
            "strictatime" => flags |= MountFlags::STRICTATIME,
            "lazytime" => flags |= MountFlags::LAZYTIME,
            "nodev" => flags |= MountFlags::NODEV,
            "nosuid" => flags |= MountFlags::NOSUID,
            "noexec" => flags |= MountFlags::NOEXEC,
            "sync" => flags |= MountFlags::SYNCHRONOUS,
            "dirsync" => flags |= MountFlags::DIRSYNC,
            "bind" | "rbind" | "remount" | "move" => {
                return Err(Error::InvalidArgument(format!(
                    "mount flag {o:?} is not allowed for a volume"
                )));
            }
            other => data.push(other),
        }
    }
    Ok((flags, data.join(",")))
}

/// Runs the system call `f` on a helper thread and waits for it until `deadline`. A mount or
/// unmount can block as long as the device's I/O does (a map queueing with no path, a dead
/// transport): past the deadline this returns `DEADLINE_EXCEEDED` and leaves the thread to
/// finish on its own, so that the volume's call ends and its slot is freed. What the call did
/// in the end is seen by the next one (every call checks the mount table first).
pub fn bounded<T: Send + 'static>(
    what: String,
    deadline: Instant,
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        Ok(r) => r,
        Err(mpsc::RecvTimeoutError::Timeout) => Err(Error::DeadlineExceeded(format!(
            "{what} has not returned by its deadline; it is left to finish on its own"
        ))),
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            Err(Error::Internal(format!("{what}: its helper thread failed")))
        }
    }
}

/// Mounts the filesystem on `device` (of type `fs_type`) at `target`, by `deadline`.
pub fn mount_fs(
    device: &Path,
    target: &Path,
    fs_type: &str,
    flags: MountFlags,
    data: &str,
    deadline: Instant,
) -> Result<()> {
    let data_c = CString::new(data)
        .map_err(|_| Error::InvalidArgument("a mount flag contains a NUL byte".into()))?;
    let what = format!(
        "mount {} ({fs_type}) on {}",
        device.display(),
        target.display()
    );
    let (device, target, fs_type) = (device.to_owned(), target.to_owned(), fs_type.to_owned());
    bounded(what.clone(), deadline, move || {
        rustix::mount::mount(&device, &target, &fs_type, flags, Some(data_c.as_c_str()))
            .map_err(|e| Error::Internal(format!("{what}: {e}")))
    })
}

/// The flags a publish may set on its bind mount: the per-mount flags (what `mountinfo`
/// shows in its sixth field), not the filesystem's own (`sync`, `lazytime`, its data), which
/// the stage's mount set once for every publish of the volume.
pub const PER_MOUNT: MountFlags = MountFlags::RDONLY
    .union(MountFlags::NOSUID)
    .union(MountFlags::NODEV)
    .union(MountFlags::NOEXEC)
    .union(MountFlags::NOATIME)
    .union(MountFlags::NODIRATIME)
    .union(MountFlags::RELATIME)
    .union(MountFlags::STRICTATIME)
    .union(MountFlags::NOSYMFOLLOW);

/// The atime modes, of which a mount has exactly one (`nodiratime` is not one: it is kept
/// beside any of them).
const ATIME_MODES: MountFlags = MountFlags::NOATIME
    .union(MountFlags::RELATIME)
    .union(MountFlags::STRICTATIME);

/// statfs's `ST_NOSYMFOLLOW` (Linux 5.10), for which rustix has no name.
const ST_NOSYMFOLLOW: u64 = 0x2000;

/// The flags of the bind remount that gives a bind of a mount whose flags are `current`
/// (statfs's `f_flag` of the bind) the per-mount flags `want` as well.
///
/// A bind remount sets the mount's flags to exactly what it is given: a flag left out is
/// cleared. So every flag the mount has is passed again (a `nosuid`, `nodev` or `noexec` the
/// stage's mount options set must reach the publish; a flag locked because the mount came
/// from another user namespace must be, or the kernel refuses), and `want` adds to them.
/// The atime mode is always named, so the kernel never picks one: `want`'s if it names one,
/// else the mount's own (neither `noatime` nor `relatime` is `strictatime`).
pub fn remount_flags(current: StatVfsMountFlags, want: MountFlags) -> MountFlags {
    let kept = [
        (StatVfsMountFlags::RDONLY, MountFlags::RDONLY),
        (StatVfsMountFlags::NOSUID, MountFlags::NOSUID),
        (StatVfsMountFlags::NODEV, MountFlags::NODEV),
        (StatVfsMountFlags::NOEXEC, MountFlags::NOEXEC),
        (StatVfsMountFlags::NODIRATIME, MountFlags::NODIRATIME),
        (
            StatVfsMountFlags::from_bits_retain(ST_NOSYMFOLLOW),
            MountFlags::NOSYMFOLLOW,
        ),
    ]
    .into_iter()
    .filter(|(st, _)| current.contains(*st))
    .fold(MountFlags::empty(), |acc, (_, ms)| acc | ms);
    let atime = if want.intersects(ATIME_MODES) {
        want & ATIME_MODES
    } else if current.contains(StatVfsMountFlags::NOATIME) {
        MountFlags::NOATIME
    } else if current.contains(StatVfsMountFlags::RELATIME) {
        MountFlags::RELATIME
    } else {
        MountFlags::STRICTATIME
    };
    MountFlags::BIND | kept | (want & PER_MOUNT & !ATIME_MODES) | atime
}

/// Bind-mounts `source` (a directory, or a device node) on `target` with the per-mount
/// flags `want` ([`PER_MOUNT`]: `RDONLY` for a read-only publish) on top of the flags of
/// `source`'s mount, which a bind keeps, by `deadline`. `scratch` is a private directory of
/// the plugin's (in its state directory) where a bind that needs flags is made first: see
/// `bind_with_flags`.
pub fn bind(
    source: &Path,
    target: &Path,
    want: MountFlags,
    scratch: &Path,
    deadline: Instant,
) -> Result<()> {
    let what = format!("bind mount {} on {}", source.display(), target.display());
    let (source, target, scratch) = (source.to_owned(), target.to_owned(), scratch.to_owned());
    bounded(what.clone(), deadline, move || {
        if !want.is_empty() {
            return bind_with_flags(&source, &target, want, &scratch)
                .map_err(|e| Error::Internal(format!("{what} with flags {want:?}: {e}")));
        }
        rustix::mount::mount_bind(&source, &target)
            .map_err(|e| Error::Internal(format!("{what}: {e}")))
    })
}

/// A bind of `source` on `target` with the flags `want` added to `source`'s, whose every copy
/// has them too.
///
/// A bind mount gets flags only by a remount, and a remount changes that one mount: the
/// copies that mount propagation already made of the bind in other mount namespaces keep
/// the flags they had. A plugin in a container publishes under kubelet's directory with
/// Bidirectional propagation, so kubelet and the pod would get a writable (or `suid`)
/// copy of a read-only (or `nosuid`) publish. So the bind is made at a place of `scratch`
/// first and given its flags there ([`remount_flags`]: those of the mount it copies, which
/// the remount would otherwise clear, and `want`); `target` gets a bind of that mount, which
/// carries its flags into every copy from the start; the place is unmounted and removed.
fn bind_with_flags(
    source: &Path,
    target: &Path,
    want: MountFlags,
    scratch: &Path,
) -> std::io::Result<()> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    fs::create_dir_all(scratch)?;
    let place = scratch.join(format!(
        "bind-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    if fs::metadata(source)?.is_dir() {
        fs::create_dir(&place)?;
    } else {
        fs::File::create_new(&place)?;
    }
    let bound = rustix::mount::mount_bind(source, &place).map_err(std::io::Error::from);
    let done = bound.and_then(|()| {
        let flagged = rustix::fs::statvfs(&place)
            .and_then(|st| rustix::mount::mount_remount(&place, remount_flags(st.f_flag, want), ""))
            .and_then(|()| rustix::mount::mount_bind(&place, target));
        let _ = rustix::mount::unmount(&place, UnmountFlags::NOFOLLOW);
        flagged.map_err(std::io::Error::from)
    });
    let _ = fs::remove_dir(&place).or_else(|_| fs::remove_file(&place));
    done
}

/// Unmounts and removes whatever `bind_with_flags` left in `scratch` (a crash between its
/// steps), by `deadline`; a missing `scratch` is fine.
pub fn clear_scratch(scratch: &Path, deadline: Instant) -> Result<()> {
    let Ok(entries) = fs::read_dir(scratch) else {
        return Ok(());
    };
    for e in entries.flatten() {
        let place = e.path();
        unmount_all(&place, deadline)?;
        let _ = fs::remove_dir(&place).or_else(|_| fs::remove_file(&place));
    }
    Ok(())
}

/// Unmounts `target`, never lazily, by `deadline`. A busy filesystem is
/// `FAILED_PRECONDITION`.
pub fn unmount(target: &Path, deadline: Instant) -> Result<()> {
    let target = target.to_owned();
    bounded(
        format!("unmount {}", target.display()),
        deadline,
        move || {
            rustix::mount::unmount(&target, UnmountFlags::NOFOLLOW).map_err(|e| {
                let msg = format!("unmount {}: {e}", target.display());
                if e == rustix::io::Errno::BUSY {
                    Error::FailedPrecondition(msg)
                } else {
                    Error::Internal(msg)
                }
            })
        },
    )
}

/// Unmounts everything mounted at `target` (bind mounts can stack), by `deadline`; nothing
/// there is fine.
pub fn unmount_all(target: &Path, deadline: Instant) -> Result<()> {
    for _ in 0..16 {
        if at(target)?.is_none() {
            return Ok(());
        }
        unmount(target, deadline)?;
    }
    Err(Error::Internal(format!(
        "{} is still mounted after 16 unmounts",
        target.display()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn generic_flags_become_flags_and_the_rest_data() {
        let opts = vec![
            "noatime".to_owned(),
            "ro,discard".to_owned(),
            "data=ordered".to_owned(),
        ];
        let (flags, data) = split_options(&opts).unwrap();
        assert_eq!(flags, MountFlags::NOATIME | MountFlags::RDONLY);
        assert_eq!(data, "discard,data=ordered");
        let e = split_options(&["bind".to_owned()]).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
    }

    #[test]
    fn a_bind_remount_keeps_every_flag_of_the_mount_and_adds_the_wanted_ones() {
        use MountFlags as M;
        use StatVfsMountFlags as S;
        // A staging mount made with `nosuid,nodev,noexec` (relatime, the kernel's default),
        // published read-only: every flag stays, not `BIND|RDONLY` alone.
        let staging = S::NOSUID | S::NODEV | S::NOEXEC | S::RELATIME;
        assert_eq!(
            remount_flags(staging, M::RDONLY),
            M::BIND | M::RDONLY | M::NOSUID | M::NODEV | M::NOEXEC | M::RELATIME
        );
        // The atime mode is always named: the mount's own, or the one the publish asks.
        let noatime = S::NOATIME | S::NODIRATIME;
        assert_eq!(
            remount_flags(noatime, M::RDONLY),
            M::BIND | M::RDONLY | M::NOATIME | M::NODIRATIME
        );
        assert_eq!(
            remount_flags(noatime, M::RELATIME),
            M::BIND | M::RELATIME | M::NODIRATIME
        );
        assert_eq!(
            remount_flags(S::empty(), M::RDONLY),
            M::BIND | M::RDONLY | M::STRICTATIME
        );
        // The publish's own flags add to the mount's; a read-only mount stays read-only, and
        // nosymfollow (a bit rustix has no name for) is kept; statfs's ST_VALID is not a flag.
        let ro = S::RDONLY | S::RELATIME | S::from_bits_retain(ST_NOSYMFOLLOW | 0x20);
        assert_eq!(
            remount_flags(ro, M::NOSUID | M::NOEXEC),
            M::BIND | M::RDONLY | M::NOSUID | M::NOEXEC | M::RELATIME | M::NOSYMFOLLOW
        );
    }

    #[test]
    fn the_per_mount_flags_of_mount_options() {
        let opts = vec![
            "nosuid,nodev".to_owned(),
            "noexec".to_owned(),
            "discard".to_owned(),
        ];
        let (flags, data) = split_options(&opts).unwrap();
        assert_eq!(
            flags & PER_MOUNT,
            MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC
        );
        assert_eq!(data, "discard");
        let (flags, _) = split_options(&["sync".to_owned(), "lazytime".to_owned()]).unwrap();
        assert_eq!(
            flags & PER_MOUNT,
            MountFlags::empty(),
            "the filesystem's flags"
        );
    }

    #[test]
    fn a_system_call_that_hangs_is_left_at_the_deadline_and_one_that_returns_answers() {
        // A thread that does not return in time stands in for a mount blocked on a device.
        let (release, hold) = mpsc::channel::<()>();
        let e = bounded(
            "mount /dev/stuck on /mnt".into(),
            Instant::now() + Duration::from_millis(100),
            move || {
                let _ = hold.recv();
                Ok(())
            },
        )
        .unwrap_err();
        assert_eq!(e.code(), tonic::Code::DeadlineExceeded, "{e}");
        assert!(e.to_string().contains("mount /dev/stuck on /mnt"), "{e}");
        drop(release);
        let v = bounded(
            "stat".into(),
            Instant::now() + Duration::from_secs(60),
            || Ok(7),
        );
        assert_eq!(v.unwrap(), 7);
        let e = unmount(
            Path::new("/nonexistent-lunkit-csi"),
            Instant::now() + Duration::from_secs(60),
        )
        .unwrap_err();
        assert!(e.to_string().contains("/nonexistent-lunkit-csi"), "{e}");
    }

    #[test]
    fn finds_the_root_mount() {
        let root = at(Path::new("/")).unwrap().expect("/ is mounted");
        assert_eq!(root.mount_point, Path::new("/"));
    }
}

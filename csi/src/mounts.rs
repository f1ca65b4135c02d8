//! Mounting and unmounting with mount(2) and umount2(2), and finding mounts in this process's
//! mount table. Unmounts are never lazy: a busy filesystem is reported, not hidden.

use std::ffi::CString;
use std::path::{Path, PathBuf};

use lunkit::mountinfo::{MountEntry, parse_table};
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

/// Mounts the filesystem on `device` (of type `fs_type`) at `target`.
pub fn mount_fs(
    device: &Path,
    target: &Path,
    fs_type: &str,
    flags: MountFlags,
    data: &str,
) -> Result<()> {
    let data_c = CString::new(data)
        .map_err(|_| Error::InvalidArgument("a mount flag contains a NUL byte".into()))?;
    rustix::mount::mount(device, target, fs_type, flags, Some(data_c.as_c_str())).map_err(|e| {
        Error::Internal(format!(
            "mount {} ({fs_type}) on {}: {e}",
            device.display(),
            target.display()
        ))
    })
}

/// Bind-mounts `source` (a directory, or a device node) on `target`, read-only if asked.
pub fn bind(source: &Path, target: &Path, readonly: bool) -> Result<()> {
    rustix::mount::mount_bind(source, target).map_err(|e| {
        Error::Internal(format!(
            "bind mount {} on {}: {e}",
            source.display(),
            target.display()
        ))
    })?;
    if readonly {
        // A bind mount takes its read-only flag only from a remount of the bind.
        if let Err(e) =
            rustix::mount::mount_remount(target, MountFlags::BIND | MountFlags::RDONLY, "")
        {
            let _ = unmount(target);
            return Err(Error::Internal(format!(
                "make the bind mount on {} read-only: {e}",
                target.display()
            )));
        }
    }
    Ok(())
}

/// Unmounts `target`, never lazily. A busy filesystem is `FAILED_PRECONDITION`.
pub fn unmount(target: &Path) -> Result<()> {
    rustix::mount::unmount(target, UnmountFlags::NOFOLLOW).map_err(|e| {
        let msg = format!("unmount {}: {e}", target.display());
        if e == rustix::io::Errno::BUSY {
            Error::FailedPrecondition(msg)
        } else {
            Error::Internal(msg)
        }
    })
}

/// Unmounts everything mounted at `target` (bind mounts can stack); nothing there is fine.
pub fn unmount_all(target: &Path) -> Result<()> {
    for _ in 0..16 {
        if at(target)?.is_none() {
            return Ok(());
        }
        unmount(target)?;
    }
    Err(Error::Internal(format!(
        "{} is still mounted after 16 unmounts",
        target.display()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn finds_the_root_mount() {
        let root = at(Path::new("/")).unwrap().expect("/ is mounted");
        assert_eq!(root.mount_point, Path::new("/"));
    }
}

//! One operation per volume at a time.
//!
//! Two layers: an in-process table of volume keys (threads of one CSI plugin), and an
//! optional `flock(2)` on `<dir>/<key>.lock` (several processes on one node, e.g. the plugin
//! and an operator's `lunkit detach`). Different volumes never wait for each other. Lock
//! files are left in place: deleting one while another process waits on it would let a third
//! process lock a new file of the same name, and both would run.

use std::collections::HashSet;
use std::os::fd::OwnedFd;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use rustix::fs::{FlockOperation, Mode, OFlags};

use crate::error::{Error, Result};

/// Keys held by this process.
static HELD: Mutex<Option<HashSet<String>>> = Mutex::new(None);
/// Signalled whenever a key is released.
static RELEASED: Condvar = Condvar::new();

/// A held volume lock; released on drop.
#[derive(Debug)]
pub struct VolumeLock {
    key: String,
    // Closing the fd releases the flock.
    _file: Option<OwnedFd>,
}

impl Drop for VolumeLock {
    fn drop(&mut self) {
        let mut held = HELD.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(set) = held.as_mut() {
            set.remove(&self.key);
        }
        RELEASED.notify_all();
    }
}

/// Takes the lock on volume `key`, waiting until `deadline`: first in this process, then, if
/// `dir` is given, across processes with `flock` on a file in `dir` (created 0700/0600 if
/// missing). A deadline that passes gives [`Error::Timeout`] naming the lock.
pub fn lock(key: &str, dir: Option<&Path>, deadline: Instant) -> Result<VolumeLock> {
    let start = Instant::now();
    {
        let mut held = HELD.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            let set = held.get_or_insert_with(HashSet::new);
            if set.insert(key.to_owned()) {
                break;
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::Timeout {
                    what: format!("another operation on volume {key} in this process"),
                    waited: now - start,
                });
            }
            held = wait(held, deadline - now);
        }
    }
    // From here on the in-process key is ours; the guard gives it back on any error.
    let mut guard = VolumeLock {
        key: key.to_owned(),
        _file: None,
    };
    if let Some(dir) = dir {
        guard._file = Some(lock_file(dir, key, deadline, start)?);
    }
    Ok(guard)
}

fn wait(
    held: MutexGuard<'static, Option<HashSet<String>>>,
    timeout: Duration,
) -> MutexGuard<'static, Option<HashSet<String>>> {
    RELEASED
        .wait_timeout(held, timeout)
        .unwrap_or_else(PoisonError::into_inner)
        .0
}

/// The lock file's path for `key`: characters outside `[A-Za-z0-9._-]` become `_`, so a key
/// can never name another directory. Distinct keys that map to one file only serialize.
pub fn file_path(dir: &Path, key: &str) -> PathBuf {
    let mut name: String = key
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .take(200)
        .collect();
    if name.starts_with('.') {
        name.insert(0, '_');
    }
    dir.join(format!("{name}.lock"))
}

fn lock_file(dir: &Path, key: &str, deadline: Instant, start: Instant) -> Result<OwnedFd> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| Error::io(dir, e))?;
    let path = file_path(dir, key);
    let fd = rustix::fs::open(
        &path,
        OFlags::CREATE | OFlags::RDWR | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::from_raw_mode(0o600),
    )
    .map_err(|e| Error::io(&path, e.into()))?;
    // flock cannot time out, so poll the non-blocking form, with the waits' backoff.
    crate::wait::until_polled(
        deadline,
        &|| format!("lock {} held by another process", path.display()),
        || match rustix::fs::flock(&fd, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => Ok(Some(())),
            Err(rustix::io::Errno::WOULDBLOCK) => Ok(None),
            Err(e) => Err(Error::io(&path, e.into())),
        },
    )
    .map_err(|e| match e {
        // The wait began with the in-process lock, not here.
        Error::Timeout { what, .. } => Error::Timeout {
            what,
            waited: start.elapsed(),
        },
        e => e,
    })?;
    Ok(fd)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn file_names_stay_in_the_directory() {
        let d = Path::new("/run/lunkit/locks");
        assert_eq!(file_path(d, "36001405abc"), d.join("36001405abc.lock"));
        assert_eq!(file_path(d, "../../etc/x"), d.join("_.._.._etc_x.lock"));
        assert_eq!(file_path(d, "t10.LIO a/b"), d.join("t10.LIO_a_b.lock"));
        assert_eq!(file_path(d, "..").parent(), Some(d));
        assert!(file_path(d, &"x".repeat(1000)).file_name().unwrap().len() <= 205);
    }

    #[test]
    fn same_key_is_exclusive_other_keys_are_not() {
        let inside = Arc::new(AtomicUsize::new(0));
        let max = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (inside, max) = (inside.clone(), max.clone());
                std::thread::spawn(move || {
                    let deadline = Instant::now() + Duration::from_secs(10);
                    let _l = lock("test-same-key", None, deadline).unwrap();
                    let n = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    max.fetch_max(n, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(5));
                    inside.fetch_sub(1, Ordering::SeqCst);
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(max.load(Ordering::SeqCst), 1);

        let a = lock("test-key-a", None, Instant::now()).unwrap();
        let b = lock("test-key-b", None, Instant::now()).unwrap();
        drop((a, b));
    }

    #[test]
    fn waiting_past_the_deadline_times_out() {
        let _held = lock("test-timeout", None, Instant::now()).unwrap();
        let t0 = Instant::now();
        let err = lock("test-timeout", None, t0 + Duration::from_millis(30)).unwrap_err();
        assert!(matches!(err, Error::Timeout { .. }), "{err}");
        assert!(t0.elapsed() >= Duration::from_millis(30));
    }

    #[test]
    fn file_lock_excludes_another_open_file_description() {
        let dir = std::env::temp_dir().join(format!("lunkit-lock-{}", std::process::id()));
        let _held = lock("test-file", Some(&dir), Instant::now()).unwrap();
        // A second open of the same file is what another process would do.
        let t0 = Instant::now();
        let err = lock_file(&dir, "test-file", t0 + Duration::from_millis(30), t0).unwrap_err();
        assert!(matches!(err, Error::Timeout { .. }), "{err}");
        drop(_held);
        lock_file(&dir, "test-file", Instant::now(), Instant::now()).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }
}

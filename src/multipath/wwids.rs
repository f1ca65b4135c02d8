//! multipathd's `wwids` file: the WWIDs multipath-tools has been told (or has decided) to
//! build maps for. With `find_multipaths` `strict`, `yes` or `smart`, a WWID not in it gets
//! no map from multipathd, and a map whose WWID is not there does not survive a restart or a
//! `reconfigure`. [`remember_wwid`] adds one, as `multipath -a` does.
//!
//! multipath-tools (libmultipath `open_file`) takes a POSIX write lock (`fcntl` `F_SETLKW`,
//! `F_WRLCK`, the whole file) on the file itself before it reads or writes it, and writes the
//! header when the file is empty. The same lock is taken here, so that a line is never
//! written while multipathd rewrites the file (`replace_wwids`) or appends its own. A POSIX
//! lock belongs to the process, not to the descriptor: two threads of one process do not
//! exclude each other with it, and closing any descriptor of the file drops it. So the
//! threads of this process are kept one at a time by a mutex around the whole exchange, and
//! the file is opened once per exchange.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use rustix::fs::FlockOperation;
use rustix::io::Errno;

use crate::error::{Error, Result};
use crate::id::Wwid;
use crate::root::Root;

/// Where multipath-tools keeps the file by default (`wwids_file`), under the root.
pub const WWIDS_FILE: &str = "etc/multipath/wwids";

/// The header multipath-tools writes at the top of a new file (`WWIDS_FILE_HEADER`), so that
/// its tools take the file as theirs.
pub const WWIDS_HEADER: &str = "# Multipath wwids, Version : 1.0\n\
    # NOTE: This file is automatically maintained by multipath and multipathd.\n\
    # You should not need to edit this file in normal circumstances.\n\
    #\n\
    # Valid WWIDs:\n";

/// One exchange with the file at a time in this process (see the module's text).
static FILE: Mutex<()> = Mutex::new(());

/// Adds `wwid` (as a `/WWID/` line, multipath form) to multipathd's `wwids` file under
/// `root` ([`WWIDS_FILE`]), unless a line names it already; the file and its directory are
/// made (0600, 0700, as multipath-tools makes them, with its header) when missing. Waits
/// for multipath-tools' lock on the file until `deadline`. Returns whether the line was added.
///
/// # Errors
///
/// [`Error::Timeout`] when the lock is held until `deadline`; [`Error::Io`] naming the file
/// otherwise (a read-only `/etc`, say). [`Error::Invalid`] for a WWID that cannot be a
/// line of the file (a space or a `/` in it).
pub fn remember_wwid(root: &Root, wwid: &Wwid, deadline: Instant) -> Result<bool> {
    remember_in(&root.path().join(WWIDS_FILE), wwid, deadline)
}

/// [`remember_wwid`] on the file `path`, for a node whose `multipath.conf` names another
/// `wwids_file`.
pub fn remember_in(path: &Path, wwid: &Wwid, deadline: Instant) -> Result<bool> {
    let key = wwid.to_multipath();
    if key.contains(|c: char| c == '/' || c.is_whitespace()) {
        return Err(Error::invalid(
            "WWID for multipathd's wwids file",
            &key,
            "contains a space or '/', which its lines cannot hold",
        ));
    }
    let io = |e: std::io::Error| Error::io(path, e);
    let _one = FILE.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(dir) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(io)?;
    }
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        // Its lines are kept: this only ever adds one.
        .truncate(false)
        .mode(0o600)
        .open(path)
        .map_err(io)?;
    lock(&file, path, deadline)?;
    let mut text = String::new();
    file.read_to_string(&mut text).map_err(io)?;
    if names(&text, &key) {
        return Ok(false);
    }
    let mut add = String::new();
    if text.is_empty() {
        add.push_str(WWIDS_HEADER);
    } else if !text.ends_with('\n') {
        // A last line without its end (an edit by hand): the new line must not join it.
        add.push('\n');
    }
    add.push_str(&format!("/{key}/\n"));
    let end = file.seek(SeekFrom::End(0)).map_err(io)?;
    if let Err(e) = file
        .write_all(add.as_bytes())
        .and_then(|()| file.sync_all())
    {
        // Half a line would name a WWID no one asked for: take it back.
        let _ = file.set_len(end);
        return Err(io(e));
    }
    Ok(true)
    // Dropping `file` closes it, which releases the lock.
}

/// Whether a line of `text` names `key`, as multipath-tools reads the file: a line that
/// starts with `/`, the WWID up to the next `/`; anything else is a comment.
fn names(text: &str, key: &str) -> bool {
    text.lines().any(|l| {
        l.strip_prefix('/')
            .and_then(|rest| rest.split_once('/'))
            .is_some_and(|(w, _)| w == key)
    })
}

/// multipath-tools' lock: a POSIX write lock on the whole file, asked without blocking and
/// again on a short backoff until `deadline` (multipathd holds it for one read or write).
fn lock(file: &File, path: &Path, deadline: Instant) -> Result<()> {
    let start = Instant::now();
    let mut pause = Duration::from_millis(1);
    loop {
        match rustix::fs::fcntl_lock(file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => return Ok(()),
            Err(Errno::AGAIN | Errno::ACCESS | Errno::INTR) => {}
            Err(e) => return Err(Error::io(path, e.into())),
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::Timeout {
                what: format!(
                    "multipath-tools' lock on {} (held by multipath or multipathd)",
                    path.display()
                ),
                waited: start.elapsed(),
            });
        }
        std::thread::sleep(pause.min(left));
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_names_a_wwid_up_to_its_second_slash() {
        let text = "# /3600a/ in a comment\n/3600b/\n/3600c/ trailing\n";
        assert!(!names(text, "3600a"));
        assert!(names(text, "3600b"));
        assert!(names(text, "3600c"));
        assert!(!names(text, "3600"));
    }
}

//! The connect itself: opening `/dev/nvme-fabrics`, the write of an option string on a helper
//! thread bounded by a deadline, the reply, and the controller a connect made after its caller
//! gave up (deleted, since nobody was told of it).

use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::{MAX_OPTIONS_LEN, Reply, parse_options, parse_reply};
use crate::error::{Error, Result};
use crate::helper::{self, Subject};
use crate::root::Root;

/// `<root>/dev/nvme-fabrics`.
fn device(root: &Root) -> PathBuf {
    root.dev("nvme-fabrics")
}

/// Opens `/dev/nvme-fabrics` read-write, refusing anything that is not a character device
/// (a regular file or FIFO planted at the path in a `--root` tree gets no connect string).
fn open(path: &Path) -> Result<fs::File> {
    let file = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ENOENT) => Error::NotFound {
                what: format!(
                    "{} does not exist; load the NVMe/TCP modules with `modprobe nvme-tcp` \
                     (it brings nvme-fabrics) and run this again",
                    path.display()
                ),
            },
            _ => Error::io(path, e),
        })?;
    let meta = file.metadata().map_err(|e| Error::io(path, e))?;
    if !meta.file_type().is_char_device() {
        return Err(Error::io(path, io::Error::from_raw_os_error(libc::ENODEV)));
    }
    Ok(file)
}

/// The options this kernel's `nvme-fabrics` accepts, read from a fresh descriptor.
pub fn supported_options(root: &Root) -> Result<Vec<String>> {
    let path = device(root);
    let mut text = String::new();
    open(&path)?
        .take(MAX_OPTIONS_LEN as u64)
        .read_to_string(&mut text)
        .map_err(|e| Error::io(&path, e))?;
    parse_options(&text)
}

/// Who learns of the controller a connect made: the caller while it waits, else nobody.
#[derive(Debug)]
enum Handoff {
    /// The caller still waits.
    Waiting,
    /// The kernel answered; the caller takes the reply (even one that came at the deadline).
    Answered(String),
    /// The caller gave up: a controller made now is nobody's, and the helper deletes it.
    Abandoned,
}

/// Writes the connect string `options` (from [`option_string`](super::option_string)) and reads the reply, giving
/// up at `deadline`.
///
/// The write cannot be interrupted and can block for as long as the kernel's TCP connect and
/// admin commands wait, so it runs on a helper thread. Past the deadline this returns
/// [`Error::Timeout`]; if the kernel still makes the controller afterwards, the helper
/// deletes it, since no caller was told of it. A reply that comes just as the deadline
/// passes is taken, not deleted.
///
/// The kernel's refusals come back as [`Error::Connect`] with its errno and what it most
/// likely means.
pub fn write(root: &Root, options: &str, describe: &str, deadline: Instant) -> Result<Reply> {
    let path = device(root);
    // Opened here, so a missing or fake device fails before a thread is started.
    let mut file = open(&path)?;
    // Blocking from here on: the connect's write waits for the controller.
    clear_nonblock(&file, &path)?;
    // The connect's target names the subject, never its options (they may hold a secret).
    let subject = Subject::write(&path, describe);
    let what = || format!("the connect to {describe}");
    let options = options.to_owned();
    let handoff = Arc::new(Mutex::new(Handoff::Waiting));
    let helper_side = Arc::clone(&handoff);
    let late = (
        root.clone(),
        option_value(&options, "nqn").map(str::to_owned),
    );
    let text = helper::bounded(subject, deadline, &what, move || {
        file.write(options.as_bytes())
            .map_err(|e| Error::io(&path, e))
            .and_then(|n| {
                // One store takes the whole string or fails; a short count is the kernel's
                // way of saying it took a part, which no kernel does.
                if n == options.len() {
                    Ok(())
                } else {
                    Err(Error::io(&path, io::Error::from(io::ErrorKind::WriteZero)))
                }
            })?;
        let mut text = String::new();
        (&mut file)
            .take(MAX_OPTIONS_LEN as u64)
            .read_to_string(&mut text)
            .map_err(|e| Error::io(&path, e))?;
        let mut h = helper_side.lock().unwrap_or_else(PoisonError::into_inner);
        if matches!(*h, Handoff::Abandoned) {
            drop(h);
            delete_late(&late.0, &text, late.1.as_deref());
        } else {
            *h = Handoff::Answered(text.clone());
        }
        Ok(text)
    });
    let text = match text {
        Err(e @ Error::Timeout { .. }) => {
            let mut h = handoff.lock().unwrap_or_else(PoisonError::into_inner);
            match std::mem::replace(&mut *h, Handoff::Abandoned) {
                Handoff::Answered(text) => Ok(text),
                _ => Err(e),
            }
        }
        other => other,
    };
    let text = text.map_err(|e| match e {
        Error::Io { source, .. } => Error::Connect {
            target: describe.to_owned(),
            hint: connect_hint(source.raw_os_error()),
            source,
        },
        e => e,
    })?;
    parse_reply(&text)
}

/// Deletes the controller a connect made after its caller gave up (`reply` names it), while
/// it is still that one: the same subsystem and controller id.
fn delete_late(root: &Root, reply: &str, nqn: Option<&str>) {
    let Ok(r) = parse_reply(reply) else {
        return;
    };
    let name = format!("nvme{}", r.instance);
    if let Ok(Some(c)) = crate::nvme::sysfs::controller(root, &name) {
        if c.cntlid == Some(r.cntlid) && c.subsysnqn.as_deref() == nqn {
            let _ = crate::nvme::delete_controller(root, &c, Instant::now() + LATE_DELETE);
        }
    }
}

/// How long a late connect's helper may take to delete the controller nobody asked for.
const LATE_DELETE: Duration = Duration::from_secs(30);

/// The value of option `name` in an option string (`nqn=…`): the first, as the kernel takes.
pub(super) fn option_value<'a>(options: &'a str, name: &str) -> Option<&'a str> {
    options
        .split(',')
        .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
}

/// Drops `O_NONBLOCK` (set for the open, against a FIFO) from `file`.
fn clear_nonblock(file: &fs::File, path: &Path) -> Result<()> {
    use rustix::fs::{OFlags, fcntl_getfl, fcntl_setfl};
    let flags = fcntl_getfl(file).map_err(|e| Error::io(path, e.into()))?;
    fcntl_setfl(file, flags - OFlags::NONBLOCK).map_err(|e| Error::io(path, e.into()))
}

/// What an errno from a connect most likely means (`drivers/nvme/host/fabrics.c`, `tcp.c`).
pub(super) fn connect_hint(errno: Option<i32>) -> &'static str {
    match errno {
        Some(libc::EALREADY) => {
            "a controller to this subsystem at this address for this host exists already"
        }
        Some(libc::EINVAL) => {
            "the kernel refused the options (its log says which): an unknown transport \
             (is nvme-tcp loaded?), or a host NQN already registered with another host id"
        }
        Some(libc::ECONNREFUSED) => "nothing listens at that address and port",
        Some(libc::ETIMEDOUT) | Some(libc::EHOSTUNREACH) | Some(libc::ENETUNREACH) => {
            "the address cannot be reached"
        }
        Some(libc::ENOENT) | Some(libc::ENODEV) => {
            "the kernel has no such transport (load nvme-tcp)"
        }
        Some(libc::EPERM) | Some(libc::EACCES) => "connecting needs CAP_SYS_ADMIN",
        Some(libc::ENOKEY) => {
            "the subsystem requires DH-HMAC-CHAP authentication and no host secret was given"
        }
        Some(libc::EKEYREJECTED) => {
            "DH-HMAC-CHAP authentication failed: the subsystem rejected the host secret, or \
             the controller could not prove itself with the controller secret"
        }
        Some(libc::EIO) => {
            "the controller failed while it was being set up (the kernel's log says why); \
             with DH-HMAC-CHAP, a refused secret comes back this way when the target dropped \
             the connection before the host's failure message, after the kernel's admin \
             timeout (nvme_core.admin_timeout, 60 s)"
        }
        Some(libc::EPROTONOSUPPORT) => {
            "the subsystem requires DH-HMAC-CHAP authentication, which this kernel was built \
             without (CONFIG_NVME_HOST_AUTH)"
        }
        _ => "",
    }
}

//! multipathd's control socket: the client half of what `multipathd -k` speaks.
//!
//! Each message, both ways, is a native `size_t` length and then that many bytes, the text
//! with its NUL. multipathd listens on the abstract name `@/org/kernel/linux/storage/multipathd`
//! and, in newer multipath-tools, on `/run/multipathd.socket` too.
//!
//! Two things about that socket are not what a caller would assume, and both are handled here:
//!
//! - **Connecting can block.** A Unix stream `connect` waits, without limit, while the
//!   listener's accept queue is full: a multipathd whose listener is stuck, with a few `multipath`
//!   or `multipathd -k` clients already queued, holds every new caller. So the connect is
//!   non-blocking and retried until the caller's deadline.
//! - **The name proves nothing.** An abstract name has no file permissions: any process of the
//!   network namespace (a pod on the host network) can bind it first and answer `ok` to
//!   `del map` without removing anything. The connection is trusted only when the process that
//!   listens is root, by the kernel's own record of it (`SO_PEERCRED`). multipathd always runs
//!   as root. In a user namespace that does not map root, its uid reads as the overflow uid, and
//!   it is not trusted; callers then do the work through device-mapper themselves.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use rustix::io::Errno;
use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};

use crate::error::{Error, Result};
use crate::root::Root;

/// multipathd's abstract control socket (`@/org/kernel/linux/storage/multipathd`).
pub const MULTIPATHD_SOCKET: &[u8] = b"/org/kernel/linux/storage/multipathd";

/// How the abstract socket is named in messages.
const ABSTRACT_LABEL: &str = "@/org/kernel/linux/storage/multipathd";

/// Replies longer than this are refused (multipath-tools' `MAX_REPLY_LEN`).
const MAX_REPLY: usize = 32 << 20;

/// Who listens on the other end, as the kernel recorded it when that process called
/// `listen` (`SO_PEERCRED`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    /// Its process id, in the caller's pid namespace (0 when it is outside it).
    pub pid: i32,
    /// Its user id.
    pub uid: u32,
    /// Its group id.
    pub gid: u32,
}

/// A connection to multipathd's control socket, to a listener that runs as root.
#[derive(Debug)]
pub struct Multipathd {
    stream: UnixStream,
    socket: String,
    peer: Peer,
}

impl Multipathd {
    /// Connects to the abstract socket (per network namespace, so `root` does not apply),
    /// then to `<root>/run/multipathd.socket`. `Ok(None)` when neither has a listener:
    /// multipathd is not running.
    ///
    /// # Errors
    ///
    /// - [`Error::Timeout`] when a listener exists but its accept queue stays full until
    ///   `deadline` (multipathd is not accepting).
    /// - [`Error::Io`] with [`io::ErrorKind::PermissionDenied`] when the listener is not
    ///   root: it is not multipathd, and nothing it says can be trusted. The message names
    ///   its pid and uid.
    pub fn connect(root: &Root, deadline: Instant) -> Result<Option<Multipathd>> {
        let abstract_addr = SocketAddrUnix::new_abstract_name(MULTIPATHD_SOCKET)
            .map_err(|e| Error::io(ABSTRACT_LABEL, e.into()))?;
        if let Some(d) = Self::connect_to(&abstract_addr, ABSTRACT_LABEL, deadline)? {
            return Ok(Some(d));
        }
        let path = root.run("multipathd.socket");
        let label = path.display().to_string();
        // A path too long for `sun_path` cannot be where multipathd listens.
        match SocketAddrUnix::new(&path) {
            Ok(addr) => Self::connect_to(&addr, &label, deadline),
            Err(_) => Ok(None),
        }
    }

    /// Connects to one address; `Ok(None)` when nothing listens there.
    fn connect_to(addr: &SocketAddrUnix, label: &str, deadline: Instant) -> Result<Option<Self>> {
        let fd = rustix::net::socket_with(
            AddressFamily::UNIX,
            SocketType::STREAM,
            SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
            None,
        )
        .map_err(|e| Error::io(label, e.into()))?;
        // Unix stream sockets connect at once or fail at once: EAGAIN, not EINPROGRESS, is
        // "the accept queue is full", and the socket may simply try again.
        let connected = crate::wait::until_with(
            deadline,
            &|| format!("room in the accept queue of {label} (multipathd is not accepting)"),
            &mut |wake| {
                std::thread::sleep(wake.saturating_duration_since(Instant::now()));
                Ok(())
            },
            || match rustix::net::connect(&fd, addr) {
                Ok(()) => Ok(Some(true)),
                Err(Errno::AGAIN) => Ok(None),
                // ENOENT, ECONNREFUSED: no listener. Anything else (EACCES on the path) is
                // not a multipathd this process can use either.
                Err(_) => Ok(Some(false)),
            },
        )?;
        if !connected {
            return Ok(None);
        }
        let stream = UnixStream::from(fd);
        stream
            .set_nonblocking(false)
            .map_err(|e| Error::io(label, e))?;
        let cred = crate::ioctl::so_peercred(&stream).map_err(|e| Error::io(label, e))?;
        let peer = Peer {
            pid: cred.pid,
            uid: cred.uid,
            gid: cred.gid,
        };
        if peer.uid != 0 {
            return Err(Error::io(
                label,
                io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!(
                        "the listener is pid {} with uid {}, not root: it is not multipathd, \
                         and its answers are not trusted",
                        peer.pid, peer.uid
                    ),
                ),
            ));
        }
        Ok(Some(Multipathd {
            stream,
            socket: label.to_owned(),
            peer,
        }))
    }

    /// The process that listens on the socket (root, or the connection would not exist).
    pub fn peer(&self) -> Peer {
        self.peer
    }

    /// `add path DISK`: multipathd takes the path device `disk` (a kernel name, `sdc`) into
    /// account, as a udev `add` event would make it. [`Answer::Blacklisted`] is the node's
    /// policy for it: no map will hold it.
    pub fn add_path(&mut self, disk: &str, deadline: Instant) -> Result<Answer> {
        crate::sysfs::check_component("path device", disk)?;
        if disk.contains(char::is_whitespace) {
            return Err(Error::invalid("path device", disk, "contains a space"));
        }
        Ok(Answer::parse(
            &self.command(&format!("add path {disk}"), deadline)?,
        ))
    }

    /// `add map WWID`: multipathd builds the map of `wwid` from the paths it knows with that
    /// WWID, whatever `find_multipaths` says (an administrator named it), as
    /// `multipathd add map` does.
    pub fn add_map(&mut self, wwid: &crate::id::Wwid, deadline: Instant) -> Result<Answer> {
        let key = wwid.to_multipath();
        if key.contains(char::is_whitespace) {
            return Err(Error::invalid(
                "WWID for multipathd",
                &key,
                "contains a space, which its commands cannot carry",
            ));
        }
        Ok(Answer::parse(
            &self.command(&format!("add map {key}"), deadline)?,
        ))
    }

    /// Sends `command` and returns the reply text, waiting at most until `deadline`.
    pub fn command(&mut self, command: &str, deadline: Instant) -> Result<String> {
        let start = Instant::now();
        let socket = || PathBuf::from(&self.socket);
        let io_err = |e: io::Error| {
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) {
                Error::Timeout {
                    what: format!("multipathd's reply to {command:?}"),
                    waited: start.elapsed(),
                }
            } else {
                Error::io(socket(), e)
            }
        };
        if command.contains('\0') {
            return Err(Error::invalid(
                "multipathd command",
                command,
                "contains NUL",
            ));
        }
        // A zero timeout means "none" to the socket: at a passed deadline, wait 1 ms.
        let left = || {
            let d = deadline.saturating_duration_since(Instant::now());
            Some(d.max(Duration::from_millis(1)))
        };
        self.stream.set_write_timeout(left()).map_err(io_err)?;
        let mut msg = Vec::with_capacity(size_of::<usize>() + command.len() + 1);
        msg.extend_from_slice(&(command.len() + 1).to_ne_bytes());
        msg.extend_from_slice(command.as_bytes());
        msg.push(0);
        self.stream.write_all(&msg).map_err(io_err)?;
        self.stream.set_read_timeout(left()).map_err(io_err)?;
        let mut len = [0u8; size_of::<usize>()];
        self.stream.read_exact(&mut len).map_err(io_err)?;
        let len = usize::from_ne_bytes(len);
        if len == 0 || len >= MAX_REPLY {
            return Err(Error::invalid(
                "multipathd reply",
                &len.to_string(),
                "length out of range",
            ));
        }
        let mut reply = vec![0u8; len];
        self.stream.set_read_timeout(left()).map_err(io_err)?;
        self.stream.read_exact(&mut reply).map_err(io_err)?;
        if let Some(nul) = reply.iter().position(|&b| b == 0) {
            reply.truncate(nul);
        }
        Ok(String::from_utf8_lossy(&reply).into_owned())
    }
}

/// What multipathd answered to a command that changes something (`add path`, `add map`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Answer {
    /// `ok`: done.
    Ok,
    /// `blacklisted`: the node's configuration excludes the device; asking again will not
    /// change that.
    Blacklisted,
    /// `delayed`: multipathd waits for something first (udev, more paths); ask again later.
    Delayed,
    /// `fail`, or anything else: the reply's text, trimmed.
    Failed(String),
}

impl Answer {
    /// The answer in multipathd's reply text.
    pub fn parse(reply: &str) -> Answer {
        match reply.trim() {
            "ok" => Answer::Ok,
            "blacklisted" => Answer::Blacklisted,
            "delayed" => Answer::Delayed,
            other => Answer::Failed(other.to_owned()),
        }
    }
}

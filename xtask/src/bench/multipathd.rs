//! multipathd's control socket, spoken from the benchmark process: the resize floor's map
//! step is one `resize map NAME` there, with no `multipathd` process to start (a spawn costs
//! 50-300 ms under TCG) and nothing of lunkit's own client (the floors do not go through
//! lunkit's code, and xtask does not link it).
//!
//! The framing is what `multipathd -k` speaks: both ways a native `size_t` length, then that
//! many bytes, the text with its NUL.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use super::sys;
use crate::Result;

/// multipathd's abstract socket name, `@/org/kernel/linux/storage/multipathd`.
pub const SOCKET: &[u8] = b"/org/kernel/linux/storage/multipathd";

/// Replies longer than this are refused (multipath-tools' `MAX_REPLY_LEN`).
const MAX_REPLY: usize = 32 << 20;

/// Sends `command` to the listener on the abstract name `socket` and returns its reply,
/// without the NUL. Connecting, sending and reading all end by `deadline`.
pub fn command(socket: &[u8], command: &str, deadline: Instant) -> Result<String> {
    let label = String::from_utf8_lossy(socket);
    let mut stream = loop {
        match sys::connect_abstract(socket) {
            Ok(Some(s)) => break s,
            // The accept queue is full: multipathd is busy; try again until the deadline.
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(1)),
            Ok(None) => {
                return Err(
                    format!("@{label}: the accept queue stayed full until the deadline").into(),
                );
            }
            Err(e) => return Err(format!("connect to @{label}: {e}").into()),
        }
    };
    // A zero timeout means "none" to a socket: at a passed deadline, 1 ms.
    let left = || {
        Some(
            deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1)),
        )
    };
    let mut msg = Vec::with_capacity(size_of::<usize>() + command.len() + 1);
    msg.extend_from_slice(&(command.len() + 1).to_ne_bytes());
    msg.extend_from_slice(command.as_bytes());
    msg.push(0);
    stream.set_write_timeout(left())?;
    stream
        .write_all(&msg)
        .map_err(|e| format!("send {command:?} to @{label}: {e}"))?;
    let mut len = [0u8; size_of::<usize>()];
    stream.set_read_timeout(left())?;
    stream
        .read_exact(&mut len)
        .map_err(|e| format!("@{label}'s reply to {command:?}: {e}"))?;
    let len = usize::from_ne_bytes(len);
    if len == 0 || len >= MAX_REPLY {
        return Err(format!("@{label}'s reply to {command:?}: length {len}").into());
    }
    let mut reply = vec![0u8; len];
    stream.set_read_timeout(left())?;
    stream
        .read_exact(&mut reply)
        .map_err(|e| format!("@{label}'s reply to {command:?}: {e}"))?;
    let text = reply.split(|&b| b == 0).next().unwrap_or_default();
    Ok(String::from_utf8_lossy(text).into_owned())
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr, UnixListener};
    use std::time::{Duration, Instant};

    use super::command;

    /// A listener that answers one framed message with `reply`, returning what it received.
    fn answer_once(name: &[u8], reply: &'static str) -> std::thread::JoinHandle<Vec<u8>> {
        let addr = SocketAddr::from_abstract_name(name).unwrap();
        let listener = UnixListener::bind_addr(&addr).unwrap();
        std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            let mut len = [0u8; size_of::<usize>()];
            conn.read_exact(&mut len).unwrap();
            let mut got = vec![0u8; usize::from_ne_bytes(len)];
            conn.read_exact(&mut got).unwrap();
            let mut out = (reply.len() + 1).to_ne_bytes().to_vec();
            out.extend_from_slice(reply.as_bytes());
            out.push(0);
            conn.write_all(&out).unwrap();
            got
        })
    }

    #[test]
    fn sends_a_framed_command_and_reads_the_reply() {
        let name = format!("lunkit-xtask-test-mpathd-{}", std::process::id());
        let server = answer_once(name.as_bytes(), "ok\n");
        let deadline = Instant::now() + Duration::from_secs(10);
        let reply = command(name.as_bytes(), "resize map mpatha", deadline).unwrap();
        assert_eq!(reply, "ok\n");
        assert_eq!(server.join().unwrap(), b"resize map mpatha\0");
    }

    #[test]
    fn no_listener_is_an_error_naming_the_socket() {
        let name = format!("lunkit-xtask-test-nobody-{}", std::process::id());
        let deadline = Instant::now() + Duration::from_secs(10);
        let e = command(name.as_bytes(), "show daemon", deadline).unwrap_err();
        assert!(e.to_string().contains(&name), "{e}");
    }
}

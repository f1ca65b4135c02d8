//! The multipathd client against stand-ins for multipathd (issue 12, items 10 and 14): how
//! long a timeout says it waited, a connect that cannot block past its deadline, a listener
//! that is not root, and the `/run/multipathd.socket` fallback with a full exchange.
//!
//! The stand-ins bind multipathd's abstract socket name in this network namespace, one test at
//! a time; the tests are skipped where a real multipathd holds the name.

use std::io::{Read, Write};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use lunkit::multipath::{MULTIPATHD_SOCKET, Multipathd};
use lunkit::{Error, Root};
use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};

/// The abstract name is one per network namespace: one stand-in at a time.
static NAME: Mutex<()> = Mutex::new(());

fn hold_name() -> MutexGuard<'static, ()> {
    NAME.lock().unwrap_or_else(|e| e.into_inner())
}

/// A root that has no `run/multipathd.socket`.
fn empty_root() -> Root {
    Root::new("/nonexistent")
}

fn soon(ms: u64) -> Instant {
    Instant::now() + Duration::from_millis(ms)
}

/// Binds the abstract name and listens with `backlog`, as `uid` if given (the kernel records
/// the listener's credentials at listen(2); `set_thread_uid` changes the calling thread
/// only, so call it with a uid on a thread of its own). `None` when the name is taken.
fn stand_in(backlog: i32, uid: Option<u32>) -> Option<std::os::fd::OwnedFd> {
    let fd = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::CLOEXEC,
        None,
    )
    .unwrap();
    let addr = SocketAddrUnix::new_abstract_name(MULTIPATHD_SOCKET).unwrap();
    if rustix::net::bind(&fd, &addr).is_err() {
        eprintln!("skipped: multipathd's socket is taken (a multipathd runs here)");
        return None;
    }
    if let Some(uid) = uid {
        rustix::thread::set_thread_uid(rustix::process::Uid::from_raw(uid)).unwrap();
    }
    rustix::net::listen(&fd, backlog).unwrap();
    Some(fd)
}

#[test]
fn a_multipathd_timeout_carries_the_time_waited() {
    let _name = hold_name();
    let addr = SocketAddr::from_abstract_name(MULTIPATHD_SOCKET).unwrap();
    let Ok(listener) = UnixListener::bind_addr(&addr) else {
        eprintln!("skipped: multipathd's socket is taken (a multipathd runs here)");
        return;
    };
    let mut d = Multipathd::connect(&empty_root(), soon(5000))
        .unwrap()
        .expect("connects to the stand-in");
    // Accepted, never answered.
    let (_conn, _) = listener.accept().unwrap();
    let err = d.command("show maps", soon(200)).unwrap_err();
    match err {
        Error::Timeout { waited, what } => {
            assert!(
                waited >= Duration::from_millis(150),
                "waited {waited:?} ({what})"
            );
            assert!(what.contains("show maps"), "{what}");
        }
        e => panic!("not a timeout: {e}"),
    }
}

/// A listener that does not accept, with its accept queue full: a blocking connect would
/// wait for as long as that lasts. The client gives up at its deadline, and says why.
#[test]
fn a_connect_to_a_full_accept_queue_ends_at_the_deadline() {
    let _name = hold_name();
    // Backlog 0: one connection waits in the queue, the next finds it full.
    let Some(_listener) = stand_in(0, None) else {
        return;
    };
    let first = Multipathd::connect(&empty_root(), soon(5000)).unwrap();
    assert!(first.is_some(), "the first connection fits the queue");
    let start = Instant::now();
    let err = Multipathd::connect(&empty_root(), soon(300)).unwrap_err();
    match err {
        Error::Timeout { what, waited } => {
            assert!(what.contains("accept queue"), "{what}");
            assert!(what.contains("multipathd"), "{what}");
            assert!(waited >= Duration::from_millis(250), "waited {waited:?}");
        }
        e => panic!("not a timeout: {e}"),
    }
    // It returned: the call did not block in connect(2).
    assert!(start.elapsed() < Duration::from_secs(60));
}

/// Anyone in the network namespace can bind the abstract name. A listener that is not root
/// is not multipathd: the client refuses it, naming its pid and uid, and sends nothing.
#[test]
fn a_listener_that_is_not_root_is_not_trusted() {
    let _name = hold_name();
    if !rustix::process::geteuid().is_root() {
        panic!("this test drops root on one thread: run it as root");
    }
    // Drop root on a thread of its own.
    let listener = std::thread::spawn(|| stand_in(8, Some(65534)))
        .join()
        .unwrap();
    let Some(_listener) = listener else { return };
    let err = Multipathd::connect(&empty_root(), soon(5000)).unwrap_err();
    assert_eq!(err.kind(), lunkit::ErrorKind::PermissionDenied, "{err}");
    let msg = err.to_string();
    assert!(msg.contains("uid 65534"), "{msg}");
    assert!(
        msg.contains(&format!("pid {}", std::process::id())),
        "{msg}"
    );
    assert!(msg.contains("not trusted"), "{msg}");
    match err {
        Error::Io { source, .. } => {
            assert_eq!(source.kind(), std::io::ErrorKind::PermissionDenied)
        }
        e => panic!("not an I/O error: {e}"),
    }
}

/// Without the abstract name, `<root>/run/multipathd.socket`; a full exchange in
/// multipathd's framing (a native length, then the text with its NUL).
#[test]
fn the_run_socket_is_used_when_the_abstract_name_is_free() {
    let _name = hold_name();
    let dir = std::env::temp_dir().join(format!("lunkit-mpd-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("run")).unwrap();
    let listener = UnixListener::bind(dir.join("run/multipathd.socket")).unwrap();
    let server = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        let mut len = [0u8; size_of::<usize>()];
        conn.read_exact(&mut len).unwrap();
        let mut cmd = vec![0u8; usize::from_ne_bytes(len)];
        conn.read_exact(&mut cmd).unwrap();
        let reply = b"ok\n\0";
        conn.write_all(&reply.len().to_ne_bytes()).unwrap();
        conn.write_all(reply).unwrap();
        cmd
    });
    let root = Root::new(&dir);
    let mut d = Multipathd::connect(&root, soon(5000))
        .unwrap()
        .expect("connects to <root>/run/multipathd.socket");
    assert_eq!(d.peer().uid, 0);
    assert_eq!(d.peer().pid, std::process::id() as i32);
    let reply = d.command("del map mpatha", soon(5000)).unwrap();
    assert_eq!(reply, "ok\n");
    assert_eq!(server.join().unwrap(), b"del map mpatha\0");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `add path` and `add map` in multipathd's words, and its answers as [`Answer`]s.
#[test]
fn add_path_and_add_map_say_what_multipathd_answered() {
    use lunkit::multipath::Answer;
    let _name = hold_name();
    let dir = std::env::temp_dir().join(format!("lunkit-mpd-add-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("run")).unwrap();
    let listener = UnixListener::bind(dir.join("run/multipathd.socket")).unwrap();
    let server = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        let mut got = Vec::new();
        for reply in [&b"blacklisted\n\0"[..], b"ok\n\0"] {
            let mut len = [0u8; size_of::<usize>()];
            conn.read_exact(&mut len).unwrap();
            let mut cmd = vec![0u8; usize::from_ne_bytes(len)];
            conn.read_exact(&mut cmd).unwrap();
            got.push(String::from_utf8(cmd).unwrap());
            conn.write_all(&reply.len().to_ne_bytes()).unwrap();
            conn.write_all(reply).unwrap();
        }
        got
    });
    let mut d = Multipathd::connect(&Root::new(&dir), soon(5000))
        .unwrap()
        .expect("connects to <root>/run/multipathd.socket");
    assert!(d.add_path("sdc extra", soon(5000)).is_err());
    assert!(d.add_path("../sdc", soon(5000)).is_err());
    assert_eq!(d.add_path("sdc", soon(5000)).unwrap(), Answer::Blacklisted);
    let wwid: lunkit::Wwid = "naa.60014055e7a100000000000000000000".parse().unwrap();
    assert_eq!(d.add_map(&wwid, soon(5000)).unwrap(), Answer::Ok);
    assert_eq!(
        server.join().unwrap(),
        [
            "add path sdc\0",
            "add map 360014055e7a100000000000000000000\0"
        ]
    );
    assert_eq!(Answer::parse("fail\n"), Answer::Failed("fail".into()));
    assert_eq!(Answer::parse("delayed\n"), Answer::Delayed);
    std::fs::remove_dir_all(&dir).unwrap();
}

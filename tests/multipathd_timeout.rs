//! A multipathd that does not answer: the timeout says how long it was waited for (issue 12,
//! item 14: it used to say "timed out after 0.0ns").
//!
//! Binds multipathd's abstract socket name in this network namespace; skipped where a real
//! multipathd holds it.

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener};
use std::time::{Duration, Instant};

use lunkit::Error;
use lunkit::multipath::Multipathd;

#[test]
fn a_multipathd_timeout_carries_the_time_waited() {
    let addr = SocketAddr::from_abstract_name("/org/kernel/linux/storage/multipathd").unwrap();
    let Ok(listener) = UnixListener::bind_addr(&addr) else {
        eprintln!("skipped: multipathd's socket is taken (a multipathd runs here)");
        return;
    };
    let root = lunkit::Root::new("/nonexistent");
    let mut d = Multipathd::connect(&root)
        .unwrap()
        .expect("connects to the stand-in");
    // Accepted, never answered.
    let (_conn, _) = listener.accept().unwrap();
    let err = d
        .command("show maps", Instant::now() + Duration::from_millis(200))
        .unwrap_err();
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

//! Shared uevent subscriptions against the host kernel: many waits at once read one socket,
//! each gets every event sent after it subscribed, and the socket goes with the last one.
//!
//! Events are synthetic `change` uevents of `/dev/null`'s device tagged with `SYNTH_UUID`
//! (as in `uevent_host.rs`). Needs root. Its own test binary, with one test, so that the
//! count of this process's uevent sockets is this test's alone.

use std::collections::HashSet;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use lunkit::uevent::{Receive, Received, Subscription};

const TRIGGER: &str = "/sys/class/mem/null/uevent";
/// `NETLINK_KOBJECT_UEVENT`, the protocol column of `/proc/net/netlink`.
const KOBJECT_UEVENT: u32 = 15;

fn synth_change(tag: &str) {
    std::fs::write(TRIGGER, format!("change {tag}"))
        .unwrap_or_else(|e| panic!("{TRIGGER}: {e} (this test needs root)"));
}

/// Receives until the event tagged `tag` arrives; panics on a timeout or lost events.
fn wait_for_tag(s: &mut Subscription, tag: &str, deadline: Instant) {
    loop {
        match s.recv(Some(deadline)).unwrap() {
            Received::Event(ev) if ev.get("SYNTH_UUID") == Some(tag) => return,
            Received::Event(_) => {}
            Received::Overflow => panic!("events lost on a quiet machine"),
            Received::TimedOut => panic!("no uevent with SYNTH_UUID={tag} in time"),
        }
    }
}

/// This process's open `NETLINK_KOBJECT_UEVENT` sockets: its descriptors' socket inodes
/// (`/proc/self/fd`) that `/proc/self/net/netlink` lists with that protocol.
fn uevent_sockets() -> usize {
    let mine: HashSet<u64> = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let link = std::fs::read_link(e.path()).ok()?;
            let link = link.to_str()?;
            link.strip_prefix("socket:[")?
                .strip_suffix(']')?
                .parse()
                .ok()
        })
        .collect();
    let table = std::fs::read_to_string("/proc/self/net/netlink").unwrap();
    table
        .lines()
        .skip(1)
        .filter(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            // sk Eth Pid Groups Rmem Wmem Dump Locks Drops Inode
            f.len() >= 10
                && f[1].parse() == Ok(KOBJECT_UEVENT)
                && f[9].parse().is_ok_and(|i: u64| mine.contains(&i))
        })
        .count()
}

#[test]
fn many_waits_share_one_socket_each_gets_every_event_and_it_closes_with_the_last() {
    const WAITS: usize = 8;
    assert_eq!(uevent_sockets(), 0, "a uevent socket open before the test");
    let deadline = Instant::now() + Duration::from_secs(20);
    let first = "0b5d7c1e-6a43-4f0e-8d2b-3c9a1e7f5d01";
    let second = "0b5d7c1e-6a43-4f0e-8d2b-3c9a1e7f5d02";
    let subscribed = Barrier::new(WAITS + 1);
    let received = Barrier::new(WAITS + 1);
    std::thread::scope(|s| {
        for _ in 0..WAITS {
            s.spawn(|| {
                let mut sub = Subscription::open().unwrap();
                subscribed.wait();
                wait_for_tag(&mut sub, first, deadline);
                wait_for_tag(&mut sub, second, deadline);
                received.wait();
            });
        }
        subscribed.wait();
        // Eight subscriptions open, one socket.
        assert_eq!(uevent_sockets(), 1);
        // Two events: whichever wait reads the socket, each reaches every wait.
        synth_change(first);
        synth_change(second);
        received.wait();
    });
    assert_eq!(
        uevent_sockets(),
        0,
        "the shared socket outlived its subscriptions"
    );

    // A wait whose deadline comes while another has the socket ends at its deadline; the
    // one reading still gets what is sent after.
    let long = "0b5d7c1e-6a43-4f0e-8d2b-3c9a1e7f5d03";
    let mut reading = Subscription::open().unwrap();
    let mut short = Subscription::open().unwrap();
    std::thread::scope(|s| {
        let reader = s.spawn(move || wait_for_tag(&mut reading, long, deadline));
        // Whichever of the two reads the socket meanwhile, `short` ends at its deadline.
        let until = Instant::now() + Duration::from_millis(200);
        loop {
            match short.recv(Some(until)).unwrap() {
                Received::TimedOut => break,
                Received::Event(ev) => assert_ne!(ev.get("SYNTH_UUID"), Some(long)),
                Received::Overflow => panic!("events lost on a quiet machine"),
            }
        }
        synth_change(long);
        reader.join().unwrap();
    });
    // `short` was open when `long` was sent: it gets it too, from its queue.
    wait_for_tag(&mut short, long, deadline);
    drop(short);
    assert_eq!(uevent_sockets(), 0);
}

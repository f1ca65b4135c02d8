//! The uevent monitor against the host kernel: real events arrive, forged ones do not.
//!
//! Writing `change <uuid>` to a device's `uevent` file makes the kernel emit a synthetic
//! `change` uevent carrying `SYNTH_UUID=<uuid>`, which lets the test pick out exactly its own
//! event among whatever else the machine is doing. `/dev/null`'s device is used because a
//! `change` on it has no effect on anything. Needs root (the file is 0200).

use std::time::{Duration, Instant};

use lunkit::Root;
use lunkit::uevent::{Action, Monitor, Received, current_seqnum};
use rustix::net::netlink::{self, SocketAddrNetlink};
use rustix::net::{AddressFamily, SendFlags, SocketFlags, SocketType};

const TRIGGER: &str = "/sys/class/mem/null/uevent";

fn synth_change(tag: &str) {
    std::fs::write(TRIGGER, format!("change {tag}"))
        .unwrap_or_else(|e| panic!("{TRIGGER}: {e} (this test needs root)"));
}

/// Receives until the synthetic event tagged `tag` arrives, returning every kernel event seen.
fn wait_for_tag(m: &mut Monitor, tag: &str) -> Vec<lunkit::uevent::Uevent> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut seen = Vec::new();
    loop {
        match m.recv(Some(deadline)).unwrap() {
            Received::Event(ev) => {
                let done = ev.get("SYNTH_UUID") == Some(tag);
                seen.push(ev);
                if done {
                    return seen;
                }
            }
            Received::Overflow => panic!("queue overflowed on a quiet machine"),
            Received::TimedOut => panic!("no uevent with SYNTH_UUID={tag} within 10 s"),
        }
    }
}

#[test]
fn receives_kernel_events_after_the_baseline() {
    let mut m = Monitor::open().unwrap();
    let before = current_seqnum(&Root::default()).unwrap();
    let tag = "6d1b8a40-0c2e-4d7a-9a51-1f2e3d4c5b01";
    synth_change(tag);
    let ev = wait_for_tag(&mut m, tag).pop().unwrap();
    assert_eq!(ev.action, Action::Change);
    assert_eq!(ev.subsystem.as_deref(), Some("mem"));
    assert_eq!(ev.devname.as_deref(), Some("null"));
    assert!(
        ev.seqnum > before,
        "event {} not after baseline {before}",
        ev.seqnum
    );
    assert_eq!(m.rejected(), 0);
}

#[test]
fn forged_unicast_event_is_ignored() {
    let mut m = Monitor::open().unwrap();
    let port = m.port_id().unwrap();
    assert_ne!(
        port, 0,
        "the kernel assigns user sockets a non-zero port id"
    );

    // Any local process can open a uevent socket and unicast to ours.
    let forger = rustix::net::socket_with(
        AddressFamily::NETLINK,
        SocketType::RAW,
        SocketFlags::CLOEXEC,
        Some(netlink::KOBJECT_UEVENT),
    )
    .unwrap();
    rustix::net::bind(&forger, &SocketAddrNetlink::new(0, 0)).unwrap();
    let forged =
        b"add@/devices/forged/block/sdzz\0ACTION=add\0DEVPATH=/devices/forged/block/sdzz\0\
SUBSYSTEM=block\0DEVNAME=sdzz\0DEVTYPE=disk\0SYNTH_UUID=forged\0SEQNUM=18446744073709551000\0";
    let sent = rustix::net::sendto(
        &forger,
        forged,
        SendFlags::empty(),
        &SocketAddrNetlink::new(port, 0),
    )
    .unwrap();
    assert_eq!(sent, forged.len());

    // A real event sent after the forgery: the monitor must deliver it, and nothing forged.
    let tag = "6d1b8a40-0c2e-4d7a-9a51-1f2e3d4c5b02";
    synth_change(tag);
    let seen = wait_for_tag(&mut m, tag);
    assert!(
        seen.iter()
            .all(|ev| !ev.devpath.starts_with("/devices/forged")),
        "forged event delivered: {seen:?}"
    );
    assert_eq!(
        m.rejected(),
        1,
        "the forged datagram was received and dropped"
    );
}

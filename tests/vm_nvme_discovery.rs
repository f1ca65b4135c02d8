//! VM tests of NVMe/TCP discovery through the library (`lunkit::nvme::discovery`): a
//! discovery controller connected through `/dev/nvme-fabrics`, its Discovery Log Page read
//! with Get Log Page through `/dev/nvmeN`, referrals followed once each, and no discovery
//! controller left behind.
//!
//! nvmet (6.1) lists, on each port, the subsystems linked to that port and the port's
//! referrals; there is one discovery service per target, answering on every port. A real
//! array lists all of its ports; here the second port is reached through a referral.
//!
//! Run by `cargo xtask test` inside the QEMU guest (ignored on the host).

use lunkit_lab as support;

use std::collections::BTreeSet;
use std::fs;

use lunkit::Root;
use lunkit::nvme::Host;
use lunkit::nvme::discovery::{self, DISCOVERY_NQN, DiscoverOptions, Subtype};
use support::cli::{describe, lunkit};
use support::nvmet::{PortConfig, Target};
use support::require_vm;

const MIB: u64 = 1 << 20;
const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:5d1c0e7a-41f2-4b8e-9c3d-7e6f5a4b3c2d";
const A: &str = "nqn.2014-08.org.lunkit:disc-a";
const B: &str = "nqn.2014-08.org.lunkit:disc-b";

fn host() -> Host {
    Host {
        nqn: HOSTNQN.parse().unwrap(),
        id: None,
    }
}

fn options(traddr: &str) -> DiscoverOptions {
    let mut o = DiscoverOptions::new(traddr.parse().unwrap(), 4420);
    o.host = Some(host());
    o
}

/// The host's controllers to the discovery NQN, as sysfs lists them.
fn discovery_controllers() -> Vec<String> {
    fs::read_dir("/sys/class/nvme")
        .map(|d| {
            d.flatten()
                .filter(|e| {
                    fs::read_to_string(e.path().join("subsysnqn"))
                        .is_ok_and(|n| n.trim() == DISCOVERY_NQN)
                })
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn discovery_follows_referrals_once_each_and_leaves_no_controller() {
    require_vm();
    // A on two ports, B on a third; referrals 1 → 2 → 3 → 1 (a loop) and 3 → nowhere.
    let mut a = Target::builder()
        .nqn(A)
        .namespace(16 * MIB)
        .port(PortConfig::new(41, "127.0.0.1", "4420"))
        .port(PortConfig::new(42, "127.0.0.2", "4420"))
        .build()
        .expect("target A");
    let mut b = Target::builder()
        .nqn(B)
        .namespace(16 * MIB)
        .port(PortConfig::new(43, "127.0.0.3", "4420"))
        .build()
        .expect("target B");
    a.add_referral(41, "to-2", "127.0.0.2", "4420").unwrap();
    a.add_referral(42, "to-3", "127.0.0.3", "4420").unwrap();
    b.add_referral(43, "loop", "127.0.0.1", "4420").unwrap();
    b.add_referral(43, "nowhere", "127.0.0.9", "4420").unwrap();
    let root = Root::default();

    let found = discovery::discover(&root, &options("127.0.0.1")).expect("discover");
    eprintln!("discovery: {found:#?}");
    let asked: Vec<String> = found
        .services
        .iter()
        .map(|s| format!("{}:{}", s.traddr, s.trsvcid))
        .collect();
    // Breadth first, each service once: the loop back to 127.0.0.1 is not followed.
    assert_eq!(
        asked,
        [
            "127.0.0.1:4420",
            "127.0.0.2:4420",
            "127.0.0.3:4420",
            "127.0.0.9:4420"
        ]
    );
    for s in &found.services[..3] {
        let l = s.result.as_ref().expect("a reachable service answers");
        assert!(!l.existing, "{l:?}");
        assert!(l.log.rejected.is_empty(), "{:?}", l.log.rejected);
        let nvm = l.log.entries.iter().filter(|e| e.subtype == Subtype::Nvm);
        assert_eq!(nvm.count(), 1, "{l:?}");
        // 6.1's nvmet lists itself too, on the port asked.
        let me: Vec<_> = l
            .log
            .entries
            .iter()
            .filter(|e| e.subtype == Subtype::CurrentDiscovery)
            .collect();
        assert_eq!(me.len(), 1, "{l:?}");
        assert_eq!(me[0].ip().unwrap(), s.traddr);
    }
    // The referral to nowhere is refused, and that does not fail the discovery.
    let nowhere = found.services[3].result.as_ref().unwrap_err();
    assert_eq!(nowhere.errno(), Some(libc::ECONNREFUSED), "{nowhere}");
    let subsystems: BTreeSet<String> = found
        .subsystems()
        .map(|e| format!("{} {}:{}", e.subsystem, e.ip().unwrap(), e.port().unwrap()))
        .collect();
    assert_eq!(
        subsystems,
        BTreeSet::from([
            format!("{A} 127.0.0.1:4420"),
            format!("{A} 127.0.0.2:4420"),
            format!("{B} 127.0.0.3:4420"),
        ])
    );
    assert_eq!(discovery_controllers(), Vec::<String>::new());

    // The command prints the same services and entries.
    let out = lunkit(&[
        "nvme",
        "discover",
        "--traddr",
        "127.0.0.1",
        "--trsvcid",
        "4420",
        "--hostnqn",
        HOSTNQN,
        "--json",
    ]);
    assert!(out.status.success(), "{}", describe(&out));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let services = doc["result"]["services"].as_array().unwrap();
    let at: Vec<String> = services
        .iter()
        .map(|s| format!("{}:{}", s["traddr"].as_str().unwrap(), s["trsvcid"]))
        .collect();
    assert_eq!(at, asked, "{doc}");
    assert_eq!(services[1]["entries"][1]["subnqn"], A, "{doc}");
    assert_eq!(services[1]["entries"][1]["subtype"], "nvm", "{doc}");
    assert!(
        services[3]["error"].as_str().unwrap().contains("127.0.0.9"),
        "{doc}"
    );
    assert_eq!(discovery_controllers(), Vec::<String>::new());

    // Without referrals, and bounded: only what was asked for.
    let mut one = options("127.0.0.1");
    one.follow_referrals = false;
    assert_eq!(discovery::discover(&root, &one).unwrap().services.len(), 1);
    let mut two = options("127.0.0.1");
    two.max_services = 2;
    assert_eq!(discovery::discover(&root, &two).unwrap().services.len(), 2);

    // The service asked for is unreachable: the error says so, and nothing is left.
    let e = discovery::discover(&root, &options("127.0.0.9")).unwrap_err();
    assert_eq!(e.errno(), Some(libc::ECONNREFUSED), "{e}");
    assert!(e.to_string().contains("127.0.0.9:4420"), "{e}");
    assert_eq!(discovery_controllers(), Vec::<String>::new());
    b.teardown().unwrap();
    a.teardown().unwrap();
}

/// The subsystem's controllers, by address, with their states.
fn paths_of(nqn: &str) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = fs::read_dir("/sys/class/nvme")
        .map(|d| {
            d.flatten()
                .filter(|e| {
                    fs::read_to_string(e.path().join("subsysnqn")).is_ok_and(|n| n.trim() == nqn)
                })
                .map(|e| {
                    let read = |f: &str| {
                        fs::read_to_string(e.path().join(f))
                            .unwrap_or_default()
                            .trim()
                            .to_owned()
                    };
                    let addr = read("address");
                    let traddr = addr
                        .split(',')
                        .find_map(|kv| kv.strip_prefix("traddr="))
                        .unwrap_or("")
                        .to_owned();
                    (traddr, read("state"))
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Persistent discovery (issue 35, item 3): a follower keeps a discovery controller on the
/// first port; the target then offers a second path (a port, and a referral to it on the
/// first port, as nvmet lists only a port's own subsystems) and takes it back. The node
/// gets the path and loses it with no call but the follower's, and the follower's events
/// come from the kernel (the discovery-change AEN as a uevent), not from polling.
#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn a_persistent_discovery_follower_connects_a_new_path_and_drops_a_gone_one() {
    use lunkit::nvme::discovery::follow::{FollowOptions, Follower, PathAction};
    use std::sync::mpsc;
    use std::sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    };
    use std::time::{Duration, Instant};

    require_vm();
    let mut a = Target::builder()
        .nqn(A)
        .namespace(16 * MIB)
        .port(PortConfig::new(44, "127.0.0.1", "4420"))
        .build()
        .expect("target A");
    let root = Root::default();
    let mut path =
        lunkit::nvme::ConnectOptions::new("127.0.0.1".parse().unwrap(), 4420, A.parse().unwrap());
    path.host = Some(host());
    let first = lunkit::nvme::connect(&root, &path).expect("the volume's first path");

    let mut opts = FollowOptions::new("127.0.0.1".parse().unwrap(), 4420);
    opts.host = Some(host());
    let mut follower = Follower::start(&root, opts).expect("follower");
    let ours = follower.controller().to_owned();
    assert_eq!(discovery_controllers(), vec![ours.clone()]);
    assert_eq!(follower.entries().len(), 1, "{:?}", follower.entries());

    let (tx, rx) = mpsc::channel();
    let stop = Arc::new(AtomicBool::new(false));
    let stopping = Arc::clone(&stop);
    let thread = std::thread::spawn(move || {
        while !stopping.load(Ordering::Relaxed) {
            match follower.next(Instant::now() + Duration::from_millis(500)) {
                Ok(Some(change)) => tx.send(Ok(change)).unwrap(),
                Ok(None) => {}
                Err(e) => tx.send(Err(e)).unwrap(),
            }
        }
        follower.stop()
    });
    // What the follower did next, within a minute (a wait's bound, not a timed check).
    let next = || {
        let change = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("the follower saw the change")
            .expect("the follower read the log");
        eprintln!("follower: {change:#?}");
        change
    };

    a.add_port(PortConfig::new(45, "127.0.0.2", "4420"))
        .unwrap();
    a.add_referral(44, "to-45", "127.0.0.2", "4420").unwrap();
    let change = next();
    assert_eq!(change.added.len(), 1, "{change:?}");
    assert_eq!(change.added[0].address, "127.0.0.2");
    assert!(
        matches!(&change.paths[..], [p] if matches!(p.action, PathAction::Connected { existing: false, .. })),
        "{change:?}"
    );
    assert_eq!(
        paths_of(A),
        [
            ("127.0.0.1".into(), "live".into()),
            ("127.0.0.2".into(), "live".into())
        ]
    );

    a.remove_referral(44, "to-45").unwrap();
    let change = next();
    assert_eq!(change.removed.len(), 1, "{change:?}");
    assert!(
        matches!(&change.paths[..], [p] if matches!(p.action, PathAction::Deleted { .. })),
        "{change:?}"
    );
    assert_eq!(paths_of(A), [("127.0.0.1".into(), "live".into())]);
    a.remove_port(45).unwrap();

    stop.store(true, Ordering::Relaxed);
    thread
        .join()
        .unwrap()
        .expect("the follower's controller deleted");
    assert_eq!(discovery_controllers(), Vec::<String>::new());
    let c = lunkit::nvme::sysfs::controller(&root, &first.controller)
        .unwrap()
        .expect("the first path");
    fs::write(format!("/sys/class/nvme/{}/delete_controller", c.name), "1").unwrap();
    a.teardown().unwrap();
}

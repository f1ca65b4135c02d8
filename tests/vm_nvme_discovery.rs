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

    // Discoveries of one service at once each read through a controller of their own: none
    // deletes the one another is reading (which failed the other's read when they shared).
    let mut one = options("127.0.0.1");
    one.follow_referrals = false;
    std::thread::scope(|s| {
        let runs: Vec<_> = (0..4)
            .map(|_| s.spawn(|| discovery::discover(&root, &one)))
            .collect();
        for r in runs {
            let found = r.join().unwrap().expect("a discovery beside three others");
            assert_eq!(found.subsystems().count(), 1, "{found:?}");
        }
    });
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

/// That `change` connected one new path, and subsystem [`A`] has both, live.
fn assert_second_path_connected(change: &lunkit::ops::nvme::follow::Change) {
    use lunkit::ops::nvme::follow::PathAction;
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
}

/// Persistent discovery (issue 35, item 3): a follower keeps a discovery controller on the
/// first port; the target then offers a second path (a port, and a referral to it on the
/// first port, as nvmet lists only a port's own subsystems) and takes it back. The node
/// gets the path and loses it with no call but the follower's, and the follower's events
/// come from the kernel (the discovery-change AEN as a uevent), not from polling.
///
/// The follower decides under the subsystem's lock, as attach and detach do: while this
/// test holds it (as a detach deleting the subsystem's last controller would), the new path
/// is not connected, and the change is tried again on the next event.
#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn a_persistent_discovery_follower_connects_a_new_path_and_drops_a_gone_one() {
    use lunkit::ops::nvme::follow::{FollowOptions, Follower, PathAction, Trigger};
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
    // The lock waits this long before the follower gives the path up for now.
    opts.lock_timeout = Duration::from_secs(2);
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

    let locks = root.run("lunkit/locks");
    let held = lunkit::ops::lock::lock(
        &lunkit::ops::nvme::subsystem_lock_key(&A.parse().unwrap()),
        Some(&locks),
        Instant::now() + Duration::from_secs(10),
    )
    .expect("the subsystem's lock");
    a.add_port(PortConfig::new(45, "127.0.0.2", "4420"))
        .unwrap();
    a.add_referral(44, "to-45", "127.0.0.2", "4420").unwrap();
    let change = next();
    assert_eq!(change.added.len(), 1, "{change:?}");
    assert_eq!(change.added[0].address, "127.0.0.2");
    assert!(
        matches!(&change.paths[..], [p] if matches!(&p.action, PathAction::Failed(e) if e.to_string().contains("nvme-subsys-"))),
        "not connected while the subsystem's lock is held: {change:?}"
    );
    assert_eq!(paths_of(A), [("127.0.0.1".into(), "live".into())]);
    drop(held);
    // Any change of the log now (a second referral to the same port) brings the path that
    // failed again, without waiting for the retry's 30 s.
    a.add_referral(44, "nudge", "127.0.0.2", "4420").unwrap();
    let change = next();
    assert_eq!(change.trigger, Trigger::Retry, "{change:?}");
    assert_second_path_connected(&change);

    a.remove_referral(44, "nudge").unwrap();
    a.remove_referral(44, "to-45").unwrap();
    // One change or two, as the kernel's notices come: the path goes in one of them.
    let mut change = next();
    if change.removed.is_empty() {
        assert!(change.paths.is_empty(), "{change:?}");
        change = next();
    }
    assert_eq!(change.removed.len(), 1, "{change:?}");
    assert!(
        matches!(&change.paths[..], [p] if matches!(p.action, PathAction::Deleted { .. })),
        "{change:?}"
    );
    assert_eq!(paths_of(A), [("127.0.0.1".into(), "live".into())]);

    stop.store(true, Ordering::Relaxed);
    thread
        .join()
        .unwrap()
        .expect("the follower's controller deleted");
    assert_eq!(discovery_controllers(), Vec::<String>::new());

    // A path the array offers while no follower runs (between a volume's attach and the
    // follower's start, or while a plugin restarts) is no change any later read would show:
    // the next follower connects it on its first call, with no event.
    a.add_referral(44, "to-45", "127.0.0.2", "4420").unwrap();
    let mut opts = FollowOptions::new("127.0.0.1".parse().unwrap(), 4420);
    opts.host = Some(host());
    let mut follower = Follower::start(&root, opts).expect("the second follower");
    // The path with no controller is left out of what it knows, to be read again.
    assert!(
        matches!(follower.entries(), [e] if e.address == "127.0.0.1"),
        "{:?}",
        follower.entries()
    );
    let change = follower
        .next(Instant::now() + Duration::from_secs(60))
        .expect("the log read again")
        .expect("a change at once, with no event");
    eprintln!("second follower: {change:#?}");
    assert_eq!(change.trigger, Trigger::Started, "{change:?}");
    assert_second_path_connected(&change);
    follower
        .stop()
        .expect("the second follower's controller deleted");
    assert_eq!(discovery_controllers(), Vec::<String>::new());

    let paths = lunkit::nvme::controllers_of(&root, &A.parse().unwrap()).unwrap();
    assert!(
        paths.iter().any(|c| c.name == first.controller),
        "{paths:?}"
    );
    for c in paths {
        fs::write(format!("/sys/class/nvme/{}/delete_controller", c.name), "1").unwrap();
    }
    a.remove_referral(44, "to-45").unwrap();
    a.remove_port(45).unwrap();
    a.teardown().unwrap();
}

/// NVMe namespace block devices on the node (`nvme0n1`; not the hidden `nvme0c1n1` paths).
fn heads() -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir("/sys/block")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("nvme") && !n.contains('c'))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// `lunkit attach --nvme-nqn NQN --nsid 1` as [`HOSTNQN`] with `args`: exit code, stdout
/// (the JSON document with `--json`) and the whole output for messages.
fn attach(nqn: &str, args: &[&str]) -> (Option<i32>, String, String) {
    let mut all = vec![
        "attach",
        "--nvme-nqn",
        nqn,
        "--nsid",
        "1",
        "--hostnqn",
        HOSTNQN,
        "--timeout",
        "30",
    ];
    all.extend(args);
    let start = std::time::Instant::now();
    let out = lunkit(&all);
    eprintln!("lunkit {args:?}: {:.1?}", start.elapsed());
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    (out.status.code(), stdout, describe(&out))
}

/// Each entry of `doc[key]` as `field field …`, for comparing whole lists at once.
fn rows(doc: &serde_json::Value, key: &str, fields: &[&str]) -> Vec<String> {
    doc[key]
        .as_array()
        .unwrap_or_else(|| panic!("no {key}: {doc}"))
        .iter()
        .map(|r| {
            let v: Vec<String> = fields
                .iter()
                .map(|f| match &r[*f] {
                    serde_json::Value::String(s) => s.clone(),
                    v => v.to_string(),
                })
                .collect();
            v.join(" ")
        })
        .collect()
}

/// Connect-all (issue 35, item 2): the attach is given one discovery address, and one that
/// nothing answers. nvmet lists on a port only that port's subsystems, so the log read at
/// 127.0.0.1 refers to the services on the subsystem's other ports (as an array that lists
/// all its ports would list them directly), and to one that is not there. Every path it
/// can use is connected at once, into one head; the port that requires TLS and the
/// services that do not answer are outcomes, not failures. No discovery controller stays.
#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn an_attach_given_one_discovery_address_connects_every_path_it_lists_into_one_head() {
    require_vm();
    let mut a = Target::builder()
        .nqn(A)
        .namespace(16 * MIB)
        .port(PortConfig::new(51, "127.0.0.1", "4420"))
        .port(PortConfig::new(52, "127.0.0.2", "4420"))
        .port(PortConfig::new(53, "127.0.0.3", "4420").requiring_tls())
        .build()
        .expect("target A");
    a.add_referral(51, "to-52", "127.0.0.2", "4420").unwrap();
    a.add_referral(51, "to-53", "127.0.0.3", "4420").unwrap();
    a.add_referral(51, "nowhere", "127.0.0.9", "4420").unwrap();

    // 127.0.0.8 is given without a port: 8009, where nothing listens.
    let (code, stdout, out) = attach(
        A,
        &[
            "--discover",
            "127.0.0.1:4420",
            "--discover",
            "127.0.0.8",
            "--json",
        ],
    );
    assert_eq!(code, Some(0), "{out}");
    let doc: serde_json::Value = serde_json::from_str(&stdout).expect(&out);
    eprintln!("attach: {doc:#}");
    assert_eq!(
        rows(&doc, "discovery", &["service", "via", "outcome", "paths"]),
        [
            r#"127.0.0.1:4420 127.0.0.1:4420 answered ["127.0.0.1:4420"]"#,
            r#"127.0.0.2:4420 127.0.0.1:4420 answered ["127.0.0.2:4420"]"#,
            r#"127.0.0.3:4420 127.0.0.1:4420 answered ["127.0.0.3:4420"]"#,
            "127.0.0.9:4420 127.0.0.1:4420 failed []",
            "127.0.0.8:8009 127.0.0.8:8009 failed []",
        ],
        "{doc}"
    );
    assert_eq!(
        rows(&doc, "portals", &["portal", "discovered", "outcome"]),
        [
            "127.0.0.1:4420 true connected",
            "127.0.0.2:4420 true connected",
            "127.0.0.3:4420 true failed",
        ],
        "{doc}"
    );
    let tls = doc["portals"][2]["detail"].as_str().unwrap();
    assert!(tls.contains("secure channel"), "{doc}");
    for (i, addr) in [(3, "127.0.0.9:4420"), (4, "127.0.0.8:8009")] {
        let why = doc["discovery"][i]["detail"].as_str().unwrap();
        assert!(why.contains(addr) && why.contains("refused"), "{doc}");
    }
    // One head, through the two paths that could be used, and nothing through the third.
    assert_eq!(doc["devices"].as_array().unwrap().len(), 1, "{doc}");
    assert_eq!(doc["controllers"].as_array().unwrap().len(), 2, "{doc}");
    assert_eq!(
        paths_of(A),
        [
            ("127.0.0.1".into(), "live".into()),
            ("127.0.0.2".into(), "live".into())
        ]
    );
    let head = doc["devices"][0]["name"].as_str().unwrap().to_owned();
    assert_eq!(heads(), std::slice::from_ref(&head));
    assert_eq!(discovery_controllers(), Vec::<String>::new());

    // Again, as text, through the second port's service alone (it refers nowhere): its
    // path is found connected, not made twice, and the head still has both.
    let (code, text, out) = attach(A, &["--discover", "127.0.0.2:4420"]);
    assert_eq!(code, Some(0), "{out}");
    for line in [
        "discovery at 127.0.0.2:4420: listed 127.0.0.2:4420\n",
        "(already connected) [discovered]\n",
        &format!("/dev/{head} "),
    ] {
        assert!(text.contains(line), "{line:?} not in {out}");
    }
    assert_eq!(paths_of(A).len(), 2);
    assert_eq!(discovery_controllers(), Vec::<String>::new());

    let out = lunkit(&["detach", "--nvme-nqn", A, "--nsid", "1", "--timeout", "30"]);
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(paths_of(A), Vec::<(String, String)>::new());
    assert_eq!(heads(), Vec::<String>::new());
    a.teardown().unwrap();
}

/// `--min-paths` above what discovery finds fails at once (no path can come that the
/// attach did not connect), naming the minimum; no discovery answering at all fails naming
/// the subsystem and each address's cause. Neither leaves a controller.
#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn an_attach_that_cannot_get_its_paths_fails_naming_why_and_leaves_no_controller() {
    require_vm();
    let mut a = Target::builder()
        .nqn(A)
        .namespace(16 * MIB)
        .port(PortConfig::new(54, "127.0.0.1", "4420"))
        .port(PortConfig::new(55, "127.0.0.2", "4420"))
        .build()
        .expect("target A");
    a.add_referral(54, "to-55", "127.0.0.2", "4420").unwrap();

    let (code, _, out) = attach(A, &["--discover", "127.0.0.1:4420", "--min-paths", "3"]);
    assert_eq!(code, Some(3), "{out}");
    assert!(
        out.contains(&format!("3 paths to NVMe {A}")) && out.contains("2 controller(s)"),
        "{out}"
    );
    // The two paths it did connect are named, and gone again.
    assert!(out.contains("127.0.0.2:4420: nvme"), "{out}");
    assert_eq!(paths_of(A), Vec::<(String, String)>::new());
    assert_eq!(heads(), Vec::<String>::new());
    assert_eq!(discovery_controllers(), Vec::<String>::new());

    let (code, _, out) = attach(
        A,
        &["--discover", "127.0.0.8", "--discover", "127.0.0.9:4420"],
    );
    assert_eq!(code, Some(3), "{out}");
    assert!(
        out.contains(&format!("no path to NVMe {A} namespace 1 can come")),
        "{out}"
    );
    for addr in ["127.0.0.8:8009", "127.0.0.9:4420"] {
        assert!(
            out.contains(&format!("discovery at {addr}: failed")),
            "{out}"
        );
    }
    assert_eq!(paths_of(A), Vec::<(String, String)>::new());
    assert_eq!(discovery_controllers(), Vec::<String>::new());
    a.teardown().unwrap();
}

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

use super::*;
use crate::ErrorKind;
use crate::nvme::discovery::AddressFamily;

const A: &str = "nqn.2014-08.org.lunkit:a";
const B: &str = "nqn.2014-08.org.lunkit:b";

fn entry(subsystem: &str, address: &str, port: &str) -> Entry {
    Entry {
        transport: TransportType::Tcp,
        family: if address.contains(':') {
            AddressFamily::Ipv6
        } else {
            AddressFamily::Ipv4
        },
        subtype: Subtype::Nvm,
        requirements: 0,
        port_id: 1,
        controller_id: 0xffff,
        admin_queue_size: 32,
        flags: 0,
        service_id: port.to_owned(),
        subsystem: subsystem.to_owned(),
        address: address.to_owned(),
        tcp_security: 0,
    }
}

fn nqn(s: &str) -> Nqn {
    s.parse().unwrap()
}

/// Each path as `portal` for one to connect, `portal !` for one refused.
fn show(paths: &[ListedPath]) -> Vec<String> {
    paths
        .iter()
        .map(|p| match &p.result {
            Ok(a) => {
                assert_eq!(a.to_string(), p.portal);
                p.portal.clone()
            }
            Err(_) => format!("{} !", p.portal),
        })
        .collect()
}

#[test]
fn only_the_volumes_tcp_subsystem_entries_are_its_paths() {
    let mut rdma = entry(A, "192.0.2.5", "4420");
    rdma.transport = TransportType::Rdma;
    let mut referral = entry(DISCOVERY, "192.0.2.6", "8009");
    referral.subtype = Subtype::Referral;
    let mut current = entry(DISCOVERY, "192.0.2.1", "8009");
    current.subtype = Subtype::CurrentDiscovery;
    // A referral or a discovery entry that names the volume's NQN is still not a path.
    let mut odd = entry(A, "192.0.2.7", "4420");
    odd.subtype = Subtype::Referral;
    let entries = [
        current,
        entry(A, "192.0.2.1", "4420"),
        entry(B, "192.0.2.1", "4420"),
        rdma,
        referral,
        odd,
        entry(A, "192.0.2.2", "4421"),
        // Another subsystem whose NQN only starts like the volume's.
        entry(&format!("{A}x"), "192.0.2.3", "4420"),
    ];
    assert_eq!(
        show(&paths_of(&entries, &nqn(A))),
        ["192.0.2.1:4420", "192.0.2.2:4421"]
    );
    assert_eq!(show(&paths_of(&entries, &nqn(B))), ["192.0.2.1:4420"]);
    let none: [Entry; 0] = [];
    assert!(paths_of(&none, &nqn(A)).is_empty());
}

const DISCOVERY: &str = super::super::DISCOVERY_NQN;

#[test]
fn a_port_listed_twice_is_one_path_however_its_address_is_written() {
    let entries = [
        entry(A, "fd00::1", "4420"),
        entry(A, "192.0.2.1", "4420"),
        // The same port from a second service, and an IPv6 address written the long way.
        entry(A, "192.0.2.1", "4420"),
        entry(A, "fd00:0:0::1", "4420"),
        // The same address on another port is another path.
        entry(A, "192.0.2.1", "4421"),
    ];
    assert_eq!(
        show(&paths_of(&entries, &nqn(A))),
        ["[fd00::1]:4420", "192.0.2.1:4420", "192.0.2.1:4421"]
    );
}

#[test]
fn a_port_that_requires_tls_is_a_path_refused_with_the_reason() {
    let mut tls = entry(A, "192.0.2.2", "4420");
    tls.requirements = 0b01;
    // "Not required" (0b10) and "not specified" (0b00) are connected.
    let mut not_required = entry(A, "192.0.2.3", "4420");
    not_required.requirements = 0b10;
    let entries = [entry(A, "192.0.2.1", "4420"), tls, not_required];
    let paths = paths_of(&entries, &nqn(A));
    assert_eq!(
        show(&paths),
        ["192.0.2.1:4420", "192.0.2.2:4420 !", "192.0.2.3:4420"]
    );
    let e = paths[1].result.as_ref().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
    assert!(e.to_string().contains("secure channel"), "{e}");
    assert!(e.to_string().contains("192.0.2.2:4420"), "{e}");
}

#[test]
fn an_entry_whose_address_or_port_is_not_one_is_a_failed_path_named_as_written() {
    let mut wrong_family = entry(A, "192.0.2.1", "4420");
    wrong_family.family = AddressFamily::Ipv6;
    let entries = [
        entry(A, "array.example", "4420"),
        entry(A, "192.0.2.1", "0"),
        entry(A, "192.0.2.1", "nvme"),
        wrong_family,
        entry(A, "192.0.2.1", "4420"),
    ];
    let paths = paths_of(&entries, &nqn(A));
    assert_eq!(
        show(&paths),
        [
            "array.example:4420 !",
            "192.0.2.1:0 !",
            "192.0.2.1:nvme !",
            "192.0.2.1:4420 !",
            // Not shadowed by the wrong-family listing of the same text.
            "192.0.2.1:4420",
        ]
    );
    for p in &paths[..4] {
        let e = p.result.as_ref().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
    }
}

#[test]
fn discovery_addresses_take_8009_unless_a_port_is_given() {
    for (given, want) in [
        ("192.0.2.10", "192.0.2.10:8009"),
        ("192.0.2.10:4420", "192.0.2.10:4420"),
        ("fd00::1", "[fd00::1]:8009"),
        ("[fd00::1]", "[fd00::1]:8009"),
        ("[fd00::1]:4420", "[fd00::1]:4420"),
    ] {
        assert_eq!(parse_address(given).unwrap().to_string(), want, "{given}");
    }
    for bad in [
        "",
        "array.example",
        "array.example:8009",
        "192.0.2.10:0",
        "192.0.2.10:65536",
        "192.0.2.10:",
        "[192.0.2.10]",
        "[fd00::1",
    ] {
        let e = parse_address(bad).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Invalid, "{bad}: {e}");
    }
}

#[test]
fn a_port_that_requires_tls_is_refused_by_name() {
    let mut e = entry("nqn.2014-08.org.lunkit:a", "127.0.0.2", "4420");
    assert!(tls_refusal(&e).is_none());
    e.requirements = 0b01; // TREQ: secure channel required
    let refusal = tls_refusal(&e).expect("refused").to_string();
    assert!(
        refusal.contains("TLS") && refusal.contains("127.0.0.2:4420"),
        "{refusal}"
    );
    e.requirements = 0b10; // not required
    assert!(tls_refusal(&e).is_none());
}

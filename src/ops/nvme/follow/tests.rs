use super::*;
use crate::nvme::discovery::{AddressFamily, Subtype, TransportType};
use crate::nvme::sysfs::{CtrlState, NvmeController};
use crate::uevent::Uevent;
use decide::is_path;

fn entry(subsystem: &str, address: &str, port: u16, subtype: Subtype) -> Entry {
    Entry {
        transport: TransportType::Tcp,
        family: AddressFamily::Ipv4,
        subtype,
        requirements: 0,
        port_id: 1,
        controller_id: 0xffff,
        admin_queue_size: 32,
        flags: 0,
        service_id: port.to_string(),
        subsystem: subsystem.to_owned(),
        address: address.to_owned(),
        tcp_security: 0,
    }
}

fn event(devpath: &str, subsystem: &str, env: &[(&str, &str)]) -> Uevent {
    event_of("change", devpath, subsystem, env)
}

fn event_of(action: &str, devpath: &str, subsystem: &str, env: &[(&str, &str)]) -> Uevent {
    let mut buf = format!(
        "{action}@{devpath}\0ACTION={action}\0DEVPATH={devpath}\0SUBSYSTEM={subsystem}\0SEQNUM=7\0"
    );
    for (k, v) in env {
        buf.push_str(&format!("{k}={v}\0"));
    }
    Uevent::parse(buf.as_bytes()).unwrap()
}

fn controller(name: &str, state: &str, namespaces: &[&str]) -> NvmeController {
    NvmeController {
        name: name.to_owned(),
        transport: Some("tcp".into()),
        address: None,
        state: Some(state.to_owned()),
        parsed_state: Some(CtrlState::parse(state)),
        subsysnqn: Some("nqn.2014-08.org.lunkit:a".into()),
        model: None,
        serial: None,
        namespaces: namespaces.iter().map(|n| (*n).to_owned()).collect(),
        cntlid: None,
        hostnqn: None,
        hostid: None,
        object: None,
    }
}

#[test]
fn only_this_controllers_change_or_rediscover_event_triggers_a_read() {
    let path = "/devices/virtual/nvme-fabrics/ctl/nvme3";
    let aen = [("NVME_AEN", AEN_DISCOVERY_CHANGE)];
    assert_eq!(
        trigger(&event(path, "nvme", &aen), "nvme3"),
        Some(Trigger::Changed)
    );
    assert_eq!(
        trigger(
            &event(path, "nvme", &[("NVME_EVENT", "rediscover")]),
            "nvme3"
        ),
        Some(Trigger::Rediscover)
    );
    // Another controller's, another notice, another subsystem, or none at all.
    assert_eq!(trigger(&event(path, "nvme", &aen), "nvme30"), None);
    assert_eq!(
        trigger(&event(path, "nvme", &[("NVME_AEN", "0x000002")]), "nvme3"),
        None
    );
    assert_eq!(trigger(&event(path, "block", &aen), "nvme3"), None);
    assert_eq!(trigger(&event(path, "nvme", &[]), "nvme3"), None);
}

#[test]
fn the_diff_names_new_and_gone_subsystem_paths_once_and_ignores_referrals() {
    let a1 = entry("nqn.2014-08.org.lunkit:a", "127.0.0.1", 4420, Subtype::Nvm);
    let a2 = entry("nqn.2014-08.org.lunkit:a", "127.0.0.2", 4420, Subtype::Nvm);
    let b1 = entry("nqn.2014-08.org.lunkit:b", "127.0.0.1", 4420, Subtype::Nvm);
    let referral = entry("", "127.0.0.3", 4420, Subtype::Referral);
    let (added, removed) = diff(
        &[a1.clone(), b1.clone()],
        &[a1.clone(), a2.clone(), referral],
    );
    assert_eq!(added, vec![a2]);
    assert_eq!(removed, vec![b1]);
    // The same path with other fields (a new port id) is not a change.
    let mut a1_again = a1.clone();
    a1_again.port_id = 9;
    assert_eq!(diff(&[a1], &[a1_again]), (vec![], vec![]));
}

#[test]
fn a_gone_path_is_deleted_only_when_another_path_is_live_and_no_device_goes() {
    let gone = controller("nvme1", "connecting", &["nvme0c1n1"]);
    let live = controller("nvme0", "live", &["nvme0c0n1"]);
    assert_eq!(keep_reason(&gone, &[live.clone(), gone.clone()]), None);
    // The only path, or the others not live: kept.
    let only = keep_reason(&gone, std::slice::from_ref(&gone)).unwrap();
    assert!(only.contains("only path"), "{only}");
    let down = controller("nvme0", "connecting", &["nvme0c0n1"]);
    assert!(keep_reason(&gone, &[down, gone.clone()]).is_some());
    // Without native multipath the controller's namespace is a device someone may hold.
    let own = controller("nvme1", "connecting", &["nvme1n1"]);
    let why = keep_reason(&own, &[live, own.clone()]).unwrap();
    assert!(why.contains("nvme1n1"), "{why}");
}

#[test]
fn native_multipath_paths_are_told_from_devices() {
    for p in ["nvme0c0n1", "nvme12c3n45"] {
        assert!(is_path(p), "{p}");
    }
    for d in ["nvme0n1", "nvme0", "nvmec1n1", "nvme0c", "sda"] {
        assert!(!is_path(d), "{d}");
    }
}

#[test]
fn only_this_controllers_remove_event_says_it_went() {
    let path = "/devices/virtual/nvme-fabrics/ctl/nvme3";
    assert!(removes(&event_of("remove", path, "nvme", &[]), "nvme3"));
    assert!(!removes(&event_of("remove", path, "nvme", &[]), "nvme30"));
    assert!(!removes(&event_of("change", path, "nvme", &[]), "nvme3"));
    assert!(!removes(&event_of("remove", path, "block", &[]), "nvme3"));
}

#[test]
fn a_failed_path_is_seen_again_by_the_next_read_and_a_tls_refusal_is_not() {
    let (a, b, c) = (
        entry("nqn.2014-08.org.lunkit:a", "127.0.0.2", 4420, Subtype::Nvm),
        entry("nqn.2014-08.org.lunkit:a", "127.0.0.3", 4420, Subtype::Nvm),
        entry("nqn.2014-08.org.lunkit:a", "127.0.0.4", 4420, Subtype::Nvm),
    );
    let mut tls = entry("nqn.2014-08.org.lunkit:a", "127.0.0.5", 4420, Subtype::Nvm);
    tls.requirements = 0b01;
    let failed = |e: &Entry| PathChange {
        entry: e.clone(),
        action: PathAction::Failed(Error::NotFound { what: "x".into() }),
    };
    let connected = |e: &Entry| PathChange {
        entry: e.clone(),
        action: PathAction::Connected {
            controller: "nvme3".into(),
            existing: false,
        },
    };
    // The log now lists a, b and the TLS port; c was dropped from it.
    let mut known = vec![a.clone(), b.clone(), tls.clone()];
    let paths = [connected(&a), failed(&b), failed(&tls), failed(&c)];
    assert!(requeue(&mut known, &paths));
    let (added, removed) = diff(&known, &[a.clone(), b.clone(), tls.clone()]);
    assert_eq!(added, [b], "the failed connect is new again");
    assert_eq!(removed, [c], "the failed delete is gone again");
    let mut known = vec![a.clone(), tls.clone()];
    assert!(!requeue(&mut known, &[connected(&a), failed(&tls)]));
    assert_eq!(known, [a, tls]);
}

#[test]
fn failed_paths_are_retried_after_a_wait_that_doubles_up_to_sixteen_minutes() {
    let secs: Vec<u64> = (0..8).map(|n| retry_wait(n).as_secs()).collect();
    assert_eq!(secs, [30, 60, 120, 240, 480, 960, 960, 960]);
    assert_eq!(retry_wait(u32::MAX).as_secs(), 960);
}

#[test]
fn a_path_is_connected_only_for_the_followed_subsystems_and_with_their_secrets() {
    const HOST_KEY: &str = "DHHC-1:01:09GFUL+L04EJzFZN2elQGibBeBw1RuITyd7jlFaOZAJwwOLq:";
    const CTRL_KEY: &str = "DHHC-1:00:Oi/HuU3nQlPSUMAHy9mtdKz0a+xVpewZQUdLbkIwufoPetit:";
    let host = Host {
        nqn: "nqn.2014-08.org.example:host".parse().unwrap(),
        id: None,
    };
    let ours = entry(
        "nqn.2014-08.org.example:ours",
        "192.0.2.7",
        4420,
        Subtype::Nvm,
    );
    let other = entry(
        "nqn.2014-08.org.example:other",
        "192.0.2.7",
        4420,
        Subtype::Nvm,
    );
    let mut opts = FollowOptions::new("192.0.2.7".parse().unwrap(), 8009);
    // Without a set, every subsystem's path, with no secret.
    let o = decide::path_connect(&opts, &host, &other).expect("any subsystem");
    assert!(o.dhchap_secret.is_none() && o.dhchap_ctrl_secret.is_none());
    opts.dhchap_secret = Some(HOST_KEY.parse().unwrap());
    opts.dhchap_ctrl_secret = Some(CTRL_KEY.parse().unwrap());
    opts.subsystems = Some([ours.nqn().unwrap()].into());
    assert!(decide::path_connect(&opts, &host, &other).is_none());
    let o = decide::path_connect(&opts, &host, &ours).expect("the followed subsystem");
    assert_eq!(o.host, Some(host));
    assert_eq!(o.dhchap_secret.as_ref().map(|s| s.expose()), Some(HOST_KEY));
    assert_eq!(
        o.dhchap_ctrl_secret.as_ref().map(|s| s.expose()),
        Some(CTRL_KEY)
    );
}

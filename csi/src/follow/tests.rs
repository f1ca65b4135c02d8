use super::*;
use crate::state::{Access, Phase};

/// Printed by `nvme gen-dhchap-key --hmac=1` and `--hmac=0` (nvme-cli 2.3).
const HOST_KEY: &str = "DHHC-1:01:09GFUL+L04EJzFZN2elQGibBeBw1RuITyd7jlFaOZAJwwOLq:";
const CTRL_KEY: &str = "DHHC-1:00:Oi/HuU3nQlPSUMAHy9mtdKz0a+xVpewZQUdLbkIwufoPetit:";
/// Printed by `nvme gen-dhchap-key --hmac=2`.
const OTHER_KEY: &str =
    "DHHC-1:02:qsB+HoiBIHLENgMh7Azb0yY7CSO1/fBCrqiqru1/4OXqsdkcG+UeondUvX166gT7al+LeQ==:";

fn nvme(discovery: &[&str], host_nqn: Option<&str>) -> Record {
    nvme_of(
        "vol",
        "nqn.2014-08.org.example:a",
        discovery,
        host_nqn,
        Dhchap::None,
    )
}

fn nvme_of(
    id: &str,
    nqn: &str,
    discovery: &[&str],
    host_nqn: Option<&str>,
    dhchap: Dhchap,
) -> Record {
    Record {
        version: crate::state::RECORD_VERSION,
        volume_id: id.into(),
        staging_path: "/staging".into(),
        phase: Phase::Staged,
        target: Target::Nvme {
            nqn: nqn.into(),
            portals: vec![],
            discovery: discovery.iter().map(|s| (*s).to_owned()).collect(),
            nsid: Some(1),
            device_uuid: None,
            device_wwid: None,
            host_nqn: host_nqn.map(str::to_owned),
            host_id: None,
            dhchap,
        },
        access: Access::Block,
        wwid: None,
        expected_wwid: None,
        device: None,
        map: false,
        published: Vec::new(),
    }
}

fn auth(secret: Option<&str>, ctrl: Option<&str>) -> Auth {
    Auth {
        secret: secret.map(|s| s.parse().unwrap()),
        ctrl_secret: ctrl.map(|s| s.parse().unwrap()),
    }
}

fn no_auth(_: &Record, _: &Nqn) -> Result<Auth, String> {
    Ok(Auth::default())
}

#[test]
fn each_service_and_host_is_followed_once_and_only_for_nvme_records() {
    let a = nvme(&["192.0.2.10:8009", "192.0.2.11"], None);
    let b = nvme(&["192.0.2.10:8009"], None);
    let c = nvme(&["192.0.2.10:8009"], Some("nqn.2014-08.org.example:host2"));
    let d = nvme(&[], None);
    let (keys, left) = wanted(&[a, b, c, d], no_auth);
    let shown: Vec<String> = keys
        .iter()
        .map(|(k, n)| format!("{} {:?} {}", k.address, k.host_nqn, n.len()))
        .collect();
    assert_eq!(
        shown,
        [
            "192.0.2.10:8009 None 1",
            "192.0.2.10:8009 Some(\"nqn.2014-08.org.example:host2\") 1",
            "192.0.2.11:8009 None 1",
        ]
    );
    assert!(left.is_empty(), "{left:?}");
    assert!(wanted(&[], no_auth).0.is_empty());
}

/// Two volumes that name one service as one host with other secrets get a follower each,
/// each for its own subsystem only; two with the same secrets share one for both.
#[test]
fn volumes_with_other_secrets_never_share_a_follower() {
    let service = &["192.0.2.10:8009"];
    let x = nvme_of(
        "x",
        "nqn.2014-08.org.example:x",
        service,
        None,
        Dhchap::Bidirectional,
    );
    let y = nvme_of(
        "y",
        "nqn.2014-08.org.example:y",
        service,
        None,
        Dhchap::Bidirectional,
    );
    let z = nvme_of(
        "z",
        "nqn.2014-08.org.example:z",
        service,
        None,
        Dhchap::None,
    );
    let secrets = |r: &Record, _: &Nqn| -> Result<Auth, String> {
        Ok(match r.volume_id.as_str() {
            "x" => auth(Some(HOST_KEY), Some(CTRL_KEY)),
            "y" => auth(Some(HOST_KEY), Some(OTHER_KEY)),
            _ => Auth::default(),
        })
    };
    let (plan, left) = wanted(&[x.clone(), y.clone(), z], secrets);
    assert!(left.is_empty(), "{left:?}");
    let mut shown: Vec<(String, Dhchap, Option<&str>)> = plan
        .iter()
        .map(|(k, n)| {
            let nqns: Vec<String> = n.iter().map(ToString::to_string).collect();
            (
                nqns.join(" "),
                k.auth.dhchap(),
                k.auth.ctrl_secret.as_ref().map(|s| s.expose()),
            )
        })
        .collect();
    shown.sort();
    assert_eq!(
        shown,
        [
            (
                "nqn.2014-08.org.example:x".into(),
                Dhchap::Bidirectional,
                Some(CTRL_KEY)
            ),
            (
                "nqn.2014-08.org.example:y".into(),
                Dhchap::Bidirectional,
                Some(OTHER_KEY)
            ),
            ("nqn.2014-08.org.example:z".into(), Dhchap::None, None),
        ]
    );

    let same = |_: &Record, _: &Nqn| Ok(auth(Some(HOST_KEY), Some(CTRL_KEY)));
    let (plan, _) = wanted(&[x, y], same);
    assert_eq!(plan.len(), 1, "{plan:?}");
    assert_eq!(plan.values().next().unwrap().len(), 2);
}

/// A volume staged with a controller secret is never followed without one (nor one staged
/// with a host secret without it): it is left out, saying why, and no message or `Debug`
/// shows a secret.
#[test]
fn a_volume_that_wants_controller_authentication_is_never_followed_without_it() {
    let service = &["192.0.2.10:8009"];
    let both = nvme_of(
        "both",
        "nqn.2014-08.org.example:b",
        service,
        None,
        Dhchap::Bidirectional,
    );
    let host = nvme_of(
        "host",
        "nqn.2014-08.org.example:h",
        service,
        None,
        Dhchap::Host,
    );
    for found in [Auth::default(), auth(Some(HOST_KEY), None)] {
        let (plan, left) = wanted(std::slice::from_ref(&both), |_, _| Ok(found.clone()));
        assert!(plan.is_empty(), "{plan:?}");
        assert!(
            matches!(&left[..], [w] if w.starts_with("volume both: ") && w.contains("dhchapCtrlSecret")),
            "{left:?}"
        );
    }
    let (plan, left) = wanted(std::slice::from_ref(&host), no_auth);
    assert!(plan.is_empty() && left.len() == 1, "{plan:?} {left:?}");
    // A secret the kernel could not give: left out, with its reason.
    let (plan, left) = wanted(std::slice::from_ref(&both), |_, _| Err("no access".into()));
    assert!(
        plan.is_empty() && left[0].ends_with("no access"),
        "{left:?}"
    );

    let (plan, left) = wanted(&[both, host], |_, _| {
        Ok(auth(Some(HOST_KEY), Some(CTRL_KEY)))
    });
    assert!(left.is_empty(), "{left:?}");
    let (key, nqns) = plan.iter().next().unwrap();
    assert_eq!(nqns.len(), 2);
    let opts = options(&Root::default(), key, nqns).unwrap();
    assert_eq!(
        opts.dhchap_secret.as_ref().map(|s| s.expose()),
        Some(HOST_KEY)
    );
    assert_eq!(
        opts.dhchap_ctrl_secret.as_ref().map(|s| s.expose()),
        Some(CTRL_KEY)
    );
    assert_eq!(opts.subsystems.as_ref(), Some(nqns));
    for shown in [format!("{key:?}"), key.describe(), key.marker()] {
        for k in [HOST_KEY, CTRL_KEY] {
            assert!(!shown.contains(k.split(':').nth(2).unwrap()), "{shown}");
        }
    }
    assert!(key.describe().ends_with("with DH-HMAC-CHAP both ways"));
}

#[test]
fn a_marker_name_is_stable_and_tells_keys_apart() {
    let k = |nqn: Option<&str>| Key {
        address: "192.0.2.10:8009".parse().unwrap(),
        host_nqn: nqn.map(str::to_owned),
        host_id: None,
        auth: Auth::default(),
    };
    assert_eq!(k(None).marker(), k(None).marker());
    assert_ne!(
        k(None).marker(),
        k(Some("nqn.2014-08.org.example:h")).marker()
    );
    assert!(k(None).marker().starts_with("discovery-"));
    assert_eq!(k(None).marker().len(), "discovery-".len() + 16);
}

/// The kernel's secrets of a volume's controller, as 6.12's sysfs shows them: `none` for one
/// not given; a controller of another host is not read.
#[test]
fn the_secrets_are_read_from_a_controller_of_the_volumes_host() {
    let dir = tempfile::tempdir().unwrap();
    let root = Root::new(dir.path());
    let nqn: Nqn = "nqn.2014-08.org.example:s".parse().unwrap();
    let ctrl = |name: &str, host: &str, secret: &str, ctrl_secret: &str| {
        let d = dir.path().join("sys/class/nvme").join(name);
        std::fs::create_dir_all(&d).unwrap();
        for (f, v) in [
            ("subsysnqn", nqn.as_str()),
            ("hostnqn", host),
            ("state", "live"),
            ("transport", "tcp"),
            ("dhchap_secret", secret),
            ("dhchap_ctrl_secret", ctrl_secret),
        ] {
            std::fs::write(d.join(f), format!("{v}\n")).unwrap();
        }
    };
    ctrl(
        "nvme0",
        "nqn.2014-08.org.example:other",
        OTHER_KEY,
        OTHER_KEY,
    );
    assert_eq!(
        auth::from_kernel(&root, &nqn, "nqn.2014-08.org.example:h").unwrap(),
        Auth::default()
    );
    ctrl("nvme1", "nqn.2014-08.org.example:h", HOST_KEY, "none");
    let a = auth::from_kernel(&root, &nqn, "nqn.2014-08.org.example:h").unwrap();
    assert_eq!(a, auth(Some(HOST_KEY), None));
    assert_eq!(
        format!("{a:?}"),
        "Auth { secret: true, ctrl_secret: false }"
    );
}

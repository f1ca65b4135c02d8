use super::*;

#[test]
fn reads_csi_driver_iscsi_attributes() {
    let v = parse_iscsi(
        "pv-1",
        &ctx(&[
            ("targetPortal", "10.0.0.1"),
            (
                "portals",
                r#"["10.0.0.2:3261", "10.0.0.1:3260", "[fd00::1]:3260"]"#,
            ),
            ("iqn", IQN),
            ("lun", "7"),
            ("iscsiInterface", "default"),
            ("discoveryCHAPAuth", "false"),
            ("wwid", "36001405a1b2c3d4e5f60718293a4b5c6"),
        ]),
        &HashMap::new(),
    )
    .unwrap();
    assert_eq!(v.iqn, IQN);
    assert_eq!(v.lun, 7);
    assert_eq!(
        v.portals,
        ["10.0.0.1:3260", "10.0.0.2:3261", "[fd00::1]:3260"],
        "targetPortal first, the default port added, the duplicate dropped"
    );
    assert_eq!(v.iface, None);
    assert!(v.wwid.is_some());
}

#[test]
fn refuses_missing_and_malformed_attributes_naming_the_key() {
    let base = [
        ("targetPortal", "10.0.0.1:3260"),
        ("iqn", IQN),
        ("lun", "1"),
    ];
    for missing in ["targetPortal", "iqn", "lun"] {
        let pairs: Vec<_> = base
            .iter()
            .copied()
            .filter(|(k, _)| *k != missing)
            .collect();
        let e = parse_iscsi("pv-1", &ctx(&pairs), &HashMap::new()).unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert_eq!(
            e.to_string(),
            format!("volume pv-1: volume attribute {missing}: missing")
        );
    }
    let cases: &[(&str, &str)] = &[
        ("lun", "-1"),
        ("lun", "4294967296"),
        ("lun", "one"),
        ("iqn", "iqn with space"),
        ("iqn", "."),
        ("iqn", ".."),
        ("iqn", "target1"),
        ("iqn", "iqn.2003-13.org.example:t"),
        ("iscsiInterface", "."),
        ("iscsiInterface", ".."),
        ("targetPortal", "10.0.0.1:0"),
        ("targetPortal", "10.0.0.1:99999"),
        ("targetPortal", "fd00::1"),
        ("targetPortal", "[fd00::1"),
        ("targetPortal", "10.0.0.1,10.0.0.2"),
        ("portals", "10.0.0.2:3260"),
        ("portals", r#"["10.0.0.2:x"]"#),
        ("iscsiInterface", "eth0 -o delete"),
        ("wwid", "naa.xyz"),
        ("wwid", "a/b"),
        ("sessionCHAPAuth", "yes"),
        ("discoveryCHAPAuth", "True"),
        ("secret", r#"{"node.session.auth.username":"u"}"#),
    ];
    for (key, value) in cases {
        let mut m = ctx(&base);
        m.insert((*key).to_owned(), (*value).to_owned());
        let e = parse_iscsi("pv-1", &m, &HashMap::new()).unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{key}={value}: {e}");
        assert!(
            e.to_string()
                .starts_with(&format!("volume pv-1: volume attribute {key}: ")),
            "{key}={value}: {e}"
        );
    }
}

const PASSWORD: &str = "s3cret-Pa55word";

fn chap_attrs() -> HashMap<String, String> {
    ctx(&[
        ("targetPortal", "10.0.0.1"),
        ("iqn", IQN),
        ("lun", "0"),
        ("sessionCHAPAuth", "true"),
        ("discoveryCHAPAuth", "true"),
    ])
}

fn secrets(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    ctx(pairs)
}

#[test]
fn session_chap_reads_kubernetes_iscsi_chap_secret_keys() {
    let s = secrets(&[
        (CHAP_USERNAME, "node-user"),
        (CHAP_PASSWORD, PASSWORD),
        // Discovery keys are not needed and not read.
        ("discovery.sendtargets.auth.username", "x"),
        ("discovery.sendtargets.auth.password", "-\n"),
    ]);
    let v = parse_iscsi("pv", &chap_attrs(), &s).unwrap();
    let chap = v.chap.expect("CHAP asked for");
    assert_eq!(chap.username, "node-user");
    assert_eq!(chap.password.expose(), PASSWORD);
    assert_eq!(chap.mutual, None);
    assert_eq!(
        chap.settings(),
        [
            ("node.session.auth.authmethod", "CHAP"),
            ("node.session.auth.username", "node-user"),
        ]
    );
    assert_eq!(chap.secrets(), [("node.session.auth.password", PASSWORD)]);
    let dbg = format!("{v:?}", v = chap);
    assert!(!dbg.contains(PASSWORD), "{dbg}");

    let mut s = s;
    s.insert(CHAP_USERNAME_IN.into(), "target-user".into());
    s.insert(CHAP_PASSWORD_IN.into(), "target-s3cret".into());
    s.insert(CHAP_AUTHMETHOD.into(), "CHAP".into());
    let chap = parse_iscsi("pv", &chap_attrs(), &s).unwrap().chap.unwrap();
    let (user_in, password_in) = chap.mutual.clone().expect("mutual CHAP");
    assert_eq!(user_in, "target-user");
    assert_eq!(password_in.expose(), "target-s3cret");
    assert_eq!(chap.settings().len(), 3);
    assert_eq!(
        chap.secrets(),
        [
            ("node.session.auth.password", PASSWORD),
            ("node.session.auth.password_in", "target-s3cret"),
        ]
    );
    let dbg = format!("{chap:?}");
    assert!(
        !dbg.contains("target-s3cret") && !dbg.contains(PASSWORD),
        "{dbg}"
    );
}

#[test]
fn without_session_chap_secrets_are_not_read() {
    let mut m = chap_attrs();
    m.insert("sessionCHAPAuth".into(), "false".into());
    let v = parse_iscsi("pv", &m, &secrets(&[(CHAP_PASSWORD, "-bad\n")])).unwrap();
    assert_eq!(v.chap, None);
    m.remove("sessionCHAPAuth");
    assert_eq!(parse_iscsi("pv", &m, &HashMap::new()).unwrap().chap, None);
}

#[test]
fn bad_chap_secrets_are_refused_naming_the_key_never_the_value() {
    let good = [(CHAP_USERNAME, "node-user"), (CHAP_PASSWORD, PASSWORD)];
    let long = "x".repeat(MAX_CHAP_LEN + 1);
    let at_limit = "y".repeat(MAX_CHAP_LEN);
    let with = |key: &'static str, value: &str| {
        let mut s = secrets(&good);
        s.insert(key.into(), value.into());
        s
    };
    let without = |key: &str| {
        let mut s = secrets(&good);
        s.remove(key);
        s
    };
    let cases: Vec<(HashMap<String, String>, &str, &str)> = vec![
        (without(CHAP_USERNAME), CHAP_USERNAME, "missing"),
        (without(CHAP_PASSWORD), CHAP_PASSWORD, "missing"),
        (with(CHAP_PASSWORD, ""), CHAP_PASSWORD, "is empty"),
        (with(CHAP_USERNAME, ""), CHAP_USERNAME, "is empty"),
        (with(CHAP_PASSWORD, &long), CHAP_PASSWORD, "at most 255"),
        (
            with(CHAP_PASSWORD, "pass\nnode.startup = automatic"),
            CHAP_PASSWORD,
            "control character",
        ),
        (
            with(CHAP_USERNAME, "user\r"),
            CHAP_USERNAME,
            "control character",
        ),
        (
            with(CHAP_PASSWORD, "-o delete"),
            CHAP_PASSWORD,
            "starts with '-'",
        ),
        (
            with(CHAP_USERNAME, "--login"),
            CHAP_USERNAME,
            "starts with '-'",
        ),
        (
            with(CHAP_PASSWORD, " padded "),
            CHAP_PASSWORD,
            "white space",
        ),
        (
            with(CHAP_USERNAME_IN, "target-user"),
            CHAP_PASSWORD_IN,
            "mutual CHAP",
        ),
        (
            with(CHAP_PASSWORD_IN, "target-s3cret"),
            CHAP_USERNAME_IN,
            "mutual CHAP",
        ),
        (
            with(CHAP_PASSWORD_IN, "-x"),
            CHAP_PASSWORD_IN,
            "starts with '-'",
        ),
        (
            with(CHAP_AUTHMETHOD, "None"),
            CHAP_AUTHMETHOD,
            "must be CHAP",
        ),
    ];
    for (s, key, why) in cases {
        let e = parse_iscsi("pv-9", &chap_attrs(), &s).unwrap_err();
        let m = e.to_string();
        assert_eq!(e.code(), Code::InvalidArgument, "{m}");
        assert!(
            m.starts_with(&format!("volume pv-9: secret {key}: ")),
            "{m}"
        );
        assert!(m.contains(why), "{key}: {m}");
        for v in s.values().filter(|v| v.len() > 2) {
            assert!(!m.contains(v.as_str()), "the value is in {m:?}");
        }
    }
    // 255 bytes is the most open-iscsi keeps whole, and is taken.
    let v = parse_iscsi("pv", &chap_attrs(), &with(CHAP_PASSWORD, &at_limit)).unwrap();
    assert_eq!(v.chap.unwrap().password.expose().len(), MAX_CHAP_LEN);
}

/// csi-driver-iscsi's example PV (examples/pv.yaml): SendTargets discovery, discovery
/// CHAP from the stage secrets.
#[test]
fn reads_csi_driver_iscsi_example_pv_with_discovery() {
    let m = ctx(&[
        ("targetPortal", "192.168.0.107:3260"),
        ("portals", "[]"),
        ("iqn", "iqn.2015-06.com.example.test:target1"),
        ("lun", "0"),
        ("iscsiInterface", "default"),
        ("discovery", "true"),
        ("discoveryCHAPAuth", "true"),
        ("sessionCHAPAuth", "false"),
        ("initiatorName", "iqn.2016-04.com.example:node-1"),
    ]);
    let s = secrets(&[
        ("discovery.sendtargets.auth.username", "disc-user"),
        ("discovery.sendtargets.auth.password", PASSWORD),
    ]);
    let v = parse_iscsi("pv", &m, &s).unwrap();
    assert!(v.discovery);
    assert_eq!(v.portals, ["192.168.0.107:3260"]);
    assert_eq!(v.chap, None);
    assert_eq!(
        v.initiator_name.as_deref(),
        Some("iqn.2016-04.com.example:node-1")
    );
    let c = v.discovery_chap.expect("discovery CHAP");
    assert_eq!(c.scope, ChapScope::Discovery);
    assert_eq!(
        c.settings(),
        [
            ("discovery.sendtargets.auth.authmethod", "CHAP"),
            ("discovery.sendtargets.auth.username", "disc-user"),
        ]
    );
    assert_eq!(
        c.secrets(),
        [("discovery.sendtargets.auth.password", PASSWORD)]
    );
    // Without its secrets, the key is named; session CHAP's keys are not taken for it.
    let e = parse_iscsi(
        "pv",
        &m,
        &secrets(&[(CHAP_USERNAME, "u"), (CHAP_PASSWORD, PASSWORD)]),
    )
    .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(
        e.to_string()
            .starts_with("volume pv: secret discovery.sendtargets.auth.username: missing")
            && e.to_string().contains("discoveryCHAPAuth is true"),
        "{e}"
    );
    // discoveryCHAPAuth without discovery opens no discovery session: nothing is read.
    let mut m2 = m.clone();
    m2.insert("discovery".into(), "false".into());
    let v = parse_iscsi("pv", &m2, &HashMap::new()).unwrap();
    assert!(!v.discovery && v.discovery_chap.is_none());
    for (k, bad) in [("discovery", "yes"), ("initiatorName", "iqn with space")] {
        let mut m3 = m.clone();
        m3.insert(k.into(), bad.into());
        let e = parse_iscsi("pv", &m3, &s).unwrap_err();
        assert!(
            e.to_string()
                .starts_with(&format!("volume pv: volume attribute {k}: ")),
            "{e}"
        );
    }
}

#[test]
fn portals_take_the_form_sysfs_shows() {
    assert_eq!(portal("127.0.0.1").unwrap(), "127.0.0.1:3260");
    assert_eq!(portal(" 127.0.0.2:3261 ").unwrap(), "127.0.0.2:3261");
    assert_eq!(portal("[::1]").unwrap(), "[::1]:3260");
    assert_eq!(portal("[::1]:860").unwrap(), "[::1]:860");
    assert_eq!(
        portal("san.example.invalid").unwrap(),
        "san.example.invalid:3260"
    );
    assert!(portal("").is_err());
    assert!(portal("[::1]x").is_err());
    assert!(portal("[nothex]:3260").is_err());
}

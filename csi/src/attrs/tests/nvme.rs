use super::*;

#[test]
fn reads_csi_driver_nvmf_attributes() {
    let m = ctx(&[
        ("targetTrAddr", "127.0.0.1"),
        ("targetTrPort", "4420"),
        ("targetTrType", "tcp"),
        ("nqn", "nqn.2014-08.org.lunkit:lab"),
        ("deviceUUID", "0A1B2C3D-5e7a-4000-8000-000000000001"),
        ("portals", r#"["127.0.0.2:4420", "127.0.0.1:4420"]"#),
    ]);
    let Volume::Nvme(v) = parse("pv-n", &m, &HashMap::new()).unwrap() else {
        panic!("not NVMe")
    };
    assert_eq!(v.nqn.to_string(), "nqn.2014-08.org.lunkit:lab");
    assert_eq!(v.portals, ["127.0.0.1:4420", "127.0.0.2:4420"]);
    assert_eq!(v.nsid, None);
    assert_eq!(
        v.device_uuid.as_deref(),
        Some("0a1b2c3d-5e7a-4000-8000-000000000001")
    );
    let mut with_nsid = m.clone();
    with_nsid.remove("deviceUUID");
    with_nsid.insert("nsid".into(), "3".into());
    with_nsid.remove("targetTrPort");
    let Volume::Nvme(v) = parse("pv-n", &with_nsid, &HashMap::new()).unwrap() else {
        panic!("not NVMe")
    };
    assert_eq!((v.nsid, v.portals[0].as_str()), (Some(3), "127.0.0.1:4420"));
}

#[test]
fn refuses_bad_nvme_attributes() {
    let base = [
        ("targetTrAddr", "127.0.0.1"),
        ("nqn", "nqn.2014-08.org.lunkit:lab"),
        ("nsid", "1"),
    ];
    let cases: &[(&str, &str, Code)] = &[
        ("targetTrAddr", "san.example.invalid", Code::InvalidArgument),
        ("targetTrPort", "0", Code::InvalidArgument),
        ("targetTrType", "rdma", Code::Unimplemented),
        ("tls", "true", Code::Unimplemented),
        ("tlsKey", "NVMeTLSkey-1:01:abc:", Code::Unimplemented),
        ("nqn", "not an nqn", Code::InvalidArgument),
        ("nsid", "0", Code::InvalidArgument),
        ("deviceUUID", "1234", Code::InvalidArgument),
        ("portals", r#"["127.0.0.2"]"#, Code::InvalidArgument),
        ("iqn", IQN, Code::InvalidArgument),
    ];
    for (key, value, code) in cases {
        let mut m = ctx(&base);
        m.insert((*key).to_owned(), (*value).to_owned());
        let e = parse("pv-n", &m, &HashMap::new()).unwrap_err();
        assert_eq!(e.code(), *code, "{key}={value}: {e}");
        assert!(
            e.to_string().starts_with("volume pv-n: volume attribute"),
            "{e}"
        );
    }
    let mut m = ctx(&base);
    m.remove("nsid");
    let e = parse("pv-n", &m, &HashMap::new()).unwrap_err();
    assert!(e.to_string().contains("deviceID: missing"), "{e}");
}

#[test]
fn reads_discovery_addresses_with_or_without_a_first_port() {
    let nqn = ("nqn", "nqn.2014-08.org.lunkit:lab");
    let nvme = |attrs: &[(&str, &str)]| match parse("pv-d", &ctx(attrs), &HashMap::new()) {
        Ok(Volume::Nvme(v)) => Ok(v),
        Ok(other) => panic!("not NVMe: {other:?}"),
        Err(e) => Err(e),
    };
    // Alone: the logs list the ports. Port 8009 unless given, each address once, in
    // either list form, IPv6 in brackets.
    for list in [
        r#"["192.0.2.10", "192.0.2.11:4420", "192.0.2.10:8009", "[fd00::1]:8009"]"#,
        "192.0.2.10, 192.0.2.11:4420,192.0.2.10:8009,[fd00::1]:8009",
        "192.0.2.10,192.0.2.11:4420,fd00::1",
    ] {
        let v = nvme(&[nqn, ("nsid", "1"), ("discoveryAddrs", list)]).unwrap();
        assert_eq!(
            v.discovery,
            ["192.0.2.10:8009", "192.0.2.11:4420", "[fd00::1]:8009"],
            "{list}"
        );
        assert!(v.portals.is_empty(), "{v:?}");
    }
    // With csi-driver-nvmf's first port: both are connected.
    let v = nvme(&[
        nqn,
        ("nsid", "1"),
        ("targetTrAddr", "192.0.2.20"),
        ("discoveryAddrs", "[fd00::1]"),
    ])
    .unwrap();
    assert_eq!(
        (v.portals, v.discovery),
        (
            vec!["192.0.2.20:4420".to_owned()],
            vec!["[fd00::1]:8009".to_owned()]
        )
    );
    // Neither a port nor a discovery address: nothing to connect.
    let e = nvme(&[nqn, ("nsid", "1")]).unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e}");
    assert!(e.to_string().contains("targetTrAddr: missing"), "{e}");
    for bad in [
        "array.example",
        "192.0.2.10:0",
        "192.0.2.10,,192.0.2.11",
        r#"["192.0.2.10", 8009]"#,
        "[]",
        ",",
    ] {
        let e = nvme(&[nqn, ("nsid", "1"), ("discoveryAddrs", bad)]).unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{bad}: {e}");
        assert!(
            e.to_string()
                .starts_with("volume pv-d: volume attribute discoveryAddrs:"),
            "{e}"
        );
    }
}

/// csi-driver-nvmf's example PV (examples/kubernetes/*/pv.yaml) with `extra` added.
fn with(extra: &[(&str, &str)]) -> Result<NvmeVolume> {
    let base = [
        ("targetTrAddr", "192.168.122.18"),
        ("targetTrPort", "49153"),
        ("targetTrType", "tcp"),
        ("nqn", "nqn.2022-08.org.test-nvmf.example"),
    ];
    let mut m = ctx(&base);
    m.extend(ctx(extra));
    match parse("pv", &m, &HashMap::new()) {
        Ok(Volume::Nvme(v)) => Ok(v),
        Ok(other) => panic!("not NVMe: {other:?}"),
        Err(e) => Err(e),
    }
}

/// csi-driver-nvmf's example PVs, with the device id forms their comments offer.
#[test]
fn reads_csi_driver_nvmf_example_pvs_device_ids() {
    let uuid = "58668891-c3e4-45d0-b90e-824525c16080";
    for attrs in [
        &[("deviceID", "uuid.58668891-c3e4-45d0-b90e-824525c16080")][..],
        &[("deviceUUID", uuid)],
        &[
            ("deviceID", "uuid.58668891-C3E4-45d0-b90e-824525c16080"),
            ("deviceUUID", uuid),
        ],
    ] {
        let v = with(attrs).unwrap();
        assert_eq!(v.device_uuid.as_deref(), Some(uuid), "{attrs:?}");
        assert_eq!((v.device_wwid, v.nsid), (None, None));
        assert_eq!(v.portals, ["192.168.122.18:49153"]);
    }
    // An NGUID and an EUI-64 both show as eui.…; the kernel's own nvme.… form too.
    for (attrs, wwid) in [
        (
            &[("deviceEUI", "00000000000000000042AA42AA42AA42")][..],
            "eui.00000000000000000042aa42aa42aa42",
        ),
        (
            &[("deviceID", "eui.00000000000000000042aa42aa42aa42")],
            "eui.00000000000000000042aa42aa42aa42",
        ),
        (
            &[("deviceID", "eui.0025384c41a0b2c1")],
            "eui.0025384c41a0b2c1",
        ),
        (
            &[("deviceID", "nvme.1b36-6c756e6b6974-51454d55-00000001")],
            "nvme.1b36-6c756e6b6974-51454d55-00000001",
        ),
    ] {
        let v = with(attrs).unwrap();
        assert_eq!(v.device_wwid.as_deref(), Some(wwid), "{attrs:?}");
        assert_eq!(v.device_uuid, None);
    }
}

/// csi-driver-nvmf's example PVs: device ids that are not the kernel's forms and bad host
/// identities are refused naming the key; a good host identity is read.
#[test]
fn refuses_bad_device_ids_and_reads_host_identity() {
    let uuid = "58668891-c3e4-45d0-b90e-824525c16080";
    // udev's model-and-serial names, a malformed id, and two that disagree are refused,
    // naming the key.
    for (attrs, key) in [
        (
            &[("deviceID", "INTEL_SSDPF2KX038T9N_PHAB2261050P3P9EGN")][..],
            "deviceID",
        ),
        (
            &[("deviceID", "Pure_Storage_FlashArray_AA00000000000AAA_42")],
            "deviceID",
        ),
        (&[("deviceID", "eui.12345")], "deviceID"),
        (&[("deviceEUI", "xyz")], "deviceEUI"),
        (
            &[
                ("deviceID", "uuid.58668891-c3e4-45d0-b90e-824525c16080"),
                ("deviceEUI", "0025384c41a0b2c1"),
            ],
            "deviceEUI",
        ),
        (&[("nsid", "1"), ("hostNqn", "not an nqn")], "hostNqn"),
        (&[("nsid", "1"), ("hostId", "1234")], "hostId"),
    ] {
        let e = with(attrs).unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{attrs:?}: {e}");
        assert!(
            e.to_string()
                .starts_with(&format!("volume pv: volume attribute {key}: ")),
            "{attrs:?}: {e}"
        );
    }
    let v = with(&[
        ("deviceUUID", uuid),
        (
            "hostNqn",
            "nqn.2014-08.org.nvmexpress:uuid:0f8fad5b-d9cb-469f-a165-70867728950e",
        ),
        ("hostId", "0F8FAD5B-D9CB-469F-A165-70867728950E"),
    ])
    .unwrap();
    assert_eq!(
        v.host_nqn.map(|n| n.to_string()).as_deref(),
        Some("nqn.2014-08.org.nvmexpress:uuid:0f8fad5b-d9cb-469f-a165-70867728950e")
    );
    assert_eq!(
        v.host_id.map(|i| i.to_string()).as_deref(),
        Some("0f8fad5b-d9cb-469f-a165-70867728950e")
    );
}

/// Printed by `nvme gen-dhchap-key --hmac=1` and `--hmac=2` (nvme-cli 2.3).
const HOST_KEY: &str = "DHHC-1:01:09GFUL+L04EJzFZN2elQGibBeBw1RuITyd7jlFaOZAJwwOLq:";

const CTRL_KEY: &str =
    "DHHC-1:02:qsB+HoiBIHLENgMh7Azb0yY7CSO1/fBCrqiqru1/4OXqsdkcG+UeondUvX166gT7al+LeQ==:";

fn nvme_attrs() -> HashMap<String, String> {
    ctx(&[
        ("targetTrAddr", "10.0.0.1"),
        ("nqn", "nqn.2026-11.invalid.lunkit:auth"),
        ("nsid", "1"),
    ])
}

#[test]
fn dhchap_secrets_come_from_the_stage_secrets_checked() {
    let none = parse_nvme("pv-n", &nvme_attrs(), &HashMap::new()).unwrap();
    assert_eq!(none.auth, NvmeAuth::default());
    let both = ctx(&[("dhchapSecret", HOST_KEY), ("dhchapCtrlSecret", CTRL_KEY)]);
    let v = parse_nvme("pv-n", &nvme_attrs(), &both).unwrap();
    assert_eq!(v.auth.secret.as_ref().map(|s| s.expose()), Some(HOST_KEY));
    assert_eq!(
        v.auth.ctrl_secret.as_ref().map(|s| s.expose()),
        Some(CTRL_KEY)
    );
    // Through `parse`, as NodeStageVolume reads them.
    let Volume::Nvme(v) = parse("pv-n", &nvme_attrs(), &both).unwrap() else {
        panic!("not NVMe");
    };
    assert!(v.auth.secret.is_some() && v.auth.ctrl_secret.is_some());
}

#[test]
fn bad_or_misplaced_dhchap_secrets_are_refused_naming_the_key_not_the_value() {
    // One character of the key changed: the CRC no longer matches.
    let typo = HOST_KEY.replacen("09GF", "09GG", 1);
    type Case<'a> = (HashMap<String, String>, HashMap<String, String>, &'a str);
    let cases: Vec<Case> = vec![
        (
            nvme_attrs(),
            ctx(&[("dhchapSecret", &typo)]),
            "stage secret dhchapSecret",
        ),
        (
            nvme_attrs(),
            ctx(&[("dhchapSecret", "DHHC-1:01:short:")]),
            "stage secret dhchapSecret",
        ),
        (
            nvme_attrs(),
            ctx(&[("dhchapCtrlSecret", CTRL_KEY)]),
            "given without dhchapSecret",
        ),
        (
            {
                let mut a = nvme_attrs();
                a.insert("dhchapSecret".into(), HOST_KEY.into());
                a
            },
            HashMap::new(),
            "volume attribute dhchapSecret: a secret is not taken",
        ),
    ];
    for (attrs, secrets, says) in cases {
        let e = parse_nvme("pv-n", &attrs, &secrets).unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{e}");
        let text = e.to_string();
        assert!(
            text.starts_with("volume pv-n: ") && text.contains(says),
            "{text}"
        );
        for secret in [HOST_KEY, CTRL_KEY, typo.as_str()] {
            let key_part = &secret[10..30];
            assert!(
                !text.contains(key_part),
                "the error shows the secret: {text}"
            );
        }
    }
}

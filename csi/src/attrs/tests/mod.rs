use super::*;
use tonic::Code;

mod iscsi;
mod nvme;

fn ctx(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

const IQN: &str = "iqn.2003-01.org.linux-iscsi.lunkit:lab";

#[test]
fn reads_fc_attributes_in_either_list_form() {
    for list in [
        r#"["500a0981891b8dc5", "0x500A0982891B8DC5", "50:0a:09:81:89:1b:8d:c5"]"#,
        "500a0982891b8dc5, 500a0981891b8dc5",
    ] {
        let m = ctx(&[("targetWWNs", list), ("lun", "4")]);
        let Volume::Fc(v) = parse("pv-fc", &m, &HashMap::new()).unwrap() else {
            panic!("not FC: {list}")
        };
        assert_eq!(
            v.wwpns,
            [
                lunkit::Wwn(0x500a0981891b8dc5),
                lunkit::Wwn(0x500a0982891b8dc5)
            ],
            "sorted, each once: {list}"
        );
        assert_eq!((v.lun, v.wwid), (4, None));
    }
}

#[test]
fn refuses_bad_fc_attributes_naming_the_key() {
    let base = [("targetWWNs", "500a0981891b8dc5"), ("lun", "1")];
    let cases: &[(&str, &str)] = &[
        ("targetWWNs", "[]"),
        ("targetWWNs", "[500a0981891b8dc5]"),
        ("targetWWNs", "500a0981891b8dc5,"),
        ("targetWWNs", "500a0981891b8dc5/../x"),
        ("targetWWNs", r#"["500a0981891b8dc5ff"]"#),
        ("lun", "-1"),
        ("lun", "4294967296"),
        ("wwid", "naa.xyz"),
    ];
    for (key, value) in cases {
        let mut m = ctx(&base);
        m.insert((*key).to_owned(), (*value).to_owned());
        let e = parse("pv-fc", &m, &HashMap::new()).unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{key}={value}: {e}");
        assert!(
            e.to_string()
                .starts_with(&format!("volume pv-fc: volume attribute {key}: ")),
            "{key}={value}: {e}"
        );
    }
    let mut m = ctx(&base);
    m.remove("lun");
    assert!(
        parse("pv-fc", &m, &HashMap::new())
            .unwrap_err()
            .to_string()
            .ends_with("lun: missing")
    );
    // An FC target and an iSCSI one (or an NVMe subsystem) at once is no volume.
    for (k, v) in [("iqn", IQN), ("nqn", "nqn.2014-08.org.lunkit:lab")] {
        let mut m = ctx(&base);
        m.insert(k.into(), v.into());
        let e = parse("pv-fc", &m, &HashMap::new()).unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{e}");
        assert!(e.to_string().contains("name both"), "{e}");
    }
}

use std::path::PathBuf;
use std::time::Instant;

use super::*;

fn host() -> Host {
    Host {
        nqn: "nqn.2014-08.org.nvmexpress:uuid:1b4e28ba-2fa1-11d2-883f-b9a761bde3fb"
            .parse()
            .unwrap(),
        id: Some("1b4e28ba-2fa1-11d2-883f-b9a761bde3fb".parse().unwrap()),
    }
}

/// A scratch directory of its own per test, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("lunkit-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn opts() -> ConnectOptions {
    ConnectOptions::new(
        "127.0.0.2".parse().unwrap(),
        4420,
        "nqn.2014-08.org.lunkit:lab".parse().unwrap(),
    )
}

#[test]
fn the_option_string_is_the_kernels_grammar() {
    let (s, names) = option_string(&opts(), &host()).unwrap();
    assert_eq!(
        s,
        "transport=tcp,traddr=127.0.0.2,trsvcid=4420,nqn=nqn.2014-08.org.lunkit:lab,\
         hostnqn=nqn.2014-08.org.nvmexpress:uuid:1b4e28ba-2fa1-11d2-883f-b9a761bde3fb,\
         hostid=1b4e28ba-2fa1-11d2-883f-b9a761bde3fb"
    );
    assert_eq!(
        names,
        ["transport", "traddr", "trsvcid", "nqn", "hostnqn", "hostid"]
    );

    let mut o = opts();
    o.traddr = "fd00::2".parse().unwrap();
    o.ctrl_loss_tmo = Some(-1);
    o.reconnect_delay = Some(2);
    o.nr_io_queues = Some(4);
    o.keep_alive_tmo = Some(5);
    o.host_iface = Some("eth0".parse().unwrap());
    let h = Host { id: None, ..host() };
    let (s, names) = option_string(&o, &h).unwrap();
    assert!(
        s.starts_with("transport=tcp,traddr=fd00::2,trsvcid=4420,")
            && s.ends_with(
                ",ctrl_loss_tmo=-1,reconnect_delay=2,nr_io_queues=4,keep_alive_tmo=5,\
                 host_iface=eth0"
            )
            && !s.contains("hostid"),
        "{s}"
    );
    assert_eq!(names.len(), 10);
    o.duplicate_connect = true;
    let (s, names) = option_string(&o, &h).unwrap();
    assert!(s.ends_with(",host_iface=eth0,duplicate_connect"), "{s}");
    assert_eq!(names.last(), Some(&"duplicate_connect"));
}

#[test]
fn values_the_kernel_would_refuse_are_refused_first() {
    let mut o = opts();
    o.trsvcid = 0;
    assert!(option_string(&o, &host()).is_err());
    let mut o = opts();
    o.reconnect_delay = Some(0);
    assert!(option_string(&o, &host()).is_err());
    let mut o = opts();
    o.nr_io_queues = Some(0);
    assert!(option_string(&o, &host()).is_err());
    let mut o = opts();
    o.ctrl_loss_tmo = Some(-2);
    assert!(option_string(&o, &host()).is_err());
}

#[test]
fn transports_and_interfaces_are_checked() {
    assert_eq!("tcp".parse::<Transport>().unwrap(), Transport::Tcp);
    for bad in ["", "TCP", "rdma", "tcp,traddr=1.2.3.4", "udp"] {
        assert!(bad.parse::<Transport>().is_err(), "{bad}");
    }
    for good in ["eth0", "enp0s31f6", "bond0.100", "a"] {
        assert_eq!(good.parse::<Interface>().unwrap().as_str(), good);
    }
    for bad in [
        "",
        ".",
        "..",
        "eth0,x=1",
        "a=b",
        "a/b",
        "a:b",
        "a b",
        "sixteen-chars-xx",
    ] {
        assert!(bad.parse::<Interface>().is_err(), "{bad}");
    }
}

#[test]
fn replies_parse_strictly() {
    assert_eq!(
        parse_reply("instance=3,cntlid=1\n").unwrap(),
        Reply {
            instance: 3,
            cntlid: 1
        }
    );
    // A key a later kernel adds is ignored.
    assert_eq!(
        parse_reply("instance=0,cntlid=65535,foo=bar\n")
            .unwrap()
            .cntlid,
        65535
    );
    for bad in [
        "",
        "\n",
        "instance=-1,cntlid=-1",
        "instance=1",
        "cntlid=1",
        "instance=1,cntlid=65536",
        "instance=+1,cntlid=1",
        "instance=1,cntlid=1,garbage",
        "instance=x,cntlid=1",
    ] {
        assert!(parse_reply(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn the_options_a_kernel_supports_are_read_from_its_listing() {
    let text = "instance=-1,cntlid=-1,transport=%s,traddr=%s,trsvcid=%s,nqn=%s,\
                queue_size=%d,nr_io_queues=%d,reconnect_delay=%d,ctrl_loss_tmo=%d,\
                keep_alive_tmo=%d,hostnqn=%s,host_traddr=%s,host_iface=%s,hostid=%s,\
                duplicate_connect,disable_sqflow,hdr_digest,data_digest,\
                nr_write_queues=%d,nr_poll_queues=%d,tos=%d,fast_io_fail_tmo=%d,\
                discovery,dhchap_secret=%s,dhchap_ctrl_secret=%s\n";
    let names = parse_options(text).unwrap();
    assert!(names.iter().any(|n| n == "host_iface"));
    assert!(names.iter().any(|n| n == "duplicate_connect"));
    assert_eq!(names[0], "transport");
    assert!(parse_options("instance=0,cntlid=1\n").is_err());
}

#[test]
fn the_host_comes_from_etc_nvme_inside_the_root() {
    let dir = Scratch::new("hostnqn");
    let root = Root::new(dir.path());
    let err = Host::from_node(&root).unwrap_err();
    assert!(err.to_string().contains("hostnqn"), "{err}");
    std::fs::create_dir_all(dir.path().join("etc/nvme")).unwrap();
    std::fs::write(
        dir.path().join("etc/nvme/hostnqn"),
        "nqn.2014-08.org.nvmexpress:uuid:1b4e28ba-2fa1-11d2-883f-b9a761bde3fb\n",
    )
    .unwrap();
    let h = Host::from_node(&root).unwrap();
    assert_eq!(h.id, None);
    std::fs::write(
        dir.path().join("etc/nvme/hostid"),
        "1b4e28ba-2fa1-11d2-883f-b9a761bde3fb\n",
    )
    .unwrap();
    assert_eq!(Host::from_node(&root).unwrap(), host());
    std::fs::write(dir.path().join("etc/nvme/hostid"), "not-a-uuid\n").unwrap();
    assert!(Host::from_node(&root).is_err());
}

#[test]
fn a_regular_file_in_place_of_the_device_gets_nothing_written() {
    let dir = Scratch::new("fake-fabrics");
    std::fs::create_dir_all(dir.path().join("dev")).unwrap();
    let fake = dir.path().join("dev/nvme-fabrics");
    std::fs::write(&fake, "").unwrap();
    let root = Root::new(dir.path());
    let (s, _) = option_string(&opts(), &host()).unwrap();
    let far = Instant::now() + Duration::from_secs(5);
    assert!(write(&root, &s, "x", far).is_err());
    assert_eq!(std::fs::read(&fake).unwrap(), b"");
    std::fs::remove_file(&fake).unwrap();
    let err = write(&root, &s, "x", far).unwrap_err();
    assert_eq!(err.kind(), crate::ErrorKind::NotFound, "{err}");
}

/// Printed by `nvme gen-dhchap-key --hmac=1` and `--hmac=2` (nvme-cli 2.3).
const HOST_KEY: &str = "DHHC-1:01:09GFUL+L04EJzFZN2elQGibBeBw1RuITyd7jlFaOZAJwwOLq:";
const CTRL_KEY: &str =
    "DHHC-1:02:qsB+HoiBIHLENgMh7Azb0yY7CSO1/fBCrqiqru1/4OXqsdkcG+UeondUvX166gT7al+LeQ==:";

#[test]
fn secrets_go_into_the_option_string_and_nowhere_else() {
    let mut o = opts();
    o.dhchap_secret = Some(HOST_KEY.parse().unwrap());
    o.dhchap_ctrl_secret = Some(CTRL_KEY.parse().unwrap());
    let (line, names) = option_string(&o, &host()).unwrap();
    assert!(line.ends_with(&format!(
        ",dhchap_secret={HOST_KEY},dhchap_ctrl_secret={CTRL_KEY}"
    )));
    // One field per option still: the secrets hold no ','.
    assert_eq!(line.split(',').count(), names.len(), "{line}");
    assert_eq!(
        &names[names.len() - 2..],
        ["dhchap_secret", "dhchap_ctrl_secret"]
    );
    // Neither the options' debug form nor the description shows a key.
    for shown in [format!("{o:?}"), o.describe()] {
        assert!(
            !shown.contains("09GFUL") && !shown.contains("qsB+Ho"),
            "{shown}"
        );
    }
}

#[test]
fn authentication_errors_say_what_failed() {
    assert!(connect_hint(Some(libc::ENOKEY)).contains("no host secret"));
    assert!(connect_hint(Some(libc::EKEYREJECTED)).contains("rejected the host secret"));
    assert!(connect_hint(Some(libc::EPROTONOSUPPORT)).contains("CONFIG_NVME_HOST_AUTH"));
    assert!(connect_hint(Some(libc::EIO)).contains("DH-HMAC-CHAP"));
}

#[test]
fn a_uuid_nqn_gives_its_own_uuid_as_the_host_id() {
    let h = Host { id: None, ..host() };
    assert_eq!(
        h.id_from_nqn().to_string(),
        "1b4e28ba-2fa1-11d2-883f-b9a761bde3fb"
    );
}

#[test]
fn another_nqn_gets_a_stable_version_8_id_of_its_own() {
    let named = |nqn: &str| Host {
        nqn: nqn.parse().unwrap(),
        id: None,
    };
    let a = named("nqn.2010-06.com.example:node-a").id_from_nqn();
    let b = named("nqn.2010-06.com.example:node-b").id_from_nqn();
    assert_eq!(a, named("nqn.2010-06.com.example:node-a").id_from_nqn());
    assert_ne!(a, b);
    for id in [a, b] {
        let bytes = id.bytes();
        assert_eq!(bytes[6] >> 4, 8, "{id}: version 8");
        assert_eq!(bytes[8] >> 6, 0b10, "{id}: RFC 9562 variant");
    }
    // A uuid-form NQN whose UUID is malformed is just another name.
    let odd = named("nqn.2014-08.org.nvmexpress:uuid:not-a-uuid").id_from_nqn();
    assert_eq!(odd.bytes()[6] >> 4, 8);
}

#[test]
fn an_option_is_read_back_by_its_whole_name() {
    let s = "transport=tcp,traddr=192.0.2.1,trsvcid=4420,nqn=nqn.2014-08.org.example:a,\
             hostnqn=nqn.2014-08.org.example:h";
    assert_eq!(option_value(s, "nqn"), Some("nqn.2014-08.org.example:a"));
    assert_eq!(
        option_value(s, "hostnqn"),
        Some("nqn.2014-08.org.example:h")
    );
    assert_eq!(option_value(s, "traddr"), Some("192.0.2.1"));
    assert_eq!(option_value(s, "host"), None);
    assert_eq!(option_value("duplicate_connect", "duplicate_connect"), None);
}

//! NVMe over Fabrics: the connect string built from parsed NQNs, host ids and interface
//! names, and the parsers of what `/dev/nvme-fabrics` answers.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lunkit::Error;
use lunkit::id::{Nqn, Uuid};
use lunkit::nvme::fabrics::{self, ConnectOptions, Host, Interface};

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    // What the kernel answers: a reply that parses prints back to the same numbers.
    if let Ok(r) = fabrics::parse_reply(s) {
        let again = fabrics::parse_reply(&format!("instance={},cntlid={}\n", r.instance, r.cntlid));
        assert_eq!(again.unwrap(), r);
    }
    if let Ok(names) = fabrics::parse_options(s) {
        assert!(names.iter().all(|n| !n.contains(',') && !n.contains('=')));
    }
    // Whatever parses as an NQN, a host id or an interface cannot add an option: the
    // connect string has exactly one field per option, each `name=value`.
    let mut parts = s.splitn(3, '\n');
    let (a, b, c) = (parts.next(), parts.next(), parts.next());
    let nqn = a.map(str::parse::<Nqn>);
    if let Some(Err(e)) = &nqn {
        assert!(matches!(e, Error::Invalid { kind: "NQN", .. }), "{e:?}");
    }
    let Some(Ok(nqn)) = nqn else {
        return;
    };
    assert_eq!(nqn.as_str(), a.unwrap());
    let id = b.and_then(|b| b.parse::<Uuid>().ok());
    if let Some(id) = id {
        assert_eq!(id.to_string().parse::<Uuid>().unwrap(), id);
    }
    let iface = c.and_then(|c| c.parse::<Interface>().ok());
    let mut opts = ConnectOptions::new("192.0.2.1".parse().unwrap(), 4420, nqn.clone());
    opts.host_iface = iface;
    let host = Host { nqn, id };
    let (line, names) = fabrics::option_string(&opts, &host).unwrap();
    let fields: Vec<&str> = line.split(',').collect();
    assert_eq!(fields.len(), names.len(), "{line}");
    for (field, name) in fields.iter().zip(&names) {
        let (k, v) = field.split_once('=').unwrap();
        assert_eq!(k, *name);
        assert!(!v.is_empty() && !v.contains('='), "{line}");
    }
});

//! Helpers shared by the fuzz targets: the inverse of each parser, written independently of
//! the library, so a target can check that what parsed formats back to the same value.

use lunkit::multipath::{GroupState, Status, Table};
use lunkit::uevent::Uevent;

fn counted(out: &mut Vec<String>, words: &[String]) {
    out.push(words.len().to_string());
    out.extend(words.iter().cloned());
}

/// The words of a counted-argument group; every path of a group has the same number, as the
/// parser reads one count per group.
fn per_path_count<T>(paths: &[T], len: impl Fn(&T) -> usize) -> usize {
    let n = paths.first().map_or(0, &len);
    assert!(
        paths.iter().all(|p| len(p) == n),
        "paths of one group disagree on their argument count"
    );
    n
}

/// A multipath table line as dm-mpath prints it.
pub fn format_table(t: &Table) -> String {
    let mut w = Vec::new();
    counted(&mut w, &t.features);
    counted(&mut w, &t.hw_handler);
    w.push(t.groups.len().to_string());
    w.push(t.initial_group.to_string());
    for g in &t.groups {
        w.push(g.selector.clone());
        counted(&mut w, &g.selector_args);
        w.push(g.paths.len().to_string());
        w.push(per_path_count(&g.paths, |p| p.args.len()).to_string());
        for p in &g.paths {
            w.push(p.dev.to_string());
            w.extend(p.args.iter().cloned());
        }
    }
    w.join(" ")
}

/// A multipath status line as dm-mpath prints it.
pub fn format_status(s: &Status) -> String {
    let mut w = vec![
        "2".to_owned(),
        u32::from(s.queue_io).to_string(),
        s.pg_init_count.to_string(),
    ];
    counted(&mut w, &s.hw_handler);
    w.push(s.groups.len().to_string());
    w.push(s.current_group.to_string());
    for g in &s.groups {
        w.push(
            match g.state {
                GroupState::Active => "A",
                GroupState::Enabled => "E",
                GroupState::Disabled => "D",
            }
            .to_owned(),
        );
        counted(&mut w, &g.selector_status);
        w.push(g.paths.len().to_string());
        w.push(per_path_count(&g.paths, |p| p.selector_info.len()).to_string());
        for p in &g.paths {
            w.push(p.dev.to_string());
            w.push(if p.active { "A" } else { "F" }.to_owned());
            w.push(p.fail_count.to_string());
            w.extend(p.selector_info.iter().cloned());
        }
    }
    w.join(" ")
}

/// A kernel uevent datagram: `ACTION@DEVPATH\0KEY=VALUE\0…`.
pub fn format_uevent(ev: &Uevent) -> Vec<u8> {
    let mut out = format!("{}@{}", ev.action.as_str(), ev.devpath).into_bytes();
    out.push(0);
    for (k, v) in &ev.env {
        out.extend_from_slice(k.as_bytes());
        out.push(b'=');
        out.extend_from_slice(v.as_bytes());
        out.push(0);
    }
    out
}

/// Rewrites a `DM_TABLE_LOAD` payload (`next` relative to each spec) into the
/// `DM_TABLE_STATUS` layout (`next` relative to the first spec), as `retrieve_status` writes.
pub fn load_to_status_layout(mut buf: Vec<u8>, count: usize) -> Vec<u8> {
    const NEXT: usize = 20;
    let mut off = 0usize;
    for _ in 0..count {
        let rel = u32::from_ne_bytes(buf[off + NEXT..off + NEXT + 4].try_into().unwrap()) as usize;
        let abs = off + rel;
        buf[off + NEXT..off + NEXT + 4].copy_from_slice(&(abs as u32).to_ne_bytes());
        off = abs;
    }
    buf
}

/// A Discovery Log Page entry as nvmet writes it (`nvmet_format_discovery_entry`): the
/// numbers little-endian, the service id, address and TSAS padded with spaces, the NQN with
/// NULs.
pub fn format_discovery_entry(e: &lunkit::nvme::discovery::Entry) -> Vec<u8> {
    use lunkit::nvme::discovery::{AddressFamily, Subtype, TransportType};
    let mut b = vec![0u8; 1024];
    b[0] = match e.transport {
        TransportType::Rdma => 1,
        TransportType::FibreChannel => 2,
        TransportType::Tcp => 3,
        TransportType::Loop => 254,
        TransportType::Other(x) => x,
    };
    b[1] = match e.family {
        AddressFamily::Ipv4 => 1,
        AddressFamily::Ipv6 => 2,
        AddressFamily::InfiniBand => 3,
        AddressFamily::FibreChannel => 4,
        AddressFamily::IntraHost => 254,
        AddressFamily::Other(x) => x,
    };
    b[2] = match e.subtype {
        Subtype::Referral => 1,
        Subtype::Nvm => 2,
        Subtype::CurrentDiscovery => 3,
        Subtype::Other(x) => x,
    };
    b[3] = e.requirements;
    for (at, v) in [(4, e.port_id), (6, e.controller_id), (8, e.admin_queue_size), (10, e.flags)] {
        b[at..at + 2].copy_from_slice(&v.to_le_bytes());
    }
    let put = |b: &mut Vec<u8>, at: usize, len: usize, s: &str, pad: u8| {
        b[at..at + len].fill(pad);
        b[at..at + s.len()].copy_from_slice(s.as_bytes());
    };
    put(&mut b, 32, 32, &e.service_id, b' ');
    put(&mut b, 256, 256, &e.subsystem, 0);
    put(&mut b, 512, 256, &e.address, b' ');
    b[768..1024].fill(b' ');
    b[768] = e.tcp_security;
    b
}

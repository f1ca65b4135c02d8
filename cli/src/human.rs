//! The human form of `lunkit list`: an aligned tree per host and per multipath map.

use std::fmt::Write as _;

use lunkit::{MultipathMap, ScsiDevice, Topology, Transport};

/// Rows whose cells are padded to a common width per column.
#[derive(Default)]
struct Table {
    rows: Vec<Vec<String>>,
}

impl Table {
    fn row<I: IntoIterator<Item = S>, S: Into<String>>(&mut self, cells: I) {
        self.rows.push(cells.into_iter().map(Into::into).collect());
    }

    fn render(&self, out: &mut String) {
        let cols = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let width: Vec<usize> = (0..cols)
            .map(|c| {
                self.rows
                    .iter()
                    .filter_map(|r| r.get(c))
                    .map(|s| s.chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        for r in &self.rows {
            let mut line = String::new();
            for (c, cell) in r.iter().enumerate() {
                let _ = write!(line, "{cell:<w$}  ", w = width[c]);
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
    }
}

fn or_dash(v: Option<&str>) -> String {
    v.unwrap_or("-").to_owned()
}

fn branch(last: bool) -> &'static str {
    if last { "└─ " } else { "├─ " }
}

fn human_size(bytes: Option<u64>) -> String {
    let Some(b) = bytes else { return "-".into() };
    const UNITS: [&str; 6] = ["B", "K", "M", "G", "T", "P"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b}B")
    } else {
        format!("{v:.1}{}", UNITS[u])
    }
}

fn lun_row(
    t: &Topology,
    d: &ScsiDevice,
    prefix: &str,
    map_of: &dyn Fn(&str) -> Option<String>,
) -> Vec<String> {
    let size = d
        .block
        .as_deref()
        .and_then(|b| t.block(b))
        .and_then(|b| b.size_bytes);
    let mut row = vec![
        format!("{prefix}{}", d.hctl),
        or_dash(d.block.as_deref()),
        or_dash(d.state.as_deref()),
        human_size(size),
        format!(
            "{} {}",
            d.vendor.as_deref().unwrap_or("-"),
            d.model.as_deref().unwrap_or("-")
        ),
        or_dash(d.wwid.as_deref()),
    ];
    if let Some(m) = d.block.as_deref().and_then(map_of) {
        row.push(format!("in {m}"));
    }
    row
}

/// Renders the topology as text.
pub fn render(t: &Topology) -> String {
    let mut out = String::new();
    let maps: Vec<_> = t.multipath_maps().collect();
    let map_of = |block: &str| {
        maps.iter()
            .find(|m| m.paths.iter().any(|p| p == block))
            .map(|m| m.name.unwrap_or(m.dm).to_owned())
    };
    section(&mut out, "SCSI hosts", &scsi_hosts(t, &map_of));
    section(&mut out, "Multipath maps", &multipath_maps(t, &maps));
    section(&mut out, "Other device-mapper devices", &other_dm(t, &maps));
    section(&mut out, "Other block devices", &other_blocks(t));
    section(&mut out, "NVMe controllers", &nvme_controllers(t));
    section(&mut out, "NVMe namespaces", &nvme_namespaces(t));
    if out.is_empty() {
        out.push_str("no SCSI hosts, block devices or NVMe controllers found\n");
    }
    out
}

/// Appends `table` under `title`, a blank line before it unless it is the first; nothing
/// when the table has no row.
fn section(out: &mut String, title: &str, table: &Table) {
    if table.rows.is_empty() {
        return;
    }
    out.push_str(if out.is_empty() { "" } else { "\n" });
    out.push_str(title);
    out.push('\n');
    table.render(out);
}

/// A SCSI host's row: its transport, and its iSCSI session or FC port.
fn host_head(t: &Topology, h: &lunkit::ScsiHost) -> Vec<String> {
    let mut head = vec![
        format!("host{}", h.number),
        h.transport.to_string(),
        or_dash(h.proc_name.as_deref()),
    ];
    match h.transport {
        Transport::Iscsi => {
            if let Some(s) = t.iscsi_sessions.iter().find(|s| s.host == Some(h.number)) {
                head.push(format!("session{}", s.sid));
                head.push(or_dash(s.target.as_deref()));
                head.push(s.portal().unwrap_or_else(|| "-".into()));
                head.push(or_dash(s.state.as_deref()));
            }
        }
        Transport::Fc => {
            if let Some(f) = t.fc_hosts.iter().find(|f| f.host == h.number) {
                head.push(f.port_name.map_or("-".into(), |w| w.to_string()));
                head.push(or_dash(f.port_state.as_deref()));
            }
        }
        Transport::Other => {}
    }
    head
}

/// Each SCSI host with the FC remote ports and the LUNs below it, as a tree.
fn scsi_hosts(t: &Topology, map_of: &dyn Fn(&str) -> Option<String>) -> Table {
    let mut hosts = Table::default();
    for h in &t.scsi_hosts {
        hosts.row(host_head(t, h));
        // FC LUNs hang below the remote port that leads to their target; everything else
        // directly below the host.
        let rports: Vec<_> = t.fc_rports.iter().filter(|r| r.host == h.number).collect();
        let under_rport = |d: &ScsiDevice| {
            rports
                .iter()
                .any(|r| r.target == Some((d.hctl.host, d.hctl.channel, d.hctl.target)))
        };
        let direct: Vec<&ScsiDevice> = t
            .devices_on_host(h.number)
            .filter(|d| !under_rport(d))
            .collect();
        let total = rports.len() + direct.len();
        for (i, r) in rports.iter().enumerate() {
            let last = i + 1 == total;
            hosts.row([
                format!("{}{}", branch(last), r.name),
                r.port_name.map_or("-".into(), |w| w.to_string()),
                if r.roles.is_empty() {
                    "-".into()
                } else {
                    r.roles.join(",")
                },
                or_dash(r.port_state.as_deref()),
                r.target.map_or("no target".into(), |(h, c, t)| {
                    format!("target {h}:{c}:{t}")
                }),
            ]);
            let luns: Vec<&ScsiDevice> = t
                .devices_on_host(h.number)
                .filter(|d| r.target == Some((d.hctl.host, d.hctl.channel, d.hctl.target)))
                .collect();
            let indent = if last { "   " } else { "│  " };
            for (j, d) in luns.iter().enumerate() {
                hosts.row(lun_row(
                    t,
                    d,
                    &format!("{indent}{}", branch(j + 1 == luns.len())),
                    map_of,
                ));
            }
        }
        for (i, d) in direct.iter().enumerate() {
            hosts.row(lun_row(t, d, branch(rports.len() + i + 1 == total), map_of));
        }
    }
    hosts
}

/// Each multipath map and its paths below it.
fn multipath_maps(t: &Topology, maps: &[MultipathMap<'_>]) -> Table {
    let mut mp = Table::default();
    for m in maps {
        let size = t.block(m.dm).and_then(|b| b.size_bytes);
        mp.row([
            m.name.unwrap_or("-").to_owned(),
            m.dm.to_owned(),
            human_size(size),
            m.wwid.to_owned(),
        ]);
        for (i, p) in m.paths.iter().enumerate() {
            let dev = t
                .scsi_devices
                .iter()
                .find(|d| d.block.as_deref() == Some(p));
            let mut row = vec![
                format!("{}{p}", branch(i + 1 == m.paths.len())),
                dev.map_or("-".into(), |d| d.hctl.to_string()),
                or_dash(dev.and_then(|d| d.state.as_deref())),
            ];
            if let Some((_, w)) = m.foreign_paths.iter().find(|(f, _)| f == p) {
                row.push(format!("reports WWID {w}, not the map's"));
            }
            mp.row(row);
        }
    }
    mp
}

/// The device-mapper devices that are not multipath maps.
fn other_dm(t: &Topology, maps: &[MultipathMap<'_>]) -> Table {
    let others = t
        .dm_devices()
        .filter(|d| !maps.iter().any(|m| m.dm == d.dm));
    let mut dm = Table::default();
    for d in others {
        dm.row([
            d.name.unwrap_or("-").to_owned(),
            d.dm.to_owned(),
            or_dash(d.uuid),
            format!(
                "on {}",
                if d.slaves.is_empty() {
                    "-".into()
                } else {
                    d.slaves.join(",")
                }
            ),
        ]);
    }
    dm
}

/// The block devices of none of the tables above or below (no SCSI disk, map or NVMe
/// namespace), with a size.
fn other_blocks(t: &Topology) -> Table {
    let plain: Vec<_> = t
        .block_devices
        .iter()
        .filter(|b| b.dm.is_none() && b.size_bytes.unwrap_or(0) > 0)
        .filter(|b| {
            !t.scsi_devices
                .iter()
                .any(|d| d.block.as_deref() == Some(b.name.as_str()))
        })
        // NVMe heads and their hidden per-controller paths have their own table below.
        .filter(|b| {
            !t.nvme_namespaces
                .iter()
                .any(|n| n.name == b.name || n.paths.iter().any(|p| p.name == b.name))
        })
        .collect();
    let mut bt = Table::default();
    for b in plain {
        bt.row([
            b.name.clone(),
            b.dev.map_or("-".into(), |d| d.to_string()),
            human_size(b.size_bytes),
            if b.read_only == Some(true) {
                "ro".into()
            } else {
                "rw".into()
            },
            b.partitions.join(","),
        ]);
    }
    bt
}

/// Each NVMe controller: its transport, state, address, subsystem and namespaces.
fn nvme_controllers(t: &Topology) -> Table {
    let mut nv = Table::default();
    for n in &t.nvme_controllers {
        nv.row([
            n.name.clone(),
            or_dash(n.transport.as_deref()),
            or_dash(n.state.as_deref()),
            or_dash(n.address.as_deref()),
            or_dash(n.subsysnqn.as_deref()),
            n.namespaces.join(","),
        ]);
    }
    nv
}

/// Each NVMe namespace head, its subsystem and its paths' ANA states.
fn nvme_namespaces(t: &Topology) -> Table {
    let mut ns = Table::default();
    for n in &t.nvme_namespaces {
        let subsystem = t
            .nvme_subsystems
            .iter()
            .find(|s| s.namespaces.contains(&n.name))
            .and_then(|s| s.nqn.as_deref());
        let paths: Vec<String> = n
            .paths
            .iter()
            .map(|p| format!("{}:{}", p.controller, or_dash(p.ana_state.as_deref())))
            .collect();
        ns.row([
            n.name.clone(),
            n.nsid.map_or_else(|| "-".into(), |i| format!("nsid {i}")),
            human_size(n.size_bytes),
            or_dash(n.wwid.as_deref()),
            or_dash(subsystem),
            paths.join(","),
        ]);
    }
    ns
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_aligns_columns() {
        let mut t = Table::default();
        t.row(["a", "bb", "c"]);
        t.row(["aaa", "b"]);
        let mut s = String::new();
        t.render(&mut s);
        assert_eq!(s, "a    bb  c\naaa  b\n");
    }

    #[test]
    fn sizes_are_readable() {
        assert_eq!(human_size(Some(512)), "512B");
        assert_eq!(human_size(Some(1 << 30)), "1.0G");
        assert_eq!(human_size(Some(3 * (1 << 20) / 2)), "1.5M");
        assert_eq!(human_size(None), "-");
    }
}

//! The sentence the CLI prints for an error: the library's message, except where that one
//! leaves the user without the next step. Those few are said again here as one sentence that
//! names the object and says what to do (the library's own text, which CSI plugins log and
//! callers may match, is left as it is).
//!
//! Each rewrite recognises its message by the text the library puts in it; a change there
//! falls back to the library's message, never to a wrong one, and `cli/tests/conventions.rs`
//! runs each through the binary so such a change is seen.

use lunkit::Error;

/// The message for `e`, as `lunkit: …` on stderr and as `"error"` in a JSON report.
pub fn describe(e: &Error) -> String {
    match e {
        Error::NotFound { what } => not_found(what).unwrap_or_else(|| e.to_string()),
        Error::Step {
            step,
            target,
            source,
        } => format!("{step} {target}: {}", describe(source)),
        // The map wait's own cause, worded as it would be on its own.
        Error::MapWait { source, .. } => describe(source),
        _ => e.to_string(),
    }
}

/// A better sentence for `NotFound { what }`, when there is one.
fn not_found(what: &str) -> Option<String> {
    if let Some(rest) = what.strip_prefix("logged-in iSCSI session to ") {
        // `{target}` or `{target} through {portal}, {portal}`.
        let (target, portals) = match rest.split_once(" through ") {
            Some((t, p)) => (t, Some(p)),
            None => (rest, None),
        };
        let portal = portals
            .and_then(|p| p.split(", ").next())
            .unwrap_or("PORTAL");
        let via = portals.map_or(String::new(), |p| format!(" through {p}"));
        return Some(format!(
            "no iSCSI session to {target}{via} is logged in: log in with \
             `iscsiadm -m node -T {target} -p {portal} --login` (after \
             `iscsiadm -m discovery -t sendtargets -p {portal}` if the node is not known yet)"
        ));
    }
    // `flush` and `delete` (teardown.rs) say this one.
    if let Some(device) = what
        .strip_prefix("block device ")
        .filter(|d| !d.starts_with("of "))
    {
        return Some(format!(
            "no block device {device} on this node: give a /dev path, a kernel name (sdc, \
             dm-0) or an H:C:T:L, as `lunkit list` shows them"
        ));
    }
    if let Some(ports) = what.strip_prefix("FC target port ") {
        return Some(format!(
            "no FC remote port {ports} is on this node: check the target's zoning and LUN \
             masking, and `lunkit list` for the ports the node sees"
        ));
    }
    if let Some(nqn) = what.strip_prefix("live NVMe controller of subsystem ") {
        return Some(format!(
            "no NVMe controller of subsystem {nqn} is live: connect one with \
             `lunkit nvme connect --traddr ADDR --nvme-nqn {nqn}` or `lunkit attach`"
        ));
    }
    if let Some(rest) = what.strip_prefix("host NQN: none was given and ") {
        let file = rest.split_once(" does not exist")?.0;
        return Some(format!(
            "this host has no NVMe host NQN: {file} does not exist, so write one there \
             (`nvme gen-hostnqn > {file}`) or pass --hostnqn"
        ));
    }
    if let Some(device) = what.strip_suffix(" (is the nvme-fabrics module loaded, with nvme-tcp?)")
    {
        return Some(format!(
            "{device} does not exist: load the NVMe/TCP modules with `modprobe nvme-tcp` \
             (it brings nvme-fabrics) and run this again"
        ));
    }
    if let Some(disks) = what.strip_prefix("WWID of ").and_then(|r| {
        r.strip_suffix(" (a multipath map is keyed by it; the LUN has no VPD page 0x83)")
    }) {
        return Some(format!(
            "{disks} report no WWID (the LUN has no VPD page 0x83), and multipath keys its \
             maps by it: attach without --wait-map, or give the LUN a device identifier on \
             the target"
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nf(what: &str) -> String {
        describe(&Error::NotFound { what: what.into() })
    }

    #[test]
    fn a_missing_iscsi_session_says_how_to_log_in() {
        let m = nf("logged-in iSCSI session to iqn.2003-01.org.a:t");
        assert!(
            m.contains("iscsiadm -m node -T iqn.2003-01.org.a:t -p PORTAL --login"),
            "{m}"
        );
        let m =
            nf("logged-in iSCSI session to iqn.2003-01.org.a:t through 10.0.0.1:3260, [::1]:3260");
        assert!(
            m.contains("no iSCSI session to iqn.2003-01.org.a:t through 10.0.0.1:3260, [::1]:3260 is logged in"),
            "{m}"
        );
        assert!(m.contains("-p 10.0.0.1:3260 --login"), "{m}");
        assert!(!m.ends_with("not found"), "{m}");
    }

    #[test]
    fn a_missing_host_nqn_names_the_file_and_both_ways_out() {
        let m = nf(
            "host NQN: none was given and /r/etc/nvme/hostnqn does not exist (write one \
             there, e.g. with `nvme gen-hostnqn`, or pass it)",
        );
        assert_eq!(
            m,
            "this host has no NVMe host NQN: /r/etc/nvme/hostnqn does not exist, so write one \
             there (`nvme gen-hostnqn > /r/etc/nvme/hostnqn`) or pass --hostnqn"
        );
    }

    #[test]
    fn a_missing_fc_port_or_nvme_controller_says_where_to_look() {
        let m = nf("FC target port 0x5001438002a3c4d6");
        assert!(
            m.starts_with(
                "no FC remote port 0x5001438002a3c4d6 is on this node: check the target's zoning"
            ),
            "{m}"
        );
        let m = nf("live NVMe controller of subsystem nqn.2014-08.org.a:b");
        assert!(
            m.contains("lunkit nvme connect --traddr ADDR --nvme-nqn nqn.2014-08.org.a:b"),
            "{m}"
        );
        let m =
            nf("WWID of sdc, sdd (a multipath map is keyed by it; the LUN has no VPD page 0x83)");
        assert!(m.starts_with("sdc, sdd report no WWID"), "{m}");
        assert!(m.contains("without --wait-map"), "{m}");
    }

    #[test]
    fn a_missing_block_device_says_how_to_name_one() {
        let m = nf("block device sdzz");
        assert!(
            m.starts_with("no block device sdzz on this node: give"),
            "{m}"
        );
        let m = nf("block device of 7:0:0:1 to appear and open");
        assert_eq!(m, "block device of 7:0:0:1 to appear and open not found");
    }

    #[test]
    fn other_messages_and_steps_keep_the_librarys_text() {
        assert_eq!(nf("multipath map mpatha"), "multipath map mpatha not found");
        let step = Error::Step {
            step: "flush-path",
            target: "7:0:0:1 (sdc)".into(),
            source: Box::new(Error::NotFound {
                what: "/dev/nvme-fabrics (is the nvme-fabrics module loaded, with nvme-tcp?)"
                    .into(),
            }),
        };
        let m = describe(&step);
        assert!(
            m.starts_with("flush-path 7:0:0:1 (sdc): /dev/nvme-fabrics does not exist"),
            "{m}"
        );
    }
}

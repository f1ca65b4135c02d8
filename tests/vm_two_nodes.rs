//! VM test: two nodes. This binary is in xtask's `TWO_NODES`: its tests run in guest A with
//! guest B booted beside it, the two on a link of their own (A 10.231.0.1, B 10.231.0.2),
//! each with its own initiator name; B runs the agent that `support::node_b` talks to. See
//! tests/vm/README.md, "Two nodes".
//!
//! Run by `cargo xtask test` inside the QEMU guest (ignored on the host).

// The fixtures build the lab with the real tools.
#![allow(clippy::disallowed_methods)]

use lunkit_lab as support;

use std::os::unix::fs::FileExt;
use std::time::Duration;

use support::lio::{LioConfig, LioTarget};
use support::node_b::{self, A_ADDR, B_INITIATOR, NodeB};
use support::{require_vm, sysfs, wait};

const IQN: &str = "iqn.2003-01.org.linux-iscsi.lunkit:two-nodes";
/// The block B writes and A reads back, in 4 KiB blocks.
const BLOCK: u64 = 5;

fn portal() -> String {
    format!("{A_ADDR}:3260")
}

/// What B's commands leave while logged in; dropping it logs B out and stops its iscsid
/// (best effort: the test's own logout is what it asserts).
struct Login<'a> {
    b: &'a NodeB,
}

impl Login<'_> {
    fn logout_command() -> String {
        let p = portal();
        format!(
            "iscsiadm -m node -T {IQN} -p {p} --logout; iscsiadm -m node -T {IQN} -p {p} -o delete; \
             iscsiadm -m discoverydb -t st -p {p} -o delete; iscsiadm -k 0; \
             while pidof iscsid >/dev/null; do sleep 0.1; done"
        )
    }
}

impl Drop for Login<'_> {
    fn drop(&mut self) {
        let _ = self.b.run(&Self::logout_command());
    }
}

/// The WWID an initiator reads for backstore `lun0` of A's target: LIO's NAA from its unit
/// serial, read from A's configfs.
fn exported_wwid() -> String {
    let text = sysfs::attr("/sys/kernel/config/target/core/fileio_0/lun0/wwn/vpd_unit_serial")
        .expect("A's backstore has a unit serial");
    let serial = text.rsplit(':').next().unwrap_or_default().trim();
    format!("naa.6001405{serial:0<25}")
}

/// B's disk whose WWID is `wwid`, if B sees one.
fn disk_on_b(b: &NodeB, wwid: &str) -> Option<String> {
    let out = b
        .ok("for d in /sys/block/sd*; do [ -e $d/device/wwid ] && echo ${d##*/} $(cat $d/device/wwid); done; true")
        .expect("node B lists its disks");
    out.lines()
        .filter_map(|l| l.split_once(' '))
        .find(|(_, w)| w.trim() == wwid)
        .map(|(d, _)| d.to_owned())
}

#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn node_b_logs_in_to_node_a_target_and_its_direct_write_lands_on_a_backstore() {
    require_vm();
    let b = node_b::node_b();
    let t0 = std::time::Instant::now();
    b.wait_until_up(Duration::from_secs(300)).unwrap();
    println!(
        "node B's agent answered {:.1} s after this test started",
        t0.elapsed().as_secs_f64()
    );
    assert_eq!(
        b.ok("cat /etc/iscsi/initiatorname.iscsi").unwrap().trim(),
        format!("InitiatorName={B_INITIATOR}"),
        "node B has its own initiator name"
    );
    let target = LioTarget::create(LioConfig {
        iqn: IQN.into(),
        luns: 1,
        lun_size: 8 << 20,
        portals: vec![portal()],
    })
    .unwrap();
    let wwid = exported_wwid();

    let login = Login { b: &b };
    let p = portal();
    b.ok(&format!(
        "modprobe iscsi_tcp && iscsid && iscsiadm -m discovery -t st -p {p} && \
         iscsiadm -m node -T {IQN} -p {p} --login"
    ))
    .unwrap();
    // LIO names the initiator of each session of the TPG (demo mode: generated ACLs).
    let sessions = std::fs::read_to_string(format!(
        "/sys/kernel/config/target/iscsi/{IQN}/tpgt_1/dynamic_sessions"
    ))
    .unwrap();
    assert!(
        sessions.contains(B_INITIATOR),
        "A's target sees B's initiator: {sessions:?}"
    );

    let disk = wait::until("node B's disk of A's LUN", Duration::from_secs(120), || {
        Ok(disk_on_b(&b, &wwid))
    })
    .unwrap();
    let pattern: Vec<u8> = b"lunkit node B wrote this\n"
        .iter()
        .copied()
        .cycle()
        .take(4096)
        .collect();
    b.ok(&format!(
        "yes 'lunkit node B wrote this' | head -c 4096 | \
         dd of=/dev/{disk} bs=4096 seek={BLOCK} count=1 oflag=direct iflag=fullblock status=none"
    ))
    .unwrap();
    let image = std::fs::File::open("/tmp/lunkit-lio/lun0.img").unwrap();
    let mut got = vec![0; 4096];
    image.read_exact_at(&mut got, BLOCK * 4096).unwrap();
    assert!(
        got == pattern,
        "A's backstore holds B's block: {:?}",
        String::from_utf8_lossy(&got[..64])
    );

    b.ok(&Login::logout_command()).unwrap();
    std::mem::forget(login);
    assert_eq!(disk_on_b(&b, &wwid), None, "B's disk went with its session");
    b.check_clean().unwrap();
    target.teardown().unwrap();
}

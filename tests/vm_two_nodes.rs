//! VM test: two nodes. This binary is in xtask's `TWO_NODES`: its tests run in guest A with
//! guest B booted beside it, the two on a link of their own (A 10.231.0.1, B 10.231.0.2),
//! each with its own initiator name; B runs the agent that `support::node_b` talks to. See
//! tests/vm/README.md, "Two nodes".
//!
//! The fencing test (issue 56): A stages a `fencing: scsi-pr` volume over its two paths and
//! writes to it; B stages the same volume as after a force-detach (its plugin preempts A);
//! from then on A's writes fail, and none of them lands. B drives its own plugin through
//! the agent by running this binary's `node_b_step` there.
//!
//! Run by `cargo xtask test` inside the QEMU guest (ignored on the host).

// The fixtures build the lab with the real tools.
#![allow(clippy::disallowed_methods)]

use lunkit_lab as support;

mod csi_plugin;

use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use csi_plugin::{Plugin, Ready};
use lunkit::Root;
use lunkit::pr::Key;
use lunkit_csi::proto::volume_capability::{
    AccessMode, AccessType, BlockVolume, access_mode::Mode,
};
use lunkit_csi::proto::*;
use lunkit_csi::{Client, Code};
use support::cli::{describe, lunkit};
use support::iscsi;
use support::lio::{LioConfig, LioTarget};
use support::multipath::{self, Multipathd};
use support::node_b::{self, A_ADDR, A_INITIATOR, B_INITIATOR, NodeB};
use support::{cmd, require_vm, sysfs, wait};

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

const FENCE_IQN: &str = "iqn.2003-01.org.linux-iscsi.lunkit:two-nodes-fence";
const VOLUME: &str = "pv-fence2";
const A_BASE: &str = "/tmp/lunkit-fence2-a";
/// B's plugin's base (B's own /tmp), and the machine-id B's plugin reads there.
const B_BASE: &str = "/tmp/lunkit-fence2-b";
/// The guests share the host's root, so their `/etc/machine-id` is the same and so would
/// their keys be: B's plugin runs in a mount namespace with this one over it.
const B_MACHINE_ID: &str = "0b0b0b0b56565656feedfacecafe0b0b";
/// A's two paths; B logs in through A's link address.
const A_PORTALS: [&str; 2] = ["127.0.0.1:3260", "127.0.0.2:3260"];
const STEP_ENV: &str = "LUNKIT_NODE_B_STEP";
const PREEMPT_ENV: &str = "LUNKIT_NODE_B_PREEMPT";
/// The line `node_b_step` prints its outcome on: `ok`, or the status code and message.
const RESULT: &str = "node-b-step: ";
/// A's writer cycles over blocks 0..A_BLOCKS (4 KiB); B writes block B_BLOCK.
const A_BLOCKS: u64 = 16;
const B_BLOCK: u64 = 64;
/// The LIO fixture's backstore of LUN 0.
const IMAGE: &str = "/tmp/lunkit-lio/lun0.img";
const LIO_PR: &str = "/sys/kernel/config/target/core/fileio_0/lun0/pr";
const APTPL_DIRS: [&str; 2] = ["/etc/target/pr", "/var/target/pr"];

fn fence_stage_req(base: &str, portal: &str, more: &[(&str, &str)]) -> NodeStageVolumeRequest {
    let staging = format!("{base}/staging/{VOLUME}");
    fs::create_dir_all(&staging).unwrap();
    let attrs: HashMap<String, String> = [
        ("targetPortal", portal),
        ("iqn", FENCE_IQN),
        ("lun", "0"),
        ("fencing", "scsi-pr"),
    ]
    .iter()
    .chain(more)
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect();
    NodeStageVolumeRequest {
        volume_id: VOLUME.into(),
        staging_target_path: staging,
        volume_capability: Some(VolumeCapability {
            access_type: Some(AccessType::Block(BlockVolume {})),
            access_mode: Some(AccessMode {
                mode: Mode::SingleNodeWriter as i32,
            }),
        }),
        volume_context: attrs,
        ..Default::default()
    }
}

fn unstage_req(base: &str) -> NodeUnstageVolumeRequest {
    NodeUnstageVolumeRequest {
        volume_id: VOLUME.into(),
        staging_target_path: format!("{base}/staging/{VOLUME}"),
    }
}

/// Node B's side of the fencing test: B's plugin (its state under [`B_BASE`]) started, one
/// stage or unstage through it, the plugin stopped (the record persists for the next step).
/// Run on B by [`b_step`]; anywhere else (the runner lists it with the VM tests) it returns
/// at once.
#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn node_b_step() {
    let Ok(step) = std::env::var(STEP_ENV) else {
        return;
    };
    let mut bin = Plugin::binary();
    bin.args(["--root", "/"]);
    let limit = Duration::from_secs(120);
    let plugin = Plugin::start(bin, B_BASE, &[], Ready::Probe, limit);
    let mut c = plugin.client();
    let preempt = std::env::var(PREEMPT_ENV).unwrap_or_default();
    let done = match step.as_str() {
        "stage" => {
            let portal = format!("{A_ADDR}:3260");
            let req = fence_stage_req(B_BASE, &portal, &[("fencingPreempt", &preempt)]);
            c.node_stage_volume(req).map(drop)
        }
        "unstage" => c.node_unstage_volume(unstage_req(B_BASE)).map(drop),
        other => panic!("{STEP_ENV}={other}: stage or unstage"),
    };
    eprintln!("node B's plugin:\n{}", plugin.log());
    match done {
        Ok(()) => println!("{RESULT}ok"),
        Err(s) => println!(
            "{RESULT}{:?}: {}",
            s.code(),
            s.message().replace('\n', " | ")
        ),
    }
}

/// Runs [`node_b_step`] on B (this same binary, through the shared root) with B's own
/// machine-id; returns its outcome line.
fn b_step(b: &NodeB, step: &str, preempt: &str) -> String {
    let exe = std::env::current_exe().unwrap();
    let bin = std::env::var("LUNKIT_CSI_BIN").expect("LUNKIT_CSI_BIN");
    let cmd = format!(
        "(pidof iscsid >/dev/null || (modprobe iscsi_tcp && iscsid)) && \
         mkdir -p {B_BASE} && echo {B_MACHINE_ID} > {B_BASE}/machine-id && \
         unshare -m sh -c 'mount --bind {B_BASE}/machine-id /etc/machine-id && \
         exec env {STEP_ENV}={step} {PREEMPT_ENV}={preempt} LUNKIT_CSI_BIN={bin} \
         {exe} --exact node_b_step --ignored --nocapture --test-threads 1'",
        exe = exe.display()
    );
    let out = b.run_within(&cmd, Duration::from_secs(400)).unwrap();
    eprintln!("node B's {step}: {}", out.stderr);
    assert!(out.success(), "node B's {step}: {}", out.describe());
    // libtest's `test node_b_step ... ` comes first on the line.
    let line = out
        .stdout
        .lines()
        .find_map(|l| Some(l.split_once(RESULT)?.1));
    line.unwrap_or_else(|| panic!("node B's {step} said nothing: {}", out.describe()))
        .to_owned()
}

/// B's sessions and stage records, one line each (empty: nothing of B's).
fn b_leftovers(b: &NodeB) -> String {
    b.ok(&format!(
        "ls /sys/class/iscsi_session {B_BASE}/state/volumes 2>/dev/null; true"
    ))
    .unwrap()
    .lines()
    .filter(|l| !l.is_empty() && !l.ends_with(':'))
    .collect::<Vec<_>>()
    .join(" ")
}

/// Takes out what B's steps leave once nothing is staged (iscsid and its records, B's base)
/// when dropped: at the end, or after a failure.
struct BSide<'a>(&'a NodeB);

impl Drop for BSide<'_> {
    fn drop(&mut self) {
        let _ = self.0.run(&format!(
            "iscsiadm -m node --logoutall=all; iscsiadm -m node -o delete; \
         iscsiadm -m discoverydb -t st -p {A_ADDR}:3260 -o delete; iscsiadm -k 0; \
         while pidof iscsid >/dev/null; do sleep 0.1; done; rm -rf {B_BASE}"
        ));
    }
}

/// A's side: the target (A's two portals and B's), iscsid, multipathd, A's plugin.
struct FenceLab {
    plugin: Option<Plugin>,
    multipathd: Option<Multipathd>,
    started_iscsid: bool,
    target: Option<LioTarget>,
}

impl FenceLab {
    fn build() -> FenceLab {
        let _ = fs::remove_dir_all(A_BASE);
        fs::create_dir_all(A_BASE).unwrap();
        for d in APTPL_DIRS {
            fs::create_dir_all(d).unwrap();
        }
        let mut portals: Vec<String> = A_PORTALS.iter().map(|p| (*p).to_owned()).collect();
        portals.push(format!("{A_ADDR}:3260"));
        let target = LioTarget::create(LioConfig {
            iqn: FENCE_IQN.into(),
            luns: 1,
            lun_size: 8 << 20,
            portals,
        })
        .expect("the LIO target");
        let mut lab = FenceLab {
            plugin: None,
            multipathd: None,
            started_iscsid: iscsi::ensure_iscsid().expect("iscsid"),
            target: Some(target),
        };
        lab.multipathd = Some(Multipathd::start(multipath::DEFAULT_CONF).expect("multipathd"));
        let mut bin = Plugin::binary();
        bin.args(["--root", "/"]);
        let limit = Duration::from_secs(120);
        lab.plugin = Some(Plugin::start(bin, A_BASE, &[], Ready::Probe, limit));
        lab
    }

    fn plugin(&self) -> &Plugin {
        self.plugin.as_ref().expect("the plugin runs")
    }
}

impl Drop for FenceLab {
    fn drop(&mut self) {
        drop(self.plugin.take());
        if !multipath::maps().is_empty() {
            cmd::run_ignoring_failure("multipath", &["-F"]);
        }
        if let Some(m) = self.multipathd.take() {
            let _ = m.stop();
        }
        iscsi::logout_all();
        if self.started_iscsid {
            let _ = iscsi::stop_iscsid();
        }
        if let Some(t) = self.target.take() {
            let _ = t.teardown();
        }
        let _ = fs::remove_dir_all(A_BASE);
    }
}

/// LIO's registered keys (one per I_T nexus) and its reservation holder line.
fn lio_pr() -> (Vec<u64>, String) {
    let keys = sysfs::attr(format!("{LIO_PR}/res_pr_registered_i_pts"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split("Key: 0x").nth(1)?.split_whitespace().next())
        .map(|h| u64::from_str_radix(h, 16).unwrap())
        .collect();
    (
        keys,
        sysfs::attr(format!("{LIO_PR}/res_holder")).unwrap_or_default(),
    )
}

/// One write of A's writer: its sequence number, when it started, how long it took, and
/// its error if it failed.
struct Write {
    seq: u64,
    start: Instant,
    took: Duration,
    err: Option<String>,
}

fn a_block(seq: u64) -> Vec<u8> {
    format!("A {seq:020}\n")
        .bytes()
        .cycle()
        .take(4096)
        .collect()
}

/// A's sequence number in a 4 KiB block of the backstore, if A wrote it.
fn a_seq(block: &[u8]) -> Option<u64> {
    let head = std::str::from_utf8(block.get(..22)?).ok()?;
    head.strip_prefix("A ")?.trim_end().parse().ok()
}

/// Writes sequence numbers with O_DIRECT to `dev` (block `seq % A_BLOCKS`), recording each
/// write, until `stop`; paced, so that a failing loop does not take the guest's one CPU.
fn writer(dev: String, log: Arc<Mutex<Vec<Write>>>, stop: Arc<AtomicBool>) {
    let f = fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(&dev)
        .unwrap();
    let mut buf = vec![0u8; 8192];
    let off = buf.as_ptr().align_offset(4096);
    for seq in 1.. {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        buf[off..off + 4096].copy_from_slice(&a_block(seq));
        let start = Instant::now();
        let r = f.write_at(&buf[off..off + 4096], (seq % A_BLOCKS) * 4096);
        let err = r.err().map(|e| e.to_string());
        let took = start.elapsed();
        log.lock().unwrap().push(Write {
            seq,
            start,
            took,
            err,
        });
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A writes to its map (`dev`) while B stages as after a force-detach: A preempted, only
/// B's key left, B holding. Returns A's writes, once some started after B's stage returned,
/// and when it returned; A's map must not hang, nor its writer when stopped.
fn writes_across_b_stage(b: &NodeB, dev: String, b_key: Key) -> (Vec<Write>, Instant) {
    let log = Arc::new(Mutex::new(Vec::<Write>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let w = {
        let (log, stop) = (log.clone(), stop.clone());
        std::thread::spawn(move || writer(dev, log, stop))
    };
    let count = |f: &dyn Fn(&Write) -> bool| log.lock().unwrap().iter().filter(|w| f(w)).count();
    wait::until_true("A's first writes", Duration::from_secs(60), || {
        count(&|w| w.err.is_none()) >= 3
    })
    .unwrap();
    assert_eq!(b_step(b, "stage", "always"), "ok");
    let staged_on_b = Instant::now();
    let (keys, holder) = lio_pr();
    assert_eq!(keys, [b_key.get()], "only B's key");
    assert!(holder.contains(B_INITIATOR), "{holder}");
    wait::until_true(
        "A's writes after B's stage to return",
        Duration::from_secs(120),
        || count(&|w| w.start >= staged_on_b) >= 5,
    )
    .unwrap();
    stop.store(true, Ordering::Relaxed);
    wait::until_true("A's writer to finish", Duration::from_secs(60), || {
        w.is_finished()
    })
    .unwrap();
    w.join().unwrap();
    let log = std::mem::take(&mut *log.lock().unwrap());
    (log, staged_on_b)
}

/// None of A's writes that started after B's stage returned succeeded, and the backstore
/// holds none later than A's last success.
fn assert_none_landed_after(log: &[Write], staged_on_b: Instant) {
    let late: Vec<u64> = log
        .iter()
        .filter(|w| w.start >= staged_on_b && w.err.is_none())
        .map(|w| w.seq)
        .collect();
    assert_eq!(
        late,
        Vec::<u64>::new(),
        "A's writes that succeeded after B's stage"
    );
    let last_ok = log.iter().filter(|w| w.err.is_none()).map(|w| w.seq).max();
    let failed: Vec<&Write> = log.iter().filter(|w| w.start >= staged_on_b).collect();
    println!(
        "A: {} writes, last success seq {last_ok:?}; after B's stage {} failed ({:?}), the slowest in {:?}",
        log.len(),
        failed.len(),
        failed[0].err,
        failed.iter().map(|w| w.took).max()
    );
    let image = fs::File::open(IMAGE).unwrap();
    let mut block = vec![0; 4096];
    let landed = (0..A_BLOCKS)
        .filter_map(|i| {
            image.read_exact_at(&mut block, i * 4096).unwrap();
            a_seq(&block)
        })
        .max();
    assert_eq!(landed, last_ok, "the latest of A's writes in the backstore");
}

/// `lunkit pr show` on `map` lists `key` on each of its paths and `key` holding it (Write
/// Exclusive, Registrants Only), `--json` alike; returns the generation the paths read.
fn assert_shown_on_map(map: &multipath::Map, key: Key) -> u64 {
    let mapper = format!("/dev/mapper/{}", map.name);
    let key = key.to_string();
    let out = lunkit(&["pr", "show", &mapper]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    let want = format!("keys {key} {key}, reserved by {key} (write-exclusive-registrants-only)");
    for p in &map.paths {
        let line = text
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{p} ")));
        assert!(line.is_some_and(|l| l.contains(&want)), "{p}: {text}");
    }
    let out = lunkit(&["pr", "show", &mapper, "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let paths = doc["paths"].as_array().expect("paths[]");
    let mut names: Vec<&str> = paths.iter().filter_map(|p| p["path"].as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, map.paths, "{doc}");
    for p in paths {
        assert_eq!(p["keys"], serde_json::json!([key, key]), "{doc}");
        assert_eq!(p["reservation"]["key"], key.as_str(), "{doc}");
        let kind = &p["reservation"]["type"];
        assert_eq!(kind, "write-exclusive-registrants-only", "{doc}");
    }
    paths[0]["generation"].as_u64().expect("a generation")
}

/// A path that joins A's staged volume later (a session to a third portal, made by hand):
/// the plugin registers A's key on it as it comes, so LIO lists a third registration of
/// the key; then the session goes again and the map is back to its two paths (the third
/// registration stays on the array until another node's preemption removes every one of
/// A's).
fn path_joins_registered(a_key: Key) {
    let third = format!("{A_ADDR}:3260");
    cmd::run(
        "iscsiadm",
        &["-m", "node", "-o", "new", "-T", FENCE_IQN, "-p", &third],
    )
    .unwrap();
    let session = iscsi::login(FENCE_IQN, &third).expect("a session to a third portal");
    let disk = iscsi::scan_lun(&session, 0).expect("LUN 0 through the third portal");
    wait::until_true("A's key on the third path", Duration::from_secs(60), || {
        lio_pr().0.len() == 3
    })
    .unwrap_or_else(|e| panic!("{e}: {disk} joined unregistered: {:?}", lio_pr()));
    assert_eq!(lio_pr().0, [a_key.get(); 3], "A's key on all three paths");
    let sid = session.sid.to_string();
    cmd::run("iscsiadm", &["-m", "session", "-r", &sid, "--logout"]).unwrap();
    cmd::run(
        "iscsiadm",
        &["-m", "node", "-o", "delete", "-T", FENCE_IQN, "-p", &third],
    )
    .unwrap();
    wait::until_true("A's map back to two paths", Duration::from_secs(60), || {
        multipath::maps()
            .first()
            .is_some_and(|m| m.paths.len() == 2)
    })
    .unwrap_or_else(|e| panic!("{e}: {:?}", multipath::maps()));
}

#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn a_fenced_volume_staged_on_b_preempts_a_whose_writes_fail_and_never_land() {
    require_vm();
    let b = node_b::node_b();
    b.wait_until_up(Duration::from_secs(300)).unwrap();
    let ids = [
        fs::read_to_string("/etc/machine-id").unwrap(),
        b.ok("cat /etc/machine-id").unwrap(),
    ];
    println!(
        "A's and B's /etc/machine-id are the same: {}",
        ids[0] == ids[1]
    );
    let lab = FenceLab::build();
    let b_side = BSide(&b);
    let a_key = Key::for_node(&Root::default()).expect("A's key");
    let b_key = Key::from_identity(B_MACHINE_ID);
    let mut c: Client = lab.plugin().client();
    let a_stage = fence_stage_req(A_BASE, A_PORTALS[0], &[("portals", "[\"127.0.0.2:3260\"]")]);
    c.node_stage_volume(a_stage.clone()).expect("A's stage");
    let maps = multipath::maps();
    assert!(
        maps.len() == 1 && maps[0].paths.len() == 2,
        "A's map: {maps:?}"
    );
    let (keys, holder) = lio_pr();
    assert_eq!(keys, [a_key.get(); 2], "A's key on both paths");
    assert!(holder.contains(A_INITIATOR), "{holder}");
    let generation = assert_shown_on_map(&maps[0], a_key);
    // A stage again finds it held: no request sent (the generation is the same).
    c.node_stage_volume(a_stage.clone())
        .expect("A's stage again");
    assert_eq!(
        assert_shown_on_map(&maps[0], a_key),
        generation,
        "nothing sent again"
    );
    // Every path of the map carries A's key (a REGISTER probe per path: after the
    // generation check, which it moves).
    let mapper = format!("/dev/mapper/{}", maps[0].name);
    let node = lunkit::block::resolve(&Root::default(), &mapper)
        .unwrap()
        .unwrap();
    let soon = Instant::now() + Duration::from_secs(30);
    let missing = lunkit::pr::unregistered_paths(&Root::default(), &node, a_key, soon).unwrap();
    assert!(missing.is_empty(), "{missing:?}");
    // Held on A by a bind mount of the map's node (kubelet's raw-block publish left behind):
    // A's unstage is refused before anything is released, its key and reservation stay.
    let generation = assert_shown_on_map(&maps[0], a_key);
    let held = "/tmp/lunkit-fence-held";
    fs::write(held, b"").unwrap();
    cmd::run("mount", &["--bind", &mapper, held]).unwrap();
    let refused = c.node_unstage_volume(unstage_req(A_BASE));
    cmd::run("umount", &[held]).unwrap();
    let e = refused.expect_err("A's unstage while its map is bind-mounted");
    assert_eq!(e.code(), Code::FailedPrecondition, "{}", e.message());
    assert!(
        e.message().contains(held),
        "names the mount: {}",
        e.message()
    );
    assert_eq!(
        assert_shown_on_map(&maps[0], a_key),
        generation,
        "nothing released or unregistered"
    );

    path_joins_registered(a_key);

    let dev = format!("/dev/mapper/{}", maps[0].name);
    let (log, staged_on_b) = writes_across_b_stage(&b, dev, b_key);
    assert_none_landed_after(&log, staged_on_b);

    // B's own write lands.
    let image = fs::File::open(IMAGE).unwrap();
    let mut block = vec![0; 4096];
    let disk = disk_on_b(&b, &exported_wwid()).expect("B's disk of the volume");
    b.ok(&format!(
        "yes 'lunkit node B wrote this' | head -c 4096 | \
         dd of=/dev/{disk} bs=4096 seek={B_BLOCK} count=1 oflag=direct iflag=fullblock status=none"
    ))
    .unwrap();
    image.read_exact_at(&mut block, B_BLOCK * 4096).unwrap();
    assert!(
        block.starts_with(b"lunkit node B wrote this\n"),
        "B's block"
    );

    // B unstages: nothing registered, nothing held; A's unstage ends clean.
    assert_eq!(b_step(&b, "unstage", ""), "ok");
    let (keys, holder) = lio_pr();
    assert_eq!(keys, Vec::<u64>::new(), "registrations left");
    assert!(holder.contains("No SPC-3 Reservation holder"), "{holder}");
    c.node_unstage_volume(unstage_req(A_BASE))
        .expect("A's unstage");
    assert_eq!(multipath::maps(), Vec::new(), "A's map left");
    let note = "preempted by another node?";
    assert!(lab.plugin().log().contains(note), "{}", lab.plugin().log());

    // fencingPreempt: never: A holds again; B's stage is refused naming A's key.
    c.node_stage_volume(a_stage).expect("A's stage again");
    let refused = b_step(&b, "stage", "never");
    assert!(refused.starts_with("FailedPrecondition: "), "{refused}");
    assert!(refused.contains(&a_key.to_string()), "{refused}");
    assert!(refused.contains("fencingPreempt is never"), "{refused}");
    assert_eq!(b_leftovers(&b), "", "B's sessions and records");
    assert_eq!(lio_pr().0, [a_key.get(); 2], "only A's key");
    let logged = lab.plugin().log().len();
    c.node_unstage_volume(unstage_req(A_BASE))
        .expect("A's unstage");
    assert_eq!(lio_pr().0, Vec::<u64>::new(), "registrations left");
    // Released inside the detach, after its one in-use check: one walk, not two.
    let log = lab.plugin().log();
    let lines = |step: &str| log[logged..].lines().filter(|l| l.contains(step)).count();
    assert_eq!(
        (lines("check-in-use"), lines("before-removal")),
        (1, 1),
        "{}",
        &log[logged..]
    );
    drop(b_side);
    b.check_clean().unwrap();
    drop(c);
    drop(lab);
}

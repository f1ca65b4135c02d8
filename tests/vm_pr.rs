//! VM test: SCSI-3 persistent reservations on LIO through `lunkit::pr` and `lunkit pr`, with
//! two initiators in one guest: two open-iscsi interfaces, each with its own
//! `iface.initiatorname`, log in to one LIO LUN, so LIO sees two I_T nexuses, A and B, as it
//! would see two nodes. `sg_persist` (sg3-utils) reads every step back as a peer.
//!
//! Run by `cargo xtask test` inside the QEMU guest (ignored on the host).

// The fixtures build the lab with iscsiadm; sg_persist is the peer the results are checked
// against.
#![allow(clippy::disallowed_methods)]

use lunkit_lab as support;

use std::fs::OpenOptions;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::time::{Duration, Instant};

use lunkit::block::{self, BlockNode};
use lunkit::pr::{self, Key, ReservationType};
use lunkit::{ErrorKind, Root};
use serde_json::Value;
use support::cli::{describe, lunkit};
use support::iscsi::{self, Session};
use support::lio::{LioConfig, LioTarget};
use support::{cmd, require_vm, sysfs};

const IQN: &str = "iqn.2003-01.org.linux-iscsi.lunkit:pr";
const PORTAL: &str = "127.0.0.1:3260";
/// The two initiators: open-iscsi interface name and its initiator name.
const INITIATORS: [(&str, &str); 2] = [
    ("lunkit-pr-a", "iqn.2026-12.org.lunkit:node-a"),
    ("lunkit-pr-b", "iqn.2026-12.org.lunkit:node-b"),
];
/// Where LIO keeps APTPL metadata (`db_root/pr`): the kernel's REGISTER asks for APTPL, and
/// LIO fails the command when it cannot write the file. /etc and /var are the guest's
/// overlays, restored after the test.
const APTPL_DIRS: [&str; 2] = ["/etc/target/pr", "/var/target/pr"];

/// One LIO LUN and a session to it from each of [`INITIATORS`]; dropping it logs both out,
/// deletes their node records and interfaces, stops iscsid if it started it, and removes
/// the target.
struct TwoInitiators {
    /// The disk of LUN 0 through A's session, then B's.
    disks: [String; 2],
    started_iscsid: bool,
    target: Option<LioTarget>,
}

impl TwoInitiators {
    fn build() -> TwoInitiators {
        for d in APTPL_DIRS {
            std::fs::create_dir_all(d).unwrap();
        }
        let target = LioTarget::create(LioConfig {
            iqn: IQN.into(),
            luns: 1,
            lun_size: 8 << 20,
            portals: vec![PORTAL.into()],
        })
        .unwrap();
        let mut me = TwoInitiators {
            disks: [String::new(), String::new()],
            started_iscsid: false,
            target: Some(target),
        };
        me.started_iscsid = iscsi::ensure_iscsid().unwrap();
        let mut discover = vec!["-m", "discovery", "-t", "st", "-p", PORTAL];
        for (iface, name) in INITIATORS {
            cmd::run("iscsiadm", &["-m", "iface", "-I", iface, "-o", "new"]).unwrap();
            let set = ["-o", "update", "-n", "iface.initiatorname", "-v", name];
            cmd::run(
                "iscsiadm",
                &[&["-m", "iface", "-I", iface][..], &set].concat(),
            )
            .unwrap();
            discover.extend(["-I", iface]);
        }
        cmd::run("iscsiadm", &discover).unwrap();
        for (i, (iface, name)) in INITIATORS.into_iter().enumerate() {
            let login = [
                "-m", "node", "-T", IQN, "-p", PORTAL, "-I", iface, "--login",
            ];
            cmd::run("iscsiadm", &login).unwrap();
            let session = session_of(name);
            me.disks[i] = iscsi::scan_lun(&session, 0).unwrap();
        }
        me
    }

    fn node(&self, i: usize) -> BlockNode {
        block::by_name(&Root::default(), &self.disks[i])
            .unwrap()
            .unwrap_or_else(|| panic!("no block device {}", self.disks[i]))
    }

    fn dev(&self, i: usize) -> String {
        format!("/dev/{}", self.disks[i])
    }
}

impl Drop for TwoInitiators {
    fn drop(&mut self) {
        for (iface, _) in INITIATORS {
            let logout = [
                "-m", "node", "-T", IQN, "-p", PORTAL, "-I", iface, "--logout",
            ];
            cmd::run_ignoring_failure("iscsiadm", &logout);
        }
        cmd::run_ignoring_failure("iscsiadm", &["-m", "node", "-T", IQN, "-o", "delete"]);
        for (iface, _) in INITIATORS {
            cmd::run_ignoring_failure("iscsiadm", &["-m", "iface", "-I", iface, "-o", "delete"]);
        }
        if self.started_iscsid {
            let _ = iscsi::stop_iscsid();
        }
        if let Some(t) = self.target.take() {
            let _ = t.teardown();
        }
    }
}

/// The session whose initiator name is `name`, once sysfs shows it.
fn session_of(name: &str) -> Session {
    support::wait::until(
        &format!("the session of {name}"),
        Duration::from_secs(30),
        || {
            Ok(iscsi::sessions().into_iter().find(|s| {
                s.target == IQN
                    && sysfs::attr(format!(
                        "/sys/class/iscsi_session/session{}/initiatorname",
                        s.sid
                    ))
                    .as_deref()
                        == Some(name)
            }))
        },
    )
    .unwrap()
}

/// `sg_persist -n -i -k DEV`: the generation and the keys, as sg3-utils reads them.
fn sg_keys(dev: &str) -> (u32, Vec<u64>) {
    let out = cmd::run("sg_persist", &["-n", "-i", "-k", dev]).unwrap();
    let generation = out
        .split("PR generation=0x")
        .nth(1)
        .and_then(|r| {
            u32::from_str_radix(r.split(|c: char| !c.is_ascii_hexdigit()).next()?, 16).ok()
        })
        .unwrap_or_else(|| panic!("no generation in {out}"));
    let keys = out
        .lines()
        .filter_map(|l| l.trim().strip_prefix("0x"))
        .map(|h| u64::from_str_radix(h, 16).unwrap())
        .collect();
    (generation, keys)
}

/// `sg_persist -n -i -r DEV`: the holder's key, `None` without a reservation.
fn sg_holder(dev: &str) -> Option<u64> {
    let out = cmd::run("sg_persist", &["-n", "-i", "-r", dev]).unwrap();
    out.lines()
        .find_map(|l| l.trim().strip_prefix("Key=0x"))
        .map(|h| u64::from_str_radix(h, 16).unwrap())
}

/// Writes 4 KiB of `seed`'s pattern at byte 0 of `dev` with `O_DIRECT`, past the page cache.
fn direct_write(dev: &str, seed: u64) -> std::io::Result<()> {
    let f = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(dev)?;
    f.write_all_at(Aligned::new(&support::cli::random(4096, seed)).bytes(), 0)
}

/// The first 4 KiB of `dev`, read with `O_DIRECT`.
fn direct_read(dev: &str) -> Vec<u8> {
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(dev)
        .unwrap();
    let mut buf = Aligned::new(&[0; 4096]);
    f.read_exact_at(buf.bytes_mut(), 0).unwrap();
    buf.bytes().to_vec()
}

/// 4 KiB on a 4 KiB boundary, as `O_DIRECT` wants them.
struct Aligned {
    buf: Vec<u8>,
    at: usize,
}

impl Aligned {
    fn new(data: &[u8]) -> Aligned {
        let mut buf = vec![0u8; 8192];
        let at = buf.as_ptr().align_offset(4096);
        buf[at..at + 4096].copy_from_slice(&data[..4096]);
        Aligned { buf, at }
    }

    fn bytes(&self) -> &[u8] {
        &self.buf[self.at..self.at + 4096]
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.buf[self.at..self.at + 4096]
    }
}

fn deadline() -> Instant {
    Instant::now() + Duration::from_secs(30)
}

/// `lunkit pr show DEV --json`, parsed.
fn show_json(dev: &str) -> Value {
    let out = lunkit(&["pr", "show", dev, "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn two_initiators_register_reserve_preempt_and_abort_release_and_clear() {
    require_vm();
    let lab = TwoInitiators::build();
    let (a, b) = (lab.node(0), lab.node(1));
    let (ka, kb) = (Key::from_identity("node-a"), Key::from_identity("node-b"));
    let we_ro = ReservationType::WriteExclusiveRegistrantsOnly;

    // Both register, A through the library, B through the CLI; read back through either.
    pr::register(&a, ka, deadline()).unwrap();
    let kb_text = kb.to_string();
    let out = lunkit(&["pr", "register", &lab.dev(1), "--key", &kb_text, "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let done: Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    assert_eq!(done["done"], "registered", "{done}");
    assert_eq!(done["key"], kb_text.as_str(), "{done}");
    assert_eq!(done["dev"], b.dev.to_string().as_str(), "{done}");
    assert!(done["elapsed_us"].as_u64().is_some(), "{done}");
    let keys = pr::read_keys(&b, deadline()).unwrap();
    let (sg_gen, sg_keys_b) = sg_keys(&lab.dev(1));
    assert_eq!(keys.keys, [ka, kb], "registrations in LIO's order");
    assert_eq!(
        keys.keys.iter().map(|k| k.get()).collect::<Vec<_>>(),
        sg_keys_b
    );
    assert_eq!(keys.generation, sg_gen);
    // A path registered with another key is found; A's is registered with its own.
    assert!(
        pr::unregistered_paths(&Root::default(), &a, ka, deadline())
            .unwrap()
            .is_empty()
    );
    let other = pr::unregistered_paths(&Root::default(), &b, ka, deadline()).unwrap();
    assert_eq!(other.len(), 1);
    assert_eq!(
        other[0].why.kind(),
        ErrorKind::ReservationConflict,
        "{}",
        other[0].why
    );

    // A reserves Write Exclusive, Registrants Only; both read it back, sg_persist too.
    pr::reserve(&a, ka, we_ro, deadline()).unwrap();
    let r = pr::read_reservation(&b, deadline()).unwrap();
    let h = r.holder.expect("a reservation");
    assert_eq!((h.key, h.kind, h.scope), (ka, Some(we_ro), 0));
    assert_eq!(sg_holder(&lab.dev(1)), Some(ka.get()));
    let doc = show_json(&lab.dev(1));
    let path = &doc["paths"][0];
    assert_eq!(path["reservation"]["key"], ka.to_string(), "{doc}");
    assert_eq!(
        path["reservation"]["type"], "write-exclusive-registrants-only",
        "{doc}"
    );
    assert_eq!(
        path["keys"],
        serde_json::json!([ka.to_string(), kb.to_string()]),
        "{doc}"
    );

    // B cannot take it: a typed refusal naming the device and A's key.
    let e = pr::reserve(&b, kb, ReservationType::ExclusiveAccess, deadline()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ReservationConflict, "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains(&lab.disks[1]) && msg.contains(&ka.to_string()),
        "{msg}"
    );
    // Nor can the CLI preempt A without --force: refused before anything is sent.
    let kb_arg = kb.to_string();
    let preempt = [
        "pr",
        "preempt",
        &lab.dev(1),
        "--key",
        &kb_arg,
        "--type",
        "we-ro",
        "--abort",
    ];
    let out = lunkit(&preempt);
    assert_eq!(out.status.code(), Some(4), "{}", describe(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(&ka.to_string()),
        "{}",
        describe(&out)
    );
    assert_eq!(sg_holder(&lab.dev(0)), Some(ka.get()), "nothing changed");

    // B preempts and aborts A: from then on A's writes fail and B's land.
    direct_write(&lab.dev(0), 1).expect("A writes while it holds the reservation");
    let out = lunkit(&[&preempt[..], &["--force"]].concat());
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert_eq!(
        sg_keys(&lab.dev(1)).1,
        [kb.get()],
        "A's registration is gone"
    );
    // A's first command is told its registration was preempted (a UNIT ATTENTION), which
    // the library reads past; sg_persist comes after it.
    let h = pr::read_reservation(&a, deadline())
        .unwrap()
        .holder
        .unwrap();
    assert_eq!((h.key, h.kind), (kb, Some(we_ro)));
    assert_eq!(sg_holder(&lab.dev(0)), Some(kb.get()));
    let refused = direct_write(&lab.dev(0), 2).expect_err("A's write after the preemption");
    // The block layer's BLK_STS_NEXUS (EBADE) for the write's RESERVATION CONFLICT; EIO
    // where a kernel folds it into an I/O error.
    let errno = refused.raw_os_error();
    assert!(
        errno == Some(libc::EBADE) || errno == Some(libc::EIO),
        "{refused}"
    );
    direct_write(&lab.dev(1), 3).expect("B's write lands");
    assert_eq!(direct_read(&lab.dev(1)), support::cli::random(4096, 3));
    // A's reservation calls are refused, typed: its key is no longer registered.
    let e = pr::release(&a, ka, we_ro, deadline()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ReservationConflict, "{e}");
    let e = pr::clear(&a, ka, deadline()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ReservationConflict, "{e}");

    // B releases and clears; nothing is left.
    let out = lunkit(&[
        "pr",
        "release",
        &lab.dev(1),
        "--key",
        &kb_arg,
        "--type",
        "we-ro",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert_eq!(pr::read_reservation(&a, deadline()).unwrap().holder, None);
    let out = lunkit(&["pr", "clear", &lab.dev(1), "--key", &kb_arg]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(pr::read_keys(&a, deadline()).unwrap().keys.is_empty());
    assert_eq!(sg_keys(&lab.dev(0)).1, Vec::<u64>::new());
    assert_eq!(sg_holder(&lab.dev(0)), None);
    drop(lab);
}

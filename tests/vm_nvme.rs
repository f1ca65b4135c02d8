//! VM tests for NVMe over Fabrics (issue 15): an nvmet TCP target on 127.0.0.1 and 127.0.0.2
//! (`support::nvmet`), connected, attached and detached by the lunkit CLI with no nvme-cli,
//! under Debian's kernel with native multipath.
//!
//! Run by `cargo xtask test` inside the QEMU guest (ignored on the host).

// The tests run the lunkit CLI, mkfs and mount; the fixtures build the target.
#![allow(clippy::disallowed_methods)]

use lunkit_lab as support;

use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use serde_json::Value;
use support::child::Running;
use support::cli::{describe, lunkit, random};
use support::nvmet::Target;
use support::{cmd, require_vm, sysfs, wait};

const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:6c1d8a70-1c9e-4d5e-9a40-3b4c5d6e7f80";
const HOSTID: &str = "6c1d8a70-1c9e-4d5e-9a40-3b4c5d6e7f80";
const PORTALS: [&str; 2] = ["127.0.0.1:4420", "127.0.0.2:4420"];
const MIB: u64 = 1 << 20;
const MOUNT: &str = "/run/lunkit-nvme-mnt";
/// The CLI's lock directory (`DetachOptions::new`'s default).
const LOCK_DIR: &str = "/run/lunkit/locks";

/// `lunkit <args>` whose last argument is `--json`: exit code and document.
fn json(args: &[&str]) -> (Option<i32>, Value, Output) {
    let out = lunkit(args);
    let doc = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{args:?}: no JSON ({e}): {}", describe(&out)));
    (out.status.code(), doc, out)
}

/// Host-side controllers of subsystem `nqn`, from sysfs.
fn controllers(nqn: &str) -> Vec<String> {
    sysfs::names("/sys/class/nvme")
        .into_iter()
        .filter(|c| sysfs::attr(format!("/sys/class/nvme/{c}/subsysnqn")).as_deref() == Some(nqn))
        .collect()
}

/// NVMe namespace block devices on the node (`nvme0n1`; no hidden paths).
fn heads() -> Vec<String> {
    sysfs::names("/sys/block")
        .into_iter()
        .filter(|n| n.starts_with("nvme") && !n.contains('c'))
        .collect()
}

/// Waits until `n` controllers of subsystem `nqn` are no longer `live` (a port went away;
/// the host keeps reconnecting them).
fn wait_links_lost(nqn: &str, n: usize) {
    wait::until_true(
        &format!("{n} controller(s) of {nqn} to lose their link"),
        Duration::from_secs(60),
        || {
            controllers(nqn)
                .iter()
                .filter(|c| {
                    sysfs::attr(format!("/sys/class/nvme/{c}/state")).as_deref() != Some("live")
                })
                .count()
                >= n
        },
    )
    .unwrap();
}

/// Deletes the controllers of its subsystem that a test left, before the target goes (a
/// failed assertion must not leave the host reconnecting to a removed target).
struct Disconnect(String);

impl Drop for Disconnect {
    fn drop(&mut self) {
        for c in controllers(&self.0) {
            let _ = fs::write(format!("/sys/class/nvme/{c}/delete_controller"), "1");
        }
    }
}

fn connect(nqn: &str, portal: &str) -> (Option<i32>, Value, Output) {
    let (addr, port) = portal.rsplit_once(':').unwrap();
    json(&[
        "nvme",
        "connect",
        "--traddr",
        addr,
        "--trsvcid",
        port,
        "--nqn",
        nqn,
        "--hostnqn",
        HOSTNQN,
        "--hostid",
        HOSTID,
        "--json",
    ])
}

fn attach(nqn: &str, nsid: u32) -> (Option<i32>, Value, Output) {
    let nsid = nsid.to_string();
    json(&[
        "attach",
        "--nvme-nqn",
        nqn,
        "--nsid",
        &nsid,
        "--portal",
        PORTALS[0],
        "--portal",
        PORTALS[1],
        "--hostnqn",
        HOSTNQN,
        "--hostid",
        HOSTID,
        "--timeout",
        "60",
        "--json",
    ])
}

fn detach(nqn: &str, nsid: u32) -> (Option<i32>, Value, Output) {
    let nsid = nsid.to_string();
    json(&[
        "detach",
        "--nvme-nqn",
        nqn,
        "--nsid",
        &nsid,
        "--timeout",
        "60",
        "--json",
    ])
}

/// `lunkit attach` of namespace `nsid` (as [`attach`]) or `lunkit detach` of it (as
/// [`detach`]), started in the background.
fn spawn(verb: &str, nqn: &str, nsid: u32) -> Running {
    let bin = std::env::var("LUNKIT_BIN").expect("LUNKIT_BIN is set by cargo xtask test");
    let nsid = nsid.to_string();
    let mut args = vec![verb, "--nvme-nqn", nqn, "--nsid", &nsid];
    if verb == "attach" {
        args.extend(["--portal", PORTALS[0], "--portal", PORTALS[1]]);
        args.extend(["--hostnqn", HOSTNQN, "--hostid", HOSTID]);
    }
    args.extend(["--timeout", "60", "--json"]);
    Running::spawn(Command::new(bin).args(&args)).expect("start lunkit")
}

/// The lock file under which attach and detach of subsystem `nqn`'s namespaces decide which
/// controllers are needed, in the CLI's lock directory.
fn subsystem_lock(nqn: &str) -> PathBuf {
    let key = lunkit::ops::nvme::subsystem_lock_key(&nqn.parse().expect("an NQN"));
    lunkit::ops::lock::file_path(Path::new(LOCK_DIR), &key)
}

/// Process `pid` has `path` open: it is waiting for the lock, or holds it.
fn has_open(pid: u32, path: &Path) -> bool {
    fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|fds| {
            fds.flatten()
                .any(|fd| fs::read_link(fd.path()).is_ok_and(|l| l == path))
        })
        .unwrap_or(false)
}

/// Process `pid` holds an exclusive `flock` on `path` (`/proc/locks`: `N: FLOCK ADVISORY
/// WRITE PID MAJ:MIN:INODE 0 EOF`; a waiter's line has `->` before `FLOCK`).
fn holds_flock(pid: u32, path: &Path) -> bool {
    let Ok(inode) = fs::metadata(path).map(|m| std::os::unix::fs::MetadataExt::ino(&m)) else {
        return false;
    };
    fs::read_to_string("/proc/locks").is_ok_and(|locks| {
        locks.lines().any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 5
                && f[1] == "FLOCK"
                && f[3] == "WRITE"
                && f[4] == pid.to_string()
                && f[5].rsplit(':').next() == Some(inode.to_string().as_str())
        })
    })
}

/// An exclusive `flock` on a lock file, held by a child (util-linux `flock`) until dropped.
struct HeldLock(std::process::Child);

impl HeldLock {
    fn take(path: &Path) -> HeldLock {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(path.parent().unwrap())
            .unwrap();
        let mut child = Command::new("flock")
            .arg(path)
            .args(["-c", "echo held; read x"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("run flock");
        let mut line = [0u8; 5];
        child
            .stdout
            .as_mut()
            .unwrap()
            .read_exact(&mut line)
            .expect("flock took the lock");
        HeldLock(child)
    }
}

impl Drop for HeldLock {
    fn drop(&mut self) {
        drop(self.0.stdin.take());
        let _ = self.0.wait();
    }
}

/// `len` bytes from the start of block device `dev`, read with `O_DIRECT` (what the target
/// holds, not a page cache filled before).
fn read_direct(dev: &str, len: usize) -> Vec<u8> {
    let mut f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(dev)
        .unwrap();
    let mut buf = vec![0u8; len + 4096];
    let off = buf.as_ptr().align_offset(4096);
    f.read_exact(&mut buf[off..off + len]).unwrap();
    buf[off..off + len].to_vec()
}

/// A controller is deleted only as the object it was decided on. Between a decision to delete
/// `nvme0` and the write, that controller goes and another is made through another port: the
/// kernel gives it the same name (the lowest free instance) and nvmet the same controller id
/// (the lowest free one). The delete of what was decided on is refused as `Replaced`, and the
/// new controller stays.
#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn a_controller_made_again_under_the_same_name_is_not_deleted_as_the_old_one() {
    require_vm();
    let target = Target::builder()
        .namespace(16 * MIB)
        .build()
        .expect("nvmet target");
    let nqn = target.nqn().to_owned();
    let _cleanup = Disconnect(nqn.clone());
    let root = lunkit::Root::default();
    let (code, _, out) = connect(&nqn, PORTALS[0]);
    assert_eq!(code, Some(0), "{}", describe(&out));
    let [name] = controllers(&nqn).try_into().expect("one controller");
    let decided = lunkit::nvme::sysfs::controller(&root, &name)
        .unwrap()
        .expect("the controller");

    fs::write(format!("/sys/class/nvme/{name}/delete_controller"), "1").unwrap();
    wait::until_true("the controller to go", Duration::from_secs(60), || {
        controllers(&nqn).is_empty()
    })
    .unwrap();
    let (code, _, out) = connect(&nqn, PORTALS[1]);
    assert_eq!(code, Some(0), "{}", describe(&out));
    let now = lunkit::nvme::sysfs::controller(&root, &name)
        .unwrap()
        .expect("a controller under the same name");
    assert_eq!(
        now.cntlid, decided.cntlid,
        "nvmet gave another controller id"
    );
    assert_ne!(now.address, decided.address);

    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    match lunkit::nvme::delete_controller(&root, &decided, deadline) {
        Err(e @ lunkit::Error::Replaced { .. }) => eprintln!("refused: {e}"),
        other => panic!("the delete of the old controller gave {other:?}"),
    }
    assert_eq!(
        controllers(&nqn),
        std::slice::from_ref(&name),
        "the new controller was deleted"
    );
    // The one read now is deleted.
    lunkit::nvme::delete_controller(&root, &now, deadline).unwrap();
    assert!(controllers(&nqn).is_empty());
    target.teardown().expect("target teardown");
}

/// The steps of a detach report whose kind is `kind`, as `(target, outcome, detail)`.
fn steps<'a>(doc: &'a Value, kind: &str) -> Vec<(&'a str, &'a str, &'a str)> {
    doc["steps"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|s| s["step"] == kind)
                .map(|s| {
                    (
                        s["target"].as_str().unwrap_or_default(),
                        s["outcome"].as_str().unwrap_or_default(),
                        s["detail"].as_str().unwrap_or_default(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn two_connects_give_one_head_with_both_paths_and_a_third_returns_the_existing_controller() {
    require_vm();
    let target = Target::builder()
        .namespace(64 * MIB)
        .build()
        .expect("nvmet target");
    let nqn = target.nqn().to_owned();
    let _cleanup = Disconnect(nqn.clone());

    // Bad input writes nothing: no controller comes of it.
    for bad in [
        vec![
            "nvme",
            "connect",
            "--traddr",
            "127.0.0.1",
            "--nqn",
            "nqn.x",
            "--hostnqn",
            HOSTNQN,
        ],
        vec![
            "nvme",
            "connect",
            "--transport",
            "rdmx",
            "--traddr",
            "127.0.0.1",
            "--nqn",
            &nqn,
            "--hostnqn",
            HOSTNQN,
        ],
        vec![
            "nvme",
            "connect",
            "--traddr",
            "1.2.3.4,nqn=x",
            "--nqn",
            &nqn,
            "--hostnqn",
            HOSTNQN,
        ],
    ] {
        let out = lunkit(&bad);
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {}", describe(&out));
    }
    assert_eq!(controllers(&nqn), Vec::<String>::new());

    let (code, a, out) = connect(&nqn, PORTALS[0]);
    assert_eq!(code, Some(0), "{}", describe(&out));
    assert_eq!(a["result"]["existing"], false, "{a}");
    assert_eq!(a["result"]["state"], "live", "{a}");
    let (code, b, out) = connect(&nqn, PORTALS[1]);
    assert_eq!(code, Some(0), "{}", describe(&out));
    let (ca, cb) = (
        a["result"]["controller"].as_str().unwrap().to_owned(),
        b["result"]["controller"].as_str().unwrap().to_owned(),
    );
    assert_ne!(ca, cb);
    let mut both = vec![ca.clone(), cb.clone()];
    both.sort();
    assert_eq!(controllers(&nqn), both);
    assert_eq!(
        sysfs::attr(format!("/sys/class/nvme/{ca}/hostnqn")).as_deref(),
        Some(HOSTNQN)
    );

    // Again on the first portal: the same controller, nothing written.
    let (code, again, out) = connect(&nqn, PORTALS[0]);
    assert_eq!(code, Some(0), "{}", describe(&out));
    assert_eq!(again["result"]["existing"], true, "{again}");
    assert_eq!(again["result"]["controller"], ca.as_str(), "{again}");
    assert_eq!(controllers(&nqn).len(), 2);
    // And as an operator sees it.
    let out = lunkit(&[
        "nvme",
        "connect",
        "--traddr",
        "127.0.0.2",
        "--nqn",
        &nqn,
        "--hostnqn",
        HOSTNQN,
        "--hostid",
        HOSTID,
    ]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!("lunkit nvme connect (text): {text}");
    assert!(
        text.starts_with(&format!("{cb}: already connected (cntlid ")),
        "{text}"
    );

    // The native-multipath head, with a path through each controller, as `list` shows it.
    let ns = target.namespace(1).unwrap();
    let list = wait::until(
        "the namespace head with both paths",
        Duration::from_secs(60),
        || {
            let out = lunkit(&["list", "--json"]);
            let doc: Value = serde_json::from_slice(&out.stdout)?;
            let ready = doc["nvme_namespaces"].as_array().is_some_and(|a| {
                a.iter()
                    .any(|n| n["paths"].as_array().is_some_and(|p| p.len() == 2))
            });
            Ok(ready.then_some(doc))
        },
    )
    .unwrap();
    let listed = list["nvme_namespaces"].as_array().unwrap();
    assert_eq!(listed.len(), 1, "{list}");
    let head = &listed[0];
    assert_eq!(head["nsid"], 1, "{head}");
    assert_eq!(head["size_bytes"], 64 * MIB, "{head}");
    assert_eq!(head["wwid"], format!("uuid.{}", ns.uuid), "{head}");
    let mut via: Vec<&str> = head["paths"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["controller"].as_str().unwrap())
        .collect();
    via.sort();
    assert_eq!(via, both, "{head}");
    let subsystem = list["nvme_subsystems"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["nqn"] == nqn.as_str())
        .unwrap_or_else(|| panic!("no subsystem {nqn}: {list}"));
    assert_eq!(subsystem["namespaces"], serde_json::json!([head["name"]]));
    let text = String::from_utf8_lossy(&lunkit(&["list"]).stdout).into_owned();
    eprintln!("lunkit list:\n{text}");
    assert!(text.contains("NVMe namespaces"), "{text}");
    // The head and its hidden paths are in the NVMe table only, not among "Other block
    // devices" (where the hidden paths, which no one can open, were listed before).
    let other = text
        .split("Other block devices")
        .nth(1)
        .map_or("", |rest| rest.split("\n\n").next().unwrap_or(""));
    for dev in [head["name"].as_str().unwrap()].into_iter().chain(
        head["paths"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["name"].as_str().unwrap()),
    ) {
        assert!(
            !other
                .lines()
                .any(|l| l.split_whitespace().next() == Some(dev)),
            "{dev} under Other block devices:\n{text}"
        );
    }

    let out = lunkit(&["nvme", "rescan", "--nqn", &nqn]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 2);
    let (code, d, out) = json(&["nvme", "rescan", "--nqn", &nqn, "--json"]);
    assert_eq!(code, Some(0), "{}", describe(&out));
    assert_eq!(
        (&d["version"], &d["nqn"]),
        (&serde_json::json!(1), &serde_json::json!(nqn))
    );
    let mut asked: Vec<String> = serde_json::from_value(d["controllers"].clone()).unwrap();
    asked.sort();
    assert_eq!(asked, both, "{d}");

    let (code, d, out) = json(&["nvme", "disconnect", "--nqn", &nqn, "--json"]);
    assert_eq!(code, Some(0), "{}", describe(&out));
    assert_eq!(d["result"]["controllers"], serde_json::json!(both), "{d}");
    assert_eq!(controllers(&nqn), Vec::<String>::new());
    assert_eq!(heads(), Vec::<String>::new());
    // Nothing connected: a second disconnect is success.
    let (code, d, out) = json(&["nvme", "disconnect", "--nqn", &nqn, "--json"]);
    assert_eq!(code, Some(0), "{}", describe(&out));
    assert_eq!(d["result"]["controllers"], serde_json::json!([]), "{d}");
    target.teardown().expect("target teardown");
}

#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn attach_then_detach_leaves_every_byte_on_the_target_and_no_controller() {
    require_vm();
    let target = Target::builder()
        .namespace(64 * MIB)
        .build()
        .expect("nvmet target");
    let nqn = target.nqn().to_owned();
    let _cleanup = Disconnect(nqn.clone());

    let (code, a, out) = attach(&nqn, 1);
    assert_eq!(code, Some(0), "{}", describe(&out));
    let ns = target.namespace(1).unwrap();
    assert_eq!(a["wwid"], format!("uuid.{}", ns.uuid), "{a}");
    assert_eq!(a["controllers"].as_array().unwrap().len(), 2, "{a}");
    for p in a["portals"].as_array().unwrap() {
        assert_eq!(p["outcome"], "connected", "{a}");
    }
    let dev = a["devices"][0]["path"].as_str().unwrap().to_owned();

    // Attached again: both portals are found connected, nothing is duplicated.
    let (code, again, out) = attach(&nqn, 1);
    assert_eq!(code, Some(0), "{}", describe(&out));
    for p in again["portals"].as_array().unwrap() {
        assert_eq!(p["outcome"], "existing", "{again}");
    }
    assert_eq!(controllers(&nqn).len(), 2);
    // A WWID that is not the namespace's is refused.
    let out = lunkit(&[
        "attach",
        "--nvme-nqn",
        &nqn,
        "--nsid",
        "1",
        "--hostnqn",
        HOSTNQN,
        "--expect-wwid",
        "uuid.00000000-0000-0000-0000-000000000000",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));

    // 8 MiB written through the page cache and never synced: the detach's flush must carry
    // it to the target.
    let data = random(8 * MIB as usize, 15);
    let mut f = fs::OpenOptions::new().write(true).open(&dev).unwrap();
    f.seek(SeekFrom::Start(MIB)).unwrap();
    f.write_all(&data).unwrap();
    drop(f);

    let (code, d, out) = detach(&nqn, 1);
    assert_eq!(code, Some(0), "{}", describe(&out));
    assert_eq!(steps(&d, "flush-namespace").len(), 1, "{d}");
    assert_eq!(steps(&d, "flush-namespace")[0].1, "done", "{d}");
    let deleted = steps(&d, "delete-controller");
    assert_eq!(deleted.len(), 2, "{d}");
    assert!(deleted.iter().all(|(_, o, _)| *o == "done"), "{d}");
    assert_eq!(controllers(&nqn), Vec::<String>::new());
    assert_eq!(heads(), Vec::<String>::new());
    assert!(
        target.read(1, MIB, data.len()).unwrap() == data,
        "the target's file differs from what was written"
    );

    // Detached again: nothing to do.
    let (code, d, out) = detach(&nqn, 1);
    assert_eq!(code, Some(0), "{}", describe(&out));
    assert_eq!(d["rounds"], 0, "{d}");
    target.teardown().expect("target teardown");
}

#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn detaching_one_of_two_namespaces_keeps_the_other_usable() {
    require_vm();
    let target = Target::builder()
        .namespace(32 * MIB)
        .namespace(48 * MIB)
        .build()
        .expect("nvmet target");
    let nqn = target.nqn().to_owned();
    let _cleanup = Disconnect(nqn.clone());

    let (code, one, out) = attach(&nqn, 1);
    assert_eq!(code, Some(0), "{}", describe(&out));
    let (code, two, out) = attach(&nqn, 2);
    assert_eq!(code, Some(0), "{}", describe(&out));
    let dev1 = one["devices"][0]["name"].as_str().unwrap().to_owned();
    let dev2 = two["devices"][0]["path"].as_str().unwrap().to_owned();
    assert_ne!(format!("/dev/{dev1}"), dev2);

    let (code, d, out) = detach(&nqn, 1);
    assert_eq!(code, Some(0), "{}", describe(&out));
    let kept = steps(&d, "delete-controller");
    assert_eq!(kept.len(), 2, "{d}");
    assert!(
        kept.iter()
            .all(|(_, o, why)| *o == "skipped" && why.starts_with("kept")),
        "{d}"
    );
    assert_eq!(controllers(&nqn).len(), 2);

    // The other namespace still takes writes and reads them back from the target.
    let data = random(MIB as usize, 2);
    let mut f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(&dev2)
        .unwrap();
    // O_DIRECT wants an aligned buffer: a Vec of u8 need not be, so copy into one that is.
    let mut aligned = vec![0u8; data.len() + 4096];
    let off = aligned.as_ptr().align_offset(4096);
    aligned[off..off + data.len()].copy_from_slice(&data);
    f.write_all(&aligned[off..off + data.len()]).unwrap();
    f.seek(SeekFrom::Start(0)).unwrap();
    let mut back = vec![0u8; data.len() + 4096];
    let off2 = back.as_ptr().align_offset(4096);
    f.read_exact(&mut back[off2..off2 + data.len()]).unwrap();
    assert!(
        back[off2..off2 + data.len()] == data[..],
        "namespace 2 reads back other bytes"
    );
    drop(f);
    assert!(target.read(2, 0, data.len()).unwrap() == data);

    // The last one takes the controllers with it.
    let (code, d, out) = detach(&nqn, 2);
    assert_eq!(code, Some(0), "{}", describe(&out));
    assert!(
        steps(&d, "delete-controller")
            .iter()
            .all(|(_, o, _)| *o == "done"),
        "{d}"
    );
    assert_eq!(controllers(&nqn), Vec::<String>::new());
    assert_eq!(heads(), Vec::<String>::new());
    target.teardown().expect("target teardown");
}

/// `lunkit attach|detach --nvme-nqn NQN --nguid NGUID` (the portals and host of [`attach`]).
fn by_nguid(verb: &str, nqn: &str, nguid: &str) -> (Option<i32>, Value, Output) {
    let mut args = vec![verb, "--nvme-nqn", nqn, "--nguid", nguid];
    if verb == "attach" {
        args.extend([
            "--portal",
            PORTALS[0],
            "--portal",
            PORTALS[1],
            "--hostnqn",
            HOSTNQN,
            "--hostid",
            HOSTID,
        ]);
    }
    args.extend(["--timeout", "60", "--json"]);
    json(&args)
}

#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn a_namespace_named_by_nguid_is_that_namespace_and_counts_for_its_neighbours() {
    require_vm();
    let target = Target::builder()
        .namespace(32 * MIB)
        .namespace(48 * MIB)
        .build()
        .expect("nvmet target");
    let nqn = target.nqn().to_owned();
    let _cleanup = Disconnect(nqn.clone());
    // As `nvme id-ns` and an array's console print it: 32 hex digits, upper case here.
    let nguid2 = target
        .namespace(2)
        .unwrap()
        .nguid
        .replace('-', "")
        .to_uppercase();

    let (code, two, out) = by_nguid("attach", &nqn, &nguid2);
    assert_eq!(code, Some(0), "{}", describe(&out));
    let dev2 = two["devices"][0]["name"].as_str().unwrap().to_owned();
    assert_eq!(
        sysfs::attr(format!("/sys/block/{dev2}/nsid")).as_deref(),
        Some("2"),
        "the NGUID named namespace 2, attach brought {dev2}: {two}"
    );
    assert_eq!(
        sysfs::attr(format!("/sys/block/{dev2}/size")).as_deref(),
        Some((48 * MIB / 512).to_string().as_str())
    );
    let (code, one, out) = attach(&nqn, 1);
    assert_eq!(code, Some(0), "{}", describe(&out));
    let dev1 = one["devices"][0]["name"].as_str().unwrap().to_owned();
    assert_ne!(dev1, dev2);

    // An NGUID the subsystem does not have is nothing on the node: nothing is touched.
    let (code, d, out) = by_nguid("detach", &nqn, "0123456789abcdef0123456789abcdef");
    assert_eq!(code, Some(0), "{}", describe(&out));
    assert!(steps(&d, "delete-controller").is_empty(), "{d}");
    assert!(steps(&d, "flush-namespace").is_empty(), "{d}");
    assert_eq!(controllers(&nqn).len(), 2);
    assert_eq!(heads().len(), 2, "both namespaces stay: {:?}", heads());

    // Namespace 1 by id: namespace 2 was attached by NGUID, and still keeps the controllers.
    let (code, d, out) = detach(&nqn, 1);
    assert_eq!(code, Some(0), "{}", describe(&out));
    let kept = steps(&d, "delete-controller");
    assert_eq!(kept.len(), 2, "{d}");
    assert!(
        kept.iter()
            .all(|(_, o, why)| *o == "skipped" && why.contains(&dev2)),
        "{d}"
    );
    assert_eq!(controllers(&nqn).len(), 2);

    // Namespace 2 by its NGUID as sysfs prints it: the last one, so the controllers go.
    let sysfs_form = target.namespace(2).unwrap().nguid.clone();
    let (code, d, out) = by_nguid("detach", &nqn, &sysfs_form);
    assert_eq!(code, Some(0), "{}", describe(&out));
    let flushed = steps(&d, "flush-namespace");
    assert_eq!(flushed.len(), 1, "{d}");
    assert_eq!(flushed[0].0, dev2, "{d}");
    assert!(
        steps(&d, "delete-controller")
            .iter()
            .all(|(_, o, _)| *o == "done"),
        "{d}"
    );
    assert_eq!(controllers(&nqn), Vec::<String>::new());
    assert_eq!(heads(), Vec::<String>::new());
    target.teardown().expect("target teardown");
}

#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn a_mounted_or_open_namespace_is_refused_with_its_data_intact() {
    require_vm();
    let target = Target::builder()
        .namespace(64 * MIB)
        .build()
        .expect("nvmet target");
    let nqn = target.nqn().to_owned();
    let _cleanup = Disconnect(nqn.clone());
    let (code, a, out) = attach(&nqn, 1);
    assert_eq!(code, Some(0), "{}", describe(&out));
    let dev = a["devices"][0]["path"].as_str().unwrap().to_owned();

    cmd::run("mkfs.ext4", &["-q", "-F", &dev]).expect("mkfs");
    fs::create_dir_all(MOUNT).unwrap();
    cmd::run("mount", &[&dev, MOUNT]).expect("mount");
    let data = random(MIB as usize, 7);
    fs::write(format!("{MOUNT}/data"), &data).unwrap();
    let (code, d, out) = detach(&nqn, 1);
    let still = fs::read(format!("{MOUNT}/data"));
    let _ = cmd::run("umount", &[MOUNT]);
    assert_eq!(code, Some(4), "{}", describe(&out));
    assert!(d["error"].as_str().unwrap().contains(MOUNT), "{d}");
    assert!(still.unwrap() == data, "the file changed while mounted");
    assert_eq!(controllers(&nqn).len(), 2, "a refusal changed something");

    // An open descriptor: a child holding the device.
    let mut holder = Command::new("sh")
        .args(["-c", &format!("exec 3<{dev}; echo open; read x")])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = [0u8; 5];
    holder
        .stdout
        .as_mut()
        .unwrap()
        .read_exact(&mut line)
        .unwrap();
    let (code, d, out) = detach(&nqn, 1);
    drop(holder.stdin.take());
    let _ = holder.wait();
    assert_eq!(code, Some(4), "{}", describe(&out));
    assert!(
        d["error"]
            .as_str()
            .unwrap()
            .contains(&format!("pid {}", holder.id())),
        "{d}"
    );
    assert_eq!(controllers(&nqn).len(), 2, "a refusal changed something");

    // Let go: detached, and the filesystem on the target still holds the file. The head is
    // claimed from the check to the controllers' delete: a mount tried right after the check
    // (from the step callback, on the detach's own thread) fails as busy instead of losing
    // its device under it.
    use lunkit::ops::{DetachOptions, NamespaceSelector, Outcome, StepKind, VolumeSpec};
    let root = lunkit::Root::default();
    let spec = VolumeSpec::Nvme {
        nqn: nqn.parse().unwrap(),
        namespace: NamespaceSelector::Id(1),
    };
    let mut tried = None;
    let report = lunkit::ops::detach_with(&root, &spec, &DetachOptions::new(&root), &mut |step| {
        if step.kind == StepKind::CheckInUse && step.outcome == Outcome::Done {
            tried = Some(Command::new("mount").args([&dev, MOUNT]).output().unwrap());
        }
    })
    .unwrap();
    eprintln!("{report:#?}");
    let tried = tried.expect("a check-in-use step that was done");
    assert!(!tried.status.success(), "mounted: {}", describe(&tried));
    assert!(
        String::from_utf8_lossy(&tried.stderr).contains("busy"),
        "{}",
        describe(&tried)
    );
    let mounts = fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(MOUNT), "{mounts}");
    assert_eq!(controllers(&nqn), Vec::<String>::new());
    let (code, a, out) = attach(&nqn, 1);
    assert_eq!(code, Some(0), "{}", describe(&out));
    let dev = a["devices"][0]["path"].as_str().unwrap().to_owned();
    cmd::run("mount", &["-o", "ro", &dev, MOUNT]).expect("mount again");
    let back = fs::read(format!("{MOUNT}/data"));
    let _ = cmd::run("umount", &[MOUNT]);
    assert!(
        back.unwrap() == data,
        "the file differs after detach and attach"
    );
    let (code, _, out) = detach(&nqn, 1);
    assert_eq!(code, Some(0), "{}", describe(&out));
    let _ = fs::remove_dir(MOUNT);
    target.teardown().expect("target teardown");
}

#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn a_target_whose_ports_went_away_is_detached_within_the_deadline_or_forced() {
    require_vm();
    let mut target = Target::builder()
        .namespace(32 * MIB)
        .build()
        .expect("nvmet target");
    let nqn = target.nqn().to_owned();
    let _cleanup = Disconnect(nqn.clone());
    let (code, _, out) = attach(&nqn, 1);
    assert_eq!(code, Some(0), "{}", describe(&out));
    let ids: Vec<u16> = target.ports().iter().map(|p| p.id).collect();
    for id in ids {
        target.remove_port(id).expect("remove a port");
    }
    // The host notices and keeps reconnecting (ctrl_loss_tmo 600 s by default).
    wait_links_lost(&nqn, 2);
    // Nothing uses it, but the kernel is reconnecting and I/O to the head queues until a
    // path comes back: a writer's last close may be waiting there, so the detach waits for a
    // path and ends at its deadline with nothing changed. Forced, it takes the namespace away.
    let detach_args = [
        "detach",
        "--nvme-nqn",
        &nqn,
        "--nsid",
        "1",
        "--timeout",
        "10",
        "--json",
    ];
    let (code, d, out) = json(&detach_args);
    eprintln!("detach without a live controller: {}", describe(&out));
    assert_eq!(code, Some(5), "{}", describe(&out));
    let err = d["error"].as_str().unwrap_or_default();
    assert!(err.contains("reconnecting"), "{d}");
    assert_eq!(
        controllers(&nqn).len(),
        2,
        "a detach that timed out changed something"
    );
    assert_eq!(
        heads().len(),
        1,
        "a detach that timed out changed something"
    );
    let forced = [
        "detach",
        "--nvme-nqn",
        &nqn,
        "--nsid",
        "1",
        "--timeout",
        "30",
        "--force",
        "--json",
    ];
    let (code, d, out) = json(&forced);
    assert_eq!(code, Some(0), "{}", describe(&out));
    let flush = steps(&d, "flush-namespace");
    assert!(
        flush[0].1 == "skipped" && flush[0].2.starts_with("forced"),
        "{d}"
    );
    assert_eq!(controllers(&nqn), Vec::<String>::new());
    assert_eq!(heads(), Vec::<String>::new());
    target.teardown().expect("target teardown");
}

/// `lunkit resize --nvme-nqn NQN --nsid N [--expect-size B] --json`.
fn resize(nqn: &str, nsid: u32, expect: Option<u64>) -> (Option<i32>, Value, Output) {
    let nsid = nsid.to_string();
    let expect = expect.map(|e| e.to_string());
    let mut args = vec!["resize", "--nvme-nqn", nqn, "--nsid", &nsid];
    if let Some(e) = &expect {
        args.extend(["--expect-size", e]);
    }
    args.extend(["--timeout", "30", "--json"]);
    json(&args)
}

/// The size of block device `name` in bytes, from sysfs.
fn block_bytes(name: &str) -> u64 {
    sysfs::attr(format!("/sys/block/{name}/size"))
        .and_then(|s| s.parse::<u64>().ok())
        .map_or(0, |s| s * 512)
}

/// Unmounts [`MOUNT`] and removes it, even when an assertion failed.
struct Unmount;

impl Drop for Unmount {
    fn drop(&mut self) {
        cmd::run_ignoring_failure("umount", &[MOUNT]);
        let _ = fs::remove_dir(MOUNT);
    }
}

#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn a_mounted_namespace_grows_online_to_what_every_controller_reports() {
    require_vm();
    let mut target = Target::builder()
        .namespace(64 * MIB)
        .build()
        .expect("nvmet target");
    let nqn = target.nqn().to_owned();
    let _cleanup = Disconnect(nqn.clone());
    let (code, a, out) = attach(&nqn, 1);
    assert_eq!(code, Some(0), "{}", describe(&out));
    let head = a["devices"][0]["name"].as_str().unwrap().to_owned();
    let dev = format!("/dev/{head}");
    cmd::run("mkfs.ext4", &["-q", "-F", &dev]).expect("mkfs.ext4");
    fs::create_dir_all(MOUNT).unwrap();
    let _unmount = Unmount;
    cmd::run("mount", &[&dev, MOUNT]).expect("mount");
    let data = random(4 << 20, 21);
    fs::write(format!("{MOUNT}/data"), &data).unwrap();
    cmd::run("sync", &[]).unwrap();

    // Already the size asked for: nothing is rescanned.
    let (code, r, out) = resize(&nqn, 1, Some(64 * MIB));
    assert_eq!(code, Some(0), "{}", describe(&out));
    assert_eq!(r["result"]["rescanned"], false, "{r}");
    assert_eq!(r["result"]["changed"], false, "{r}");
    let reported = r["result"]["nvme"]["reported"].as_array().unwrap();
    assert_eq!(reported.len(), 2, "both controllers answer Identify: {r}");
    assert!(reported.iter().all(|c| c["size"] == 64 * MIB), "{r}");

    // The array grows the namespace; the resize waits until the head has what both
    // controllers report.
    target.grow(1, 96 * MIB).expect("grow the namespace");
    let (code, r, out) = resize(&nqn, 1, Some(96 * MIB));
    assert_eq!(code, Some(0), "{}", describe(&out));
    assert_eq!(r["result"]["size"], 96 * MIB, "{r}");
    assert_eq!(block_bytes(&head), 96 * MIB);
    let reported = r["result"]["nvme"]["reported"].as_array().unwrap();
    assert!(reported.iter().all(|c| c["size"] == 96 * MIB), "{r}");
    cmd::run("resize2fs", &[&dev]).expect("resize2fs");

    // Grown again and asked without a size: the controllers' answer is the size.
    target.grow(1, 128 * MIB).expect("grow the namespace");
    let (code, r, out) = resize(&nqn, 1, None);
    assert_eq!(code, Some(0), "{}", describe(&out));
    assert_eq!(r["result"]["size"], 128 * MIB, "{r}");
    assert_eq!(block_bytes(&head), 128 * MIB);
    cmd::run("resize2fs", &[&dev]).expect("resize2fs");
    let fs_bytes = {
        let out = cmd::run("stat", &["-f", "-c", "%b %S", MOUNT]).expect("stat -f");
        let v: Vec<u64> = out.split_whitespace().map(|v| v.parse().unwrap()).collect();
        v[0] * v[1]
    };
    assert!(
        fs_bytes > 96 * MIB,
        "ext4 did not grow past 96 MiB: {fs_bytes} bytes"
    );
    // Grown without a notice: only lunkit's Identify makes nvmet look at the file, so the
    // head is still short when the resize finds out, and it rescans the controllers.
    target.grow_quietly(1, 160 * MIB).expect("grow the file");
    assert_eq!(block_bytes(&head), 128 * MIB);
    let (code, r, out) = resize(&nqn, 1, None);
    assert_eq!(code, Some(0), "{}", describe(&out));
    assert_eq!(r["result"]["size"], 160 * MIB, "{r}");
    assert_eq!(r["result"]["rescanned"], true, "{r}");
    assert_eq!(r["result"]["changed"], true, "{r}");
    assert_eq!(block_bytes(&head), 160 * MIB);
    cmd::run("resize2fs", &[&dev]).expect("resize2fs");

    // What was written before is what the device gives back, not what the cache kept.
    fs::write("/proc/sys/vm/drop_caches", "3").unwrap();
    assert!(
        fs::read(format!("{MOUNT}/data")).unwrap() == data,
        "the file changed across the resizes"
    );

    // A controller that lost its port cannot be asked: refused, naming it, nothing written.
    let second = target.ports()[1].id;
    target.remove_port(second).expect("remove a port");
    wait_links_lost(&nqn, 1);
    let (code, r, out) = resize(&nqn, 1, Some(160 * MIB));
    assert_eq!(code, Some(1), "{}", describe(&out));
    let err = r["error"].as_str().unwrap_or_default();
    assert!(err.contains("controller nvme"), "{r}");
    assert_eq!(block_bytes(&head), 160 * MIB);

    drop(_unmount);
    let (code, _, out) = detach(&nqn, 1);
    assert_eq!(code, Some(0), "{}", describe(&out));
    assert_eq!(controllers(&nqn), Vec::<String>::new());
    // The flushed ext4 is on the target: its superblock magic, 0xEF53 at byte 1080.
    assert_eq!(target.read(1, 1080, 2).unwrap(), [0x53, 0xef]);
    target.teardown().expect("target teardown");
}

/// Opens `argv[1]` read-only, starts a thread that keeps running, says `ready`, then ends its
/// main thread alone (`exit(2)`, not `exit_group(2)`: syscall 60 on x86_64). The process
/// lives on with a zombie leader whose `/proc/PID/fd` is empty, while the other thread still
/// holds the descriptor in the table they shared.
const ZOMBIE_LEADER_PY: &str = "\
import ctypes, os, sys, threading, time
fd = os.open(sys.argv[1], os.O_RDONLY)
threading.Thread(target=time.sleep, args=(3600,)).start()
print('ready', flush=True)
ctypes.CDLL(None).syscall(60, 0)
";

/// Kills (SIGKILL: the whole thread group) and reaps the child, even when an assertion failed.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn a_namespace_a_process_holds_after_its_main_thread_exited_is_refused() {
    require_vm();
    let target = Target::builder()
        .namespace(32 * MIB)
        .build()
        .expect("nvmet target");
    let nqn = target.nqn().to_owned();
    let _cleanup = Disconnect(nqn.clone());
    let (code, a, out) = attach(&nqn, 1);
    assert_eq!(code, Some(0), "{}", describe(&out));
    let dev = a["devices"][0]["path"].as_str().unwrap().to_owned();

    let mut child = Command::new("python3")
        .args(["-c", ZOMBIE_LEADER_PY, &dev])
        .stdout(Stdio::piped())
        .spawn()
        .expect("run python3");
    let mut ready = [0u8; 6];
    child
        .stdout
        .take()
        .unwrap()
        .read_exact(&mut ready)
        .expect("the holder says ready");
    assert_eq!(&ready, b"ready\n");
    let pid = child.id();
    let holder = KillOnDrop(child);
    wait::until_true(
        "the holder's main thread to exit",
        Duration::from_secs(30),
        || {
            fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| s.rsplit_once(") ").map(|(_, r)| r.starts_with('Z')))
                .unwrap_or(false)
        },
    )
    .unwrap();
    assert_eq!(
        fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count(),
        0,
        "a zombie leader's fd/ is empty: the descriptor is only in its threads' task/*/fd"
    );

    let (code, d, out) = detach(&nqn, 1);
    assert_eq!(code, Some(4), "{}", describe(&out));
    let err = d["error"].as_str().unwrap_or_default();
    assert!(err.contains(&format!("pid {pid}")), "{d}");
    assert_eq!(
        controllers(&nqn).len(),
        2,
        "a refused detach changed something"
    );

    drop(holder);
    let (code, _, out) = detach(&nqn, 1);
    assert_eq!(code, Some(0), "{}", describe(&out));
    assert_eq!(controllers(&nqn), Vec::<String>::new());
    target.teardown().expect("target teardown");
}

/// Issue 33: a namespace attached while another of its subsystem is being detached keeps the
/// controllers. The attach of namespace 2 holds the subsystem's lock while it waits for the
/// namespace to appear (it is added on the target only once the detach of namespace 1 waits
/// for that lock too), and marks it before it lets go: the detach decides after it, and
/// keeps both controllers. Then namespace 2 goes away on the target, its mark staying: a
/// marked namespace that is not on the node still keeps them, until it is detached.
#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn a_namespace_attached_while_another_is_detaching_keeps_the_controllers() {
    require_vm();
    let mut target = Target::builder()
        .namespace(32 * MIB)
        .build()
        .expect("nvmet target");
    let nqn = target.nqn().to_owned();
    let _cleanup = Disconnect(nqn.clone());
    let (code, _, out) = attach(&nqn, 1);
    assert_eq!(code, Some(0), "{}", describe(&out));
    let lock = subsystem_lock(&nqn);

    let attaching = spawn("attach", &nqn, 2);
    wait::until_true(
        "the attach of namespace 2 to hold the lock",
        Duration::from_secs(60),
        || holds_flock(attaching.pid(), &lock),
    )
    .unwrap();
    let detaching = spawn("detach", &nqn, 1);
    wait::until_true(
        "the detach of namespace 1 to wait for it",
        Duration::from_secs(60),
        || has_open(detaching.pid(), &lock),
    )
    .unwrap();
    target.add_namespace(2, 48 * MIB).expect("add namespace 2");
    let data = random(64 << 10, 33);
    target.write(2, 0, &data).unwrap();

    let attached = attaching.wait(Duration::from_secs(120));
    assert_eq!(attached.code(), Some(0), "{}", attached.describe());
    let detached = detaching.wait(Duration::from_secs(120));
    assert_eq!(detached.code(), Some(0), "{}", detached.describe());
    let two: Value = serde_json::from_str(&attached.stdout).unwrap();
    let d: Value = serde_json::from_str(&detached.stdout).unwrap();
    let dev2 = two["devices"][0]["name"].as_str().unwrap().to_owned();
    let kept = steps(&d, "delete-controller");
    assert_eq!(kept.len(), 2, "{d}");
    assert!(
        kept.iter()
            .all(|(_, o, why)| *o == "skipped" && why.contains(&dev2)),
        "{d}"
    );
    let live = |nqn: &str| {
        controllers(nqn)
            .iter()
            .filter(|c| {
                sysfs::attr(format!("/sys/class/nvme/{c}/state")).as_deref() == Some("live")
            })
            .count()
    };
    assert_eq!(live(&nqn), 2);
    assert!(read_direct(&format!("/dev/{dev2}"), data.len()) == data);

    // Gone on the target, still marked: namespace 1's detach keeps the controllers for it.
    target.remove_namespace(2).expect("remove namespace 2");
    wait::until_true(
        "namespace 2 to leave the node",
        Duration::from_secs(60),
        || !heads().contains(&dev2),
    )
    .unwrap();
    let (code, d, out) = detach(&nqn, 1);
    assert_eq!(code, Some(0), "{}", describe(&out));
    let kept = steps(&d, "delete-controller");
    assert_eq!(kept.len(), 2, "{d}");
    assert!(
        kept.iter()
            .all(|(_, o, why)| *o == "skipped" && why.contains("namespace 2 (not on the node")),
        "{d}"
    );
    assert_eq!(live(&nqn), 2);
    // Its detach takes the mark away; then namespace 1's takes the controllers.
    let (code, _, out) = detach(&nqn, 2);
    assert_eq!(code, Some(0), "{}", describe(&out));
    let (code, d, out) = detach(&nqn, 1);
    assert_eq!(code, Some(0), "{}", describe(&out));
    assert!(
        steps(&d, "delete-controller")
            .iter()
            .all(|(_, o, _)| *o == "done"),
        "{d}"
    );
    assert_eq!(controllers(&nqn), Vec::<String>::new());
    target.teardown().expect("target teardown");
}

/// Issue 33: a detach decides whether the namespace is in use only once it holds the
/// subsystem's lock. The test holds that lock, starts the detach, mounts the namespace
/// while the detach waits for it, and lets go: the detach refuses, naming the mount.
#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn a_namespace_mounted_while_its_detach_waits_for_the_lock_is_refused() {
    require_vm();
    let target = Target::builder()
        .namespace(64 * MIB)
        .build()
        .expect("nvmet target");
    let nqn = target.nqn().to_owned();
    let _cleanup = Disconnect(nqn.clone());
    let (code, a, out) = attach(&nqn, 1);
    assert_eq!(code, Some(0), "{}", describe(&out));
    let dev = a["devices"][0]["path"].as_str().unwrap().to_owned();
    cmd::run("mkfs.ext4", &["-q", "-F", &dev]).expect("mkfs");
    fs::create_dir_all(MOUNT).unwrap();

    let lock = subsystem_lock(&nqn);
    let held = HeldLock::take(&lock);
    let detaching = spawn("detach", &nqn, 1);
    wait::until_true(
        "the detach to wait for the lock",
        Duration::from_secs(60),
        || has_open(detaching.pid(), &lock),
    )
    .unwrap();
    cmd::run("mount", &[&dev, MOUNT]).expect("mount");
    drop(held);
    let detached = detaching.wait(Duration::from_secs(120));
    let _ = cmd::run("umount", &[MOUNT]);
    assert_eq!(detached.code(), Some(4), "{}", detached.describe());
    let d: Value = serde_json::from_str(&detached.stdout).unwrap();
    assert!(d["error"].as_str().unwrap().contains(MOUNT), "{d}");
    assert_eq!(controllers(&nqn).len(), 2, "a refusal changed something");

    let (code, _, out) = detach(&nqn, 1);
    assert_eq!(code, Some(0), "{}", describe(&out));
    assert_eq!(controllers(&nqn), Vec::<String>::new());
    let _ = fs::remove_dir(MOUNT);
    target.teardown().expect("target teardown");
}

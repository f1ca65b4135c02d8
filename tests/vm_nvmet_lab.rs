//! VM test of the NVMe/TCP lab itself (`support::nvmet`): an nvmet subsystem on two TCP ports
//! serves one namespace over two paths to the host's native multipath, with the identity and
//! size the fixture set, and everything goes away again. The host side is plain std::fs on
//! /dev/nvme-fabrics and sysfs, the lab's ground truth, not the lunkit library.
//!
//! Run by `cargo xtask test` inside the QEMU guest (ignored on the host).
//!
//! What the Debian 6.1 kernel (6.1.0-56-amd64, CONFIG_NVME_MULTIPATH=y) does, as this test
//! found it under TCG; the test asserts the behaviour and prints the timings:
//!
//! - Reading /dev/nvme-fabrics on a fresh open, before any write, returns one line: the
//!   options the kernel parses, behind a `instance=-1,cntlid=-1,` prefix. 6.1 returns exactly
//!   `instance=-1,cntlid=-1,transport=%s,traddr=%s,trsvcid=%s,nqn=%s,queue_size=%d,nr_io_queues=%d,reconnect_delay=%d,ctrl_loss_tmo=%d,keep_alive_tmo=%d,hostnqn=%s,host_traddr=%s,host_iface=%s,hostid=%s,duplicate_connect,disable_sqflow,hdr_digest,data_digest,nr_write_queues=%d,nr_poll_queues=%d,tos=%d,fast_io_fail_tmo=%d,discovery,dhchap_secret=%s,dhchap_ctrl_secret=%s\n`
//!   (no `tls`, `keyring`, `tls_key` or `concat` yet). A reader can tell the supported
//!   options from it, but `%s`/`%d` tokens are not a grammar to rely on.
//! - A connect is one write(2) of the whole option string on an fd opened read-write; the
//!   reply is read from the same fd afterwards: `instance=0,cntlid=1\n` (decimal, newline
//!   terminated). `instance` is the N of /sys/class/nvme/nvmeN. The write returns only once
//!   the controller is `live` (admin and I/O queues connected); the namespaces appear after,
//!   from the controller's asynchronous scan, so a caller waits for the block devices.
//!   Under TCG a connect took 0.27 to 0.78 s over two runs, and the head with both paths was
//!   there 13 to 42 ms after the second connect returned.
//! - A second connect with the same transport, address, port, subsystem NQN, host NQN and
//!   hostid fails with EALREADY (errno 114, "Operation already in progress") unless
//!   `duplicate_connect` is given, and creates nothing. It took 0.33 to 0.71 s, as long as
//!   a connect (probably because every write first runs `request_module("nvme-tcp")`, a
//!   modprobe, slow under TCG). A read on the same fd after a failed write returns the
//!   options line again (`instance=-1,cntlid=-1,transport=%s,...`), as if nothing had been
//!   written.
//! - A connect to a port nobody listens on fails with ECONNREFUSED (errno 111, "Connection
//!   refused") after 0.32 to 0.65 s under TCG (dmesg: `nvme nvmeN: failed to connect
//!   socket: -111`). The kernel does not retry the first connect, and the instance number is
//!   freed again.
//! - Native multipath names the head `nvme<S>n<H>` (S = the nvme-subsystem instance, H = the
//!   head instance, not the nsid) and each path `nvme<S>c<C>n<H>` (C = the controller
//!   instance). Paths are in /sys/block with `hidden` = 1 and no /dev node; the head has
//!   `hidden` = 0 and is the only one in /dev. The head's directory has no links to its paths
//!   (`slaves` and `holders` are empty): the paths are found under /sys/class/nvme/nvmeC/
//!   (`nvme<S>c<C>n<H>`) and the heads under /sys/class/nvme-subsystem/nvme-subsysS/.
//! - `wwid` is `uuid.<device_uuid>` on the head and on each path when the namespace has a
//!   UUID; `uuid` and `nguid` print the configfs values in UUID form. `ana_state` and
//!   `ana_grpid` exist on the paths only. `serial` is the subsystem's `attr_serial` padded
//!   with spaces to 20 characters.
//! - On the target, a subsystem that a port links cannot be removed (rmdir: EBUSY): links
//!   first. `revalidate_size` is write-only; writing 1 after growing the file makes connected
//!   hosts rescan (`detected capacity change`): the head had the new size 70 ms later. A
//!   namespace added at runtime was a disk on the host 90 ms later; one removed was gone
//!   0.2 s later. Removing a port (unlinking the subsystem) put the host's controller on
//!   that path into `connecting` within 0.1 s while the other stayed `live`; with
//!   `ctrl_loss_tmo=5,reconnect_delay=1` the controller was deleted 5.3 s later.
//! - nvmet refuses an `allowed_hosts` link while `attr_allow_any_host` is 1 (EINVAL).
//! - 127.0.0.2 needs no address on `lo`: all of 127/8 is `local` there. nvmet binds it and
//!   the host connects to it from source 127.0.0.1 (`address` reads
//!   `traddr=127.0.0.2,trsvcid=4420,src_addr=127.0.0.1`).

use lunkit_lab as support;

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

use support::nvmet::{PortConfig, Target};
use support::{require_vm, sysfs, wait};

const FABRICS: &str = "/dev/nvme-fabrics";
const HOSTNQN: &str = "nqn.2014-08.org.lunkit:host-lab";
const HOSTID: &str = "5e7a0000-0000-4000-8000-00000000b057";
const MIB: u64 = 1 << 20;
const SIZE: u64 = 64 * MIB;
/// Under TCG a controller's namespace scan and udev's handling of the disks take seconds.
const APPEAR: Duration = Duration::from_secs(60);
const BLOCK: usize = 4096;

/// The option string of a connect to `nqn` at `traddr:trsvcid`, as this host.
fn options(nqn: &str, traddr: &str, trsvcid: &str) -> String {
    format!(
        "transport=tcp,traddr={traddr},trsvcid={trsvcid},nqn={nqn},hostnqn={HOSTNQN},hostid={HOSTID}"
    )
}

/// One connect: `options` written in one write(2) on a read-write open of /dev/nvme-fabrics,
/// then the reply read from the same fd. On a failed write, the error and what a read on
/// that fd returns after it.
fn fabrics_connect(options: &str) -> Result<String, (io::Error, String)> {
    let mut dev = OpenOptions::new()
        .read(true)
        .write(true)
        .open(FABRICS)
        .unwrap_or_else(|e| panic!("open {FABRICS}: {e}"));
    let written = dev.write(options.as_bytes());
    let mut reply = String::new();
    let read = dev.read_to_string(&mut reply);
    match written {
        Ok(n) => {
            assert_eq!(n, options.len(), "short write of {options:?}");
            read.unwrap_or_else(|e| panic!("read the reply to {options:?}: {e}"));
            Ok(reply)
        }
        Err(e) => Err((e, reply)),
    }
}

/// `(instance, cntlid)` from a reply `instance=N,cntlid=M\n`.
fn parse_reply(reply: &str) -> (u32, u32) {
    let field = |key: &str| {
        reply
            .trim_end()
            .split(',')
            .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {key} in connect reply {reply:?}"))
    };
    (field("instance"), field("cntlid"))
}

/// A host controller this test connected. Deleted on drop unless the test deleted it: a
/// failed assertion must not leave it reconnecting to a target that is gone (the runner's
/// reset would delete it too, as a leak).
struct Controller {
    name: String,
}

impl Controller {
    fn connect(nqn: &str, port: &PortConfig) -> Controller {
        let opts = options(nqn, &port.traddr, &port.trsvcid);
        let start = Instant::now();
        let reply = fabrics_connect(&opts)
            .unwrap_or_else(|(e, _)| panic!("connect {opts:?}: {e} ({:?})", e.raw_os_error()));
        let (instance, cntlid) = parse_reply(&reply);
        eprintln!(
            "connected to {}:{} in {:?}: reply {reply:?}",
            port.traddr,
            port.trsvcid,
            start.elapsed()
        );
        let c = Controller {
            name: format!("nvme{instance}"),
        };
        assert_eq!(c.attr("cntlid"), cntlid.to_string(), "{}", c.name);
        c
    }

    fn dir(&self) -> String {
        format!("/sys/class/nvme/{}", self.name)
    }

    fn attr(&self, name: &str) -> String {
        let path = format!("{}/{name}", self.dir());
        sysfs::attr(&path).unwrap_or_else(|| panic!("cannot read {path}"))
    }

    /// The instance C of `nvmeC`.
    fn instance(&self) -> u32 {
        sysfs::number_after(&self.name, "nvme").expect("nvmeN")
    }

    /// Deletes it (`delete_controller`, synchronous) and waits until its sysfs entry is gone.
    fn delete(mut self) {
        let name = std::mem::take(&mut self.name);
        let path = format!("/sys/class/nvme/{name}/delete_controller");
        fs::write(&path, "1").unwrap_or_else(|e| panic!("write 1 to {path}: {e}"));
        let gone = || !Path::new(&format!("/sys/class/nvme/{name}")).exists();
        wait::until_true(&format!("{name} to go"), APPEAR, gone).unwrap();
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        if !self.name.is_empty() {
            let _ = fs::write(format!("{}/delete_controller", self.dir()), "1");
        }
    }
}

/// What the host shows for one namespace: the nvme-subsystem instance, the head disk and its
/// hidden path disks.
#[derive(Debug)]
struct Multipath {
    subsystem: String,
    head: String,
    paths: Vec<String>,
}

/// The nvme-subsystem whose `subsysnqn` is `nqn` (`nvme-subsysS`), once it exists.
fn subsystem_of(nqn: &str) -> Option<String> {
    sysfs::names("/sys/class/nvme-subsystem")
        .into_iter()
        .find(|s| {
            sysfs::attr(format!("/sys/class/nvme-subsystem/{s}/subsysnqn")).as_deref() == Some(nqn)
        })
}

/// The head of namespace `nsid` of `nqn` with one path per controller of `ctrls`, once the
/// controllers' scans made all of them; `None` until then.
fn multipath_of(nqn: &str, nsid: u32, ctrls: &[&Controller]) -> Option<Multipath> {
    let subsystem = subsystem_of(nqn)?;
    let s = sysfs::number_after(&subsystem, "nvme-subsys")?;
    let head = sysfs::names(format!("/sys/class/nvme-subsystem/{subsystem}"))
        .into_iter()
        .filter(|n| n.starts_with(&format!("nvme{s}n")))
        .find(|n| sysfs::attr(format!("/sys/block/{n}/nsid")) == Some(nsid.to_string()))?;
    let h = head.rsplit_once('n')?.1;
    let paths: Vec<String> = ctrls
        .iter()
        .map(|c| format!("nvme{s}c{}n{h}", c.instance()))
        .collect();
    // Each path is a block device and a child of its controller.
    let all_there = paths.iter().zip(ctrls).all(|(p, c)| {
        Path::new(&format!("/sys/block/{p}")).exists()
            && Path::new(&format!("{}/{p}", c.dir())).exists()
    });
    all_there.then_some(Multipath {
        subsystem,
        head,
        paths,
    })
}

/// A block device's attribute, which must be there.
fn block_attr(disk: &str, name: &str) -> String {
    let path = format!("/sys/block/{disk}/{name}");
    sysfs::attr(&path).unwrap_or_else(|| panic!("cannot read {path}"))
}

/// A 4 KiB-aligned block inside `buf` (O_DIRECT wants aligned memory).
fn aligned(buf: &mut Vec<u8>) -> &mut [u8] {
    buf.resize(2 * BLOCK, 0);
    let off = buf.as_ptr().align_offset(BLOCK);
    &mut buf[off..off + BLOCK]
}

/// Opens the head with O_DIRECT: reads and writes reach the target, not the host's page
/// cache (udev's probe of the new disk filled it with what it read).
fn open_direct(dev: &str) -> File {
    OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(dev)
        .unwrap_or_else(|e| panic!("open {dev} O_DIRECT: {e}"))
}

#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn nvmet_lab_serves_two_paths_and_tears_down_clean() {
    require_vm();
    let target = Target::builder().namespace(SIZE).build().unwrap();
    let nqn = target.nqn().to_owned();
    let ns = target.namespace(1).unwrap().clone();
    assert_eq!(fs::metadata(&ns.file).unwrap().len(), SIZE, "{:?}", ns.file);

    // Before any write, a read says which options this kernel parses.
    let mut before = String::new();
    File::open(FABRICS)
        .and_then(|mut f| f.read_to_string(&mut before))
        .unwrap_or_else(|e| panic!("read {FABRICS}: {e}"));
    eprintln!("{FABRICS} before a write: {before:?}");
    assert!(before.starts_with("instance=-1,cntlid=-1,"), "{before:?}");
    for token in ["transport=%s", "nqn=%s", "hostnqn=%s", "hostid=%s"] {
        assert!(before.contains(token), "{token} not in {before:?}");
    }

    let ports = target.ports().to_vec();
    assert_eq!(ports.len(), 2, "{ports:?}");
    let first = Controller::connect(&nqn, &ports[0]);

    // The same connect again: refused, nothing created.
    let start = Instant::now();
    let (e, after) = fabrics_connect(&options(&nqn, &ports[0].traddr, &ports[0].trsvcid))
        .expect_err("a duplicate connect must fail");
    eprintln!(
        "duplicate connect: {e} ({:?}) after {:?}; read after it: {after:?}",
        e.raw_os_error(),
        start.elapsed()
    );
    assert_eq!(e.raw_os_error(), Some(libc::EALREADY), "{e}");
    assert!(after.starts_with("instance=-1,cntlid=-1,"), "{after:?}");

    // A port nobody listens on.
    let start = Instant::now();
    let (e, _) = fabrics_connect(&options(&nqn, "127.0.0.1", "4499"))
        .expect_err("a connect to a closed port must fail");
    eprintln!(
        "connect to a closed port: {e} ({:?}) after {:?}",
        e.raw_os_error(),
        start.elapsed()
    );
    assert_eq!(e.raw_os_error(), Some(libc::ECONNREFUSED), "{e}");

    let second = Controller::connect(&nqn, &ports[1]);
    for (c, port) in [(&first, &ports[0]), (&second, &ports[1])] {
        assert_eq!(c.attr("transport"), "tcp");
        let address = c.attr("address");
        let want = format!("traddr={},trsvcid={}", port.traddr, port.trsvcid);
        assert!(
            address.starts_with(&want),
            "{}: address {address:?}",
            c.name
        );
        assert_eq!(c.attr("state"), "live", "{}", c.name);
        assert_eq!(c.attr("subsysnqn"), nqn);
        assert_eq!(c.attr("hostnqn"), HOSTNQN);
        assert_eq!(c.attr("hostid"), HOSTID);
        assert_eq!(c.attr("serial").trim_end(), target.serial());
    }

    let start = Instant::now();
    let mp = wait::until("the multipath head and its two paths", APPEAR, || {
        Ok(multipath_of(&nqn, 1, &[&first, &second]))
    })
    .unwrap();
    eprintln!(
        "{mp:?} complete {:?} after the second connect",
        start.elapsed()
    );
    let subsys = format!("/sys/class/nvme-subsystem/{}", mp.subsystem);
    let members = sysfs::names(&subsys);
    for c in [&first, &second] {
        assert!(
            members.contains(&c.name),
            "{} not in {subsys}: {members:?}",
            c.name
        );
    }
    eprintln!(
        "iopolicy {}",
        sysfs::attr(format!("{subsys}/iopolicy")).unwrap_or_default()
    );

    // The head: visible, the namespace's size and identity.
    assert_eq!(block_attr(&mp.head, "hidden"), "0", "{}", mp.head);
    let sectors: u64 = block_attr(&mp.head, "size").parse().unwrap();
    assert_eq!(sectors * 512, SIZE, "{} size", mp.head);
    assert_eq!(sectors * 512, fs::metadata(&ns.file).unwrap().len());
    let wwid = block_attr(&mp.head, "wwid");
    assert!(wwid.starts_with("uuid."), "{}: wwid {wwid:?}", mp.head);
    assert!(
        wwid.contains(&ns.uuid),
        "{}: wwid {wwid:?}, uuid {}",
        mp.head,
        ns.uuid
    );
    assert_eq!(block_attr(&mp.head, "uuid"), ns.uuid);
    assert_eq!(block_attr(&mp.head, "nguid"), ns.nguid);
    assert!(
        Path::new(&format!("/dev/{}", mp.head)).exists(),
        "/dev/{}",
        mp.head
    );

    // The paths: hidden, one per controller, the same namespace.
    for (path, c) in mp.paths.iter().zip([&first, &second]) {
        assert_eq!(block_attr(path, "hidden"), "1", "{path}");
        assert_eq!(block_attr(path, "nsid"), "1", "{path}");
        assert_eq!(block_attr(path, "wwid"), wwid, "{path}");
        assert_eq!(block_attr(path, "size"), sectors.to_string(), "{path}");
        let ctrl = sysfs::link_name(format!("/sys/block/{path}/device"));
        assert_eq!(ctrl.as_deref(), Some(c.name.as_str()), "{path}/device");
        eprintln!("{path}: ana_state {}", block_attr(path, "ana_state"));
    }

    // Data both ways: the host's write lands in the file, the file's bytes reach the host.
    let dev = open_direct(&format!("/dev/{}", mp.head));
    let mut buf = Vec::new();
    let block = aligned(&mut buf);
    block.fill(0xa5);
    dev.write_all_at(block, MIB)
        .expect("write through the head");
    dev.sync_all().expect("flush the head");
    assert!(
        target
            .read(1, MIB, BLOCK)
            .unwrap()
            .iter()
            .all(|b| *b == 0xa5),
        "the host's write is not in {:?}",
        ns.file
    );
    target.write(1, 2 * MIB, &[0x3c; BLOCK]).unwrap();
    dev.read_exact_at(block, 2 * MIB)
        .expect("read through the head");
    assert!(
        block.iter().all(|b| *b == 0x3c),
        "the file's bytes did not reach the host"
    );
    drop(dev);

    first.delete();
    second.delete();
    let head = format!("/sys/block/{}", mp.head);
    wait::until_true(&format!("{head} to go"), APPEAR, || {
        !Path::new(&head).exists() && subsystem_of(&nqn).is_none()
    })
    .unwrap();
    for path in &mp.paths {
        assert!(
            !Path::new(&format!("/sys/block/{path}")).exists(),
            "{path} left"
        );
    }

    let dir = ns.file.parent().unwrap().to_owned();
    target.teardown().unwrap();
    assert!(
        !Path::new(&format!("/sys/kernel/config/nvmet/subsystems/{nqn}")).exists(),
        "the subsystem is still in configfs"
    );
    assert!(!dir.exists(), "{} left", dir.display());
}

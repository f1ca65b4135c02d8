//! Block operations on a real kernel: loop devices on the host (they need no SCSI).
//!
//! Needs root (losetup, BLKFLSBUF, mount). Each test sets up its own loop device over a file
//! in a temp directory and detaches it on drop.
#![allow(clippy::disallowed_methods)]

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use lunkit::block::{self, UsageScope};
use lunkit::{ErrorKind, Root};
use lunkit_lab::cli::random;

/// `block::usage` of `node`, less what this sandbox cannot see: root without
/// `CAP_SYS_PTRACE` (a container) may not look at the fds of processes with more
/// capabilities than its own (pid 1 here), which the check reports as "could not check pid
/// N". Those are not the processes these tests make; anything else unchecked fails.
fn usage_here(root: &Root, node: &block::BlockNode, scope: &UsageScope<'_>) -> block::Usage {
    let mut u = block::usage(root, std::slice::from_ref(node), scope, deadline()).unwrap();
    for c in &u.unchecked {
        assert!(
            c.what.starts_with("pid ")
                && c.what != format!("pid {}", std::process::id())
                && c.reason.contains("Permission denied"),
            "{u}"
        );
    }
    u.unchecked.clear();
    u
}

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

macro_rules! require_root {
    () => {
        if !is_root() {
            eprintln!("skipped: needs root for loop devices");
            return;
        }
    };
}

fn run(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A loop device over a fresh zeroed file; detached (and unmounted, swapped off) on drop.
struct Loop {
    dir: PathBuf,
    backing: PathBuf,
    dev: String,
    mount: Option<PathBuf>,
    swap: bool,
}

/// Held while `losetup --find` runs. Two at once race for the same free device: the loser
/// opens it, tries to bind it, gets EBUSY and moves on, and for that moment it holds open
/// (and the kernel claims) a device the winner's test may already be checking for users.
static LOSETUP: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl Loop {
    fn new(tag: &str, size: u64) -> Loop {
        let _one_at_a_time = LOSETUP
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let dir = std::env::temp_dir().join(format!("lunkit-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let backing = dir.join("backing.img");
        File::create(&backing).unwrap().set_len(size).unwrap();
        let dev = run("losetup", &["--find", "--show", backing.to_str().unwrap()])
            .trim()
            .to_owned();
        Loop {
            dir,
            backing,
            dev,
            mount: None,
            swap: false,
        }
    }

    fn node(&self) -> block::BlockNode {
        block::resolve(&Root::default(), &self.dev)
            .unwrap()
            .unwrap()
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        if let Some(m) = &self.mount {
            let _ = Command::new("umount").arg(m).status();
        }
        if self.swap {
            let _ = Command::new("swapoff").arg(&self.dev).status();
        }
        let _ = Command::new("losetup").args(["-d", &self.dev]).status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn read_at(path: &Path, len: usize) -> Vec<u8> {
    let mut buf = vec![0; len];
    File::open(path).unwrap().read_exact(&mut buf).unwrap();
    buf
}

fn deadline() -> Instant {
    Instant::now() + Duration::from_secs(30)
}

#[test]
fn flush_writes_back_and_drops_the_cache() {
    require_root!();
    let lo = Loop::new("flush", 8 << 20);
    let node = lo.node();
    let p = random(4 << 20, 1);
    // Keep the writer open: the last close of a block device syncs and drops its cache by
    // itself, which would hide whether flush did anything.
    let mut w = OpenOptions::new().write(true).open(&lo.dev).unwrap();
    w.write_all(&p).unwrap();
    assert_ne!(
        read_at(&lo.backing, p.len()),
        p,
        "the pages should still be dirty in the loop device's cache before the flush"
    );

    block::flush(&node, deadline()).unwrap();
    assert_eq!(
        read_at(&lo.backing, p.len()),
        p,
        "after flush the backing file holds what was written"
    );

    // BLKFLSBUF also invalidated the device's cache: change the backing file underneath and
    // the device must show the new bytes, not cached old ones (fsync alone would keep them).
    let q = random(4 << 20, 2);
    let b = OpenOptions::new().write(true).open(&lo.backing).unwrap();
    b.write_all_at(&q, 0).unwrap();
    b.sync_all().unwrap();
    assert_eq!(read_at(Path::new(&lo.dev), q.len()), q);
    drop(w);
}

#[test]
fn size_and_block_size_come_from_the_kernel() {
    require_root!();
    let lo = Loop::new("size", 3 << 20);
    let node = lo.node();
    assert_eq!(block::size(&node).unwrap(), 3 << 20);
    // The bounded form answers the same, and its helper closes the device when done.
    assert_eq!(block::size_within(&node, deadline()).unwrap(), 3 << 20);
    assert_eq!(block::logical_block_size(&node).unwrap(), 512);
    // A deadline already past still lets a quick call report, as every helper call does.
    assert_eq!(
        block::size_within(&node, Instant::now()).unwrap(),
        3 << 20,
        "a call that returns at once is not a timeout"
    );
}

#[test]
fn resolve_by_path_name_and_number_agree() {
    require_root!();
    let lo = Loop::new("resolve", 1 << 20);
    let root = Root::default();
    let by_path = block::resolve(&root, &lo.dev).unwrap().unwrap();
    let name = lo.dev.strip_prefix("/dev/").unwrap();
    assert_eq!(by_path.name, name);
    assert_eq!(block::resolve(&root, name).unwrap().unwrap(), by_path);
    assert_eq!(
        block::by_number(&root, by_path.dev).unwrap().unwrap(),
        by_path
    );
    // Gone devices are None, not errors; malformed names are Invalid.
    assert_eq!(
        block::resolve(&root, "/dev/lunkit-no-such-node").unwrap(),
        None
    );
    assert_eq!(block::resolve(&root, "loop999999").unwrap(), None);
    for bad in ["../sda", "a/b", "", "/dev/../etc/passwd"] {
        let e = block::resolve(&root, bad).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Invalid, "{bad}: {e}");
    }
    // Not a block device.
    let e = block::resolve(&root, "/dev/null").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
}

/// Polls `f` for up to 10 s (children take a moment to open what their script opens).
fn wait_for<T>(mut f: impl FnMut() -> Option<T>) -> T {
    let t0 = std::time::Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(10),
            "timed out"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn usage_names_mounts_openers_and_swap() {
    require_root!();
    let root = Root::default();
    let scope = UsageScope::default();

    let mut lo = Loop::new("usage", 32 << 20);
    let node = lo.node();
    let u = usage_here(&root, &node, &scope);
    assert!(u.is_empty(), "{u:?}");

    // An open fd, named by pid.
    let f = File::open(&lo.dev).unwrap();
    let u = usage_here(&root, &node, &scope);
    assert!(u.only_openers(), "{u}");
    assert!(
        u.openers
            .iter()
            .any(|o| o.pid == std::process::id() && o.device == node.name),
        "{u}"
    );
    drop(f);

    // With hundreds of processes the walk is split between threads: openers in several of
    // them, the newest pids last, are all found, each once; a name on the ignore list is not
    // enough to be ignored (any process can take it): the executable must be a path
    // manager's.
    let mut kids: Vec<std::process::Child> = (0..200)
        .map(|i| {
            let script = if i % 50 == 49 {
                format!("exec 3<{}; exec sleep 60", lo.dev)
            } else {
                "exec sleep 60".to_owned()
            };
            Command::new("sh").args(["-c", &script]).spawn().unwrap()
        })
        .collect();
    let holders: Vec<u32> = kids
        .iter()
        .enumerate()
        .filter(|(i, _)| i % 50 == 49)
        .map(|(_, k)| k.id())
        .collect();
    let found = |u: &block::Usage| -> Vec<u32> { u.openers.iter().map(|o| o.pid).collect() };
    let u = wait_for(|| {
        let u = usage_here(&root, &node, &scope);
        (found(&u).len() == holders.len()).then_some(u)
    });
    assert_eq!(found(&u), holders, "{u}");
    assert!(u.openers.iter().all(|o| o.comm == "sleep"), "{u}");
    let ignoring = UsageScope {
        ignore_openers: &["sleep"],
        ..UsageScope::default()
    };
    let u = usage_here(&root, &node, &ignoring);
    assert_eq!(found(&u), holders, "{u}");
    assert!(u.managers.is_empty(), "{u}");
    for k in &mut kids {
        let _ = k.kill();
        let _ = k.wait();
    }

    // A mount, matched by device number, with a space in the mount point.
    run("mkfs.ext4", &["-q", "-F", &lo.dev]);
    let mp = lo.dir.join("mount point");
    std::fs::create_dir_all(&mp).unwrap();
    run("mount", &[&lo.dev, mp.to_str().unwrap()]);
    lo.mount = Some(mp.clone());
    let u = usage_here(&root, &node, &scope);
    assert_eq!(u.mounts.len(), 1, "{u}");
    assert_eq!(u.mounts[0].mount_point, mp);
    assert!(u.to_string().contains("mount point"), "{u}");
    // The refusal carries what was found, and a workflow's step error hands it on.
    let refusal = u.refusal(&node.name).expect("a mounted device is refused");
    assert_eq!(refusal.kind(), lunkit::ErrorKind::Busy, "{refusal}");
    let step = lunkit::Error::Step {
        step: "check-in-use",
        target: node.name.clone(),
        source: Box::new(refusal),
    };
    assert_eq!(step.usage(), Some(&u), "{step}");
    run("umount", &[mp.to_str().unwrap()]);
    lo.mount = None;

    // Active swap (the O_EXCL claim is explained by it, so it is not reported twice).
    run("mkswap", &["-q", &lo.dev]);
    if Command::new("swapon")
        .arg(&lo.dev)
        .status()
        .unwrap()
        .success()
    {
        lo.swap = true;
        let u = usage_here(&root, &node, &scope);
        assert_eq!(u.swaps, std::slice::from_ref(&node.name), "{u}");
        assert!(u.claimed.is_empty(), "{u}");
    } else {
        eprintln!("swapon not permitted here; swap case not checked");
    }
}

/// A claim (`O_EXCL` open) keeps every other exclusive user off the device until dropped: a
/// mount fails while it is held and works after, and a device already mounted refuses the
/// claim with `EBUSY`. Plain opens (the flush's) still work.
#[test]
fn a_claim_keeps_mounts_off_until_dropped() {
    require_root!();
    let mut lo = Loop::new("claim", 32 << 20);
    let node = lo.node();
    run("mkfs.ext4", &["-q", "-F", &lo.dev]);
    let mnt = lo.dir.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();

    let claim = block::try_claim(&node, deadline())
        .unwrap()
        .expect("claimed");
    assert_eq!(claim.node().dev, node.dev);
    let refused = Command::new("mount")
        .arg(&lo.dev)
        .arg(&mnt)
        .output()
        .unwrap();
    assert!(!refused.status.success(), "mounted while claimed");
    block::flush(&node, deadline()).unwrap();
    // A second claim is refused too, as EBUSY, which try_claim passes on.
    let again = block::try_claim(&node, deadline()).unwrap_err();
    assert_eq!(again.errno(), Some(libc::EBUSY), "{again}");
    drop(claim);

    run("mount", &[&lo.dev, mnt.to_str().unwrap()]);
    lo.mount = Some(mnt.clone());
    let e = block::try_claim(&node, deadline()).unwrap_err();
    assert_eq!(e.errno(), Some(libc::EBUSY), "{e}");
}

/// A process that mapped the device and closed its descriptor still holds it (a mapping
/// keeps the file open): the check finds it in `/proc/PID/maps`, names it, and says whether
/// the mapping can write.
#[test]
fn a_device_mapped_after_its_descriptor_closed_is_in_use() {
    require_root!();
    mapped_and_closed("mapped", None);
}

/// The same, mapped below `0x10000000`, where `maps` pads the address with zeros that the
/// mapping's `map_files/` name has not (a non-PIE executable's place, and a 32-bit
/// process's every mapping). The check used to take that mapping for one gone under it.
#[test]
fn a_device_mapped_at_a_low_address_is_in_use() {
    require_root!();
    mapped_and_closed("mapped-low", Some(0x10_0000));
}

/// A Python process maps loop device `tag` shared and writable (at `at`, if given), closes
/// its descriptor, and is found as the device's user until it exits.
fn mapped_and_closed(tag: &str, at: Option<u64>) {
    let root = Root::default();
    let lo = Loop::new(tag, 8 << 20);
    let node = lo.node();
    // MAP_SHARED, or MAP_SHARED | MAP_FIXED_NOREPLACE at a given address.
    let (addr, flags) = match at {
        Some(a) => (a.to_string(), 0x10_0001),
        None => ("None".to_owned(), 1),
    };
    let script = format!(
        "import ctypes, os, time\n\
         libc = ctypes.CDLL(None, use_errno=True)\n\
         libc.mmap.restype = ctypes.c_void_p\n\
         libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, \
         ctypes.c_int, ctypes.c_long]\n\
         fd = os.open({:?}, os.O_RDWR)\n\
         # PROT_READ | PROT_WRITE; Python's own mmap would keep a dup of fd.\n\
         want = {addr}\n\
         got = libc.mmap(want, 4096, 3, {flags}, fd, 0)\n\
         assert got != ctypes.c_void_p(-1).value and want in (None, got), got\n\
         os.close(fd)\n\
         print('ready', flush=True)\n\
         time.sleep(60)\n",
        lo.dev
    );
    let mut child = Command::new("python3")
        .args(["-c", &script])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line.trim(), "ready");
    let u = usage_here(&root, &node, &UsageScope::default());
    let _ = child.kill();
    let _ = child.wait();
    assert!(u.openers.is_empty(), "the descriptor was closed: {u}");
    assert_eq!(u.mapped.len(), 1, "{u}");
    assert_eq!(u.mapped[0].pid, child.id());
    assert!(!u.mapped[0].read_only, "{u}");
    assert!(u.has_users() && !u.only_openers(), "{u}");
    assert!(u.to_string().contains("memory-mapped by pid"), "{u}");
    let u = usage_here(&root, &node, &UsageScope::default());
    assert!(u.is_empty(), "gone with its process: {u}");
}

/// Checks that overlap in time share walks over `/proc` (issue 38): each still finds
/// exactly its own device's holders, and a descriptor opened just before a check asked is
/// seen while other checks keep walks under way. (Which walk a check may take is
/// `helper::shared`'s unit tests; here it is the real walk, matched per device.)
#[test]
fn overlapping_checks_share_walks_and_each_sees_its_own_holders() {
    require_root!();
    let root = Root::default();
    let scope = UsageScope::default();
    let loops: Vec<Loop> = (0..6)
        .map(|i| Loop::new(&format!("shared{i}"), 8 << 20))
        .collect();
    let nodes: Vec<block::BlockNode> = loops.iter().map(Loop::node).collect();
    // Every other device held by a child of its own.
    let mut kids: Vec<(usize, std::process::Child)> = (0..6)
        .step_by(2)
        .map(|i| {
            let script = format!("exec 3<{}; exec sleep 60", loops[i].dev);
            (i, Command::new("sh").args(["-c", &script]).spawn().unwrap())
        })
        .collect();
    let holder = |i: usize| kids.iter().find(|(k, _)| *k == i).map(|(_, c)| c.id());
    wait_for(|| {
        kids.iter()
            .all(|(i, _)| !usage_here(&root, &nodes[*i], &scope).openers.is_empty())
            .then_some(())
    });
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        // Six checks at once, three rounds: each sees its holder and nobody else's.
        let checkers: Vec<_> = (0..6)
            .map(|i| {
                let (root, scope, node) = (&root, &scope, &nodes[i]);
                let want: Vec<u32> = holder(i).into_iter().collect();
                s.spawn(move || {
                    for round in 0..3 {
                        let u = usage_here(root, node, scope);
                        let pids: Vec<u32> = u.openers.iter().map(|o| o.pid).collect();
                        assert_eq!(pids, want, "{} round {round}: {u}", node.name);
                        assert!(u.holders.is_empty() && u.mounts.is_empty(), "{u}");
                    }
                })
            })
            .collect();
        for c in checkers {
            c.join().unwrap();
        }
        // One thread keeps walks under way; the other opens a device, then checks it: the
        // walk it gets started after its open, whatever was running when it asked.
        let busy = s.spawn(|| {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                usage_here(&root, &nodes[0], &scope);
            }
        });
        for round in 0..10 {
            let f = File::open(&loops[1].dev).unwrap();
            let u = usage_here(&root, &nodes[1], &scope);
            assert!(
                u.openers.iter().any(|o| o.pid == std::process::id()),
                "round {round}: the descriptor opened before the check asked was missed: {u}"
            );
            drop(f);
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        busy.join().unwrap();
    });
    for (_, k) in &mut kids {
        let _ = k.kill();
        let _ = k.wait();
    }
}

/// `block::usages` answers several sets in one walk, each as `block::usage` would alone.
#[test]
fn usages_answers_each_set_as_usage_does_alone() {
    require_root!();
    let root = Root::default();
    let loops: Vec<Loop> = (0..3)
        .map(|i| Loop::new(&format!("usages{i}"), 8 << 20))
        .collect();
    let nodes: Vec<block::BlockNode> = loops.iter().map(Loop::node).collect();
    let script = format!("exec 3<{}; exec sleep 60", loops[1].dev);
    let mut kid = Command::new("sh").args(["-c", &script]).spawn().unwrap();
    let scope = UsageScope::default();
    wait_for(|| (!usage_here(&root, &nodes[1], &scope).openers.is_empty()).then_some(()));
    let asks: Vec<block::UsageAsk<'_>> = nodes
        .iter()
        .map(|n| block::UsageAsk {
            devices: std::slice::from_ref(n),
            scope: UsageScope::default(),
        })
        .collect();
    let all = block::usages(&root, &asks, deadline()).unwrap();
    assert_eq!(all.len(), 3);
    let pids = |u: &block::Usage| u.openers.iter().map(|o| o.pid).collect::<Vec<u32>>();
    assert_eq!(pids(&all[1]), [kid.id()], "{}", all[1]);
    for i in [0, 2] {
        assert!(
            all[i].openers.is_empty() && all[i].mounts.is_empty(),
            "{}",
            all[i]
        );
        assert_eq!(pids(&all[i]), pids(&usage_here(&root, &nodes[i], &scope)));
    }
    assert!(block::usages(&root, &[], deadline()).unwrap().is_empty());
    let _ = kid.kill();
    let _ = kid.wait();
}

#[test]
fn read_ends_reads_the_first_and_last_span_and_holds_the_device_as_a_helper() {
    require_root!();
    let span: u64 = 1 << 20;
    let size = 3 * span + 4096;
    let lo = Loop::new("ends", size);
    let head = random(usize::try_from(span).unwrap(), 3);
    let tail = random(usize::try_from(span).unwrap(), 4);
    let b = OpenOptions::new().write(true).open(&lo.backing).unwrap();
    b.write_all_at(&head, 0).unwrap();
    b.write_all_at(&tail, size - span).unwrap();
    b.sync_all().unwrap();
    let node = lo.node();
    let ends = block::read_ends(&node, span, deadline()).unwrap();
    assert_eq!(ends.size, size);
    assert!(
        ends.head == head,
        "the first span is not what the file holds"
    );
    assert!(
        ends.tail == tail,
        "the last span is not what the file holds"
    );
    // A device smaller than the span is read whole, once.
    let ends = block::read_ends(&node, 2 * size, deadline()).unwrap();
    assert_eq!(ends.head.len() as u64, size);
    assert_eq!(ends.head, ends.tail);
    // The read closed what it opened: nothing of this process holds the device now.
    let u = usage_here(&Root::default(), &node, &UsageScope::default());
    assert!(u.is_empty() && u.helpers.is_empty(), "{u}");
    // A node that is not the device it claims to be is refused, not read.
    let mut other = node.clone();
    other.dev.minor += 100_000;
    let e = block::read_ends(&other, span, deadline()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
}

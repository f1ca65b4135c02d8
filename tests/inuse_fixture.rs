//! The in-use check (`block::usage`) on small fake roots: users that only `/proc` and sysfs
//! files show, where no kernel object is needed (issue 12: bind mounts of device nodes, other
//! mount namespaces, unreadable processes, zombie leaders, spoofed path managers, loop
//! devices, malformed mount tables).
//!
//! A fake process's fd is a symlink, which `statx` follows like the kernel's magic link; to
//! make it a block device it points at a real node of this machine, and the fake disk is
//! given that node's number. Tests needing one skip where the machine has none.

mod common;

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::Scratch;
use lunkit::block::{self, BlockNode, UsageScope};
use lunkit::scsi::PATH_MANAGERS;
use lunkit::{DevNum, Root};

/// A deadline no fixture check comes near.
fn far() -> Instant {
    Instant::now() + Duration::from_secs(60)
}

/// A fake root with a disk `sdc` and a multipath map `dm-0`, and no process yet.
struct Tree {
    dir: Scratch,
}

impl Tree {
    fn new(tag: &str, sdc: DevNum) -> Tree {
        let t = Tree {
            dir: Scratch::new(tag),
        };
        t.disk("sdc", sdc, false);
        t.disk(
            "dm-0",
            DevNum {
                major: 253,
                minor: 0,
            },
            true,
        );
        t.write(
            "proc/self/mountinfo",
            b"22 1 8:2 / / rw - ext4 /dev/sda2 rw\n",
        );
        t
    }

    fn root(&self) -> Root {
        Root::new(self.dir.path())
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn write(&self, rel: &str, text: &[u8]) {
        let p = self.path(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, text).unwrap();
    }

    fn link(&self, rel: &str, to: &str) {
        let p = self.path(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        symlink(to, p).unwrap();
    }

    fn disk(&self, name: &str, dev: DevNum, dm: bool) {
        self.write(
            &format!("sys/class/block/{name}/dev"),
            format!("{dev}\n").as_bytes(),
        );
        fs::create_dir_all(self.path(&format!("sys/class/block/{name}/holders"))).unwrap();
        if dm {
            self.write(&format!("sys/class/block/{name}/dm/name"), b"mpatha\n");
        }
    }

    /// A process: its comm, uid 0, its executable, and its fds (name -> link target).
    fn process(&self, pid: u32, comm: &str, exe: &str, fds: &[(&str, &str)]) {
        self.write(&format!("proc/{pid}/comm"), format!("{comm}\n").as_bytes());
        self.write(
            &format!("proc/{pid}/status"),
            format!("Name:\t{comm}\nPPid:\t1\nUid:\t0\t0\t0\t0\n").as_bytes(),
        );
        self.write(
            &format!("proc/{pid}/stat"),
            format!("{pid} ({comm}) S 1 1 1\n").as_bytes(),
        );
        self.link(&format!("proc/{pid}/exe"), exe);
        fs::create_dir_all(self.path(&format!("proc/{pid}/fd"))).unwrap();
        for (fd, to) in fds {
            self.link(&format!("proc/{pid}/fd/{fd}"), to);
            self.write(
                &format!("proc/{pid}/fdinfo/{fd}"),
                b"pos:\t0\nflags:\t0100000\n",
            );
        }
    }

    fn node(&self, name: &str) -> BlockNode {
        block::by_name(&self.root(), name).unwrap().unwrap()
    }

    fn usage(&self, devices: &[&str], own: &[String]) -> block::Usage {
        let nodes: Vec<BlockNode> = devices.iter().map(|d| self.node(d)).collect();
        let scope = UsageScope {
            own,
            ignore_openers: PATH_MANAGERS,
        };
        block::usage(&self.root(), &nodes, &scope, far()).unwrap()
    }
}

const SDC: DevNum = DevNum {
    major: 8,
    minor: 32,
};

/// A block device node of this machine and its number, for fake fds to point at.
fn host_block_device() -> Option<(PathBuf, DevNum)> {
    for e in fs::read_dir("/sys/class/block").ok()?.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let node = Path::new("/dev").join(&name);
        let Ok(dev) = fs::read_to_string(e.path().join("dev")) else {
            continue;
        };
        use std::os::unix::fs::FileTypeExt;
        if fs::metadata(&node).is_ok_and(|m| m.file_type().is_block_device()) {
            if let Ok(d) = dev.trim().parse() {
                return Some((node, d));
            }
        }
    }
    None
}

macro_rules! host_block_device_or_skip {
    () => {
        match host_block_device() {
            Some(d) => d,
            None => {
                eprintln!("skipped: no block device node on this machine");
                return;
            }
        }
    };
}

#[test]
fn nothing_there_is_not_in_use() {
    let t = Tree::new("inuse-none", SDC);
    let u = t.usage(&["sdc", "dm-0"], &[]);
    assert!(u.is_empty(), "{u}");
    assert_eq!(u.to_string(), "not in use");
}

#[test]
fn bind_mounts_of_the_device_node_are_users_named_by_mount_point() {
    // Kubelet's raw block layout: the node bind-mounted onto the global map path file and
    // into the pod. Field 3 is devtmpfs's 0:5, not the device's number.
    let t = Tree::new("inuse-bind", SDC);
    let global = "/var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices/pv1/dev/pod-1";
    let pod = "/var/lib/kubelet/pods/pod-1/volumeDevices/kubernetes.io~csi/pv1";
    t.write(
        "proc/self/mountinfo",
        format!(
            "22 1 8:2 / / rw - ext4 /dev/sda2 rw\n\
             25 22 0:5 / /dev rw,nosuid shared:2 - devtmpfs udev rw,size=1000k\n\
             90 22 0:5 /dm-0 {global} rw,nosuid shared:2 - devtmpfs udev rw,size=1000k\n\
             91 22 0:5 /dm-0 {pod} rw,nosuid shared:2 - devtmpfs udev rw,size=1000k\n\
             92 22 0:5 /sdd /var/lib/other rw shared:2 - devtmpfs udev rw\n"
        )
        .as_bytes(),
    );
    let u = t.usage(&["dm-0"], &[]);
    assert!(!u.is_empty(), "the bind mounts were missed");
    let msg = u.to_string();
    assert!(msg.contains(global) && msg.contains(pod), "{msg}");
    assert!(msg.contains("dm-0"), "{msg}");
    assert!(
        !msg.contains("/var/lib/other") && !msg.contains(" /dev "),
        "{msg}"
    );
    assert_eq!(u.mounts.len(), 2, "{msg}");
    // Binds of dm-0's node are not sdc's users.
    let u = t.usage(&["sdc"], &[]);
    assert!(u.is_empty(), "{u}");
}

#[test]
fn the_host_mount_namespace_is_read_not_only_our_own() {
    // Under --root /host in a container, proc/self is the container's namespace; the host's
    // mounts are pid 1's.
    let t = Tree::new("inuse-host-ns", SDC);
    t.write(
        "proc/1/mountinfo",
        b"22 1 8:2 / / rw - ext4 /dev/sda2 rw\n40 22 8:32 / /mnt/host-data rw - xfs /dev/sdc rw\n",
    );
    let u = t.usage(&["sdc"], &[]);
    assert!(!u.is_empty(), "the host's mount was missed");
    let msg = u.to_string();
    assert!(
        msg.contains("/mnt/host-data") && msg.contains("pid 1"),
        "{msg}"
    );
}

#[test]
fn every_mount_namespace_of_the_processes_is_read_once() {
    let t = Tree::new("inuse-ns", SDC);
    for who in ["1", "self"] {
        t.link(&format!("proc/{who}/ns/mnt"), "mnt:[4026531840]");
    }
    t.write("proc/1/mountinfo", b"22 1 8:2 / / rw - ext4 /dev/sda2 rw\n");
    // Two processes of one pod namespace; its table is read once (the second copy differs
    // only to show which was read).
    for (pid, point) in [(1234, "/data-a"), (1235, "/data-b")] {
        t.process(pid, "app", "/usr/bin/app", &[]);
        t.link(&format!("proc/{pid}/ns/mnt"), "mnt:[4026532999]");
        t.write(
            &format!("proc/{pid}/mountinfo"),
            format!(
                "{root} 1 0:80 / / rw - overlay overlay rw\n41 {root} 8:32 / {point} rw - ext4 /dev/sdc rw\n",
                root = pid + 10_000
            )
                .as_bytes(),
        );
    }
    let u = t.usage(&["sdc"], &[]);
    assert!(!u.is_empty(), "the pod's mount was missed");
    let msg = u.to_string();
    assert_eq!(
        msg.matches("/data-").count(),
        1,
        "one namespace, one table: {msg}"
    );
    assert!(msg.contains("4026532999"), "names the namespace: {msg}");
}

#[test]
fn a_process_whose_fds_cannot_be_read_is_could_not_check_never_not_in_use() {
    let t = Tree::new("inuse-partial", SDC);
    t.process(77, "secret", "/usr/bin/secret", &[]);
    // Stands for EACCES (which root does not get on a fake tree): the fd directory exists
    // but cannot be listed.
    fs::remove_dir(t.path("proc/77/fd")).unwrap();
    t.write("proc/77/fd", b"");
    let u = t.usage(&["sdc"], &[]);
    assert!(!u.is_empty(), "a partial scan was reported as not in use");
    let msg = u.to_string();
    assert!(msg.contains("could not check pid 77"), "{msg}");
    // A process that is simply gone (no fd directory at all) is no gap.
    fs::remove_file(t.path("proc/77/fd")).unwrap();
    assert!(t.usage(&["sdc"], &[]).is_empty());
}

#[test]
fn a_zombie_leaders_threads_are_scanned() {
    let (node, dev) = host_block_device_or_skip!();
    let t = Tree::new("inuse-zombie", dev);
    // The main thread exited: fd/ lists nothing, the other thread still has the disk open.
    t.process(88, "java", "/usr/bin/java", &[]);
    t.write("proc/88/stat", b"88 (java) Z 1 1 1\n");
    // As the kernel shows a zombie leader: no executable (its memory is gone), and no
    // namespace links (it left them), so it cannot pass for a kernel thread.
    fs::remove_file(t.path("proc/88/exe")).unwrap();
    let _ = fs::remove_file(t.path("proc/88/ns/mnt"));
    fs::create_dir_all(t.path("proc/88/task/88/fd")).unwrap();
    t.link("proc/88/task/89/fd/5", node.to_str().unwrap());
    t.write("proc/88/task/89/fdinfo/5", b"flags:\t02\n");
    let u = t.usage(&["sdc"], &[]);
    assert!(!u.is_empty(), "the live thread's fd was missed");
    assert!(u.to_string().contains("open by pid 88 (java)"), "{u}");
}

#[test]
fn path_managers_are_recognised_by_executable_not_by_name() {
    let (node, dev) = host_block_device_or_skip!();
    let node = node.to_str().unwrap();
    let t = Tree::new("inuse-spoof", dev);
    // A real udev worker on the path: not a user.
    t.process(98, "(udev-worker)", "/usr/bin/udevadm", &[("3", node)]);
    let u = t.usage(&["sdc"], &[]);
    assert!(u.is_empty(), "{u}");
    assert_eq!(u.managers.len(), 1);
    // A writer that named itself like one (PR_SET_NAME): a user.
    t.process(99, "(udev-worker)", "/usr/bin/dd", &[("3", node)]);
    let u = t.usage(&["sdc"], &[]);
    assert!(!u.is_empty(), "the spoofed name was believed");
    assert!(u.to_string().contains("open by pid 99"), "{u}");
    // Named and exec'd right, but not root: a user.
    fs::remove_dir_all(t.path("proc/99")).unwrap();
    t.process(99, "multipathd", "/sbin/multipathd", &[("3", node)]);
    t.write(
        "proc/99/status",
        b"Name:\tmultipathd\nPPid:\t1\nUid:\t1000\t1000\t1000\t1000\n",
    );
    let u = t.usage(&["sdc"], &[]);
    assert!(u.to_string().contains("open by pid 99"), "{u}");
}

#[test]
fn on_maps_only_a_genuine_udev_probes_read_only_open_is_not_a_use() {
    let (node, dev) = host_block_device_or_skip!();
    let node = node.to_str().unwrap();
    let t = Tree::new("inuse-map-manager", SDC);
    t.disk("dm-0", dev, true);
    // udev's probe of the map (blkid opens it read-only), a genuine worker: listed, not a
    // user. The map's removal still waits for it (dm refuses an open map).
    t.process(98, "(udev-worker)", "/usr/bin/udevadm", &[("3", node)]);
    let u = t.usage(&["dm-0"], &[]);
    assert!(u.is_empty(), "a read-only probe refused the map: {u}");
    assert_eq!(u.managers.len(), 1, "{:?}", u.managers);
    assert!(u.managers[0].read_only);
    // The same worker with the map open for writing: a user.
    t.write("proc/98/fdinfo/3", b"pos:\t0\nflags:\t0100002\n");
    let u = t.usage(&["dm-0"], &[]);
    assert!(!u.is_empty(), "a writing opener of a map was excused");
    assert!(u.to_string().contains("open by pid 98"), "{u}");
    // A read-only opener under the worker's name but another executable: a user.
    t.write("proc/98/fdinfo/3", b"pos:\t0\nflags:\t0100000\n");
    fs::remove_file(t.path("proc/98/exe")).unwrap();
    t.link("proc/98/exe", "/usr/bin/dd");
    let u = t.usage(&["dm-0"], &[]);
    assert!(u.to_string().contains("open by pid 98"), "{u}");
}

/// A program udev's rules run on `device` (`comm`, from `exe`) is a probe, not a user; the
/// same program run from a shell is a user.
fn a_rule_program_is_a_probe_only_when_a_udev_worker_ran_it(
    t: &Tree,
    node: &str,
    device: &str,
    comm: &str,
    exe: &str,
) {
    t.process(97, "(udev-worker)", "/usr/lib/systemd/systemd-udevd", &[]);
    t.process(98, comm, exe, &[("3", node)]);
    let ppid = |parent: u32| format!("Name:\t{comm}\nPPid:\t{parent}\nUid:\t0\t0\t0\t0\n");
    t.write("proc/98/status", ppid(97).as_bytes());
    let u = t.usage(&[device], &[]);
    assert!(u.is_empty(), "udev's {comm} refused {device}: {u}");
    assert_eq!(u.managers.len(), 1, "{:?}", u.managers);
    // The same program run from a shell (`kpartx -a /dev/mapper/mpatha`, `multipath -ll`).
    t.process(96, "bash", "/usr/bin/bash", &[]);
    t.write("proc/98/status", ppid(96).as_bytes());
    let u = t.usage(&[device], &[]);
    assert!(
        u.to_string().contains(&format!("open by pid 98 ({comm})")),
        "a {comm} a shell ran was excused on {device}: {u}"
    );
}

#[test]
fn kpartx_is_a_probe_only_when_a_udev_worker_ran_it() {
    let (node, dev) = host_block_device_or_skip!();
    let t = Tree::new("inuse-kpartx", SDC);
    t.disk("dm-0", dev, true);
    // multipath-tools' kpartx.rules: a udev worker runs kpartx on the map, which reads its
    // partition table read-only. With the target down it stays in that read.
    a_rule_program_is_a_probe_only_when_a_udev_worker_ran_it(
        &t,
        node.to_str().unwrap(),
        "dm-0",
        "kpartx",
        "/usr/sbin/kpartx",
    );
}

#[test]
fn udevs_probes_on_a_path_are_probes_only_when_a_udev_worker_ran_them() {
    let (node, dev) = host_block_device_or_skip!();
    // multipath-tools' 60-multipath.rules: a udev worker runs `multipath -u sdc` on the new
    // or changed disk, which opens it to ask whether multipathd should claim it (CI's detach
    // just after an attach found it on a path and waited a round for it). systemd's
    // 60-persistent-storage.rules runs `scsi_id -d /dev/sdc` where no rule set the serial.
    for (comm, exe) in [
        ("multipath", "/usr/sbin/multipath"),
        ("scsi_id", "/usr/lib/udev/scsi_id"),
    ] {
        let t = Tree::new(&format!("inuse-probe-{comm}"), dev);
        a_rule_program_is_a_probe_only_when_a_udev_worker_ran_it(
            &t,
            node.to_str().unwrap(),
            "sdc",
            comm,
            exe,
        );
    }
}

#[test]
fn a_loop_device_on_the_node_is_a_user_named_with_its_backing_file() {
    let (node, dev) = host_block_device_or_skip!();
    let t = Tree::new("inuse-loop", SDC);
    t.disk("dm-0", dev, true);
    // `/dev/dm-0` of the tree is the machine's node, so the backing file's stat has its
    // number (the kernel answers LOOP_GET_STATUS64 for a real loop device).
    t.link("dev/dm-0", node.to_str().unwrap());
    t.disk("loop3", DevNum { major: 7, minor: 3 }, false);
    t.write("sys/class/block/loop3/loop/backing_file", b"/dev/dm-0\n");
    // An unbound loop device has no `loop/` directory and is ignored.
    t.disk("loop4", DevNum { major: 7, minor: 4 }, false);
    let u = t.usage(&["dm-0"], &[]);
    assert!(!u.is_empty(), "the loop device was missed");
    let msg = u.to_string();
    assert!(msg.contains("loop3") && msg.contains("/dev/dm-0"), "{msg}");
    assert!(!msg.contains("loop4"), "{msg}");
}

#[test]
fn a_malformed_mountinfo_line_is_skipped_and_counted_not_fatal() {
    let t = Tree::new("inuse-badline", SDC);
    t.write(
        "proc/self/mountinfo",
        b"22 1 8:2 / / rw - ext4 /dev/sda2 rw\n\
          50 22 0:50 / /home/u/sshfs rw - fuse.sshfs host:/x rw,user_id=0,\xff\xfe\n\
          51 22 8:32 / /mnt/data rw - ext4 /dev/sdc rw\n\
          52 22 garbage\n",
    );
    let u = t.usage(&["sdc"], &[]);
    assert!(u.to_string().contains("/mnt/data"), "{u}");
    assert_eq!(u.mountinfo_skipped, 2);
    // Not in use when the odd lines are someone else's.
    let u = t.usage(&["dm-0"], &[]);
    assert!(u.is_empty(), "{u}");
    // A line on the device itself that cannot be read is a gap in the check.
    t.write(
        "proc/self/mountinfo",
        b"22 1 8:2 / / rw - ext4 /dev/sda2 rw\n53 22 8:32 / /mnt/x rw - fuse.x src \xff\n",
    );
    let u = t.usage(&["sdc"], &[]);
    assert!(!u.is_empty(), "{u}");
    assert!(u.to_string().contains("could not check"), "{u}");
}

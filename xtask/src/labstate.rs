//! The guest's storage lab as state: a snapshot of everything a VM test can leave behind
//! (daemons, processes, dm devices, iSCSI sessions, NVMe fabrics controllers, LIO and nvmet
//! configfs entries, scsi_debug, SCSI and block devices, loop devices, mounts), the leaks of
//! one snapshot against the boot's baseline, and the reset that puts the lab back to that
//! baseline.
//!
//! The guest runner (testrun.rs) takes the baseline before the first test, checks after each
//! test, resets, and checks again: one test's leftovers must never reach the next test (a
//! multipathd left running builds maps over the next test's disks).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use lunkit_lab::{cmd, iscsi, multipath, sysfs, udev, wait};

/// The daemons the lab starts. udevd runs at the baseline (virtme-ng's init starts it);
/// the others must not outlive the test that started them.
const DAEMONS: &[&str] = &["multipathd", "iscsid", "systemd-udevd"];
const UDEVD: &str = "systemd-udevd";
const CONFIGFS: &str = "/sys/kernel/config";

/// How long one cleanup command may take before it is abandoned.
const STEP: Duration = Duration::from_secs(20);

/// Everything a test can leave behind, read from /proc and /sys.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// Daemon name -> pids (empty if not running).
    daemons: BTreeMap<&'static str, Vec<u32>>,
    /// Every process (pid -> description) that is not a kernel thread.
    processes: BTreeMap<u32, Process>,
    /// `dm-N` -> dm name.
    dm: BTreeMap<String, String>,
    /// `sessionN` -> target IQN.
    sessions: BTreeMap<String, String>,
    /// `nvmeN` -> the fabrics controller (any transport but PCIe) and its disks.
    nvme: BTreeMap<String, NvmeController>,
    /// Targets, backstores and nvmet objects, as paths under /sys/kernel/config.
    configfs: BTreeSet<String>,
    scsi_debug: bool,
    /// H:C:T:L -> its disk (`sdb`) or empty.
    scsi_devices: BTreeMap<String, String>,
    /// /sys/block entries other than dm-N and loopN (which are checked on their own).
    block: BTreeSet<String>,
    /// `loopN` -> backing file, for the bound ones.
    loops: BTreeMap<String, String>,
    /// Mount point -> `fstype source`.
    mounts: BTreeMap<String, String>,
    /// Active swap areas (a swap on a test disk keeps scsi_debug from unloading).
    swaps: BTreeSet<String>,
    /// Network interfaces (the FCoE lab's veths and bridge).
    netdevs: BTreeSet<String>,
    /// FCoE controllers and forwarders, `/sys/bus/fcoe/devices`.
    fcoe: BTreeSet<String>,
    /// `scsi_mod.scan` (`sync`, `async`, `manual`): the FCoE lab sets it to `manual`, and a
    /// guest left so brings scsi_debug's hosts up empty.
    scsi_scan: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Process {
    ppid: u32,
    cmdline: String,
}

/// A host-side NVMe fabrics controller, as a leak names it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct NvmeController {
    /// `tcp 127.0.0.1:4420 nqn.2014-08.org.lunkit:lab`: transport, address, subsystem.
    what: String,
    /// Its path disks (`nvme0c0n1`) and the multipath heads of its subsystem (`nvme0n1`),
    /// which go with it: the leak names them here, not again as block devices.
    disks: Vec<String>,
}

impl Snapshot {
    pub fn take() -> Snapshot {
        Snapshot {
            daemons: DAEMONS.iter().map(|d| (*d, cmd::pids_of(d))).collect(),
            processes: processes(),
            dm: sysfs::names("/sys/block")
                .into_iter()
                .filter(|n| n.starts_with("dm-"))
                .map(|dm| {
                    let name = sysfs::attr(format!("/sys/block/{dm}/dm/name")).unwrap_or_default();
                    (dm, name)
                })
                .collect(),
            sessions: sysfs::names("/sys/class/iscsi_session")
                .into_iter()
                .map(|s| {
                    let target = sysfs::attr(format!("/sys/class/iscsi_session/{s}/targetname"))
                        .unwrap_or_default();
                    (s, target)
                })
                .collect(),
            nvme: nvme_controllers(),
            configfs: configfs_objects(),
            scsi_debug: Path::new("/sys/module/scsi_debug").exists(),
            scsi_devices: sysfs::names("/sys/class/scsi_device")
                .into_iter()
                .map(|h| {
                    let disk = sysfs::names(format!("/sys/class/scsi_device/{h}/device/block"));
                    (h, disk.join(","))
                })
                .collect(),
            block: sysfs::names("/sys/block")
                .into_iter()
                .filter(|n| !n.starts_with("dm-") && !n.starts_with("loop"))
                .collect(),
            loops: sysfs::names("/sys/block")
                .into_iter()
                .filter(|n| n.starts_with("loop"))
                .filter_map(|n| {
                    let file = sysfs::attr(format!("/sys/block/{n}/loop/backing_file"))?;
                    Some((n, file))
                })
                .collect(),
            mounts: mounts(),
            swaps: swaps(),
            netdevs: sysfs::names("/sys/class/net").into_iter().collect(),
            fcoe: sysfs::names("/sys/bus/fcoe/devices").into_iter().collect(),
            scsi_scan: sysfs::attr("/sys/module/scsi_mod/parameters/scan"),
        }
    }

    /// One line about the baseline, for the log.
    pub fn summary(&self) -> String {
        let daemons: Vec<String> = self
            .daemons
            .iter()
            .map(|(d, pids)| {
                if pids.is_empty() {
                    format!("{d} not running")
                } else {
                    format!("{d} running")
                }
            })
            .collect();
        format!(
            "{}; {} dm devices, {} iSCSI sessions, {} NVMe fabrics controllers, {} SCSI devices, \
             {} mounts, {} processes",
            daemons.join(", "),
            self.dm.len(),
            self.sessions.len(),
            self.nvme.len(),
            self.scsi_devices.len(),
            self.mounts.len(),
            self.processes.len()
        )
    }

    /// What this snapshot holds that `base` did not (and daemons that ran at `base` but no
    /// longer do), one item per kind, naming each thing: `multipathd pid 412 running`,
    /// `dm devices mpatha (dm-0)`. Empty when the lab is as the baseline left it.
    pub fn leaks(&self, base: &Snapshot) -> Vec<String> {
        let mut out = Vec::new();
        for (daemon, pids) in &self.daemons {
            let before = base.daemons.get(daemon).is_some_and(|p| !p.is_empty());
            match (before, pids.is_empty()) {
                (false, false) => out.push(format!("{daemon} {} running", pid_list(pids))),
                (true, true) => out.push(format!("{daemon} not running (it ran at the baseline)")),
                _ => {}
            }
        }
        let stray = self.stray_processes(base);
        if !stray.is_empty() {
            let list: Vec<String> = stray
                .iter()
                .map(|(pid, p)| format!("{pid} `{}`", p.cmdline))
                .collect();
            out.push(format!("processes {}", list.join(", ")));
        }
        let new_dm: Vec<String> = self
            .dm
            .iter()
            .filter(|(dm, name)| base.dm.get(*dm) != Some(name))
            .map(|(dm, name)| format!("{name} ({dm})"))
            .collect();
        if !new_dm.is_empty() {
            out.push(format!("dm devices {}", new_dm.join(", ")));
        }
        let new_sessions: Vec<String> = self
            .sessions
            .iter()
            .filter(|(s, _)| !base.sessions.contains_key(*s))
            .map(|(s, t)| format!("{s} ({t})"))
            .collect();
        if !new_sessions.is_empty() {
            out.push(format!("iSCSI sessions {}", new_sessions.join(", ")));
        }
        let new_nvme = self.new_nvme_controllers(base);
        if !new_nvme.is_empty() {
            let list: Vec<String> = new_nvme
                .iter()
                .map(|(name, c)| {
                    if c.disks.is_empty() {
                        format!("{name} ({})", c.what)
                    } else {
                        format!("{name} ({}; {})", c.what, c.disks.join(", "))
                    }
                })
                .collect();
            out.push(format!("nvme controllers {}", list.join(", ")));
        }
        let new_cfs: Vec<&String> = self.configfs.difference(&base.configfs).collect();
        if !new_cfs.is_empty() {
            let list: Vec<&str> = new_cfs.iter().map(|s| s.as_str()).collect();
            out.push(format!("configfs entries {}", list.join(", ")));
        }
        if self.scsi_debug && !base.scsi_debug {
            out.push("scsi_debug loaded".to_owned());
        }
        let new_scsi: Vec<(&String, &String)> = self
            .scsi_devices
            .iter()
            .filter(|(h, _)| !base.scsi_devices.contains_key(*h))
            .collect();
        if !new_scsi.is_empty() {
            let list: Vec<String> = new_scsi
                .iter()
                .map(|(h, d)| {
                    if d.is_empty() {
                        (*h).clone()
                    } else {
                        format!("{h} ({d})")
                    }
                })
                .collect();
            out.push(format!("SCSI devices {}", list.join(", ")));
        }
        // Disks of the SCSI devices and NVMe controllers above are named there already.
        let named: BTreeSet<&str> = new_scsi
            .iter()
            .flat_map(|(_, d)| d.split(','))
            .chain(
                new_nvme
                    .iter()
                    .flat_map(|(_, c)| c.disks.iter().map(String::as_str)),
            )
            .collect();
        let new_block: Vec<&str> = self
            .block
            .difference(&base.block)
            .map(String::as_str)
            .filter(|b| !named.contains(b))
            .collect();
        if !new_block.is_empty() {
            out.push(format!("block devices {}", new_block.join(", ")));
        }
        let new_loops: Vec<String> = self
            .loops
            .iter()
            .filter(|(l, f)| base.loops.get(*l) != Some(f))
            .map(|(l, f)| format!("{l} ({f})"))
            .collect();
        if !new_loops.is_empty() {
            out.push(format!("loop devices {}", new_loops.join(", ")));
        }
        let new_mounts: Vec<String> = self
            .mounts
            .iter()
            .filter(|(m, what)| base.mounts.get(*m) != Some(what))
            .map(|(m, what)| format!("{m} ({what})"))
            .collect();
        if !new_mounts.is_empty() {
            out.push(format!("mounts {}", new_mounts.join(", ")));
        }
        let new_swaps: Vec<&str> = self
            .swaps
            .difference(&base.swaps)
            .map(String::as_str)
            .collect();
        if !new_swaps.is_empty() {
            out.push(format!("swaps {}", new_swaps.join(", ")));
        }
        let new_fcoe: Vec<&str> = self
            .fcoe
            .difference(&base.fcoe)
            .map(String::as_str)
            .collect();
        if !new_fcoe.is_empty() {
            out.push(format!("FCoE devices {}", new_fcoe.join(", ")));
        }
        let new_net: Vec<&str> = self
            .netdevs
            .difference(&base.netdevs)
            .map(String::as_str)
            .collect();
        if !new_net.is_empty() {
            out.push(format!("network interfaces {}", new_net.join(", ")));
        }
        if self.scsi_scan != base.scsi_scan {
            out.push(format!(
                "scsi_mod.scan is {:?} (it was {:?})",
                self.scsi_scan, base.scsi_scan
            ));
        }
        out
    }

    /// The NVMe fabrics controllers the baseline did not have.
    fn new_nvme_controllers(&self, base: &Snapshot) -> Vec<(&String, &NvmeController)> {
        self.nvme
            .iter()
            .filter(|(n, c)| base.nvme.get(*n).is_none_or(|b| b.what != c.what))
            .collect()
    }

    /// Processes that were not there at the baseline and belong to no daemon, to no udev
    /// worker (whose helpers come and go) and not to us: what a test left running.
    fn stray_processes(&self, base: &Snapshot) -> BTreeMap<u32, Process> {
        let me = std::process::id();
        let daemon_pids: BTreeSet<u32> = self.daemons.values().flatten().copied().collect();
        let descends_from = |pid: u32, roots: &dyn Fn(u32) -> bool| {
            let mut p = pid;
            for _ in 0..64 {
                if roots(p) {
                    return true;
                }
                match self.processes.get(&p) {
                    Some(proc_) if proc_.ppid > 1 => p = proc_.ppid,
                    _ => return false,
                }
            }
            false
        };
        let mut ancestors = BTreeSet::new();
        let mut p = me;
        while let Some(proc_) = self.processes.get(&p) {
            ancestors.insert(p);
            if proc_.ppid <= 1 {
                break;
            }
            p = proc_.ppid;
        }
        self.processes
            .iter()
            .filter(|(pid, p)| {
                !base.processes.contains_key(pid)
                    && !ancestors.contains(pid)
                    // Usermode helpers the kernel starts (modprobe) are children of kthreadd.
                    && p.ppid != 2
                    && !descends_from(**pid, &|q| q == me || daemon_pids.contains(&q))
            })
            .map(|(pid, p)| (*pid, p.clone()))
            .collect()
    }
}

fn pid_list(pids: &[u32]) -> String {
    let list: Vec<String> = pids.iter().map(u32::to_string).collect();
    if pids.len() == 1 {
        format!("pid {}", list[0])
    } else {
        format!("pids {}", list.join(", "))
    }
}

/// Every process with a command line (kernel threads have none).
fn processes() -> BTreeMap<u32, Process> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return BTreeMap::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let raw = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            if raw.is_empty() || cmd::is_zombie(pid) {
                return None;
            }
            let cmdline = String::from_utf8_lossy(&raw)
                .trim_end_matches('\0')
                .replace('\0', " ");
            let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // `PID (COMM) STATE PPID ...`; COMM may hold spaces and parentheses.
            let (_, rest) = stat.rsplit_once(')')?;
            let ppid = rest.split_whitespace().nth(1)?.parse().ok()?;
            Some((pid, Process { ppid, cmdline }))
        })
        .collect()
}

/// Mount point -> `fstype source`, from our mountinfo. configfs is left out: lio.rs mounts it
/// once and it stays for the boot, like the modules it belongs to.
fn mounts() -> BTreeMap<String, String> {
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let point = left.split(' ').nth(4)?.to_owned();
            let mut r = right.split(' ');
            let (fstype, source) = (r.next()?, r.next()?);
            (fstype != "configfs").then(|| (point, format!("{fstype} {source}")))
        })
        .collect()
}

/// The active swap areas, from /proc/swaps (its first line is a header).
fn swaps() -> BTreeSet<String> {
    fs::read_to_string("/proc/swaps")
        .unwrap_or_default()
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect()
}

/// The host's NVMe fabrics controllers: those in /sys/class/nvme whose transport is not
/// `pcie` (tcp, rdma, fc, loop), each with its disks. A PCIe controller is hardware, not
/// something a test connects.
fn nvme_controllers() -> BTreeMap<String, NvmeController> {
    let class = Path::new("/sys/class/nvme");
    sysfs::names(class)
        .into_iter()
        .filter_map(|name| {
            let dir = class.join(&name);
            // One going away has no attributes left: it is no longer there to leak.
            let transport = sysfs::attr(dir.join("transport"))?;
            if transport == "pcie" {
                return None;
            }
            let address = short_address(&sysfs::attr(dir.join("address")).unwrap_or_default());
            let nqn = sysfs::attr(dir.join("subsysnqn")).unwrap_or_default();
            let what = format!("{transport} {address} {nqn}").replace("  ", " ");
            let disks = nvme_disks(&name);
            Some((name, NvmeController { what, disks }))
        })
        .collect()
}

/// `127.0.0.1:4420` from `traddr=127.0.0.1,trsvcid=4420,src_addr=127.0.0.1`; an address
/// without them (fc, loop) as it is.
fn short_address(address: &str) -> String {
    let field = |key: &str| {
        address
            .split(',')
            .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
    };
    match (field("traddr"), field("trsvcid")) {
        (Some(addr), Some(port)) => format!("{addr}:{port}"),
        (Some(addr), None) => addr.to_owned(),
        _ => address.to_owned(),
    }
}

/// The disks that go when controller `ctrl` is deleted: its own (the hidden paths
/// `nvme0c0n1` under native multipath, `nvme0n1` without) and the multipath heads of its
/// subsystem (`nvme0n1`), which go with their last path.
fn nvme_disks(ctrl: &str) -> Vec<String> {
    let is_disk = |n: &String| Path::new("/sys/block").join(n).exists();
    let own = sysfs::names(format!("/sys/class/nvme/{ctrl}"));
    let heads = sysfs::names("/sys/class/nvme-subsystem")
        .into_iter()
        .map(|s| sysfs::names(format!("/sys/class/nvme-subsystem/{s}")))
        .filter(|members| members.iter().any(|m| m == ctrl))
        .flatten();
    let disks: BTreeSet<String> = own.into_iter().chain(heads).filter(is_disk).collect();
    disks.into_iter().collect()
}

/// The objects a test creates in configfs, as paths below /sys/kernel/config: LIO targets
/// (`target/iscsi/IQN`) and backstores (`target/core/fileio_0/lun0`, or the HBA alone when it
/// is empty), and nvmet's objects ([`nvmet_objects`]). The default groups the modules create
/// (`target/core/alua`, `target/iscsi/discovery_auth`) are not objects of a test.
fn configfs_objects() -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let target = Path::new(CONFIGFS).join("target");
    for fabric in dirs_in(&target) {
        if fabric == "core" {
            for hba in dirs_in(&target.join("core")) {
                if hba == "alua" {
                    continue;
                }
                let devices = dirs_in(&target.join("core").join(&hba));
                if devices.is_empty() {
                    out.insert(format!("target/core/{hba}"));
                }
                for dev in devices {
                    out.insert(format!("target/core/{hba}/{dev}"));
                }
            }
        } else {
            for wwn in dirs_in(&target.join(&fabric)) {
                if wwn != "discovery_auth" {
                    out.insert(format!("target/{fabric}/{wwn}"));
                }
            }
        }
    }
    nvmet_objects(&mut out);
    out
}

/// nvmet's objects, each named by where it is: ports (`nvmet/ports/1`) with their links to
/// subsystems (`nvmet/ports/1/subsystems/NQN`), referrals and ANA groups other than the
/// default group 1; subsystems (`nvmet/subsystems/NQN`) with their namespaces
/// (`.../namespaces/1`) and allowed-host links (`.../allowed_hosts/HOSTNQN`); hosts.
fn nvmet_objects(out: &mut BTreeSet<String>) {
    let nvmet = Path::new(CONFIGFS).join("nvmet");
    let mut add = |parent: &str, names: Vec<String>| {
        for name in names {
            out.insert(format!("{parent}/{name}"));
        }
    };
    for port in dirs_in(&nvmet.join("ports")) {
        let dir = nvmet.join("ports").join(&port);
        let obj = format!("nvmet/ports/{port}");
        add(
            &format!("{obj}/subsystems"),
            links_in(&dir.join("subsystems")),
        );
        add(&format!("{obj}/referrals"), dirs_in(&dir.join("referrals")));
        let groups = dirs_in(&dir.join("ana_groups"));
        add(
            &format!("{obj}/ana_groups"),
            groups.into_iter().filter(|g| g != "1").collect(),
        );
        add("nvmet/ports", vec![port]);
    }
    for nqn in dirs_in(&nvmet.join("subsystems")) {
        let dir = nvmet.join("subsystems").join(&nqn);
        let obj = format!("nvmet/subsystems/{nqn}");
        add(
            &format!("{obj}/namespaces"),
            dirs_in(&dir.join("namespaces")),
        );
        add(
            &format!("{obj}/allowed_hosts"),
            links_in(&dir.join("allowed_hosts")),
        );
        add("nvmet/subsystems", vec![nqn]);
    }
    add("nvmet/hosts", dirs_in(&nvmet.join("hosts")));
}

/// Names of the directories (not files, not symlinks) in `dir`, sorted.
fn dirs_in(dir: &Path) -> Vec<String> {
    entries_in(dir, |t| t.is_dir())
}

/// Names of the symlinks in `dir`, sorted.
fn links_in(dir: &Path) -> Vec<String> {
    entries_in(dir, |t| t.is_symlink())
}

fn entries_in(dir: &Path, keep: impl Fn(&fs::FileType) -> bool) -> Vec<String> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut v: Vec<String> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| keep(&t)))
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    v.sort();
    v
}

/// Takes a snapshot once udev has handled what the test's teardown triggered, and counts a
/// process as stray only if it is still there a moment later (a helper that was just ending
/// is not a leak).
pub fn check(base: &Snapshot) -> Vec<String> {
    settle();
    let first = Snapshot::take();
    if first.stray_processes(base).is_empty() {
        return first.leaks(base);
    }
    std::thread::sleep(Duration::from_millis(500));
    Snapshot::take().leaks(base)
}

/// Waits (bounded) until udevd has handled the queued events, if it runs. Not again when the
/// kernel has sent no uevent since the last settle that ended with an empty queue
/// (`/sys/kernel/uevent_seqnum` unchanged): the check after a reset that had nothing to
/// undo, and the reset's own settle then, cost a process each (0.1 to 1 s under TCG) for
/// nothing.
fn settle() {
    if !udev::running() {
        return;
    }
    let seqnum = udev::uevent_seqnum();
    let mut settled = SETTLED_AT.lock().unwrap_or_else(|e| e.into_inner());
    if seqnum.is_some() && seqnum == *settled {
        return;
    }
    let done = cmd::run_bounded("udevadm", &["settle", "--timeout=15"], STEP);
    *settled = if done.ok() { seqnum } else { None };
}

/// The uevent number before the last settle that succeeded.
static SETTLED_AT: std::sync::Mutex<Option<u64>> = std::sync::Mutex::new(None);

/// Puts the lab back to `base`, in the order that lets each step work: processes that hold
/// devices, mounts, multipathd (it would rebuild maps), maps, iSCSI sessions, iscsid, NVMe
/// fabrics controllers (before their target goes), LIO and nvmet in configfs, scsi_debug and
/// other SCSI devices, loop devices, then udevd. Returns
/// one line per thing it did or failed to do, for the log. The overlays (/etc, /var) are the
/// caller's (overlay.rs).
pub fn reset(base: &Snapshot) -> Vec<String> {
    let mut log = Vec::new();
    let now = Snapshot::take();
    kill_stray_processes(&now, base, &mut log);
    unmount(&now, base, &mut log);
    swapoff(&now, base, &mut log);
    stop_daemon_unless_at_baseline("multipathd", base, &mut log);
    // Its log would otherwise show up in the next test's diagnostics as if it were that test's.
    if !cmd::process_running("multipathd") {
        let _ = fs::remove_file(multipath::LOG);
    }
    remove_dm_devices(base, &mut log);
    logout_sessions(base, &mut log);
    stop_daemon_unless_at_baseline("iscsid", base, &mut log);
    delete_nvme_controllers(base, &mut log);
    remove_configfs_objects(base, &mut log);
    settle();
    remove_scsi(base, &mut log);
    remove_net_devices(base, &mut log);
    restore_scsi_scan(base, &mut log);
    detach_loops(base, &mut log);
    restore_udevd(base, &mut log);
    log
}

/// Deletes the network interfaces the baseline did not have (an FCoE controller on one goes
/// with it: fcoe destroys its interface when the device is unregistered). Whatever is left
/// fails the second check, and the runner boots a fresh guest.
fn remove_net_devices(base: &Snapshot, log: &mut Vec<String>) {
    let now: BTreeSet<String> = sysfs::names("/sys/class/net").into_iter().collect();
    for dev in now.difference(&base.netdevs) {
        // A veth's peer goes with it.
        if !Path::new("/sys/class/net").join(dev).exists() {
            continue;
        }
        let r = cmd::run_bounded("ip", &["link", "del", dev], STEP);
        if r.ok() {
            log.push(format!("deleted network interface {dev}"));
        } else {
            log.push(format!(
                "could not delete network interface {dev}: {}",
                r.output_or_reason(STEP).trim()
            ));
        }
    }
}

/// Puts `scsi_mod.scan` back to what it was at the baseline.
fn restore_scsi_scan(base: &Snapshot, log: &mut Vec<String>) {
    const SCAN: &str = "/sys/module/scsi_mod/parameters/scan";
    let Some(was) = &base.scsi_scan else {
        return;
    };
    if sysfs::attr(SCAN).as_ref() == Some(was) {
        return;
    }
    match fs::write(SCAN, was) {
        Ok(()) => log.push(format!("set scsi_mod.scan back to {was}")),
        Err(e) => log.push(format!("could not set scsi_mod.scan back to {was}: {e}")),
    }
}

fn kill_stray_processes(now: &Snapshot, base: &Snapshot, log: &mut Vec<String>) {
    let stray = now.stray_processes(base);
    if stray.is_empty() {
        return;
    }
    for (pid, p) in &stray {
        cmd::run_ignoring_failure("kill", &["-KILL", &pid.to_string()]);
        log.push(format!("killed {pid} `{}`", p.cmdline));
    }
    let alive = || {
        stray
            .keys()
            .any(|pid| Path::new(&format!("/proc/{pid}")).exists() && !cmd::is_zombie(*pid))
    };
    if wait::until_true("stray processes to die", Duration::from_secs(10), || {
        !alive()
    })
    .is_err()
    {
        log.push("some killed processes are still there (stuck in the kernel?)".to_owned());
    }
}

fn unmount(now: &Snapshot, base: &Snapshot, log: &mut Vec<String>) {
    // Deepest first, so a mount on top of another goes before it.
    let mut points: Vec<&String> = now
        .mounts
        .iter()
        .filter(|(m, what)| base.mounts.get(*m) != Some(what))
        .map(|(m, _)| m)
        .collect();
    points.sort_by_key(|m| std::cmp::Reverse(m.matches('/').count()));
    for m in points {
        let r = cmd::run_bounded("umount", &[m], STEP);
        if r.ok() {
            log.push(format!("unmounted {m}"));
        } else {
            cmd::run_bounded("umount", &["-l", m], STEP);
            log.push(format!("unmounted {m} lazily ({})", r.stderr.trim()));
        }
    }
}

fn swapoff(now: &Snapshot, base: &Snapshot, log: &mut Vec<String>) {
    for swap in now.swaps.difference(&base.swaps) {
        let r = cmd::run_bounded("swapoff", &[swap], STEP);
        if r.ok() {
            log.push(format!("swapped off {swap}"));
        } else {
            log.push(format!(
                "could not swap off {swap}: {}",
                r.output_or_reason(STEP).trim()
            ));
        }
    }
}

/// Stops `daemon` if it runs and did not at the baseline: politely, then SIGKILL.
fn stop_daemon_unless_at_baseline(daemon: &str, base: &Snapshot, log: &mut Vec<String>) {
    let pids = cmd::pids_of(daemon);
    if pids.is_empty() || base.daemons.get(daemon).is_some_and(|p| !p.is_empty()) {
        return;
    }
    let result = match daemon {
        "iscsid" => iscsi::stop_iscsid(),
        _ => {
            cmd::run_bounded(daemon, &["shutdown"], Duration::from_secs(10));
            let gone = || !cmd::process_running(daemon);
            wait::until_true(&format!("{daemon} to exit"), Duration::from_secs(10), gone).or_else(
                |_| {
                    for pid in cmd::pids_of(daemon) {
                        cmd::run_ignoring_failure("kill", &["-KILL", &pid.to_string()]);
                    }
                    wait::until_true(
                        &format!("{daemon} to exit after SIGKILL"),
                        Duration::from_secs(10),
                        gone,
                    )
                },
            )
        }
    };
    match result {
        Ok(()) => log.push(format!("stopped {daemon} ({})", pid_list(&pids))),
        Err(e) => log.push(format!("could not stop {daemon}: {e}")),
    }
}

/// Removes the dm devices the baseline did not have, holders before what they hold (a
/// partition map before its multipath map). A queueing map is switched to failing I/O first
/// and an open one gets an error table (`--force`), so nothing waits on dead paths.
fn remove_dm_devices(base: &Snapshot, log: &mut Vec<String>) {
    for _round in 0..4 {
        let extra: Vec<(String, String)> = Snapshot::take()
            .dm
            .into_iter()
            .filter(|(dm, name)| base.dm.get(dm) != Some(name))
            .collect();
        if extra.is_empty() {
            return;
        }
        // Those nothing else holds go this round.
        let free: Vec<&(String, String)> = extra
            .iter()
            .filter(|(dm, _)| sysfs::names(format!("/sys/block/{dm}/holders")).is_empty())
            .collect();
        let round: Vec<&(String, String)> = if free.is_empty() {
            extra.iter().collect()
        } else {
            free
        };
        for (dm, name) in round {
            if sysfs::attr(format!("/sys/block/{dm}/dm/suspended")).as_deref() == Some("1") {
                cmd::run_bounded("dmsetup", &["resume", "--noudevsync", name], STEP);
            }
            cmd::run_bounded(
                "dmsetup",
                &["message", "--noudevsync", name, "0", "fail_if_no_path"],
                STEP,
            );
            let r = cmd::run_bounded(
                "dmsetup",
                &["remove", "--force", "--retry", "--noudevsync", name],
                STEP,
            );
            if r.ok() {
                log.push(format!("removed dm device {name} ({dm})"));
            } else {
                log.push(format!(
                    "dmsetup remove --force {name} ({dm}) failed: {}",
                    r.output_or_reason(STEP).trim()
                ));
            }
        }
    }
}

/// Logs out of the sessions the baseline did not have. iscsiadm needs iscsid: if a test
/// killed it, it is started for the logout (and stopped again after, like any iscsid the
/// baseline did not run).
fn logout_sessions(base: &Snapshot, log: &mut Vec<String>) {
    let extra = || {
        sysfs::names("/sys/class/iscsi_session")
            .into_iter()
            .filter(|s| !base.sessions.contains_key(s))
            .collect::<Vec<_>>()
    };
    let sessions = extra();
    if sessions.is_empty() {
        return;
    }
    if !cmd::process_running("iscsid") {
        cmd::run_bounded("iscsid", &[], STEP);
        let _ = wait::until_true("iscsid to start", Duration::from_secs(10), || {
            cmd::process_running("iscsid")
        });
    }
    let limit = Duration::from_secs(60);
    let r = cmd::run_bounded("iscsiadm", &["-m", "node", "--logoutall=all"], limit);
    if !extra().is_empty() {
        cmd::run_bounded("iscsiadm", &["-m", "session", "-u"], limit);
    }
    let left = extra();
    if left.is_empty() {
        log.push(format!("logged out of {}", sessions.join(", ")));
    } else {
        log.push(format!(
            "could not log out of {}: {}",
            left.join(", "),
            r.output_or_reason(limit).trim()
        ));
    }
}

/// Deletes the NVMe fabrics controllers the baseline did not have, with their disks
/// (`delete_controller`). Before the nvmet objects go: a controller whose target vanished
/// would keep reconnecting until its `ctrl_loss_tmo` (600 s by default).
fn delete_nvme_controllers(base: &Snapshot, log: &mut Vec<String>) {
    let now = Snapshot {
        nvme: nvme_controllers(),
        ..Snapshot::default()
    };
    for (name, c) in now.new_nvme_controllers(base) {
        let dir = Path::new("/sys/class/nvme").join(name);
        let deleted = write_bounded(&dir.join("delete_controller"), "1", STEP).and_then(|()| {
            let gone = || !dir.exists();
            wait::until_true(&format!("{name} to go"), STEP, gone).map_err(|e| e.to_string())
        });
        match deleted {
            Ok(()) => log.push(format!("deleted nvme controller {name} ({})", c.what)),
            Err(e) => log.push(format!("could not delete nvme controller {name}: {e}")),
        }
    }
}

/// Removes the configfs objects the baseline did not have, in the order configfs demands
/// (see lio.rs): each target's TPGs disabled, then its LUN links, LUNs, portals, ACLs, TPGs
/// and the target; then the backstores (which a LUN link holds) and their HBAs; then nvmet's
/// objects in [`removal_rank`]'s order.
fn remove_configfs_objects(base: &Snapshot, log: &mut Vec<String>) {
    let root = Path::new(CONFIGFS);
    for _pass in 0..3 {
        let extra: Vec<String> = configfs_objects()
            .difference(&base.configfs)
            .cloned()
            .collect();
        if extra.is_empty() {
            return;
        }
        let mut ordered = extra.clone();
        ordered.sort_by_key(|p| removal_rank(p));
        for obj in &ordered {
            let path = root.join(obj);
            // A link goes alone: walking it would empty the directory it points to.
            if fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_symlink()) {
                let _ = fs::remove_file(&path);
                continue;
            }
            if is_nvmet_namespace(obj) {
                let _ = fs::write(path.join("enable"), "0");
            }
            for tpg in dirs_in(&path).iter().filter(|d| d.starts_with("tpgt_")) {
                let _ = fs::write(path.join(tpg).join("enable"), "0");
            }
            remove_configfs_tree(&path);
            // An HBA goes with its last device.
            if obj.starts_with("target/core/") {
                if let Some(hba) = path.parent() {
                    if hba != root.join("target/core") && dirs_in(hba).is_empty() {
                        let _ = fs::remove_dir(hba);
                    }
                }
            }
        }
        let left: BTreeSet<String> = configfs_objects()
            .difference(&base.configfs)
            .cloned()
            .collect();
        let removed: Vec<&String> = extra.iter().filter(|o| !left.contains(*o)).collect();
        if !removed.is_empty() {
            let list: Vec<&str> = removed.iter().map(|s| s.as_str()).collect();
            log.push(format!("removed configfs {}", list.join(", ")));
        }
    }
    let left: Vec<String> = configfs_objects()
        .difference(&base.configfs)
        .cloned()
        .collect();
    if !left.is_empty() {
        log.push(format!("could not remove configfs {}", left.join(", ")));
    }
}

/// Where configfs object `obj` goes in the removal: lower first. Fabric targets before the
/// backstores their LUNs link; for nvmet, a port's links to subsystems first (a linked
/// subsystem cannot be removed: EBUSY; the last link going stops the port's listener), the
/// port's referrals and ANA groups, the ports, a subsystem's allowed-host links and its
/// namespaces (disabled, then removed), the subsystems, and the hosts they linked.
fn removal_rank(obj: &str) -> u8 {
    let parts: Vec<&str> = obj.split('/').collect();
    match parts.as_slice() {
        ["target", "core", ..] => 1,
        ["target", ..] => 0,
        ["nvmet", "ports", _, "subsystems", _] => 2,
        ["nvmet", "ports", _, _, _] => 3,
        ["nvmet", "ports", _] => 4,
        ["nvmet", "subsystems", _, "allowed_hosts", _] => 5,
        ["nvmet", "subsystems", _, "namespaces", _] => 6,
        ["nvmet", "subsystems", _] => 7,
        ["nvmet", "hosts", _] => 8,
        _ => 9,
    }
}

/// Whether `obj` is an nvmet namespace (`nvmet/subsystems/NQN/namespaces/N`).
fn is_nvmet_namespace(obj: &str) -> bool {
    matches!(
        obj.split('/').collect::<Vec<_>>().as_slice(),
        ["nvmet", "subsystems", _, "namespaces", _]
    )
}

/// Removes a configfs directory: its symlinks, then its subdirectories (depth first), then
/// itself. The default groups a module creates cannot be removed (EPERM) and go with their
/// parent, so failures on the way down are expected and ignored.
fn remove_configfs_tree(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    let mut subdirs = Vec::new();
    for e in entries.flatten() {
        match e.file_type() {
            Ok(t) if t.is_symlink() => {
                let _ = fs::remove_file(e.path());
            }
            Ok(t) if t.is_dir() => subdirs.push(e.path()),
            _ => {}
        }
    }
    for sub in subdirs {
        remove_configfs_tree(&sub);
    }
    let _ = fs::remove_dir(dir);
}

/// Unloads scsi_debug (with its hosts and devices) and deletes the other SCSI devices the
/// baseline did not have.
fn remove_scsi(base: &Snapshot, log: &mut Vec<String>) {
    if Path::new("/sys/module/scsi_debug").exists() && !base.scsi_debug {
        let mut last = String::new();
        let unloaded = wait::until_true("scsi_debug to unload", Duration::from_secs(30), || {
            let r = cmd::run_bounded("modprobe", &["-r", "scsi_debug"], STEP);
            last = r.stderr.trim().to_owned();
            r.ok()
        });
        match unloaded {
            Ok(()) => log.push("unloaded scsi_debug".to_owned()),
            Err(e) => log.push(format!("{e}: {last}")),
        }
    }
    for hctl in sysfs::names("/sys/class/scsi_device") {
        if base.scsi_devices.contains_key(&hctl) {
            continue;
        }
        let delete = PathBuf::from(format!("/sys/class/scsi_device/{hctl}/device/delete"));
        match write_bounded(&delete, "1", STEP) {
            Ok(()) => log.push(format!("deleted SCSI device {hctl}")),
            Err(e) => log.push(format!("could not delete SCSI device {hctl}: {e}")),
        }
    }
}

fn detach_loops(base: &Snapshot, log: &mut Vec<String>) {
    for (dev, file) in Snapshot::take().loops {
        if base.loops.get(&dev) == Some(&file) {
            continue;
        }
        let r = cmd::run_bounded("losetup", &["-d", &format!("/dev/{dev}")], STEP);
        if r.ok() {
            log.push(format!("detached {dev} ({file})"));
        } else {
            log.push(format!(
                "could not detach {dev}: {}",
                r.output_or_reason(STEP).trim()
            ));
        }
    }
}

/// Starts udevd again if it ran at the baseline (a test that stops it may fail before it
/// restarts it), or stops one a test started.
fn restore_udevd(base: &Snapshot, log: &mut Vec<String>) {
    let at_base = base.daemons.get(UDEVD).is_some_and(|p| !p.is_empty());
    let running = cmd::process_running(UDEVD);
    if at_base && !running {
        match udev::ensure_running() {
            Ok(()) => log.push("restarted udevd".to_owned()),
            Err(e) => log.push(format!("could not restart udevd: {e}")),
        }
    } else if !at_base && running {
        match udev::stop() {
            Ok(()) => log.push("stopped udevd".to_owned()),
            Err(e) => log.push(format!("could not stop udevd: {e}")),
        }
    }
}

/// Writes a sysfs attribute on a helper thread, giving up on it after `limit`: writing
/// `delete` to a device stuck in error handling can block for minutes.
fn write_bounded(path: &Path, value: &str, limit: Duration) -> Result<(), String> {
    let (tx, rx) = mpsc::channel();
    let (p, v) = (path.to_path_buf(), value.to_owned());
    std::thread::spawn(move || {
        let _ = tx.send(fs::write(&p, v).map_err(|e| e.to_string()));
    });
    let start = Instant::now();
    rx.recv_timeout(limit).map_err(|_| {
        format!(
            "write to {} still blocked after {:?}",
            path.display(),
            start.elapsed()
        )
    })?
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> Snapshot {
        let mut s = Snapshot::default();
        s.daemons.insert("multipathd", vec![]);
        s.daemons.insert("iscsid", vec![]);
        s.daemons.insert(UDEVD, vec![116]);
        s.scsi_devices.insert("2:0:0:0".into(), "sr0".into());
        s.block.insert("sr0".into());
        s.mounts.insert("/".into(), "9p /dev/root".into());
        s
    }

    #[test]
    fn a_clean_lab_has_no_leaks() {
        let mut now = base();
        // udevd restarted by a test: another pid, still running.
        now.daemons.insert(UDEVD, vec![900]);
        assert_eq!(now.leaks(&base()), Vec::<String>::new());
    }

    #[test]
    fn leaks_name_each_thing() {
        let mut now = base();
        now.daemons.insert("multipathd", vec![412]);
        now.daemons.insert("iscsid", vec![300, 301]);
        now.daemons.insert(UDEVD, vec![]);
        now.dm.insert("dm-0".into(), "mpatha".into());
        now.sessions.insert(
            "session1".into(),
            "iqn.2003-01.org.linux-iscsi.lunkit:lab".into(),
        );
        now.nvme.insert(
            "nvme0".into(),
            NvmeController {
                what: "tcp 127.0.0.1:4420 nqn.2014-08.org.lunkit:lab".into(),
                disks: vec!["nvme0c0n1".into(), "nvme0n1".into()],
            },
        );
        now.block.insert("nvme0c0n1".into());
        now.block.insert("nvme0n1".into());
        now.configfs.insert("target/core/fileio_0/lun0".into());
        now.scsi_debug = true;
        now.scsi_devices.insert("6:0:0:0".into(), "sda".into());
        now.block.insert("sda".into());
        now.block.insert("nbd0".into());
        now.loops.insert("loop0".into(), "/tmp/x.img".into());
        now.mounts.insert("/mnt".into(), "ext4 /dev/dm-0".into());
        now.swaps.insert("/dev/sdb".into());
        assert_eq!(
            now.leaks(&base()),
            [
                "iscsid pids 300, 301 running",
                "multipathd pid 412 running",
                "systemd-udevd not running (it ran at the baseline)",
                "dm devices mpatha (dm-0)",
                "iSCSI sessions session1 (iqn.2003-01.org.linux-iscsi.lunkit:lab)",
                "nvme controllers nvme0 (tcp 127.0.0.1:4420 nqn.2014-08.org.lunkit:lab; \
                 nvme0c0n1, nvme0n1)",
                "configfs entries target/core/fileio_0/lun0",
                "scsi_debug loaded",
                "SCSI devices 6:0:0:0 (sda)",
                "block devices nbd0",
                "loop devices loop0 (/tmp/x.img)",
                "mounts /mnt (ext4 /dev/dm-0)",
                "swaps /dev/sdb",
            ]
        );
    }

    #[test]
    fn a_controller_at_the_baseline_is_no_leak_but_one_reconnected_elsewhere_is() {
        let ctrl = |what: &str| NvmeController {
            what: what.into(),
            disks: vec![],
        };
        let mut b = base();
        b.nvme
            .insert("nvme0".into(), ctrl("tcp 127.0.0.1:4420 nqn.a"));
        let mut now = b.clone();
        assert_eq!(now.leaks(&b), Vec::<String>::new());
        now.nvme
            .insert("nvme0".into(), ctrl("tcp 127.0.0.2:4420 nqn.a"));
        assert_eq!(
            now.leaks(&b),
            ["nvme controllers nvme0 (tcp 127.0.0.2:4420 nqn.a)"]
        );
    }

    #[test]
    fn addresses_are_shortened_to_addr_and_port() {
        assert_eq!(
            short_address("traddr=127.0.0.2,trsvcid=4420,src_addr=127.0.0.1"),
            "127.0.0.2:4420"
        );
        assert_eq!(short_address("traddr=10.0.0.1"), "10.0.0.1");
        assert_eq!(short_address(""), "");
        assert_eq!(short_address("nn-0x1:pn-0x2"), "nn-0x1:pn-0x2");
    }

    #[test]
    fn nvmet_objects_go_links_first_and_hosts_last() {
        let nqn = "nvmet/subsystems/nqn.2014-08.org.lunkit:lab";
        let mut objects = vec![
            "nvmet/hosts/nqn.h".to_owned(),
            nqn.to_owned(),
            format!("{nqn}/namespaces/1"),
            format!("{nqn}/allowed_hosts/nqn.h"),
            "nvmet/ports/1".to_owned(),
            "nvmet/ports/1/referrals/r".to_owned(),
            "nvmet/ports/1/subsystems/nqn.2014-08.org.lunkit:lab".to_owned(),
            "target/core/fileio_0/lun0".to_owned(),
            "target/iscsi/iqn.x".to_owned(),
        ];
        objects.sort_by_key(|p| removal_rank(p));
        assert_eq!(
            objects,
            [
                "target/iscsi/iqn.x".to_owned(),
                "target/core/fileio_0/lun0".to_owned(),
                "nvmet/ports/1/subsystems/nqn.2014-08.org.lunkit:lab".to_owned(),
                "nvmet/ports/1/referrals/r".to_owned(),
                "nvmet/ports/1".to_owned(),
                format!("{nqn}/allowed_hosts/nqn.h"),
                format!("{nqn}/namespaces/1"),
                nqn.to_owned(),
                "nvmet/hosts/nqn.h".to_owned(),
            ]
        );
        assert!(is_nvmet_namespace(&format!("{nqn}/namespaces/1")));
        assert!(!is_nvmet_namespace(nqn));
    }

    #[test]
    fn a_process_left_behind_is_a_leak_but_daemon_children_are_not() {
        let me = std::process::id();
        let proc_ = |cmdline: &str, ppid: u32| Process {
            ppid,
            cmdline: cmdline.into(),
        };
        let mut b = base();
        b.processes.insert(me, proc_("xtask", 1));
        b.processes.insert(116, proc_("systemd-udevd", 1));
        let mut now = b.clone();
        now.processes.insert(500, proc_("(udev-worker)", 116));
        now.processes.insert(501, proc_("scsi_id", 500));
        now.processes.insert(502, proc_("modprobe", 2));
        now.processes.insert(503, proc_("dmsetup", me));
        now.processes.insert(600, proc_("sleep", 1));
        assert_eq!(now.leaks(&b), ["processes 600 `sleep`"]);
    }
}

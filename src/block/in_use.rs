//! Who is using a block device: [`usage`] and what it may pass over ([`UsageScope`]),
//! re-exported as `lunkit::block::*`.

use std::collections::BTreeSet;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use rustix::fs::OFlags;

use super::mountinfo;
use crate::block::sysfs as sysblock;
use crate::dm::{Control, DevId};
use crate::error::{Error, Result};
use crate::helper::{self, Subject};
use crate::id::DevNum;
use crate::root::Root;

use super::process::*;
use super::processes::*;
use super::swaps_loops::{SwapsAndLoops, swaps_and_loops};
use super::usage::*;
use super::walks::{CheckIntent, Walking};
use super::{BlockNode, block_number, by_name, open_checked};

/// How long a device held only by open file descriptors (no mount, holder or swap) is given
/// to let go before a take-down refuses: udev's probes open every new or changed disk and map
/// for a moment, and under load that moment lasts seconds.
pub const OPENER_GRACE: std::time::Duration = std::time::Duration::from_secs(3);

/// What [`usage`] should not count as a user.
#[derive(Debug, Clone, Default)]
pub struct UsageScope<'a> {
    /// Kernel names of devices that belong to the volume being taken down (its multipath map
    /// and partition maps): holders among them are not users, but their own users are.
    pub own: &'a [String],
    /// Command names whose open file descriptors on a *path device* (a SCSI disk among the
    /// devices asked about), and whose read-only ones on a map or partition, do not count:
    /// the daemon that manages paths and lets go of them when they are removed
    /// (`multipathd` checks every path), and udev's probes. A map's removal still fails
    /// while a probe holds it, so such a probe delays a take-down but never lets one lose
    /// data.
    ///
    /// A command name is whatever a process sets (`PR_SET_NAME`), so it is not enough: the
    /// process must also run as root and be one of [`MANAGER_EXES`] (`/proc/PID/exe`), or be
    /// a child of udevd (a worker forked from it).
    pub ignore_openers: &'a [&'a str],
}

/// Executables (`/proc/PID/exe` file names) whose processes may be path managers. On
/// current systemd `systemd-udevd` is a link to `udevadm`, which is what `exe` shows.
pub const MANAGER_EXES: &[&str] = &["multipathd", "systemd-udevd", "udevd", "udevadm"];

/// Executables of udevd, whose children (its workers) may be path managers.
pub(super) const UDEVD_EXES: &[&str] = &["systemd-udevd", "udevd", "udevadm"];

/// The devices asked about, their partitions and everything stacked on them.
pub(super) struct Family {
    nodes: Vec<BlockNode>,
}

impl Family {
    pub(super) fn numbers(&self) -> Vec<DevNum> {
        self.nodes.iter().map(|n| n.dev).collect()
    }

    pub(super) fn name_of(&self, d: DevNum) -> String {
        self.nodes
            .iter()
            .find(|n| n.dev == d)
            .map_or_else(|| d.to_string(), |n| n.name.clone())
    }

    /// The family member a devtmpfs bind mount's root (`/dm-0`, `/mapper/mpatha`) is the
    /// node of: by name, or failing that by the number of the node at that path below the
    /// root's `/dev` (a node udev or dm created under another name).
    fn of_node(&self, root: &Root, node: &Path) -> Option<String> {
        let rel = node.strip_prefix("/").unwrap_or(node);
        if let Some(n) = self.nodes.iter().find(|n| Path::new(&n.name) == rel) {
            return Some(n.name.clone());
        }
        let st = rustix::fs::stat(root.dev(rel)).ok()?;
        let d = block_number(&st)?;
        self.nodes
            .iter()
            .find(|n| n.dev == d)
            .map(|n| n.name.clone())
    }

    /// The family's mounts in one mount table, into `usage`.
    pub(super) fn mounts_in(
        &self,
        root: &Root,
        table: &mountinfo::MountTable,
        ns: MountNamespace,
        usage: &mut Usage,
    ) {
        let numbers = self.numbers();
        for m in &table.mounts {
            let found = if numbers.contains(&m.dev) {
                Some((self.name_of(m.dev), MountKind::Filesystem))
            } else {
                m.device_node()
                    .and_then(|node| self.of_node(root, node))
                    .map(|name| (name, MountKind::DeviceNode))
            };
            if let Some((device, kind)) = found {
                let u = MountUse {
                    device,
                    mount_point: m.mount_point.clone(),
                    kind,
                    namespace: ns,
                };
                if !usage.mounts.contains(&u) {
                    usage.mounts.push(u);
                }
            }
        }
        usage.mountinfo_skipped += table.skipped.len();
        for line in &table.skipped {
            if let Some(d) = line.dev.filter(|d| numbers.contains(d)) {
                usage.unchecked.push(Unchecked {
                    what: format!("line {} of the mount table ({ns})", line.number),
                    reason: format!(
                        "it is a mount of {} and did not parse: {}",
                        self.name_of(d),
                        line.reason
                    ),
                });
            }
        }
    }
}

/// Who uses `devices`, their partitions, and whatever is stacked on them (followed up through
/// `holders/`), cheapest and most exact checks first:
///
/// 1. sysfs: `holders/` (stacked devices);
/// 2. the mount tables of the host (`<root>/proc/1/mountinfo`) and of this process: mounts
///    by device number, and bind mounts of the devices' nodes (devtmpfs, by mount root);
/// 3. `/proc/swaps`;
/// 4. bound loop devices backed by the devices (`LOOP_GET_STATUS64`, given until `deadline`);
///
/// and, only when none of those found a user (a refusal needs one reason, not all):
///
/// 5. every process (`/proc/*`, shared out between this thread and helper threads, and
///    started first so that it runs while 1–4 are read): its open fds (`fd/`, or each
///    thread's `task/*/fd/` when the main thread has exited), and the mount table of every
///    mount namespace not read yet (deduplicated by `ns/mnt` inode);
/// 6. one `O_EXCL` open on each device at the top of a stack that nothing above explains,
///    given until `deadline` (an open waits while a partition scan holds the disk).
///
/// A process whose fds or mount table cannot be read (`EACCES` without root or
/// `CAP_SYS_PTRACE`) lands in [`Usage::unchecked`]: the answer is then "could not check",
/// never "not in use".
pub fn usage(
    root: &Root,
    devices: &[BlockNode],
    scope: &UsageScope<'_>,
    deadline: Instant,
) -> Result<Usage> {
    usage_of(root, devices, scope, deadline, None)
}

/// [`usage`] by a check that said beforehand it would ask ([`intend_check`]), so that
/// checks that began together share one walk over the processes.
pub(crate) fn usage_intended(
    root: &Root,
    devices: &[BlockNode],
    scope: &UsageScope<'_>,
    deadline: Instant,
    intent: CheckIntent,
) -> Result<Usage> {
    usage_of(root, devices, scope, deadline, Some(intent))
}

/// [`usage`], by a check that gave its `intent` beforehand if any.
fn usage_of(
    root: &Root,
    devices: &[BlockNode],
    scope: &UsageScope<'_>,
    deadline: Instant,
    intent: Option<CheckIntent>,
) -> Result<Usage> {
    let ask = UsageAsk {
        devices,
        scope: scope.clone(),
    };
    let mut found = usages_of(root, std::slice::from_ref(&ask), deadline, intent)?;
    Ok(found.pop().unwrap_or_default())
}

/// One set of devices for [`usages`], as [`usage`] takes them.
#[derive(Debug, Clone, Default)]
pub struct UsageAsk<'a> {
    /// The devices asked about.
    pub devices: &'a [BlockNode],
    /// What not to count as their users.
    pub scope: UsageScope<'a>,
}

/// [`usage`] of several sets of devices at one time, with one walk over the processes for
/// all of them: what a caller that checks many volumes at once asks (`lunkit doctor`, every
/// iSCSI session and finding). Each answer is the one [`usage`] would give for its set
/// alone, in the order asked; an error fails them all.
///
/// The walk is shared with this process's other checks too: a check takes the first walk
/// that started after it asked, its own when none is under way (started at once, to run
/// while steps 1–4 are read), else the next one, which every check that asked meanwhile
/// shares. Each matches the walk against its own devices.
pub fn usages(root: &Root, asks: &[UsageAsk<'_>], deadline: Instant) -> Result<Vec<Usage>> {
    usages_of(root, asks, deadline, None)
}

/// [`usages`], by a check that gave its `intent` beforehand if any.
fn usages_of(
    root: &Root,
    asks: &[UsageAsk<'_>],
    deadline: Instant,
    intent: Option<CheckIntent>,
) -> Result<Vec<Usage>> {
    if asks.is_empty() {
        return Ok(Vec::new());
    }
    let walking = Walking::start(root, deadline, intent)?;
    let proc_fd = Arc::clone(walking.proc_fd());
    let foreign = foreign_pid_namespace(&proc_fd, &root.proc(""));
    let own = OwnTables::read(root, &proc_fd)?;
    let node = SwapsAndLoops::read(root, deadline)?;
    let mut firsts = Vec::with_capacity(asks.len());
    for ask in asks {
        let mut usage = Usage::default();
        usage.unchecked.extend(foreign.clone());
        let family = first_looks(root, ask, &own, &node, &mut usage)?;
        firsts.push((family, usage));
    }
    // Users found already in every set: the refusals need no more. The walk's shares
    // finish on their own.
    if firsts.iter().all(|(_, u)| u.has_users()) {
        return Ok(firsts.into_iter().map(|(_, u)| u).collect());
    }
    let walk = walking.collected(root, deadline)?;
    let read_already = own.root_mounts();
    let mut out = Vec::with_capacity(firsts.len());
    for ((family, mut usage), ask) in firsts.into_iter().zip(asks) {
        if !usage.has_users() {
            let scan = walk.matched(&family, &read_already);
            add_walk(&proc_fd, scan, &family, ask, &mut usage, root);
            probe_claims(root, &family, deadline, &mut usage)?;
        }
        out.push(usage);
    }
    Ok(out)
}

/// Steps 1–4 for one set, into `usage`: its family (returned) and holders, its mounts in
/// the host's and this process's tables, swaps and loop devices.
fn first_looks(
    root: &Root,
    ask: &UsageAsk<'_>,
    own: &OwnTables,
    node: &SwapsAndLoops,
    usage: &mut Usage,
) -> Result<Family> {
    let (family, holders) = family_of(root, ask.devices, ask.scope.own)?;
    usage.holders = holders;
    own.mounts(root, &family, usage);
    swaps_and_loops(&family, node, usage);
    Ok(family)
}

/// Step 5 for one set: what the walk found of its family, into `usage`. A path manager's
/// descriptor is set apart from the openers (see [`UsageScope::ignore_openers`]).
fn add_walk(
    proc_fd: &OwnedFd,
    scan: ProcScan,
    family: &Family,
    ask: &UsageAsk<'_>,
    usage: &mut Usage,
    root: &Root,
) {
    usage.unchecked.extend(scan.unchecked);
    usage.mountinfo_skipped += scan.usage.mountinfo_skipped;
    for m in scan.usage.mounts {
        if !usage.mounts.contains(&m) {
            usage.mounts.push(m);
        }
    }
    usage.unchecked.extend(scan.usage.unchecked);
    let opener = |o: OpenFd| Opener {
        pid: o.pid,
        device: family.name_of(o.dev),
        read_only: o.read_only,
        comm: o.comm,
    };
    usage.helpers = scan.helpers.into_iter().map(opener).collect();
    usage.mapped = scan.mapped.into_iter().map(opener).collect();
    let paths = path_numbers(root, ask.devices);
    for o in scan.openers {
        let on_path = paths.contains(&o.dev);
        let opener = opener(o);
        // On a path a manager's descriptor is not a use: multipathd checks every path, and
        // udev probes it. On a map or a partition only a read-only one is (udev's blkid), and
        // it is listed, not ignored: the map's removal still waits for it to close, and a map
        // no path can serve is not taken down while it is open (ops::detach).
        if (on_path || opener.read_only)
            && ask.scope.ignore_openers.contains(&opener.comm.as_str())
            && is_path_manager(proc_fd, opener.pid)
        {
            usage.managers.push(opener);
        } else {
            usage.openers.push(opener);
        }
    }
}

/// Every device whose users count: `devices`, their partitions, and foreign stacks on them;
/// plus the volume's own devices (`own`, kernel names), whose mounts and openers count too.
/// Also returns the holders that are not `own`, sorted.
fn family_of(root: &Root, devices: &[BlockNode], own: &[String]) -> Result<(Family, Vec<String>)> {
    let mut family: BTreeSet<BlockNode> = BTreeSet::new();
    let mut todo: Vec<BlockNode> = devices.to_vec();
    for o in own {
        if let Some(n) = by_name(root, o)? {
            todo.push(n);
        }
    }
    let mut foreign_holders = BTreeSet::new();
    while let Some(n) = todo.pop() {
        if family.len() > 4096 || !family.insert(n.clone()) {
            continue;
        }
        for sub in sysblock::partitions(root, &n.name)? {
            if let Some(p) = by_name(root, &sub)? {
                todo.push(p);
            }
        }
        for h in sysblock::holders(root, &n.name)? {
            if !own.contains(&h) {
                foreign_holders.insert(h.clone());
            }
            if let Some(hn) = by_name(root, &h)? {
                todo.push(hn);
            }
        }
    }
    let family = Family {
        nodes: family.into_iter().collect(),
    };
    Ok((family, foreign_holders.into_iter().collect()))
}

/// The devices the path-manager rule applies to: SCSI disks asked about, not maps (a `dm/`
/// directory), partitions, or an NVMe namespace head (the device users open, like a map:
/// only a manager's read-only open of it, udev's probe, is not a use).
fn path_numbers(root: &Root, devices: &[BlockNode]) -> Vec<DevNum> {
    devices
        .iter()
        .filter(|n| {
            !sysblock::is_dm(root, &n.name)
                && !sysblock::is_partition(root, &n.name)
                && sysblock::scsi_address(root, &n.name).is_some()
        })
        .map(|n| n.dev)
        .collect()
}

/// The host's mount table (pid 1's) and this process's, which a check reads itself rather
/// than leaving them to the walk: read once for every set it asks about.
struct OwnTables {
    tables: Vec<(mountinfo::MountTable, MountNamespace)>,
    /// The host's table could not be read.
    unchecked: Option<Unchecked>,
}

impl OwnTables {
    /// The host's table, then this process's if it is in another namespace (or which one
    /// cannot be told) and is not the same table.
    fn read(root: &Root, proc_fd: &OwnedFd) -> Result<OwnTables> {
        let host = mnt_ns(proc_fd.as_fd(), "1").ok();
        let this = mnt_ns(proc_fd.as_fd(), "self").ok();
        let mut seen = SeenNamespaces::default();
        let mut own = OwnTables {
            tables: Vec::new(),
            unchecked: None,
        };
        match mountinfo::read_of(root, 1) {
            Ok(table) => {
                seen.claim_table(&table);
                let ns = MountNamespace {
                    inode: host,
                    pid: Some(1),
                };
                own.tables.push((table, ns));
            }
            // A tree without pid 1 (a fixture): this process's table stands for it.
            Err(e) if e.is_gone() => {}
            Err(e) => {
                own.unchecked = Some(Unchecked {
                    what: "the mount table of pid 1".into(),
                    reason: e.to_string(),
                });
            }
        }
        if this.is_none() || this != host {
            let table = mountinfo::read(root)?;
            if seen.claim_table(&table) {
                let ns = MountNamespace {
                    inode: this,
                    pid: None,
                };
                own.tables.push((table, ns));
            }
        }
        Ok(own)
    }

    /// The family's mounts in these tables, into `usage`.
    fn mounts(&self, root: &Root, family: &Family, usage: &mut Usage) {
        for (table, ns) in &self.tables {
            family.mounts_in(root, table, *ns, usage);
        }
        usage.unchecked.extend(self.unchecked.clone());
    }

    /// Each table's root mount id: the walk's copies of these are not matched again.
    fn root_mounts(&self) -> Vec<u32> {
        self.tables
            .iter()
            .filter_map(|(t, _)| t.mounts.first().map(|m| m.id))
            .collect()
    }
}

/// The `O_EXCL` probe. It explains nothing by itself, so only devices nothing else accounts
/// for are asked: tops of stacks that are not mounted or swap. A claim is an open, so a map
/// device-mapper counts no opener of cannot be claimed: its count is one ioctl, where the
/// probe is a thread and an open.
fn probe_claims(root: &Root, family: &Family, deadline: Instant, usage: &mut Usage) -> Result<()> {
    let mut dm: Option<Option<Control>> = None;
    for n in &family.nodes {
        let top = sysblock::holders(root, &n.name)?.is_empty();
        let explained = usage.mounts.iter().any(|m| m.device == n.name)
            || usage.swaps.contains(&n.name)
            || usage.holders.contains(&n.name);
        if !top || explained {
            continue;
        }
        if sysblock::is_dm(root, &n.name) {
            let ctl = dm.get_or_insert_with(|| Control::open(root).ok());
            let unopened = ctl
                .as_ref()
                .and_then(|c| c.info(&DevId::Dev(n.dev)).ok())
                .is_some_and(|i| i.open_count == 0);
            if unopened {
                continue;
            }
        }
        if is_claimed(n, deadline)? {
            usage.claimed.push(n.name.clone());
        }
    }
    Ok(())
}

/// The inode number of the initial pid namespace's `ns/pid` link (`PROC_PID_INIT_INO` in the
/// kernel's `proc_ns.h`): fixed, so pid 1 of the host's `/proc` always shows `pid:[4026531836]`.
const HOST_PID_NS: &[u8] = b"pid:[4026531836]";

/// [`Unchecked`] when the procfs at `proc_dir` belongs to a pid namespace other than the
/// host's (a node plugin's container without `hostPID`): its pid 1 is not the host's init,
/// so the processes and mount namespaces outside it, kubelet's and the pods', are not seen
/// and the check cannot call anything unused. `None` when it is the host's, or when that
/// cannot be told (`ns/pid` unreadable without ptrace access, or absent in a fixture).
fn foreign_pid_namespace(proc_fd: &OwnedFd, proc_dir: &Path) -> Option<Unchecked> {
    let link = rustix::fs::readlinkat(proc_fd, "1/ns/pid", Vec::new()).ok()?;
    (link.as_bytes() != HOST_PID_NS).then(|| Unchecked {
        what: "the processes outside this pid namespace".into(),
        reason: format!(
            "pid 1 of {} is in {}, not the host's pid namespace: give the check the host's \
             /proc (hostPID, or the host's root with --root)",
            proc_dir.display(),
            link.to_string_lossy()
        ),
    })
}

/// Whether an `O_EXCL` open of the node fails with `EBUSY`: a filesystem, swap, dm, md or
/// another exclusive opener has claimed it. A node that cannot be opened for another reason
/// says nothing. The open runs on a helper thread until `deadline` ([`Error::Timeout`]
/// then): it waits while a partition scan holds the disk, for as long as the scan's reads
/// take.
fn is_claimed(node: &BlockNode, deadline: Instant) -> Result<bool> {
    let what = || format!("O_EXCL probe of {node} (its open is waiting for the disk)");
    let probe = node.clone();
    helper::bounded(
        Subject::device("O_EXCL probe", node.dev),
        deadline,
        &what,
        move || match open_checked(&probe, OFlags::EXCL | OFlags::NONBLOCK) {
            Ok(fd) => {
                let _held = helper::hold(fd.as_fd(), probe.dev);
                Ok(false)
            }
            Err(Error::Io { source, .. }) => Ok(source.raw_os_error() == Some(libc::EBUSY)),
            Err(_) => Ok(false),
        },
    )
}

/// The device number of a node path as written in `/proc/swaps`, looked up below the root.
pub(super) fn node_number(root: &Root, path: &Path) -> Option<DevNum> {
    let p = root.path().join(path.strip_prefix("/").unwrap_or(path));
    block_number(&rustix::fs::stat(&p).ok()?)
}

/// The active swap areas in `<root>/proc/swaps`. An absent file (no swap support) is none.
pub(super) fn swaps(root: &Root) -> Result<Vec<PathBuf>> {
    let path = root.proc("swaps");
    match std::fs::read(&path) {
        Ok(text) => Ok(parse_swaps(&text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(Error::io(&path, e)),
    }
}

/// The file names in `/proc/swaps` text: the first column after the header, with the same
/// octal escapes as mountinfo.
pub fn parse_swaps(text: &[u8]) -> Vec<PathBuf> {
    use std::os::unix::ffi::OsStringExt;
    text.split(|&b| b == b'\n')
        .skip(1)
        .filter_map(|l| {
            l.split(|&b| b == b' ' || b == b'\t')
                .find(|f| !f.is_empty())
        })
        .map(|f| PathBuf::from(std::ffi::OsString::from_vec(mountinfo::unescape(f))))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn swaps_parse_with_escapes() {
        let text = b"Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n\
/dev/sdc2                               partition\t1048572\t\t0\t\t-2\n\
/swap\\040file                           file\t\t1024\t\t0\t\t-3\n";
        assert_eq!(
            parse_swaps(text),
            [PathBuf::from("/dev/sdc2"), PathBuf::from("/swap file")]
        );
        assert!(parse_swaps(b"Filename Type Size Used Priority\n").is_empty());
        assert!(parse_swaps(b"").is_empty());
    }

    #[test]
    fn a_proc_of_another_pid_namespace_is_said() {
        let dir = std::env::temp_dir().join(format!("lunkit-pidns-{}", std::process::id()));
        let ns = dir.join("1/ns");
        std::fs::create_dir_all(&ns).unwrap();
        let open = || {
            rustix::fs::open(
                &dir,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )
            .unwrap()
        };
        // No link to read (a fixture, or no ptrace access): nothing can be said.
        assert_eq!(foreign_pid_namespace(&open(), &dir), None);
        std::os::unix::fs::symlink("pid:[4026531836]", ns.join("pid")).unwrap();
        assert_eq!(foreign_pid_namespace(&open(), &dir), None);
        std::fs::remove_file(ns.join("pid")).unwrap();
        std::os::unix::fs::symlink("pid:[4026532301]", ns.join("pid")).unwrap();
        let u = foreign_pid_namespace(&open(), &dir).expect("another pid namespace");
        assert!(u.reason.contains("pid:[4026532301]"), "{u:?}");
        assert!(u.reason.contains("hostPID"), "{u:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn fdinfo_access_modes() {
        let ro = b"pos:\t0\nflags:\t0100000\nmnt_id:\t22\nino:\t5\n";
        assert_eq!(fdinfo_access_mode(ro), Some(libc::O_RDONLY));
        assert_eq!(
            fdinfo_access_mode(b"pos:\t0\nflags:\t02100002\n"),
            Some(libc::O_RDWR)
        );
        assert_eq!(fdinfo_access_mode(b"flags:\t01\n"), Some(libc::O_WRONLY));
        assert_eq!(fdinfo_access_mode(b"pos:\t0\n"), None);
        assert_eq!(fdinfo_access_mode(b"flags:\t9z\n"), None);
        assert_eq!(fdinfo_access_mode(b"flags:\t0\xff\n"), None);
    }
}

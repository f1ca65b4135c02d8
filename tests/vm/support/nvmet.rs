//! An NVMe/TCP target built through nvmet's configfs, without nvmetcli or nvme-cli: one
//! subsystem open to any host, file-backed namespaces with known identities, and TCP ports on
//! loopback addresses that each export the subsystem, so a host that connects once per port
//! has one path per port under its native multipath head.
//!
//! The backing files live in a tmpfs the target mounts itself: through the guest's /tmp (an
//! overlay) nvmet sizes a file-backed namespace at 0 bytes.
//!
//! Host-side controllers are not the target's: a test deletes those it connected, and the
//! runner's lab reset deletes any it left.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{Result, cmd, sysfs, wait};

const CONFIGFS: &str = "/sys/kernel/config";
const NVMET: &str = "/sys/kernel/config/nvmet";
/// Each target's tmpfs is mounted at `/run/lunkit-nvmet/<NQN>`: its own, so teardown leaves
/// nothing and two targets do not share files.
pub const TMPFS_ROOT: &str = "/run/lunkit-nvmet";
/// The subsystem the lab serves unless a test names another.
pub const DEFAULT_NQN: &str = "nqn.2014-08.org.lunkit:lab";
/// The NVMe/TCP well-known port.
pub const TRSVCID: &str = "4420";
/// The target and the host modules; nvme-fabrics and nvme-core come as dependencies.
const MODULES: &[&str] = &["nvmet", "nvmet-tcp", "nvme-tcp"];
/// How long a step of teardown may keep failing before it is given up (umount while nvmet
/// still holds a file).
const TEARDOWN: Duration = Duration::from_secs(10);

/// One TCP port of the target: nvmet's `ports/<id>`, listening on `traddr:trsvcid`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortConfig {
    /// The port's directory name, unique among all nvmet ports of the guest.
    pub id: u16,
    pub traddr: String,
    pub trsvcid: String,
    /// Whether the port's discovery entries say a secure channel (TLS) is required
    /// (`addr_treq`). 6.1's nvmet only reports it: it still takes plain connects.
    pub tls_required: bool,
}

impl PortConfig {
    pub fn new(id: u16, traddr: &str, trsvcid: &str) -> Self {
        Self {
            id,
            traddr: traddr.to_owned(),
            trsvcid: trsvcid.to_owned(),
            tls_required: false,
        }
    }

    /// The port, listed in the discovery log as requiring TLS ([`PortConfig::tls_required`]).
    pub fn requiring_tls(self) -> Self {
        Self {
            tls_required: true,
            ..self
        }
    }

    /// The two ports of the lab: 127.0.0.1 and 127.0.0.2 on 4420, two paths to one subsystem.
    pub fn lab_pair() -> Vec<PortConfig> {
        vec![
            PortConfig::new(1, "127.0.0.1", TRSVCID),
            PortConfig::new(2, "127.0.0.2", TRSVCID),
        ]
    }
}

/// One namespace as the target serves it: the identities the host reads back (`uuid`,
/// `nguid`, and `wwid` = `uuid.<uuid>`), the size, and the file behind it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Namespace {
    pub nsid: u32,
    /// Bytes; follows [`Target::grow`].
    pub size: u64,
    /// `device_uuid`, lower case with dashes, as the host's sysfs prints it.
    pub uuid: String,
    /// `device_nguid`, in the same form (the host prints it like a UUID too).
    pub nguid: String,
    /// The backing file in the target's tmpfs.
    pub file: PathBuf,
}

/// What to build; [`Target::builder`] starts one.
#[derive(Debug, Clone)]
pub struct TargetBuilder {
    nqn: String,
    namespaces: Vec<(u32, u64)>,
    ports: Vec<PortConfig>,
}

impl TargetBuilder {
    /// The subsystem NQN (default [`DEFAULT_NQN`]).
    pub fn nqn(mut self, nqn: &str) -> Self {
        nqn.clone_into(&mut self.nqn);
        self
    }

    /// A namespace of `size` bytes with the next free nsid (1, 2, ...).
    pub fn namespace(self, size: u64) -> Self {
        let nsid = self.namespaces.iter().map(|(n, _)| *n).max().unwrap_or(0) + 1;
        self.namespace_id(nsid, size)
    }

    /// A namespace of `size` bytes with nsid `nsid`.
    pub fn namespace_id(mut self, nsid: u32, size: u64) -> Self {
        self.namespaces.push((nsid, size));
        self
    }

    /// A port; the first call replaces the default pair ([`PortConfig::lab_pair`]).
    pub fn port(mut self, port: PortConfig) -> Self {
        self.ports.push(port);
        self
    }

    /// Loads the modules, mounts configfs and the tmpfs, and builds the subsystem, its
    /// namespaces and its ports. On failure, what was built is removed again.
    pub fn build(self) -> Result<Target> {
        load_modules()?;
        mount_configfs()?;
        let ports = if self.ports.is_empty() {
            PortConfig::lab_pair()
        } else {
            self.ports
        };
        for port in &ports {
            ensure_local(&port.traddr)?;
        }
        let mut target = Target {
            serial: serial(&self.nqn),
            dir: Path::new(TMPFS_ROOT).join(self.nqn.replace('/', "_")),
            nqn: self.nqn,
            namespaces: BTreeMap::new(),
            ports: Vec::new(),
            referrals: Vec::new(),
            hosts: Vec::new(),
            live: false,
        };
        // Before anything is made: a failed build removes what the target holds, and that
        // must never be another target's subsystem or tmpfs.
        target.check_free(&ports)?;
        target.live = true;
        if let Err(e) = target.build(&self.namespaces, &ports) {
            target.live = false;
            let _ = target.remove();
            return Err(e);
        }
        Ok(target)
    }
}

/// A configured nvmet subsystem; [`Target::teardown`] (or drop) removes it, its ports, its
/// namespaces and its tmpfs, and leaves the modules loaded.
#[derive(Debug)]
pub struct Target {
    nqn: String,
    serial: String,
    /// The tmpfs mount point holding the backing files.
    dir: PathBuf,
    namespaces: BTreeMap<u32, Namespace>,
    ports: Vec<PortConfig>,
    /// Referrals made with [`Target::add_referral`]: (port id, name).
    referrals: Vec<(u16, String)>,
    /// Hosts made with [`Target::require_host`]: `hosts/<nqn>`, linked from the subsystem.
    hosts: Vec<String>,
    live: bool,
}

impl Target {
    /// [`DEFAULT_NQN`] on the two lab ports, without namespaces until some are added.
    pub fn builder() -> TargetBuilder {
        TargetBuilder {
            nqn: DEFAULT_NQN.to_owned(),
            namespaces: Vec::new(),
            ports: Vec::new(),
        }
    }

    pub fn nqn(&self) -> &str {
        &self.nqn
    }

    /// `attr_serial`, which the host shows in `serial` padded with spaces to 20 characters.
    pub fn serial(&self) -> &str {
        &self.serial
    }

    /// The ports still there (see [`remove_port`](Self::remove_port)).
    pub fn ports(&self) -> &[PortConfig] {
        &self.ports
    }

    /// The namespaces, by nsid.
    pub fn namespaces(&self) -> impl Iterator<Item = &Namespace> {
        self.namespaces.values()
    }

    /// Namespace `nsid`; an error names the nsids there are.
    pub fn namespace(&self, nsid: u32) -> Result<&Namespace> {
        self.namespaces.get(&nsid).ok_or_else(|| {
            let have: Vec<u32> = self.namespaces.keys().copied().collect();
            format!("{}: no namespace {nsid} (have {have:?})", self.nqn).into()
        })
    }

    /// The backing file of namespace `nsid`.
    pub fn file(&self, nsid: u32) -> Result<&Path> {
        Ok(&self.namespace(nsid)?.file)
    }

    fn subsystem_dir(&self) -> PathBuf {
        Path::new(NVMET).join("subsystems").join(&self.nqn)
    }

    fn namespace_dir(&self, nsid: u32) -> PathBuf {
        self.subsystem_dir()
            .join("namespaces")
            .join(nsid.to_string())
    }

    /// Fails if the subsystem, the tmpfs or one of the ports exists already: a target of
    /// this NQN (or with these port ids) that was not torn down.
    fn check_free(&self, ports: &[PortConfig]) -> Result<()> {
        let taken = [self.subsystem_dir(), self.dir.clone()]
            .into_iter()
            .chain(ports.iter().map(|p| port_dir(p.id)))
            .find(|p| p.exists() && (p != &self.dir || is_mountpoint(&self.dir)));
        match taken {
            Some(p) => {
                Err(format!("{} exists already: a target not torn down?", p.display()).into())
            }
            None => Ok(()),
        }
    }

    fn build(&mut self, namespaces: &[(u32, u64)], ports: &[PortConfig]) -> Result<()> {
        mount_tmpfs(&self.dir)?;
        let subsys = self.subsystem_dir();
        mkdir_new(&subsys)?;
        write(&subsys.join("attr_allow_any_host"), "1")?;
        write(&subsys.join("attr_serial"), &self.serial)?;
        for &(nsid, size) in namespaces {
            self.add_namespace(nsid, size)?;
        }
        for port in ports {
            self.add_port(port.clone())?;
        }
        Ok(())
    }

    /// Adds namespace `nsid` of `size` bytes on a new sparse file, with its known `uuid` and
    /// `nguid` ([`namespace_uuid`], [`namespace_nguid`]). Connected hosts learn of it through
    /// a namespace-change event and scan it.
    pub fn add_namespace(&mut self, nsid: u32, size: u64) -> Result<&Namespace> {
        if self.namespaces.contains_key(&nsid) {
            return Err(format!("{}: namespace {nsid} exists already", self.nqn).into());
        }
        let ns = Namespace {
            nsid,
            size,
            uuid: namespace_uuid(&self.nqn, nsid),
            nguid: namespace_nguid(&self.nqn, nsid),
            file: self.dir.join(format!("ns{nsid}.img")),
        };
        create_sparse(&ns.file, size)?;
        let dir = self.namespace_dir(nsid);
        let enabled = enable_namespace(&dir, &ns);
        if enabled.is_err() {
            remove_namespace_dir(&dir);
            let _ = fs::remove_file(&ns.file);
        }
        enabled?;
        Ok(self.namespaces.entry(nsid).or_insert(ns))
    }

    /// Disables and removes namespace `nsid` and deletes its file: the LUN taken away on
    /// the array. Connected hosts get a namespace-change event and remove their disk.
    pub fn remove_namespace(&mut self, nsid: u32) -> Result<()> {
        let ns = self.namespace(nsid)?.clone();
        let dir = self.namespace_dir(nsid);
        write(&dir.join("enable"), "0")?;
        rmdir(&dir)?;
        self.namespaces.remove(&nsid);
        fs::remove_file(&ns.file).map_err(|e| format!("remove {}: {e}", ns.file.display()).into())
    }

    /// Hides (`false`) or shows again (`true`) namespace `nsid`, keeping its file: an array
    /// masking a namespace for a moment. Connected hosts get a namespace-change event, and
    /// remove or scan its disk.
    pub fn set_namespace_enabled(&self, nsid: u32, on: bool) -> Result<()> {
        self.namespace(nsid)?;
        write(
            &self.namespace_dir(nsid).join("enable"),
            if on { "1" } else { "0" },
        )
    }

    /// Creates `port` and links the subsystem to it: nvmet starts listening when the first
    /// subsystem is linked.
    pub fn add_port(&mut self, port: PortConfig) -> Result<()> {
        if self.ports.iter().any(|p| p.id == port.id) {
            return Err(format!("{}: port {} exists already", self.nqn, port.id).into());
        }
        ensure_local(&port.traddr)?;
        let dir = port_dir(port.id);
        // Another target's port with this id is not ours to clean up after a failure.
        mkdir_new(&dir)?;
        let made = configure_port(&dir, &port).and_then(|()| link(&self.subsystem_dir(), &dir));
        if made.is_err() {
            unlink_port(&dir, &self.nqn);
        }
        made?;
        self.ports.push(port);
        Ok(())
    }

    /// Makes port `port_id`'s discovery log refer hosts to the discovery service at
    /// `traddr`:`trsvcid` (a subtype 1 entry, `ports/<id>/referrals/<name>`). nvmet raises a
    /// discovery-change event to the hosts connected to that port.
    pub fn add_referral(
        &mut self,
        port_id: u16,
        name: &str,
        traddr: &str,
        trsvcid: &str,
    ) -> Result<()> {
        if !self.ports.iter().any(|p| p.id == port_id) {
            return Err(format!("{}: no port {port_id} for a referral", self.nqn).into());
        }
        let dir = port_dir(port_id).join("referrals").join(name);
        mkdir_new(&dir)?;
        let made = (|| {
            write(&dir.join("addr_trtype"), "tcp")?;
            write(&dir.join("addr_adrfam"), "ipv4")?;
            write(&dir.join("addr_traddr"), traddr)?;
            write(&dir.join("addr_trsvcid"), trsvcid)?;
            write(&dir.join("enable"), "1")
        })();
        if made.is_err() {
            remove_referral_dir(&dir);
            return made;
        }
        self.referrals.push((port_id, name.to_owned()));
        Ok(())
    }

    /// Removes referral `name` of port `port_id` ([`Target::add_referral`]); nvmet raises a
    /// discovery-change event to the hosts connected to that port.
    pub fn remove_referral(&mut self, port_id: u16, name: &str) -> Result<()> {
        let Some(i) = self
            .referrals
            .iter()
            .position(|(p, n)| *p == port_id && n == name)
        else {
            return Err(format!("{}: no referral {name} on port {port_id}", self.nqn).into());
        };
        let dir = port_dir(port_id).join("referrals").join(name);
        remove_referral_dir(&dir);
        if dir.exists() {
            return Err(format!("{} is still there", dir.display()).into());
        }
        self.referrals.remove(i);
        Ok(())
    }

    /// Lets only `hostnqn` in from now on (`attr_allow_any_host` 0, an `allowed_hosts`
    /// link), and, with `key`, only once it authenticates with DH-HMAC-CHAP
    /// (`hosts/<nqn>/dhchap_key`; `ctrl_key` makes it bidirectional: the target proves
    /// itself with it). Needs a kernel built with `CONFIG_NVME_TARGET_AUTH` for the keys.
    pub fn require_host(
        &mut self,
        hostnqn: &str,
        key: Option<&str>,
        ctrl_key: Option<&str>,
    ) -> Result<()> {
        let host = Path::new(NVMET).join("hosts").join(hostnqn);
        mkdir_new(&host)?;
        self.hosts.push(hostnqn.to_owned());
        if let Some(k) = key {
            write(&host.join("dhchap_key"), k)?;
        }
        if let Some(k) = ctrl_key {
            write(&host.join("dhchap_ctrl_key"), k)?;
        }
        let subsys = self.subsystem_dir();
        write(&subsys.join("attr_allow_any_host"), "0")?;
        let at = subsys.join("allowed_hosts").join(hostnqn);
        std::os::unix::fs::symlink(&host, &at)
            .map_err(|e| format!("link {} to {}: {e}", at.display(), host.display()).into())
    }

    /// Changes the controller key host `hostnqn` (one [`Target::require_host`] made) is
    /// shown from now on (`hosts/<nqn>/dhchap_ctrl_key`): a host that expects the old one
    /// refuses the controllers of new connects; those connected already stay.
    pub fn set_host_ctrl_key(&mut self, hostnqn: &str, ctrl_key: &str) -> Result<()> {
        if !self.hosts.iter().any(|h| h == hostnqn) {
            return Err(format!("{}: no host {hostnqn} required", self.nqn).into());
        }
        let host = Path::new(NVMET).join("hosts").join(hostnqn);
        write(&host.join("dhchap_ctrl_key"), ctrl_key)
    }

    /// Removes port `id`: the target port going away under a live host. Unlinking the
    /// subsystem stops the listener and drops the controllers connected through it, so the
    /// host's controller on that path starts reconnecting.
    pub fn remove_port(&mut self, id: u16) -> Result<()> {
        let Some(i) = self.ports.iter().position(|p| p.id == id) else {
            return Err(format!("{}: no port {id}", self.nqn).into());
        };
        let dir = port_dir(id);
        self.remove_referrals(Some(id));
        let link = dir.join("subsystems").join(&self.nqn);
        fs::remove_file(&link).map_err(|e| format!("unlink {}: {e}", link.display()))?;
        rmdir(&dir)?;
        self.ports.remove(i);
        Ok(())
    }

    /// Grows namespace `nsid`'s file to `size` bytes and tells nvmet (`revalidate_size`),
    /// which raises a namespace-change event: connected hosts rescan and see the new size.
    pub fn grow(&mut self, nsid: u32, size: u64) -> Result<()> {
        self.grow_quietly(nsid, size)?;
        write(&self.namespace_dir(nsid).join("revalidate_size"), "1")
    }

    /// Grows namespace `nsid`'s file to `size` bytes without telling nvmet: hosts learn of it
    /// only when nvmet next looks at the file, which it does when a host sends Identify
    /// Namespace (and then raises the namespace-change event). What an array that grew a
    /// volume without a notice looks like.
    pub fn grow_quietly(&mut self, nsid: u32, size: u64) -> Result<()> {
        let ns = self.namespace(nsid)?;
        if size < ns.size {
            return Err(format!(
                "{}: namespace {nsid} is {} bytes; grow to {size} would shrink it",
                self.nqn, ns.size
            )
            .into());
        }
        let file = OpenOptions::new()
            .write(true)
            .open(&ns.file)
            .map_err(|e| format!("open {}: {e}", ns.file.display()))?;
        file.set_len(size)
            .map_err(|e| format!("grow {} to {size}: {e}", ns.file.display()))?;
        if let Some(ns) = self.namespaces.get_mut(&nsid) {
            ns.size = size;
        }
        Ok(())
    }

    /// `len` bytes of namespace `nsid` at `offset`, read from its backing file: what the host
    /// wrote, to compare with what it meant to write.
    pub fn read(&self, nsid: u32, offset: u64, len: usize) -> Result<Vec<u8>> {
        let path = self.file(nsid)?;
        let mut buf = vec![0; len];
        File::open(path)
            .and_then(|f| f.read_exact_at(&mut buf, offset))
            .map_err(|e| format!("read {len} bytes at {offset} of {}: {e}", path.display()))?;
        Ok(buf)
    }

    /// Writes `data` into namespace `nsid`'s backing file at `offset`: data the host should
    /// read (nvmet uses buffered I/O on the file, so the host sees it on its next read).
    pub fn write(&self, nsid: u32, offset: u64, data: &[u8]) -> Result<()> {
        let path = self.file(nsid)?;
        OpenOptions::new()
            .write(true)
            .open(path)
            .and_then(|f| f.write_all_at(data, offset))
            .map_err(|e| {
                let len = data.len();
                format!("write {len} bytes at {offset} of {}: {e}", path.display()).into()
            })
    }

    /// Removes the target and says what is left if anything is. Disconnect the host first:
    /// its controllers to a subsystem that is gone keep reconnecting until their
    /// `ctrl_loss_tmo`.
    pub fn teardown(mut self) -> Result<()> {
        self.live = false;
        self.remove()
    }

    /// Best effort, in the order configfs demands (a subsystem that a port links is busy):
    /// port links, ports, namespaces (disabled first), the subsystem, then the tmpfs. A failed
    /// step does not stop the others; the result names everything still there.
    fn remove(&mut self) -> Result<()> {
        self.remove_referrals(None);
        for host in std::mem::take(&mut self.hosts) {
            let _ = fs::remove_file(self.subsystem_dir().join("allowed_hosts").join(&host));
            let _ = fs::remove_dir(Path::new(NVMET).join("hosts").join(&host));
        }
        for port in &self.ports {
            unlink_port(&port_dir(port.id), &self.nqn);
        }
        for nsid in self.namespaces.keys() {
            remove_namespace_dir(&self.namespace_dir(*nsid));
        }
        let subsys = self.subsystem_dir();
        let _ = fs::remove_dir(&subsys);
        let unmounted = unmount_tmpfs(&self.dir);
        let mut left: Vec<String> = self
            .ports
            .iter()
            .map(|p| port_dir(p.id))
            .chain([subsys])
            .filter(|p| p.exists())
            .map(|p| p.display().to_string())
            .collect();
        if let Err(e) = unmounted {
            left.push(e.to_string());
        }
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!("{}: left after teardown: {}", self.nqn, left.join("; ")).into())
        }
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        if self.live {
            self.live = false;
            if let Err(e) = self.remove() {
                eprintln!("nvmet: {e}");
            }
        }
    }
}

/// The `device_uuid` of namespace `nsid` of subsystem `nqn`: a v4-shaped UUID whose first
/// group is a hash of the NQN and whose last is the nsid, so every namespace of the lab has
/// its own and a test can tell which one a disk is.
pub fn namespace_uuid(nqn: &str, nsid: u32) -> String {
    format!("{:08x}-5e7a-4000-8000-{nsid:012x}", fnv1a(nqn))
}

/// The `device_nguid` of namespace `nsid` of `nqn`: like [`namespace_uuid`] but different
/// from it, so a test can tell which identity a reader took.
pub fn namespace_nguid(nqn: &str, nsid: u32) -> String {
    format!("{:08x}-5e7a-6e67-0000-{nsid:012x}", fnv1a(nqn))
}

/// The `attr_serial` of subsystem `nqn` (20 characters at most).
pub fn serial(nqn: &str) -> String {
    format!("lunkit{:08x}", fnv1a(nqn))
}

/// 32-bit FNV-1a: a stable hash without a dependency.
fn fnv1a(s: &str) -> u32 {
    s.bytes().fold(0x811c_9dc5, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

/// Loads nvmet, nvmet-tcp and nvme-tcp (the host side, for the tests that connect).
pub fn load_modules() -> Result<()> {
    cmd::modprobe(MODULES)
}

/// Mounts configfs unless it is (the bare guest does not mount it; lio.rs may have).
fn mount_configfs() -> Result<()> {
    if !Path::new(NVMET).is_dir() {
        cmd::run("mount", &["-t", "configfs", "configfs", CONFIGFS])?;
    }
    if Path::new(NVMET).is_dir() {
        Ok(())
    } else {
        Err(format!("{NVMET} missing after loading nvmet and mounting configfs").into())
    }
}

/// Fails unless `addr` is delivered locally. Linux routes all of 127/8 to `lo` (the `local`
/// table has `local 127.0.0.0/8 dev lo`), so 127.0.0.2 works without being added to `lo`:
/// nvmet binds it and the host connects to it (from source 127.0.0.1).
///
/// Read from the kernel's routing tables (`/proc/net/fib_trie`: a `LOCAL` prefix holding
/// `addr`) without spawning `ip`; `ip route get` decides only when that finds none.
fn ensure_local(addr: &str) -> Result<()> {
    if sysfs::delivered_locally(addr) {
        return Ok(());
    }
    let route = cmd::run("ip", &["-o", "route", "get", addr])?;
    if route.starts_with("local ") {
        Ok(())
    } else {
        Err(format!("{addr} is not a local address: `ip route get {addr}` says {route:?}").into())
    }
}

/// Mounts a tmpfs of its own at `dir`; fails if something is mounted there already (a target
/// with this NQN that was not torn down).
fn mount_tmpfs(dir: &Path) -> Result<()> {
    let point = dir.to_str().ok_or("tmpfs path is not UTF-8")?;
    if is_mountpoint(dir) {
        return Err(format!("{point} is mounted already: a target of this NQN is still up").into());
    }
    mkdir(dir)?;
    cmd::run(
        "mount",
        &["-t", "tmpfs", "-o", "mode=0700", "lunkit-nvmet", point],
    )?;
    Ok(())
}

/// Unmounts the tmpfs at `dir` and removes the mount point (and [`TMPFS_ROOT`] if it is
/// empty then). umount is retried for a while: nvmet may still be closing a file.
fn unmount_tmpfs(dir: &Path) -> Result<()> {
    let Some(point) = dir.to_str() else {
        return Err(format!("{} is not UTF-8", dir.display()).into());
    };
    let mut last = String::new();
    let done = wait::until(&format!("umount {point}"), TEARDOWN, || {
        if !is_mountpoint(dir) {
            return Ok(Some(()));
        }
        let r = cmd::run_bounded("umount", &[point], TEARDOWN);
        last = r.stderr.trim().to_owned();
        Ok(r.ok().then_some(()))
    });
    if let Err(e) = done {
        return Err(format!("{e}: {last}").into());
    }
    let _ = fs::remove_dir(dir);
    let _ = fs::remove_dir(TMPFS_ROOT);
    Ok(())
}

fn is_mountpoint(dir: &Path) -> bool {
    fs::read_to_string("/proc/self/mountinfo").is_ok_and(|m| {
        m.lines()
            .any(|l| l.split(' ').nth(4).is_some_and(|p| Path::new(p) == dir))
    })
}

/// A sparse file of `size` bytes (tmpfs allocates pages only when they are written).
fn create_sparse(path: &Path, size: u64) -> Result<()> {
    File::create_new(path)
        .and_then(|f| f.set_len(size))
        .map_err(|e| format!("create {} of {size} bytes: {e}", path.display()).into())
}

/// Creates the namespace directory `dir` for `ns` and enables it. `buffered_io` must be set
/// before `enable` (nvmet refuses it on an enabled namespace), and so must the identities.
fn enable_namespace(dir: &Path, ns: &Namespace) -> Result<()> {
    let file = ns.file.to_str().ok_or("backing file path is not UTF-8")?;
    mkdir_new(dir)?;
    write(&dir.join("device_path"), file)?;
    write(&dir.join("buffered_io"), "1")?;
    write(&dir.join("device_uuid"), &ns.uuid)?;
    write(&dir.join("device_nguid"), &ns.nguid)?;
    write(&dir.join("enable"), "1")
}

/// Disables and removes a namespace directory (best effort: it may be half made or gone).
fn remove_namespace_dir(dir: &Path) {
    let _ = fs::write(dir.join("enable"), "0");
    let _ = fs::remove_dir(dir);
}

impl Target {
    /// Removes the referrals of port `id`, or of every port (best effort).
    fn remove_referrals(&mut self, id: Option<u16>) {
        self.referrals.retain(|(port, name)| {
            if id.is_some_and(|id| id != *port) {
                return true;
            }
            remove_referral_dir(&port_dir(*port).join("referrals").join(name));
            false
        });
    }
}

/// Disables and removes a referral directory (it may be half made).
fn remove_referral_dir(dir: &Path) {
    let _ = fs::write(dir.join("enable"), "0");
    let _ = fs::remove_dir(dir);
}

fn port_dir(id: u16) -> PathBuf {
    Path::new(NVMET).join("ports").join(id.to_string())
}

/// Gives port directory `dir` `port`'s TCP/IPv4 address. The address can be set only while
/// no subsystem is linked.
fn configure_port(dir: &Path, port: &PortConfig) -> Result<()> {
    write(&dir.join("addr_trtype"), "tcp")?;
    write(&dir.join("addr_adrfam"), "ipv4")?;
    write(&dir.join("addr_traddr"), &port.traddr)?;
    write(&dir.join("addr_trsvcid"), &port.trsvcid)?;
    if port.tls_required {
        write(&dir.join("addr_treq"), "required")?;
    }
    Ok(())
}

/// Links subsystem `subsys` to port `dir` (`ports/N/subsystems/NQN` -> `subsystems/NQN`);
/// the first link makes nvmet listen, so a busy address fails here.
fn link(subsys: &Path, dir: &Path) -> Result<()> {
    let name = subsys.file_name().ok_or("subsystem path has no name")?;
    let at = dir.join("subsystems").join(name);
    std::os::unix::fs::symlink(subsys, &at)
        .map_err(|e| format!("link {} to {}: {e}", at.display(), subsys.display()).into())
}

/// Removes subsystem `nqn`'s link from port `dir` and the port (best effort).
fn unlink_port(dir: &Path, nqn: &str) {
    let _ = fs::remove_file(dir.join("subsystems").join(nqn));
    let _ = fs::remove_dir(dir);
}

fn mkdir(p: &Path) -> Result<()> {
    fs::create_dir_all(p).map_err(|e| format!("mkdir {}: {e}", p.display()).into())
}

/// Creates configfs object `p`, failing if it exists (`create_dir_all` would not).
fn mkdir_new(p: &Path) -> Result<()> {
    fs::create_dir(p).map_err(|e| format!("mkdir {}: {e}", p.display()).into())
}

fn rmdir(p: &Path) -> Result<()> {
    fs::remove_dir(p).map_err(|e| format!("rmdir {}: {e}", p.display()).into())
}

fn write(p: &Path, v: &str) -> Result<()> {
    fs::write(p, v).map_err(|e| format!("write {v:?} to {}: {e}", p.display()).into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_are_stable_distinct_and_well_formed() {
        let uuid = namespace_uuid(DEFAULT_NQN, 1);
        assert_eq!(uuid, namespace_uuid(DEFAULT_NQN, 1));
        assert_ne!(uuid, namespace_uuid(DEFAULT_NQN, 2));
        assert_ne!(uuid, namespace_uuid("nqn.2014-08.org.lunkit:other", 1));
        assert_ne!(uuid, namespace_nguid(DEFAULT_NQN, 1));
        for id in [uuid, namespace_nguid(DEFAULT_NQN, 7)] {
            let groups: Vec<usize> = id.split('-').map(str::len).collect();
            assert_eq!(groups, [8, 4, 4, 4, 12], "{id}");
            assert!(
                id.chars().all(|c| c == '-' || c.is_ascii_hexdigit()),
                "{id}"
            );
        }
        assert!(serial(DEFAULT_NQN).len() <= 20);
    }

    #[test]
    fn the_builder_numbers_namespaces_and_keeps_the_default_ports_until_told() {
        let b = Target::builder()
            .namespace(1 << 20)
            .namespace_id(5, 2 << 20)
            .namespace(3);
        assert_eq!(b.namespaces, [(1, 1 << 20), (5, 2 << 20), (6, 3)]);
        assert!(b.ports.is_empty());
        let b = b.port(PortConfig::new(7, "127.0.0.3", "4421"));
        assert_eq!(b.ports, [PortConfig::new(7, "127.0.0.3", "4421")]);
    }
}

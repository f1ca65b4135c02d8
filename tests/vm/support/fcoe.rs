//! A real Fibre Channel transport inside the guest: software FCoE (`fcoe`, `libfcoe`, `libfc`)
//! over veth pairs on one Linux bridge (the "fabric"), every FCoE controller in VN2VN mode
//! (no FCF switch), and LIO's `tcm_fc` serving file-backed LUNs on the target's local port.
//! Each initiator port is an `fc_host` with an `fc_remote_ports` entry for the target
//! (`FCP Target`, a SCSI target id) that the kernel made, so lunkit's FC scan and detach run
//! on a tree nobody wrote by hand; with two initiator ports a LUN has two real FC paths.
//!
//! Built through sysfs and configfs only (no fcoe-utils, no targetcli):
//!
//! 1. bridge `lkfcbr`; per port a veth pair (`lkfct`, `lkfct2`... for the target ports,
//!    `lkfc1`, `lkfc2`... for the initiators; their peers `<name>-br` on the bridge), fixed
//!    MACs (the local ports' WWNs come from them), MTU 9000 (an FCoE frame carries up to 2112
//!    bytes of payload), all up;
//! 2. each port's name written to `/sys/bus/fcoe/ctlr_create`: a controller each, created
//!    disabled, with its SCSI host; `mode` set to `vn2vn`;
//! 3. the tcm_fc target in configfs under each target port's WWPN (`fc/xx:xx:..:xx/tpgt_1`),
//!    LUNs linked to fileio backstores on a tmpfs of its own (the same backstores for every
//!    target port, as an array exports one LUN on each controller port), and an ACL per
//!    initiator WWPN with every LUN mapped. tcm_fc has no demo mode, and it must be there
//!    *before* the ports log in: the initiator learns the `FCP Target` role from the PRLI
//!    response, which tcm_fc gives only for a local port it has a TPG for and a remote port it
//!    has an ACL for;
//! 4. every controller `enabled`; VN2VN claims a port id for each, the ports log in to each
//!    other, and the fixture waits (bounded) until every initiator's remote port to every
//!    target port is Online with the `FCP Target` role and a SCSI target id.
//!
//! `scsi_mod.scan` is set to `manual` while the lab exists: otherwise the FC transport scans
//! the whole target (`fc_scsi_scan_rport`, every LUN) the moment the remote port comes up,
//! and a test of "scan exactly one LUN" would start with all of them present.
//!
//! Teardown (drop): SCSI devices left on the initiators' hosts (deleted while the target still
//! answers), the target's configfs objects children first, the backstores, every controller
//! through `/sys/bus/fcoe/ctlr_destroy` (asynchronous in the kernel: waited for until their
//! SCSI hosts are gone), the veth pairs and the bridge, the tmpfs, and `scsi_mod.scan`
//! restored. The modules stay loaded. The runner's lab reset knows none of the FCoE objects:
//! a test killed before this drop leaves the controllers, hosts, veths and bridge behind, and
//! the next build fails naming them.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::tunable::Tunable;
use super::{Result, cmd, sysfs, wait};

const CONFIGFS: &str = "/sys/kernel/config";
const TARGET: &str = "/sys/kernel/config/target";
const FCOE_BUS: &str = "/sys/bus/fcoe";
const SCAN_MODE: &str = "/sys/module/scsi_mod/parameters/scan";
/// The backing files' tmpfs.
pub const TMPFS: &str = "/run/lunkit-fcoe";
/// The bridge all ports hang off.
pub const BRIDGE: &str = "lkfcbr";
/// The first target port's interface; target port `j` (from 2) is `lkfct<j>`, initiator `i`
/// (from 1) is `lkfc<i>`.
pub const TARGET_IF: &str = "lkfct";
/// At most this many initiator ports (their names and MACs have one digit).
pub const MAX_INITIATORS: usize = 9;
/// At most this many target ports.
pub const MAX_TARGETS: usize = 9;
// Locally administered unicast MACs: target port `j`'s is `02:1c:fc:00:00:1<j-1>`, initiator
// `i`'s is `02:1c:fc:00:00:0<i>`. fcoe makes a port's WWPN `0x2000<MAC>` and its WWNN
// `0x1000<MAC>` of it (`fcoe_wwn_from_mac`, schemes 2 and 1).
/// Enough for a full FC frame (2112 bytes of payload) plus the FCoE header and trailer.
const MTU: &str = "9000";
/// fileio HBAs `fileio_4200 + lun`: clear of lio.rs's `fileio_<lun>` and lio_extra's 4096.
const HBA_BASE: u32 = 4200;
const MODULES: &[&str] = &["fcoe", "tcm_fc", "target_core_file"];
/// VN2VN login takes about a second under TCG; a loaded machine gets much more.
const LOGIN: Duration = Duration::from_secs(90);
/// One teardown step (a controller's destruction, an umount) may take this long.
const TEARDOWN: Duration = Duration::from_secs(30);

/// What to build.
#[derive(Debug, Clone)]
pub struct FcoeConfig {
    /// The LUN numbers the target exports (each to every initiator's ACL).
    pub luns: Vec<u32>,
    pub lun_size: u64,
    /// Initiator ports (FC hosts), each one path to every LUN through every target port: 1
    /// to [`MAX_INITIATORS`].
    pub initiators: usize,
    /// Target ports (an array's controller ports), each a TPG of its own under its own WWPN
    /// exporting the same LUNs (the same backstores, so the same WWIDs): 1 to
    /// [`MAX_TARGETS`].
    pub targets: usize,
}

impl Default for FcoeConfig {
    fn default() -> Self {
        Self {
            luns: vec![0, 1, 2, 3],
            lun_size: 16 << 20,
            initiators: 1,
            targets: 1,
        }
    }
}

/// One local FC port: a veth end, its FCoE controller and SCSI host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalPort {
    pub ifname: String,
    /// `ctlr_N` under /sys/bus/fcoe/devices.
    pub ctlr: String,
    /// The SCSI host number (`hostN`, also its `fc_host`).
    pub host: u32,
    pub wwpn: u64,
}

/// The FCoE lab; removed on drop (or by [`FcoeLab::teardown`], which reports what is left).
#[derive(Debug)]
pub struct FcoeLab {
    pub config: FcoeConfig,
    /// The initiator ports, in the order of their interfaces (`lkfc1`, `lkfc2`...).
    pub initiators: Vec<LocalPort>,
    /// The target ports, in the order of their interfaces (`lkfct`, `lkfct2`...).
    pub targets: Vec<LocalPort>,
    scan_mode: Option<Tunable>,
    live: bool,
}

/// The unit serial of LUN `lun`'s backstore: hex only, so LIO puts all of it into the NAA
/// (see [`wwid`]), and unlike lio.rs's serials.
pub fn unit_serial(lun: u32) -> String {
    format!("fc1a{lun:04x}")
}

/// The WWID (sysfs form) the initiator reads for LUN `lun`: LIO's NAA type 6 designator,
/// OUI 001405 followed by the serial's hex digits, zero-filled to 25 digits.
pub fn wwid(lun: u32) -> String {
    format!("naa.6001405{:0<25}", unit_serial(lun))
}

/// `0x%016x`, as `fc_host`/`fc_remote_ports` print a WWN and lunkit takes it.
pub fn wwn_sysfs(wwn: u64) -> String {
    format!("0x{wwn:016x}")
}

/// `xx:xx:xx:xx:xx:xx:xx:xx`, the only form tcm_fc accepts for its configfs names.
pub fn wwn_colon(wwn: u64) -> String {
    wwn.to_be_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

impl FcoeLab {
    /// Builds the lab and waits until the initiator sees the target port Online. On failure,
    /// what was built is removed again.
    pub fn build(config: FcoeConfig) -> Result<Self> {
        if !(1..=MAX_INITIATORS).contains(&config.initiators) {
            return Err(format!(
                "{} initiator ports: 1 to {MAX_INITIATORS}",
                config.initiators
            )
            .into());
        }
        if !(1..=MAX_TARGETS).contains(&config.targets) {
            return Err(format!("{} target ports: 1 to {MAX_TARGETS}", config.targets).into());
        }
        check_free(&config)?;
        cmd::modprobe(MODULES)?;
        if !Path::new(TARGET).is_dir() {
            cmd::run("mount", &["-t", "configfs", "configfs", CONFIGFS])?;
        }
        let scan_mode = Some(Tunable::set(SCAN_MODE, "manual")?);
        let mut me = Self {
            config,
            initiators: Vec::new(),
            targets: Vec::new(),
            scan_mode,
            live: true,
        };
        if let Err(e) = me.build_inner() {
            me.live = false;
            let left = me.remove().err();
            return Err(match left {
                Some(l) => format!("{e} (and the cleanup after it: {l})").into(),
                None => e,
            });
        }
        Ok(me)
    }

    fn build_inner(&mut self) -> Result<()> {
        // The bridge and every port in one `ip -batch`.
        let mut ip = vec![
            format!("link add {BRIDGE} type bridge stp_state 0 mcast_snooping 0"),
            format!("link set {BRIDGE} mtu {MTU} up"),
        ];
        for j in 1..=self.config.targets {
            add_port(
                &mut ip,
                &target_if(j),
                &format!("02:1c:fc:00:00:1{}", j - 1),
            );
        }
        for i in 1..=self.config.initiators {
            add_port(&mut ip, &initiator_if(i), &format!("02:1c:fc:00:00:0{i}"));
        }
        cmd::ip_batch(&ip, false)?;
        for j in 1..=self.config.targets {
            let port = create_ctlr(&target_if(j))?;
            self.targets.push(port);
        }
        for i in 1..=self.config.initiators {
            let port = create_ctlr(&initiator_if(i))?;
            self.initiators.push(port);
        }
        mount_tmpfs()?;
        self.make_backstores()?;
        for target in &self.targets {
            self.build_target(target)?;
        }
        for port in self.initiators.iter().chain(&self.targets) {
            write(&ctlr_dir(&port.ctlr).join("enabled"), "1")?;
        }
        for target in &self.targets {
            for port in &self.initiators {
                self.wait_for_target_port(port, target)?;
                // The initiator's port as seen from the target: the login went both ways.
                wait::until_true(
                    &format!("{}'s local port to see {}'s", target.ifname, port.ifname),
                    LOGIN,
                    || rport_to(target.host, port.wwpn).is_some(),
                )?;
            }
        }
        Ok(())
    }

    fn tpg(target: &LocalPort) -> PathBuf {
        Path::new(TARGET)
            .join("fc")
            .join(wwn_colon(target.wwpn))
            .join("tpgt_1")
    }

    fn acl(target: &LocalPort, initiator: &LocalPort) -> PathBuf {
        Self::tpg(target)
            .join("acls")
            .join(wwn_colon(initiator.wwpn))
    }

    fn backstore(lun: u32) -> PathBuf {
        Path::new(TARGET).join(format!("core/fileio_{}/fc_lun{lun}", HBA_BASE + lun))
    }

    /// The LUNs' fileio backstores, shared by every target port.
    fn make_backstores(&self) -> Result<()> {
        for &lun in &self.config.luns {
            let bs = Self::backstore(lun);
            mkdir(&bs)?;
            let image = format!("{TMPFS}/lun{lun}.img");
            write(
                &bs.join("control"),
                &format!("fd_dev_name={image},fd_dev_size={}", self.config.lun_size),
            )?;
            write(&bs.join("enable"), "1")?;
            // Before the LUN is exported: LIO refuses to change an exported LUN's serial.
            write(&bs.join("wwn/vpd_unit_serial"), &unit_serial(lun))?;
        }
        Ok(())
    }

    /// `target`'s TPG: every LUN, and an ACL per initiator with every LUN mapped.
    fn build_target(&self, target: &LocalPort) -> Result<()> {
        let tpg = Self::tpg(target);
        if tpg.parent().is_some_and(Path::exists) {
            return Err(format!("{} exists already", tpg.parent().unwrap().display()).into());
        }
        for &lun in &self.config.luns {
            let bs = Self::backstore(lun);
            let lun_dir = tpg.join(format!("lun/lun_{lun}"));
            mkdir(&lun_dir)?;
            symlink(&bs, &lun_dir.join("lunkit"))?;
        }
        for initiator in &self.initiators {
            let acl = Self::acl(target, initiator);
            mkdir(&acl)?;
            for &lun in &self.config.luns {
                let mapped = acl.join(format!("lun_{lun}"));
                mkdir(&mapped)?;
                symlink(&tpg.join(format!("lun/lun_{lun}")), &mapped.join("lunkit"))?;
            }
        }
        Ok(())
    }

    /// Waits until `initiator` has an Online remote port to `target` with the `FCP Target`
    /// role and a SCSI target id.
    fn wait_for_target_port(&self, initiator: &LocalPort, target: &LocalPort) -> Result<()> {
        let mut last = String::from("no remote port yet");
        let what = format!(
            "{} to log in to the FCoE target port {}",
            initiator.ifname, target.ifname
        );
        let r = wait::until(&what, LOGIN, || {
            let Some(rport) = rport_to(initiator.host, target.wwpn) else {
                return Ok(None);
            };
            let dir = Path::new("/sys/class/fc_remote_ports").join(&rport);
            let state = sysfs::attr(dir.join("port_state")).unwrap_or_default();
            let roles = sysfs::attr(dir.join("roles")).unwrap_or_default();
            let id = sysfs::attr(dir.join("scsi_target_id")).unwrap_or_default();
            last = format!("{rport}: state {state:?}, roles {roles:?}, scsi_target_id {id:?}");
            let ready = state == "Online"
                && roles.split(',').any(|r| r.trim() == "FCP Target")
                && id.parse::<u32>().is_ok();
            Ok(ready.then_some(()))
        });
        r.map_err(|e| format!("{e}; last seen: {last}").into())
    }

    /// The first target port.
    pub fn target(&self) -> &LocalPort {
        &self.targets[0]
    }

    /// The first target port's WWPN as sysfs prints it (`0x2000021cfc000010`).
    pub fn target_wwpn(&self) -> String {
        wwn_sysfs(self.target().wwpn)
    }

    /// Every target port's WWPN as sysfs prints it, in port order.
    pub fn target_wwpns(&self) -> Vec<String> {
        self.targets.iter().map(|t| wwn_sysfs(t.wwpn)).collect()
    }

    /// The first initiator port.
    pub fn initiator(&self) -> &LocalPort {
        &self.initiators[0]
    }

    /// The first initiator port's WWPN as sysfs prints it.
    pub fn initiator_wwpn(&self) -> String {
        wwn_sysfs(self.initiator().wwpn)
    }

    /// The first initiator's remote port to the target (`rport-H:0-N`), read now.
    pub fn rport(&self) -> Option<String> {
        self.rport_of(self.initiator())
    }

    /// `initiator`'s remote port to the first target port, read now.
    pub fn rport_of(&self, initiator: &LocalPort) -> Option<String> {
        rport_to(initiator.host, self.target().wwpn)
    }

    /// The SCSI target id the FC transport bound to the target port behind the first
    /// initiator, read now.
    pub fn scsi_target_id(&self) -> Option<u32> {
        self.scsi_target_id_of(self.initiator())
    }

    /// The SCSI target id of the first target port behind `initiator`, read now.
    pub fn scsi_target_id_of(&self, initiator: &LocalPort) -> Option<u32> {
        self.scsi_target_id_via(initiator, self.target())
    }

    /// The SCSI target id the FC transport bound to `target` behind `initiator`, read now.
    pub fn scsi_target_id_via(&self, initiator: &LocalPort, target: &LocalPort) -> Option<u32> {
        let rport = rport_to(initiator.host, target.wwpn)?;
        sysfs::attr(format!("/sys/class/fc_remote_ports/{rport}/scsi_target_id"))?
            .parse()
            .ok()
    }

    /// H:C:T:L of every SCSI device below the initiators' hosts, sorted.
    pub fn devices(&self) -> Vec<String> {
        let mut all: Vec<String> = self
            .initiators
            .iter()
            .flat_map(|p| devices_on(p.host))
            .collect();
        all.sort();
        all
    }

    /// The backing file of LUN `lun` on the target side.
    pub fn image(&self, lun: u32) -> PathBuf {
        Path::new(TMPFS).join(format!("lun{lun}.img"))
    }

    /// Takes `port`'s interface down (`up` false) or up: FCoE sees the link go, the port's
    /// `fc_host` goes Linkdown and its remote ports Blocked (until their `dev_loss_tmo`);
    /// back up, the port logs in again. Teardown brings every port up first.
    pub fn set_link(&self, port: &LocalPort, up: bool) -> Result<()> {
        let state = if up { "up" } else { "down" };
        cmd::run("ip", &["link", "set", &port.ifname, state])?;
        Ok(())
    }

    /// `port_state` of `initiator`'s remote port to the target, read now.
    pub fn rport_state_of(&self, initiator: &LocalPort) -> Option<String> {
        let rport = self.rport_of(initiator)?;
        sysfs::attr(format!("/sys/class/fc_remote_ports/{rport}/port_state"))
    }

    /// Removes the lab; fails naming whatever is left.
    pub fn teardown(mut self) -> Result<()> {
        self.live = false;
        self.remove()
    }

    /// Best effort, every step whatever the one before did; the result names what is left.
    fn remove(&mut self) -> Result<()> {
        let mut left = Vec::new();
        // A port a test left down holds its devices' I/O (and so their deletion) until the
        // remote port's dev_loss_tmo: bring it back and let it log in again first.
        let down: Vec<&LocalPort> = self
            .initiators
            .iter()
            .filter(|p| {
                sysfs::attr(format!("/sys/class/net/{}/operstate", p.ifname)).as_deref()
                    == Some("down")
            })
            .collect();
        for port in &down {
            let _ = self.set_link(port, true);
        }
        for port in &down {
            for target in &self.targets {
                let _ = self.wait_for_target_port(port, target);
            }
        }
        // Devices first, while the target still answers their last SYNCHRONIZE CACHE.
        for hctl in self.devices() {
            let _ = fs::write(format!("/sys/class/scsi_device/{hctl}/device/delete"), "1");
        }
        for target in &self.targets {
            self.remove_target(target);
            let tpg = Self::tpg(target);
            let wwn_dir = tpg.parent().expect("tpg has a parent");
            if wwn_dir.exists() {
                left.push(wwn_dir.display().to_string());
            }
        }
        for &lun in &self.config.luns {
            let bs = Self::backstore(lun);
            let _ = fs::remove_dir(&bs);
            let _ = fs::remove_dir(bs.parent().expect("backstore has a parent"));
            if bs.exists() {
                left.push(bs.display().to_string());
            }
        }
        // Every port the build may have made, also past a failed one.
        let ports: Vec<String> = (1..=self.config.initiators)
            .map(initiator_if)
            .chain((1..=self.config.targets).map(target_if))
            .collect();
        for ifname in &ports {
            if let Err(e) = destroy_ctlr(ifname) {
                left.push(e.to_string());
            }
        }
        // Deleting one end of a veth pair deletes both.
        let del: Vec<String> = ports
            .iter()
            .map(String::as_str)
            .chain([BRIDGE])
            .filter(|ifname| Path::new("/sys/class/net").join(ifname).exists())
            .map(|ifname| format!("link del {ifname}"))
            .collect();
        if !del.is_empty() {
            if let Err(e) = cmd::ip_batch(&del, true) {
                left.push(e.to_string());
            }
        }
        if let Err(e) = unmount_tmpfs() {
            left.push(e.to_string());
        }
        drop(self.scan_mode.take());
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!("FCoE lab: left after teardown: {}", left.join("; ")).into())
        }
    }

    /// `target`'s configfs objects, children first: mapped LUNs, the ACL, the TPG's LUNs,
    /// the TPG, the WWN.
    fn remove_target(&self, target: &LocalPort) {
        let tpg = Self::tpg(target);
        for initiator in &self.initiators {
            let acl = Self::acl(target, initiator);
            for &lun in &self.config.luns {
                let mapped = acl.join(format!("lun_{lun}"));
                let _ = fs::remove_file(mapped.join("lunkit"));
                let _ = fs::remove_dir(&mapped);
            }
            let _ = fs::remove_dir(&acl);
        }
        for &lun in &self.config.luns {
            let lun_dir = tpg.join(format!("lun/lun_{lun}"));
            let _ = fs::remove_file(lun_dir.join("lunkit"));
            let _ = fs::remove_dir(&lun_dir);
        }
        let _ = fs::remove_dir(&tpg);
        let _ = fs::remove_dir(tpg.parent().expect("tpg has a parent"));
    }
}

impl Drop for FcoeLab {
    fn drop(&mut self) {
        if self.live {
            self.live = false;
            if let Err(e) = self.remove() {
                eprintln!("{e}");
            }
        }
    }
}

/// Fails if a piece of the lab is there already (a test killed before its teardown): the
/// runner's reset does not know FCoE, so nothing else removes it.
fn check_free(config: &FcoeConfig) -> Result<()> {
    let mut there = Vec::new();
    let names = (1..=config.initiators)
        .map(initiator_if)
        .chain((1..=config.targets).map(target_if))
        .chain([BRIDGE.to_owned()]);
    for ifname in names {
        if Path::new("/sys/class/net").join(&ifname).exists() {
            there.push(format!("network interface {ifname}"));
        }
    }
    if is_mountpoint(TMPFS) {
        there.push(format!("tmpfs {TMPFS}"));
    }
    if there.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "an FCoE lab is still up ({}): a test was killed before its teardown",
            there.join(", ")
        )
        .into())
    }
}

/// Target port `j`'s interface (from 1).
fn target_if(j: usize) -> String {
    match j {
        1 => TARGET_IF.to_owned(),
        j => format!("{TARGET_IF}{j}"),
    }
}

/// Initiator port `i`'s interface (from 1).
fn initiator_if(i: usize) -> String {
    format!("lkfc{i}")
}

/// A veth pair: `ifname` (MAC `mac`) for FCoE, its peer `<ifname>-br` on the bridge; the
/// `ip` commands that make it, added to `ip`.
fn add_port(ip: &mut Vec<String>, ifname: &str, mac: &str) {
    let peer = format!("{ifname}-br");
    ip.extend([
        format!("link add {ifname} type veth peer name {peer}"),
        format!("link set {ifname} address {mac} mtu {MTU}"),
        format!("link set {peer} mtu {MTU} master {BRIDGE} up"),
        format!("link set {ifname} up"),
    ]);
}

fn ctlr_dir(ctlr: &str) -> PathBuf {
    Path::new(FCOE_BUS).join("devices").join(ctlr)
}

/// The FCoE controller on `ifname` (`ctlr_N`, a child of the net device) and its SCSI host.
fn ctlr_of(ifname: &str) -> Option<(String, Option<u32>)> {
    let net = Path::new("/sys/class/net").join(ifname);
    let ctlr = sysfs::names(&net)
        .into_iter()
        .find(|n| n.starts_with("ctlr_"))?;
    let host = sysfs::names(net.join(&ctlr))
        .iter()
        .find_map(|n| sysfs::number_after(n, "host"));
    Some((ctlr, host))
}

/// Creates the FCoE controller on `ifname` (disabled), puts it in VN2VN mode, and reads its
/// port's WWPN.
fn create_ctlr(ifname: &str) -> Result<LocalPort> {
    write(&Path::new(FCOE_BUS).join("ctlr_create"), ifname)?;
    let (ctlr, host) = wait::until(
        &format!("the FCoE controller on {ifname}"),
        TEARDOWN,
        || Ok(ctlr_of(ifname).and_then(|(c, h)| Some((c, h?)))),
    )?;
    write(&ctlr_dir(&ctlr).join("mode"), "vn2vn")?;
    let name = sysfs::attr(format!("/sys/class/fc_host/host{host}/port_name"))
        .ok_or_else(|| format!("fc_host host{host} has no port_name"))?;
    let wwpn = u64::from_str_radix(name.trim_start_matches("0x"), 16)
        .map_err(|e| format!("fc_host host{host} port_name {name:?}: {e}"))?;
    Ok(LocalPort {
        ifname: ifname.to_owned(),
        ctlr,
        host,
        wwpn,
    })
}

/// Destroys the FCoE controller on `ifname`, if there is one, and waits until it and its SCSI
/// host are gone (the kernel destroys it in a work item, after the write returned).
fn destroy_ctlr(ifname: &str) -> Result<()> {
    let Some((ctlr, host)) = ctlr_of(ifname) else {
        return Ok(());
    };
    write(&Path::new(FCOE_BUS).join("ctlr_destroy"), ifname)?;
    wait::until_true(
        &format!("FCoE controller {ctlr} on {ifname} to go"),
        TEARDOWN,
        || {
            ctlr_of(ifname).is_none()
                && !ctlr_dir(&ctlr).exists()
                && host
                    .is_none_or(|h| !Path::new(&format!("/sys/class/scsi_host/host{h}")).exists())
        },
    )
}

/// The remote port below SCSI host `host` whose WWPN is `wwpn`.
fn rport_to(host: u32, wwpn: u64) -> Option<String> {
    let want = wwn_sysfs(wwpn);
    sysfs::names("/sys/class/fc_remote_ports")
        .into_iter()
        .filter(|r| r.starts_with(&format!("rport-{host}:")))
        .find(|r| {
            sysfs::attr(format!("/sys/class/fc_remote_ports/{r}/port_name")).as_deref()
                == Some(want.as_str())
        })
}

fn devices_on(host: u32) -> Vec<String> {
    sysfs::names("/sys/class/scsi_device")
        .into_iter()
        .filter(|h| h.starts_with(&format!("{host}:")))
        .collect()
}

fn mount_tmpfs() -> Result<()> {
    mkdir(Path::new(TMPFS))?;
    cmd::run(
        "mount",
        &["-t", "tmpfs", "-o", "mode=0700", "lunkit-fcoe", TMPFS],
    )?;
    Ok(())
}

/// Unmounts the tmpfs (retried: LIO may still be closing a backing file) and removes the
/// mount point.
fn unmount_tmpfs() -> Result<()> {
    let mut last = String::new();
    let done = wait::until(&format!("umount {TMPFS}"), TEARDOWN, || {
        if !is_mountpoint(TMPFS) {
            return Ok(Some(()));
        }
        let r = cmd::run_bounded("umount", &[TMPFS], TEARDOWN);
        last = r.stderr.trim().to_owned();
        Ok(r.ok().then_some(()))
    });
    if let Err(e) = done {
        return Err(format!("{e}: {last}").into());
    }
    let _ = fs::remove_dir(TMPFS);
    Ok(())
}

fn is_mountpoint(dir: &str) -> bool {
    fs::read_to_string("/proc/self/mountinfo")
        .is_ok_and(|m| m.lines().any(|l| l.split(' ').nth(4) == Some(dir)))
}

fn mkdir(p: &Path) -> Result<()> {
    fs::create_dir_all(p).map_err(|e| format!("mkdir {}: {e}", p.display()).into())
}

fn write(p: &Path, v: &str) -> Result<()> {
    fs::write(p, v).map_err(|e| format!("write {v:?} to {}: {e}", p.display()).into())
}

fn symlink(from: &Path, to: &Path) -> Result<()> {
    std::os::unix::fs::symlink(from, to)
        .map_err(|e| format!("link {} to {}: {e}", to.display(), from.display()).into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_in_the_forms_the_kernel_uses() {
        assert_eq!(wwn_colon(0x2000_021c_fc00_0010), "20:00:02:1c:fc:00:00:10");
        assert_eq!(wwn_sysfs(0x2000_021c_fc00_0010), "0x2000021cfc000010");
        // The guest's LIO gave serial "fc000001" the WWID naa.6001405fc00000100000000000000000.
        assert_eq!(unit_serial(1), "fc1a0001");
        assert_eq!(wwid(1), "naa.6001405fc1a000100000000000000000");
        assert_eq!(wwid(1).len(), "naa.".len() + 32);
    }
}

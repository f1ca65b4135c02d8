//! scsi_debug: RAM-backed SCSI hosts, the cheapest lab for scan/list/delete tests.

use std::path::Path;
use std::time::Duration;

use super::{Result, cmd, sysfs, udev, wait};

const DRIVER: &str = "/sys/bus/pseudo/drivers/scsi_debug";

/// A loaded scsi_debug module; [`ScsiDebug::unload`] (or drop) removes it with its devices.
#[derive(Debug)]
pub struct ScsiDebug {
    /// SCSI host numbers of the scsi_debug adapters, ascending.
    pub hosts: Vec<u32>,
    loaded: bool,
}

impl ScsiDebug {
    /// Loads scsi_debug with module parameters (`("add_host", "2")`, ...) and waits until
    /// `expect_disks` of its devices have a block device (sd probes asynchronously).
    ///
    /// For example `add_host=2 num_tgts=1 max_luns=4` gives 2 hosts x 1 target x 4 LUNs.
    pub fn load(params: &[(&str, &str)], expect_disks: usize) -> Result<Self> {
        // A module left by an earlier test would keep its parameters: start clean.
        if Path::new("/sys/module/scsi_debug").exists() {
            unload_module()?;
        }
        let args: Vec<String> = params.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let mut argv = vec!["scsi_debug"];
        argv.extend(args.iter().map(String::as_str));
        cmd::run("modprobe", &argv)?;
        let mut me = Self {
            hosts: Vec::new(),
            loaded: true,
        };
        me.hosts = wait::until("scsi_debug hosts", Duration::from_secs(30), || {
            let hosts = hosts();
            Ok((!hosts.is_empty()).then_some(hosts))
        })?;
        wait::until_true(
            &format!("{expect_disks} scsi_debug block devices"),
            Duration::from_secs(60),
            || me.disks().len() >= expect_disks,
        )?;
        Ok(me)
    }

    /// H:C:T:L of every SCSI device on the scsi_debug hosts.
    pub fn devices(&self) -> Vec<String> {
        sysfs::names("/sys/class/scsi_device")
            .into_iter()
            .filter(|hctl| {
                let host = hctl.split(':').next().and_then(|h| h.parse().ok());
                host.is_some_and(|h| self.hosts.contains(&h))
            })
            .collect()
    }

    /// Block device names (`sda`) of the scsi_debug devices that have one.
    pub fn disks(&self) -> Vec<String> {
        self.devices()
            .iter()
            .flat_map(|hctl| sysfs::names(format!("/sys/class/scsi_device/{hctl}/device/block")))
            .collect()
    }

    /// Removes the module (and so its hosts and devices).
    pub fn unload(mut self) -> Result<()> {
        self.loaded = false;
        unload_module()
    }
}

impl Drop for ScsiDebug {
    fn drop(&mut self) {
        if self.loaded {
            let _ = unload_module();
        }
    }
}

/// scsi_debug's hosts, from its pseudo-bus adapters (`adapter0/host3`).
fn hosts() -> Vec<u32> {
    let mut hosts: Vec<u32> = sysfs::names(DRIVER)
        .iter()
        .filter(|a| a.starts_with("adapter"))
        .flat_map(|a| sysfs::names(format!("{DRIVER}/{a}")))
        .filter_map(|h| sysfs::number_after(&h, "host"))
        .collect();
    hosts.sort_unstable();
    hosts
}

/// `modprobe -r` fails while a device is still open, and udev's workers open every new disk
/// (blkid, scsi_id). A burst of disks under TCG keeps them busy longer than a fixed wait
/// allows (seen: 30 s of "Module scsi_debug is in use" right after 8 disks appeared), so let
/// udev's queue drain first (`udevadm settle` waits on the queue, not on a guess), then
/// retry for a while. A settle that fails (udevd stopped by the test) is only reported.
fn unload_module() -> Result<()> {
    let settled = udev::settle(Duration::from_secs(120));
    let mut last = String::new();
    wait::until(
        "scsi_debug to unload",
        Duration::from_secs(30),
        || match cmd::run("modprobe", &["-r", "scsi_debug"]) {
            Ok(_) => Ok(Some(())),
            Err(e) => {
                last = e.to_string();
                Ok(None)
            }
        },
    )
    .map_err(|e| format!("{e}: {last} (udev settle before: {settled:?})").into())
}

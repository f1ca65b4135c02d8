//! multipathd in the guest, and the multipath maps as sysfs shows them.

use std::fs;
use std::path::Path;
use std::process::Child;
use std::time::Duration;

use super::{Result, cmd, sysfs, udev, wait};

/// Where [`Multipathd`] has multipathd log (read by [`log`] and the diagnostics).
pub const LOG: &str = "/tmp/lunkit-multipathd.log";

/// The `defaults` section of every configuration below, as a literal for `concat!`.
macro_rules! defaults {
    () => {
        "defaults {\n\tuser_friendly_names yes\n\tfind_multipaths no\n}\n"
    };
}

/// The smallest useful configuration: mpathN names, and every path with a WWID gets a map
/// (find_multipaths no), so a map appears as soon as its paths are scanned.
pub const DEFAULT_CONF: &str = defaults!();

/// [`DEFAULT_CONF`], but a map whose paths all failed queues I/O until one comes back
/// (`no_path_retry queue`) instead of LIO's hwtable default, 12 checker intervals (about
/// 60 s) after which multipathd fails what was queued.
///
/// And an iSCSI session that lost its link waits [`QUEUEING_RECOVERY_TMO`] seconds for it
/// to come back before its disks go `transport-offline`. multipathd writes
/// `fast_io_fail_tmo` into each path's session as `recovery_tmo`, and its default, 5 s, is
/// shorter than an outage a test makes lasts under TCG load.
pub const QUEUEING_CONF: &str = concat!(
    defaults!(),
    "overrides {\n\tno_path_retry queue\n\tfast_io_fail_tmo 600\n}\n"
);

/// The `recovery_tmo` multipathd gives an iSCSI session under [`QUEUEING_CONF`].
pub const QUEUEING_RECOVERY_TMO: u32 = 600;

/// A multipathd we started; [`Multipathd::stop`] (or drop) shuts it down and flushes its maps.
#[derive(Debug)]
pub struct Multipathd {
    child: Option<Child>,
}

/// A multipath map from sysfs: `dm-N` whose `dm/uuid` starts with `mpath-`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Map {
    pub name: String,
    pub dm: String,
    pub uuid: String,
    /// Path devices (`slaves/`), sorted.
    pub paths: Vec<String>,
}

impl Multipathd {
    /// Writes /etc/multipath.conf (an overlay in the guest) and runs `multipathd -d` as our
    /// child, logging to /tmp/lunkit-multipathd.log.
    pub fn start(conf: &str) -> Result<Self> {
        udev::ensure_running()?;
        cmd::modprobe(&["dm_multipath"])?;
        fs::write("/etc/multipath.conf", conf)?;
        let child = cmd::spawn_logged("multipathd", &["-d", "-s"], Path::new(LOG))?;
        let me = Self { child: Some(child) };
        // Its socket first, read from /proc (no process): it listens only once its start-up
        // has set up the paths and maps, which takes seconds under TCG, and each `multipathd
        // show daemon` asked meanwhile cost a spawn. Then ask until it answers.
        wait::until_true("multipathd to listen", Duration::from_secs(30), listening)
            .map_err(|e| format!("{e}; log:\n{}", log()))?;
        wait::until_true("multipathd to answer", Duration::from_secs(30), || {
            cmd::run("multipathd", &["show", "daemon"]).is_ok()
        })
        .map_err(|e| format!("{e}; log:\n{}", log()))?;
        Ok(me)
    }

    /// Asks multipathd to shut down, waits for it, then flushes unused maps.
    pub fn stop(mut self) -> Result<()> {
        self.shutdown()
    }

    /// Asks multipathd to shut down and waits for it, leaving its maps in place: a node
    /// whose maps outlive the daemon. Flush them with [`flush_all`] afterwards.
    pub fn stop_keeping_maps(mut self) -> Result<()> {
        self.exit()
    }

    fn shutdown(&mut self) -> Result<()> {
        if self.child.is_none() {
            return Ok(());
        }
        self.exit().and(flush_all())
    }

    fn exit(&mut self) -> Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        cmd::run_ignoring_failure("multipathd", &["shutdown"]);
        let exited = wait::until_true("multipathd to exit", Duration::from_secs(30), || {
            matches!(child.try_wait(), Ok(Some(_)))
        });
        if exited.is_err() {
            let _ = child.kill();
            let _ = child.wait();
        }
        exited
    }
}

/// multipathd's command socket (abstract), as `/proc/net/unix` shows it.
const SOCKET: &str = "@/org/kernel/linux/storage/multipathd";

/// Whether a socket is bound at multipathd's command socket name (`/proc/net/unix`).
fn listening() -> bool {
    fs::read_to_string("/proc/net/unix").is_ok_and(|t| {
        t.lines()
            .any(|l| l.split_whitespace().nth(7) == Some(SOCKET))
    })
}

impl Drop for Multipathd {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

/// Flushes every multipath map (`multipath -F`) and waits until none is left.
///
/// `multipath -F` skips a map that is open at that moment, and udev opens maps for a moment
/// to probe them (blkid, after multipathd's last reloads and its shutdown's events). One
/// `-F` then leaves a map behind, and the next test finds it (seen in CI: `mpatha` left with
/// open count 0 once udev was done). So: let udev finish, flush, look, and again until the
/// deadline; a map still there is an error naming it.
pub fn flush_all() -> Result<()> {
    wait::until_true(
        "every multipath map to be flushed",
        Duration::from_secs(30),
        || {
            // None left (a test that detached its volumes): nothing to flush, no process.
            if maps().is_empty() {
                return true;
            }
            let _ = udev::settle(Duration::from_secs(10));
            cmd::run_ignoring_failure("multipath", &["-F"]);
            maps().is_empty()
        },
    )
    .map_err(|e| format!("{e}; left: {:?}", maps()).into())
}

/// multipathd's log so far (for error messages).
pub fn log() -> String {
    fs::read_to_string(LOG).unwrap_or_default()
}

/// All multipath maps, by dm name.
pub fn maps() -> Vec<Map> {
    let mut v: Vec<Map> = sysfs::names("/sys/block")
        .into_iter()
        .filter(|n| n.starts_with("dm-"))
        .filter_map(|dm| {
            let base = format!("/sys/block/{dm}");
            let uuid = sysfs::attr(format!("{base}/dm/uuid"))?;
            if !uuid.starts_with("mpath-") {
                return None;
            }
            Some(Map {
                name: sysfs::attr(format!("{base}/dm/name"))?,
                paths: sysfs::names(format!("{base}/slaves")),
                dm,
                uuid,
            })
        })
        .collect();
    v.sort_by(|a, b| a.name.cmp(&b.name));
    v
}

/// Waits until there are `count` multipath maps with `paths` paths each.
pub fn wait_maps(count: usize, paths: usize) -> Result<Vec<Map>> {
    let mut last = Vec::new();
    wait_for(
        &format!("{count} multipath maps with {paths} paths each"),
        || {
            last = maps();
            (last.len() == count && last.iter().all(|m| m.paths.len() == paths))
                .then(|| last.clone())
        },
    )
    .map_err(|e| format!("{e}; maps now: {last:?}; multipathd log:\n{}", log()).into())
}

/// How long multipathd and udev may both look idle while a wait for maps goes on.
pub const STALL: Duration = Duration::from_secs(60);

/// Waits until `probe` sees the maps it wants, for as long as multipathd or udev is at work
/// ([`activity`]), failing after [`STALL`] without progress or 10 minutes in all.
///
/// Not one fixed deadline: multipathd builds maps one uevent at a time, and it holds a new
/// map's reloads until udev has processed the map's creation (up to `uev_wait_timeout`,
/// 30 s). A burst of devices under TCG fills udev's queue, and then a map can take minutes
/// while every daemon is busy and nothing is wrong (CI saw a 60 s deadline run out so).
pub fn wait_for<T>(what: &str, mut probe: impl FnMut() -> Option<T>) -> Result<T> {
    wait::until_progressing(what, STALL, Duration::from_secs(600), activity, || {
        Ok(probe())
    })
}

/// What changes while multipathd and udev work: the length of multipathd's log (it logs
/// every map it adds or reloads and every path it adds, so the maps need no second walk
/// here) and udev's queue (`/run/udev/queue` exists while events are pending).
pub fn activity() -> (u64, bool) {
    let log_len = fs::metadata(LOG).map_or(0, |m| m.len());
    (log_len, Path::new("/run/udev/queue").exists())
}

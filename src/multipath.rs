//! dm-multipath maps: parse their table and status, find them, and take them down safely.
//!
//! [`remove`] is `multipath -f MAP` without the tool, following multipath-tools 0.9's
//! `_dm_flush_map` (docs/DESIGN.md, "Removing a multipath map"), plus one refusal the tool
//! does not make: a map with no active path that queues I/O cannot write its dirty data
//! anywhere, so removing it would drop that data; it is refused unless the caller forces.
//!
//! When multipathd is running the removal is asked of it (`del map NAME` on its control
//! socket, as `multipath -f` does), so it forgets the map instead of re-creating it. Nothing
//! here spawns a process, and every wait has a deadline.

use std::time::{Duration, Instant};

use crate::block::{self, UsageScope};
use crate::dm::{Control, DevId, DeviceInfo, Removed, Suspend, Target};
use crate::error::{Error, Result};
use crate::root::Root;
use crate::sysfs::block::DevNum;
use crate::uevent::{Action, Monitor};
use crate::wwid::Wwid;

mod multipathd;
pub use multipathd::{MULTIPATHD_SOCKET, Multipathd, Peer};

// ---------------------------------------------------------------------------------------
// Table and status lines
// ---------------------------------------------------------------------------------------

/// A multipath target's table (constructor) line:
/// `<#feat> [feat…] <#hw> [hw…] <#PGs> <initPG> {<selector> <#selargs> [..] <#paths>
/// <#pathargs> {<maj:min> [args]}…}…`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    /// Feature words: `queue_if_no_path`, `pg_init_retries 50`, `queue_mode bio`, ...
    pub features: Vec<String>,
    /// Hardware handler name and arguments (`alua`), empty when none.
    pub hw_handler: Vec<String>,
    /// The path group tried first (1-based; 0 when there are no groups).
    pub initial_group: u32,
    /// The path groups, in priority order.
    pub groups: Vec<TableGroup>,
}

/// One path group of a [`Table`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableGroup {
    /// Path selector: `round-robin`, `service-time`, `queue-length`, ...
    pub selector: String,
    /// The selector's arguments.
    pub selector_args: Vec<String>,
    /// The group's paths.
    pub paths: Vec<TablePath>,
}

/// One path of a [`TableGroup`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TablePath {
    /// The path device.
    pub dev: DevNum,
    /// Per-path selector arguments (`repeat_count`, `relative_throughput`).
    pub args: Vec<String>,
}

/// A multipath target's status line:
/// `2 <queue_io> <pg_init_count> <#hw> [hw…] <#PGs> <curPG> {A|D|E <#ps> [ps…] <#paths>
/// <#info> {<maj:min> A|F <fail_count> [info…]}…}…`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    /// I/O is being queued right now (no usable path, or a path group initialising).
    pub queue_io: bool,
    /// Path group initialisations done so far.
    pub pg_init_count: u32,
    /// Hardware handler status words (the kernel reports none).
    pub hw_handler: Vec<String>,
    /// The group in use or to be used next (1-based; 0 when there are no groups).
    pub current_group: u32,
    /// The path groups, in priority order.
    pub groups: Vec<StatusGroup>,
}

/// Whether a path group may be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupState {
    /// `A`: the group in use.
    Active,
    /// `E`: usable, not in use.
    Enabled,
    /// `D`: bypassed (disabled) until re-enabled or nothing else is left.
    Disabled,
}

/// One path group of a [`Status`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusGroup {
    /// The group's state.
    pub state: GroupState,
    /// Selector status words for the group.
    pub selector_status: Vec<String>,
    /// The group's paths.
    pub paths: Vec<StatusPath>,
}

/// One path of a [`StatusGroup`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusPath {
    /// The path device.
    pub dev: DevNum,
    /// `A` (true): usable; `F` (false): failed.
    pub active: bool,
    /// How many times the path has failed.
    pub fail_count: u32,
    /// Selector status words for the path (in-flight I/O and the like).
    pub selector_info: Vec<String>,
}

/// Splits a line into words and hands them out with counted-list helpers; every error
/// names the line.
struct Words<'a> {
    line: &'a str,
    kind: &'static str,
    it: std::str::SplitAsciiWhitespace<'a>,
}

impl<'a> Words<'a> {
    fn new(kind: &'static str, line: &'a str) -> Self {
        Words {
            line,
            kind,
            it: line.split_ascii_whitespace(),
        }
    }

    fn bad(&self, reason: &'static str) -> Error {
        Error::invalid(self.kind, self.line, reason)
    }

    fn word(&mut self, what: &'static str) -> Result<&'a str> {
        self.it.next().ok_or_else(|| self.bad(what))
    }

    fn number(&mut self, what: &'static str) -> Result<u32> {
        let w = self.word(what)?;
        crate::hctl::decimal(w).ok_or_else(|| self.bad(what))
    }

    /// A count, then that many words. The count is bounded by the words left, so a huge
    /// count in a short line is an error, not a huge allocation.
    fn counted(&mut self, what: &'static str) -> Result<Vec<String>> {
        let n = self.number(what)? as usize;
        let mut out = Vec::with_capacity(n.min(64));
        for _ in 0..n {
            out.push(self.word(what)?.to_owned());
        }
        Ok(out)
    }

    fn dev(&mut self) -> Result<DevNum> {
        let w = self.word("missing path device")?;
        w.parse()
            .map_err(|_| self.bad("path device is not MAJOR:MINOR"))
    }

    fn end(mut self) -> Result<()> {
        match self.it.next() {
            None => Ok(()),
            Some(_) => Err(self.bad("trailing words")),
        }
    }
}

impl Table {
    /// Parses the parameters of a `multipath` table line (what follows `multipath`).
    pub fn parse(params: &str) -> Result<Table> {
        let mut w = Words::new("multipath table", params);
        let features = w.counted("feature list truncated")?;
        let hw_handler = w.counted("hardware handler list truncated")?;
        let n_groups = w.number("missing number of path groups")?;
        let initial_group = w.number("missing initial path group")?;
        let mut groups = Vec::new();
        for _ in 0..n_groups {
            let selector = w.word("missing path selector")?.to_owned();
            let selector_args = w.counted("selector arguments truncated")?;
            let n_paths = w.number("missing number of paths")?;
            let n_args = w.number("missing number of path arguments")? as usize;
            let mut paths = Vec::new();
            for _ in 0..n_paths {
                let dev = w.dev()?;
                let mut args = Vec::with_capacity(n_args.min(8));
                for _ in 0..n_args {
                    args.push(w.word("path arguments truncated")?.to_owned());
                }
                paths.push(TablePath { dev, args });
            }
            groups.push(TableGroup {
                selector,
                selector_args,
                paths,
            });
        }
        w.end()?;
        Ok(Table {
            features,
            hw_handler,
            initial_group,
            groups,
        })
    }

    /// The map queues I/O while no path is usable (`queue_if_no_path`).
    pub fn queue_if_no_path(&self) -> bool {
        self.features.iter().any(|f| f == "queue_if_no_path")
    }

    /// Every path device, in table order.
    pub fn paths(&self) -> impl Iterator<Item = DevNum> + '_ {
        self.groups
            .iter()
            .flat_map(|g| g.paths.iter().map(|p| p.dev))
    }
}

impl Status {
    /// Parses the parameters of a `multipath` status line.
    pub fn parse(params: &str) -> Result<Status> {
        let mut w = Words::new("multipath status", params);
        let features = w.counted("feature list truncated")?;
        let num = |i: usize| features.get(i).and_then(|s| crate::hctl::decimal(s));
        let queue_io = num(0).ok_or_else(|| w.bad("missing queue_io"))? != 0;
        let pg_init_count = num(1).ok_or_else(|| w.bad("missing pg_init_count"))?;
        let hw_handler = w.counted("hardware handler status truncated")?;
        let n_groups = w.number("missing number of path groups")?;
        let current_group = w.number("missing current path group")?;
        let mut groups = Vec::new();
        for _ in 0..n_groups {
            let state = match w.word("missing group state")? {
                "A" => GroupState::Active,
                "E" => GroupState::Enabled,
                "D" => GroupState::Disabled,
                _ => return Err(w.bad("group state is not A, E or D")),
            };
            let selector_status = w.counted("selector status truncated")?;
            let n_paths = w.number("missing number of paths")?;
            let n_info = w.number("missing number of path info words")? as usize;
            let mut paths = Vec::new();
            for _ in 0..n_paths {
                let dev = w.dev()?;
                let active = match w.word("missing path state")? {
                    "A" => true,
                    "F" => false,
                    _ => return Err(w.bad("path state is not A or F")),
                };
                let fail_count = w.number("missing fail count")?;
                let mut selector_info = Vec::with_capacity(n_info.min(8));
                for _ in 0..n_info {
                    selector_info.push(w.word("path info truncated")?.to_owned());
                }
                paths.push(StatusPath {
                    dev,
                    active,
                    fail_count,
                    selector_info,
                });
            }
            groups.push(StatusGroup {
                state,
                selector_status,
                paths,
            });
        }
        w.end()?;
        Ok(Status {
            queue_io,
            pg_init_count,
            hw_handler,
            current_group,
            groups,
        })
    }

    /// Every path, in table order.
    pub fn paths(&self) -> impl Iterator<Item = &StatusPath> + '_ {
        self.groups.iter().flat_map(|g| g.paths.iter())
    }

    /// How many paths are usable.
    pub fn active_paths(&self) -> usize {
        self.paths().filter(|p| p.active).count()
    }
}

// ---------------------------------------------------------------------------------------
// Finding maps
// ---------------------------------------------------------------------------------------

/// A multipath map: a device-mapper device with uuid `mpath-<wwid>` and one `multipath`
/// target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Map {
    /// What device-mapper says about it.
    pub info: DeviceInfo,
    /// The WWID from its uuid, multipath form (`36001405…`).
    pub wwid: String,
    /// Its table.
    pub table: Table,
    /// Length of the map in sectors.
    pub sectors: u64,
}

impl Map {
    /// The map name.
    pub fn name(&self) -> &str {
        &self.info.name
    }

    /// `name (dm-N)`, for messages.
    fn label(&self) -> String {
        format!("{} ({})", self.info.name, self.info.kernel_name())
    }
}

/// The uuid prefix multipath-tools gives the maps it creates: `mpath-<wwid>`.
pub const UUID_PREFIX: &str = "mpath-";

/// The WWID in a multipath map's uuid (`mpath-<wwid>`), or `None` for any other uuid,
/// including a partition map's and a bare `mpath-`.
pub fn uuid_wwid(uuid: &str) -> Option<&str> {
    uuid.strip_prefix(UUID_PREFIX).filter(|w| !w.is_empty())
}

/// The WWID in the uuid of a multipath map or of one of its partition maps
/// (`part<N>-mpath-<wwid>`, as kpartx names them), or `None` for any other uuid.
pub fn map_or_partition_uuid_wwid(uuid: &str) -> Option<&str> {
    uuid_wwid(uuid).or_else(|| partition_parent(uuid).and_then(uuid_wwid))
}

/// The uuid of the map a partition map's uuid (`part<N>-<map uuid>`) names, or `None`.
fn partition_parent(uuid: &str) -> Option<&str> {
    let (n, parent) = uuid.strip_prefix("part")?.split_once('-')?;
    crate::hctl::decimal::<u32>(n).map(|_| parent)
}

/// Reads the map `id` and checks it is a multipath map; `Ok(None)` if no such device.
pub fn read_map(ctl: &Control, id: &DevId<'_>) -> Result<Option<Map>> {
    let info = match ctl.info(id) {
        Ok(i) => i,
        Err(e) if e.is_gone() => return Ok(None),
        Err(e) => return Err(e),
    };
    let not_mpath = |reason| Error::Invalid {
        kind: "multipath map",
        input: info.name.clone(),
        reason,
    };
    let wwid = info
        .uuid
        .as_deref()
        .and_then(uuid_wwid)
        .ok_or_else(|| not_mpath("not a multipath map: its uuid does not start with mpath-"))?
        .to_owned();
    // Ask by name from now on: the number could be reused if the map went away meanwhile.
    let by_name = DevId::Name(&info.name);
    let table = match ctl.table(&by_name) {
        Ok(t) => t,
        Err(e) if e.is_gone() => return Ok(None),
        Err(e) => return Err(e),
    };
    let [t] = table.as_slice() else {
        return Err(not_mpath(
            "not a multipath map: its table is not one target",
        ));
    };
    if t.target_type != "multipath" {
        return Err(not_mpath(
            "not a multipath map: its target is not multipath",
        ));
    }
    Ok(Some(Map {
        wwid,
        table: Table::parse(&t.params)?,
        sectors: t.length,
        info,
    }))
}

/// Finds a multipath map from what a user typed: a map name, a WWID (either form), `dm-N`,
/// `/dev/dm-N`, `/dev/mapper/NAME`, or a path device `/dev/sdX` (the map holding it).
///
/// A `/dev` path is resolved by `stat` to its device number and then through
/// `/sys/dev/block/M:m`: the string is never spliced into a sysfs path. `/dev/...` is taken
/// below `root`. No such map is [`Error::NotFound`].
pub fn find(ctl: &Control, root: &Root, spec: &str) -> Result<Map> {
    let not_found = || Error::NotFound {
        what: format!("multipath map {spec}"),
    };
    if spec.starts_with('/') {
        // Resolved below the root, symlinks included; a node that is gone is no map.
        let dev = crate::block::resolve(root, spec)?
            .ok_or_else(not_found)?
            .dev;
        if is_dm(root, dev) {
            return read_map(ctl, &DevId::Dev(dev))?.ok_or_else(not_found);
        }
        // A path device: the multipath map stacked on it.
        let holders = crate::sysfs::entries(&root.sys(format!("dev/block/{dev}/holders")))?;
        for h in holders {
            // A holder that is not a multipath map (LVM, a partition map) is skipped.
            if let Some(d) = dm_kernel_name_dev(root, &h)? {
                if let Ok(Some(m)) = read_map(ctl, &DevId::Dev(d)) {
                    return Ok(m);
                }
            }
        }
        return Err(not_found());
    }
    if let Some(dev) = dm_kernel_name_dev(root, spec)? {
        return read_map(ctl, &DevId::Dev(dev))?.ok_or_else(not_found);
    }
    if crate::dm::buffer::check_name(spec).is_ok() {
        if let Some(m) = read_map(ctl, &DevId::Name(spec))? {
            return Ok(m);
        }
    }
    if let Ok(wwid) = spec.parse::<Wwid>() {
        let uuid = format!("{UUID_PREFIX}{}", wwid.to_multipath());
        if crate::dm::buffer::check_uuid(&uuid).is_ok() {
            if let Some(m) = read_map(ctl, &DevId::Uuid(&uuid))? {
                return Ok(m);
            }
        }
    }
    Err(not_found())
}

/// `dm-N` → the device number in `/sys/block/dm-N/dev`; `None` if `name` is not `dm-<digits>`
/// or no such device exists.
fn dm_kernel_name_dev(root: &Root, name: &str) -> Result<Option<DevNum>> {
    let Some(n) = name.strip_prefix("dm-") else {
        return Ok(None);
    };
    if crate::hctl::decimal::<u32>(n).is_none() {
        return Ok(None);
    }
    Ok(crate::sysfs::attr(&root.sys("block").join(name), "dev").and_then(|s| s.parse().ok()))
}

fn is_dm(root: &Root, dev: DevNum) -> bool {
    root.sys(format!("dev/block/{dev}/dm")).is_dir()
}

/// A partition map of a multipath map (what kpartx creates): one `linear` target on the map,
/// uuid `part<N>-mpath-<wwid>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionMap {
    /// Its name.
    pub name: String,
    /// Its device number.
    pub dev: DevNum,
}

/// Whether `uuid` is `part<digits>-<map_uuid>`.
pub fn is_partition_uuid(uuid: &str, map_uuid: &str) -> bool {
    partition_parent(uuid) == Some(map_uuid)
}

/// Whether a table is one `linear` target on `map_dev` (`<maj:min> <offset>`).
pub fn is_partition_table(table: &[Target], map_dev: DevNum) -> bool {
    let [t] = table else { return false };
    t.target_type == "linear"
        && t.params.split_ascii_whitespace().next() == Some(map_dev.to_string().as_str())
}

/// The partition maps on `map`, as multipath-tools' `do_foreach_partmaps` finds them.
pub fn partition_maps(ctl: &Control, map: &Map) -> Result<Vec<PartitionMap>> {
    let Some(map_uuid) = map.info.uuid.as_deref() else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for d in ctl.list()? {
        if !d
            .uuid
            .as_deref()
            .is_some_and(|u| is_partition_uuid(u, map_uuid))
        {
            continue;
        }
        match ctl.table(&DevId::Name(&d.name)) {
            Ok(t) if is_partition_table(&t, map.info.dev) => out.push(PartitionMap {
                name: d.name,
                dev: d.dev,
            }),
            Ok(_) => {}
            Err(e) if e.is_gone() => {}
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------
// Flush and remove
// ---------------------------------------------------------------------------------------

/// How [`remove`] behaves. The default: 30 s, not deferred, not forced, multipathd asked
/// when it runs.
///
/// ```
/// let mut opts = lunkit::multipath::RemoveOptions::default();
/// opts.timeout = std::time::Duration::from_secs(10);
/// opts.deferred = true;
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RemoveOptions {
    /// How long the removal may take, counted from the call. The map is left as it was found
    /// (queueing restored) on failure.
    pub timeout: Duration,
    /// Mark an open map for removal on last close instead of refusing.
    pub deferred: bool,
    /// Remove even when no path is active and the map queues I/O: queued I/O is failed.
    pub force: bool,
    /// Ask multipathd when it runs (the default), so it does not re-create the map.
    pub use_multipathd: bool,
}

impl Default for RemoveOptions {
    fn default() -> Self {
        RemoveOptions {
            timeout: DEFAULT_REMOVE_TIMEOUT,
            deferred: false,
            force: false,
            use_multipathd: true,
        }
    }
}

/// Default time a [`remove`] may take.
pub const DEFAULT_REMOVE_TIMEOUT: Duration = Duration::from_secs(30);

/// What [`remove`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoveReport {
    /// The map name.
    pub map: String,
    /// Its kernel name (`dm-N`).
    pub kernel_name: String,
    /// Removed now, or marked for removal on last close.
    pub outcome: Removed,
    /// multipathd did it.
    pub via_multipathd: bool,
    /// Why multipathd, though it runs and was to be asked, did not do it, and the removal
    /// was done through device-mapper instead: it did not answer in time, its socket's
    /// listener is not root, or it answered something other than `ok`.
    pub multipathd_skipped: Option<String>,
    /// Maps found suspended and resumed first (a removal killed between its suspend and its
    /// remove leaves the map so).
    pub resumed: Vec<String>,
    /// Partition maps removed first.
    pub partitions_removed: Vec<String>,
}

/// Takes the multipath map `spec` (see [`find`]) off the node: `multipath -f` without the
/// tool, with a deadline.
///
/// 1. It must be a multipath map (uuid `mpath-`, one `multipath` target).
/// 2. The map and its partition maps, if found suspended, are resumed
///    ([`RemoveReport::resumed`]). No active path while `queue_if_no_path` is set: refused with
///    [`Error::Busy`] unless `force` (then `fail_if_no_path` fails the queued I/O first).
/// 3. Open beyond its own partition maps, or a partition map open: [`Error::Busy`] naming the
///    open count and who uses it (unless `deferred`). A map held by nothing but processes is
///    given [`block::OPENER_GRACE`] first: udev probes a map after every reload.
/// 4. multipathd running (as root): `del map NAME`, given half the time left; otherwise, or if
///    it fails or does not answer in time ([`RemoveReport::multipathd_skipped`]):
///    `fail_if_no_path` if the table queues, remove partition maps, suspend with flush,
///    remove, retrying `EBUSY` with backoff until the deadline (resuming between tries), and
///    on failure restore `queue_if_no_path`.
/// 5. After an immediate removal, wait for the `remove` uevent of `dm-N` (or its sysfs
///    directory to vanish).
pub fn remove(root: &Root, spec: &str, opts: &RemoveOptions) -> Result<RemoveReport> {
    let deadline = crate::wait::deadline_after(opts.timeout);
    // A malformed name is the caller's mistake (Invalid), whatever the node has.
    if !spec.starts_with('/') && spec.parse::<Wwid>().is_err() {
        crate::dm::buffer::check_name(spec)?;
    }
    let ctl = Control::open(root)?;
    // Subscribe before acting, so the remove uevent cannot slip past.
    let mut monitor = Monitor::open().ok();
    let map = find(&ctl, root, spec)?;
    // The removal wait watches this object, not `M:m`: device-mapper hands the freed minor
    // to the next map created (multipathd building another volume's map), at once.
    let sys_object = crate::sysfs::object_id(&root.sys(format!("dev/block/{}", map.info.dev)));
    let name = map.info.name.clone();
    let by_name = DevId::Name(&name);
    let queues = map.table.queue_if_no_path();
    let mut report_resumed = Vec::new();
    let parts = partition_maps(&ctl, &map)?;
    // A map left suspended (a removal killed between its suspend and its remove) holds every
    // I/O, udev's probes' and the flush's, and cannot be suspended again: resume it, and its
    // partition maps, so the sequence below starts from a map that serves I/O.
    let devs = std::iter::once(map.info.dev).chain(parts.iter().map(|p| p.dev));
    for dev in devs {
        match ctl.info(&DevId::Dev(dev)) {
            Ok(i) if i.suspended() => {
                ctl.resume(&DevId::Dev(dev))?;
                report_resumed.push(i.name);
            }
            Ok(_) => {}
            Err(e) if e.is_gone() => {}
            Err(e) => return Err(e),
        }
    }

    let status = ctl.status(&by_name)?;
    let status = match status.as_slice() {
        [t] if t.target_type == "multipath" => Status::parse(&t.params)?,
        _ => {
            return Err(Error::invalid(
                "multipath map",
                &name,
                "its status is not one multipath target",
            ));
        }
    };
    let mut queue_disabled = false;
    if queues && status.active_paths() == 0 {
        if !opts.force {
            return Err(Error::Busy {
                device: map.label(),
                reason: "no path is active and queue_if_no_path is set: queued and dirty data \
                         cannot reach the storage; refusing (force fails that I/O)"
                    .into(),
            });
        }
        // Fail the queued I/O now, so that writers stuck on it (a close that syncs) let go
        // of the map before the busy check.
        ctl.message(&by_name, 0, "fail_if_no_path")?;
        queue_disabled = true;
    }

    if !opts.deferred {
        // Failed I/O gets until the deadline to unwind. Otherwise only a map held by nothing
        // but processes is waited for, briefly: udev probes a map after every reload.
        let until = if queue_disabled {
            deadline
        } else {
            crate::wait::deadline_after(block::OPENER_GRACE).min(deadline)
        };
        let mut last = None;
        let settled = crate::wait::until(
            None,
            until,
            &|| format!("{} to be released", map.label()),
            &|_| false,
            || {
                last = busy_reason(&ctl, root, &map, &parts, deadline)?;
                Ok(match &last {
                    Some(b) if queue_disabled || b.transient => None,
                    _ => Some(()),
                })
            },
        );
        match settled {
            Ok(()) | Err(Error::Timeout { .. }) => {}
            Err(e) => return Err(e),
        }
        if let Some(Busy { reason, .. }) = last {
            restore_queueing(&ctl, &by_name, queue_disabled);
            return Err(Error::Busy {
                device: map.label(),
                reason,
            });
        }
    }

    let kernel_name = map.info.kernel_name();
    let mut report = RemoveReport {
        map: name.clone(),
        kernel_name: kernel_name.clone(),
        outcome: Removed::Now,
        via_multipathd: false,
        multipathd_skipped: None,
        resumed: report_resumed,
        partitions_removed: Vec::new(),
    };

    let mut done = false;
    if opts.use_multipathd && !opts.deferred {
        // multipathd's flush cannot defer; a deferred removal is done here.
        match ask_multipathd(root, &name, deadline) {
            Ok(true) => {
                report.via_multipathd = true;
                report.partitions_removed = parts.iter().map(|p| p.name.clone()).collect();
                done = true;
            }
            Ok(false) => {}
            // Not running, not answering in time, not root, or answering "fail": do it here,
            // which reports precisely why it cannot be done, if it cannot. A multipathd that
            // timed out may still be at it; the sequence below takes a map that vanishes
            // under it as removed.
            Err(why) => report.multipathd_skipped = Some(why),
        }
    }
    if !done {
        let (outcome, removed_parts) =
            flush_and_remove(&ctl, &map, &parts, opts, deadline, queue_disabled)?;
        report.outcome = outcome;
        report.partitions_removed = removed_parts;
    }

    if report.outcome == Removed::Now {
        let dev = map.info.dev;
        let sys_dir = root.sys(format!("dev/block/{dev}"));
        crate::wait::until(
            monitor.as_mut(),
            deadline,
            &|| format!("removal of {kernel_name}"),
            &|ev| ev.action == Action::Remove && ev.devname.as_deref() == Some(&kernel_name),
            || {
                let now = crate::sysfs::object_id(&sys_dir);
                let gone = match sys_object {
                    Some(id) => now != Some(id),
                    None => now.is_none(),
                };
                Ok(gone.then_some(()))
            },
        )?;
    }
    Ok(report)
}

/// Asks multipathd to `del map NAME`: `Ok(true)` when it answered `ok`, `Ok(false)` when no
/// multipathd runs, `Err(why)` when it runs but did not do it.
///
/// It gets half of the time left, so that the device-mapper sequence keeps the other half
/// when multipathd hangs.
fn ask_multipathd(root: &Root, name: &str, deadline: Instant) -> std::result::Result<bool, String> {
    let now = Instant::now();
    let theirs = now + deadline.saturating_duration_since(now) / 2;
    let mut d = match Multipathd::connect(root, theirs) {
        Ok(Some(d)) => d,
        Ok(None) => return Ok(false),
        Err(e) => return Err(e.to_string()),
    };
    match d.command(&format!("del map {name}"), theirs) {
        Ok(reply) if reply.trim_end() == "ok" => Ok(true),
        Ok(reply) => Err(format!(
            "multipathd answered {:?} to \"del map {name}\"",
            reply.trim_end()
        )),
        Err(e) => Err(format!("multipathd: {e}")),
    }
}

/// The local `_dm_flush_map` sequence (steps 4 and on of [`remove`]).
fn flush_and_remove(
    ctl: &Control,
    map: &Map,
    parts: &[PartitionMap],
    opts: &RemoveOptions,
    deadline: Instant,
    mut queue_disabled: bool,
) -> Result<(Removed, Vec<String>)> {
    let name = map.name();
    let by_name = DevId::Name(name);
    // A suspended map answers messages with EBUSY; then leave queueing alone and do not
    // suspend (as multipath-tools does when the message fails). A deferred removal never
    // suspends: the map stays in use until its last close, and a map left suspended would
    // block every opener (udev's probe after the holder closes, the holder's own writeback),
    // so that last close would never come. multipath-tools' deferred path does not suspend
    // either.
    let mut may_suspend = !opts.deferred;
    if map.table.queue_if_no_path() && !queue_disabled {
        match ctl.message(&by_name, 0, "fail_if_no_path") {
            Ok(_) => queue_disabled = true,
            Err(e) if e.is_gone() => return Ok((Removed::Now, Vec::new())),
            Err(_) => may_suspend = false,
        }
    }
    let fail = |e: Error| {
        restore_queueing(ctl, &by_name, queue_disabled);
        e
    };

    let mut removed = Vec::new();
    for p in parts {
        match ctl.remove(&DevId::Name(&p.name), opts.deferred) {
            Ok(_) => removed.push(p.name.clone()),
            Err(e) if e.is_gone() => {}
            Err(e) if e.errno() == Some(libc::EBUSY) => {
                return Err(fail(Error::Busy {
                    device: format!("{} ({})", map.label(), p.name),
                    reason: "its partition map is open".into(),
                }));
            }
            Err(e) => return Err(fail(e)),
        }
    }

    let removing_since = Instant::now();
    let mut backoff = Duration::from_millis(50);
    let mut last_open = 0;
    loop {
        if may_suspend {
            let how = Suspend {
                noflush: false,
                skip_lockfs: true,
            };
            match ctl.suspend(&by_name, how) {
                Ok(_) => {}
                Err(e) if e.is_gone() => return Ok((Removed::Now, removed)),
                Err(e) => return Err(fail(e)),
            }
        }
        match ctl.remove(&by_name, opts.deferred) {
            Ok(Removed::Deferred) => {
                // Still serving its holder until the last close: give it back the I/O policy
                // it had.
                restore_queueing(ctl, &by_name, queue_disabled);
                return Ok((Removed::Deferred, removed));
            }
            Ok(outcome) => return Ok((outcome, removed)),
            Err(e) if e.is_gone() => return Ok((Removed::Now, removed)),
            Err(e) if e.errno() == Some(libc::EBUSY) => {
                if may_suspend {
                    // Let I/O through again while we wait: a suspended map blocks its openers.
                    match ctl.resume(&by_name) {
                        Ok(_) => {}
                        Err(e) if e.is_gone() => {
                            return Ok((Removed::Now, removed));
                        }
                        Err(e) => return Err(fail(e)),
                    }
                }
                match ctl.info(&by_name) {
                    Ok(i) => last_open = i.open_count,
                    Err(e) if e.is_gone() => return Ok((Removed::Now, removed)),
                    Err(_) => {}
                }
            }
            Err(e) => return Err(fail(e)),
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(fail(Error::Timeout {
                what: format!(
                    "removal of {} (still open, open count {last_open})",
                    map.label()
                ),
                waited: removing_since.elapsed(),
            }));
        }
        std::thread::sleep(backoff.min(deadline - now));
        backoff = (backoff * 2).min(Duration::from_millis(500));
    }
}

/// Re-enables queueing if this call disabled it (best effort: the map may be gone).
fn restore_queueing(ctl: &Control, id: &DevId<'_>, disabled: bool) {
    if disabled {
        let _ = ctl.message(id, 0, "queue_if_no_path");
    }
}

/// Why a map cannot be removed now.
struct Busy {
    reason: String,
    /// Only processes hold it, or nothing is to be seen any more: it may pass on its own.
    transient: bool,
}

/// Why the map cannot be removed now, or `None`: it is open beyond its partition maps, or a
/// partition map is open (multipath-tools' `mpath_in_use`).
fn busy_reason(
    ctl: &Control,
    root: &Root,
    map: &Map,
    parts: &[PartitionMap],
    deadline: Instant,
) -> Result<Option<Busy>> {
    let info = ctl.info(&DevId::Name(map.name()))?;
    let mut open_parts = Vec::new();
    for p in parts {
        match ctl.info(&DevId::Name(&p.name)) {
            Ok(i) if i.open_count > 0 => open_parts.push(format!(
                "partition map {} open {} time(s)",
                p.name, i.open_count
            )),
            Ok(_) => {}
            Err(e) if e.is_gone() => {}
            Err(e) => return Err(e),
        }
    }
    let own = i64::from(info.open_count) - parts.len() as i64;
    if own <= 0 && open_parts.is_empty() {
        return Ok(None);
    }
    let users = users(root, info.dev, parts, deadline);
    let mut reason = format!(
        "open count {} ({} partition map(s))",
        info.open_count,
        parts.len(),
    );
    if let Some(u) = users.as_ref().filter(|u| !u.is_empty()) {
        reason.push_str(&format!(": {u}"));
    }
    for p in open_parts {
        reason.push_str("; ");
        reason.push_str(&p);
    }
    Ok(Some(Busy {
        reason,
        transient: users.is_none_or(|u| u.is_empty() || u.only_openers()),
    }))
}

/// Who uses a map (mounts, holders, swap, openers), as [`block::usage`] finds it for the map
/// and its partition maps in one walk: what a person needs to act on a refusal. The partition
/// maps are its own, not users by themselves. `None` when the map is gone or cannot be looked
/// at.
fn users(
    root: &Root,
    dev: DevNum,
    parts: &[PartitionMap],
    deadline: Instant,
) -> Option<block::Usage> {
    let node = block::by_number(root, dev).ok()??;
    let own: Vec<String> = parts
        .iter()
        .filter_map(|p| block::by_number(root, p.dev).ok().flatten())
        .map(|n| n.name)
        .collect();
    let scope = UsageScope {
        own: &own,
        ignore_openers: &[],
    };
    block::usage(root, &[node], &scope, deadline).ok()
}

//! The multipath target's table (constructor) and status lines, as dm-mpath prints them.

use crate::error::{Error, Result};
use crate::id::DevNum;

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
        crate::id::decimal(w).ok_or_else(|| self.bad(what))
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
        let num = |i: usize| features.get(i).and_then(|s| crate::id::decimal(s));
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

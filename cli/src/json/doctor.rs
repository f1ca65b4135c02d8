//! `lunkit doctor --json`: every finding of [`lunkit::ops::doctor::examine`], and with
//! `--fix` what [`lunkit::ops::doctor::fix`] did with each.

use lunkit::ops::doctor::{Examination, Finding as Found, FixOutcome, Fixes};
use serde::Serialize;

use super::{SCHEMA_VERSION, micros};

/// `lunkit doctor --json`.
#[derive(Debug, Serialize)]
pub struct Doctor {
    pub version: u32,
    pub findings: Vec<Finding>,
    /// States the kernel may still recover from (a blocked SCSI device, an NVMe controller
    /// not live), seen for less than `grace_s`: not findings yet. Same shape as a finding,
    /// `fix` always `null`.
    pub pending: Vec<Finding>,
    /// The grace, in seconds (`--grace`).
    pub grace_s: u64,
    /// How many findings are in use (or could not be checked) as examined.
    pub in_use: usize,
    /// With `--fix`: how many findings are left on the node (exit 1, or 4 when one of them
    /// is in use); `null` without `--fix`.
    pub left: Option<usize>,
    /// The library's own time (the examination and the fix).
    pub elapsed_us: u64,
}

/// One finding.
#[derive(Debug, Serialize)]
pub struct Finding {
    /// `scsi-device-down`, `scsi-device-blocked`, `remapped-path`, `map-without-paths`,
    /// `map-paths-down`, `idle-session`, `nvme-controller-down`, `idle-subsystem`,
    /// `stale-name-record`, `remapped-address`, `stale-attach-mark`, `lun-gone`.
    pub kind: &'static str,
    pub objects: Vec<String>,
    pub why: String,
    /// The WWID or subsystem NQN it was found with (a name record's recorded WWID, an
    /// attach mark's subsystem NQN); `null` when it has none.
    pub identity: Option<String>,
    /// The block devices the in-use check looked at.
    pub devices: Vec<String>,
    /// Whether something uses them; `null` when not checked.
    pub in_use: Option<bool>,
    /// Who uses them, as a detach's refusal says it; `null` when nothing does.
    pub users: Option<String>,
    /// For a recoverable state: how long doctor has seen it, in seconds; else `null`.
    pub since_s: Option<u64>,
    /// For a map: whether it queues I/O (`queue_if_no_path`); else, or unread, `null`.
    pub queues: Option<bool>,
    /// What `--fix` did with it; `null` without `--fix`.
    pub fix: Option<Fix>,
}

/// What `--fix` did with a finding.
#[derive(Debug, Serialize)]
pub struct Fix {
    /// `fixed`, `gone` (already, when looked at again), or why it was left: `in-use`,
    /// `changed`, `not-selected`, `unsupported`, `failed`.
    pub outcome: &'static str,
    /// Whether the finding is still on the node.
    pub left: bool,
    /// What was done, or why it was left (who uses it, what changed, the error).
    pub detail: Option<String>,
}

impl Doctor {
    /// The document for an examination and, with `--fix`, its fixes.
    pub fn new(e: &Examination, fixes: Option<&Fixes>) -> Self {
        let outcome = |i: usize| fixes.and_then(|x| x.outcomes.get(i));
        Doctor {
            version: SCHEMA_VERSION,
            findings: e
                .findings
                .iter()
                .enumerate()
                .map(|(i, f)| Finding::new(f, outcome(i)))
                .collect(),
            pending: e.pending.iter().map(|f| Finding::new(f, None)).collect(),
            grace_s: e.grace.as_secs(),
            in_use: e.findings.iter().filter(|f| f.in_use()).count(),
            left: fixes.map(|x| x.outcomes.iter().filter(|o| o.is_left()).count()),
            elapsed_us: micros(e.elapsed + fixes.map(|x| x.elapsed).unwrap_or_default()),
        }
    }
}

impl Finding {
    fn new(f: &Found, fix: Option<&FixOutcome>) -> Self {
        Finding {
            kind: f.kind.as_str(),
            objects: f.objects.clone(),
            why: f.why.clone(),
            identity: f.identity.clone(),
            devices: f.devices.clone(),
            in_use: f.usage.as_ref().map(|_| f.in_use()),
            users: f
                .usage
                .as_ref()
                .filter(|_| f.in_use())
                .map(ToString::to_string),
            since_s: f.since.map(|d| d.as_secs()),
            queues: f.queues,
            fix: fix.map(|o| Fix {
                outcome: o.as_str(),
                left: o.is_left(),
                detail: o.detail(),
            }),
        }
    }
}

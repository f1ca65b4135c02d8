//! `lunkit doctor --json`: every finding of [`lunkit::ops::doctor::examine`].

use lunkit::ops::doctor::{Examination, Finding as Found};
use serde::Serialize;

use super::{SCHEMA_VERSION, micros};

/// `lunkit doctor --json`.
#[derive(Debug, Serialize)]
pub struct Doctor {
    pub version: u32,
    pub findings: Vec<Finding>,
    /// How many findings are in use (or could not be checked): those exit 4.
    pub in_use: usize,
    /// The library's own time.
    pub elapsed_us: u64,
}

/// One finding.
#[derive(Debug, Serialize)]
pub struct Finding {
    /// `scsi-device-down`, `remapped-path`, `map-without-paths`, `map-paths-down`,
    /// `idle-session`, `nvme-controller-down`.
    pub kind: &'static str,
    pub objects: Vec<String>,
    pub why: String,
    /// The block devices the in-use check looked at.
    pub devices: Vec<String>,
    /// Whether something uses them; `null` when not checked.
    pub in_use: Option<bool>,
    /// Who uses them, as a detach's refusal says it; `null` when nothing does.
    pub users: Option<String>,
}

impl From<&Examination> for Doctor {
    fn from(e: &Examination) -> Self {
        Doctor {
            version: SCHEMA_VERSION,
            findings: e.findings.iter().map(Finding::from).collect(),
            in_use: e.findings.iter().filter(|f| f.in_use()).count(),
            elapsed_us: micros(e.elapsed),
        }
    }
}

impl From<&Found> for Finding {
    fn from(f: &Found) -> Self {
        Finding {
            kind: f.kind.as_str(),
            objects: f.objects.clone(),
            why: f.why.clone(),
            devices: f.devices.clone(),
            in_use: f.usage.as_ref().map(|_| f.in_use()),
            users: f
                .usage
                .as_ref()
                .filter(|_| f.in_use())
                .map(ToString::to_string),
        }
    }
}

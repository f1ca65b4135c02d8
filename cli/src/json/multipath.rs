//! `lunkit multipath remove --json`.

use lunkit::dm::Removed;
use lunkit::multipath::RemoveReport;
use serde::Serialize;

use super::SCHEMA_VERSION;

#[derive(Debug, Serialize)]
pub struct Remove {
    pub version: u32,
    /// The map name.
    pub map: String,
    /// `dm-N`.
    pub kernel_name: String,
    /// `removed`, or `deferred` (marked for removal on its last close).
    pub outcome: &'static str,
    pub via_multipathd: bool,
    /// Why multipathd was not the one that did it; `null` when it was, or did not run.
    pub multipathd_skipped: Option<String>,
    /// Maps found suspended and resumed first.
    pub resumed: Vec<String>,
    pub partitions_removed: Vec<String>,
}

/// `removed` or `deferred`, as the text output says it too.
pub fn outcome(r: &Removed) -> &'static str {
    match r {
        Removed::Now => "removed",
        Removed::Deferred => "deferred",
    }
}

impl From<&RemoveReport> for Remove {
    fn from(r: &RemoveReport) -> Self {
        Remove {
            version: SCHEMA_VERSION,
            map: r.map.clone(),
            kernel_name: r.kernel_name.clone(),
            outcome: outcome(&r.outcome),
            via_multipathd: r.via_multipathd,
            multipathd_skipped: r.multipathd_skipped.clone(),
            resumed: r.resumed.clone(),
            partitions_removed: r.partitions_removed.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_removal_says_how_and_what_else_went() {
        let r = RemoveReport {
            map: "mpatha".into(),
            kernel_name: "dm-0".into(),
            outcome: Removed::Deferred,
            via_multipathd: false,
            multipathd_skipped: Some("its listener is not root".into()),
            resumed: vec!["dm-1".into()],
            partitions_removed: vec!["mpatha1".into()],
        };
        assert_eq!(
            serde_json::to_value(Remove::from(&r)).unwrap(),
            json!({
                "version": 1, "map": "mpatha", "kernel_name": "dm-0", "outcome": "deferred",
                "via_multipathd": false, "multipathd_skipped": "its listener is not root",
                "resumed": ["dm-1"], "partitions_removed": ["mpatha1"],
            })
        );
        assert_eq!(outcome(&Removed::Now), "removed");
    }
}

//! `lunkit detach --json`: one report, also on failure, with every step.

use std::time::Duration;

use lunkit::ops::{DetachReport, Outcome, Step as LibStep, VolumeSpec};
use serde::Serialize;

use super::{SCHEMA_VERSION, micros, millis};

#[derive(Debug, Serialize)]
pub struct Detach {
    pub version: u32,
    /// The volume as the command line named it (`iSCSI IQN LUN 1`, `/dev/sdc`).
    pub volume: String,
    /// The name its lock and records go by (the WWID in multipath form, else `hctl-…`);
    /// `null` when the detach failed.
    pub key: Option<String>,
    /// Multipath form (`36001405…`); `null` when unknown or failed.
    pub wwid: Option<String>,
    pub ok: bool,
    pub error: Option<String>,
    /// How many take-down rounds ran (0 on failure, or when nothing was there).
    pub rounds: u32,
    /// The whole command, in milliseconds.
    pub duration_ms: f64,
    /// The same measure under the name every other document uses.
    pub elapsed_us: u64,
    /// Every step, in order, those of a failed detach included.
    pub steps: Vec<Step>,
}

#[derive(Debug, Serialize)]
pub struct Step {
    /// `identify`, `lock`, `check-in-use`, `remove-map`… (`StepKind::as_str`).
    pub step: &'static str,
    /// What it acted on.
    pub target: String,
    /// `done`, `already-gone`, `skipped` or `failed`.
    pub outcome: &'static str,
    /// Why, when skipped or failed.
    pub detail: Option<String>,
    /// From the start of the detach: steps that ran side by side overlap.
    pub start_ms: f64,
    pub duration_ms: f64,
}

impl Detach {
    /// The report of a detach of `spec` that took `elapsed` and recorded `steps`.
    pub fn new(
        spec: &VolumeSpec,
        result: &lunkit::Result<DetachReport>,
        steps: &[LibStep],
        elapsed: Duration,
    ) -> Self {
        let identity = result.as_ref().ok().map(|r| &r.identity);
        Detach {
            version: SCHEMA_VERSION,
            volume: spec.to_string(),
            key: identity.map(|i| i.key()),
            wwid: identity
                .and_then(|i| i.wwid.as_ref())
                .map(|w| w.to_multipath()),
            ok: result.is_ok(),
            error: result.as_ref().err().map(ToString::to_string),
            rounds: result.as_ref().map_or(0, |r| r.rounds),
            // One reading for both figures, so they agree to the microsecond.
            duration_ms: millis(elapsed),
            elapsed_us: micros(elapsed),
            steps: steps.iter().map(Step::new).collect(),
        }
    }
}

impl Step {
    fn new(s: &LibStep) -> Self {
        let (outcome, detail) = match &s.outcome {
            Outcome::Done => ("done", None),
            Outcome::AlreadyGone => ("already-gone", None),
            Outcome::Skipped(w) => ("skipped", Some(w.clone())),
            Outcome::Failed(w) => ("failed", Some(w.clone())),
        };
        Step {
            step: s.kind.as_str(),
            target: s.target.clone(),
            outcome,
            detail,
            start_ms: millis(s.start),
            duration_ms: millis(s.duration),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lunkit::ops::{Identity, StepKind};
    use serde_json::{Value, json};

    fn step(kind: StepKind, target: &str, outcome: Outcome) -> LibStep {
        LibStep {
            kind,
            target: target.into(),
            outcome,
            start: Duration::from_micros(500),
            duration: Duration::from_micros(2_250),
        }
    }

    fn spec() -> VolumeSpec {
        VolumeSpec::Wwid("36001405a1b2c3d4e5f60718293a4b5c6".parse().unwrap())
    }

    #[test]
    fn a_detach_reports_its_identity_rounds_and_steps() {
        let steps = vec![
            step(StepKind::Identify, "x", Outcome::Done),
            step(StepKind::RemoveMap, "mpatha (dm-0)", Outcome::AlreadyGone),
            step(
                StepKind::DeletePath,
                "6:0:0:1 (sdc)",
                Outcome::Skipped("forced".into()),
            ),
        ];
        let identity = Identity {
            wwid: Some("naa.6001405a1b2c3d4e5f60718293a4b5c6".parse().unwrap()),
            addresses: Vec::new(),
        };
        let report = DetachReport {
            identity,
            steps: steps.clone(),
            rounds: 2,
            duration: Duration::from_millis(9),
        };
        let v = serde_json::to_value(Detach::new(
            &spec(),
            &Ok(report),
            &steps,
            Duration::from_micros(12_500),
        ))
        .unwrap();
        assert_eq!(v["version"], json!(1));
        assert_eq!(v["volume"], json!(spec().to_string()));
        assert_eq!(v["key"], json!("36001405a1b2c3d4e5f60718293a4b5c6"));
        assert_eq!(v["wwid"], json!("36001405a1b2c3d4e5f60718293a4b5c6"));
        assert_eq!((&v["ok"], &v["error"]), (&json!(true), &Value::Null));
        assert_eq!(v["rounds"], json!(2));
        assert_eq!(v["duration_ms"], json!(12.5));
        assert_eq!(v["elapsed_us"], json!(12_500));
        assert_eq!(
            v["steps"],
            json!([
                {"step": "identify", "target": "x", "outcome": "done", "detail": null, "start_ms": 0.5, "duration_ms": 2.25},
                {"step": "remove-map", "target": "mpatha (dm-0)", "outcome": "already-gone", "detail": null, "start_ms": 0.5, "duration_ms": 2.25},
                {"step": "delete-path", "target": "6:0:0:1 (sdc)", "outcome": "skipped", "detail": "forced", "start_ms": 0.5, "duration_ms": 2.25},
            ])
        );
    }

    #[test]
    fn a_failed_detach_has_its_error_and_the_steps_it_took() {
        let steps = vec![step(
            StepKind::CheckInUse,
            "mpatha (dm-0)",
            Outcome::Failed("mounted at /mnt".into()),
        )];
        let failed = Err(lunkit::Error::invalid("device", "sdz", "not a SCSI disk"));
        let v =
            serde_json::to_value(Detach::new(&spec(), &failed, &steps, Duration::ZERO)).unwrap();
        assert_eq!(v["ok"], json!(false));
        assert!(
            v["error"].as_str().unwrap().contains("not a SCSI disk"),
            "{v}"
        );
        assert_eq!((&v["key"], &v["wwid"]), (&Value::Null, &Value::Null));
        assert_eq!(v["rounds"], json!(0));
        assert_eq!(v["steps"][0]["outcome"], json!("failed"));
        assert_eq!(v["steps"][0]["detail"], json!("mounted at /mnt"));
    }

    #[test]
    fn its_one_line_keeps_the_shape_the_bench_reads() {
        // `cargo xtask bench` sums a step's `duration_ms` from `"step":"…"` objects and takes
        // the last `elapsed_us` as the command's.
        let steps = vec![step(StepKind::CheckInUse, "m", Outcome::Done)];
        let text = super::super::to_text(
            &Detach::new(
                &spec(),
                &Err(lunkit::Error::invalid("a", "b", "c")),
                &steps,
                Duration::from_micros(7),
            ),
            super::super::Layout::Line,
        );
        assert!(text.contains(r#""step":"check-in-use""#), "{text}");
        let last = text.rfind("\"elapsed_us\":").unwrap();
        assert!(text[last..].starts_with("\"elapsed_us\":7,"), "{text}");
    }
}

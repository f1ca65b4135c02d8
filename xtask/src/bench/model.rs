//! What a benchmark records: measurements (one method in one table row) made of runs, their
//! statistics, and a line format the guest writes and the host reads back (xtask has no
//! dependencies, so no serde).

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;

use crate::Result;

/// One run of one method.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Run {
    /// Wall time as the caller sees it (process spawn to exit for programs), microseconds.
    pub wall_us: u64,
    /// The time lunkit reports itself (`elapsed_us`): the library's part, without exec.
    pub lib_us: Option<u64>,
    /// Kernel uevents from just before the action until the system was quiet again.
    pub uevents: Option<u64>,
    /// SCSI devices that appeared besides the wanted ones.
    pub extra: Option<u64>,
    /// Peak resident set of the measured process (`ru_maxrss`), KiB.
    pub rss_kib: Option<u64>,
    /// When the wanted disk's `add` uevent reached the benchmark's own listener, from the
    /// start of the run: what is left of `wall_us` is the method noticing it and finishing.
    /// With several wanted disks (a 2-session scan), the last one's.
    pub add_us: Option<u64>,
    /// When the wanted LUN's `scsi_device` `add` uevent arrived, from the start of the run:
    /// the scan write is then done, and `add_us - dev_add_us` is the asynchronous sd probe.
    /// With several wanted LUNs, the last one's.
    pub dev_add_us: Option<u64>,
    /// lunkit detach's `check-in-use` steps (every round's, summed), from its `--json`: the
    /// in-use check alone.
    pub check_us: Option<u64>,
    /// lunkit scan's first path's `write_start_us`, from its `--json`: how long the library
    /// took from its call to its first scan write, before which the kernel has nothing to do.
    pub first_write_us: Option<u64>,
    /// lunkit scan's `elapsed_us` less its last path's `ready_us`: its time after the kernel
    /// had the last disk ready.
    pub after_ready_us: Option<u64>,
    /// lunkit detach's steps, in the order it reported them, each with its start (from the
    /// start of the detach) and length: steps that ran side by side overlap.
    pub steps: Vec<StepSpan>,
    /// How many findings `lunkit doctor --json` reported: on the busy node, its idle sessions.
    pub findings: Option<u64>,
}

/// One step of a lunkit detach as its `--json` reported it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StepSpan {
    /// `check-in-use`, `delete-path`...
    pub name: String,
    /// When it began, from the start of the detach, microseconds.
    pub start_us: u64,
    /// How long it took, microseconds.
    pub dur_us: u64,
}

impl Run {
    /// The library time no step covers: `lib_us` less the union of the steps' spans (steps
    /// side by side count once). `None` without a library time or without steps.
    pub fn outside_steps_us(&self) -> Option<u64> {
        let lib = self.lib_us?;
        if self.steps.is_empty() {
            return None;
        }
        let mut spans: Vec<(u64, u64)> = self
            .steps
            .iter()
            .map(|s| (s.start_us, s.start_us + s.dur_us))
            .collect();
        spans.sort_unstable();
        let (mut covered, mut reach) = (0, 0);
        for (from, to) in spans {
            let from = from.max(reach);
            if to > from {
                covered += to - from;
                reach = to;
            }
        }
        Some(lib.saturating_sub(covered))
    }

    /// The steps each named by their kind and, for a kind that came more than once, which
    /// time it was (`flush-path #2`): the same label stands for the same step in every run
    /// of a detach that went the same way.
    pub fn step_labels(&self) -> Vec<(String, &StepSpan)> {
        self.steps
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let before = self.steps[..i].iter().filter(|o| o.name == s.name).count();
                let again = self.steps[i + 1..].iter().any(|o| o.name == s.name);
                let label = if before > 0 || again {
                    format!("{} #{}", s.name, before + 1)
                } else {
                    s.name.clone()
                };
                (label, s)
            })
            .collect()
    }
}

/// Whether a measurement could be made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    Ok,
    /// The tool or subcommand does not exist here (e.g. `lunkit detach` before it is merged).
    Unavailable(String),
    /// It ran and failed; the runs before the failure are kept.
    Failed(String),
}

/// One method in one table row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Measurement {
    /// Stable key: `<row>.<method>`, e.g. `scan.lunkit`.
    pub id: String,
    /// The table row (`scan`, `scale1`, `scale256`, `teardown`, `listing`, `flush`).
    pub row: String,
    /// What was run, for people.
    pub label: String,
    pub runs: Vec<Run>,
    pub state: State,
    /// How it was measured (commands, what "done" means).
    pub note: String,
}

impl Measurement {
    pub fn new(row: &str, method: &str, label: &str, note: &str) -> Self {
        Self {
            id: format!("{row}.{method}"),
            row: row.to_owned(),
            label: label.to_owned(),
            runs: Vec::new(),
            state: State::Ok,
            note: note.to_owned(),
        }
    }

    pub fn method(&self) -> &str {
        self.id.split_once('.').map_or(self.id.as_str(), |(_, m)| m)
    }

    pub fn is_ok(&self) -> bool {
        self.state == State::Ok && !self.runs.is_empty()
    }

    pub fn wall(&self) -> Option<Stats> {
        Stats::of(self.runs.iter().map(|r| r.wall_us))
    }

    pub fn lib(&self) -> Option<Stats> {
        Stats::of(self.runs.iter().filter_map(|r| r.lib_us))
    }

    pub fn check(&self) -> Option<Stats> {
        Stats::of(self.runs.iter().filter_map(|r| r.check_us))
    }

    pub fn first_write(&self) -> Option<Stats> {
        Stats::of(self.runs.iter().filter_map(|r| r.first_write_us))
    }

    pub fn after_ready(&self) -> Option<Stats> {
        Stats::of(self.runs.iter().filter_map(|r| r.after_ready_us))
    }

    pub fn outside_steps(&self) -> Option<Stats> {
        Stats::of(self.runs.iter().filter_map(Run::outside_steps_us))
    }

    /// Per step label ([`Run::step_labels`]), in the order of the run they first appear
    /// in: the stats of its start and of its length over the runs that had it.
    pub fn step_stats(&self) -> Vec<(String, Stats, Stats)> {
        let mut labels: Vec<String> = Vec::new();
        for r in &self.runs {
            for (l, _) in r.step_labels() {
                if !labels.contains(&l) {
                    labels.push(l);
                }
            }
        }
        labels
            .into_iter()
            .filter_map(|l| {
                let of = |f: fn(&StepSpan) -> u64| {
                    Stats::of(self.runs.iter().flat_map(|r| {
                        r.step_labels()
                            .into_iter()
                            .filter(|(x, _)| *x == l)
                            .map(|(_, s)| f(s))
                            .collect::<Vec<_>>()
                    }))
                };
                Some((l.clone(), of(|s| s.start_us)?, of(|s| s.dur_us)?))
            })
            .collect()
    }

    /// The run whose library time is the median's (the lower middle one of an even count):
    /// the one detach shown step by step.
    pub fn median_run(&self) -> Option<&Run> {
        let mut runs: Vec<&Run> = self.runs.iter().filter(|r| r.lib_us.is_some()).collect();
        runs.sort_by_key(|r| r.lib_us);
        runs.get(runs.len().checked_sub(1)? / 2).copied()
    }

    pub fn uevents(&self) -> Option<Stats> {
        Stats::of(self.runs.iter().filter_map(|r| r.uevents))
    }

    pub fn extra(&self) -> Option<Stats> {
        Stats::of(self.runs.iter().filter_map(|r| r.extra))
    }

    pub fn findings(&self) -> Option<Stats> {
        Stats::of(self.runs.iter().filter_map(|r| r.findings))
    }

    pub fn rss(&self) -> Option<Stats> {
        Stats::of(self.runs.iter().filter_map(|r| r.rss_kib))
    }

    /// Time from the `scsi_device` to the disk `add` uevent: the kernel's sd probe.
    pub fn probe(&self) -> Option<Stats> {
        Stats::of(
            self.runs
                .iter()
                .filter_map(|r| match (r.dev_add_us, r.add_us) {
                    (Some(d), Some(a)) => Some(a.saturating_sub(d)),
                    _ => None,
                }),
        )
    }

    /// Time from the disk's `add` uevent to the end of the run.
    pub fn after_add(&self) -> Option<Stats> {
        Stats::of(
            self.runs
                .iter()
                .filter_map(|r| r.add_us.map(|a| r.wall_us.saturating_sub(a))),
        )
    }
}

/// Median, minimum and maximum of a sample.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stats {
    pub median: f64,
    pub min: u64,
    pub max: u64,
    pub n: usize,
}

impl Stats {
    pub fn of(values: impl Iterator<Item = u64>) -> Option<Self> {
        let mut v: Vec<u64> = values.collect();
        if v.is_empty() {
            return None;
        }
        v.sort_unstable();
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2] as f64
        } else {
            (v[n / 2 - 1] as f64 + v[n / 2] as f64) / 2.0
        };
        Some(Self {
            median,
            min: v[0],
            max: v[n - 1],
            n,
        })
    }
}

// ---------------------------------------------------------------------------------------
// Line format: `M\tid\trow\tlabel\tstate\tmessage\tnote`, then one
// `R\tid\twall\tlib\tuevents\textra\trss\tadd\tdev_add\tcheck\tfirst_write\tafter_ready\tsteps\tfindings`
// line per run, `steps` as `name@start+length,...` (microseconds) or `-`.
// ---------------------------------------------------------------------------------------

fn clean(s: &str) -> String {
    s.replace(['\t', '\n', '\r'], " ")
}

fn opt(v: Option<u64>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

fn steps_field(steps: &[StepSpan]) -> String {
    if steps.is_empty() {
        return "-".to_owned();
    }
    let each: Vec<String> = steps
        .iter()
        .map(|s| {
            format!(
                "{}@{}+{}",
                clean(&s.name).replace([',', '@', '+'], "_"),
                s.start_us,
                s.dur_us
            )
        })
        .collect();
    each.join(",")
}

fn parse_steps(field: &str) -> Option<Vec<StepSpan>> {
    if field == "-" {
        return Some(Vec::new());
    }
    field
        .split(',')
        .map(|one| {
            let (name, span) = one.split_once('@')?;
            let (start, dur) = span.split_once('+')?;
            Some(StepSpan {
                name: name.to_owned(),
                start_us: start.parse().ok()?,
                dur_us: dur.parse().ok()?,
            })
        })
        .collect()
}

pub fn to_lines(m: &Measurement) -> String {
    let (state, msg) = match &m.state {
        State::Ok => ("ok", ""),
        State::Unavailable(s) => ("unavailable", s.as_str()),
        State::Failed(s) => ("failed", s.as_str()),
    };
    let mut out = format!(
        "M\t{}\t{}\t{}\t{state}\t{}\t{}\n",
        clean(&m.id),
        clean(&m.row),
        clean(&m.label),
        clean(msg),
        clean(&m.note)
    );
    for r in &m.runs {
        let _ = writeln!(
            out,
            "R\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
            clean(&m.id),
            r.wall_us,
            opt(r.lib_us),
            opt(r.uevents),
            opt(r.extra),
            opt(r.rss_kib),
            opt(r.add_us),
            opt(r.dev_add_us),
            opt(r.check_us),
            opt(r.first_write_us),
            opt(r.after_ready_us),
            steps_field(&r.steps),
            opt(r.findings)
        );
    }
    out
}

pub fn from_lines(text: &str) -> Result<Vec<Measurement>> {
    let mut out: Vec<Measurement> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let f: Vec<&str> = line.split('\t').collect();
        let bad = || format!("line {}: malformed benchmark record {line:?}", i + 1);
        match f.first() {
            Some(&"M") if f.len() == 7 => {
                let state = match f[4] {
                    "ok" => State::Ok,
                    "unavailable" => State::Unavailable(f[5].to_owned()),
                    "failed" => State::Failed(f[5].to_owned()),
                    _ => return Err(bad().into()),
                };
                let m = Measurement {
                    id: f[1].to_owned(),
                    row: f[2].to_owned(),
                    label: f[3].to_owned(),
                    runs: Vec::new(),
                    state,
                    note: f[6].to_owned(),
                };
                // A measurement written again (after more runs, or with a note saying more)
                // replaces the earlier copy where it stood: the methods keep their order.
                match out.iter_mut().find(|o| o.id == m.id) {
                    Some(old) => *old = m,
                    None => out.push(m),
                }
            }
            // Records written before `check_us`, `first_write_us`, `after_ready_us`, `steps`
            // and `findings` have fields fewer.
            Some(&"R") if (9..=14).contains(&f.len()) => {
                let num = |s: &str| -> Result<Option<u64>> {
                    if s == "-" {
                        Ok(None)
                    } else {
                        Ok(Some(s.parse().map_err(|_| bad())?))
                    }
                };
                // A field an older record does not have reads as not measured.
                let later = |i: usize| f.get(i).map_or(Ok(None), |s| num(s));
                let run = Run {
                    wall_us: num(f[2])?.ok_or_else(bad)?,
                    lib_us: num(f[3])?,
                    uevents: num(f[4])?,
                    extra: num(f[5])?,
                    rss_kib: num(f[6])?,
                    add_us: num(f[7])?,
                    dev_add_us: num(f[8])?,
                    check_us: later(9)?,
                    first_write_us: later(10)?,
                    after_ready_us: later(11)?,
                    steps: match f.get(12) {
                        Some(s) => parse_steps(s).ok_or_else(bad)?,
                        None => Vec::new(),
                    },
                    findings: later(13)?,
                };
                let m = out
                    .iter_mut()
                    .rev()
                    .find(|m| m.id == f[1])
                    .ok_or_else(bad)?;
                m.runs.push(run);
            }
            None | Some(&"") => {}
            _ => return Err(bad().into()),
        }
    }
    Ok(out)
}

/// Appends measurements to a file as they complete, so a guest that dies half-way still
/// leaves what it measured.
#[derive(Debug)]
pub struct Recorder {
    file: std::fs::File,
}

impl Recorder {
    pub fn create(path: &Path) -> Result<Self> {
        let file = std::fs::File::create(path)
            .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
        Ok(Self { file })
    }

    pub fn record(&mut self, m: &Measurement) -> Result<()> {
        self.file.write_all(to_lines(m).as_bytes())?;
        self.file.flush()?;
        Ok(())
    }
}

/// The order the methods of a row run in, in round `round`: as listed in the warm-up (round 0),
/// shuffled in every recorded round, the same shuffle for the same round in every bench run.
///
/// A run can leave the kernel or the target in a state that makes the next one faster or
/// slower than it would be alone. In two lab probes of the node row's scans (2026-11-26, ten
/// runs each, resident), the 2-session scan took a median 103 ms when it came right after a
/// one-path scan and 70 ms when it came after a 2-session one, its second session's write
/// returning 23 ms later. In a fixed order every round gives each method the same
/// predecessor, so such an effect falls on one method every time and reads as a difference
/// between methods; shuffled, it falls on all of them alike.
pub fn round_order(n: usize, round: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    if round == 0 {
        return order;
    }
    // xorshift64*, seeded by the round: reproducible without a dependency.
    let mut x = (round as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = |bound: usize| {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 33) as usize % bound
    };
    for i in (1..n).rev() {
        order.swap(i, next(i + 1));
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_after_the_warm_up_are_shuffled_reproducibly() {
        assert_eq!(round_order(6, 0), [0, 1, 2, 3, 4, 5]);
        assert!(round_order(0, 3).is_empty());
        assert_eq!(round_order(1, 3), [0]);
        let mut predecessors = std::collections::BTreeSet::new();
        for round in 1..=15 {
            let order = round_order(6, round);
            let mut sorted = order.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, [0, 1, 2, 3, 4, 5], "round {round}: {order:?}");
            assert_eq!(order, round_order(6, round), "round {round}");
            // What ran just before method 2 (the 2-session scan in the node row).
            let at = order.iter().position(|&m| m == 2).unwrap();
            predecessors.insert(at.checked_sub(1).map(|i| order[i]));
        }
        // Over 15 rounds it follows several methods, and comes first in some round.
        assert!(predecessors.len() >= 4, "{predecessors:?}");
        assert!(predecessors.contains(&None), "{predecessors:?}");
    }

    #[test]
    fn medians_of_odd_and_even_samples() {
        let s = Stats::of([5, 1, 3].into_iter()).unwrap();
        assert_eq!((s.median, s.min, s.max, s.n), (3.0, 1, 5, 3));
        let s = Stats::of([4, 1, 3, 2].into_iter()).unwrap();
        assert_eq!(s.median, 2.5);
        assert!(Stats::of(std::iter::empty()).is_none());
    }

    #[test]
    fn lines_round_trip() {
        let mut a = Measurement::new("scan", "lunkit", "lunkit scan\tiscsi", "note");
        a.runs.push(Run {
            wall_us: 10,
            lib_us: Some(8),
            uevents: Some(14),
            extra: Some(0),
            rss_kib: Some(4000),
            add_us: Some(7),
            dev_add_us: Some(5),
            check_us: Some(3),
            first_write_us: Some(2),
            after_ready_us: Some(1),
            steps: vec![
                StepSpan {
                    name: "lock".into(),
                    start_us: 0,
                    dur_us: 4,
                },
                StepSpan {
                    name: "delete-path".into(),
                    start_us: 5,
                    dur_us: 2,
                },
            ],
            findings: Some(2),
        });
        a.runs.push(Run {
            wall_us: 12,
            ..Run::default()
        });
        let mut b = Measurement::new("teardown", "lunkit", "lunkit detach", "");
        b.state = State::Unavailable("no detach subcommand".into());
        let text = format!("{}{}", to_lines(&a), to_lines(&b));
        let back = from_lines(&text).unwrap();
        a.label = "lunkit scan iscsi".into();
        assert_eq!(back, vec![a.clone(), b.clone()]);
        // Written again with another note, the first stays first, with its new runs only.
        a.note = "note, and what it found".into();
        a.runs.truncate(1);
        let again = format!("{text}{}", to_lines(&a));
        assert_eq!(from_lines(&again).unwrap(), vec![a, b]);
        assert!(from_lines("X\t1").is_err());
        assert!(from_lines("R\tnope\t1\t-\t-\t-\t-\t-\t-").is_err());
        // A record from before `check_us` still reads, without it.
        let old = "M\tteardown.lunkit\tteardown\tlunkit detach\tok\t\t\nR\tteardown.lunkit\t9\t8\t-\t-\t-\t-\t-\n";
        let back = from_lines(old).unwrap();
        assert_eq!(back[0].runs[0].lib_us, Some(8));
        assert_eq!(back[0].runs[0].check_us, None);
        // And one from before `first_write_us`, with `check_us`.
        let old =
            "M\tnode.lunkit\tnode\tlunkit scan\tok\t\t\nR\tnode.lunkit\t9\t8\t-\t-\t-\t-\t-\t4\n";
        let back = from_lines(old).unwrap();
        assert_eq!(back[0].runs[0].check_us, Some(4));
        assert_eq!(back[0].runs[0].first_write_us, None);
        assert!(
            from_lines("M\tt.l\tt\tl\tok\t\t\nR\tt.l\t9\t8\t-\t-\t-\t-\t-\t-\t-\t-\tlock@1")
                .is_err()
        );
    }

    fn span(name: &str, start_us: u64, dur_us: u64) -> StepSpan {
        StepSpan {
            name: name.into(),
            start_us,
            dur_us,
        }
    }

    #[test]
    fn side_by_side_steps_count_once_and_the_rest_is_outside() {
        let run = Run {
            lib_us: Some(100),
            steps: vec![
                span("identify", 0, 10),
                span("check-in-use", 20, 30),
                // Two paths at once, overlapping each other.
                span("flush-path", 60, 10),
                span("delete-path", 70, 20),
                span("flush-path", 60, 5),
                span("delete-path", 65, 15),
            ],
            ..Run::default()
        };
        // Covered: 0-10, 20-50, 60-90: 70 of 100.
        assert_eq!(run.outside_steps_us(), Some(30));
        let labels: Vec<String> = run.step_labels().into_iter().map(|(l, _)| l).collect();
        assert_eq!(
            labels,
            [
                "identify",
                "check-in-use",
                "flush-path #1",
                "delete-path #1",
                "flush-path #2",
                "delete-path #2"
            ]
        );
        assert_eq!(Run::default().outside_steps_us(), None);
        let no_lib = Run {
            steps: vec![span("lock", 0, 1)],
            ..Run::default()
        };
        assert_eq!(no_lib.outside_steps_us(), None);
    }

    #[test]
    fn step_stats_are_per_label_over_the_runs_that_had_it() {
        let mut m = Measurement::new("t", "lunkit", "lunkit detach", "");
        for (lib, check, retry) in [(100, 30, false), (120, 50, true), (90, 20, false)] {
            let mut steps = vec![span("identify", 0, 10), span("check-in-use", 10, check)];
            if retry {
                steps.push(span("check-in-use", 80, 5));
            }
            m.runs.push(Run {
                lib_us: Some(lib),
                steps,
                ..Run::default()
            });
        }
        let stats = m.step_stats();
        let names: Vec<&str> = stats.iter().map(|(l, _, _)| l.as_str()).collect();
        assert_eq!(
            names,
            [
                "identify",
                "check-in-use",
                "check-in-use #1",
                "check-in-use #2"
            ]
        );
        assert_eq!(stats[1].2.n, 2);
        assert_eq!(stats[1].2.median, 25.0);
        assert_eq!((stats[3].1.median, stats[3].2.median), (80.0, 5.0));
        assert_eq!(m.median_run().unwrap().lib_us, Some(100));
        assert_eq!(m.outside_steps().unwrap().median, 60.0);
    }
}

//! Splitting the default kernel's VM tests over guests that run side by side, balanced by
//! each test's known cost rather than by count.
//!
//! CI's 2-core machine ran the default kernel's hundred tests one after another in one TCG
//! guest, which kept only about 1.2 cores busy: many tests wait on the kernel, udev and
//! multipathd. Two guests, each with the same isolation as one (its own overlays, `/tmp`,
//! lab baseline and checked reset after each test), use the other core.
//!
//! A test's cost is its duration in the runs before: the runner records every passed test's
//! seconds in `target/xtask-vm/durations.tsv` after each run ([`record`]), over the
//! committed `tests/vm/durations.tsv` (what a fresh CI checkout has). A test in neither
//! costs the median of the known ones.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::vmtests::{Outcome, VmTest};
use crate::{Result, paths};

/// The environment variable that sets how many guests run the default kernel's tests.
pub const GUESTS_ENV: &str = "LUNKIT_VM_GUESTS";

/// Two: the host has two cores, and a third guest would only share them more thinly (each
/// guest is a 2-vCPU, 2 GiB QEMU).
pub const DEFAULT_GUESTS: usize = 2;

/// More guests than this is a typo, not a plan: each one holds 2 GiB.
const MAX_GUESTS: usize = 4;

/// Test binaries whose tests must share one guest, in their given order (none today: every
/// test sets up and tears down its own lab); [`partition`] never splits them.
pub const TOGETHER: &[&str] = &[];

/// What a test costs when no run has timed it: the median of the known costs, or this.
const UNKNOWN_SECS: f64 = 20.0;

/// What a guest may come to hold of the host's memory (its `--memory`), in KiB.
const GUEST_KIB: u64 = 2 << 20;

/// How many guests run the default kernel's tests: [`GUESTS_ENV`], or [`DEFAULT_GUESTS`]
/// when the host's available memory holds them, another kernel's guest and 1 GiB for the
/// host's own work; else one, said on standard error.
pub fn guests() -> Result<usize> {
    match std::env::var(GUESTS_ENV) {
        Err(std::env::VarError::NotPresent) => {
            let available = std::fs::read_to_string("/proc/meminfo")
                .ok()
                .and_then(|t| mem_available_kib(&t));
            let fits = fitting(available, DEFAULT_GUESTS);
            if fits < DEFAULT_GUESTS {
                eprintln!(
                    "xtask: {fits} guest(s) for the default kernel: the host has {} KiB \
                     available, {} KiB per guest ({GUESTS_ENV} sets it)",
                    available.unwrap_or_default(),
                    GUEST_KIB
                );
            }
            Ok(fits)
        }
        Ok(v) => v
            .trim()
            .parse()
            .ok()
            .filter(|n| (1..=MAX_GUESTS).contains(n))
            .ok_or_else(|| format!("{GUESTS_ENV}={v:?}: expected 1 to {MAX_GUESTS}").into()),
        Err(e) => Err(format!("{GUESTS_ENV}: {e}").into()),
    }
}

/// `MemAvailable` of a `/proc/meminfo` text, in KiB.
pub fn mem_available_kib(meminfo: &str) -> Option<u64> {
    meminfo.lines().find_map(|l| {
        let rest = l.strip_prefix("MemAvailable:")?;
        rest.trim().strip_suffix("kB")?.trim().parse().ok()
    })
}

/// How many of `wanted` guests fit in `available` KiB beside another kernel's guest and
/// 1 GiB for the host; at least one. Unknown memory is taken as enough.
pub fn fitting(available: Option<u64>, wanted: usize) -> usize {
    let Some(kib) = available else {
        return wanted;
    };
    let room = kib.saturating_sub(GUEST_KIB + (1 << 20)) / GUEST_KIB;
    usize::try_from(room).unwrap_or(usize::MAX).clamp(1, wanted)
}

/// The committed costs, what a fresh checkout has.
fn committed() -> PathBuf {
    paths::root().join("tests/vm/durations.tsv")
}

/// The costs this checkout's runs recorded.
fn recorded() -> PathBuf {
    paths::target_dir().join("xtask-vm/durations.tsv")
}

/// Seconds per test key.
#[derive(Debug, Default, Clone)]
pub struct Costs(BTreeMap<String, f64>);

impl Costs {
    /// The committed costs, overridden by the recorded ones. A missing or unreadable file
    /// adds nothing: costs only balance the guests, they decide no result.
    pub fn load() -> Costs {
        let mut costs = BTreeMap::new();
        for file in [committed(), recorded()] {
            if let Ok(text) = std::fs::read_to_string(&file) {
                costs.extend(parse(&text));
            }
        }
        Costs(costs)
    }

    /// `test`'s cost in seconds: known, or the median of the known ones.
    pub fn of(&self, key: &str) -> f64 {
        self.0.get(key).copied().unwrap_or_else(|| self.median())
    }

    fn median(&self) -> f64 {
        let mut v: Vec<f64> = self.0.values().copied().collect();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(UNKNOWN_SECS)
    }
}

/// `KEY<TAB>SECS` lines; `#` comments, blank and malformed lines are skipped.
fn parse(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (key, secs) = l.split_once('\t')?;
            let secs: f64 = secs.trim().parse().ok()?;
            (secs.is_finite() && secs >= 0.0).then(|| (key.trim().to_owned(), secs))
        })
        .collect()
}

fn format(costs: &BTreeMap<String, f64>) -> String {
    let mut s = String::from(
        "# Seconds each VM test took when it last passed (key, tab, seconds): what `cargo xtask\n\
         # test` balances its guests by. The runner writes target/xtask-vm/durations.tsv;\n\
         # tests/vm/durations.tsv is a copy of it committed for fresh checkouts (CI).\n",
    );
    for (key, secs) in costs {
        s.push_str(&format!("{key}\t{secs:.1}\n"));
    }
    s
}

/// Adds the passed tests' durations to the recorded costs (a failed test's time says little
/// about its next run). Tests not in `outcomes` keep their earlier cost.
pub fn record(outcomes: &[Outcome]) -> Result<PathBuf> {
    let file = recorded();
    let mut costs = std::fs::read_to_string(&file)
        .map(|t| parse(&t))
        .unwrap_or_default();
    for o in outcomes.iter().filter(|o| o.passed()) {
        if let Some(secs) = o.secs {
            costs.insert(o.key.clone(), secs);
        }
    }
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&file, format(&costs))
        .map_err(|e| format!("cannot write {}: {e}", file.display()))?;
    Ok(file)
}

/// Splits `tests` into at most `n` parts of about equal cost: the costliest unit first,
/// each into the part that costs least so far (longest processing time first, within 4/3 of
/// the best split). A unit is one test, or every test of a binary named in `together`
/// ([`TOGETHER`]). Each part keeps the tests' given order; empty parts are dropped.
pub fn partition(tests: &[VmTest], costs: &Costs, n: usize, together: &[&str]) -> Vec<Vec<VmTest>> {
    let mut units: Vec<(f64, Vec<usize>)> = Vec::new();
    let mut unit_of: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, t) in tests.iter().enumerate() {
        let cost = costs.of(&t.key);
        let krate = t.key.split("::").next().unwrap_or_default();
        match together.iter().find(|k| **k == krate) {
            Some(k) if unit_of.contains_key(k) => {
                let u = &mut units[unit_of[k]];
                u.0 += cost;
                u.1.push(i);
            }
            found => {
                if let Some(k) = found {
                    unit_of.insert(k, units.len());
                }
                units.push((cost, vec![i]));
            }
        }
    }
    units.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    let mut parts: Vec<(f64, Vec<usize>)> = vec![(0.0, Vec::new()); n.max(1)];
    for (cost, members) in units {
        let cheapest = parts
            .iter_mut()
            .min_by(|a, b| a.0.total_cmp(&b.0))
            .expect("at least one part");
        cheapest.0 += cost;
        cheapest.1.extend(members);
    }
    parts
        .into_iter()
        .filter(|(_, members)| !members.is_empty())
        .map(|(_, mut members)| {
            members.sort_unstable();
            members.into_iter().map(|i| tests[i].clone()).collect()
        })
        .collect()
}

/// The cost of `tests`, in seconds.
pub fn total(tests: &[VmTest], costs: &Costs) -> f64 {
    tests.iter().map(|t| costs.of(&t.key)).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(key: &str) -> VmTest {
        VmTest {
            key: key.into(),
            bin: "/t/x".into(),
            name: key.split("::").nth(1).unwrap_or_default().into(),
        }
    }

    fn costs(pairs: &[(&str, f64)]) -> Costs {
        Costs(pairs.iter().map(|(k, s)| ((*k).to_owned(), *s)).collect())
    }

    fn keys(part: &[VmTest]) -> Vec<&str> {
        part.iter().map(|t| t.key.as_str()).collect()
    }

    #[test]
    fn balances_by_cost_not_by_count() {
        let tests = [t("a::long"), t("a::s1"), t("a::s2"), t("a::s3"), t("a::s4")];
        let c = costs(&[
            ("a::long", 100.0),
            ("a::s1", 30.0),
            ("a::s2", 30.0),
            ("a::s3", 30.0),
            ("a::s4", 20.0),
        ]);
        let parts = partition(&tests, &c, 2, &[]);
        assert_eq!(keys(&parts[0]), ["a::long"]);
        assert_eq!(keys(&parts[1]), ["a::s1", "a::s2", "a::s3", "a::s4"]);
        assert_eq!(total(&parts[0], &c), 100.0);
        assert_eq!(total(&parts[1], &c), 110.0);
    }

    #[test]
    fn parts_keep_the_given_order_and_lose_no_test() {
        let tests: Vec<VmTest> = (0..9).map(|i| t(&format!("b::t{i}"))).collect();
        let c = costs(&[("b::t0", 1.0), ("b::t4", 50.0), ("b::t8", 9.0)]);
        let parts = partition(&tests, &c, 2, &[]);
        let mut all: Vec<&str> = parts.iter().flat_map(|p| keys(p)).collect();
        for p in &parts {
            let idx: Vec<usize> = p
                .iter()
                .map(|x| tests.iter().position(|y| y == x).unwrap())
                .collect();
            assert!(idx.is_sorted(), "{idx:?}");
        }
        all.sort_unstable();
        assert_eq!(all, keys(&tests));
    }

    #[test]
    fn one_guest_takes_everything_and_no_part_is_empty() {
        let tests = [t("a::x"), t("a::y")];
        let c = Costs::default();
        assert_eq!(partition(&tests, &c, 1, &[]), vec![tests.to_vec()]);
        assert_eq!(partition(&tests, &c, 4, &[]).len(), 2);
        assert!(partition(&[], &c, 2, &[]).is_empty());
    }

    #[test]
    fn a_together_binary_stays_in_one_part_in_order() {
        let tests = [t("a::x"), t("b::p"), t("a::y"), t("b::q"), t("a::z")];
        let c = costs(&[
            ("a::x", 10.0),
            ("a::y", 10.0),
            ("a::z", 10.0),
            ("b::p", 40.0),
        ]);
        let parts = partition(&tests, &c, 2, &["a"]);
        assert_eq!(parts.len(), 2);
        let a_keys = |p: &[VmTest]| -> Vec<String> {
            keys(p)
                .into_iter()
                .filter(|k| k.starts_with("a::"))
                .map(String::from)
                .collect()
        };
        let mut a_parts: Vec<Vec<String>> = parts.iter().map(|p| a_keys(p)).collect();
        a_parts.retain(|k| !k.is_empty());
        assert_eq!(a_parts, [["a::x", "a::y", "a::z"]]);
    }

    #[test]
    fn unknown_tests_cost_the_median() {
        let c = costs(&[("a::x", 10.0), ("a::y", 30.0), ("a::z", 50.0)]);
        assert_eq!(c.of("a::new"), 30.0);
        assert_eq!(Costs::default().of("a::new"), UNKNOWN_SECS);
    }

    #[test]
    fn costs_round_trip_and_skip_junk() {
        let c: BTreeMap<String, f64> = [("vm_x::a".to_owned(), 12.5), ("vm_y::b".into(), 3.0)]
            .into_iter()
            .collect();
        assert_eq!(parse(&format(&c)), c);
        let junk = "# c\nvm_x::a\t-1\nvm_x::b\tNaN\nvm_x::c 3\n\nvm_x::d\t4.5\n";
        assert_eq!(
            parse(junk).into_iter().collect::<Vec<_>>(),
            [("vm_x::d".to_owned(), 4.5)]
        );
    }

    #[test]
    fn the_guests_are_as_many_as_the_memory_holds() {
        let text = "MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   7340032 kB\n";
        assert_eq!(mem_available_kib(text), Some(7_340_032));
        assert_eq!(mem_available_kib("MemTotal: 1 kB\n"), None);
        let gib = |n: u64| Some(n << 20);
        assert_eq!(fitting(gib(22), 2), 2);
        assert_eq!(fitting(gib(7), 2), 2);
        assert_eq!(fitting(gib(6), 2), 1);
        assert_eq!(fitting(gib(1), 2), 1, "never none");
        assert_eq!(fitting(None, 2), 2);
    }
}

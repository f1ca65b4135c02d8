//! The host side of the VM test runner: list every VM test on the host, boot a guest that
//! runs them one at a time with a checked lab reset between them (testrun.rs), and boot a
//! fresh guest for the rest when a reset cannot clean. Also the flake detector
//! (`--repeat N`), and the fixed lines the guest reports in ([`Line`]).

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::provision::{self, Lab};
use crate::vm::Boot;
use crate::{Result, host, labkernel, paths, split, twonode};

/// How long one VM test may run in the guest before it is killed and counted as failed. The
/// longest test (vm_detach's killed clean-ups, 119 s in durations.tsv) took 235 s in a CI run
/// on a machine about twice as slow as that: 600 s leaves room for a slower day, and a hang
/// then costs at most this much CI time (plus the host's wait for a silent guest).
pub const TEST_LIMIT: Duration = Duration::from_secs(600);

/// The prefix of every line the guest runner reports in.
const MARK: &str = "xtask-vm-test:";

/// One VM test: `name` in the test binary `bin`, known as `key` (`vm_dm::name`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmTest {
    pub key: String,
    pub bin: PathBuf,
    pub name: String,
}

impl VmTest {
    /// The plan file the guest reads: `KEY<TAB>BIN<TAB>NAME` per line. A file rather than
    /// arguments, because the guest's command line goes through the kernel's, which is short.
    pub fn plan(tests: &[VmTest]) -> String {
        tests
            .iter()
            .map(|t| format!("{}\t{}\t{}\n", t.key, t.bin.display(), t.name))
            .collect()
    }

    pub fn parse_plan(text: &str) -> Result<Vec<VmTest>> {
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                let mut f = l.split('\t');
                match (f.next(), f.next(), f.next(), f.next()) {
                    (Some(key), Some(bin), Some(name), None) => Ok(VmTest {
                        key: key.to_owned(),
                        bin: PathBuf::from(bin),
                        name: name.to_owned(),
                    }),
                    _ => Err(format!("bad test plan line {l:?}").into()),
                }
            })
            .collect()
    }
}

/// Lists the ignored tests of each VM test binary (`BIN --list --ignored`, no VM needed), as
/// `(crate name, executable)`, keeping those whose key contains `filter` (or one of its `|`-separated parts).
pub fn list(bins: &[(String, PathBuf)], filter: Option<&str>) -> Result<Vec<VmTest>> {
    let mut tests = Vec::new();
    for (krate, bin) in bins {
        let out = Command::new(bin)
            .args(["--list", "--ignored"])
            .current_dir(paths::root())
            .output()
            .map_err(|e| format!("cannot run {} --list: {e}", bin.display()))?;
        if !out.status.success() {
            return Err(format!(
                "`{} --list --ignored` failed ({}): {}",
                bin.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )
            .into());
        }
        tests.extend(parse_list(
            krate,
            bin,
            &String::from_utf8_lossy(&out.stdout),
        ));
    }
    // `a|b`: a test whose name contains any of the parts.
    tests.retain(|t| filter.is_none_or(|f| f.split('|').any(|p| t.key.contains(p))));
    Ok(tests)
}

/// libtest's `--list` output: `NAME: test` lines (benchmarks and the summary are skipped).
fn parse_list(krate: &str, bin: &Path, stdout: &str) -> Vec<VmTest> {
    stdout
        .lines()
        .filter_map(|l| l.strip_suffix(": test"))
        .map(|name| VmTest {
            key: format!("{krate}::{name}"),
            bin: bin.to_path_buf(),
            name: name.to_owned(),
        })
        .collect()
}

/// How a test ended in the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Passed,
    /// Its assertions failed (or it crashed, or overran [`TEST_LIMIT`]).
    Failed,
    /// It passed, but left something running or configured that the baseline did not have.
    Leaked,
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Status::Passed => "passed",
            Status::Failed => "failed",
            Status::Leaked => "leaked",
        })
    }
}

impl Status {
    fn parse(s: &str) -> Option<Status> {
        match s {
            "passed" => Some(Status::Passed),
            "failed" => Some(Status::Failed),
            "leaked" => Some(Status::Leaked),
            _ => None,
        }
    }
}

/// A line the guest runner prints for the host to read, e.g.
/// `xtask-vm-test: RESULT vm_dm::mpath_remove_map_and_partition_map passed 12.3`.
#[derive(Debug, Clone, PartialEq)]
pub enum Line {
    /// The runner started, this long after the guest kernel did.
    Booted {
        uptime: f64,
    },
    Start {
        key: String,
    },
    Result {
        key: String,
        status: Status,
        secs: f64,
    },
    /// The first line of why a test failed or what it leaked.
    Reason {
        key: String,
        text: String,
    },
    /// The check and reset after a test took `secs`; `clean` tells if the lab is at the
    /// baseline again.
    Lab {
        key: String,
        secs: f64,
        clean: bool,
    },
    /// The runner stops: the tests not run yet need a fresh guest.
    Stop {
        why: String,
    },
}

impl fmt::Display for Line {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Line::Booted { uptime } => write!(f, "{MARK} BOOTED {uptime:.1}"),
            Line::Start { key } => write!(f, "{MARK} START {key}"),
            Line::Result { key, status, secs } => {
                write!(f, "{MARK} RESULT {key} {status} {secs:.1}")
            }
            Line::Reason { key, text } => {
                let one_line = text.lines().next().unwrap_or_default();
                write!(f, "{MARK} REASON {key} {one_line}")
            }
            Line::Lab { key, secs, clean } => write!(
                f,
                "{MARK} LAB {key} {secs:.2} {}",
                if *clean { "clean" } else { "dirty" }
            ),
            Line::Stop { why } => write!(f, "{MARK} STOP {why}"),
        }
    }
}

impl Line {
    pub fn parse(line: &str) -> Option<Line> {
        let rest = line.trim_end().strip_prefix(MARK)?.trim_start();
        let (kind, rest) = rest.split_once(' ').unwrap_or((rest, ""));
        let words: Vec<&str> = rest.split_whitespace().collect();
        match (kind, words.as_slice()) {
            ("BOOTED", [uptime]) => Some(Line::Booted {
                uptime: uptime.parse().ok()?,
            }),
            ("START", [key]) => Some(Line::Start {
                key: (*key).to_owned(),
            }),
            ("RESULT", [key, status, secs]) => Some(Line::Result {
                key: (*key).to_owned(),
                status: Status::parse(status)?,
                secs: secs.parse().ok()?,
            }),
            ("REASON", [key, ..]) => Some(Line::Reason {
                key: (*key).to_owned(),
                text: rest.trim_start()[key.len()..].trim().to_owned(),
            }),
            ("LAB", [key, secs, state]) => Some(Line::Lab {
                key: (*key).to_owned(),
                secs: secs.parse().ok()?,
                clean: match *state {
                    "clean" => true,
                    "dirty" => false,
                    _ => return None,
                },
            }),
            ("STOP", _) => Some(Line::Stop {
                why: rest.trim().to_owned(),
            }),
            _ => None,
        }
    }
}

/// How one test ended, as the host saw it.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub key: String,
    /// `None`: no result, because the guest died during the test or never got to it.
    pub status: Option<Status>,
    pub secs: Option<f64>,
    pub reason: Option<String>,
    /// The guest it ran in ([`run_suites`] names them).
    pub guest: String,
    /// Which boot of its guest it ran in (1-based).
    pub boot: usize,
}

impl Outcome {
    pub fn passed(&self) -> bool {
        self.status == Some(Status::Passed)
    }

    /// A test with no result, and why.
    fn not_run(key: &str, reason: String, guest: &str, boot: usize) -> Outcome {
        Outcome {
            key: key.to_owned(),
            status: None,
            secs: None,
            reason: Some(reason),
            guest: guest.to_owned(),
            boot,
        }
    }

    fn label(&self) -> &'static str {
        match self.status {
            Some(Status::Passed) => "passed",
            Some(Status::Failed) => "FAILED",
            Some(Status::Leaked) => "LEAKED",
            None => "NOT RUN",
        }
    }
}

/// One guest's share of a run.
#[derive(Debug, Clone)]
pub struct GuestSummary {
    pub name: String,
    pub tests: usize,
    pub failed: usize,
    /// The sum of its tests' durations.
    pub test_secs: f64,
    pub boots: usize,
    pub wall: Duration,
    /// Everything it printed, every boot.
    pub log: PathBuf,
}

/// One run of a set of VM tests, over as many boots as it took.
#[derive(Debug, Default)]
pub struct SuiteRun {
    /// In the order of the tests given.
    pub outcomes: Vec<Outcome>,
    pub boots: usize,
    /// Guest uptime when the runner started, per boot (the cost of a fresh boot).
    pub uptimes: Vec<f64>,
    /// Check + reset after each test.
    pub lab_secs: Vec<f64>,
    /// Per guest, in the order they were started.
    pub guests: Vec<GuestSummary>,
    pub wall: Duration,
}

impl SuiteRun {
    pub fn counts(&self) -> (usize, usize) {
        let passed = self.outcomes.iter().filter(|o| o.passed()).count();
        (passed, self.outcomes.len() - passed)
    }

    /// A guest's tests, none run, and why (its kernel could not be installed, its thread
    /// panicked).
    fn not_run(guest: &str, tests: &[VmTest], why: &str) -> SuiteRun {
        eprintln!(
            "xtask: [{guest}] none of its {} tests run: {why}",
            tests.len()
        );
        let outcomes: Vec<Outcome> = tests
            .iter()
            .map(|t| Outcome::not_run(&t.key, format!("not run: {why}"), guest, 0))
            .collect();
        SuiteRun {
            guests: vec![GuestSummary {
                name: guest.to_owned(),
                tests: tests.len(),
                failed: tests.len(),
                test_secs: 0.0,
                boots: 0,
                wall: Duration::ZERO,
                log: guest_log(guest),
            }],
            outcomes,
            ..SuiteRun::default()
        }
    }

    /// The per-test table, the timing line and each guest's share.
    pub fn print(&self) {
        println!(
            "xtask test: VM test results ({} boot{} in {} guest{}, {}):",
            self.boots,
            if self.boots == 1 { "" } else { "s" },
            self.guests.len(),
            if self.guests.len() == 1 { "" } else { "s" },
            minutes(self.wall)
        );
        for o in &self.outcomes {
            let secs = o
                .secs
                .map_or_else(|| "-".to_owned(), |s| format!("{s:.1}s"));
            let reason = o
                .reason
                .as_deref()
                .filter(|_| !o.passed())
                .map(|r| format!(": {r}"))
                .unwrap_or_default();
            println!(
                "  {:<8} {secs:>8}  {} boot {}  {}{reason}",
                o.label(),
                o.guest,
                o.boot,
                o.key
            );
        }
        if let (Some(med), Some(max)) = (median(&self.lab_secs), max(&self.lab_secs)) {
            println!(
                "xtask test: lab check+reset after each test: median {med:.1} s, max {max:.1} s \
                 ({} tests); a fresh guest was up after {:.1} s (median of {} boots)",
                self.lab_secs.len(),
                median(&self.uptimes).unwrap_or(0.0),
                self.uptimes.len()
            );
        }
        for g in &self.guests {
            let failed = if g.failed == 0 {
                String::new()
            } else {
                format!(
                    ", {} failed: their output is in {} (from `{MARK} START <test>`)",
                    g.failed,
                    g.log.display()
                )
            };
            println!(
                "xtask test: guest {}: {} tests in {} boot{}, their sum {:.0} s, wall {}{failed}",
                g.name,
                g.tests,
                g.boots,
                if g.boots == 1 { "" } else { "s" },
                g.test_secs,
                minutes(g.wall)
            );
        }
    }
}

/// Test binaries that boot another kernel than the lab's default: which, and with how many
/// vCPUs.
///
/// The auth kernel gets one. With two, Debian's 6.12 oopses now and then under QEMU's
/// multi-threaded TCG, seen in about one boot of five here and in CI: `Oops: int3` in code
/// a static key had just been patched in (`__alloc_skb` from `netlink_sendmsg`, as nvmet's
/// modules loaded), the guest panics and the run ends with exit 255. That is the int3 of
/// the kernel's `text_poke_bp` still executed by the other vCPU after the patch completed;
/// with a single vCPU there is no other CPU to run the stale code. 6.1 has never shown it.
/// The auth kernel is [`labkernel::LABEL`] here, its ABI resolved when a run boots it
/// ([`labkernel::chosen`]).
const KERNELS: &[(&str, &str, u8)] = &[("vm_nvme_auth", labkernel::LABEL, 1)];

/// The kernel `test` boots: `None` for the lab's default.
pub fn kernel_for(test: &VmTest) -> Option<&'static str> {
    let krate = test.key.split("::").next()?;
    KERNELS
        .iter()
        .find(|(k, _, _)| *k == krate)
        .map(|&(_, v, _)| v)
}

/// How many vCPUs a guest of kernel `version` (one of [`KERNELS`]) gets.
fn cpus_for(version: &str) -> u8 {
    KERNELS
        .iter()
        .find(|(_, v, _)| *v == version)
        .map_or(provision::DEFAULT_CPUS, |&(_, _, c)| c)
}

/// Every guest a run boots: the default kernel's tests split over [`split::guests`] guests
/// balanced by cost ([`split::partition`]), each other kernel's tests in a guest of their
/// own. As `(kernel, guest name, tests)`, `None` for the default kernel.
fn plan_guests(
    lab: &Lab,
    tests: &[VmTest],
    guests: usize,
    costs: &split::Costs,
) -> Vec<(Option<&'static str>, String, Vec<VmTest>)> {
    // A two-node binary's tests boot a pair of guests of their own (twonode.rs).
    let (pair, tests): (Vec<VmTest>, Vec<VmTest>) =
        tests.iter().cloned().partition(twonode::needs_two_nodes);
    let mut kernels: Vec<Option<&str>> = tests.iter().map(kernel_for).collect();
    kernels.sort();
    kernels.dedup();
    let mut plans = Vec::new();
    if !pair.is_empty() {
        plans.push((None, twonode::guest_name(&lab.kernel_version), pair));
    }
    for kernel in kernels {
        let group: Vec<VmTest> = tests
            .iter()
            .filter(|t| kernel_for(t) == kernel)
            .cloned()
            .collect();
        let Some(version) = kernel else {
            let parts = split::partition(&group, costs, guests, split::TOGETHER);
            let many = parts.len() > 1;
            for (i, part) in parts.into_iter().enumerate() {
                let name = if many {
                    format!("{}:{}", lab.kernel_version, char::from(b'a' + i as u8))
                } else {
                    lab.kernel_version.clone()
                };
                plans.push((None, name, part));
            }
            continue;
        };
        // The guest is named after the kernel it boots, so the run's report says which ran.
        let name = match version {
            labkernel::LABEL => labkernel::chosen().unwrap_or_else(|_| version.to_owned()),
            v => v.to_owned(),
        };
        plans.push((Some(version), name, group));
    }
    plans
}

/// Runs `tests` in guests side by side ([`plan_guests`]): the default kernel's split over
/// [`split::guests`] guests (`LUNKIT_VM_GUESTS`, 2 unless set), each other kernel's
/// (installed first when missing) in a guest of its own. Each guest runs its share as
/// [`run_suite`] does, one test at a time with the checked lab reset between them; one
/// result, the outcomes in the given order, each naming its guest.
///
/// Side by side because one TCG guest kept only about 1.2 of CI's 2 cores busy: its tests
/// wait on the kernel, udev and multipathd. Each guest has its own overlays, `/tmp`, lab
/// baseline, plan file and log; a guest that dies fails only its own remaining tests. The
/// other kernels' groups are small (the 6.12 group is four tests on one vCPU).
pub fn run_suites(lab: &Lab, lunkit: &Path, tests: &[VmTest]) -> Result<SuiteRun> {
    let start = Instant::now();
    let costs = split::Costs::load();
    let plans = plan_guests(lab, tests, split::guests()?, &costs);
    for (_, name, tests) in &plans {
        eprintln!(
            "xtask: guest {name}: {} VM test{}, about {:.0} s by earlier runs",
            tests.len(),
            if tests.len() == 1 { "" } else { "s" },
            split::total(tests, &costs)
        );
    }
    let runs: Vec<SuiteRun> = std::thread::scope(|s| {
        let threads: Vec<_> = plans
            .iter()
            .map(|(kernel, name, tests)| {
                s.spawn(move || {
                    let lab = match kernel {
                        Some(labkernel::LABEL) => labkernel::chosen().and_then(|abi| {
                            provision::with_kernel(lab, &abi, cpus_for(labkernel::LABEL))
                        }),
                        Some(v) => provision::with_kernel(lab, v, cpus_for(v)),
                        None => Ok(lab.clone()),
                    };
                    match lab {
                        Ok(lab) => run_suite(&lab, name, lunkit, tests),
                        Err(e) => SuiteRun::not_run(name, tests, &e.to_string()),
                    }
                })
            })
            .collect();
        threads
            .into_iter()
            .zip(&plans)
            .map(|(t, (_, name, tests))| {
                t.join().unwrap_or_else(|_| {
                    SuiteRun::not_run(name, tests, "the thread running this guest panicked")
                })
            })
            .collect()
    });
    let mut all = SuiteRun::default();
    for run in runs {
        all.outcomes.extend(run.outcomes);
        all.boots += run.boots;
        all.uptimes.extend(run.uptimes);
        all.lab_secs.extend(run.lab_secs);
        all.guests.extend(run.guests);
    }
    let order = |o: &Outcome| tests.iter().position(|t| t.key == o.key);
    all.outcomes.sort_by_key(order);
    all.wall = start.elapsed();
    match split::record(&all.outcomes) {
        Ok(file) => eprintln!(
            "xtask: the passed tests' durations are in {}",
            file.display()
        ),
        Err(e) => eprintln!("xtask: the tests' durations were not recorded: {e}"),
    }
    Ok(all)
}

/// Where guest `name`'s output goes, every boot of a run.
fn guest_log(name: &str) -> PathBuf {
    paths::target_dir()
        .join("xtask-vm")
        .join(format!("guest-{name}.log"))
}

/// Runs `tests` in guest `name`, each alone, with a checked lab reset between them; a guest
/// whose lab cannot be reset stops, and a fresh one runs the rest. A guest that cannot boot,
/// or runs no test, fails the tests it has left.
pub fn run_suite(lab: &Lab, name: &str, lunkit: &Path, tests: &[VmTest]) -> SuiteRun {
    let start = Instant::now();
    let mut run = SuiteRun::default();
    let mut results: BTreeMap<String, Outcome> = BTreeMap::new();
    let mut remaining: Vec<VmTest> = tests.to_vec();
    let log = guest_log(name);
    // One log per run: each boot appends.
    let _ = std::fs::remove_file(&log);
    while !remaining.is_empty() {
        run.boots += 1;
        let boot_no = run.boots;
        let end = match boot_once(lab, name, lunkit, &remaining, boot_no, &mut run) {
            Ok((end, outcomes)) => {
                results.extend(outcomes.into_iter().map(|o| (o.key.clone(), o)));
                end
            }
            Err(e) => format!("could not be run: {e}"),
        };
        let before = remaining.len();
        remaining.retain(|t| !results.contains_key(&t.key));
        if remaining.len() == before {
            eprintln!(
                "xtask: [{name}] boot {boot_no} ran none of its {before} tests (the guest \
                 {end}); giving up"
            );
            let why = format!("not run: guest {name} ran no test and {end}");
            for t in &remaining {
                let o = Outcome::not_run(&t.key, why.clone(), name, boot_no);
                results.insert(t.key.clone(), o);
            }
            print_console_tail(lab, name);
            break;
        }
    }
    run.outcomes = tests
        .iter()
        .filter_map(|t| results.remove(&t.key))
        .collect();
    run.wall = start.elapsed();
    run.guests.push(GuestSummary {
        name: name.to_owned(),
        tests: tests.len(),
        failed: run.outcomes.iter().filter(|o| !o.passed()).count(),
        test_secs: run.outcomes.iter().filter_map(|o| o.secs).sum(),
        boots: run.boots,
        wall: run.wall,
        log,
    });
    run
}

/// One boot of guest `name` running `remaining`: how the guest ended, and the outcomes of
/// the tests it ran (the one it died in counted as failed: it is not run again).
fn boot_once(
    lab: &Lab,
    name: &str,
    lunkit: &Path,
    remaining: &[VmTest],
    boot_no: usize,
    run: &mut SuiteRun,
) -> Result<(String, Vec<Outcome>)> {
    let plan_dir = paths::target_dir().join("xtask-vm");
    std::fs::create_dir_all(&plan_dir)?;
    // Per guest: several run side by side ([`run_suites`]).
    let plan = plan_dir.join(format!("plan-{}-{name}-{boot_no}.txt", std::process::id()));
    std::fs::write(&plan, VmTest::plan(remaining))
        .map_err(|e| format!("cannot write {}: {e}", plan.display()))?;
    eprintln!(
        "xtask: [{name}] boot {boot_no} of {}: {} VM test{} to run",
        lab.kernel_version,
        remaining.len(),
        if remaining.len() == 1 { "" } else { "s" }
    );
    let boot = Boot {
        timeout: Some(boot_limit(remaining.len())),
        idle_timeout: Some(TEST_LIMIT + Duration::from_secs(180)),
        name: Some(name.to_owned()),
        log: Some(guest_log(name)),
        ..Boot::default()
    };
    // Node A of a pair runs the same runner, on the link with node B beside it.
    let pair = remaining.iter().any(twonode::needs_two_nodes);
    let argv = host::guest_argv(&[
        if pair { "node-a" } else { "run-tests" },
        &lunkit.to_string_lossy(),
        &plan.to_string_lossy(),
    ])?;
    let tee = if pair {
        twonode::boot_pair(lab, boot, &argv, boot_no)
    } else {
        boot.run_tee(lab, &argv)
    };
    let _ = std::fs::remove_file(&plan);
    let tee = tee?;
    let end = tee.killed.clone().unwrap_or_else(|| {
        tee.status
            .map_or_else(|| "was not reaped".to_owned(), |s| format!("exited ({s})"))
    });
    let outcome = |key: String, status, secs, reason| Outcome {
        key,
        status,
        secs,
        reason,
        guest: name.to_owned(),
        boot: boot_no,
    };
    let mut started = None;
    let mut outcomes: Vec<Outcome> = Vec::new();
    for line in tee.lines.iter().filter_map(|l| Line::parse(l)) {
        match line {
            Line::Booted { uptime } => run.uptimes.push(uptime),
            Line::Start { key } => started = Some(key),
            Line::Result { key, status, secs } => {
                started = None;
                outcomes.push(outcome(key, Some(status), Some(secs), None));
            }
            Line::Reason { key, text } => {
                if let Some(o) = outcomes.iter_mut().find(|o| o.key == key) {
                    o.reason = Some(text);
                }
            }
            Line::Lab { secs, .. } => run.lab_secs.push(secs),
            Line::Stop { why } => eprintln!("xtask: [{name}] boot {boot_no} stopped early: {why}"),
        }
    }
    if let Some(key) = started {
        let why = format!("guest {name} ended during the test: it {end}");
        outcomes.push(outcome(key, Some(Status::Failed), None, Some(why)));
    }
    Ok((end, outcomes))
}

/// Why a guest ran nothing, from a diagnostic boot's console (its tests stay failed).
fn print_console_tail(lab: &Lab, name: &str) {
    eprintln!(
        "xtask: [{name}] booting {} once more with its console shown, to say why (a \
         diagnosis, not a retry)",
        lab.kernel_version
    );
    match crate::vm::console_tail(lab, 40) {
        Ok((status, lines)) => {
            eprintln!("xtask: [{name}] the diagnostic guest {status}; its console's last lines:");
            for l in lines {
                eprintln!("[{name}]   | {l}");
            }
        }
        Err(e) => eprintln!("xtask: [{name}] the diagnostic boot failed too: {e}"),
    }
}

/// The whole guest's backstop; each test has its own limit in the guest, and a silent
/// guest is killed sooner (the idle limit).
fn boot_limit(tests: usize) -> Duration {
    Duration::from_secs(600) + (TEST_LIMIT + Duration::from_secs(120)) * tests as u32
}

/// `--repeat N`: runs the tests N times, each time from fresh boots, and prints per test how
/// often it passed and why it failed. Exit code 1 when any run failed.
pub fn repeat(lab: &Lab, lunkit: &Path, tests: &[VmTest], times: usize) -> Result<u8> {
    let mut per_test: BTreeMap<String, Vec<Outcome>> = BTreeMap::new();
    let mut lab_secs = Vec::new();
    for r in 1..=times {
        eprintln!("xtask: repeat {r} of {times}");
        let run = run_suites(lab, lunkit, tests)?;
        run.print();
        lab_secs.extend(run.lab_secs);
        for o in run.outcomes {
            per_test.entry(o.key.clone()).or_default().push(o);
        }
    }
    let width = tests.iter().map(|t| t.key.len()).max().unwrap_or(4).max(4);
    println!(
        "xtask test: flake report, {times} run{} of {} VM test{} (each run from a fresh boot):",
        if times == 1 { "" } else { "s" },
        tests.len(),
        if tests.len() == 1 { "" } else { "s" }
    );
    println!("  {:<width$}  passes  failure reasons (first line)", "test");
    let (mut passed, mut failed) = (0, 0);
    for t in tests {
        let outcomes = per_test.get(&t.key).map(Vec::as_slice).unwrap_or_default();
        let ok = outcomes.iter().filter(|o| o.passed()).count();
        passed += ok;
        failed += times - ok;
        let mut reasons: Vec<(String, usize)> = Vec::new();
        for o in outcomes.iter().filter(|o| !o.passed()) {
            let why = format!(
                "{}: {}",
                o.label(),
                o.reason.as_deref().unwrap_or("no reason reported")
            );
            match reasons.iter_mut().find(|(r, _)| *r == why) {
                Some((_, n)) => *n += 1,
                None => reasons.push((why, 1)),
            }
        }
        let reasons: Vec<String> = reasons
            .into_iter()
            .map(|(r, n)| if n == 1 { r } else { format!("{n}x {r}") })
            .collect();
        println!(
            "  {:<width$}  {:>6}  {}",
            t.key,
            format!("{ok}/{times}"),
            reasons.join(" | ")
        );
    }
    if let Some(med) = median(&lab_secs) {
        println!("xtask test: lab check+reset after each test: median {med:.1} s");
    }
    println!("vm: {passed} passed, {failed} failed");
    Ok(if failed == 0 { 0 } else { 1 })
}

fn median(v: &[f64]) -> Option<f64> {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s.get(s.len() / 2).copied()
}

fn max(v: &[f64]) -> Option<f64> {
    v.iter().copied().max_by(f64::total_cmp)
}

fn minutes(d: Duration) -> String {
    let s = d.as_secs();
    format!("{}m{:02}s", s / 60, s % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_round_trip() {
        let lines = [
            Line::Booted { uptime: 21.5 },
            Line::Start {
                key: "vm_dm::a_b".into(),
            },
            Line::Result {
                key: "vm_dm::a_b".into(),
                status: Status::Leaked,
                secs: 12.5,
            },
            Line::Reason {
                key: "vm_dm::a_b".into(),
                text: "LEAK: multipathd pid 412 running; dm devices mpatha (dm-0)".into(),
            },
            Line::Lab {
                key: "vm_dm::a_b".into(),
                secs: 1.25,
                clean: false,
            },
            Line::Stop {
                why: "lab not clean after vm_dm::a_b".into(),
            },
        ];
        for l in lines {
            assert_eq!(Line::parse(&l.to_string()), Some(l.clone()), "{l}");
        }
        assert_eq!(Line::parse("test result: ok. 1 passed"), None);
        assert_eq!(Line::parse("xtask-vm-test: RESULT k maybe 1.0"), None);
    }

    #[test]
    fn reason_keeps_the_first_line_only() {
        let l = Line::Reason {
            key: "k::t".into(),
            text: "assertion failed: x\nmore".into(),
        };
        assert_eq!(
            l.to_string(),
            "xtask-vm-test: REASON k::t assertion failed: x"
        );
    }

    #[test]
    fn parses_libtest_lists() {
        let out = "a_test: test\nother: test\nbench_x: benchmark\n\n2 tests, 1 benchmark\n";
        let t = parse_list("vm_x", Path::new("/t/vm_x-1"), out);
        let keys: Vec<&str> = t.iter().map(|t| t.key.as_str()).collect();
        assert_eq!(keys, ["vm_x::a_test", "vm_x::other"]);
        assert_eq!(t[0].name, "a_test");
    }

    #[test]
    fn only_the_auth_binary_boots_the_auth_kernel() {
        let t = |key: &str| VmTest {
            key: key.into(),
            bin: "/t/x".into(),
            name: key.split("::").nth(1).unwrap_or("").into(),
        };
        assert_eq!(
            kernel_for(&t("vm_nvme_auth::a_test")),
            Some(labkernel::LABEL)
        );
        assert_eq!(kernel_for(&t("vm_nvme::a_test")), None);
        assert_eq!(kernel_for(&t("vm_nvme_auth_x::a_test")), None);
    }

    #[test]
    fn plans_round_trip() {
        let tests = vec![VmTest {
            key: "vm_x::a".into(),
            bin: PathBuf::from("/w/target/debug/deps/vm_x-1"),
            name: "a".into(),
        }];
        assert_eq!(VmTest::parse_plan(&VmTest::plan(&tests)).unwrap(), tests);
        assert!(VmTest::parse_plan("just one field\n").is_err());
    }
}

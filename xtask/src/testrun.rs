//! `xtask guest run-tests`: the guest side of the VM test runner. It runs each planned test
//! alone, checks the lab against the boot's baseline after it, resets the lab, and checks
//! again; when the reset cannot clean, it stops so the host can boot a fresh guest for the
//! tests not yet run (vmtests.rs). It reports in the fixed lines of [`crate::vmtests::Line`].

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use lunkit_lab::{VM_ENV, diag};

use crate::labstate::{self, Snapshot};
use crate::overlay::Overlay;
use crate::process::{self, TeeOptions};
use crate::vmtests::{Line, Status, TEST_LIMIT, VmTest};
use crate::{Result, paths};

/// The writable overlays the tests and daemons change (the guest's root is read-only).
pub(crate) const OVERLAYS: &[&str] = &["/etc", "/var"];

/// Runs the tests of the plan file in order; exit code 0 when every one ran and passed.
pub fn run_tests(lunkit: &Path, plan: &Path) -> Result<u8> {
    let text = std::fs::read_to_string(plan)
        .map_err(|e| format!("cannot read the test plan {}: {e}", plan.display()))?;
    let tests = VmTest::parse_plan(&text)?;
    let uptime = std::fs::read_to_string("/proc/uptime")
        .ok()
        .and_then(|u| u.split_whitespace().next()?.parse::<f64>().ok())
        .unwrap_or(0.0);
    println!("{}", Line::Booted { uptime });
    crate::kmsg::watch();
    let overlays = Overlay::baselines(OVERLAYS)?;
    let base = Snapshot::take();
    println!("xtask guest: lab baseline: {}", base.summary());
    let mut all_passed = true;
    for (i, test) in tests.iter().enumerate() {
        let (status, checked_in) = run_checked(lunkit, test, &base);
        all_passed &= status == Status::Passed;
        let t0 = Instant::now();
        reset(&base, &overlays);
        let reset_in = t0.elapsed();
        let left = still_dirty(&base, &overlays);
        let clean = left.is_empty();
        println!(
            "xtask guest: lab check {:.2} s, reset {:.2} s, check again {:.2} s",
            checked_in.as_secs_f64(),
            reset_in.as_secs_f64(),
            t0.elapsed().saturating_sub(reset_in).as_secs_f64()
        );
        println!(
            "{}",
            Line::Lab {
                key: test.key.clone(),
                secs: (checked_in + t0.elapsed()).as_secs_f64(),
                clean,
            }
        );
        if !clean {
            println!(
                "xtask guest: the reset after {} left the lab unclean: {}",
                test.key,
                left.join("; ")
            );
            println!(
                "{}",
                diag::report(&format!("unclean lab after {}", test.key))
            );
            let not_run: Vec<&str> = tests[i + 1..].iter().map(|t| t.key.as_str()).collect();
            println!(
                "xtask guest: not run in this boot, left for a fresh one: {}",
                if not_run.is_empty() {
                    "none".to_owned()
                } else {
                    not_run.join(", ")
                }
            );
            println!(
                "{}",
                Line::Stop {
                    why: format!("lab not clean after {}", test.key),
                }
            );
            return Ok(1);
        }
    }
    Ok(if all_passed { 0 } else { 1 })
}

/// Runs one test, then checks the lab for leaks; prints its START, RESULT and REASON lines.
/// Returns its status and how long the leak check took (the lab's share of the time).
fn run_checked(lunkit: &Path, test: &VmTest, base: &Snapshot) -> (Status, Duration) {
    println!(
        "{}",
        Line::Start {
            key: test.key.clone()
        }
    );
    let t0 = Instant::now();
    let ran = run_one(lunkit, test);
    let secs = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let leaks = labstate::check(base);
    let checked_in = t1.elapsed();
    let (status, reason) = match (ran, leaks.is_empty()) {
        (Ok(()), true) => (Status::Passed, None),
        (Ok(()), false) => (Status::Leaked, Some(format!("LEAK: {}", leaks.join("; ")))),
        (Err(why), _) => (Status::Failed, Some(why)),
    };
    if !leaks.is_empty() {
        println!("LEAK after {}: {}", test.key, leaks.join("; "));
    }
    if status != Status::Passed {
        println!(
            "{}",
            diag::report(&format!("after {} {status} and its teardown", test.key))
        );
    }
    println!(
        "{}",
        Line::Result {
            key: test.key.clone(),
            status,
            secs,
        }
    );
    if let Some(reason) = reason {
        println!(
            "{}",
            Line::Reason {
                key: test.key.clone(),
                text: reason,
            }
        );
    }
    (status, checked_in)
}

/// Runs the test alone in its binary; `Err` carries the first line of why it failed.
fn run_one(lunkit: &Path, test: &VmTest) -> Result<(), String> {
    let mut cmd = Command::new(&test.bin);
    cmd.args([
        "--ignored",
        "--exact",
        &test.name,
        "--test-threads=1",
        "--nocapture",
    ])
    .env(VM_ENV, "1")
    .env("LUNKIT_BIN", lunkit)
    // The CSI plugin is built beside it (`cargo build -p lunkit-csi`).
    .env("LUNKIT_CSI_BIN", lunkit.with_file_name("lunkit-csi"))
    // The plugin's image, in podman's store beside (`cargo xtask image`), and its name there.
    .env("LUNKIT_IMAGE_STORE", crate::image::store_dir())
    .env("LUNKIT_IMAGE", crate::image::LAB_TAG)
    // cargo runs tests from the package root; do the same.
    .current_dir(paths::root());
    let tee = process::tee(
        &mut cmd,
        &TeeOptions {
            timeout: Some(TEST_LIMIT),
            merge_stderr: true,
            stacks_on_kill: true,
            ..TeeOptions::default()
        },
    )
    .map_err(|e| e.to_string())?;
    if let Some(why) = tee.killed {
        return Err(format!("killed: it {why}"));
    }
    let ran_one = tee
        .lines
        .iter()
        .any(|l| l.starts_with("test result: ok. 1 passed;"));
    match tee.status {
        Some(s) if s.success() && ran_one => Ok(()),
        Some(s) if s.success() => Err("libtest did not run the test (is the name right?)".into()),
        status => Err(failure_reason(&tee.lines).unwrap_or_else(|| match status {
            Some(s) => format!("the test binary ended with {s}"),
            None => "the test binary was not reaped".to_owned(),
        })),
    }
}

/// The panic message's first line from a libtest run's output: the line after
/// `thread 'NAME' (TID) panicked at FILE:LINE:COL:` (the thread id since Rust 1.88 or so).
pub fn failure_reason(lines: &[String]) -> Option<String> {
    let at = lines
        .iter()
        .position(|l| l.starts_with("thread '") && l.contains(" panicked at "))?;
    let head = &lines[at];
    // Before Rust 1.73 the message was on the same line: `panicked at 'MSG', FILE`.
    if !head.trim_end().ends_with(':') {
        return Some(head.trim().to_owned());
    }
    lines[at + 1..]
        .iter()
        .map(|l| l.trim())
        .find(|l| !l.is_empty())
        .map(str::to_owned)
}

/// Resets the lab and the overlays and logs what it did.
pub(crate) fn reset(base: &Snapshot, overlays: &[Overlay]) {
    let mut actions = labstate::reset(base);
    for o in overlays {
        let changes = o.changes();
        if changes.is_empty() {
            continue;
        }
        let errors = o.restore();
        actions.push(format!(
            "restored {} ({})",
            o.merged.display(),
            Overlay::describe(&changes).join(", ")
        ));
        actions.extend(errors);
    }
    for a in &actions {
        println!("xtask guest: reset: {a}");
    }
}

/// What is still not as at the baseline, lab and overlays (empty when clean).
pub(crate) fn still_dirty(base: &Snapshot, overlays: &[Overlay]) -> Vec<String> {
    let mut left = labstate::check(base);
    for o in overlays {
        let changes = o.changes();
        if !changes.is_empty() {
            left.push(format!(
                "{} differs from the baseline: {}",
                o.merged.display(),
                Overlay::describe(&changes).join(", ")
            ));
        }
    }
    left
}

#[cfg(test)]
mod tests {
    use super::failure_reason;

    fn lines(text: &str) -> Vec<String> {
        text.lines().map(str::to_owned).collect()
    }

    #[test]
    fn finds_the_panic_message() {
        let out = lines(
            "running 1 test\n\
             thread 'remove' (511) panicked at tests/vm_dm.rs:230:5:\n\
             assertion `left == right` failed: via multipathd\n  left: true\n\
             ==== lab diagnostics: panic in thread 'remove' ====\n\
             test remove ... FAILED",
        );
        assert_eq!(
            failure_reason(&out).as_deref(),
            Some("assertion `left == right` failed: via multipathd")
        );
        let old = lines("thread 'x' panicked at 'boom', tests/a.rs:1:1");
        assert_eq!(
            failure_reason(&old).as_deref(),
            Some("thread 'x' panicked at 'boom', tests/a.rs:1:1")
        );
        assert_eq!(failure_reason(&lines("test x ... ok")), None);
    }
}

//! `lunkit doctor`: what earlier attaches and detaches left on the node, and with `--fix`,
//! its cleanup.

use clap::Args;
use lunkit::Root;
use lunkit::ops::doctor::{self, DoctorOptions, Examination, FixOptions, FixOutcome, Kind};

use crate::json;

/// `lunkit doctor` (read only unless `--fix` is given).
#[derive(Args)]
pub struct Doctor {
    /// Print the JSON document (schema version 1) instead of text.
    #[arg(long)]
    pub json: bool,
    /// Skip the in-use check on each finding's devices (faster; in_use is then unknown, and
    /// idle sessions and LUNs gone, which only opening the devices tells, are not looked
    /// for). A fix checks again before it writes, whatever this says.
    #[arg(long)]
    pub no_use_check: bool,
    /// How long a state the kernel may still recover from (a SCSI device blocked, an NVMe
    /// controller not live) must have lasted before it is a finding, in seconds; until then
    /// it is listed as pending. Doctor remembers when it first saw each such state (in the
    /// lock directory, on /run: forgotten at a reboot). 0: at once.
    #[arg(long, value_name = "SECS", default_value_t = 120)]
    pub grace: u64,
    /// Clean up what is safe by the detach rules: with no KIND, the kinds scsi-device-down
    /// (offline devices; transport-offline ones only when named), remapped-path,
    /// map-without-paths, lun-gone, stale-name-record and stale-attach-mark; with KINDs
    /// (comma-separated or repeated), those only. scsi-device-blocked, map-paths-down,
    /// idle-session, nvme-controller-down, idle-subsystem and remapped-address are
    /// cleaned up only when named; idle-session and remapped-address are never cleaned up
    /// (the fix says what to do). Without --fix nothing is changed.
    #[arg(long, value_name = "KIND", num_args = 0.., value_delimiter = ',')]
    pub fix: Option<Vec<String>>,
}

/// Runs it; the exit code: 0 nothing found (or, with `--fix`, everything found cleaned up),
/// 1 findings left, none in use, 4 a finding left in use or not checkable, 2 a kind not
/// known, 2 or 3 when the node could not be read.
pub fn run(root: &Root, cmd: Doctor) -> u8 {
    match examine_and_fix(root, &cmd) {
        Ok((found, fixes)) => {
            if cmd.json {
                let doc = json::doctor::Doctor::new(&found, fixes.as_ref());
                json::print(&doc, json::Layout::Pretty);
            } else {
                out!("{}", render(&found, fixes.as_ref()));
            }
            exit(&found, fixes.as_ref())
        }
        Err(e) => {
            errln!("lunkit: {}", e);
            crate::exit_code(&e)
        }
    }
}

fn examine_and_fix(
    root: &Root,
    cmd: &Doctor,
) -> lunkit::Result<(Examination, Option<doctor::Fixes>)> {
    // Parsed before the node is read: a misspelt kind changes nothing.
    let kinds = match &cmd.fix {
        Some(names) => Some(
            names
                .iter()
                .map(|n| n.parse())
                .collect::<lunkit::Result<Vec<Kind>>>()?,
        ),
        None => None,
    };
    let mut opts = DoctorOptions::new(root);
    opts.check_use = !cmd.no_use_check;
    opts.grace = std::time::Duration::from_secs(cmd.grace);
    let found = doctor::examine(root, &opts)?;
    let Some(kinds) = kinds else {
        return Ok((found, None));
    };
    let mut fix = FixOptions::new(root);
    fix.kinds = kinds;
    let fixes = doctor::fix(root, &found, &fix)?;
    Ok((found, Some(fixes)))
}

/// 4 when a finding left is in use, 1 when findings are left, else 0. Without a fix, every
/// finding is left.
fn exit(found: &Examination, fixes: Option<&doctor::Fixes>) -> u8 {
    let (left, in_use) = match fixes {
        None => (
            found.findings.len(),
            found.findings.iter().filter(|f| f.in_use()).count(),
        ),
        // A finding left for another reason (not selected, changed, failed) that the
        // examination found in use counts as in use too: a script cleans only on 1.
        Some(x) => (
            x.outcomes.iter().filter(|o| o.is_left()).count(),
            x.outcomes
                .iter()
                .zip(&found.findings)
                .filter(|(o, f)| matches!(o, FixOutcome::InUse(_)) || (o.is_left() && f.in_use()))
                .count(),
        ),
    };
    if in_use > 0 {
        crate::exit::BUSY
    } else if left > 0 {
        crate::exit::OTHER
    } else {
        0
    }
}

/// One line per finding, then who uses it when something does, then what the fix did; then
/// the pending states, a line each.
fn render(e: &Examination, fixes: Option<&doctor::Fixes>) -> String {
    let mut out = String::new();
    if e.findings.is_empty() {
        out.push_str("nothing found\n");
    }
    for (i, f) in e.findings.iter().enumerate() {
        out.push_str(&format!(
            "{:<22} {}: {}\n",
            f.kind,
            f.objects.join(" "),
            f.why
        ));
        match &f.usage {
            Some(u) if f.in_use() => out.push_str(&format!("{:<22} in use: {u}\n", "")),
            Some(_) => out.push_str(&format!("{:<22} not in use\n", "")),
            None => {}
        }
        if let Some(o) = fixes.and_then(|x| x.outcomes.get(i)) {
            out.push_str(&format!("{:<22} {o}\n", ""));
        }
    }
    for f in &e.pending {
        out.push_str(&format!(
            "pending ({} s grace)   {} {}: {}\n",
            e.grace.as_secs(),
            f.kind,
            f.objects.join(" "),
            f.why
        ));
    }
    out
}

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
    /// Clean up what is safe by the detach rules: with no KIND, the kinds scsi-device-down
    /// (offline devices; transport-offline ones only when named), remapped-path,
    /// map-without-paths and lun-gone; with KINDs (comma-separated or repeated), those only.
    /// map-paths-down, idle-session and nvme-controller-down are cleaned up only when named.
    /// Without --fix nothing is changed.
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
                print!("{}", render(&found, fixes.as_ref()));
            }
            exit(&found, fixes.as_ref())
        }
        Err(e) => {
            eprintln!("lunkit: {e}");
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
    let mut opts = DoctorOptions::default();
    opts.check_use = !cmd.no_use_check;
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

/// One line per finding, then who uses it when something does, then what the fix did.
fn render(e: &Examination, fixes: Option<&doctor::Fixes>) -> String {
    if e.findings.is_empty() {
        return "nothing found\n".into();
    }
    let mut out = String::new();
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
    out
}

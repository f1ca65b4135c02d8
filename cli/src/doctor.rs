//! `lunkit doctor`: what earlier attaches and detaches left on the node.

use clap::Args;
use lunkit::Root;
use lunkit::ops::doctor::{self, DoctorOptions, Examination};

use crate::json;

/// `lunkit doctor` (read only: nothing is changed).
#[derive(Args)]
pub struct Doctor {
    /// Print the JSON document (schema version 1) instead of text.
    #[arg(long)]
    pub json: bool,
    /// Skip the in-use check on each finding's devices (faster; in_use is then unknown).
    #[arg(long)]
    pub no_use_check: bool,
}

/// Runs it; the exit code: 0 nothing found, 1 findings (none in use), 4 a finding in use or
/// not checkable, 2 or 3 when the node could not be read.
pub fn run(root: &Root, cmd: Doctor) -> u8 {
    let opts = {
        let mut o = DoctorOptions::default();
        o.check_use = !cmd.no_use_check;
        o
    };
    let found = match doctor::examine(root, &opts) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("lunkit: {e}");
            return crate::exit_code(&e);
        }
    };
    if cmd.json {
        json::print(&json::doctor::Doctor::from(&found), json::Layout::Pretty);
    } else {
        print!("{}", render(&found));
    }
    if found.findings.iter().any(|f| f.in_use()) {
        crate::exit::BUSY
    } else if found.findings.is_empty() {
        0
    } else {
        crate::exit::OTHER
    }
}

/// One line per finding, then who uses it when something does.
fn render(e: &Examination) -> String {
    if e.findings.is_empty() {
        return "nothing found\n".into();
    }
    let mut out = String::new();
    for f in &e.findings {
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
    }
    out
}

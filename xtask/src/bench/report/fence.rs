//! The fencing rows' summary: what `fencing: scsi-pr` adds to a stage and an unstage, against
//! the stage and the unstage alone and against the kernel's own commands.

use std::fmt::Write as _;

use super::{lib_median, median, time};
use crate::bench::model::Measurement;

/// The table, or nothing when the fencing rows did not run.
pub(super) fn section(all: &[Measurement]) -> String {
    // Library times: a resident line's time adds the batch's own reading and printing.
    let read = lib_median(all, "fence-stage.read");
    let mut out = String::new();
    for (dir, alone_method) in [("stage", "attach"), ("unstage", "detach")] {
        let row = format!("fence-{dir}");
        let alone = lib_median(all, &format!("{row}.{alone_method}"));
        let sent = lib_median(all, &format!("{row}.lunkit"));
        let floor = median(all, &format!("{row}.floor"));
        let Some((alone, sent)) = alone.zip(sent) else {
            continue;
        };
        let added = sent + read.unwrap_or(0.0);
        let t = |v: Option<f64>| v.map_or_else(|| "–".to_owned(), time);
        let _ = writeln!(
            out,
            "| {dir} | {} | {} | {} | {} | {} | {:.2}× | {} | {:.0}% |",
            time(alone),
            time(sent),
            t(floor),
            floor.map_or_else(|| "–".to_owned(), |f| format!("{:.2}×", sent / f)),
            t(read),
            added / alone,
            time(added),
            100.0 * added / (alone + added),
        );
    }
    if out.is_empty() {
        return out;
    }
    format!(
        "\nFencing (issue 56), medians of library time (`elapsed_us`): the reservation commands \
         lunkit sends, the kernel's ioctls for the same commands, the reading of the reservation the plugin adds (one \
         `pr show` of a path, at stage and again at unstage); what they add against the stage \
         or unstage alone (the unstage releases inside the detach, after its one in-use \
         check):\n\n\
         | | alone | commands, lunkit | commands, kernel floor | lunkit / floor | reading | \
         added / alone | added | share of the fenced whole |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|\n{out}"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::model::Run;

    fn m(id: &str, wall_us: u64, lib_us: Option<u64>, check_us: Option<u64>) -> Measurement {
        let (row, method) = id.split_once('.').unwrap();
        let mut m = Measurement::new(row, method, method, "");
        m.runs = vec![
            Run {
                wall_us,
                lib_us,
                check_us,
                ..Run::default()
            };
            3
        ];
        m
    }

    #[test]
    fn fencing_is_added_to_the_stage_and_unstage_alone() {
        let all = vec![
            m("fence-stage.attach", 300_000, Some(200_000), None),
            m("fence-stage.lunkit", 40_000, Some(30_000), None),
            m("fence-stage.read", 14_000, Some(10_000), None),
            m("fence-stage.floor", 20_000, None, None),
            m("fence-unstage.detach", 250_000, Some(100_000), Some(40_000)),
            m("fence-unstage.lunkit", 60_000, Some(50_000), None),
            m("fence-unstage.floor", 40_000, None, None),
        ];
        let s = section(&all);
        // Stage: 30 ms of commands and 10 ms of reading on a 200 ms attach.
        assert!(
            s.contains(
                "| stage | 200.0 ms | 30.0 ms | 20.0 ms | 1.50× | 10.0 ms | 0.20× | 40.0 ms | 17% |"
            ),
            "{s}"
        );
        // Unstage: 50 + 10 ms on a 100 ms detach.
        assert!(
            s.contains(
                "| unstage | 100.0 ms | 50.0 ms | 40.0 ms | 1.25× | 10.0 ms | 0.60× | 60.0 ms | 38% |"
            ),
            "{s}"
        );
        assert!(section(&all[..0]).is_empty());
    }
}

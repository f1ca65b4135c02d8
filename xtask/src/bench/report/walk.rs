//! The walk rows' targets (issue 57): a detach on a node of 1,000 processes within the floor
//! after a plain in-use reading, and faster than the shell sequence at every node size.

use super::{Target, at_most, faster_each_round, lib_median, median};
use crate::bench::model::Measurement;

pub(super) fn targets(all: &[Measurement]) -> Vec<Target> {
    let mut t = vec![at_most(
        "walk1000-plain-checked",
        "node of 1,000 processes, resident: a detach's library time within 1.0× the kernel \
         floor after a plain in-use reading",
        lib_median(all, "walk1000.resident"),
        median(all, "walk1000.plain-checked"),
        1.0,
        "plain-checked floor",
    )];
    for (n, id) in [
        (100, "walk100-vs-shell"),
        (300, "walk300-vs-shell"),
        (1000, "walk1000-vs-shell"),
    ] {
        t.push(faster_every_round(all, n, id));
    }
    t
}

/// The resident detach's library time below the shell sequence's time in every round of
/// the node of `n` processes.
fn faster_every_round(all: &[Measurement], n: usize, id: &'static str) -> Target {
    let text = format!(
        "node of {n} processes: a detach's library time (resident) below the shell \
         sequence's in every round"
    );
    let (lunkit, shell) = (format!("walk{n}.resident"), format!("walk{n}.shell"));
    faster_each_round(all, id, text, &lunkit, &shell)
}

#[cfg(test)]
mod tests {
    use super::super::Verdict;
    use super::*;
    use crate::bench::model::Run;

    fn m(id: &str, walls: &[u64], lib: bool) -> Measurement {
        let (row, method) = id.split_once('.').unwrap();
        let mut m = Measurement::new(row, method, method, "");
        m.runs = walls
            .iter()
            .map(|&w| Run {
                wall_us: w,
                lib_us: lib.then_some(w),
                ..Run::default()
            })
            .collect();
        m
    }

    #[test]
    fn a_node_of_a_thousand_is_held_to_its_plain_reading_and_the_shell_round_by_round() {
        let all = vec![
            m("walk1000.resident", &[900, 1_100, 1_000], true),
            m("walk1000.plain-checked", &[1_000, 1_000, 1_000], false),
            m("walk1000.shell", &[2_000, 1_050, 3_000], false),
        ];
        let t = targets(&all);
        assert_eq!(t[0].verdict, Verdict::Met, "{}", t[0].detail);
        let thousand = t.iter().find(|t| t.id == "walk1000-vs-shell").unwrap();
        // Round 2: 1.1 ms against the shell's 1.05 ms.
        assert_eq!(thousand.verdict, Verdict::Missed);
        assert_eq!(thousand.detail, "faster in 2 of 3 rounds");
        let hundred = t.iter().find(|t| t.id == "walk100-vs-shell").unwrap();
        assert_eq!(hundred.verdict, Verdict::NotAvailable);
    }
}

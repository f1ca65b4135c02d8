//! The fencing rows (issue 56): what the plugin's `fencing: scsi-pr` adds to a stage and an
//! unstage of a 2-path volume, against the stage and the unstage alone, udevd and
//! multipathd running.
//!
//! A fenced stage is the volume's attach, then this node's key registered on every path
//! and a *Write Exclusive, Registrants Only* reservation taken through the first, after a
//! READ RESERVATION that says whether to reserve, find it held or preempt. A fenced unstage
//! is the volume's detach with a step inside it (`ops::detach_before_removal`), after its
//! in-use check and its map's flush: the reservation read, released through every running
//! path (only the holding path's RELEASE ends it) and the key unregistered on every path.
//!
//! Every round attaches the volume (row `fence-stage`, method `attach`), then fences and
//! unfences it twice, once with lunkit and once with the kernel's ioctls (in turn which goes
//! first), reads the reservation once with `lunkit pr show` between lunkit's two, and
//! detaches it (`fence-unstage`, `detach`). Every lunkit call is a line to one resident
//! `lunkit batch`, as the plugin calls the library in its own process. Each step's outcome
//! is read back with `lunkit pr show` outside the measured time: the key registered and
//! holding after a stage, no key and no reservation after an unstage.

use std::fs;
use std::path::Path;
use std::time::Instant;

use lunkit_lab::iscsi::Session;
use lunkit_lab::multipath::{self, Map};

use super::{
    Ctx, NO_RESIDENT, RESIDENT_NOTE, node_cleanup, node_map, node_present, on_mapped_lab, progress,
    run_lunkit, say, settle, start_resident, warm_cpu,
};
use crate::Result;
use crate::bench::model::{Measurement, Run, State};
use crate::bench::proc;
use crate::bench::resident::Resident;
use crate::bench::sys::{self, PR_WRITE_EXCLUSIVE_REG_ONLY, Pr};

/// The LUN the rows fence (LUN 0 stays attached and mapped, a node already using the target).
const FENCE_LUN: u32 = 6;
/// The bench's key ("lunkit", 0, 1): never a node's, so a key left by a failed run is known.
const KEY: u64 = 0x6c75_6e6b_6974_0001;
/// Where LIO keeps APTPL metadata: the kernel's REGISTER asks for APTPL, and LIO fails the
/// command when it cannot write the file there.
const APTPL_DIRS: [&str; 2] = ["/etc/target/pr", "/var/target/pr"];

/// Who issues the reservation commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Way {
    Lunkit,
    Floor,
}

/// The rows' measurements, in the order they are recorded.
struct Rows {
    attach: Measurement,
    stage: Measurement,
    read: Measurement,
    stage_floor: Measurement,
    detach: Measurement,
    unstage: Measurement,
    unstage_floor: Measurement,
}

impl Rows {
    fn new(lun: u32) -> Rows {
        let m = |row: &str, method: &str, label: &str, note: String| {
            Measurement::new(&format!("fence-{row}"), method, label, &note)
        };
        let line = |what: &str| format!("{what} Each command a line to {RESIDENT_NOTE}");
        Rows {
            attach: m(
                "stage",
                "attach",
                "the stage alone: lunkit attach, both sessions, resident",
                line(&format!(
                    "`lunkit attach --iscsi-target IQN --lun {lun} --min-paths 2 --wait-map \
                     --json`: the device part of a block volume's stage."
                )),
            ),
            stage: m(
                "stage",
                "lunkit",
                "lunkit pr: register on each path, reserve",
                line(
                    "`lunkit pr register --ignore-existing --json` on each path and `lunkit pr \
                     reserve --type we-ro --json` through the first: the commands a fenced \
                     stage sends, their times summed.",
                ),
            ),
            read: m(
                "stage",
                "read",
                "lunkit pr show of one path",
                line(
                    "`lunkit pr show DISK --json`: one path's keys and reservation, two \
                     PERSISTENT RESERVE IN commands where the plugin's READ RESERVATION is one \
                     (it reads once at stage and once at unstage).",
                ),
            ),
            stage_floor: m(
                "stage",
                "floor",
                "kernel floor: the same commands by ioctl",
                "`IOC_PR_REGISTER` (`PR_FL_IGNORE_KEY`) on each path and `IOC_PR_RESERVE` \
                 through the first, from the benchmark process, each path opened as lunkit \
                 opens it."
                    .to_owned(),
            ),
            detach: m(
                "unstage",
                "detach",
                "the unstage alone: lunkit detach, resident",
                line("`lunkit detach --wwid W --json`."),
            ),
            unstage: m(
                "unstage",
                "lunkit",
                "lunkit pr: release and unregister on each path",
                line(
                    "`lunkit pr release --type we-ro --json` and `lunkit pr unregister --json` \
                     on each path: the commands a fenced unstage sends, their times summed.",
                ),
            ),
            unstage_floor: m(
                "unstage",
                "floor",
                "kernel floor: the same commands by ioctl",
                "`IOC_PR_RELEASE` and `IOC_PR_REGISTER` to no key on each path, from the \
                 benchmark process."
                    .to_owned(),
            ),
        }
    }

    fn all_mut(&mut self) -> [&mut Measurement; 7] {
        [
            &mut self.attach,
            &mut self.stage,
            &mut self.read,
            &mut self.stage_floor,
            &mut self.detach,
            &mut self.unstage,
            &mut self.unstage_floor,
        ]
    }
}

/// The group: the lab with multipathd, the rows, and the lab taken down whatever happened.
pub(super) fn phase(ctx: &mut Ctx) -> Result<()> {
    let made: Vec<&str> = APTPL_DIRS
        .into_iter()
        .filter(|d| !Path::new(d).exists())
        .collect();
    for d in &made {
        fs::create_dir_all(d)?;
    }
    let result = on_mapped_lab(ctx, "the fencing rows", |ctx, lab| {
        let mut resident = start_resident(ctx)?.ok_or(NO_RESIDENT)?;
        rows(ctx, &lab.sessions, &mut resident)
    });
    for d in made {
        let _ = fs::remove_dir_all(d);
    }
    result
}

/// Every round, recorded at the end (with the failure, when one stopped them).
fn rows(ctx: &mut Ctx, sessions: &[Session], resident: &mut Resident) -> Result<()> {
    let mut rows = Rows::new(FENCE_LUN);
    node_cleanup(ctx, sessions, FENCE_LUN, node_map(sessions, FENCE_LUN))?;
    let mut outcome = Ok(());
    for round in 0..=ctx.runs {
        if let Err(e) = one_round(ctx, sessions, resident, &mut rows, round) {
            say(&format!("fence round {round} FAILED: {e}"));
            clear_left(sessions);
            let _ = node_cleanup(ctx, sessions, FENCE_LUN, node_map(sessions, FENCE_LUN));
            outcome = Err(format!("round {round}: {e}"));
            break;
        }
    }
    for m in rows.all_mut() {
        if let Err(e) = &outcome {
            m.state = State::Failed(e.clone());
        }
        ctx.rec.record(m)?;
    }
    outcome.map_err(Into::into)
}

/// One round: attach, fence and unfence both ways, read once, detach.
fn one_round(
    ctx: &mut Ctx,
    sessions: &[Session],
    resident: &mut Resident,
    rows: &mut Rows,
    round: usize,
) -> Result<()> {
    let keep = |m: &mut Measurement, run: Run| {
        progress(m, round, ctx.runs, &run);
        if round > 0 {
            m.runs.push(run);
        }
    };
    settle(ctx)?;
    warm_cpu();
    let run = lunkit_run(ctx, resident, &attach_args(sessions), "lunkit attach")?;
    keep(&mut rows.attach, run);
    let map = node_map(sessions, FENCE_LUN)?.ok_or("the attach left no disk")?;
    let paths: Vec<String> = map.paths.iter().map(|p| format!("/dev/{p}")).collect();
    settle(ctx)?;
    let ways = match round % 2 {
        0 => [Way::Lunkit, Way::Floor],
        _ => [Way::Floor, Way::Lunkit],
    };
    for way in ways {
        let (stage, unstage) = match way {
            Way::Lunkit => (&mut rows.stage, &mut rows.unstage),
            Way::Floor => (&mut rows.stage_floor, &mut rows.unstage_floor),
        };
        warm_cpu();
        keep(stage, fence(ctx, resident, &paths, way)?);
        if way == Way::Lunkit {
            warm_cpu();
            let run = lunkit_run(
                ctx,
                resident,
                &["pr", "show", &paths[0], "--json"],
                "pr show",
            )?;
            keep(&mut rows.read, run);
        }
        held(ctx, resident, &paths)?;
        warm_cpu();
        keep(unstage, unfence(ctx, resident, &paths, way)?);
        clean(ctx, resident, &map)?;
    }
    settle(ctx)?;
    warm_cpu();
    let wwid = map
        .uuid
        .strip_prefix("mpath-")
        .unwrap_or(&map.uuid)
        .to_owned();
    let args = ["detach", "--wwid", &wwid, "--timeout", "60", "--json"];
    let run = lunkit_run(ctx, resident, &args, "lunkit detach")?;
    keep(&mut rows.detach, run);
    settle(ctx)?;
    let map_left = multipath::maps().iter().any(|m| m.uuid == map.uuid);
    if map_left || !node_present(sessions, FENCE_LUN).0.is_empty() {
        return Err(format!("the detach left {wwid} or its paths on the node").into());
    }
    Ok(())
}

fn attach_args(sessions: &[Session]) -> Vec<String> {
    [
        "attach",
        "--iscsi-target",
        &sessions[0].target,
        "--lun",
        &FENCE_LUN.to_string(),
        "--min-paths",
        "2",
        "--wait-map",
        "--timeout",
        "60",
        "--json",
    ]
    .map(str::to_owned)
    .to_vec()
}

/// A resident lunkit line's run: its time, and its library time and in-use check when its
/// `--json` reports them.
fn lunkit_run(
    ctx: &Ctx,
    resident: &mut Resident,
    args: &[impl AsRef<str>],
    what: &str,
) -> Result<Run> {
    let args: Vec<&str> = args.iter().map(AsRef::as_ref).collect();
    let out = run_lunkit(ctx, Some(resident), &args, what)?;
    Ok(Run {
        wall_us: out.wall.as_micros() as u64,
        lib_us: proc::json_u64(&out.stdout, "elapsed_us"),
        check_us: proc::json_step_us(&out.stdout, "check-in-use"),
        steps: proc::json_steps(&out.stdout).unwrap_or_default(),
        ..Run::default()
    })
}

/// The stage's reservation commands on `paths`, the way `way` sends them: REGISTER AND
/// IGNORE EXISTING KEY through each, then RESERVE through the first.
fn fence(ctx: &Ctx, resident: &mut Resident, paths: &[String], way: Way) -> Result<Run> {
    let mut reqs: Vec<(&str, Pr)> = paths
        .iter()
        .map(|p| (p.as_str(), Pr::RegisterIgnore(KEY)))
        .collect();
    reqs.push((&paths[0], Pr::Reserve(KEY, PR_WRITE_EXCLUSIVE_REG_ONLY)));
    send(ctx, resident, &reqs, way)
}

/// The unstage's reservation commands on `paths`: RELEASE through each, then each
/// registration dropped.
fn unfence(ctx: &Ctx, resident: &mut Resident, paths: &[String], way: Way) -> Result<Run> {
    let reqs: Vec<(&str, Pr)> = paths
        .iter()
        .map(|p| (p.as_str(), Pr::Release(KEY, PR_WRITE_EXCLUSIVE_REG_ONLY)))
        .chain(paths.iter().map(|p| (p.as_str(), Pr::Unregister(KEY))))
        .collect();
    send(ctx, resident, &reqs, way)
}

/// The `lunkit pr` line that sends `req` to `path`.
fn line(path: &str, req: Pr) -> Vec<String> {
    let (command, more): (&str, &[&str]) = match req {
        Pr::RegisterIgnore(_) => ("register", &["--ignore-existing"]),
        Pr::Unregister(_) => ("unregister", &[]),
        Pr::Reserve(..) => ("reserve", &["--type", "we-ro"]),
        Pr::Release(..) => ("release", &["--type", "we-ro"]),
        Pr::Clear(_) => ("clear", &["--force"]),
    };
    let mut l: Vec<String> = ["pr", command]
        .into_iter()
        .chain(more.iter().copied())
        .map(str::to_owned)
        .collect();
    l.extend([
        "--key".to_owned(),
        format!("{KEY:#018x}"),
        path.to_owned(),
        "--json".to_owned(),
    ]);
    l
}

/// Sends `reqs` one after another, the way `way` says: as `lunkit pr` lines to the resident
/// process (their times and library times summed), or as the bench's own ioctls (timed as a
/// whole).
fn send(ctx: &Ctx, resident: &mut Resident, reqs: &[(&str, Pr)], way: Way) -> Result<Run> {
    let mut run = Run::default();
    match way {
        Way::Lunkit => {
            let mut lib_us = Some(0);
            for (path, req) in reqs {
                let l = line(path, *req);
                let one = lunkit_run(ctx, resident, &l, &l[..2].join(" "))?;
                run.wall_us += one.wall_us;
                lib_us = lib_us.zip(one.lib_us).map(|(a, b)| a + b);
            }
            run.lib_us = lib_us;
        }
        Way::Floor => {
            let t0 = Instant::now();
            for (path, req) in reqs {
                sys::pr(path, *req)?;
            }
            run.wall_us = t0.elapsed().as_micros() as u64;
        }
    }
    Ok(run)
}

/// The bench's key registered on every path and holding the reservation.
fn held(ctx: &Ctx, resident: &mut Resident, paths: &[String]) -> Result<()> {
    let key = format!("\"{KEY:#018x}\"");
    for p in paths {
        let out = run_lunkit(
            ctx,
            Some(&mut *resident),
            &["pr", "show", p, "--json"],
            "pr show",
        )?;
        let text = bare(&out.stdout);
        // READ KEYS lists every registration of the LUN (one per path here), READ
        // RESERVATION the holder's key.
        if text.matches(&key).count() != paths.len() + 1 || !text.contains("\"error\":null") {
            return Err(format!(
                "after the stage, {p} does not show key {key} registered and holding: {text}"
            )
            .into());
        }
    }
    Ok(())
}

/// No key registered and no reservation on any path of `map`.
fn clean(ctx: &Ctx, resident: &mut Resident, map: &Map) -> Result<()> {
    let dm = format!("/dev/{}", map.dm);
    let out = run_lunkit(
        ctx,
        Some(resident),
        &["pr", "show", &dm, "--json"],
        "pr show",
    )?;
    let text = bare(&out.stdout);
    let paths = text.matches("\"path\":").count();
    if paths != map.paths.len()
        || text.matches("\"keys\":[]").count() != paths
        || text.matches("\"reservation\":null").count() != paths
    {
        return Err(
            format!("after the unstage, {dm} still shows keys or a reservation: {text}").into(),
        );
    }
    Ok(())
}

/// After a failed round: whatever the bench's key left on the volume's paths, cleared.
fn clear_left(sessions: &[Session]) {
    for disk in node_present(sessions, FENCE_LUN).1 {
        let path = format!("/dev/{disk}");
        let _ = sys::pr(&path, Pr::RegisterIgnore(KEY));
        if let Err(e) = sys::pr(&path, Pr::Clear(KEY)) {
            say(&format!("  clearing the bench's key on {path}: {e}"));
        }
    }
}

/// A JSON document without its layout's whitespace.
fn bare(json: &str) -> String {
    json.split_whitespace().collect()
}

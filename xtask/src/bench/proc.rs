//! Running a measured program: wall time from spawn to reaped exit, its output, and its peak
//! RSS from `wait4`.

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use super::model::StepSpan;
use super::sys;
use crate::{Result, process};

/// What a measured program did.
#[derive(Debug)]
pub struct Outcome {
    pub wall: Duration,
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    pub rss_kib: u64,
}

impl Outcome {
    /// Fails with the command's stderr unless it exited 0.
    pub fn ok(self, what: &str) -> Result<Self> {
        if self.status.success() {
            Ok(self)
        } else {
            Err(format!("`{what}` failed ({}): {}", self.status, self.stderr.trim()).into())
        }
    }
}

/// Runs `cmd` with stdin closed; `keep_stdout` pipes stdout to us (otherwise /dev/null, for
/// tools whose large output we do not need). stderr is always captured.
pub fn timed(cmd: &mut Command, keep_stdout: bool) -> Result<Outcome> {
    run_timed(cmd, None, keep_stdout)
}

/// [`timed`] with `input` written to the program's stdin (then closed), and its stdout kept:
/// `lunkit batch` reads its commands there.
pub fn timed_with_input(cmd: &mut Command, input: &[u8]) -> Result<Outcome> {
    run_timed(cmd, Some(input), true)
}

fn run_timed(cmd: &mut Command, input: Option<&[u8]>, keep_stdout: bool) -> Result<Outcome> {
    cmd.stdin(match input {
        Some(_) => Stdio::piped(),
        None => Stdio::null(),
    })
    .stderr(Stdio::piped());
    cmd.stdout(if keep_stdout {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    let t0 = Instant::now();
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", process::describe(cmd)))?;
    if let (Some(input), Some(mut pipe)) = (input, child.stdin.take()) {
        // Closed when dropped, at the end of this block: the program sees its input end.
        pipe.write_all(input)?;
    }
    let mut err_pipe = child.stderr.take().expect("stderr is piped");
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err_pipe.read_to_string(&mut s);
        s
    });
    let mut stdout = String::new();
    if let Some(mut out) = child.stdout.take() {
        let _ = out.read_to_string(&mut stdout);
    }
    let (status, rss_kib) = sys::wait_rusage(&child)?;
    let wall = t0.elapsed();
    let stderr = err_reader.join().unwrap_or_default();
    Ok(Outcome {
        wall,
        status,
        stdout,
        stderr,
        rss_kib,
    })
}

/// Whether `lunkit SUB` exists: `lunkit SUB --help` exits 0. A lunkit without the subcommand
/// exits 2 with clap's "unrecognized subcommand"; that (or anything else) is the reason.
pub fn subcommand_available(lunkit: &Path, sub: &str) -> std::result::Result<(), String> {
    let out = Command::new(lunkit)
        .args([sub, "--help"])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", lunkit.display()))?;
    if out.status.success() {
        return Ok(());
    }
    let err = String::from_utf8_lossy(&out.stderr);
    let first = err.lines().next().unwrap_or("").trim();
    if out.status.code() == Some(2) && err.contains("unrecognized subcommand") {
        Err(format!("this lunkit has no `{sub}` subcommand ({first})"))
    } else {
        Err(format!(
            "`lunkit {sub} --help` failed ({}): {first}",
            out.status
        ))
    }
}

/// The last `"key": N` in a JSON text: for `scan` and `detach`, the top-level `elapsed_us`
/// (it comes last); for `resize`, whose keys serde_json sorts, the library's own
/// `result.elapsed_us`, which comes after the top-level one.
pub fn json_u64(text: &str, key: &str) -> Option<u64> {
    let pat = format!("\"{key}\":");
    number_at(&text[text.rfind(&pat)? + pat.len()..])
}

/// Every `"key": N` in a JSON text, in order, a `null` passed over: for lunkit scan, each
/// path's `write_start_us` or `ready_us` (a path never written or not found has `null`).
pub fn json_u64s(text: &str, key: &str) -> Vec<u64> {
    let pat = format!("\"{key}\":");
    text.match_indices(&pat)
        .filter_map(|(at, _)| number_at(&text[at + pat.len()..]))
        .collect()
}

/// Every `"key": "value"` in a JSON text, in order, compact or pretty-printed, a value that
/// is not a string passed over: for lunkit doctor, each finding's `kind` or `why`. Escapes
/// are kept as written.
pub fn json_strs(text: &str, key: &str) -> Vec<String> {
    let pat = format!("\"{key}\":");
    text.match_indices(&pat)
        .filter_map(|(at, _)| {
            let value = text[at + pat.len()..].trim_start().strip_prefix('"')?;
            let mut escaped = false;
            let end = value.find(|c| {
                let end = c == '"' && !escaped;
                escaped = c == '\\' && !escaped;
                end
            })?;
            Some(value[..end].to_owned())
        })
        .collect()
}

/// The unsigned integer a JSON value starts with (after blanks); `None` for anything else.
fn number_at(value: &str) -> Option<u64> {
    let digits: String = value
        .trim_start()
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// The summed `duration_ms` of the objects in lunkit detach's `--json` whose `"step"` is
/// `step`, in microseconds; `None` when no step has that name.
pub fn json_step_us(text: &str, step: &str) -> Option<u64> {
    let spans = json_steps(text)?;
    let mut named = spans.iter().filter(|s| s.name == step).peekable();
    named.peek()?;
    Some(named.map(|s| s.dur_us).sum())
}

/// Every step of lunkit detach's `--json`, in order: its name, its `start_ms` (from the start
/// of the detach; 0 from a lunkit that does not report it) and its `duration_ms`, in
/// microseconds. `None` when the text is cut off or a step lacks its name or duration.
///
/// The step objects are found by their braces, outside strings (a step's `detail` is free
/// text), and a key cannot occur inside a string: its quotes would be escaped there.
pub fn json_steps(text: &str) -> Option<Vec<StepSpan>> {
    let (mut depth, mut in_str, mut escaped) = (0usize, false, false);
    let mut start = None;
    let mut spans = Vec::new();
    for (i, c) in text.char_indices() {
        if in_str {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_str = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_str = true,
            '{' => {
                depth += 1;
                if depth == 2 {
                    start = Some(i);
                }
            }
            '}' => {
                if depth == 2 {
                    let obj = &text[start.take()?..=i];
                    if let Some(name) = string_field(obj, "step") {
                        spans.push(StepSpan {
                            name: name.to_owned(),
                            start_us: ms_field_us(obj, "start_ms").unwrap_or(0),
                            dur_us: ms_field_us(obj, "duration_ms")?,
                        });
                    }
                }
                depth = depth.checked_sub(1)?;
            }
            _ => {}
        }
    }
    (depth == 0 && !in_str).then_some(spans)
}

/// The value of `"key":"value"` in one JSON object (a value without escapes).
fn string_field<'a>(obj: &'a str, key: &str) -> Option<&'a str> {
    let pat = format!("\"{key}\":\"");
    let at = obj.find(&pat)? + pat.len();
    let len = obj[at..].find('"')?;
    Some(&obj[at..at + len])
}

/// The number of `"key":N` in one JSON object, milliseconds, as whole microseconds.
fn ms_field_us(obj: &str, key: &str) -> Option<u64> {
    let pat = format!("\"{key}\":");
    let at = obj.find(&pat)? + pat.len();
    let num: String = obj[at..]
        .trim_start()
        .chars()
        .take_while(|c| c.is_ascii_digit() || matches!(c, '.' | 'e' | 'E' | '-' | '+'))
        .collect();
    let ms: f64 = num.parse().ok()?;
    (ms >= 0.0).then(|| (ms * 1e3).round() as u64)
}

#[cfg(test)]
mod tests {
    use super::{StepSpan, json_step_us, json_steps, json_strs, json_u64, json_u64s};

    #[test]
    fn reads_every_string_for_a_key() {
        let doc = "{\n  \"findings\": [\n    {\n      \"kind\": \"idle-session\",\n      \"why\": \"nothing uses \\\"sdb\\\"\",\n      \"identity\": null\n    },\n    {\"kind\":\"remapped-path\"}\n  ]\n}";
        assert_eq!(json_strs(doc, "kind"), ["idle-session", "remapped-path"]);
        assert_eq!(json_strs(doc, "why"), [r#"nothing uses \"sdb\""#]);
        assert!(json_strs(doc, "identity").is_empty());
        assert!(json_strs(doc, "nope").is_empty());
    }

    #[test]
    fn reads_every_number_for_a_key() {
        let doc = r#"{"paths":[{"via":"session2","write_start_us":3120,"ready_us":61000},{"via":"session1","write_start_us":2710},{"via":"session3","write_start_us":null}],"elapsed_us":62000}"#;
        assert_eq!(json_u64s(doc, "write_start_us"), [3120, 2710]);
        assert_eq!(json_u64s(doc, "ready_us"), [61000]);
        assert!(json_u64s(doc, "nope").is_empty());
        assert!(json_u64s("{\"write_start_us\":null}", "write_start_us").is_empty());
    }

    #[test]
    fn sums_a_named_steps_durations_whatever_their_details_say() {
        let doc = r#"{"elapsed_us":900,"steps":[{"detail":null,"duration_ms":1.5,"outcome":"done","step":"identify","target":"x"},{"detail":"a } in \"step\":\"check-in-use\" text {","duration_ms":2.25,"outcome":"failed","step":"check-in-use","target":"mpatha"},{"detail":null,"duration_ms":0.75,"outcome":"done","step":"check-in-use","target":"mpatha"}],"version":1}"#;
        assert_eq!(json_step_us(doc, "check-in-use"), Some(3000));
        assert_eq!(json_step_us(doc, "identify"), Some(1500));
        assert_eq!(json_step_us(doc, "remove-map"), None);
        assert_eq!(json_step_us("{\"steps\":[{\"step\":\"x\"", "x"), None);
    }

    #[test]
    fn reads_each_steps_start_and_length() {
        let doc = r#"{"elapsed_us":900,"steps":[{"detail":null,"duration_ms":1.5,"outcome":"done","start_ms":0.25,"step":"identify","target":"x"},{"detail":"a } in \"step\":\"lock\" text {","duration_ms":2.0,"outcome":"done","start_ms":3.0,"step":"flush-path","target":"7:0:0:5 (sdc)"},{"detail":null,"duration_ms":0.5,"outcome":"done","start_ms":3.5,"step":"flush-path","target":"8:0:0:5 (sdd)"}],"version":1}"#;
        let span = |name: &str, start_us, dur_us| StepSpan {
            name: name.into(),
            start_us,
            dur_us,
        };
        assert_eq!(
            json_steps(doc).unwrap(),
            [
                span("identify", 250, 1500),
                span("flush-path", 3000, 2000),
                span("flush-path", 3500, 500)
            ]
        );
        // A lunkit from before `start_ms`: every step at 0.
        let old = r#"{"steps":[{"duration_ms":1.0,"step":"lock"}]}"#;
        assert_eq!(json_steps(old).unwrap(), [span("lock", 0, 1000)]);
        assert_eq!(json_steps(r#"{"steps":[{"step":"lock"}]}"#), None);
        assert_eq!(
            json_steps(r#"{"steps":[{"step":"lock","duration_ms":1"#),
            None
        );
    }

    #[test]
    fn reads_the_last_number_for_a_key() {
        let doc = "{\n  \"devices\": [ { \"elapsed_us\": 5 } ],\n  \"elapsed_us\": 111081\n}";
        assert_eq!(json_u64(doc, "elapsed_us"), Some(111_081));
        assert_eq!(json_u64(doc, "nope"), None);
        assert_eq!(json_u64("{\"elapsed_us\":null}", "elapsed_us"), None);
        // lunkit resize (serde_json, keys sorted): the library's own figure, under `result`.
        let resize = r#"{"elapsed_us":151000,"error":null,"ok":true,"result":{"changed":true,"elapsed_us":150900,"map":{"by":"multipathd"},"paths":[],"rescanned":true,"size":83886080,"wwid":null},"version":1,"volume":"/dev/mapper/mpatha"}"#;
        assert_eq!(json_u64(resize, "elapsed_us"), Some(150_900));
    }
}

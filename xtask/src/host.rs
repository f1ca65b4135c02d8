//! The host side of the commands: build, provision, boot, report.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::guest::SCENARIOS;
use crate::process::{self, cargo};
use crate::vm::Boot;
use crate::{Result, checks, image, paths, provision, vmtests};

/// `xtask vm [--timeout S] -- CMD...`
pub fn vm(args: &[String]) -> Result<u8> {
    let mut timeout = None;
    let mut it = args.iter();
    let mut argv = Vec::new();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--timeout" => {
                let s = it.next().ok_or("--timeout needs seconds")?;
                timeout = Some(Duration::from_secs(
                    s.parse().map_err(|_| format!("bad --timeout {s:?}"))?,
                ));
            }
            "--" => {
                argv.extend(it.by_ref().cloned());
            }
            _ => {
                argv.push(a.clone());
                argv.extend(it.by_ref().cloned());
            }
        }
    }
    if argv.is_empty() {
        return Err("usage: cargo xtask vm [--timeout SECONDS] -- CMD [ARGS...]".into());
    }
    let lab = provision::ensure()?;
    let (status, _) = Boot {
        timeout,
        ..Boot::default()
    }
    .run(&lab, &argv)?;
    Ok(exit_code(status))
}

/// `xtask fixtures [NAME...]`: rebuilds the sysfs fixture trees, one boot per scenario, into
/// a staging directory the guest may write, then swaps them into tests/fixtures.
pub fn fixtures(args: &[String]) -> Result<u8> {
    let names: Vec<&str> = if args.is_empty() {
        SCENARIOS.to_vec()
    } else {
        args.iter().map(String::as_str).collect()
    };
    if let Some(bad) = names.iter().find(|n| !SCENARIOS.contains(n)) {
        return Err(format!("unknown scenario {bad:?} (known: {})", SCENARIOS.join(", ")).into());
    }
    let lab = provision::ensure()?;
    let staging = paths::target_dir().join("vm-capture");
    for name in names {
        let _ = std::fs::remove_dir_all(&staging);
        std::fs::create_dir_all(&staging)?;
        let out = staging.join(name);
        let boot = Boot {
            rwdirs: vec![staging.clone()],
            timeout: Some(Duration::from_secs(600)),
            ..Boot::default()
        };
        let (status, _) = boot.run(
            &lab,
            &guest_argv(&["capture", name, &out.to_string_lossy()])?,
        )?;
        if !status.success() {
            return Err(format!("capturing {name} failed in the guest ({status})").into());
        }
        let fixture = paths::root().join("tests/fixtures").join(name);
        let _ = std::fs::remove_dir_all(&fixture);
        copy_tree(&out, &fixture)?;
        eprintln!("xtask: wrote {}", fixture.display());
    }
    let _ = std::fs::remove_dir_all(&staging);
    Ok(0)
}

/// `xtask lab [-- CMD...]`: the iSCSI multipath lab and `lunkit list` in it; then CMD, if
/// given, runs in the lab (with LUNKIT_BIN set) before it is torn down.
pub fn lab(args: &[String]) -> Result<u8> {
    let extra: Vec<&str> = match args.split_first() {
        None => Vec::new(),
        Some((dd, rest)) if dd == "--" && !rest.is_empty() => {
            rest.iter().map(String::as_str).collect()
        }
        _ => return Err("usage: cargo xtask lab [-- CMD [ARGS...]]".into()),
    };
    let lab = provision::ensure()?;
    process::run(cargo().args(["build", "-p", "lunkit-cli"]))?;
    let lunkit = paths::lunkit_bin().to_string_lossy().into_owned();
    let mut argv = vec!["lab", lunkit.as_str()];
    argv.extend(extra);
    let boot = Boot {
        timeout: Some(Duration::from_secs(600)),
        ..Boot::default()
    };
    let (status, _) = boot.run(&lab, &guest_argv(&argv)?)?;
    Ok(exit_code(status))
}

/// `xtask test [--host-only | --vm-only] [--repeat N] [FILTER]`: the host steps (fmt,
/// clippy, docs, the MSRV check, host tests: checks.rs), then the VM tests, each alone with a
/// checked lab reset between them (vmtests.rs). `--host-only` stops before the VM;
/// `--vm-only` skips the host steps and FILTER selects VM tests by name, for the edit loop on
/// VM tests; `--repeat N` (VM tests only) runs them N times from fresh boots and reports
/// flakes. CI runs the whole thing.
pub fn test(args: &[String]) -> Result<u8> {
    let usage = "usage: cargo xtask test [--host-only | --vm-only] [--repeat N] [FILTER]";
    let mut vm_only = false;
    let mut host_only = false;
    let mut repeat = None;
    let mut filter = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--host-only" => host_only = true,
            "--vm-only" => vm_only = true,
            "--repeat" => {
                let n = it.next().ok_or(usage)?;
                let n: usize = n
                    .parse()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| format!("--repeat needs a positive count, not {n:?}"))?;
                repeat = Some(n);
                vm_only = true;
            }
            _ if !a.starts_with('-') && filter.is_none() => filter = Some(a.clone()),
            _ => return Err(usage.into()),
        }
    }
    if host_only && (vm_only || filter.is_some()) {
        return Err(format!("--host-only runs no VM test: {usage}").into());
    }
    if host_only {
        // Nothing is provisioned: the VM's packages and virtme-ng are not needed, and the
        // host tests' C toolchain and kernel headers (gcc, linux-libc-dev) are assumed.
        let counts = checks::run()?;
        println!("xtask test: ok: host tests {counts}; VM tests not run (--host-only)");
        return Ok(0);
    }
    // Provision first: the host tests need the C toolchain and kernel headers too.
    let lab = provision::ensure()?;
    let mut host = None;
    if !vm_only {
        host = Some(checks::run()?);
    }
    // The VM tests run both binaries: `lunkit` (LUNKIT_BIN) and the CSI plugin beside it.
    process::run(cargo().args(["build", "-p", "lunkit-cli", "-p", "lunkit-csi"]))?;
    if !vm_only {
        // The image builds from this checkout and its programs start in it; with the dev
        // binaries just built (a release build would double the compile time of the run).
        let built = image::build("dev", &paths::target_dir().join("image/lunkit-csi.oci.tar"))?;
        println!("{built}");
    }
    let bins = vm_test_binaries()?;
    if bins.is_empty() {
        return Err("no VM test binaries (tests/vm_*.rs) were built".into());
    }
    let tests = vmtests::list(&bins, filter.as_deref())?;
    if tests.is_empty() {
        return Err(match &filter {
            Some(f) => format!("no VM test name contains {f:?}").into(),
            None => "the VM test binaries list no tests".into(),
        });
    }
    let lunkit = paths::lunkit_bin();
    if let Some(times) = repeat {
        return vmtests::repeat(&lab, &lunkit, &tests, times);
    }
    let run = vmtests::run_suites(&lab, &lunkit, &tests)?;
    run.print();
    let (passed, failed) = run.counts();
    let ok = failed == 0;
    let host = host.map_or_else(|| "skipped".to_owned(), |c| c.to_string());
    println!(
        "xtask test: {}: host tests {host}; VM tests {passed} passed, {failed} failed",
        if ok { "ok" } else { "FAILED" }
    );
    // The line CI reads, alone at the end.
    println!("vm: {passed} passed, {failed} failed");
    Ok(if ok { 0 } else { 1 })
}

/// Builds the root crate's tests and returns `(crate name, executable)` of each
/// `tests/vm_*.rs`, from cargo's JSON messages (the file names carry a hash only cargo knows).
fn vm_test_binaries() -> Result<Vec<(String, PathBuf)>> {
    let out = cargo()
        .args([
            "test",
            "-p",
            "lunkit",
            "--tests",
            "--no-run",
            "--message-format=json",
        ])
        .stderr(std::process::Stdio::inherit())
        .output()?;
    if !out.status.success() {
        return Err("building the VM tests failed".into());
    }
    let tests_dir = paths::root().join("tests");
    let mut bins = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        if !line.contains("\"reason\":\"compiler-artifact\"") {
            continue;
        }
        let (Some(src), Some(exe)) = (json_str(line, "src_path"), json_str(line, "executable"))
        else {
            continue;
        };
        let src = Path::new(&src);
        let vm_crate = src
            .file_name()
            .and_then(|n| n.to_str())
            .filter(|n| n.starts_with("vm_"))
            .and_then(|n| n.strip_suffix(".rs"));
        if let (true, Some(name)) = (src.parent() == Some(tests_dir.as_path()), vm_crate) {
            bins.push((name.to_owned(), PathBuf::from(exe)));
        }
    }
    bins.sort();
    bins.dedup();
    Ok(bins)
}

/// The string value of the first `"key":"..."` in a JSON line (enough for cargo's messages;
/// xtask stays dependency-free).
fn json_str(line: &str, key: &str) -> Option<String> {
    let start = line.find(&format!("\"{key}\":\""))? + key.len() + 4;
    let mut out = String::new();
    let mut chars = line[start..].chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => return Some(out),
            '\\' => match chars.next()? {
                'n' => out.push('\n'),
                't' => out.push('\t'),
                other => out.push(other),
            },
            c => out.push(c),
        }
    }
    None
}

/// The command line that runs this xtask binary inside the guest. The guest does not inherit
/// our environment, hence `env`.
pub fn guest_argv(args: &[&str]) -> Result<Vec<String>> {
    let me = std::env::current_exe()?;
    let mut argv = vec![
        "env".to_owned(),
        "LUNKIT_VM=1".to_owned(),
        me.to_string_lossy().into_owned(),
        "guest".to_owned(),
    ];
    argv.extend(args.iter().map(|s| (*s).to_owned()));
    Ok(argv)
}

fn exit_code(status: std::process::ExitStatus) -> u8 {
    status.code().map_or(1, |c| u8::try_from(c).unwrap_or(1))
}

/// Copies a captured tree (files, directories, symlinks as symlinks).
fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        let ft = entry.file_type()?;
        if ft.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&src)?, &dst)?;
        } else if ft.is_dir() {
            copy_tree(&src, &dst)?;
        } else {
            std::fs::copy(&src, &dst)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::json_str;

    #[test]
    fn reads_cargo_json_strings() {
        let line = r#"{"reason":"compiler-artifact","target":{"name":"vm_list","src_path":"/w/tests/vm_list.rs"},"executable":"/w/target/debug/deps/vm_list-1a2b","fresh":true}"#;
        assert_eq!(
            json_str(line, "src_path").as_deref(),
            Some("/w/tests/vm_list.rs")
        );
        assert_eq!(
            json_str(line, "executable").as_deref(),
            Some("/w/target/debug/deps/vm_list-1a2b")
        );
        assert_eq!(json_str(r#"{"executable":null}"#, "executable"), None);
        assert_eq!(json_str(r#"{"a":"x\"y"}"#, "a").as_deref(), Some("x\"y"));
    }
}

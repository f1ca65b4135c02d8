//! The host steps of `xtask test`, before any VM boots: formatting, ARCHITECTURE.md's figures
//! against the code, clippy, the library docs,
//! the examples, the crates as they would be published, a check at the declared MSRV, the
//! `deploy/` manifests against the Kubernetes schemas, and
//! the host tests. Each one fails the run.

use std::path::Path;
use std::process::Command;

use crate::process::{self, Counts, cargo};
use crate::{Result, paths};
use crate::{architecture, manifests};

/// Runs every host step in order and returns the host tests' counts.
pub fn run() -> Result<Counts> {
    process::run(cargo().args(["fmt", "--all", "--check"]))?;
    architecture::check()?;
    process::run(cargo().args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    docs()?;
    process::run(cargo().args(["build", "--examples"]))?;
    package()?;
    msrv()?;
    manifests::validate()?;
    let (status, lines) = process::run_tee(cargo().args(["test", "--workspace"]), None)?;
    let counts = Counts::from_lines(&lines);
    if !status.success() {
        return Err(format!("host tests failed: {counts}").into());
    }
    Ok(counts)
}

/// The packages whose docs users read (docs.rs builds these): the binaries' doc comments
/// are their `--help` text, not rustdoc.
const DOC_PACKAGES: &[&str] = &["lunkit", "lunkit-sys"];

/// `cargo doc --no-deps` with rustdoc warnings denied (a broken intra-doc link fails), once
/// with the default features and once with all of them, so a link that only resolves with
/// (or without) `udev` is caught either way.
fn docs() -> Result<()> {
    let mut flags = std::env::var("RUSTDOCFLAGS").unwrap_or_default();
    flags.push_str(" -D warnings");
    for features in [None, Some("--all-features")] {
        let mut cmd = cargo();
        cmd.args(["doc", "--no-deps"])
            .env("RUSTDOCFLAGS", flags.trim());
        for p in DOC_PACKAGES {
            cmd.args(["-p", p]);
        }
        cmd.args(features);
        process::run(&mut cmd)?;
    }
    Ok(())
}

/// The published crates: the largest a `.crate` file may be.
const MAX_CRATE_BYTES: u64 = 1 << 20;

/// `cargo package` of lunkit-sys and lunkit, each built from its packaged sources, as
/// crates.io would get them. Their `include` lists keep the tests' fixture trees out; a
/// `.crate` over [`MAX_CRATE_BYTES`] fails the step. lunkit finds the unpublished lunkit-sys
/// in cargo's local overlay of the packages made in the same call. `--offline`: the steps
/// before have fetched every dependency; `--allow-dirty`: this is a check, not a publish.
fn package() -> Result<()> {
    forget_unpacked_packages()?;
    process::run(
        cargo()
            .args([
                "package",
                "-p",
                "lunkit-sys",
                "-p",
                "lunkit",
                "--allow-dirty",
                "--offline",
                "--target-dir",
            ])
            .arg(verify_dir()),
    )?;
    let dir = verify_dir().join("package");
    let entries = std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|x| x == "crate") {
            let len = entry.metadata().map(|m| m.len()).unwrap_or(0);
            if len > MAX_CRATE_BYTES {
                return Err(format!(
                    "{} is {len} bytes, over {MAX_CRATE_BYTES}: a fixture got into the package?",
                    path.display()
                )
                .into());
            }
        }
    }
    Ok(())
}

/// Removes what cargo kept of our own packages from earlier runs: its unpacked copies of the
/// overlay's lunkit-sys (`$CARGO_HOME/registry/src/<registry>/lunkit-sys-<version>/`) and the
/// verification's build ([`verify_dir`]). A registry crate is taken as immutable, so while
/// the version is unchanged cargo reuses both, and lunkit would be verified against an old
/// lunkit-sys (an item added since: "unresolved import"). Only names of this workspace's
/// unpublished crates are removed.
fn forget_unpacked_packages() -> Result<()> {
    let built = verify_dir();
    if built.exists() {
        std::fs::remove_dir_all(&built).map_err(|e| format!("{}: {e}", built.display()))?;
    }
    let home = std::env::var_os("CARGO_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| std::path::Path::new(&h).join(".cargo")));
    let Some(src) = home.map(|h| h.join("registry/src")) else {
        return Ok(());
    };
    let Ok(registries) = std::fs::read_dir(&src) else {
        return Ok(());
    };
    for registry in registries.flatten() {
        let Ok(crates) = std::fs::read_dir(registry.path()) else {
            continue;
        };
        for krate in crates.flatten() {
            let name = krate.file_name();
            let ours = name.to_str().is_some_and(|n| {
                ["lunkit-sys-", "lunkit-"].iter().any(|p| {
                    n.strip_prefix(p)
                        .is_some_and(|v| v.starts_with(|c: char| c.is_ascii_digit()))
                })
            });
            if ours {
                std::fs::remove_dir_all(krate.path())
                    .map_err(|e| format!("{}: {e}", krate.path().display()))?;
            }
        }
    }
    Ok(())
}

/// Where `cargo package` builds and verifies: a target directory of its own, emptied before
/// each run (see [`forget_unpacked_packages`]).
fn verify_dir() -> std::path::PathBuf {
    paths::target_dir().join("package-verify")
}

/// `cargo check` of the whole workspace (every target, every feature, the committed
/// Cargo.lock) with the toolchain of the declared `rust-version`, so that the MSRV is built,
/// not only declared. rustup installs that toolchain once if it is missing (the minimal
/// profile: rustc, cargo, std). Its own target directory keeps the two toolchains' builds
/// apart. Only errors fail the step: an older rustc's lints are not the ones clippy judges.
fn msrv() -> Result<()> {
    let manifest = paths::root().join("Cargo.toml");
    let text = std::fs::read_to_string(&manifest)
        .map_err(|e| format!("cannot read {}: {e}", manifest.display()))?;
    let msrv = declared_msrv(&text).ok_or_else(|| {
        format!(
            "no rust-version in [workspace.package] of {}",
            manifest.display()
        )
    })?;
    let installed = Command::new("rustup")
        .args(["run", &msrv, "rustc", "--version"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .map_err(|e| format!("the MSRV check runs Rust {msrv} through rustup, which failed: {e}"))?
        .success();
    if !installed {
        eprintln!("xtask: installing Rust {msrv} (the declared rust-version) with rustup");
        process::run(Command::new("rustup").args([
            "toolchain",
            "install",
            &msrv,
            "--profile",
            "minimal",
        ]))?;
    }
    process::run(&mut msrv_check(&msrv, &paths::target_dir().join("msrv")))
}

/// `rustup run MSRV cargo check ...`, cleared of what the outer cargo set for us: `RUSTC`,
/// `RUSTDOC` or `RUSTUP_TOOLCHAIN` would otherwise pick the current toolchain's tools.
fn msrv_check(msrv: &str, target_dir: &Path) -> Command {
    let mut cmd = Command::new("rustup");
    cmd.args(["run", msrv, "cargo", "check"])
        .args(["--workspace", "--all-targets", "--all-features", "--locked"])
        .env("CARGO_TARGET_DIR", target_dir)
        .current_dir(paths::root());
    for var in ["CARGO", "RUSTC", "RUSTDOC", "RUSTUP_TOOLCHAIN"] {
        cmd.env_remove(var);
    }
    cmd
}

/// The `rust-version` of `[workspace.package]` in the root manifest's text.
fn declared_msrv(manifest: &str) -> Option<String> {
    let mut in_section = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_section = line == "[workspace.package]";
        } else if in_section {
            let Some((key, value)) = line.split_once('=') else {
                continue;
            };
            if key.trim() == "rust-version" {
                let v = value.trim().strip_prefix('"')?.strip_suffix('"')?;
                return Some(v.to_owned());
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::declared_msrv;

    #[test]
    fn reads_the_workspace_rust_version() {
        let manifest = "[workspace]\nmembers = [\".\"]\n\n[workspace.package]\nedition = \"2024\"\n\
                        rust-version = \"1.85\"\n\n[package]\nrust-version = \"1.99\"\n";
        assert_eq!(declared_msrv(manifest).as_deref(), Some("1.85"));
        assert_eq!(declared_msrv("[package]\nrust-version = \"1.85\"\n"), None);
        let ours = std::fs::read_to_string(crate::paths::root().join("Cargo.toml")).unwrap();
        assert!(
            declared_msrv(&ours).is_some(),
            "Cargo.toml declares no MSRV"
        );
    }
}

//! Where `unsafe` may live: the part of the unsafe policy the compiler cannot say by itself.
//!
//! The compiler and clippy enforce the rest (`[workspace.lints]` in Cargo.toml): `unsafe_code`
//! is denied in every crate of the workspace, `clippy::undocumented_unsafe_blocks` demands a
//! `// SAFETY:` comment on each unsafe block and impl, and
//! `clippy::multiple_unsafe_ops_per_block` keeps each block to one unsafe operation. A module
//! can still opt out with `#![allow(unsafe_code)]`, and nothing but this test says which may:
//! in the library only `src/ioctl.rs` (the raw ioctls and one getsockopt), in xtask only `xtask/src/bench/sys.rs`
//! (the benchmark's hand-declared syscalls); `sys/` forbids `unsafe` outright.

use std::fs;
use std::path::{Path, PathBuf};

/// The only files that may lower the `unsafe_code` lint.
const MAY_USE_UNSAFE: &[&str] = &["src/ioctl.rs", "xtask/src/bench/sys.rs"];

/// Where the workspace's Rust sources are (the fuzz crate is its own workspace, on nightly).
const SOURCE_DIRS: &[&str] = &["src", "sys", "cli", "xtask", "tests", "benches"];

/// Every manifest of the workspace, each of which must take the workspace's lints.
const MANIFESTS: &[&str] = &[
    "Cargo.toml",
    "sys/Cargo.toml",
    "cli/Cargo.toml",
    "xtask/Cargo.toml",
    "tests/vm/support/Cargo.toml",
];

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries {
        let e = e.unwrap();
        let p = e.path();
        let ft = e.file_type().unwrap();
        // Fixture trees are captured sysfs (full of links), not code.
        if ft.is_dir()
            && p.file_name()
                .is_some_and(|n| n != "fixtures" && n != "target")
        {
            rust_files(&p, out);
        } else if ft.is_file() && p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The lines of `src` (the file `rel`) that name the `unsafe_code` lint other than to deny
/// or forbid it, unless `rel` may use `unsafe`. A lint attribute that allows, warns or expects
/// it, however spelled (`cfg_attr`, across lines), names it on a line that is not a comment.
fn opt_outs(rel: &str, src: &str) -> Vec<String> {
    if MAY_USE_UNSAFE.contains(&rel) {
        return Vec::new();
    }
    let lint = "unsafe_code";
    src.lines()
        .enumerate()
        .filter(|(_, l)| {
            let code = l.trim_start();
            l.contains(lint)
                && !code.starts_with("//")
                && !(code.starts_with("#![deny(") || code.starts_with("#![forbid("))
        })
        .map(|(n, l)| format!("{rel}:{}: may not lower `{lint}`: {}", n + 1, l.trim()))
        .collect()
}

/// The workspace lints the policy rests on, and every manifest taking them.
fn manifest_problems(top: &Path) -> Vec<String> {
    let mut problems = Vec::new();
    let root = fs::read_to_string(top.join("Cargo.toml")).unwrap();
    for (table, line) in [
        ("[workspace.lints.rust]", "unsafe_code = \"deny\""),
        (
            "[workspace.lints.clippy]",
            "undocumented_unsafe_blocks = \"deny\"",
        ),
        (
            "[workspace.lints.clippy]",
            "multiple_unsafe_ops_per_block = \"deny\"",
        ),
    ] {
        let body = root
            .split(table)
            .nth(1)
            .map(|b| b.split("\n[").next().unwrap());
        if !body.is_some_and(|b| b.lines().any(|l| l.trim() == line)) {
            problems.push(format!("Cargo.toml: no `{line}` in {table}"));
        }
    }
    for m in MANIFESTS {
        let text = fs::read_to_string(top.join(m)).unwrap();
        if !text.contains("[lints]\nworkspace = true") {
            problems.push(format!("{m}: does not take the workspace lints"));
        }
    }
    problems
}

#[test]
fn unsafe_lives_only_where_it_may() {
    let top = repo();
    let mut files = Vec::new();
    for d in SOURCE_DIRS {
        rust_files(&top.join(d), &mut files);
    }
    assert!(files.len() > 50, "found only {} source files", files.len());
    let mut problems = manifest_problems(&top);
    for f in &files {
        let rel = f.strip_prefix(&top).unwrap().to_str().unwrap().to_owned();
        if rel == "tests/unsafe_audit.rs" {
            continue;
        }
        problems.extend(opt_outs(&rel, &fs::read_to_string(f).unwrap()));
    }
    let sys = fs::read_to_string(top.join("sys/src/lib.rs")).unwrap();
    if !sys.contains("#![forbid(unsafe_code)]") {
        problems.push("sys/src/lib.rs: no #![forbid(unsafe_code)]".into());
    }
    // The allowed files exist and do hold the unsafe code, so the list cannot rot.
    for rel in MAY_USE_UNSAFE {
        let src = fs::read_to_string(top.join(rel)).unwrap();
        if !src.contains("#![allow(unsafe_code)]") || !src.contains("unsafe {") {
            problems.push(format!("{rel}: listed as using unsafe, but does not"));
        }
    }
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
}

#[test]
fn the_check_sees_every_way_to_opt_out() {
    let bad = [
        "#![allow(unsafe_code)]\n",
        "#[allow(unsafe_code)]\nfn f() {}\n",
        "#![expect(unsafe_code, reason = \"x\")]\n",
        "#![cfg_attr(test, allow(unsafe_code))]\n",
        "#![warn(unsafe_code)]\n",
        "#![allow(\n    unsafe_code,\n)]\n",
    ];
    for src in bad {
        assert_eq!(opt_outs("src/wwn.rs", src).len(), 1, "{src:?}");
    }
    let fine = [
        "#![deny(unsafe_code)]\n",
        "#![forbid(unsafe_code)]\n",
        "// unsafe_code is denied here\n",
    ];
    for src in fine {
        assert!(opt_outs("src/wwn.rs", src).is_empty(), "{src:?}");
    }
    assert!(opt_outs("src/ioctl.rs", "#![allow(unsafe_code)]\n").is_empty());
}

#[test]
fn the_check_sees_a_lint_dropped_from_the_manifest() {
    assert!(manifest_problems(&repo()).is_empty());
    let dst = std::env::temp_dir().join(format!("lunkit-unsafe-audit-{}", std::process::id()));
    for m in MANIFESTS {
        let to = dst.join(m);
        fs::create_dir_all(to.parent().unwrap()).unwrap();
        fs::copy(repo().join(m), to).unwrap();
    }
    let root = fs::read_to_string(dst.join("Cargo.toml")).unwrap();
    let weakened = root.replace("undocumented_unsafe_blocks = \"deny\"", "");
    fs::write(dst.join("Cargo.toml"), weakened).unwrap();
    let cli = fs::read_to_string(dst.join("cli/Cargo.toml")).unwrap();
    fs::write(
        dst.join("cli/Cargo.toml"),
        cli.replace("[lints]\nworkspace = true", ""),
    )
    .unwrap();
    assert_eq!(
        manifest_problems(&dst),
        [
            "Cargo.toml: no `undocumented_unsafe_blocks = \"deny\"` in [workspace.lints.clippy]",
            "cli/Cargo.toml: does not take the workspace lints",
        ]
    );
    fs::remove_dir_all(&dst).unwrap();
}

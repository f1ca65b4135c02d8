//! Where things are: the workspace, its target directory, the virtme-ng venv.

use std::path::{Path, PathBuf};

/// The workspace root (xtask lives in `<root>/xtask`). The guest sees the same path because it
/// shares the host root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask is inside the workspace")
        .to_path_buf()
}

pub fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => root().join(dir),
        None => root().join("target"),
    }
}

/// The virtme-ng venv, kept under `target/` so each checkout has its own and `cargo clean`
/// removes it. Its `bin/` must be on PATH because `vng` runs `virtme-run` from there
/// (docs/DESIGN.md, "QEMU facts on these machines").
pub fn venv() -> PathBuf {
    target_dir().join("vng-venv")
}

/// The `lunkit` CLI as `cargo build -p lunkit-cli` leaves it.
pub fn lunkit_bin() -> PathBuf {
    target_dir().join("debug/lunkit")
}

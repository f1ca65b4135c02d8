//! Scratch copies of the fixture trees, shared by the host tests that need a tree they can
//! write to or change.

#![allow(dead_code)] // each test binary uses its own part of this module

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

/// A temp directory removed on drop, even when the test fails.
pub struct Scratch(PathBuf);

impl Scratch {
    /// A fresh, empty `lunkit-<tag>-<pid>` under the temp dir.
    pub fn new(tag: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("lunkit-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    /// A scratch directory holding a copy of `tests/fixtures/<fixture>`.
    pub fn with_fixture(fixture: &str, tag: &str) -> Scratch {
        let s = Scratch::new(tag);
        copy_fixture(fixture, s.path());
        s
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Copies `tests/fixtures/<fixture>` to `to`, symlinks as symlinks (sysfs is mostly links, and
/// resolving them would change what the readers see).
pub fn copy_fixture(fixture: &str, to: &Path) {
    fn copy(from: &Path, to: &Path) {
        fs::create_dir_all(to).unwrap();
        for e in fs::read_dir(from).unwrap() {
            let e = e.unwrap();
            let (src, dst) = (e.path(), to.join(e.file_name()));
            let ft = e.file_type().unwrap();
            if ft.is_symlink() {
                symlink(fs::read_link(&src).unwrap(), &dst).unwrap();
            } else if ft.is_dir() {
                copy(&src, &dst);
            } else {
                fs::copy(&src, &dst).unwrap();
            }
        }
    }
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(fixture);
    copy(&src, to);
}

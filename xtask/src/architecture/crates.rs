//! The figures of the CSI plugin (`csi/src`) and the CLI (`cli/src`), which are held to the
//! library's limits (issue 54): no file over [`MAX_FILE_LINES`] lines, no function over
//! [`MAX_FN_LINES`]. Unlike the library's counts, which only state what is, a plugin or CLI
//! file or function over a limit fails the check ([`over_limits`]) even when ARCHITECTURE.md
//! states it: the limits came with the reshape that met them, and nothing is grandfathered.
//!
//! The plugin is shaped by protocol family as the library is: its transport modules
//! (`iscsi/`, `fc/`, `nvme/`) name none of each other, and the SCSI part iSCSI and FC share
//! (`scsi.rs`) names none of them; [`crossings`] counts the paths that do, with the same
//! lexer and the same limits as the library's `ops/scsi/` ↔ `ops/nvme/` rule.

use std::path::Path;

use super::{Figure, File, Function, MAX_FILE_LINES, MAX_FN_LINES, paths_named, sources};
use crate::Result;

/// The plugin's transport modules, each its own protocol family.
const TRANSPORTS: [&str; 3] = ["iscsi", "fc", "nvme"];
/// The plugin's module that the SCSI transports share; it may name none of them.
const SHARED: &str = "scsi";

/// The crates held to the limits: their directory, which is also the figures' label.
pub const CRATES: [&str; 2] = ["csi", "cli"];

/// The figures of the crate in `dir` (`csi`), its sources under `src`.
pub fn figures(dir: &str, src: &Path) -> Result<Vec<Figure>> {
    let files = sources(src)?;
    let largest = files
        .iter()
        .max_by_key(|f| (f.lines, std::cmp::Reverse(&f.rel)))
        .ok_or_else(|| format!("{dir}/src has no .rs file"))?;
    let functions: Vec<Function> = files.iter().flat_map(File::functions).collect();
    let longest = functions
        .iter()
        .max_by_key(|f| (f.lines, std::cmp::Reverse(&f.name)))
        .ok_or_else(|| format!("{dir}/src has no function"))?;
    let figure = |name: String, value: String| Figure { name, value };
    let mut out = vec![
        figure(format!("`{dir}/` files"), files.len().to_string()),
        figure(
            format!("largest `{dir}/` file"),
            format!("`{dir}/src/{}`, {} lines", largest.rel, largest.lines),
        ),
        figure(
            format!("`{dir}/` files over {MAX_FILE_LINES} lines"),
            files
                .iter()
                .filter(|f| f.lines > MAX_FILE_LINES)
                .count()
                .to_string(),
        ),
        figure(
            format!("`{dir}/` functions over {MAX_FN_LINES} lines"),
            functions
                .iter()
                .filter(|f| f.lines > MAX_FN_LINES)
                .count()
                .to_string(),
        ),
        figure(
            format!("longest `{dir}/` function"),
            format!("`{}`, {} lines", longest.name, longest.lines),
        ),
    ];
    if dir == "csi" {
        let n: usize = files.iter().map(|f| crossings(f).len()).sum();
        out.push(figure(
            "paths between `csi/`'s transport modules".to_owned(),
            n.to_string(),
        ));
    }
    Ok(out)
}

/// What breaks the limits in the crate in `dir`: each file over [`MAX_FILE_LINES`] lines,
/// each function over [`MAX_FN_LINES`], and (for the plugin) each path between transport
/// modules, as `dir/src/file: …` lines.
pub fn over_limits(dir: &str, src: &Path) -> Result<Vec<String>> {
    let files = sources(src)?;
    let mut out = Vec::new();
    for f in &files {
        if f.lines > MAX_FILE_LINES {
            out.push(format!(
                "{dir}/src/{}: {} lines (at most {MAX_FILE_LINES})",
                f.rel, f.lines
            ));
        }
        for func in f.functions() {
            if func.lines > MAX_FN_LINES {
                out.push(format!(
                    "{dir}/src/{}: `{}` is {} lines (at most {MAX_FN_LINES})",
                    f.rel, func.name, func.lines
                ));
            }
        }
        if dir == "csi" {
            out.extend(
                crossings(f)
                    .into_iter()
                    .map(|p| format!("{dir}/src/{}: names {p}, another transport's module", f.rel)),
            );
        }
    }
    Ok(out)
}

/// The paths in a plugin file of one transport module that name another transport's
/// module, or in its shared SCSI module that name any transport's, each as `a::b`.
fn crossings(file: &File) -> Vec<String> {
    let own = match file.module.first().map(String::as_str) {
        Some(m) if TRANSPORTS.contains(&m) => Some(m),
        Some(SHARED) => None,
        _ => return Vec::new(),
    };
    paths_named(&file.text, &file.module)
        .into_iter()
        .filter(|p| {
            p.first()
                .is_some_and(|m| TRANSPORTS.contains(&m.as_str()) && Some(m.as_str()) != own)
        })
        .map(|p| p.join("::"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plugin_tree_is_counted_and_its_breaches_named() {
        let dir = std::env::temp_dir().join(format!("xtask-arch-csi-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for d in ["iscsi", "fc", "nvme"] {
            std::fs::create_dir_all(dir.join(d)).unwrap();
        }
        std::fs::write(dir.join("lib.rs"), "pub mod iscsi;\npub mod fc;\n").unwrap();
        let long_fn = format!("fn long() {{\n{}}}\n", "    a();\n".repeat(101));
        std::fs::write(
            dir.join("iscsi/mod.rs"),
            format!("use super::*;\n{long_fn}"),
        )
        .unwrap();
        // Another transport by `crate::` and by `super::`; its own and a shared module are fine.
        std::fs::write(
            dir.join("fc/mod.rs"),
            "use crate::nvme::X;\nuse super::iscsi::Y;\nuse crate::fc::Z;\nuse crate::scsi::W;\n",
        )
        .unwrap();
        std::fs::write(dir.join("scsi.rs"), "use crate::nvme::stage;\n").unwrap();
        std::fs::write(dir.join("nvme/mod.rs"), "\n".repeat(601)).unwrap();
        let got = figures("csi", &dir).unwrap();
        let breaches = over_limits("csi", &dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let value = |name: &str| got.iter().find(|f| f.name == name).unwrap().value.clone();
        assert_eq!(value("`csi/` files"), "5");
        assert_eq!(
            value("largest `csi/` file"),
            "`csi/src/nvme/mod.rs`, 601 lines"
        );
        assert_eq!(value("`csi/` files over 600 lines"), "1");
        assert_eq!(value("`csi/` functions over 100 lines"), "1");
        assert_eq!(value("longest `csi/` function"), "`iscsi::long`, 103 lines");
        assert_eq!(value("paths between `csi/`'s transport modules"), "3");
        assert_eq!(
            breaches,
            [
                "csi/src/fc/mod.rs: names nvme::X, another transport's module",
                "csi/src/fc/mod.rs: names iscsi::Y, another transport's module",
                "csi/src/iscsi/mod.rs: `iscsi::long` is 103 lines (at most 100)",
                "csi/src/nvme/mod.rs: 601 lines (at most 600)",
                "csi/src/scsi.rs: names nvme::stage, another transport's module",
            ]
        );
    }
}

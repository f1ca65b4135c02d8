//! ARCHITECTURE.md's figures, computed from `src/` and compared with what the document states.
//!
//! The figures live in one table of ARCHITECTURE.md between [`BEGIN`] and [`END`]; this module
//! reads only that table, counts the same things in the library's sources, and fails naming
//! each figure that drifted, the stated value and the real one, with the whole table to paste
//! in. `cargo xtask test` runs it among its host steps; `cargo xtask architecture` prints the
//! table (`--check`: compares, as the test does).
//!
//! The counting reads the sources with a small lexer, not a Rust parser: comments, strings
//! (raw ones too) and character literals are blanked, then braces are matched. Its limits:
//! a function's length runs from the line of its `fn` keyword to the line of its closing
//! brace (its doc comment and attributes left out; a nested `fn` counts inside its parent and
//! on its own); anything under `#[cfg(test)]` is left out, but a `#[test]` function outside
//! such a block is counted; a `fn` produced by a macro is not seen; and the `ops/scsi/` ↔
//! `ops/nvme/` rule sees paths that start with `crate::`, `super::` or `self::` (grouped
//! `use` lists included), not a name reached through a re-export or a glob import.
//!
//! The same counts are made of the plugin (`csi/src`) and the CLI (`cli/src`), where a file or
//! function over the limits fails the check whatever the table states ([`crates`]).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::{Result, paths};

mod crates;

/// The line before the table of figures.
pub const BEGIN: &str = "<!-- figures: computed from src/ by `cargo xtask architecture`, checked by `cargo xtask test` -->";
/// The line after it.
pub const END: &str = "<!-- /figures -->";

/// A library file may be at most this long (issue 34); longer ones are counted, not refused.
const MAX_FILE_LINES: usize = 600;
/// A library function may be at most this long.
const MAX_FN_LINES: usize = 100;

/// One figure: what it counts and its value, as the table's two cells.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Figure {
    pub name: String,
    pub value: String,
}

/// `cargo xtask test`'s step: ARCHITECTURE.md states what the code has.
pub fn check() -> Result<()> {
    let root = paths::root();
    let doc_path = root.join("ARCHITECTURE.md");
    let doc =
        std::fs::read_to_string(&doc_path).map_err(|e| format!("{}: {e}", doc_path.display()))?;
    let stated = stated(&doc)?;
    let real = all_figures(&root)?;
    compare(&stated, &real)?;
    let mut breaches = Vec::new();
    for dir in crates::CRATES {
        breaches.extend(crates::over_limits(dir, &root.join(dir).join("src"))?);
    }
    if !breaches.is_empty() {
        return Err(format!(
            "the plugin and the CLI are held to the library's limits (files and functions \
             at most {MAX_FILE_LINES} and {MAX_FN_LINES} lines, no path between csi's \
             transport modules); these break them:\n  {}",
            breaches.join("\n  ")
        )
        .into());
    }
    println!(
        "ARCHITECTURE.md's {} figures match src/, csi/src and cli/src",
        real.len()
    );
    Ok(())
}

/// The library's figures, then those of each crate of [`crates::CRATES`].
fn all_figures(root: &Path) -> Result<Vec<Figure>> {
    let mut all = figures(&root.join("src"))?;
    for dir in crates::CRATES {
        all.extend(crates::figures(dir, &root.join(dir).join("src"))?);
    }
    Ok(all)
}

/// `cargo xtask architecture [--check]`: prints the table as ARCHITECTURE.md should have it,
/// or with `--check` runs [`check`] alone.
pub fn main(args: &[String]) -> Result<u8> {
    match args {
        [] => print!("{}", table(&all_figures(&paths::root())?)),
        [flag] if flag == "--check" => check()?,
        _ => return Err(format!("unexpected arguments {args:?} (only --check)").into()),
    }
    Ok(0)
}

/// The table between [`BEGIN`] and [`END`], those lines included, for `figures`.
pub fn table(figures: &[Figure]) -> String {
    let mut t = format!("{BEGIN}\n| figure | value |\n|---|---|\n");
    for f in figures {
        let _ = writeln!(t, "| {} | {} |", f.name, f.value);
    }
    t.push_str(END);
    t.push('\n');
    t
}

/// The figures ARCHITECTURE.md states: the rows of its one table between [`BEGIN`] and
/// [`END`].
pub fn stated(doc: &str) -> Result<Vec<Figure>> {
    let lines: Vec<&str> = doc.lines().collect();
    let at = |marker: &str| lines.iter().position(|l| l.trim() == marker);
    let (Some(begin), Some(end)) = (at(BEGIN), at(END)) else {
        return Err(format!(
            "ARCHITECTURE.md has no table of figures: put the output of `cargo xtask \
             architecture` in it (the lines {BEGIN:?} and {END:?} around the table)"
        )
        .into());
    };
    if end < begin {
        return Err(format!("ARCHITECTURE.md: {END:?} comes before {BEGIN:?}").into());
    }
    let mut figures = Vec::new();
    for line in &lines[begin + 1..end] {
        let cells: Vec<&str> = line
            .trim()
            .trim_matches('|')
            .split('|')
            .map(str::trim)
            .collect();
        match cells.as_slice() {
            ["figure", "value"] => {}
            [a, b] if a.chars().all(|c| c == '-') && b.chars().all(|c| c == '-') => {}
            [name, value] => figures.push(Figure {
                name: (*name).to_owned(),
                value: (*value).to_owned(),
            }),
            _ => {
                return Err(format!(
                    "ARCHITECTURE.md's table of figures: {line:?} is not a row `| figure | value |`"
                )
                .into());
            }
        }
    }
    Ok(figures)
}

/// Fails, naming every figure that differs, is missing or is not one this check computes,
/// and giving the table to write instead.
pub fn compare(stated: &[Figure], real: &[Figure]) -> Result<()> {
    let mut wrong = Vec::new();
    for r in real {
        match stated.iter().find(|s| s.name == r.name) {
            Some(s) if s.value == r.value => {}
            Some(s) => wrong.push(format!(
                "  {}: ARCHITECTURE.md states {}, src/ has {}",
                r.name, s.value, r.value
            )),
            None => wrong.push(format!("  {}: not stated, src/ has {}", r.name, r.value)),
        }
    }
    for s in stated {
        if !real.iter().any(|r| r.name == s.name) {
            wrong.push(format!(
                "  {}: stated as {}, but no such figure is computed (a typo, or a row to remove)",
                s.name, s.value
            ));
        }
    }
    if wrong.is_empty() {
        return Ok(());
    }
    Err(format!(
        "ARCHITECTURE.md's figures are out of date:\n{}\nReplace its table of figures with this \
         (the output of `cargo xtask architecture`), and update any prose that repeats them:\n\n{}",
        wrong.join("\n"),
        table(real)
    )
    .into())
}

/// Every figure, computed from the library's sources under `src`.
pub fn figures(src: &Path) -> Result<Vec<Figure>> {
    let files = sources(src)?;
    let lib = files
        .iter()
        .find(|f| f.module.is_empty())
        .ok_or_else(|| format!("{}: no lib.rs", src.display()))?;
    let (modules, gated) = public_modules(&lib.text);
    let largest = files
        .iter()
        .max_by_key(|f| (f.lines, std::cmp::Reverse(&f.rel)))
        .ok_or("src/ has no .rs file")?;
    let long_files = files.iter().filter(|f| f.lines > MAX_FILE_LINES).count();
    let functions: Vec<Function> = files.iter().flat_map(File::functions).collect();
    let long_fns = functions.iter().filter(|f| f.lines > MAX_FN_LINES).count();
    let longest = functions
        .iter()
        .max_by_key(|f| (f.lines, std::cmp::Reverse(&f.name)))
        .ok_or("src/ has no function")?;
    let crossings: usize = files.iter().map(|f| cross_family_paths(f).len()).sum();
    let figure = |name: &str, value: String| Figure {
        name: name.to_owned(),
        value,
    };
    Ok(vec![
        figure("public root modules", modules.to_string()),
        figure(
            "public root modules without optional features",
            (modules - gated).to_string(),
        ),
        figure(
            "items re-exported at the root",
            reexports(&lib.text).to_string(),
        ),
        figure("library files", files.len().to_string()),
        figure(
            "largest library file",
            format!("`src/{}`, {} lines", largest.rel, largest.lines),
        ),
        figure(
            &format!("library files over {MAX_FILE_LINES} lines"),
            long_files.to_string(),
        ),
        figure(
            &format!("library functions over {MAX_FN_LINES} lines"),
            long_fns.to_string(),
        ),
        figure(
            "longest library function",
            format!("`{}`, {} lines", longest.name, longest.lines),
        ),
        figure(
            "paths between `ops/scsi/` and `ops/nvme/`",
            crossings.to_string(),
        ),
    ])
}

/// One source file of the library.
struct File {
    /// Its path below `src/`, with `/` (`ops/nvme/resize.rs`).
    rel: String,
    /// Its module path (`["ops", "nvme", "resize"]`; empty for `lib.rs`).
    module: Vec<String>,
    text: String,
    lines: usize,
}

impl File {
    fn functions(&self) -> Vec<Function> {
        let prefix: String = self.module.iter().map(|m| format!("{m}::")).collect();
        functions(&self.text)
            .into_iter()
            .map(|f| Function {
                name: format!("{prefix}{}", f.name),
                lines: f.lines,
            })
            .collect()
    }
}

/// Every `.rs` file under `src`, sorted by path.
fn sources(src: &Path) -> Result<Vec<File>> {
    let mut paths = Vec::new();
    walk(src, &mut paths)?;
    paths.sort();
    paths
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))?;
            let rel = p
                .strip_prefix(src)
                .expect("walk stays under src")
                .to_string_lossy()
                .replace('\\', "/");
            Ok(File {
                module: module_path(&rel),
                lines: text.lines().count(),
                text,
                rel,
            })
        })
        .collect()
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for entry in entries {
        let path = entry?.path();
        if path.is_dir() {
            walk(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    Ok(())
}

/// The module a file below `src/` defines: `ops/nvme/mod.rs` is `ops::nvme`, `lib.rs` the root.
fn module_path(rel: &str) -> Vec<String> {
    let stem = rel.strip_suffix(".rs").unwrap_or(rel);
    let mut parts: Vec<String> = stem.split('/').map(str::to_owned).collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
        parts.pop();
    }
    parts
}

/// `lib.rs`'s `pub mod` items at its top level, and how many of them a `#[cfg(feature…)]`
/// attribute gates.
fn public_modules(lib: &str) -> (usize, usize) {
    let masked = mask(lib);
    let lines: Vec<&str> = masked.lines().collect();
    let mut all = 0;
    let mut gated = 0;
    for (i, line) in lines.iter().enumerate() {
        if !line.starts_with("pub mod ") {
            continue;
        }
        all += 1;
        let attrs = lines[..i]
            .iter()
            .rev()
            .take_while(|l| l.trim_start().starts_with("#[") || l.trim_start().starts_with("///"));
        if attrs
            .into_iter()
            .any(|l| l.trim_start().starts_with("#[cfg(feature"))
        {
            gated += 1;
        }
    }
    (all, gated)
}

/// How many names `lib.rs`'s top-level `pub use` items re-export (`pub use a::{B, C};` is
/// two).
fn reexports(lib: &str) -> usize {
    let toks = tokens(&mask(lib));
    let mut count = 0;
    let mut depth = 0usize;
    let mut i = 0;
    while i < toks.len() {
        match toks[i].text.as_str() {
            "{" => depth += 1,
            "}" => depth = depth.saturating_sub(1),
            "pub" if depth == 0 && toks.get(i + 1).is_some_and(|t| t.text == "use") => {
                let end = (i..toks.len())
                    .find(|&j| toks[j].text == ";")
                    .unwrap_or(toks.len());
                // A leaf is the last name before a `,`, a `}` or the `;` that is not itself
                // a closing `}` (`{A, B}` has two, `a::b` one, `a::{B, c::D}` two).
                count += (i + 2..end)
                    .filter(|&j| {
                        let next = toks.get(j + 1).map_or(";", |t| t.text.as_str());
                        matches!(next, "," | "}" | ";")
                            && !matches!(toks[j].text.as_str(), "}" | "," | "{")
                    })
                    .count();
                i = end;
            }
            _ => {}
        }
        i += 1;
    }
    count
}

/// Paths in a file of `ops/scsi/` that name `ops::nvme`, or in one of `ops/nvme/` that name
/// `ops::scsi`, each as `file: path`.
fn cross_family_paths(file: &File) -> Vec<String> {
    let other = match file.module.get(..2) {
        Some([a, b]) if a == "ops" && b == "scsi" => "nvme",
        Some([a, b]) if a == "ops" && b == "nvme" => "scsi",
        _ => return Vec::new(),
    };
    paths_named(&file.text, &file.module)
        .into_iter()
        .filter(|p| p.len() >= 2 && p[0] == "ops" && p[1] == other)
        .map(|p| format!("src/{}: {}", file.rel, p.join("::")))
        .collect()
}

/// Every path starting with `crate::`, `super::` or `self::` in `text`, resolved against
/// `module` to a path from the crate root; a grouped `use a::{b, c::d}` gives `a::b` and
/// `a::c` (the first name of each member is all the rule needs).
fn paths_named(text: &str, module: &[String]) -> Vec<Vec<String>> {
    let toks = tokens(&mask(text));
    let mut out = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        let starts = matches!(toks[i].text.as_str(), "crate" | "super" | "self")
            && (i == 0 || toks[i - 1].text != "::");
        if !starts {
            i += 1;
            continue;
        }
        let mut path: Vec<String> = if toks[i].text == "crate" {
            Vec::new()
        } else {
            module.to_vec()
        };
        let mut j = i;
        loop {
            match toks[j].text.as_str() {
                "super" => {
                    path.pop();
                }
                "self" | "crate" => {}
                name => path.push(name.to_owned()),
            }
            let is_ident = |t: &Tok| t.text.starts_with(|c: char| c.is_alphabetic() || c == '_');
            match (toks.get(j + 1), toks.get(j + 2)) {
                (Some(sep), Some(next)) if sep.text == "::" && is_ident(next) => j += 2,
                (Some(sep), Some(next)) if sep.text == "::" && next.text == "{" => {
                    for member in group_members(&toks, j + 2) {
                        let mut p = path.clone();
                        if member != "self" {
                            p.push(member);
                        }
                        out.push(p);
                    }
                    break;
                }
                _ => {
                    out.push(path.clone());
                    break;
                }
            }
        }
        i = j + 1;
    }
    out
}

/// The first name of each member of the `{…}` group opened at `open`.
fn group_members(toks: &[Tok], open: usize) -> Vec<String> {
    let mut members = Vec::new();
    let mut depth = 0;
    for (k, t) in toks.iter().enumerate().skip(open) {
        match t.text.as_str() {
            "{" => depth += 1,
            "}" => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            name if depth == 1 && matches!(toks[k - 1].text.as_str(), "{" | ",") => {
                members.push(name.to_owned());
            }
            _ => {}
        }
    }
    members
}

/// A function of the library and its length in lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Function {
    /// `name`, `Type::name` in an `impl` (the file's module path is added by the caller).
    pub name: String,
    pub lines: usize,
}

/// What an opening brace opened.
enum Frame {
    Fn { name: String, line: usize },
    Impl(Option<String>),
    Test,
    Block,
}

/// What the tokens since the last item boundary are heading for.
enum Pending {
    None,
    Fn {
        name: String,
        line: usize,
        nest: usize,
    },
    Impl {
        name: Option<String>,
        angle: i32,
        stopped: bool,
    },
}

/// Every function with a body in `text`, outside `#[cfg(test)]` items, with its length from
/// the line of `fn` to the line of its closing brace.
pub fn functions(text: &str) -> Vec<Function> {
    let toks = tokens(&mask(text));
    let mut out = Vec::new();
    let mut stack: Vec<Frame> = Vec::new();
    let mut pending = Pending::None;
    let mut cfg_test = false;
    // Depth of `(` and `[`: a `;` inside them (`[u8; 4]`) ends no declaration.
    let mut nest = 0usize;
    for (i, t) in toks.iter().enumerate() {
        let text = t.text.as_str();
        let next = toks.get(i + 1).map(|t| t.text.as_str());
        if let Pending::Impl {
            name,
            angle,
            stopped,
        } = &mut pending
        {
            match text {
                "<" => *angle += 1,
                ">" if i == 0 || toks[i - 1].text != "-" => *angle -= 1,
                "for" if *angle == 0 => *name = None,
                "where" => *stopped = true,
                "dyn" | "mut" | "const" | "unsafe" => {}
                _ if *angle == 0 && !*stopped && is_ident(text) => *name = Some(text.to_owned()),
                _ => {}
            }
        }
        match text {
            "#" if is_cfg_test(&toks[i..]) => cfg_test = true,
            "(" | "[" => nest += 1,
            ")" | "]" => nest = nest.saturating_sub(1),
            "fn" if next.is_some_and(is_ident) && matches!(pending, Pending::None) => {
                pending = Pending::Fn {
                    name: next.unwrap_or_default().to_owned(),
                    line: t.line,
                    nest,
                };
            }
            "impl" if matches!(pending, Pending::None) => {
                pending = Pending::Impl {
                    name: None,
                    angle: 0,
                    stopped: false,
                };
            }
            ";" => {
                if matches!(&pending, Pending::Fn { nest: n, .. } if *n == nest) {
                    pending = Pending::None;
                }
                cfg_test = false;
            }
            "{" => {
                let frame = match std::mem::replace(&mut pending, Pending::None) {
                    _ if std::mem::take(&mut cfg_test) => Frame::Test,
                    Pending::Fn { name, line, .. } => Frame::Fn { name, line },
                    Pending::Impl { name, .. } => Frame::Impl(name),
                    Pending::None => Frame::Block,
                };
                stack.push(frame);
            }
            "}" => {
                if let Some(Frame::Fn { name, line }) = stack.pop() {
                    if !stack.iter().any(|f| matches!(f, Frame::Test)) {
                        let owner = stack.iter().rev().find_map(|f| match f {
                            Frame::Impl(Some(ty)) => Some(ty.as_str()),
                            _ => None,
                        });
                        out.push(Function {
                            name: owner.map_or(name.clone(), |ty| format!("{ty}::{name}")),
                            lines: t.line - line + 1,
                        });
                    }
                }
            }
            _ => {}
        }
    }
    out
}

/// Whether the tokens start with `#[cfg(test)]`.
fn is_cfg_test(toks: &[Tok]) -> bool {
    let want = ["#", "[", "cfg", "(", "test", ")", "]"];
    toks.len() >= want.len() && toks.iter().zip(want).all(|(t, w)| t.text == w)
}

fn is_ident(s: &str) -> bool {
    s.starts_with(|c: char| c.is_alphabetic() || c == '_')
        && s.chars().all(|c| c.is_alphanumeric() || c == '_')
}

/// A token of masked source: a name, a number, `::`, or one other character; `line` from 1.
#[derive(Debug)]
struct Tok {
    text: String,
    line: usize,
}

/// The tokens of `masked` (the output of [`mask`]).
fn tokens(masked: &str) -> Vec<Tok> {
    let chars: Vec<char> = masked.chars().collect();
    let mut out = Vec::new();
    let mut line = 1;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push(Tok {
                text: chars[start..i].iter().collect(),
                line,
            });
        } else if c == ':' && chars.get(i + 1) == Some(&':') {
            out.push(Tok {
                text: "::".into(),
                line,
            });
            i += 2;
        } else {
            out.push(Tok {
                text: c.to_string(),
                line,
            });
            i += 1;
        }
    }
    out
}

/// `src` with every comment, string literal (raw and byte strings too) and character literal
/// replaced by blanks, newlines kept, so braces and names can be counted on what is left.
/// A string keeps its quotes, so `"{"` becomes `" "`.
pub fn mask(src: &str) -> String {
    let c: Vec<char> = src.chars().collect();
    let mut out: Vec<char> = c.clone();
    let blank = |out: &mut Vec<char>, from: usize, to: usize| {
        for ch in &mut out[from..to.min(c.len())] {
            if *ch != '\n' {
                *ch = ' ';
            }
        }
    };
    let ident = |k: usize| c[k].is_alphanumeric() || c[k] == '_';
    let mut i = 0;
    while i < c.len() {
        if c[i] == '/' && c.get(i + 1) == Some(&'/') {
            let end = (i..c.len()).find(|&k| c[k] == '\n').unwrap_or(c.len());
            blank(&mut out, i, end);
            i = end;
        } else if c[i] == '/' && c.get(i + 1) == Some(&'*') {
            // Block comments nest in Rust.
            let (mut depth, mut k) = (0usize, i);
            while k < c.len() {
                if c[k] == '/' && c.get(k + 1) == Some(&'*') {
                    depth += 1;
                    k += 2;
                } else if c[k] == '*' && c.get(k + 1) == Some(&'/') {
                    depth -= 1;
                    k += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    k += 1;
                }
            }
            blank(&mut out, i, k);
            i = k;
        } else if let Some((open, hashes)) = raw_string_start(&c, i, &ident) {
            let close: Vec<char> = std::iter::once('"')
                .chain(std::iter::repeat_n('#', hashes))
                .collect();
            let body = open + 1;
            let end = (body..c.len())
                .find(|&k| c[k..].starts_with(&close))
                .map_or(c.len(), |k| k + close.len());
            blank(&mut out, body, end.saturating_sub(close.len()));
            i = end;
        } else if c[i] == '"' {
            let mut k = i + 1;
            while k < c.len() && c[k] != '"' {
                k += if c[k] == '\\' { 2 } else { 1 };
            }
            blank(&mut out, i + 1, k);
            i = k + 1;
        } else if c[i] == '\'' {
            // A character literal ('x', '\n', '\u{7b}'), or else a lifetime, left as it is.
            let end = if c.get(i + 1) == Some(&'\\') {
                (i + 2..c.len()).find(|&k| c[k] == '\'')
            } else if c.get(i + 2) == Some(&'\'') {
                Some(i + 2)
            } else {
                None
            };
            match end {
                Some(e) => {
                    blank(&mut out, i + 1, e);
                    i = e + 1;
                }
                None => i += 1,
            }
        } else {
            i += 1;
        }
    }
    out.into_iter().collect()
}

/// At `i`, a raw string's `r` (`r"`, `r#"`, `br#"`…, not the end of a name such as `for`):
/// the index of its opening quote and its number of `#`.
fn raw_string_start(c: &[char], i: usize, ident: &dyn Fn(usize) -> bool) -> Option<(usize, usize)> {
    if c[i] != 'r' {
        return None;
    }
    let starts_name = i == 0 || !ident(i - 1) || (c[i - 1] == 'b' && (i == 1 || !ident(i - 2)));
    if !starts_name {
        return None;
    }
    let hashes = c[i + 1..].iter().take_while(|&&ch| ch == '#').count();
    (c.get(i + 1 + hashes) == Some(&'"')).then_some((i + 1 + hashes, hashes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lens(src: &str) -> Vec<(String, usize)> {
        functions(src)
            .into_iter()
            .map(|f| (f.name, f.lines))
            .collect()
    }

    #[test]
    fn masking_blanks_comments_strings_and_chars_but_not_lifetimes() {
        let src = "fn a<'x>(s: &'x str) -> char { // }\n  let _ = \"}{\"; /* { /* } */ } */ '{' }";
        let m = mask(src);
        assert_eq!(m.len(), src.len());
        assert_eq!(m.matches('{').count(), 1, "{m}");
        assert_eq!(m.matches('}').count(), 1, "{m}");
        assert!(m.contains("<'x>") && m.contains("&'x str"), "{m}");
        let raw = "let s = r#\"a \"}\" b\"#; let t = br\"{\"; let u = '\\u{7b}'; for_r(\"x\")";
        let m = mask(raw);
        assert!(!m.contains('{') && !m.contains('}'), "{m}");
        assert!(m.contains("for_r"), "{m}");
    }

    #[test]
    fn functions_run_from_fn_to_their_closing_brace() {
        let src = "\
/// Doc.
#[inline]
pub fn one() {
    let s = \"}\";
}

impl<'a, T: Clone> Display for Wrapper<'a, T> where T: Debug {
    fn fmt(&self) -> [u8; 4] {
        if x { y } else { z }
    }
}

trait Tr {
    fn declared(&self, a: [u8; 2]);
    fn defaulted(&self) {}
}

fn outer() -> impl Iterator<Item = u8> {
    fn inner() {
    }
    std::iter::empty()
}
";
        assert_eq!(
            lens(src),
            [
                ("one".to_owned(), 3),
                ("Wrapper::fmt".to_owned(), 3),
                ("defaulted".to_owned(), 1),
                ("inner".to_owned(), 2),
                ("outer".to_owned(), 5),
            ]
        );
    }

    #[test]
    fn test_code_is_left_out() {
        let src = "\
fn kept() {
}
#[cfg(test)]
mod tests {
    fn helper() {}
    #[test]
    fn t() { helper() }
}
#[cfg(test)]
use std::fmt;
fn also_kept() {}
";
        assert_eq!(
            lens(src),
            [("kept".to_owned(), 2), ("also_kept".to_owned(), 1)]
        );
    }

    #[test]
    fn root_modules_and_reexports_are_counted_with_their_features() {
        let lib = "\
//! Docs mention pub mod nothing.
pub mod a;
mod private;
pub(crate) mod internal;
#[cfg(feature = \"udev\")]
#[cfg_attr(docsrs, doc(cfg(feature = \"udev\")))]
pub mod udev;
pub mod b;

pub use a::{One, Two as Deux};
pub use b::Three;
pub use b::inner::{self, x::Four};
mod m { pub use super::a::NotAtTheRoot; }
";
        assert_eq!(public_modules(lib), (3, 1));
        assert_eq!(reexports(lib), 5);
    }

    #[test]
    fn paths_are_resolved_from_the_file_module() {
        let module: Vec<String> = ["ops", "scsi", "detach", "run"].map(String::from).to_vec();
        let text = "\
use super::super::super::nvme::kept;
use crate::ops::{steps::StepLog, nvme};
use crate::nvme::Connected;
use self::inner::Thing;
// use crate::ops::nvme::in_a_comment;
let s = \"crate::ops::nvme::in_a_string\";
";
        let paths: Vec<String> = paths_named(text, &module)
            .into_iter()
            .map(|p| p.join("::"))
            .collect();
        assert_eq!(
            paths,
            [
                "ops::nvme::kept",
                "ops::steps",
                "ops::nvme",
                "nvme::Connected",
                "ops::scsi::detach::run::inner::Thing",
            ]
        );
        let file = File {
            rel: "ops/scsi/detach/run.rs".into(),
            module,
            text: text.into(),
            lines: 6,
        };
        assert_eq!(
            cross_family_paths(&file),
            [
                "src/ops/scsi/detach/run.rs: ops::nvme::kept",
                "src/ops/scsi/detach/run.rs: ops::nvme",
            ]
        );
        let nvme_side = File {
            rel: "ops/nvme/mod.rs".into(),
            module: module_path("ops/nvme/mod.rs"),
            text: "use super::scsi::locate;\nuse super::steps;\n".into(),
            lines: 2,
        };
        assert_eq!(
            cross_family_paths(&nvme_side),
            ["src/ops/nvme/mod.rs: ops::scsi::locate"]
        );
    }

    fn fig(name: &str, value: &str) -> Figure {
        Figure {
            name: name.into(),
            value: value.into(),
        }
    }

    #[test]
    fn the_table_is_read_only_between_its_markers() {
        let doc = format!(
            "# A\n| figure | value |\n| stray | 1 |\n{}",
            table(&[
                fig("public root modules", "19"),
                fig("largest library file", "`src/a.rs`, 9 lines")
            ])
        );
        assert_eq!(
            stated(&doc).unwrap(),
            [
                fig("public root modules", "19"),
                fig("largest library file", "`src/a.rs`, 9 lines")
            ]
        );
        assert!(
            stated("# no table\n")
                .unwrap_err()
                .to_string()
                .contains("cargo xtask architecture")
        );
        let bad = format!("{BEGIN}\n| one cell |\n{END}\n");
        assert!(stated(&bad).unwrap_err().to_string().contains("one cell"));
    }

    #[test]
    fn a_drift_names_the_figure_both_values_and_the_table_to_write() {
        let real = [fig("public root modules", "14"), fig("library files", "60")];
        assert!(compare(&real, &real).is_ok());
        let stated = [fig("public root modules", "19"), fig("old figure", "3")];
        let e = compare(&stated, &real).unwrap_err().to_string();
        assert!(
            e.contains("public root modules: ARCHITECTURE.md states 19, src/ has 14"),
            "{e}"
        );
        assert!(e.contains("library files: not stated, src/ has 60"), "{e}");
        assert!(e.contains("old figure: stated as 3"), "{e}");
        assert!(e.contains(&table(&real)), "{e}");
    }

    #[test]
    fn the_figures_of_a_small_tree() {
        let dir = std::env::temp_dir().join(format!("xtask-arch-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("ops/scsi")).unwrap();
        std::fs::write(
            dir.join("lib.rs"),
            "pub mod ops;\nmod x;\npub use ops::A;\n",
        )
        .unwrap();
        let long_fn = format!("fn long() {{\n{}}}\n", "    a();\n".repeat(101));
        std::fs::write(dir.join("ops/mod.rs"), &long_fn).unwrap();
        std::fs::write(
            dir.join("ops/scsi/mod.rs"),
            "use super::nvme::B;\nfn f() {}\n",
        )
        .unwrap();
        let got = figures(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let value = |name: &str| got.iter().find(|f| f.name == name).unwrap().value.clone();
        assert_eq!(value("public root modules"), "1");
        assert_eq!(value("items re-exported at the root"), "1");
        assert_eq!(value("library files"), "3");
        assert_eq!(value("largest library file"), "`src/ops/mod.rs`, 103 lines");
        assert_eq!(value("library functions over 100 lines"), "1");
        assert_eq!(value("longest library function"), "`ops::long`, 103 lines");
        assert_eq!(value("paths between `ops/scsi/` and `ops/nvme/`"), "1");
    }
}

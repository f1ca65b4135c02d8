//! The `unsafe` policy, checked on the source (issue 7, "Lints"):
//!
//! - every `unsafe` block, impl, trait, extern block and attribute in `src/`, `sys/src/`,
//!   `cli/src/` and `xtask/src/` has a `// SAFETY:` comment directly above it (attribute
//!   lines may sit in between); an `unsafe fn` may instead have a `# Safety` section in its
//!   doc comment, and the methods of an `unsafe impl` are covered by the impl's comment;
//! - in the library (`src/`), `unsafe` appears only in `src/ioctl.rs`, the module that issues
//!   raw ioctls; `src/lib.rs` denies `unsafe_code` and `sys/` forbids it.
//!
//! The scanner understands enough Rust to ignore the word in comments, doc comments, string
//! and raw string literals, char literals and longer identifiers (`unsafe_code`).

use std::fs;
use std::path::{Path, PathBuf};

/// One line of source, split into its code (literals blanked out) and its comment text.
#[derive(Debug, Default, Clone)]
struct Line {
    code: String,
    /// The comments on the line, each with its opening marker (`// …`, `/// …`, `/* …`).
    comment: String,
}

/// Splits `src` into lines of code and comments. String, raw string and char literals become
/// spaces in the code; block comments may span lines and nest, as in Rust.
fn lex(src: &str) -> Vec<Line> {
    #[derive(Clone, Copy, PartialEq)]
    enum State {
        Code,
        LineComment,
        BlockComment(u32),
        Str,
        RawStr(usize),
    }
    let chars: Vec<char> = src.chars().collect();
    let mut lines = vec![Line::default()];
    let mut state = State::Code;
    let mut i = 0;
    let at = |i: usize| chars.get(i).copied().unwrap_or('\0');
    while i < chars.len() {
        let c = chars[i];
        let line = lines.last_mut().unwrap();
        if c == '\n' {
            if state == State::LineComment {
                state = State::Code;
            }
            lines.push(Line::default());
            i += 1;
            continue;
        }
        match state {
            State::Code => {
                let prev_ident = i > 0 && is_ident(chars[i - 1]);
                if c == '/' && at(i + 1) == '/' {
                    state = State::LineComment;
                    line.comment.push(c);
                } else if c == '/' && at(i + 1) == '*' {
                    state = State::BlockComment(1);
                    line.comment.push_str("/*");
                    i += 1;
                } else if c == '"' {
                    state = State::Str;
                    line.code.push(' ');
                } else if !prev_ident && matches!(c, 'r' | 'b' | 'c') && raw_start(&chars, i) {
                    // r"…", r#"…"#, br"…", cr#"…"#: count the hashes up to the quote.
                    let mut j = i + 1;
                    if c != 'r' {
                        j += 1;
                    }
                    let hashes = chars[j..].iter().take_while(|&&h| h == '#').count();
                    for _ in i..=j + hashes {
                        line.code.push(' ');
                    }
                    i = j + hashes;
                    state = State::RawStr(hashes);
                } else if c == '\'' && is_char_literal(&chars, i) {
                    // Blank the whole literal: '"' or '\'' must not start a string.
                    let end = char_literal_end(&chars, i);
                    for _ in i..=end {
                        line.code.push(' ');
                    }
                    i = end;
                } else {
                    line.code.push(c);
                }
            }
            State::LineComment => line.comment.push(c),
            State::BlockComment(depth) => {
                line.comment.push(c);
                if c == '*' && at(i + 1) == '/' {
                    line.comment.push('/');
                    i += 1;
                    state = if depth == 1 {
                        State::Code
                    } else {
                        State::BlockComment(depth - 1)
                    };
                } else if c == '/' && at(i + 1) == '*' {
                    line.comment.push('*');
                    i += 1;
                    state = State::BlockComment(depth + 1);
                }
            }
            State::Str => {
                line.code.push(' ');
                if c == '\\' && at(i + 1) != '\n' {
                    line.code.push(' ');
                    i += 1;
                } else if c == '"' {
                    state = State::Code;
                }
            }
            State::RawStr(hashes) => {
                line.code.push(' ');
                if c == '"' && (1..=hashes).all(|k| at(i + k) == '#') {
                    for _ in 0..hashes {
                        line.code.push(' ');
                    }
                    i += hashes;
                    state = State::Code;
                }
            }
        }
        i += 1;
    }
    lines
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Whether a raw string literal starts at `i` (`r"`, `r#`, `br"`, `br#`, `cr"`, `cr#`).
fn raw_start(chars: &[char], i: usize) -> bool {
    let rest = &chars[i..];
    let after_r = match rest {
        ['r', ..] => 1,
        ['b' | 'c', 'r', ..] => 2,
        _ => return false,
    };
    let hashes = rest[after_r..].iter().take_while(|&&h| h == '#').count();
    rest.get(after_r + hashes) == Some(&'"')
}

/// Whether the `'` at `i` opens a char literal rather than a lifetime or label.
fn is_char_literal(chars: &[char], i: usize) -> bool {
    match chars.get(i + 1) {
        Some('\\') => true,
        Some(_) => chars.get(i + 2) == Some(&'\''),
        None => false,
    }
}

/// The index of the `'` that closes the char literal opened at `i`.
fn char_literal_end(chars: &[char], i: usize) -> usize {
    let mut j = i + 1;
    if chars[j] == '\\' {
        j += 2;
    } else {
        j += 1;
    }
    while j < chars.len() && chars[j] != '\'' {
        j += 1;
    }
    j
}

/// Where `unsafe` appears as a keyword: (line index, column in the code text).
fn unsafe_tokens(lines: &[Line]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    for (n, l) in lines.iter().enumerate() {
        let code = &l.code;
        let mut from = 0;
        while let Some(k) = code[from..].find("unsafe") {
            let start = from + k;
            let end = start + "unsafe".len();
            let before = code[..start].chars().next_back();
            let after = code[end..].chars().next();
            if !before.is_some_and(is_ident) && !after.is_some_and(is_ident) {
                out.push((n, start));
            }
            from = end;
        }
    }
    out
}

/// The first word of code after position (`line`, `col`), looking across lines.
fn next_word(lines: &[Line], line: usize, col: usize) -> String {
    let mut text: String = lines[line].code[col..].to_owned();
    for l in &lines[line + 1..] {
        text.push(' ');
        text.push_str(&l.code);
    }
    text.split(|c: char| !is_ident(c))
        .find(|w| !w.is_empty())
        .unwrap_or("")
        .to_owned()
}

fn is_attribute(l: &Line) -> bool {
    let t = l.code.trim_start();
    t.starts_with("#[") || t.starts_with("#![")
}

/// The comment lines directly above line `n`, attribute lines skipped, nearest first.
fn comment_block_above(lines: &[Line], n: usize) -> Vec<&str> {
    let mut out = Vec::new();
    let mut i = n;
    while i > 0 {
        i -= 1;
        let l = &lines[i];
        if !l.code.trim().is_empty() {
            if is_attribute(l) && out.is_empty() {
                continue;
            }
            break;
        }
        let c = l.comment.trim();
        if c.is_empty() {
            break;
        }
        out.push(c);
    }
    out
}

fn has_safety_comment(block: &[&str]) -> bool {
    block.iter().any(|c| {
        c.strip_prefix("//")
            .filter(|rest| !rest.starts_with('/') && !rest.starts_with('!'))
            .or_else(|| c.strip_prefix("/*"))
            .is_some_and(|rest| rest.trim_start().starts_with("SAFETY:"))
    })
}

fn has_safety_doc(block: &[&str]) -> bool {
    block.iter().any(|c| {
        c.strip_prefix("///")
            .is_some_and(|rest| rest.trim() == "# Safety")
    })
}

/// A place where the policy is broken.
#[derive(Debug, PartialEq)]
struct Finding {
    line: usize,
    what: String,
}

/// Every `unsafe` in `src` that lacks its comment. Line numbers are 1-based.
fn missing_safety_comments(src: &str) -> Vec<Finding> {
    let lines = lex(src);
    // The bodies of `unsafe impl`s, as (opening line, closing line).
    let mut impl_bodies: Vec<(usize, usize)> = Vec::new();
    {
        let tokens = unsafe_tokens(&lines);
        for &(n, col) in &tokens {
            if next_word(&lines, n, col + "unsafe".len()) != "impl" {
                continue;
            }
            // Find the impl's opening brace, then its matching close.
            let mut depth = 0i64;
            let mut open_line = None;
            'scan: for (m, l) in lines.iter().enumerate().skip(n) {
                let start = if m == n { col } else { 0 };
                for ch in l.code[start..].chars() {
                    match ch {
                        '{' => {
                            depth += 1;
                            open_line.get_or_insert(m);
                        }
                        '}' => {
                            depth -= 1;
                            if let (0, Some(open)) = (depth, open_line) {
                                impl_bodies.push((open, m));
                                break 'scan;
                            }
                        }
                        ';' if open_line.is_none() => break 'scan,
                        _ => {}
                    }
                }
            }
        }
    }
    let mut out = Vec::new();
    for (n, col) in unsafe_tokens(&lines) {
        let block = comment_block_above(&lines, n);
        let kind = next_word(&lines, n, col + "unsafe".len());
        let ok = match kind.as_str() {
            "fn" => {
                let in_unsafe_impl = impl_bodies.iter().any(|&(a, b)| a < n && n <= b);
                in_unsafe_impl || has_safety_comment(&block) || has_safety_doc(&block)
            }
            "trait" => has_safety_comment(&block) || has_safety_doc(&block),
            _ => has_safety_comment(&block),
        };
        if !ok {
            let what = match kind.as_str() {
                "impl" | "fn" | "trait" | "extern" => format!("unsafe {kind}"),
                _ => "unsafe block".to_owned(),
            };
            out.push(Finding { line: n + 1, what });
        }
    }
    out
}

/// Whether `src` uses `unsafe` at all (as a keyword, outside comments and literals).
fn uses_unsafe(src: &str) -> bool {
    !unsafe_tokens(&lex(src)).is_empty()
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = fs::read_dir(&d) else { continue };
        for e in rd {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Runs the whole audit on the tree at `top`; returns one message per problem.
fn audit(top: &Path) -> Vec<String> {
    let mut problems = Vec::new();
    let mut audited = 0;
    for dir in ["src", "sys/src", "cli/src", "xtask/src"] {
        for file in rust_files(&top.join(dir)) {
            audited += 1;
            let src = fs::read_to_string(&file).unwrap();
            let rel = file.strip_prefix(top).unwrap().display().to_string();
            for f in missing_safety_comments(&src) {
                problems.push(format!(
                    "{rel}:{}: {} without a `// SAFETY:` comment directly above it",
                    f.line, f.what
                ));
            }
            if dir == "src" && rel != "src/ioctl.rs" && uses_unsafe(&src) {
                problems.push(format!(
                    "{rel}: uses `unsafe`; in the library only src/ioctl.rs may"
                ));
            }
        }
    }
    assert!(
        audited > 10,
        "found only {audited} source files below {top:?}"
    );
    let lib = fs::read_to_string(top.join("src/lib.rs")).unwrap();
    if !lib.contains("#![deny(unsafe_code)]") && !lib.contains("#![forbid(unsafe_code)]") {
        problems.push("src/lib.rs: no #![deny(unsafe_code)]".into());
    }
    let sys = fs::read_to_string(top.join("sys/src/lib.rs")).unwrap();
    if !sys.contains("#![forbid(unsafe_code)]") && uses_unsafe(&sys) {
        problems.push("sys/src/lib.rs: no #![forbid(unsafe_code)]".into());
    }
    problems
}

#[test]
fn every_unsafe_has_a_safety_comment_and_lives_in_ioctl() {
    let problems = audit(&repo());
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
    // The audit looked at real unsafe code, not at nothing.
    let ioctl = fs::read_to_string(repo().join("src/ioctl.rs")).unwrap();
    assert!(unsafe_tokens(&lex(&ioctl)).len() >= 10);
}

// ---------------------------------------------------------------------------------------
// The checker itself: it must be able to fail.
// ---------------------------------------------------------------------------------------

/// Copies the parts of the repository the audit reads to a temp dir.
fn copy_sources(tag: &str) -> PathBuf {
    let dst =
        std::env::temp_dir().join(format!("lunkit-unsafe-audit-{tag}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dst);
    for dir in ["src", "sys/src", "cli/src", "xtask/src"] {
        for f in rust_files(&repo().join(dir)) {
            let to = dst.join(f.strip_prefix(repo()).unwrap());
            fs::create_dir_all(to.parent().unwrap()).unwrap();
            fs::copy(&f, &to).unwrap();
        }
    }
    dst
}

#[test]
fn audit_fails_on_a_copy_with_a_safety_comment_removed() {
    let dst = copy_sources("removed");
    assert!(audit(&dst).is_empty());
    let ioctl = dst.join("src/ioctl.rs");
    let src = fs::read_to_string(&ioctl).unwrap();
    let pos = src.find("    // SAFETY: BLKFLSBUF").unwrap();
    let line_end = pos + src[pos..].find('\n').unwrap() + 1;
    let target_line = src[..pos].lines().count() + 1; // the `unsafe` line, after removal
    fs::write(&ioctl, format!("{}{}", &src[..pos], &src[line_end..])).unwrap();
    let problems = audit(&dst);
    assert_eq!(
        problems,
        [format!(
            "src/ioctl.rs:{target_line}: unsafe block without a `// SAFETY:` comment directly above it"
        )]
    );
    fs::remove_dir_all(&dst).unwrap();
}

#[test]
fn audit_fails_on_a_copy_with_unsafe_outside_ioctl() {
    let dst = copy_sources("outside");
    let wwn = dst.join("src/wwn.rs");
    let mut src = fs::read_to_string(&wwn).unwrap();
    src.push_str(
        "\n// SAFETY: documented, but still not allowed here.\n\
         pub fn zero() -> u8 { unsafe { std::mem::zeroed() } }\n",
    );
    fs::write(&wwn, src).unwrap();
    let problems = audit(&dst);
    assert_eq!(
        problems,
        ["src/wwn.rs: uses `unsafe`; in the library only src/ioctl.rs may"]
    );
    fs::remove_dir_all(&dst).unwrap();
}

#[test]
fn scanner_sees_keywords_not_words() {
    let src = r####"
//! Docs may say unsafe, and so may comments: // unsafe { }
/* block comment: unsafe { x } /* nested unsafe */ still comment unsafe */
#![deny(unsafe_code)]
const A: &str = "unsafe { }";
const B: &str = r#"a "quoted" unsafe"#;
const C: &[u8] = br##"unsafe"##;
const D: char = '"';
const E: &str = "escaped \" unsafe";
fn f<'a>(x: &'a str) -> &'a str { let unsafe_ish = x; unsafe_ish }
const F: char = '\'';
let s = "multi
line unsafe";
"####;
    assert_eq!(unsafe_tokens(&lex(src)), []);
    assert!(missing_safety_comments(src).is_empty());
}

#[test]
fn scanner_requires_the_comment_directly_above() {
    let bad = "fn f() {\n    let x = unsafe { g() };\n}\n";
    assert_eq!(
        missing_safety_comments(bad),
        [Finding {
            line: 2,
            what: "unsafe block".into()
        }]
    );
    // A comment that is not a SAFETY comment, a blank line between, a doc comment: all fail.
    for bad in [
        "// This is fine.\nunsafe { g() }\n",
        "// SAFETY: too far.\n\nunsafe { g() }\n",
        "/// SAFETY: a doc comment is not it.\nunsafe impl Send for X {}\n",
        "// SAFETY: for the first one.\nunsafe { g() }\nunsafe { h() }\n",
        "unsafe fn raw() {}\n",
        "#[unsafe(no_mangle)]\npub extern \"C\" fn f() {}\n",
    ] {
        assert!(!missing_safety_comments(bad).is_empty(), "{bad}");
    }
    for good in [
        "// SAFETY: g has no preconditions.\nlet x = unsafe { g() };\n",
        "    // SAFETY: spans\n    // two lines.\n    unsafe { g() }\n",
        "// SAFETY: attribute between.\n#[allow(clippy::x)]\n#[inline]\nunsafe impl Send for X {}\n",
        "/// Does things.\n///\n/// # Safety\n///\n/// `p` must be valid.\npub unsafe fn raw(p: *const u8) {}\n",
        "// SAFETY: the impl's contract.\nunsafe impl Ioctl for R {\n    fn a() {}\n    unsafe fn b() {}\n}\n",
        "// SAFETY: exported symbol, unique.\n#[unsafe(no_mangle)]\npub extern \"C\" fn f() {}\n",
    ] {
        assert_eq!(missing_safety_comments(good), [], "{good}");
    }
    // An `unsafe fn` after an `unsafe impl` has closed is not covered by it.
    let after = "// SAFETY: ok.\nunsafe impl Send for X {}\nunsafe fn later() {}\n";
    assert_eq!(
        missing_safety_comments(after),
        [Finding {
            line: 3,
            what: "unsafe fn".into()
        }]
    );
}

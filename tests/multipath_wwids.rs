//! multipathd's `wwids` file (`lunkit::multipath::remember_wwid`): the file as multipath-tools
//! writes it, one line per WWID, under multipath-tools' own lock (a POSIX write lock on the
//! whole file), which another process holds here.

// The test, not the library, spawns a process: a copy of itself that holds the lock, since
// a POSIX lock of the test's own process would not keep the library's call out.
#![allow(clippy::disallowed_methods)]

mod common;

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::Scratch;
use lunkit::multipath::{WWIDS_FILE, WWIDS_HEADER, remember_wwid};
use lunkit::{ErrorKind, Root, Wwid};

const A: &str = "naa.60014055e7a100000000000000000000";
const B: &str = "360014055e7a100000010000000000000";

fn soon() -> Instant {
    Instant::now() + Duration::from_secs(10)
}

#[test]
fn a_wwid_is_one_line_of_a_file_made_as_multipath_makes_it() {
    let s = Scratch::new("wwids-file");
    let root = Root::new(s.path());
    let a: Wwid = A.parse().unwrap();
    assert!(remember_wwid(&root, &a, soon()).unwrap());
    assert!(!remember_wwid(&root, &a, soon()).unwrap());
    // The same WWID in its other form is the same line.
    let a_mpath: Wwid = a.to_multipath().parse().unwrap();
    assert!(!remember_wwid(&root, &a_mpath, soon()).unwrap());
    assert!(remember_wwid(&root, &B.parse().unwrap(), soon()).unwrap());
    let file = s.path().join(WWIDS_FILE);
    let text = fs::read_to_string(&file).unwrap();
    assert_eq!(
        text,
        format!("{WWIDS_HEADER}/360014055e7a100000000000000000000/\n/{B}/\n")
    );
    let mode = |p: &std::path::Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&file), 0o600);
    assert_eq!(mode(file.parent().unwrap()), 0o700);
}

#[test]
fn a_file_edited_by_hand_keeps_its_lines() {
    let s = Scratch::new("wwids-hand");
    let file = s.path().join(WWIDS_FILE);
    fs::create_dir_all(file.parent().unwrap()).unwrap();
    // No header, a comment naming the WWID, and no end to the last line.
    fs::write(&file, "# /360014055e7a100000000000000000000/\n/3600a/").unwrap();
    let root = Root::new(s.path());
    assert!(remember_wwid(&root, &A.parse().unwrap(), soon()).unwrap());
    assert_eq!(
        fs::read_to_string(&file).unwrap(),
        "# /360014055e7a100000000000000000000/\n/3600a/\n/360014055e7a100000000000000000000/\n"
    );
}

/// Not a test of its own: run by the test below in a child process, it holds a POSIX write
/// lock on the file `LUNKIT_WWIDS_HOLD` names (as multipath-tools takes it) until its stdin
/// closes. A POSIX lock of this process would not keep this process's own calls out.
#[test]
fn hold_the_wwids_lock() {
    let Some(path) = std::env::var_os("LUNKIT_WWIDS_HOLD") else {
        return;
    };
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    rustix::fs::fcntl_lock(&f, rustix::fs::FlockOperation::LockExclusive).unwrap();
    println!("locked");
    std::io::stdout().flush().unwrap();
    let _ = std::io::stdin().read_line(&mut String::new());
}

#[test]
fn nothing_is_written_while_multipath_holds_the_file() {
    let s = Scratch::new("wwids-locked");
    let root = Root::new(s.path());
    let a: Wwid = A.parse().unwrap();
    assert!(remember_wwid(&root, &a, soon()).unwrap());
    let file = s.path().join(WWIDS_FILE);
    let before = fs::read_to_string(&file).unwrap();
    let mut holder = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "hold_the_wwids_lock",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("LUNKIT_WWIDS_HOLD", &file)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(holder.stdout.take().unwrap());
    let mut line = String::new();
    // libtest may print the test's name on the same line first.
    while !line.trim_end().ends_with("locked") {
        line.clear();
        assert_ne!(out.read_line(&mut line).unwrap(), 0, "the holder ended");
    }
    let b: Wwid = B.parse().unwrap();
    let e = remember_wwid(&root, &b, Instant::now() + Duration::from_millis(300)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    assert!(e.to_string().contains("multipath-tools' lock on"), "{e}");
    assert_eq!(fs::read_to_string(&file).unwrap(), before);
    drop(holder.stdin.take());
    holder.wait().unwrap();
    assert!(remember_wwid(&root, &b, soon()).unwrap());
}

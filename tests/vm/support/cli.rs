//! The lunkit command as the tests run it: the binary `cargo xtask test` names in
//! `$LUNKIT_BIN`, an account of a run for assertion messages, and reproducible data to write
//! and read back.

use std::process::{Command, Output};

/// Runs `lunkit ARGS` (`$LUNKIT_BIN`) to the end, with its output captured.
pub fn lunkit(args: &[&str]) -> Output {
    let bin = std::env::var("LUNKIT_BIN").expect("LUNKIT_BIN is set by cargo xtask test");
    Command::new(&bin).args(args).output().expect("run lunkit")
}

/// Runs `lunkit ARGS` with `input` on its stdin (`lunkit batch`), to the end, with its
/// output captured.
pub fn lunkit_with_input(args: &[&str], input: &str) -> Output {
    use std::io::Write;
    use std::process::Stdio;
    let bin = std::env::var("LUNKIT_BIN").expect("LUNKIT_BIN is set by cargo xtask test");
    let mut child = Command::new(&bin)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run lunkit");
    let mut stdin = child.stdin.take().expect("lunkit's stdin");
    stdin
        .write_all(input.as_bytes())
        .expect("write lunkit's stdin");
    drop(stdin);
    child.wait_with_output().expect("wait for lunkit")
}

/// `exit Some(0); stdout: …; stderr: …`, for assertion messages.
pub fn describe(o: &Output) -> String {
    format!(
        "exit {:?}; stdout: {}; stderr: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout).trim(),
        String::from_utf8_lossy(&o.stderr).trim(),
    )
}

/// `len` bytes of xorshift from `seed`: the same for the same seed, different for another,
/// and incompressible enough that a misplaced page or block does not compare equal.
pub fn random(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

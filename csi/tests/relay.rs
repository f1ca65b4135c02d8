//! The plugin binary against hostile HTTP/2 clients on its socket (`csi/src/authority/`): an
//! HPACK bomb, frames announcing 16 MiB, a CONTINUATION flood, a dynamic table size update to
//! 1 MiB. Each gets a GOAWAY with the error code HTTP/2 names for it and the end of its
//! connection; the plugin's peak resident memory (VmHWM) stays under 64 MiB, it logs what it
//! refused, and a normal call on a new connection is answered afterwards.
//!
//! The plugin runs under a 1 GiB address-space limit (`ulimit -v`): a relay that lets a bomb
//! through fails these tests (the plugin dies at the limit) instead of eating the host's
//! memory.

// The test starts the plugin binary; the plugin itself runs programs only through exec.rs.
#![allow(clippy::disallowed_methods)]

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use lunkit_csi::Client;
use lunkit_csi::proto::NodeGetInfoRequest;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const SETTINGS: u8 = 0x4;
const GOAWAY: u8 = 0x7;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;

const FRAME_SIZE_ERROR: u32 = 0x6;
const COMPRESSION_ERROR: u32 = 0x9;
const ENHANCE_YOUR_CALM: u32 = 0xb;

/// The most resident memory the plugin may ever have had.
const PEAK_KIB: u64 = 64 << 10;

struct Plugin {
    dir: tempfile::TempDir,
    child: Child,
}

impl Plugin {
    fn start() -> Plugin {
        let dir = tempfile::tempdir().unwrap();
        let stderr = std::fs::File::create(dir.path().join("stderr")).unwrap();
        let child = Command::new("sh")
            .args(["-c", "ulimit -v 1048576 && exec \"$0\" \"$@\""])
            .arg(env!("CARGO_BIN_EXE_lunkit-csi"))
            .arg("--endpoint")
            .arg(format!("unix://{}", dir.path().join("csi.sock").display()))
            .args(["--nodeid", "node-a", "--doctor-interval", "0"])
            .args(["--follow-discovery", "false"])
            .arg("--state-dir")
            .arg(dir.path().join("state"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .unwrap();
        let p = Plugin { dir, child };
        let limit = Instant::now() + Duration::from_secs(30);
        while !p.answers() {
            assert!(Instant::now() < limit, "the plugin did not answer in 30 s");
            std::thread::sleep(Duration::from_millis(20));
        }
        p
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("csi.sock")
    }

    /// A NodeGetInfo call on a new connection is answered.
    fn answers(&self) -> bool {
        Client::connect(&self.socket())
            .ok()
            .and_then(|mut c| c.node_get_info(NodeGetInfoRequest {}).ok())
            .is_some_and(|info| info.node_id == "node-a")
    }

    /// The plugin's peak resident memory, in KiB.
    fn peak_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .expect("the plugin is running");
        let line = status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .expect("a VmHWM line");
        line.trim().trim_end_matches("kB").trim().parse().unwrap()
    }

    /// Checks what every test ends with: the plugin's peak memory, a normal call answered,
    /// and a log line naming the refusal `code`.
    fn still_serves(self, code: &str) {
        let peak = self.peak_kib();
        eprintln!("the plugin's peak RSS: {peak} KiB");
        assert!(peak < PEAK_KIB, "the plugin's peak RSS was {peak} KiB");
        assert!(self.answers(), "a normal call after the attack");
        let log = std::fs::read_to_string(self.dir.path().join("stderr")).unwrap();
        assert!(
            log.contains("a client of the CSI socket sent") && log.contains(code),
            "{log}"
        );
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    out.extend_from_slice(&u32::try_from(payload.len()).unwrap().to_be_bytes()[1..]);
    out.extend_from_slice(&[kind, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
}

/// The preface and an empty SETTINGS frame, as a client starts.
fn opening() -> Vec<u8> {
    let mut out = PREFACE.to_vec();
    frame(&mut out, SETTINGS, 0, 0, &[]);
    out
}

/// A Probe request's header block, with `extra` literals after the pseudo-headers.
fn probe_block(enc: &mut hpack::Encoder, extra: &[(&[u8], &[u8])]) -> Vec<u8> {
    let mut headers: Vec<(&[u8], &[u8])> = vec![
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":path", b"/csi.v1.Identity/Probe"),
        (b":authority", b"localhost"),
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
    ];
    headers.extend_from_slice(extra);
    enc.encode(headers)
}

/// Sends `input` on a new connection (from a thread, then closes its sending side, after
/// `before_close` when given) and reads what comes back until the plugin closes: its frames.
fn exchange(sock: &Path, input: Arc<Vec<u8>>, before_close: Option<Arc<Barrier>>) -> Vec<Frame> {
    let s = UnixStream::connect(sock).unwrap();
    let mut w = s.try_clone().unwrap();
    let writer = std::thread::spawn(move || {
        // The plugin may close the connection before it has read it all: no error matters.
        let _ = w.write_all(&input);
        if let Some(b) = before_close {
            b.wait();
        }
        let _ = w.shutdown(std::net::Shutdown::Write);
    });
    let mut got = Vec::new();
    let mut r = &s;
    let mut buf = [0u8; 1 << 16];
    // Until the end of the stream, or a reset once what was sent is read.
    while let Ok(n @ 1..) = r.read(&mut buf) {
        got.extend_from_slice(&buf[..n]);
    }
    writer.join().unwrap();
    parse(&got)
}

#[derive(Debug)]
struct Frame {
    kind: u8,
    payload: Vec<u8>,
}

fn parse(mut rest: &[u8]) -> Vec<Frame> {
    let mut frames = Vec::new();
    while rest.len() >= 9 {
        let len = usize::from(rest[0]) << 16 | usize::from(rest[1]) << 8 | usize::from(rest[2]);
        let Some(payload) = rest.get(9..9 + len) else {
            break;
        };
        frames.push(Frame {
            kind: rest[3],
            payload: payload.to_vec(),
        });
        rest = &rest[9 + len..];
    }
    frames
}

/// The last stream and error code of the GOAWAY in `frames`, the last frame sent.
fn goaway(frames: &[Frame]) -> (u32, u32, String) {
    let last = frames.last().expect("frames from the plugin");
    assert_eq!(last.kind, GOAWAY, "the last frame is a GOAWAY: {frames:?}");
    let word = |i: usize| u32::from_be_bytes(last.payload[i..i + 4].try_into().unwrap());
    let debug = String::from_utf8_lossy(&last.payload[8..]).into_owned();
    (word(0) & 0x7fff_ffff, word(4), debug)
}

#[test]
fn an_hpack_bomb_is_refused_and_costs_no_memory() {
    let p = Plugin::start();
    // A 4 KiB entry in the client's table (4000 + 7 + 32 bytes), in a request on stream 1.
    let mut enc = hpack::Encoder::new();
    let big = vec![b'b'; 4000];
    let mut first = opening();
    frame(
        &mut first,
        HEADERS,
        END_HEADERS,
        1,
        &probe_block(&mut enc, &[(b"x-bomb", &big)]),
    );
    // Then 1 MiB of references to it (index 62, the newest entry): 4 GiB decoded, in a
    // HEADERS frame and 63 CONTINUATIONs on stream 3.
    let refs = vec![0xbe; 16 << 10];
    let mut bomb = first.clone();
    frame(&mut bomb, HEADERS, 0, 3, &refs);
    for i in 1..64 {
        let flags = if i == 63 { END_HEADERS } else { 0 };
        frame(&mut bomb, CONTINUATION, flags, 3, &refs);
    }
    let (last, code, debug) = goaway(&exchange(&p.socket(), Arc::new(bomb), None));
    assert_eq!((last, code), (1, ENHANCE_YOUR_CALM), "{debug}");
    // A bomb in one frame: 16 KiB of references, 64 MiB decoded; only the decoded list's
    // bound catches it.
    let mut small = first;
    frame(&mut small, HEADERS, END_HEADERS, 3, &refs);
    let (last, code, debug) = goaway(&exchange(&p.socket(), Arc::new(small), None));
    assert_eq!((last, code), (1, ENHANCE_YOUR_CALM), "{debug}");
    assert!(debug.contains("header list"), "{debug}");
    p.still_serves("ENHANCE_YOUR_CALM");
}

#[test]
fn frames_announcing_16_mib_are_refused_before_they_are_read() {
    let p = Plugin::start();
    // Six connections at once, each announcing a 16 MiB DATA frame and sending all of it
    // but its last byte: a relay that reads before it checks holds 96 MiB.
    let len: usize = (16 << 20) - 1;
    let mut input = opening();
    input.extend_from_slice(&u32::try_from(len).unwrap().to_be_bytes()[1..]);
    input.extend_from_slice(&[DATA, END_STREAM, 0, 0, 0, 1]);
    input.resize(input.len() + len - 1, 0);
    let input = Arc::new(input);
    let all_sent = Arc::new(Barrier::new(6));
    let threads: Vec<_> = (0..6)
        .map(|_| {
            let (sock, input, all_sent) = (p.socket(), input.clone(), all_sent.clone());
            std::thread::spawn(move || exchange(&sock, input, Some(all_sent)))
        })
        .collect();
    for t in threads {
        let (last, code, debug) = goaway(&t.join().unwrap());
        assert_eq!((last, code), (0, FRAME_SIZE_ERROR), "{debug}");
        assert!(debug.contains("16777215"), "{debug}");
    }
    p.still_serves("FRAME_SIZE_ERROR");
}

#[test]
fn a_continuation_flood_is_refused() {
    let p = Plugin::start();
    let mut enc = hpack::Encoder::new();
    let mut input = opening();
    frame(&mut input, HEADERS, 0, 1, &probe_block(&mut enc, &[]));
    // 100,000 empty CONTINUATIONs: no memory, but no end either.
    for _ in 0..100_000 {
        frame(&mut input, CONTINUATION, 0, 1, &[]);
    }
    let (last, code, debug) = goaway(&exchange(&p.socket(), Arc::new(input), None));
    assert_eq!((last, code), (0, ENHANCE_YOUR_CALM), "{debug}");
    assert!(debug.contains("CONTINUATION"), "{debug}");
    p.still_serves("ENHANCE_YOUR_CALM");
}

#[test]
fn a_table_size_update_to_1_mib_is_refused() {
    let p = Plugin::start();
    let mut enc = hpack::Encoder::new();
    let mut input = opening();
    frame(
        &mut input,
        HEADERS,
        END_HEADERS | END_STREAM,
        1,
        &probe_block(&mut enc, &[]),
    );
    // A dynamic table size update to 1 MiB (001 and a 5-bit prefix integer), then a request.
    let mut block = hpack::encoder::encode_integer(1 << 20, 5);
    block[0] |= 0x20;
    block.extend(probe_block(&mut enc, &[]));
    frame(&mut input, HEADERS, END_HEADERS | END_STREAM, 3, &block);
    let frames = exchange(&p.socket(), Arc::new(input), None);
    let (last, code, debug) = goaway(&frames);
    assert_eq!((last, code), (1, COMPRESSION_ERROR), "{debug}");
    assert!(debug.contains("1048576"), "{debug}");
    p.still_serves("COMPRESSION_ERROR");
}

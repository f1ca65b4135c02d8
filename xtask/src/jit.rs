//! The TCG code cache of a running guest, read through QEMU's human monitor (`info jit`).
//!
//! Under TCG, QEMU translates guest code into host code and keeps it in one buffer (1 GiB
//! by default, 2 GiB at most on x86-64 hosts). When the buffer is full it throws *every*
//! translation away (a "TB flush"), kernel code included, and each run after that starts
//! cold. The bench reports how many flushes its run saw, so that a run whose medians mix
//! warm and cold code says so.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::Duration;

/// How often the watcher asks; a flush count only grows, so the last answer is the total.
const POLL: Duration = Duration::from_secs(2);

/// What `info jit` said last.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CodeCache {
    /// "TB flush count": how many times the whole cache was thrown away.
    pub flushes: u64,
    /// Bytes of host code generated since the last flush, and the buffer's size.
    pub used: u64,
    pub size: u64,
}

/// Parses the output of `info jit` (QEMU 7.2: `TB flush count  N` and
/// `gen code size  USED/SIZE`). `None` when either line is missing.
pub fn parse(text: &str) -> Option<CodeCache> {
    let mut flushes = None;
    let mut gen_code = None;
    for line in text.lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix("TB flush count") {
            flushes = rest.trim().parse().ok();
        } else if let Some(rest) = line.strip_prefix("gen code size") {
            let (used, size) = rest.trim().split_once('/')?;
            gen_code = Some((used.trim().parse().ok()?, size.trim().parse().ok()?));
        }
    }
    let (used, size) = gen_code?;
    Some(CodeCache {
        flushes: flushes?,
        used,
        size,
    })
}

/// Asks the monitor on `sock` once: connect, read the greeting up to the prompt, send
/// `info jit`, read its answer up to the next prompt.
fn ask(sock: &Path) -> std::io::Result<Option<CodeCache>> {
    let stream = UnixStream::connect(sock)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    until_prompt(&mut reader)?;
    writer.write_all(b"info jit\n")?;
    Ok(parse(&until_prompt(&mut reader)?))
}

/// Reads until the monitor's `(qemu) ` prompt, which ends without a newline.
fn until_prompt(reader: &mut impl BufRead) -> std::io::Result<String> {
    let mut text = Vec::new();
    while !text.ends_with(b"(qemu) ") {
        let buf = reader.fill_buf()?;
        if buf.is_empty() {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        text.extend_from_slice(buf);
        let n = buf.len();
        reader.consume(n);
    }
    Ok(String::from_utf8_lossy(&text).into_owned())
}

/// Asks the monitor every [`POLL`] while the guest runs; the answer must be taken before
/// QEMU exits, so the last one stands for the whole run.
pub struct Watch {
    stop: Arc<AtomicBool>,
    last: Arc<Mutex<Option<CodeCache>>>,
    thread: JoinHandle<()>,
    sock: PathBuf,
}

impl Watch {
    /// Starts asking on `sock`; it may not exist yet (QEMU has not started).
    pub fn start(sock: PathBuf) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let last = Arc::new(Mutex::new(None));
        let thread = {
            let (stop, last, sock) = (stop.clone(), last.clone(), sock.clone());
            thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(Some(cache)) = ask(&sock) {
                        *last.lock().unwrap_or_else(|p| p.into_inner()) = Some(cache);
                    }
                    thread::sleep(POLL);
                }
            })
        };
        Watch {
            stop,
            last,
            thread,
            sock,
        }
    }

    /// Stops asking; the last answer, or `None` when the monitor never answered.
    pub fn finish(self) -> Option<CodeCache> {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
        let _ = std::fs::remove_file(&self.sock);
        *self.last.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `info jit` of QEMU 7.2.22 during a bench run, as the monitor sent it (the echo of
    /// the command, with its terminal escapes, cut to the command itself).
    const INFO_JIT: &str = "info jit\r\n\
        Translation buffer state:\r\n\
        gen code size       149528403/1073659904\r\n\
        TB count            265613\r\n\
        TB avg target size  18 max=2358 bytes\r\n\
        TB avg host size    321 bytes (expansion ratio: 17.0)\r\n\
        cross page TB count 804 (0%)\r\n\
        direct jump count   155919 (58%) (2 jumps=127222 47%)\r\n\
        TB hash buckets     110744/131072 (84.49% head buckets used)\r\n\
        TB hash occupancy   43.68% avg chain occ. Histogram: [0,10)%|▄ █  ▇▁▅▁▂|[90,100]%\r\n\
        TB hash avg chain   1.047 buckets. Histogram: 1|█▁▁|3\r\n\
        \r\n\
        Statistics:\r\n\
        TB flush count      0\r\n\
        TB invalidate count 22500\r\n\
        TLB full flushes    0\r\n\
        TLB partial flushes 83678\r\n\
        TLB elided flushes  183970\r\n\
        [TCG profiler not compiled]\r\n\
        (qemu) ";

    #[test]
    fn reads_the_flush_count_and_the_buffer() {
        assert_eq!(
            parse(INFO_JIT),
            Some(CodeCache {
                flushes: 0,
                used: 149528403,
                size: 1073659904
            })
        );
    }

    #[test]
    fn an_answer_without_the_flush_count_is_none() {
        let cut = INFO_JIT.split("TB flush count").next().unwrap();
        assert_eq!(parse(cut), None);
        assert_eq!(parse(&INFO_JIT.replace("/1073659904", "")), None);
        assert_eq!(
            parse(&INFO_JIT.replace("flush count      0", "flush count x")),
            None
        );
        assert_eq!(parse(""), None);
    }
}

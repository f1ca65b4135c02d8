//! Secrets on command lines: a thread reads every `/proc/*/cmdline` in a tight loop, as any
//! local user can, looking for them while a test runs what must never put one there.

use std::collections::HashSet;
use std::fs;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

/// The watching thread; [`Watcher::stop`] ends it and says what it found.
#[derive(Debug)]
pub struct Watcher {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Seen>,
}

/// What a [`Watcher`] saw.
#[derive(Debug, Default)]
pub struct Seen {
    /// How many distinct command lines held the marker (`iscsiadm`, say): a run that caught
    /// none of the commands it watched for proves nothing, and is told apart so.
    pub marked: usize,
    /// Every command line that held a secret, NULs shown as spaces.
    pub leaks: Vec<String>,
    /// How many times it read the whole of `/proc`.
    pub sweeps: usize,
}

impl Watcher {
    /// Starts watching for any of `secrets`, counting the command lines that hold `marker`.
    pub fn start(secrets: &[&str], marker: &str) -> Watcher {
        let stop = Arc::new(AtomicBool::new(false));
        let secrets: Vec<Vec<u8>> = secrets.iter().map(|s| s.as_bytes().to_vec()).collect();
        let marker = marker.as_bytes().to_vec();
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let holds = |line: &[u8], s: &[u8]| line.windows(s.len()).any(|w| w == s);
            let mut marked = HashSet::new();
            let mut seen = Seen::default();
            while !flag.load(Ordering::Relaxed) {
                let Ok(dir) = fs::read_dir("/proc") else {
                    continue;
                };
                for e in dir.flatten() {
                    let Ok(line) = fs::read(e.path().join("cmdline")) else {
                        continue;
                    };
                    if !marker.is_empty() && holds(&line, &marker) {
                        marked.insert(line.clone());
                    }
                    if secrets.iter().any(|s| holds(&line, s)) {
                        seen.leaks
                            .push(String::from_utf8_lossy(&line).replace('\0', " "));
                    }
                }
                seen.sweeps += 1;
            }
            seen.marked = marked.len();
            seen
        });
        Watcher { stop, thread }
    }

    /// Stops the watcher and returns what it saw.
    pub fn stop(self) -> Seen {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("the command-line watcher thread")
    }
}

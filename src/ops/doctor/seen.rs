//! How long a state the kernel may still recover from has lasted: a SCSI device `blocked`
//! while its transport recovers, an NVMe controller `connecting`. Such a state is normal
//! for seconds and a leftover after minutes, and sysfs keeps no time of when it began. So
//! doctor remembers when it first saw each one, in one small file in lunkit's lock
//! directory (`<lock_dir>/doctor/seen`, on `/run`, a tmpfs: forgotten at a reboot, as the
//! states are), and reports it once it has lasted past a grace.
//!
//! Times are the kernel's boot clock (`/proc/uptime`, `CLOCK_BOOTTIME`): it goes on
//! through a suspend, unlike `CLOCK_MONOTONIC`, and starts again at a reboot, as `/run`
//! does. Concurrent examinations each rewrite the file whole (renamed into place): the
//! last one wins, and a state it lost the time of is timed again from that examination.
//!
//! The file is text, a line per state: `<first seen, seconds of boot time> <key>`. A key is
//! the finding's kind, objects and identity; one that holds a line break is never stored.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::Finding;
use crate::error::{Error, Result};
use crate::root::Root;

/// The record of first sightings, read at the start of an examination and written at its
/// end with exactly the states seen in it.
#[derive(Debug)]
pub(super) struct Seen {
    /// The file; `None`: nothing is kept (every state counts as first seen now).
    path: Option<PathBuf>,
    /// Seconds of boot time, now.
    now: u64,
    /// What the file held.
    before: BTreeMap<String, u64>,
    /// The states seen in this examination, with their first sighting.
    kept: BTreeMap<String, u64>,
}

impl Seen {
    /// Reads the record below `lock_dir` (none yet is an empty one), and the boot clock.
    /// Without a lock directory nothing is remembered.
    ///
    /// # Errors
    ///
    /// `/proc/uptime` could not be read or parsed ([`Error::Io`], [`Error::Invalid`]), or the
    /// record exists and could not be read.
    pub(super) fn load(root: &Root, lock_dir: Option<&Path>) -> Result<Seen> {
        let uptime = root.proc("uptime");
        let text = std::fs::read_to_string(&uptime).map_err(|e| Error::io(&uptime, e))?;
        let now = parse_uptime(&text).ok_or_else(|| {
            Error::invalid("/proc/uptime", text.trim(), "expected seconds since boot")
        })?;
        let path = lock_dir.map(|d| d.join("doctor").join("seen"));
        let before = match &path {
            Some(p) => match std::fs::read_to_string(p) {
                Ok(text) => parse(&text),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
                Err(e) => return Err(Error::io(p, e)),
            },
            None => BTreeMap::new(),
        };
        Ok(Seen {
            path,
            now,
            before,
            kept: BTreeMap::new(),
        })
    }

    /// How long the state of `f` has been seen, counting this examination; it is kept for
    /// the next one. A first sighting is 0; one recorded in the future (a clock that went
    /// back: a record older than this boot) is taken as new.
    pub(super) fn since(&mut self, f: &Finding) -> Duration {
        let key = key(f);
        let first = match self.before.get(&key) {
            Some(&t) if t <= self.now => t,
            _ => self.now,
        };
        if !key.contains('\n') {
            self.kept.insert(key, first);
        }
        Duration::from_secs(self.now - first)
    }

    /// Writes the states seen in this examination (and only those: one that ended is
    /// forgotten, and timed anew if it comes back). Written whole and renamed into place.
    ///
    /// # Errors
    ///
    /// The directory or file could not be made or written ([`Error::Io`], naming it).
    pub(super) fn save(self) -> Result<()> {
        let Some(path) = self.path else {
            return Ok(());
        };
        if self.kept == self.before {
            return Ok(());
        }
        let dir = path.parent().unwrap_or(Path::new("."));
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| Error::io(dir, e))?;
        let tmp = dir.join(format!("seen.tmp-{}", std::process::id()));
        let write = || -> std::io::Result<()> {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&tmp)?;
            f.write_all(render(&self.kept).as_bytes())?;
            std::fs::rename(&tmp, &path)
        };
        write().map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            Error::io(&path, e)
        })
    }
}

/// A finding's key in the record: kind, objects and identity, which together name one state
/// of one object (the same controller of another subsystem is another state).
fn key(f: &Finding) -> String {
    format!(
        "{} {} {}",
        f.kind,
        f.objects.join(","),
        f.identity.as_deref().unwrap_or("-")
    )
}

/// The first field of `/proc/uptime` (`12345.67 23456.78`), in whole seconds.
pub(super) fn parse_uptime(text: &str) -> Option<u64> {
    let secs = text.split_whitespace().next()?;
    let whole = secs.split_once('.').map_or(secs, |(w, _)| w);
    whole.parse().ok()
}

/// The record's lines; a malformed line is passed over (the state is timed anew).
pub(super) fn parse(text: &str) -> BTreeMap<String, u64> {
    text.lines()
        .filter_map(|l| {
            let (t, key) = l.split_once(' ')?;
            Some((key.to_owned(), t.parse().ok()?))
        })
        .collect()
}

fn render(kept: &BTreeMap<String, u64>) -> String {
    kept.iter().map(|(k, t)| format!("{t} {k}\n")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::doctor::Kind;

    #[test]
    fn uptime_and_records_parse_and_bad_lines_are_passed_over() {
        assert_eq!(parse_uptime("12345.67 23456.78\n"), Some(12345));
        assert_eq!(parse_uptime("7 1\n"), Some(7));
        assert_eq!(parse_uptime(""), None);
        assert_eq!(parse_uptime("-1.0 2"), None);
        let m = parse("100 nvme-controller-down nvme1 nqn.x\nbad\nx y z\n5 a b\n");
        assert_eq!(m.len(), 2);
        assert_eq!(m["nvme-controller-down nvme1 nqn.x"], 100);
        assert_eq!(parse(&render(&m)), m);
    }

    fn finding(object: &str) -> Finding {
        Finding {
            kind: Kind::NvmeControllerDown,
            objects: vec![object.into()],
            why: String::new(),
            identity: Some("nqn.2014-08.org.lunkit:a".into()),
            devices: vec![],
            usage: None,
            since: None,
            queues: None,
        }
    }

    #[test]
    fn a_state_is_timed_from_its_first_sighting_and_forgotten_when_it_ends() {
        let dir = std::env::temp_dir().join(format!("lunkit-seen-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let proc = dir.join("proc");
        std::fs::create_dir_all(&proc).unwrap();
        let root = Root::new(&dir);
        let at = |secs: u64| {
            std::fs::write(proc.join("uptime"), format!("{secs}.50 1.00\n")).unwrap();
            Seen::load(&root, Some(&dir.join("locks"))).unwrap()
        };
        let (a, b) = (finding("nvme1"), finding("nvme2"));
        let mut s = at(100);
        assert_eq!(s.since(&a), Duration::ZERO);
        s.save().unwrap();
        let mut s = at(130);
        assert_eq!(s.since(&a), Duration::from_secs(30));
        assert_eq!(s.since(&b), Duration::ZERO);
        s.save().unwrap();
        // a ended (not seen at 150): forgotten; b goes on.
        let mut s = at(150);
        assert_eq!(s.since(&b), Duration::from_secs(20));
        s.save().unwrap();
        let mut s = at(160);
        assert_eq!(s.since(&a), Duration::ZERO, "a came back: timed anew");
        // A record from before a reboot (later than now) is taken as new.
        let mut s = at(10);
        assert_eq!(s.since(&b), Duration::ZERO);
        // Without a lock directory nothing is kept.
        let mut s = Seen::load(&root, None).unwrap();
        assert_eq!(s.since(&a), Duration::ZERO);
        s.save().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

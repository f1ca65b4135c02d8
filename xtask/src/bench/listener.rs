//! An independent kernel-uevent listener: its own netlink socket (group 1) and parser,
//! nothing from lunkit's code path. It gives the kernel floor (when the block device's `add`
//! arrives), and tells when the system has gone quiet after an action.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::sys::UeventSocket;
use crate::Result;

/// One kernel uevent, stamped when the listener received it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub at: Instant,
    pub seqnum: u64,
    pub action: String,
    pub devpath: String,
    pub subsystem: String,
    pub devtype: String,
}

impl Event {
    /// Parses `ACTION@DEVPATH\0KEY=VALUE\0...`; `None` for anything else (udevd's `libudev`
    /// messages never reach group 1, but a malformed datagram must not stop the listener).
    pub fn parse(buf: &[u8], at: Instant) -> Option<Self> {
        let mut fields = buf.split(|&b| b == 0).filter(|f| !f.is_empty());
        let header = std::str::from_utf8(fields.next()?).ok()?;
        let (action, devpath) = header.split_once('@')?;
        let mut ev = Self {
            at,
            seqnum: 0,
            action: action.to_owned(),
            devpath: devpath.to_owned(),
            subsystem: String::new(),
            devtype: String::new(),
        };
        for f in fields {
            let Ok(f) = std::str::from_utf8(f) else {
                continue;
            };
            match f.split_once('=') {
                Some(("SEQNUM", v)) => ev.seqnum = v.parse().ok()?,
                Some(("SUBSYSTEM", v)) => ev.subsystem = v.to_owned(),
                Some(("DEVTYPE", v)) => ev.devtype = v.to_owned(),
                _ => {}
            }
        }
        (ev.seqnum != 0).then_some(ev)
    }

    /// The `add` of SCSI device `hctl` itself (`.../target…/H:C:T:L`), which the kernel sends
    /// while the scan write is still in progress.
    pub fn is_scsi_device_add_of(&self, hctl: &str) -> bool {
        self.action == "add"
            && self.subsystem == "scsi"
            && self.devtype == "scsi_device"
            && self.devpath.ends_with(&format!("/{hctl}"))
    }

    /// The `add` of the whole disk of SCSI device `hctl` (`.../H:C:T:L/block/sdX`).
    pub fn is_disk_add_of(&self, hctl: &str) -> bool {
        self.action == "add"
            && self.subsystem == "block"
            && self.devtype == "disk"
            && self.devpath.contains(&format!("/{hctl}/block/"))
    }

    /// The `remove` of the whole disk of SCSI device `hctl`: the kernel has taken the disk
    /// away (a delete's end as the floor counts it).
    pub fn is_disk_remove_of(&self, hctl: &str) -> bool {
        self.action == "remove"
            && self.subsystem == "block"
            && self.devtype == "disk"
            && self.devpath.contains(&format!("/{hctl}/block/"))
    }
}

#[derive(Debug, Default)]
struct State {
    events: Vec<Event>,
    last_at: Option<Instant>,
    /// Receive errors (ENOBUFS: events were dropped).
    errors: u64,
}

/// The running listener; its thread lives as long as the process.
#[derive(Debug, Clone)]
pub struct Listener {
    shared: Arc<(Mutex<State>, Condvar)>,
}

impl Listener {
    pub fn start() -> Result<Self> {
        let sock = UeventSocket::open().map_err(|e| format!("uevent socket: {e}"))?;
        let shared = Arc::new((Mutex::new(State::default()), Condvar::new()));
        let me = Self {
            shared: shared.clone(),
        };
        std::thread::Builder::new()
            .name("uevent-listener".into())
            .spawn(move || {
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    let got = sock.recv(&mut buf);
                    let at = Instant::now();
                    let (lock, cv) = &*shared;
                    let mut st = lock.lock().unwrap_or_else(|e| e.into_inner());
                    match got {
                        Ok((n, 0)) => {
                            if let Some(ev) = Event::parse(&buf[..n], at) {
                                st.events.push(ev);
                                st.last_at = Some(at);
                            }
                        }
                        // Not from the kernel: ignore.
                        Ok(_) => {}
                        Err(_) => {
                            st.errors += 1;
                            st.last_at = Some(at);
                        }
                    }
                    cv.notify_all();
                }
            })?;
        Ok(me)
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.shared.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Receive errors so far (each means events were lost).
    pub fn errors(&self) -> u64 {
        self.state().errors
    }

    /// The first event after `after_seqnum` matching `want`, waiting until `deadline`.
    pub fn wait_for(
        &self,
        after_seqnum: u64,
        deadline: Instant,
        want: impl Fn(&Event) -> bool,
    ) -> Option<Event> {
        let (lock, cv) = &*self.shared;
        let mut st = lock.lock().unwrap_or_else(|e| e.into_inner());
        let mut seen = 0;
        loop {
            if let Some(ev) = st.events[seen..]
                .iter()
                .find(|e| e.seqnum > after_seqnum && want(e))
            {
                return Some(ev.clone());
            }
            seen = st.events.len();
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            st = cv
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Waits until no event has arrived for `quiet`, at most `max`; returns whether it did.
    pub fn wait_quiet(&self, quiet: Duration, max: Duration) -> bool {
        let deadline = Instant::now() + max;
        loop {
            let now = Instant::now();
            let last = self.state().last_at;
            let since = last.map_or(quiet, |t| now.saturating_duration_since(t));
            if since >= quiet {
                return true;
            }
            if now >= deadline {
                return false;
            }
            std::thread::sleep((quiet - since).min(deadline - now) + Duration::from_millis(5));
        }
    }

    /// Forgets the events so far (the list would grow across thousands of runs).
    pub fn clear(&self) {
        self.state().events.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kernel_datagrams() {
        let buf = b"add@/devices/platform/host6/session1/target6:0:0/6:0:0:3/block/sdc\0\
ACTION=add\0DEVPATH=/devices/platform/host6/session1/target6:0:0/6:0:0:3/block/sdc\0\
SUBSYSTEM=block\0MAJOR=8\0MINOR=32\0DEVNAME=sdc\0DEVTYPE=disk\0DISKSEQ=9\0SEQNUM=1402\0";
        let ev = Event::parse(buf, Instant::now()).unwrap();
        assert_eq!(ev.seqnum, 1402);
        assert_eq!(ev.subsystem, "block");
        assert!(ev.is_disk_add_of("6:0:0:3"));
        assert!(!ev.is_disk_add_of("6:0:0:30"));
        assert!(!ev.is_disk_add_of("16:0:0:3"));
        let dev = b"add@/devices/platform/host6/session1/target6:0:0/6:0:0:3\0ACTION=add\0\
SUBSYSTEM=scsi\0DEVTYPE=scsi_device\0SEQNUM=1398\0";
        let ev = Event::parse(dev, Instant::now()).unwrap();
        assert!(ev.is_scsi_device_add_of("6:0:0:3"));
        assert!(!ev.is_scsi_device_add_of("16:0:0:3"));
        assert!(!ev.is_disk_add_of("6:0:0:3"));
        let gone = b"remove@/devices/platform/host6/session1/target6:0:0/6:0:0:3/block/sdc\0\
ACTION=remove\0DEVPATH=/devices/platform/host6/session1/target6:0:0/6:0:0:3/block/sdc\0\
SUBSYSTEM=block\0DEVTYPE=disk\0SEQNUM=1500\0";
        let ev = Event::parse(gone, Instant::now()).unwrap();
        assert!(ev.is_disk_remove_of("6:0:0:3"));
        assert!(!ev.is_disk_add_of("6:0:0:3"));
        assert!(!ev.is_disk_remove_of("6:0:0:30"));
        assert!(Event::parse(b"libudev\0\xfe\xed", Instant::now()).is_none());
        assert!(Event::parse(b"add@/x\0ACTION=add\0", Instant::now()).is_none());
    }
}

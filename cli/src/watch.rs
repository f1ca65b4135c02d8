//! `lunkit watch`: print kernel uevents as they arrive, like `udevadm monitor --kernel`.

use lunkit::uevent::{Monitor, Received};

use crate::json::{self, Layout};

pub fn run(json: bool) -> lunkit::Result<()> {
    let mut m = Monitor::open()?;
    loop {
        let line = match m.recv(None)? {
            Received::Event(ev) => {
                if json {
                    json::to_text(&json::watch::Event::from(&ev), Layout::Line)
                } else {
                    format!(
                        "KERNEL {:<8} {} ({}) seq {}",
                        ev.action.as_str(),
                        ev.devpath,
                        ev.subsystem.as_deref().unwrap_or("-"),
                        ev.seqnum
                    )
                }
            }
            Received::Overflow => {
                if json {
                    json::to_text(&json::watch::Overflow::new(), Layout::Line)
                } else {
                    "OVERFLOW: events were lost (receive queue full)".to_owned()
                }
            }
            Received::TimedOut => continue,
        };
        outln!("{line}");
        // A closed pipe (`lunkit watch | head`) ends the command quietly.
        if crate::out::closed() {
            return Ok(());
        }
    }
}

//! One uevent socket for every wait of this process that overlaps in time.
//!
//! A CSI plugin attaches and detaches many volumes at once (a node drain, a StatefulSet
//! scaling). With a [`Monitor`] each, every wait had its own socket: the kernel copied each
//! uevent into every socket, and each waiter woke, received and parsed every event of every
//! other volume (32 attaches of 2 paths: 32 sockets, each about 500 events). A
//! [`Subscription`] shares one socket with the others open at the same time: each event is
//! received and parsed once, and handed to every subscription as a queued copy.
//!
//! No thread of its own: the waiters take turns reading the socket (leader and followers).
//! A waiter finding its queue empty reads the socket itself when no other waiter is, and
//! hands each event it receives to every queue; the others sleep on a condition variable
//! until an event is handed out or their wait ends. A lone waiter therefore reads its socket
//! directly, as with a [`Monitor`], and nothing is left running once the last subscription
//! is dropped: the socket is closed with it.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Instant;

use super::{Monitor, Receive, Received, Uevent};
use crate::error::Result;

/// Events queued for one subscription at most; beyond, its queue is dropped and it is told
/// [`Received::Overflow`], as the kernel tells a socket whose queue is full.
const QUEUE_MAX: usize = 4096;

/// A subscription to the kernel's uevents through the process's one shared socket.
///
/// Open it before acting, as a [`Monitor`]: every event the kernel sends after
/// [`Subscription::open`] returns reaches it. It may also get events sent shortly before,
/// still queued on a socket that was already open; a waiter treats events as hints and
/// re-checks sysfs, so an early one only wakes it.
#[derive(Debug)]
pub struct Subscription {
    hub: &'static Hub,
    id: u64,
}

impl Subscription {
    /// Joins the shared socket, opening it ([`Monitor::open`]) when no other subscription
    /// is open.
    pub fn open() -> Result<Subscription> {
        hub().join().map(|id| Subscription { hub: hub(), id })
    }
}

impl Receive for Subscription {
    /// Waits until a uevent is queued for this subscription, the shared queue overflows, or
    /// `deadline` passes (`None` waits forever), reading the socket itself while no other
    /// subscription is.
    fn recv(&mut self, deadline: Option<Instant>) -> Result<Received> {
        self.hub.recv(self.id, deadline)
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.hub.leave(self.id);
    }
}

/// The process's one hub.
fn hub() -> &'static Hub {
    static HUB: OnceLock<Hub> = OnceLock::new();
    HUB.get_or_init(Hub::default)
}

/// The shared socket and every open subscription's queue.
#[derive(Debug, Default)]
struct Hub {
    state: Mutex<State>,
    /// Signalled when events are handed out, and when the reader gives the socket back.
    handed: Condvar,
}

#[derive(Debug, Default)]
struct State {
    /// The socket while no subscription is reading it; `None` while one is (or none is open).
    idle: Option<Monitor>,
    /// A subscription has the socket out, reading it.
    reading: bool,
    queues: HashMap<u64, Queue>,
    next_id: u64,
}

#[derive(Debug, Default)]
struct Queue {
    events: VecDeque<Arc<Uevent>>,
    /// Events were lost (the socket's queue or this one overflowed) since it last received.
    overflowed: bool,
}

impl Hub {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Every change to the state is made whole under the lock: a panic elsewhere while it
        // was held leaves it true.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn join(&self) -> Result<u64> {
        let mut st = self.lock();
        if st.idle.is_none() && !st.reading {
            // Bound before this subscription counts as open: nothing sent after `open`
            // returns can be missed.
            st.idle = Some(Monitor::open()?);
        }
        let id = st.next_id;
        st.next_id += 1;
        st.queues.insert(id, Queue::default());
        Ok(id)
    }

    fn leave(&self, id: u64) {
        let mut st = self.lock();
        st.queues.remove(&id);
        if st.queues.is_empty() {
            // A reader is always a subscription, so none is reading now: the socket is idle.
            st.idle = None;
        }
    }

    fn recv(&self, id: u64, deadline: Option<Instant>) -> Result<Received> {
        let mut st = self.lock();
        loop {
            if let Some(got) = st.queues.get_mut(&id).and_then(Queue::take) {
                return Ok(got);
            }
            let now = Instant::now();
            let over = deadline.is_some_and(|d| now >= d);
            match st.idle.take() {
                // Read it: the subscriptions waiting meanwhile sleep until this hands out
                // what it got.
                Some(socket) => {
                    st.reading = true;
                    drop(st);
                    let mut turn = Turn {
                        hub: self,
                        socket: Some(socket),
                    };
                    let got = turn.read(deadline);
                    let ended;
                    (st, ended) = turn.give_back(got);
                    if let Some(ended) = ended {
                        return ended;
                    }
                }
                None if over => return Ok(Received::TimedOut),
                // Another subscription is reading: wait for what it hands out.
                None => {
                    st = match deadline {
                        Some(d) => {
                            let left = d.saturating_duration_since(now);
                            self.handed
                                .wait_timeout(st, left)
                                .unwrap_or_else(PoisonError::into_inner)
                                .0
                        }
                        None => self.handed.wait(st).unwrap_or_else(PoisonError::into_inner),
                    };
                }
            }
        }
    }

    /// Queues what the socket gave for every subscription; what ends the reader's wait
    /// instead (its deadline, an error of the socket) is returned.
    fn hand_out(st: &mut State, got: Result<Received>) -> Option<Result<Received>> {
        match got {
            Ok(Received::Event(ev)) => {
                let ev = Arc::new(ev);
                for q in st.queues.values_mut() {
                    q.push(&ev);
                }
                None
            }
            Ok(Received::Overflow) => {
                for q in st.queues.values_mut() {
                    q.lost();
                }
                None
            }
            ended @ (Ok(Received::TimedOut) | Err(_)) => Some(ended),
        }
    }
}

/// The socket taken out of the hub by the subscription reading it: given back, and the other
/// waiters woken, however the read ends (a panic included, so that they are not left
/// waiting on a socket nobody reads).
struct Turn<'a> {
    hub: &'a Hub,
    socket: Option<Monitor>,
}

impl<'a> Turn<'a> {
    fn read(&mut self, deadline: Option<Instant>) -> Result<Received> {
        match self.socket.as_mut() {
            Some(socket) => socket.recv(deadline),
            None => Ok(Received::TimedOut),
        }
    }

    /// Hands out what the read got ([`Hub::hand_out`]) and gives the socket back, in one
    /// hold of the lock.
    fn give_back(
        mut self,
        got: Result<Received>,
    ) -> (MutexGuard<'a, State>, Option<Result<Received>>) {
        let mut st = self.hub.lock();
        let ended = Hub::hand_out(&mut st, got);
        st.reading = false;
        st.idle = self.socket.take();
        self.hub.handed.notify_all();
        (st, ended)
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        if let Some(socket) = self.socket.take() {
            let mut st = self.hub.lock();
            st.reading = false;
            st.idle = Some(socket);
            self.hub.handed.notify_all();
        }
    }
}

impl Queue {
    /// What this subscription receives next: a loss first, then its oldest event.
    fn take(&mut self) -> Option<Received> {
        if std::mem::take(&mut self.overflowed) {
            return Some(Received::Overflow);
        }
        // The last holder (a lone subscription) takes the event itself, the others a copy.
        let ev = self.events.pop_front()?;
        Some(Received::Event(
            Arc::try_unwrap(ev).unwrap_or_else(|ev| Uevent::clone(&ev)),
        ))
    }

    fn push(&mut self, ev: &Arc<Uevent>) {
        if self.events.len() >= QUEUE_MAX {
            self.lost();
        } else {
            self.events.push_back(Arc::clone(ev));
        }
    }

    /// Events were lost: what is queued is dropped too, since the subscriber re-checks all.
    fn lost(&mut self) {
        self.events.clear();
        self.overflowed = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(seqnum: u64) -> Arc<Uevent> {
        let datagram = format!("change@/devices/virtual/mem/null\0SEQNUM={seqnum}\0");
        Arc::new(Uevent::parse(datagram.as_bytes()).unwrap())
    }

    fn seqnum(got: Option<Received>) -> Option<u64> {
        match got {
            Some(Received::Event(ev)) => Some(ev.seqnum),
            _ => None,
        }
    }

    #[test]
    fn a_queue_gives_its_events_in_order() {
        let mut q = Queue::default();
        q.push(&event(1));
        q.push(&event(2));
        assert_eq!(seqnum(q.take()), Some(1));
        assert_eq!(seqnum(q.take()), Some(2));
        assert!(q.take().is_none());
    }

    /// A subscriber that does not receive for a long while loses its queue and is told so,
    /// once, rather than holding every event of the node in memory.
    #[test]
    fn a_full_queue_is_dropped_and_reported_as_lost_once() {
        let mut q = Queue::default();
        for n in 0..=QUEUE_MAX as u64 {
            q.push(&event(n));
        }
        assert!(matches!(q.take(), Some(Received::Overflow)));
        assert!(q.take().is_none());
        q.push(&event(7));
        assert_eq!(seqnum(q.take()), Some(7));
    }
}

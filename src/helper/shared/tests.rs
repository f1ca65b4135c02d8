use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::*;

fn soon() -> Instant {
    Instant::now() + Duration::from_secs(30)
}

fn value(t: Taken<u32>) -> Option<u32> {
    match t {
        Taken::Shared(v) => Some(*v),
        Taken::Failed | Taken::TimedOut => None,
    }
}

#[test]
fn a_run_started_after_the_ask_is_taken_without_running_again() {
    let shared = Shared::new();
    let ticket = shared.ask();
    let lead = shared.lead().expect("nothing under way");
    assert_eq!(lead.publish(Some(7)).as_deref(), Some(&7));
    let got = ticket.take(&shared, soon(), || panic!("the lead's run was good for it"));
    assert_eq!(value(got), Some(7));
}

#[test]
fn a_run_under_way_at_the_ask_is_not_taken() {
    let shared = Shared::new();
    let lead = shared.lead().expect("nothing under way");
    assert!(shared.lead().is_none(), "one run at a time");
    let ticket = shared.ask();
    lead.publish(Some(1));
    let got = ticket.take(&shared, soon(), || Some(2));
    assert_eq!(value(got), Some(2), "it started before the ask");
}

#[test]
fn callers_that_asked_during_one_run_share_the_next() {
    let shared = Shared::new();
    let runs = AtomicUsize::new(0);
    let lead = shared.lead().expect("nothing under way");
    let tickets: Vec<Ticket> = (0..8).map(|_| shared.ask()).collect();
    let got: Vec<Option<u32>> = std::thread::scope(|s| {
        let takers: Vec<_> = tickets
            .into_iter()
            .map(|t| {
                let (shared, runs) = (&shared, &runs);
                s.spawn(move || {
                    value(t.take(shared, soon(), || {
                        runs.fetch_add(1, Ordering::SeqCst);
                        Some(2)
                    }))
                })
            })
            .collect();
        lead.publish(Some(1));
        takers.into_iter().map(|t| t.join().unwrap()).collect()
    });
    assert_eq!(got, vec![Some(2); 8]);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "one run for all eight");
}

#[test]
fn a_lead_given_up_leaves_its_waiters_to_run_their_own() {
    let shared = Shared::new();
    let ticket = shared.ask();
    let lead = shared.lead().expect("nothing under way");
    let got = std::thread::scope(|s| {
        let taker = s.spawn(|| value(ticket.take(&shared, soon(), || Some(3))));
        drop(lead);
        taker.join().unwrap()
    });
    assert_eq!(got, Some(3));
}

#[test]
fn a_failed_run_is_not_taken_by_anyone() {
    let shared: Shared<u32> = Shared::new();
    let first = shared.ask();
    assert!(matches!(
        first.take(&shared, soon(), || None),
        Taken::Failed
    ));
    let second = shared.ask();
    assert_eq!(value(second.take(&shared, soon(), || Some(4))), Some(4));
}

#[test]
fn waiting_for_another_callers_run_ends_at_the_deadline() {
    let shared: Shared<u32> = Shared::new();
    let _lead = shared.lead().expect("nothing under way");
    let ticket = shared.ask();
    let got = ticket.take(&shared, Instant::now() + Duration::from_millis(20), || {
        panic!("a run is under way: it must wait, not run")
    });
    assert!(matches!(got, Taken::TimedOut));
}

fn leaked() -> &'static Shared<u32> {
    Box::leak(Box::new(Shared::new()))
}

#[test]
fn gather_waits_for_every_caller_that_said_it_would_ask() {
    use std::sync::atomic::AtomicBool;
    let shared = leaked();
    // Nobody said anything: no wait at all, whatever the bound.
    shared.gather(soon());
    let intent = shared.intend();
    let asked = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(50));
            let _ticket = shared.ask();
            asked.store(true, Ordering::SeqCst);
            drop(intent);
        });
        shared.gather(soon());
        assert!(
            asked.load(Ordering::SeqCst),
            "gather returned before the ask"
        );
    });
}

#[test]
fn gather_ends_at_its_bound_or_when_a_run_starts() {
    let shared = leaked();
    let held = shared.intend();
    // The intent is never given up here: only the bound ends the wait.
    shared.gather(Instant::now() + Duration::from_millis(20));
    // A run under way cannot be led by the gatherer: no point in waiting.
    let lead = shared.lead().expect("nothing under way");
    shared.gather(soon());
    lead.publish(Some(1));
    drop(held);
    assert_eq!(shared.lock().intents, 0, "a dropped intent is counted out");
}

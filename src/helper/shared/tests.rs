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
    shared.gather(soon(), soon());
    let intent = shared.intend();
    let asked = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(50));
            let _ticket = shared.ask();
            asked.store(true, Ordering::SeqCst);
            drop(intent);
        });
        shared.gather(soon(), soon());
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
    shared.gather(Instant::now() + Duration::from_millis(20), soon());
    // A run under way cannot be led by the gatherer: no point in waiting.
    let lead = shared.lead().expect("nothing under way");
    shared.gather(soon(), soon());
    lead.publish(Some(1));
    drop(held);
    assert_eq!(shared.lock().intents, 0, "a dropped intent is counted out");
}

#[test]
fn a_promise_keeps_a_gather_waiting_past_its_own_bound_for_the_callers_to_come() {
    use std::sync::atomic::AtomicBool;
    let shared = leaked();
    let promise = shared.promise(2, soon());
    // The first caller claims a promised place rather than saying a new one.
    let first = shared.intend();
    let counts = |s: &State<u32>| (s.intents, s.promised);
    assert_eq!(counts(&shared.lock()), (2, 1));
    let mine = shared.ask();
    drop(first);
    let asked = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            // Later than the gather's own bound of 1 ms: only the promise keeps it waiting.
            std::thread::sleep(Duration::from_millis(50));
            let second = shared.intend();
            let theirs = shared.ask();
            asked.store(true, Ordering::SeqCst);
            drop(second);
            shared.give_up(theirs);
        });
        shared.gather(Instant::now() + Duration::from_millis(1), soon());
        assert!(
            asked.load(Ordering::SeqCst),
            "gather returned before the promised caller asked"
        );
    });
    shared.give_up(mine);
    drop(promise);
    let s = shared.lock();
    assert_eq!((s.intents, s.promised, s.promises), (0, 0, 0));
    assert!(s.gather_until.is_none() && s.open.is_empty());
}

#[test]
fn places_promised_and_never_claimed_are_withdrawn_and_never_outwait_the_deadline() {
    let shared = leaked();
    let promise = shared.promise(3, soon());
    // Promised callers that never came: the check's own deadline ends the wait, not the
    // promise's time.
    shared.gather(Instant::now(), Instant::now() + Duration::from_millis(20));
    assert!(Instant::now() < shared.lock().gather_until.unwrap());
    let claimed = shared.intend();
    drop(promise);
    assert_eq!(
        shared.lock().intents,
        1,
        "the claimed place is a caller's own now"
    );
    drop(claimed);
    assert_eq!(shared.lock().intents, 0);
    assert!(shared.lock().gather_until.is_none());
}

#[test]
fn open_tickets_say_which_runs_are_wanted() {
    let shared: Shared<u32> = Shared::new();
    let early = shared.ask();
    assert!(shared.wanted(1));
    let lead = shared.lead().expect("nothing under way");
    assert_eq!(lead.run(), 1);
    let late = shared.ask();
    shared.give_up(early);
    assert!(
        !shared.wanted(1),
        "the one open ticket asked after run 1 started"
    );
    assert!(shared.wanted(2));
    lead.publish(Some(1));
    assert_eq!(value(late.take(&shared, soon(), || Some(2))), Some(2));
    assert!(!shared.wanted(3) && shared.lock().open.is_empty());
    assert_eq!(shared.started(), 2);
}

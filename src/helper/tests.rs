use super::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};

fn subject(on: &str) -> Subject {
    Subject {
        op: "test",
        on: on.into(),
    }
}

fn soon() -> Instant {
    Instant::now() + Duration::from_millis(50)
}

/// A call on `on` that blocks until the returned sender sends (or is dropped), left to
/// its helper after timing out; the subject stays busy until then.
fn stuck(on: &str) -> mpsc::Sender<()> {
    let (release, gate) = mpsc::channel::<()>();
    let first = bounded(
        subject(on),
        soon(),
        &|| format!("call on {on}"),
        move || {
            let _ = gate.recv();
            Ok(())
        },
    );
    assert_eq!(first.unwrap_err().kind(), crate::ErrorKind::Timeout);
    release
}

#[test]
fn returns_the_result_or_times_out_naming_the_call() {
    let far = Instant::now() + Duration::from_secs(60);
    assert_eq!(
        bounded(subject("a"), far, &|| "x".into(), || Ok(7)).unwrap(),
        7
    );
    let (release, gate) = mpsc::channel::<()>();
    let err = bounded(
        subject("b"),
        soon(),
        &|| "write to scan".into(),
        move || {
            let _ = gate.recv();
            Ok(())
        },
    )
    .unwrap_err();
    assert!(
        matches!(&err, Error::Timeout { what, .. } if what == "write to scan"),
        "{err}"
    );
    drop(release);
}

#[test]
fn a_stuck_helper_is_not_joined_by_a_second_on_its_subject() {
    let release = stuck("dev");

    // The first still blocks: a second call waits for it, and does not run.
    let ran = Arc::new(AtomicBool::new(false));
    let r = ran.clone();
    let second = bounded(subject("dev"), soon(), &|| "flush of d".into(), move || {
        r.store(true, Ordering::SeqCst);
        Ok(2)
    });
    let e = second.unwrap_err();
    assert!(
        e.to_string().contains("an earlier call is still blocked"),
        "{e}"
    );
    assert!(!ran.load(Ordering::SeqCst));

    // Another subject is not held up by it.
    let far = Instant::now() + Duration::from_secs(60);
    assert_eq!(
        bounded(subject("other"), far, &|| "x".into(), || Ok(3)).unwrap(),
        3
    );

    // Once the first returns, the subject is free again.
    release.send(()).unwrap();
    assert_eq!(
        bounded(subject("dev"), far, &|| "x".into(), || Ok(4)).unwrap(),
        4
    );
}

#[test]
fn try_start_passes_over_a_busy_subject_at_once_and_not_a_free_one() {
    let release = stuck("t");

    // Busy: `None` without waiting for it, and `f` does not run.
    let ran = Arc::new(AtomicBool::new(false));
    let r = ran.clone();
    let asked = Instant::now();
    let busy = try_start(subject("t"), move || {
        r.store(true, Ordering::SeqCst);
        Ok(1)
    })
    .unwrap();
    // (Had it waited for the stuck call, which returns only on `release` below, this
    // test would never get here.)
    assert!(busy.is_none());
    assert!(!ran.load(Ordering::SeqCst));

    // Another subject runs, and reports when its call returned; once its result is in,
    // the subject is free for the next call at once.
    let far = Instant::now() + Duration::from_secs(60);
    for round in 0..50 {
        let other = try_start(subject("u"), move || Ok(round)).unwrap().unwrap();
        let (v, at) = other.wait_timed(far, &|| "x".into()).unwrap();
        assert_eq!(v, round);
        assert!(at >= asked);
    }

    // Once the stuck call returns, the subject is free again (its result went nowhere:
    // the timed-out caller is gone, so look until it is).
    release.send(()).unwrap();
    let freed = loop {
        match try_start(subject("t"), || Ok(3)).unwrap() {
            Some(p) => break p,
            None => std::thread::sleep(Duration::from_millis(1)),
        }
    };
    assert_eq!(freed.wait(far, &|| "x".into()).unwrap(), 3);
}

#[test]
fn a_waiting_call_runs_as_soon_as_the_earlier_one_returns() {
    let (release, gate) = mpsc::channel::<()>();
    let _ = bounded(subject("w"), soon(), &|| "x".into(), move || {
        let _ = gate.recv();
        Ok(0)
    });
    let releaser = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        release.send(()).unwrap();
    });
    let far = Instant::now() + Duration::from_secs(60);
    assert_eq!(
        bounded(subject("w"), far, &|| "x".into(), || Ok(5)).unwrap(),
        5
    );
    releaser.join().unwrap();
}

#[test]
fn held_descriptors_are_listed_while_held() {
    let file = std::fs::File::open("/proc/self/stat").unwrap();
    let fd = std::os::fd::AsFd::as_fd(&file);
    let dev = DevNum {
        major: 7,
        minor: 1234,
    };
    let guard = hold(fd, dev);
    assert!(held().contains(&(fd.as_raw_fd(), dev)));
    drop(guard);
    assert!(!held().contains(&(fd.as_raw_fd(), dev)));
}

fn eventually(what: &str, cond: impl Fn() -> bool) {
    let until = Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(Instant::now() < until, "{what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn warm_threads_take_calls_come_back_and_exit_when_unused() {
    // Asked twice before any is up, they are started once.
    prewarm(2);
    prewarm(2);
    eventually("two threads waiting", || idle_count() >= 2);
    std::thread::sleep(Duration::from_millis(100));
    assert!(idle_count() <= 2, "{} threads waiting", idle_count());
    assert_eq!(lock(&POOL).starting, 0);
    let before = idle_count();
    let (gate, wait) = mpsc::channel::<()>();
    let far = Instant::now() + Duration::from_secs(60);
    let call = std::thread::spawn(move || {
        bounded(subject("warm"), far, &|| "x".into(), move || {
            let _ = wait.recv();
            Ok(std::thread::current().name().map(str::to_owned))
        })
    });
    // The call took a waiting thread rather than starting its own.
    eventually("a waiting thread to take the call", || {
        idle_count() < before
    });
    gate.send(()).unwrap();
    let name = call.join().unwrap().unwrap();
    assert_eq!(name.as_deref(), Some("lunkit-helper"));
    // Back in the list after its call, and gone once nothing comes for a while.
    eventually("the threads to exit unused", || idle_count() == 0);
}

#[test]
fn fan_out_keeps_the_order_and_turns_every_panic_into_an_error() {
    let items = [1u32, 2, 3, 4];
    let doubled = fan_out("lunkit-test", &items, |i| Ok(i * 2));
    let doubled: Vec<u32> = doubled.into_iter().map(|r| r.unwrap()).collect();
    assert_eq!(doubled, [2, 4, 6, 8]);
    // A worker's panic and the calling thread's (it works the last item) alike.
    for bad in [2u32, 4] {
        let out = fan_out("lunkit-test", &items, |&i| {
            assert!(i != bad, "item {i} fails");
            Ok(i)
        });
        for (i, r) in items.iter().zip(out) {
            match r {
                Err(Error::Internal { what }) if *i == bad => {
                    assert!(what.contains("lunkit-test worker panicked"), "{what}");
                }
                Ok(v) if *i != bad => assert_eq!(v, *i),
                other => panic!("item {i}: {other:?}"),
            }
        }
    }
    assert!(fan_out("lunkit-test", &[] as &[u32], |&i| Ok(i)).is_empty());
}

//! The checker itself, on hand-made histories: it must reject the
//! anomalies a broken cluster would show (a stale read after an
//! acknowledged write, a lost write, two successful compare-and-sets from
//! one value, a read of a value nobody wrote, reads going back in time)
//! and accept histories that are linearizable only through concurrency or
//! an operation of unknown outcome.

use std::time::Instant;

use super::checker::{check, Event, Op, Ret};

/// An operation on key "k" by `client`, from `call` to `ret` (ms).
fn ev(client: usize, op: Op, ret: Ret, call: u64, returned: Option<u64>) -> Event {
    Event {
        client,
        key: "k".to_string(),
        op,
        ret,
        call: call * 1_000_000,
        returned: returned.map(|t| t * 1_000_000),
    }
}

fn put(client: usize, v: u64, call: u64, ret: u64) -> Event {
    ev(client, Op::Put(v), Ret::Put, call, Some(ret))
}

fn get(client: usize, seen: Option<u64>, call: u64, ret: u64) -> Event {
    ev(client, Op::Get, Ret::Get(seen), call, Some(ret))
}

fn cas(client: usize, expect: u64, new: u64, ok: bool, call: u64, ret: u64) -> Event {
    ev(
        client,
        Op::Cas { expect, new },
        Ret::Cas(ok),
        call,
        Some(ret),
    )
}

#[test]
fn rejects_a_stale_read_after_an_acknowledged_write() {
    // put 1, put 2 acknowledged, then a read (started later) still sees 1.
    let h = [put(0, 1, 0, 10), put(0, 2, 20, 30), get(1, Some(1), 40, 50)];
    let v = check(&h).expect_err("stale read accepted");
    assert_eq!((v.key.as_str(), v.total), ("k", 3));
    assert!(v.to_string().contains("Get -> Get(Some(1))"), "{v}");
}

#[test]
fn rejects_a_lost_write() {
    // An acknowledged put, then every later read sees the key absent.
    let h = [put(0, 7, 0, 10), get(1, None, 20, 30), get(2, None, 40, 50)];
    check(&h).expect_err("lost write accepted");
    // Also when the write was overwritten in a way that drops it: two
    // sequential puts, and a later read sees the first again.
    let h = [
        put(0, 1, 0, 10),
        put(1, 2, 5, 15),
        get(2, Some(2), 20, 25),
        get(2, Some(1), 30, 35),
    ];
    check(&h).expect_err("value came back after being overwritten");
}

#[test]
fn rejects_two_successful_compare_and_sets_from_one_value() {
    let h = [
        put(0, 1, 0, 10),
        cas(1, 1, 2, true, 20, 40),
        cas(2, 1, 3, true, 25, 45),
    ];
    check(&h).expect_err("both CAS from 1 succeeded");
    // A CAS that failed although the value it expected was there.
    let h = [put(0, 1, 0, 10), cas(1, 1, 2, false, 20, 30)];
    check(&h).expect_err("CAS failed on a matching value");
}

#[test]
fn rejects_a_read_of_a_value_nobody_wrote_and_reads_going_back() {
    check(&[get(0, Some(9), 0, 10)]).expect_err("read a value never written");
    // Two writes concurrent with each other; readers disagree on their
    // order in real time: 1 then 2 then 1 again.
    let h = [
        put(0, 1, 0, 100),
        put(1, 2, 0, 100),
        get(2, Some(1), 10, 20),
        get(2, Some(2), 30, 40),
        get(3, Some(1), 50, 60),
    ];
    check(&h).expect_err("reads went back in time");
}

#[test]
fn rejects_a_write_of_unknown_outcome_seen_before_it_was_sent() {
    let h = [
        get(0, Some(5), 0, 10),
        ev(1, Op::Put(5), Ret::Unknown, 20, None),
    ];
    check(&h).expect_err("read a value before its put was invoked");
}

#[test]
fn accepts_linearizable_histories() {
    // Sequential.
    let h = [
        get(0, None, 0, 5),
        put(0, 1, 10, 20),
        get(1, Some(1), 30, 40),
        cas(2, 1, 2, true, 50, 60),
        cas(0, 1, 3, false, 70, 80),
        get(1, Some(2), 90, 95),
    ];
    assert_eq!(check(&h).expect("sequential history"), 6);
    // Concurrent: reads overlapping a put may see the old value, then the
    // new one, as long as no read sees the old value after another read
    // that finished before it started saw the new one.
    let h = [
        put(0, 1, 0, 10),
        put(1, 2, 20, 60),
        get(2, Some(1), 25, 30),
        get(3, Some(2), 35, 40),
        get(2, Some(2), 45, 50),
    ];
    check(&h).expect("reads overlapping a put");
    // Unknown outcomes: a timed-out put that took effect later, one that
    // never did, and a timed-out CAS that did; reads that failed are
    // dropped.
    let h = [
        put(0, 1, 0, 10),
        ev(1, Op::Put(2), Ret::Unknown, 20, None),
        get(2, Some(1), 30, 40),
        get(2, Some(2), 50, 60),
        ev(3, Op::Put(3), Ret::Unknown, 55, None),
        ev(0, Op::Cas { expect: 2, new: 4 }, Ret::Unknown, 70, None),
        ev(2, Op::Get, Ret::Unknown, 75, None),
        get(2, Some(4), 80, 90),
    ];
    assert_eq!(check(&h).expect("unknown outcomes"), 7);
    // Keys are independent registers.
    let mut other = put(0, 1, 0, 10);
    other.key = "other".to_string();
    check(&[put(1, 1, 0, 10), other, get(2, Some(1), 20, 30)]).expect("two keys");
}

/// The memoised search stays fast on a long, highly concurrent history of
/// one key, for acceptance and for rejection (the case a plain
/// backtracking search blows up on).
#[test]
fn long_concurrent_histories_are_checked_quickly() {
    let (clients, rounds) = (8u64, 150u64);
    let mut h = Vec::new();
    // Rounds of `clients` fully overlapping ops: one put per round, the
    // others read the value of the previous round or this one.
    for r in 0..rounds {
        let t = r * 100;
        h.push(put(0, r + 1, t, t + 90));
        for c in 1..clients {
            let seen = match (c % 2, r) {
                (0, _) => Some(r + 1),
                (_, 0) => None,
                _ => Some(r),
            };
            h.push(get(c as usize, seen, t + 1, t + 91));
        }
    }
    let started = Instant::now();
    assert_eq!(
        check(&h).expect("good history"),
        (clients * rounds) as usize
    );
    let good = started.elapsed();
    // The same with one stale read near the end.
    let t = rounds * 100;
    h.push(get(1, Some(rounds - 5), t + 10, t + 20));
    let started = Instant::now();
    let v = check(&h).expect_err("stale read at the end");
    let bad = started.elapsed();
    assert!(v.to_string().contains("Get(Some(145))"), "{v}");
    assert!(
        good.as_secs() < 5 && bad.as_secs() < 5,
        "accept took {good:?}, reject {bad:?} on {} ops",
        h.len()
    );
}

//! The Raft and apply threads' channels (`queue.rs`): order, bound,
//! disconnection, and wake-ups across threads.

use super::*;
use std::time::Duration;

#[test]
fn items_come_out_in_the_order_they_went_in_across_batches() {
    let (tx, mut rx) = unbounded();
    for i in 0..5 {
        tx.try_send(i).unwrap();
    }
    assert_eq!(rx.try_recv(), Some(0));
    // Sent while 1..5 wait in the receiver's batch: they come after.
    tx.try_send(5).unwrap();
    let got: Vec<_> = std::iter::from_fn(|| rx.try_recv()).collect();
    assert_eq!(got, vec![1, 2, 3, 4, 5]);
    assert_eq!(rx.try_recv(), None);
}

#[test]
fn a_bounded_channel_refuses_when_full_and_takes_again_once_drained() {
    let (tx, mut rx) = bounded(2);
    tx.try_send(1).unwrap();
    tx.try_send(2).unwrap();
    assert!(matches!(tx.try_send(3), Err(TrySendError::Full(3))));
    assert_eq!(rx.try_recv(), Some(1));
    // The receiver took both in one batch: room for two more.
    tx.try_send(3).unwrap();
    tx.try_send(4).unwrap();
    assert!(matches!(tx.try_send(5), Err(TrySendError::Full(5))));
    let got: Vec<_> = std::iter::from_fn(|| rx.try_recv()).collect();
    assert_eq!(got, vec![2, 3, 4]);
}

#[test]
fn a_blocking_send_waits_for_room() {
    let (tx, mut rx) = bounded(1);
    tx.send(0).unwrap();
    let sender = std::thread::spawn(move || {
        for i in 1..100 {
            tx.send(i).unwrap();
        }
    });
    let got: Vec<_> = (0..100).map(|_| rx.recv().unwrap()).collect();
    assert_eq!(got, (0..100).collect::<Vec<_>>());
    sender.join().unwrap();
    assert_eq!(rx.recv(), None, "every sender gone, nothing left");
}

#[test]
fn sends_fail_once_the_receiver_is_gone() {
    let (tx, rx) = bounded(4);
    tx.try_send(1).unwrap();
    drop(rx);
    assert!(matches!(tx.try_send(2), Err(TrySendError::Disconnected(2))));
    assert!(tx.send(3).is_err());
}

#[test]
fn a_full_sender_parked_when_the_receiver_goes_is_released() {
    let (tx, rx) = bounded(1);
    tx.send(0).unwrap();
    let sender = std::thread::spawn(move || tx.send(1).is_err());
    // Whether or not the sender parked before this, it must end with an error.
    std::thread::sleep(Duration::from_millis(20));
    drop(rx);
    assert!(sender.join().unwrap());
}

#[test]
fn recv_reports_disconnection_after_what_was_sent() {
    let (tx, mut rx) = unbounded::<u32>();
    let tx2 = tx.clone();
    drop(tx);
    tx2.try_send(7).unwrap();
    let last = std::thread::spawn(move || {
        // Let the receiver park on an empty queue before the last sender goes.
        std::thread::sleep(Duration::from_millis(20));
        tx2.try_send(8).unwrap();
        drop(tx2);
    });
    // What was sent before the last sender went is still received.
    assert_eq!(rx.recv(), Some(7));
    assert_eq!(rx.recv(), Some(8));
    assert_eq!(rx.recv(), None);
    last.join().unwrap();
}

#[test]
fn a_parked_receiver_wakes_for_each_sender_and_loses_nothing() {
    let (tx, rx) = bounded(16);
    let receiver = std::thread::spawn(move || rx.collect::<Vec<u64>>());
    let senders: Vec<_> = (0..4u64)
        .map(|s| {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for i in 0..2_000 {
                    tx.send(s * 10_000 + i).unwrap();
                    if i % 100 == 0 {
                        // Let the receiver park now and then.
                        std::thread::sleep(Duration::from_micros(200));
                    }
                }
            })
        })
        .collect();
    drop(tx);
    for s in senders {
        s.join().unwrap();
    }
    let got = receiver.join().unwrap();
    assert_eq!(got.len(), 8_000);
    for s in 0..4u64 {
        let mine: Vec<_> = got.iter().filter(|v| **v / 10_000 == s).copied().collect();
        assert_eq!(mine, (0..2_000).map(|i| s * 10_000 + i).collect::<Vec<_>>());
    }
}

#[test]
fn a_bell_returns_at_once_while_items_wait_even_quietly_sent_ones() {
    let (tx, mut rx) = unbounded();
    let bell = rx.bell();
    tx.try_send_quiet(1).unwrap();
    assert!(tx.has_queued());
    let started = Instant::now();
    assert!(bell.wait_until(Instant::now() + Duration::from_secs(30)));
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(rx.try_recv(), Some(1));
    assert!(!tx.has_queued());
    assert!(!rx.has_taken());
}

#[test]
fn a_bell_times_out_and_wakes_for_wake_and_when_every_sender_is_gone() {
    let (tx, rx) = unbounded::<u8>();
    let bell = rx.bell();
    // Nothing queued, nobody rings: the deadline ends the wait.
    let t0 = Instant::now();
    assert!(bell.wait_until(Instant::now() + Duration::from_millis(20)));
    assert!(t0.elapsed() >= Duration::from_millis(20));

    // A wake while nobody waits is kept for the next wait.
    tx.wake();
    let started = Instant::now();
    assert!(bell.wait_until(Instant::now() + Duration::from_secs(60)));
    assert!(started.elapsed() < Duration::from_secs(30));

    let ringing = std::thread::spawn(move || {
        let woke = bell.wait_until(Instant::now() + Duration::from_secs(60));
        (woke, bell)
    });
    while !ringing.is_finished() {
        tx.wake();
        std::thread::sleep(Duration::from_millis(5));
    }
    let (woke, bell) = ringing.join().unwrap();
    assert!(woke, "senders are still there");

    let waiting =
        std::thread::spawn(move || bell.wait_until(Instant::now() + Duration::from_secs(60)));
    drop(tx);
    assert!(!waiting.join().unwrap(), "every sender is gone");
    drop(rx);
}

#[test]
fn a_quiet_send_is_refused_when_full_or_closed() {
    let (tx, rx) = bounded(1);
    tx.try_send_quiet(1).unwrap();
    assert!(matches!(tx.try_send_quiet(2), Err(TrySendError::Full(2))));
    drop(rx);
    assert!(matches!(
        tx.try_send_quiet(3),
        Err(TrySendError::Disconnected(3))
    ));
}

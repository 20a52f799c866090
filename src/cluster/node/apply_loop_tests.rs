//! The apply loop with a real store: batches queued in log order and
//! applied by several combining threads and the apply thread at once are
//! applied once each, in log order, and every proposer gets its answer.

use crate::cluster::log::catchup::Work;
use crate::cluster::log::initial_gate::InitialGate;
use crate::cluster::log::initial_gate_tests::alone;
use crate::cluster::log::queue::{self, Sender};
use crate::cluster::log::raft_status::RaftStatus;
use crate::cluster::log::waiters::Waiters;
use crate::cluster::member::applied_membership::Members;
use crate::cluster::node::apply_loop::{small, Applier, ApplyCore};
use crate::entry_bytes as entry;
use crate::mvcc::{Applied, DeleteRequest, Entry, PutRequest, RangeRequest, Store, StoreConfig};
use bytes::Bytes;
use parking_lot::Mutex;
use raft::prelude::{Entry as LogEntry, EntryType};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const KEYS: u64 = 10;
const THREADS: u64 = 4;
const BATCHES_PER_THREAD: u64 = 60;

/// An applier for a one-member cluster over `store`.
fn applier(store: Arc<Store>) -> (Applier, u64) {
    let (config, boot) = alone(
        "apply-test",
        Duration::from_millis(100),
        Duration::from_millis(1000),
    );
    let id = boot.id;
    // The Raft loop's inbox, which only membership changes and snapshot
    // captures use: neither happens here.
    let (inbox, _) = queue::bounded(16);
    let applier = Applier {
        id,
        store,
        waiters: Arc::new(Waiters::default()),
        status: Arc::new(RaftStatus::default()),
        applied: Arc::new(tokio::sync::watch::channel(0).0),
        inbox,
        term: 0,
        members: Arc::new(Members::new(&boot, &config)),
        gate: Arc::new(InitialGate::new(
            crate::cluster::log::initial_gate::WritesWaitFor {
                initial_revision: false,
                replicated_limits: false,
            },
        )),
        answers: Vec::new(),
    };
    (applier, id)
}

/// The log as the test's "Raft loop" hands it out: the next index, under
/// the lock that keeps queueing in log order (as the Raft loop's lock
/// does).
struct Log {
    next: u64,
    to_apply: Sender<Work>,
}

/// `n` committed puts from `first` on: entry `i` writes key `i % KEYS`
/// with value `i`, proposed by `proposer` as proposal `i`.
fn batch(first: u64, n: u64, proposer: u64) -> Vec<LogEntry> {
    (first..first + n)
        .map(|i| {
            let mut e = LogEntry::default();
            e.set_entry_type(EntryType::EntryNormal);
            e.set_index(i);
            e.set_term(1);
            let key = format!("k{}", i % KEYS);
            e.set_data(entry::encode(proposer, i, 0, put_value(&key, &i.to_string())).into());
            e
        })
        .collect()
}

/// Batch `b` of thread `t`: mostly small (applied by whoever combines),
/// every seventh too large for that (the apply thread's).
fn size(t: u64, b: u64) -> u64 {
    if b.is_multiple_of(7) {
        100
    } else {
        1 + (b + t) % 8
    }
}

fn put_value(key: &str, value: &str) -> Entry {
    Entry::Put(PutRequest {
        key: Bytes::copy_from_slice(key.as_bytes()),
        value: Bytes::copy_from_slice(value.as_bytes()),
        ..Default::default()
    })
}

fn value_of(store: &Store, key: &str) -> String {
    let kvs = store
        .range(&RangeRequest {
            key: Bytes::copy_from_slice(key.as_bytes()),
            ..Default::default()
        })
        .unwrap()
        .kvs;
    String::from_utf8(kvs[0].value.to_vec()).unwrap()
}

/// `applier` behind an apply core, its apply thread running; with the
/// sending side of the core's queue.
fn running(applier: Applier) -> (Arc<ApplyCore>, Sender<Work>, JoinHandle<()>) {
    let (to_apply, committed) = queue::unbounded();
    let core = ApplyCore::new(applier, committed);
    let thread = {
        let core = core.clone();
        std::thread::spawn(move || core.run())
    };
    (core, to_apply, thread)
}

/// Queues `entries` without waking the apply thread, as a round does.
fn quietly(to_apply: &Sender<Work>, entries: Vec<LogEntry>) {
    to_apply
        .try_send_quiet(Work::Entries(entries))
        .ok()
        .unwrap();
}

/// Waits until `status` shows `index` applied.
fn until_applied(status: &RaftStatus, index: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while status.applied() < index {
        assert!(
            Instant::now() < deadline,
            "applied {} of {index}",
            status.applied()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_round_thread_applies_small_batches_itself_and_wakes_the_apply_thread_for_large_ones() {
    let store = Arc::new(Store::new(StoreConfig::default()));
    let (applier, me) = applier(store.clone());
    let status = applier.status.clone();
    let (core, to_apply, apply_thread) = running(applier);
    // The apply thread parks at once; a quiet hand-off does not wake it,
    // so what is applied when `combine` returns was applied by this thread.
    quietly(&to_apply, batch(1, 3, me));
    core.combine();
    assert_eq!(status.applied(), 3);
    // Too large for a round's thread: only the apply thread, woken by
    // `combine`, applies it.
    quietly(&to_apply, batch(4, 100, me));
    core.combine();
    until_applied(&status, 103);
    // Small again, queued behind a large one: the apply thread takes both
    // in order.
    quietly(&to_apply, batch(104, 100, me));
    quietly(&to_apply, batch(204, 2, me));
    core.combine();
    until_applied(&status, 205);
    assert_eq!(value_of(&store, "k5"), "205");
    drop(to_apply);
    apply_thread.join().unwrap();
}

#[test]
fn combining_threads_and_the_apply_thread_apply_every_batch_once_in_log_order() {
    let store = Arc::new(Store::new(StoreConfig::default()));
    let start = store.current_revision();
    let (applier, me) = applier(store.clone());
    let waiters = applier.waiters.clone();
    let status = applier.status.clone();
    let applied = applier.applied.subscribe();
    let (core, to_apply, apply_thread) = running(applier);
    let log = Arc::new(Mutex::new(Log { next: 1, to_apply }));
    let total: u64 = (0..THREADS)
        .flat_map(|t| (0..BATCHES_PER_THREAD).map(move |b| size(t, b)))
        .sum();
    let answers: Vec<_> = (1..=total).map(|i| (i, waiters.wait(i))).collect();
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let (core, log) = (core.clone(), log.clone());
            std::thread::spawn(move || {
                for b in 0..BATCHES_PER_THREAD {
                    let n = size(t, b);
                    let mut log = log.lock();
                    let first = log.next;
                    log.next += n;
                    // Every fifth batch handed over with a waking send.
                    let work = Work::Entries(batch(first, n, me));
                    if b.is_multiple_of(5) {
                        log.to_apply.send(work).ok().unwrap();
                    } else {
                        log.to_apply.try_send_quiet(work).ok().unwrap();
                    }
                    drop(log);
                    core.combine();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let last = log.lock().next - 1;
    assert_eq!(last, total);
    // Nobody but the combining threads' rings woke the apply thread for
    // the large batches: they are applied without any further push.
    until_applied(&status, last);
    assert_eq!(*applied.borrow(), last);
    // Once each: one revision per entry; in log order: every key holds
    // the value of the last entry that wrote it.
    assert_eq!(store.current_revision(), start + last as i64);
    for k in 0..KEYS {
        let newest = (1..=last).rev().find(|i| i % KEYS == k).unwrap();
        assert_eq!(value_of(&store, &format!("k{k}")), newest.to_string());
    }
    // Every proposer got its own entry's result: entry i is revision
    // start + i.
    for (i, (mut rx, _pending)) in answers {
        match rx.try_recv() {
            Ok(Ok(Applied::Put(p))) => assert_eq!(p.revision, start + i as i64, "entry {i}"),
            other => panic!("entry {i} answered {other:?}"),
        }
    }
    // The queue's last sender gone, the apply thread ends.
    drop(log);
    apply_thread.join().unwrap();
}

#[test]
fn a_round_thread_takes_only_few_light_plain_entries() {
    assert!(small(&batch(1, 64, 1)));
    assert!(!small(&batch(1, 65, 1)));
    // The leader's empty entry of its term is light.
    let mut empty = LogEntry::default();
    empty.set_entry_type(EntryType::EntryNormal);
    assert!(small(&[empty]));
    // One heavy entry (`entry_weight.rs`) sends the batch to the apply
    // thread; so does a membership change.
    let mut batch = batch(1, 3, 1);
    let mut delete = LogEntry::default();
    delete.set_entry_type(EntryType::EntryNormal);
    let range = Entry::Delete(DeleteRequest {
        key: Bytes::from_static(b"a"),
        range_end: Bytes::from_static(b"\0"),
        prev_kv: false,
    });
    delete.set_data(entry::encode(1, 9, 0, range).into());
    batch.push(delete);
    assert!(!small(&batch));
    let mut change = LogEntry::default();
    change.set_entry_type(EntryType::EntryConfChange);
    assert!(!small(&[change]));
    // Bounded by bytes too: 40 puts of 8 KiB (320 KiB).
    let big: Vec<LogEntry> = (1..=40)
        .map(|i| {
            let mut e = LogEntry::default();
            e.set_entry_type(EntryType::EntryNormal);
            let value = "v".repeat(8 * 1024);
            e.set_data(entry::encode(1, i, 0, put_value("k", &value)).into());
            e
        })
        .collect();
    assert!(!small(&big));
}

//! A journal's records, replayed one by one into a fresh store, rebuild
//! exactly the state that concurrent writers built (every mix of entries,
//! errors included); and nothing is visible before the journal says it is
//! durable.

use super::super::journal::{Change, Journal, Replayed};
use super::super::*;
use super::determinism::{assert_same_state, random_entry};
use super::{b, put};
use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::SeedableRng;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// A journal in memory: records kept as the changes themselves, made
/// durable by [`InMemory::sync`] (by hand, or from a thread).
struct InMemory {
    changes: Mutex<Vec<Replayed>>,
    records: Mutex<Vec<(Option<i64>, usize)>>,
    durable: AtomicU64,
    notify: tokio::sync::watch::Sender<u64>,
    store: Mutex<Weak<Store>>,
}

impl InMemory {
    fn attach_to(store: &Arc<Store>) -> Arc<Self> {
        let journal = Arc::new(InMemory {
            changes: Mutex::new(Vec::new()),
            records: Mutex::new(Vec::new()),
            durable: AtomicU64::new(0),
            notify: tokio::sync::watch::channel(0).0,
            store: Mutex::new(Arc::downgrade(store)),
        });
        store.attach_journal(journal.clone());
        journal
    }

    /// Makes every record appended so far durable.
    fn sync(&self) {
        let (count, newest) = {
            let records = self.records.lock();
            let newest = records.iter().filter_map(|(rev, _)| *rev).max();
            (records.len() as u64, newest)
        };
        self.durable.store(count, Ordering::Release);
        self.notify.send_replace(count);
        if let (Some(rev), Some(store)) = (newest, self.store.lock().upgrade()) {
            store.journal_durable(rev);
        }
    }

    /// The records in order, as a replay reads them.
    fn read_back(&self) -> Vec<(Option<i64>, Replayed)> {
        let changes = self.changes.lock();
        self.records
            .lock()
            .iter()
            .map(|(rev, i)| {
                let change = match &changes[*i] {
                    Replayed::Write(t) => Replayed::Write(t.clone()),
                    Replayed::Entry(e) => Replayed::Entry(e.clone()),
                    Replayed::Empty => Replayed::Empty,
                };
                (*rev, change)
            })
            .collect()
    }
}

impl Journal for InMemory {
    fn encode(&self, change: Change<'_>) -> Vec<u8> {
        let mut changes = self.changes.lock();
        changes.push(match change {
            Change::Write(t) => Replayed::Write(t.clone()),
            Change::Entry(e) => Replayed::Entry(e.clone()),
            Change::Empty => Replayed::Empty,
        });
        (changes.len() - 1).to_le_bytes().to_vec()
    }

    fn append(&self, revision: Option<i64>, record: Vec<u8>) -> u64 {
        let index = usize::from_le_bytes(record.try_into().expect("an index"));
        let mut records = self.records.lock();
        records.push((revision, index));
        records.len() as u64
    }

    fn appended(&self) -> u64 {
        self.records.lock().len() as u64
    }

    fn durable(&self) -> u64 {
        self.durable.load(Ordering::Acquire)
    }

    fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.notify.subscribe()
    }
}

fn replay_into_fresh(journal: &InMemory, config: StoreConfig) -> Store {
    let fresh = Store::new(config);
    for (n, (revision, record)) in journal.read_back().into_iter().enumerate() {
        fresh
            .replay(revision, record)
            .unwrap_or_else(|e| panic!("record {n}: {e}"));
    }
    fresh
}

#[test]
fn concurrent_entries_of_every_kind_replay_to_the_same_state() {
    const THREADS: u64 = 4;
    const PER_THREAD: usize = 700;
    let store = Arc::new(Store::new(StoreConfig::default()));
    let journal = InMemory::attach_to(&store);
    let stop = Arc::new(AtomicBool::new(false));
    let syncer = {
        let (journal, stop) = (journal.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Acquire) {
                journal.sync();
                std::thread::sleep(Duration::from_micros(200));
            }
        })
    };
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || {
                let mut rng = StdRng::seed_from_u64(7_000 + t);
                let mut outcomes = (0usize, 0usize);
                for _ in 0..PER_THREAD {
                    match store.apply(random_entry(&mut rng, &store)) {
                        Ok(_) => outcomes.0 += 1,
                        Err(_) => outcomes.1 += 1,
                    }
                }
                outcomes
            })
        })
        .collect();
    let (mut ok, mut failed) = (0, 0);
    for w in workers {
        let (o, f) = w.join().expect("worker");
        ok += o;
        failed += f;
    }
    stop.store(true, Ordering::Release);
    syncer.join().unwrap();
    journal.sync();
    assert!(ok > 1_000 && failed > 50, "{ok} applied, {failed} refused");
    let records = journal.read_back();
    let without_revision = records.iter().filter(|(rev, _)| rev.is_none()).count();
    assert!(
        without_revision > 100,
        "grants, revokes and alarms were recorded: {without_revision}"
    );

    let fresh = replay_into_fresh(&journal, StoreConfig::default());
    assert_same_state(&store, &fresh, records.len());
    assert_eq!(
        super::determinism::log(&store),
        super::determinism::log(&fresh),
        "change logs"
    );
}

#[test]
fn a_revision_is_visible_only_once_its_record_is_durable() {
    let store = Arc::new(Store::new(StoreConfig::default()));
    let journal = InMemory::attach_to(&store);
    let writer = {
        let store = store.clone();
        std::thread::spawn(move || put(&store, "k", "v"))
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while journal.appended() == 0 {
        assert!(std::time::Instant::now() < deadline, "the put was recorded");
        std::thread::yield_now();
    }
    assert_eq!(store.current_revision(), 1, "not visible before durable");
    assert!(!writer.is_finished(), "not acknowledged before durable");
    let read = store
        .range(&RangeRequest {
            key: b("k"),
            ..Default::default()
        })
        .unwrap();
    assert!(read.kvs.is_empty(), "readers do not see it either");
    journal.sync();
    assert_eq!(writer.join().unwrap(), 2);
    assert_eq!(store.current_revision(), 2);
}

#[test]
fn a_change_without_a_revision_is_answered_once_durable() {
    let store = Arc::new(Store::new(StoreConfig::default()));
    let journal = InMemory::attach_to(&store);
    let granting = {
        let store = store.clone();
        std::thread::spawn(move || store.lease_grant(5, 60).map(|g| g.id))
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while journal.appended() == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the grant was recorded"
        );
        std::thread::yield_now();
    }
    std::thread::sleep(Duration::from_millis(20));
    assert!(!granting.is_finished(), "not answered before durable");
    journal.sync();
    assert_eq!(granting.join().unwrap(), Ok(5));
    let records = journal.read_back();
    assert!(matches!(
        records.as_slice(),
        [(None, Replayed::Entry(Entry::LeaseGrant { id: 5, ttl: 60 }))]
    ));
}

#[test]
fn a_snapshot_cut_and_the_records_after_it_rebuild_the_state() {
    let store = Arc::new(Store::new(StoreConfig::default()));
    let journal = InMemory::attach_to(&store);
    let syncing = |f: &dyn Fn()| {
        let j = journal.clone();
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let t = std::thread::spawn(move || {
            while !s.load(Ordering::Acquire) {
                j.sync();
                std::thread::sleep(Duration::from_micros(100));
            }
        });
        f();
        stop.store(true, Ordering::Release);
        t.join().unwrap();
        journal.sync();
    };
    syncing(&|| {
        store.lease_grant(7, 100).unwrap();
        put(&store, "a", "1");
        store
            .put(PutRequest {
                key: b("leased"),
                value: b("x"),
                lease: 7,
                ..Default::default()
            })
            .unwrap();
    });
    let cut = store.snapshot_cut();
    assert_eq!(cut.position, Some(journal.appended()));
    syncing(&|| {
        put(&store, "a", "2");
        store.lease_revoke(7).unwrap();
        store.lease_grant(8, 50).unwrap();
        store.compact(store.current_revision()).unwrap();
    });

    // A fresh store: the cut's state, then the records after its position.
    let fresh = Store::new(StoreConfig {
        initial_revision: cut.revision,
        ..Default::default()
    });
    let restored_leases = cut
        .leases
        .iter()
        .map(|l| crate::lease::RestoredLease {
            id: l.id,
            ttl: l.granted_ttl,
            remaining: Duration::from_millis(l.remaining_ms as u64),
        })
        .collect();
    fresh.load(
        cut.kvs.iter().map(|kv| (**kv).clone()).collect(),
        restored_leases,
    );
    let after = journal
        .read_back()
        .into_iter()
        .skip(cut.position.unwrap() as usize);
    for (revision, record) in after {
        fresh.replay(revision, record).unwrap();
    }
    assert_eq!(fresh.current_revision(), store.current_revision());
    assert_eq!(
        super::determinism::leases(&fresh),
        super::determinism::leases(&store)
    );
    let live = |s: &Store| s.live_kvs();
    assert_eq!(live(&fresh), live(&store));
}

#[test]
fn a_record_out_of_order_is_refused() {
    let store = Store::new(StoreConfig::default());
    let write = TxnRequest {
        compare: Vec::new(),
        success: vec![RequestOp::Put(PutRequest {
            key: b("k"),
            value: b("v"),
            ..Default::default()
        })],
        failure: Vec::new(),
    };
    let err = store
        .replay(Some(5), Replayed::Write(write.clone()))
        .unwrap_err();
    assert_eq!(err.0, "a record of revision 5 follows revision 1");
    store.replay(Some(2), Replayed::Write(write)).unwrap();
    store.replay(Some(3), Replayed::Empty).unwrap();
    assert_eq!(store.current_revision(), 3);
}

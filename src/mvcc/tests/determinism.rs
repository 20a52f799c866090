//! The apply path is deterministic: the same entries applied to two fresh
//! stores give the same responses, hashes, lease tables and change logs;
//! and entries applied concurrently give what applying them one by one, in
//! the order of their revisions, gives.

use super::super::*;
use super::b;
use crate::error::Result;
use crate::lease::LessorConfig;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::time::Instant;

const KEYS: [&str; 8] = ["a", "b", "c", "d", "k/1", "k/2", "k/3", "z"];

fn key(rng: &mut StdRng) -> bytes::Bytes {
    b(KEYS[rng.random_range(0..KEYS.len())])
}

/// A range end for `key`: a single key, a bounded range, or from-key.
fn range_end(rng: &mut StdRng) -> bytes::Bytes {
    match rng.random_range(0..6) {
        0 => b("k0"),
        1 => b("\0"),
        2 => b("e"),
        _ => bytes::Bytes::new(),
    }
}

/// A revision around the store's readable window, errors included.
fn revision(rng: &mut StdRng, store: &Store) -> i64 {
    let lo = store.compacted_revision().max(1) - 1;
    let hi = store.current_revision() + 1;
    if rng.random_bool(0.5) {
        0
    } else {
        rng.random_range(lo..=hi)
    }
}

fn random_put(rng: &mut StdRng) -> PutRequest {
    let ignore_value = rng.random_bool(0.1);
    let ignore_lease = rng.random_bool(0.1);
    PutRequest {
        key: key(rng),
        value: if ignore_value {
            bytes::Bytes::new()
        } else {
            b(&format!("v{}", rng.random_range(0..5)))
        },
        lease: if ignore_lease || rng.random_bool(0.6) {
            0
        } else {
            [1, 2, 3, 99][rng.random_range(0..4)]
        },
        prev_kv: rng.random_bool(0.5),
        ignore_value,
        ignore_lease,
    }
}

fn random_compare(rng: &mut StdRng) -> Compare {
    let n = rng.random_range(0..6);
    let target = match rng.random_range(0..6) {
        0 => CompareTarget::Version(n),
        1 => CompareTarget::Create(n),
        2 => CompareTarget::Mod(n),
        3 => CompareTarget::Lease([0, 1, 2][rng.random_range(0..3)]),
        4 => CompareTarget::Value(b(&format!("v{n}"))),
        _ => CompareTarget::Unknown,
    };
    let result = [
        CompareResult::Equal,
        CompareResult::Greater,
        CompareResult::Less,
        CompareResult::NotEqual,
        CompareResult::Unknown,
    ][rng.random_range(0..5)];
    Compare {
        result,
        target,
        key: key(rng),
        range_end: range_end(rng),
    }
}

fn random_op(rng: &mut StdRng, store: &Store, depth: u32) -> RequestOp {
    match rng.random_range(0..if depth < 2 { 4 } else { 3 }) {
        0 => RequestOp::Put(random_put(rng)),
        1 => RequestOp::Delete(DeleteRequest {
            key: key(rng),
            range_end: range_end(rng),
            prev_kv: rng.random_bool(0.5),
        }),
        2 => RequestOp::Range(RangeRequest {
            key: key(rng),
            range_end: range_end(rng),
            revision: revision(rng, store),
            limit: rng.random_range(0..3),
            ..Default::default()
        }),
        _ => RequestOp::Txn(random_txn(rng, store, depth + 1)),
    }
}

fn random_txn(rng: &mut StdRng, store: &Store, depth: u32) -> TxnRequest {
    TxnRequest {
        compare: (0..rng.random_range(0..3))
            .map(|_| random_compare(rng))
            .collect(),
        success: (0..rng.random_range(0..4))
            .map(|_| random_op(rng, store, depth))
            .collect(),
        failure: (0..rng.random_range(0..3))
            .map(|_| random_op(rng, store, depth))
            .collect(),
    }
}

pub(super) fn random_entry(rng: &mut StdRng, store: &Store) -> Entry {
    match rng.random_range(0..22) {
        0..=5 => Entry::Put(random_put(rng)),
        6..=7 => Entry::Delete(DeleteRequest {
            key: key(rng),
            range_end: range_end(rng),
            prev_kv: rng.random_bool(0.5),
        }),
        8..=13 => Entry::Txn(random_txn(rng, store, 0)),
        14 => Entry::Compact {
            revision: revision(rng, store),
        },
        15..=17 => Entry::LeaseGrant {
            id: rng.random_range(1..=4),
            ttl: rng.random_range(1..100),
        },
        18..=19 => Entry::LeaseRevoke {
            id: rng.random_range(1..=4),
        },
        // Alarms come and go, so that writes run both under them and not.
        20 => Entry::Alarm {
            action: if rng.random_bool(0.08) {
                AlarmAction::Activate
            } else {
                AlarmAction::Deactivate
            },
            member_id: 1,
            alarm: rng.random_range(1..=2),
        },
        _ => Entry::Alarm {
            action: AlarmAction::Get,
            member_id: 0,
            alarm: rng.random_range(0..=2),
        },
    }
}

/// The lease table, without anything a clock would change.
pub(super) fn leases(store: &Store) -> Vec<(i64, i64, Vec<bytes::Bytes>)> {
    let now = Instant::now();
    store
        .lessor()
        .all(true, now)
        .into_iter()
        .map(|l| (l.id, l.granted_ttl, l.keys))
        .collect()
}

pub(super) fn log(store: &Store) -> Vec<(i64, Event)> {
    let (_, events, _) = store.read_log(0, usize::MAX, usize::MAX);
    events.into_iter().map(|e| (e.revision, e.event)).collect()
}

pub(super) fn assert_same_state(a: &Store, b: &Store, step: usize) {
    assert_eq!(a.current_revision(), b.current_revision(), "step {step}");
    assert_eq!(
        a.compacted_revision(),
        b.compacted_revision(),
        "step {step}"
    );
    assert_eq!(a.hash_kv(0), b.hash_kv(0), "HashKV after step {step}");
    assert_eq!(leases(a), leases(b), "lease table after step {step}");
    assert_eq!(a.alarms(), b.alarms(), "alarms after step {step}");
}

/// What a replay exercised.
#[derive(Debug)]
struct Replayed {
    steps: usize,
    errors: usize,
    successes: usize,
    revisions: i64,
    /// Writes refused while an alarm was raised.
    refused_by_alarm: usize,
    /// Writes the space quota refused (a NoSpace with no alarm raised
    /// before the write).
    refused_by_quota: usize,
}

impl Replayed {
    /// The generator exercised both successes and etcd's errors, and
    /// writes under raised alarms.
    fn assert_exercised(&self) {
        assert!(self.errors > self.steps / 20, "{self:?}");
        assert!(self.successes > self.steps / 2, "{self:?}");
        assert!(self.revisions > self.steps as i64 / 4, "{self:?}");
        assert!(self.refused_by_alarm > 0, "{self:?}");
    }
}

/// Applies `steps` random entries to two fresh stores and compares them
/// after every step.
fn replay_twice(seed: u64, config: StoreConfig, steps: usize) -> Replayed {
    let mut rng = StdRng::seed_from_u64(seed);
    let a = Store::new(config.clone());
    let b = Store::new(config);
    let start = a.current_revision();
    let mut out = Replayed {
        steps,
        errors: 0,
        successes: 0,
        revisions: 0,
        refused_by_alarm: 0,
        refused_by_quota: 0,
    };
    for step in 0..steps {
        let entry = random_entry(&mut rng, &a);
        let no_alarm_before = a.alarms().is_empty();
        let ra: Result<Applied> = a.apply(entry.clone());
        let rb = b.apply(entry.clone());
        assert_eq!(ra, rb, "step {step}: {entry:?}");
        match &ra {
            Ok(_) => out.successes += 1,
            Err(e) => {
                out.errors += 1;
                let refused = matches!(
                    e,
                    crate::error::Error::NoSpace | crate::error::Error::Corrupt
                );
                if refused && no_alarm_before {
                    out.refused_by_quota += 1;
                } else if refused {
                    out.refused_by_alarm += 1;
                }
            }
        }
        assert_same_state(&a, &b, step);
    }
    assert_eq!(log(&a), log(&b), "change logs");
    out.revisions = a.current_revision() - start;
    out
}

#[test]
fn the_same_entries_give_the_same_state_on_two_stores() {
    for seed in 0..4 {
        replay_twice(seed, StoreConfig::default(), 1_500).assert_exercised();
    }
}

#[test]
fn determinism_holds_with_lease_adoption_and_a_bumped_start() {
    let config = StoreConfig {
        initial_revision: 1_000,
        lessor: LessorConfig {
            adopt_unknown_ttl: Some(60),
            ..Default::default()
        },
        ..Default::default()
    };
    for seed in 10..13 {
        replay_twice(seed, config.clone(), 1_500).assert_exercised();
    }
}

/// Records a log the way a member that checks its quota before proposing
/// writes one: the leader's limits first, then random entries, where an
/// entry over the recording member's quota is replaced by the NOSPACE alarm
/// it raises (and dropped once that alarm is raised).
fn record_log(seed: u64, steps: usize, recorder: &StoreConfig) -> Vec<Entry> {
    let mut rng = StdRng::seed_from_u64(seed);
    let store = Store::new(recorder.clone());
    let mut log = vec![Entry::Limits(store.own_limits())];
    store.apply(log[0].clone()).unwrap();
    while log.len() < steps {
        let entry = random_entry(&mut rng, &store);
        let entry = match store.check_space(&entry) {
            Space::Fits => entry,
            Space::Full => continue,
            Space::Raise(alarm) => alarm,
        };
        let _ = store.apply(entry.clone());
        log.push(entry);
    }
    log
}

#[test]
fn a_log_gives_the_same_answers_and_state_whatever_the_members_own_settings() {
    // The recording member: a quota the random entries reach and leave
    // again (deletes, compactions, and disarms, which name member 1).
    let recorder = StoreConfig {
        quota_bytes: Some(25_000),
        member_id: 1,
        ..Default::default()
    };
    // Members that differ in everything a member holds alone: its ID, its
    // quota (none, tiny, huge), its --max-txn-ops and lease adoption flags
    // (the log's Limits entry decides), its auth token TTL.
    let members = [
        recorder.clone(),
        StoreConfig {
            member_id: 2,
            quota_bytes: None,
            ..Default::default()
        },
        StoreConfig {
            member_id: 3,
            quota_bytes: Some(100),
            max_txn_ops: 1,
            lessor: LessorConfig {
                adopt_unknown_ttl: Some(60),
                ..Default::default()
            },
            ..Default::default()
        },
        StoreConfig {
            member_id: 0x8e9e_05c5_2164_694d,
            quota_bytes: Some(1 << 40),
            auth: crate::auth::AuthConfig {
                token_ttl: std::time::Duration::from_secs(1),
                ..Default::default()
            },
            ..Default::default()
        },
    ];
    for seed in 20..23 {
        let recorded = record_log(seed, 1_500, &recorder);
        let raised = recorded
            .iter()
            .filter(|e| matches!(e, Entry::Alarm { action: AlarmAction::Activate, alarm, .. } if *alarm == ALARM_NOSPACE))
            .count();
        let stores: Vec<Store> = members.iter().cloned().map(Store::new).collect();
        let mut refused_by_alarm = 0;
        for (step, entry) in recorded.iter().enumerate() {
            let answers: Vec<Result<Applied>> =
                stores.iter().map(|s| s.apply(entry.clone())).collect();
            for (i, answer) in answers.iter().enumerate().skip(1) {
                assert_eq!(
                    &answers[0], answer,
                    "seed {seed} step {step}, member {i}: {entry:?}"
                );
                assert_same_state(&stores[0], &stores[i], step);
            }
            refused_by_alarm += matches!(answers[0], Err(crate::error::Error::NoSpace)) as usize;
        }
        for other in &stores[1..] {
            assert_eq!(log(&stores[0]), log(other), "seed {seed}: change logs");
        }
        assert!(raised > 0, "seed {seed}: the quota never tripped");
        assert!(
            refused_by_alarm > 0,
            "seed {seed}: no write met the raised alarm"
        );
    }
}

/// The apply path's files read no clock, draw no random number and read no
/// member setting: what they decide can depend on nothing but the store
/// and the entry.
#[test]
fn the_apply_path_reads_no_clock_and_no_randomness() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/mvcc");
    for file in [
        "apply.rs",
        "write.rs",
        "compact.rs",
        "alarms.rs",
        "compare.rs",
        "locks.rs",
        "history.rs",
        "sequencer.rs",
    ] {
        let text = std::fs::read_to_string(dir.join(file)).unwrap();
        for banned in [
            "Instant::now",
            "SystemTime",
            "rand::",
            "std::env::",
            "config()",
        ] {
            let code: String = text
                .lines()
                .filter(|l| !l.trim_start().starts_with("//"))
                .collect::<Vec<_>>()
                .join("\n");
            assert!(!code.contains(banned), "{file} uses {banned}");
        }
    }
}

/// An entry that always changes something, so each one gets a revision of
/// its own: a txn whose both branches put (single-key or range compares,
/// and sometimes a range delete away from the written keys), or a put.
fn changing_entry(rng: &mut StdRng) -> Entry {
    const WRITTEN: [&str; 6] = ["a", "b", "c", "d", "e", "f"];
    let k = |rng: &mut StdRng| b(WRITTEN[rng.random_range(0..WRITTEN.len())]);
    let put = |rng: &mut StdRng, key| {
        RequestOp::Put(PutRequest {
            key,
            value: b(&format!("v{}", rng.random_range(0..4))),
            prev_kv: rng.random_bool(0.5),
            ..Default::default()
        })
    };
    if rng.random_bool(0.3) {
        let key = k(rng);
        let RequestOp::Put(p) = put(rng, key) else {
            unreachable!()
        };
        return Entry::Put(p);
    }
    let mut compare = Compare {
        result: CompareResult::Equal,
        target: CompareTarget::Version(rng.random_range(0..3)),
        key: k(rng),
        range_end: bytes::Bytes::new(),
    };
    if rng.random_bool(0.2) {
        compare.key = b("a");
        compare.range_end = b("g");
        compare.result = CompareResult::Greater;
        compare.target = CompareTarget::Mod(rng.random_range(0..50));
    }
    let (k1, k2) = (k(rng), k(rng));
    let mut success = vec![put(rng, k1.clone())];
    if k2 != k1 {
        success.push(RequestOp::Delete(DeleteRequest {
            key: k2,
            range_end: bytes::Bytes::new(),
            prev_kv: true,
        }));
    }
    if rng.random_bool(0.15) {
        success.push(RequestOp::Delete(DeleteRequest {
            key: b("x/"),
            range_end: b("x0"),
            prev_kv: false,
        }));
    }
    if rng.random_bool(0.3) {
        success.push(RequestOp::Range(RangeRequest {
            key: k(rng),
            ..Default::default()
        }));
    }
    let key = k(rng);
    let failure = vec![put(rng, key), put(rng, b("x/1"))];
    Entry::Txn(TxnRequest {
        compare: vec![compare],
        success,
        failure,
    })
}

fn revision_of(applied: &Applied) -> i64 {
    match applied {
        Applied::Put(p) => p.revision,
        Applied::Txn(t) => t.revision,
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn concurrent_writes_equal_their_serial_replay_in_revision_order() {
    const THREADS: u64 = 4;
    const PER_THREAD: usize = 600;
    let concurrent = std::sync::Arc::new(Store::new(StoreConfig::default()));
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let store = concurrent.clone();
            std::thread::spawn(move || {
                let mut rng = StdRng::seed_from_u64(100 + t);
                (0..PER_THREAD)
                    .map(|_| {
                        let entry = changing_entry(&mut rng);
                        let applied = store.apply(entry.clone()).expect("apply");
                        (revision_of(&applied), entry, applied)
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut done: Vec<(i64, Entry, Applied)> = workers
        .into_iter()
        .flat_map(|w| w.join().expect("worker"))
        .collect();
    done.sort_by_key(|(rev, _, _)| *rev);
    let revs: Vec<i64> = done.iter().map(|(rev, _, _)| *rev).collect();
    let expected: Vec<i64> = (2..2 + done.len() as i64).collect();
    assert_eq!(revs, expected, "one revision per write, none lost");

    let serial = Store::new(StoreConfig::default());
    for (rev, entry, applied) in &done {
        let replayed = serial.apply(entry.clone()).expect("replay");
        assert_eq!(&replayed, applied, "revision {rev}: {entry:?}");
    }
    assert_eq!(concurrent.hash_kv(0), serial.hash_kv(0));
    assert_eq!(log(&concurrent), log(&serial), "change logs");
}

//! Events (uncached, leased): creates attached to a shared 3660 s lease
//! (a new one every 1000 objects), updates as Range-then-Txn, direct watches,
//! paginated lists pinned to one revision, counts, and lease expiry.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ephd::proto::etcdserverpb as pb;
use ephd::proto::mvccpb::event::EventType;
use futures::stream::{self, StreamExt};

use super::apiserver::{
    b, direct_watch, text, Apiserver, LeaseManager, Ledger, Outcome, Watcher, ERR_COMPACTED,
    ERR_FUTURE_REV, EVENTS, EVENT_LEASE_TTL, LEASE_MAX_OBJECTS,
};
use crate::harness::{Ephd, Server};
use crate::support::{assert_raw_err, prefix_end};

const NAMESPACES: usize = 5;
const PER_NAMESPACE: usize = 500;

fn event_key(ns: usize, i: usize) -> String {
    format!("{EVENTS}ns-{ns}/pod-{i:04}.17f3a2b1c0d{i:04}")
}

fn event_object(ns: usize, i: usize, count: usize) -> Vec<u8> {
    format!("k8s\x00\x0a\x08v1.Event ns-{ns} pod-{i:04} count={count}").into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn events_leases_updates_lists_and_direct_watch() {
    let server = Ephd::start(&[]);
    let api = Apiserver::connect(&server.endpoint()).await;
    let ledger = Ledger::default();
    let leases = Arc::new(LeaseManager::new(api.clone(), EVENT_LEASE_TTL));

    // A direct watch as `kubectl get events -w` with RV "0" gets: page the
    // list (limit 10000), then watch from header.revision + 1.
    let initial = api.list(EVENTS, 10_000, 0).await.expect("initial list");
    assert!(initial.kvs.is_empty());
    let watch = Watcher::open(api.channel(), direct_watch(EVENTS, initial.revision + 1)).await;

    // 2500 event creates, 32 in flight, each with the manager's lease.
    let total = NAMESPACES * PER_NAMESPACE;
    let created: Vec<(usize, usize, i64, i64)> = stream::iter(0..total)
        .map(|n| {
            let api = api.clone();
            let leases = leases.clone();
            async move {
                let (ns, i) = (n % NAMESPACES, n / NAMESPACES);
                let lease = leases.get_lease().await;
                let rev = api
                    .create(&event_key(ns, i), &event_object(ns, i, 1), lease)
                    .await
                    .expect("create Txn")
                    .expect("event did not exist");
                (ns, i, rev, lease)
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    let mut lease_of: HashMap<String, i64> = HashMap::new();
    for (ns, i, rev, lease) in &created {
        ledger.put(*rev, &event_key(*ns, *i), &event_object(*ns, *i, 1));
        lease_of.insert(event_key(*ns, *i), *lease);
    }
    let granted = leases.granted();
    assert_eq!(
        granted.len(),
        total.div_ceil(LEASE_MAX_OBJECTS),
        "one lease per 1000 objects"
    );
    for (n, id) in granted.iter().enumerate() {
        let ttl = api.time_to_live(*id, true).await;
        assert_eq!(ttl.granted_ttl, EVENT_LEASE_TTL);
        assert!(ttl.ttl > EVENT_LEASE_TTL - 60 && ttl.ttl <= EVENT_LEASE_TTL);
        let want = LEASE_MAX_OBJECTS.min(total - n * LEASE_MAX_OBJECTS);
        assert_eq!(ttl.keys.len(), want, "keys attached to lease #{n}");
        for k in &ttl.keys {
            assert_eq!(
                lease_of[&text(k)],
                *id,
                "{} attached to the wrong lease",
                text(k)
            );
        }
    }

    // Updates (uncached): Range, then Txn on its mod_revision, with the lease
    // the manager hands out now.
    for n in 0..300 {
        let (ns, i) = (n % NAMESPACES, n * 7 % PER_NAMESPACE);
        let key = event_key(ns, i);
        let (_, kv) = api.get(&key).await.expect("get");
        let kv = kv.expect("event exists");
        let lease = leases.get_lease().await;
        let count = kv.version as usize + 1;
        let value = event_object(ns, i, count);
        match api
            .update(&key, &value, lease, kv.mod_revision)
            .await
            .expect("Txn")
        {
            Outcome::Done(rev) => {
                assert!(rev > kv.mod_revision);
                ledger.put(rev, &key, &value);
                lease_of.insert(key.clone(), lease);
                let (_, now) = api.get(&key).await.expect("get");
                let now = now.expect("exists");
                assert_eq!(
                    (
                        now.mod_revision,
                        now.version,
                        now.lease,
                        now.create_revision
                    ),
                    (rev, kv.version + 1, lease, kv.create_revision)
                );
            }
            other => panic!("update of {key}: {other:?}"),
        }
        // Retrying the same update from the stale read: conflict with the
        // object just written.
        if n % 50 == 0 {
            match api
                .update(&key, b"stale", lease, kv.mod_revision)
                .await
                .expect("Txn")
            {
                Outcome::Conflict(cur) => assert_eq!(cur.value.as_ref(), value.as_slice()),
                other => panic!("stale event update: {other:?}"),
            }
        }
    }

    // Paginated lists pinned to the first page's revision while writers keep
    // creating events in the middle of the key space and deleting others.
    let writer = {
        let api = api.clone();
        let ledger = ledger.clone();
        tokio::spawn(async move {
            for n in 0..150 {
                let key = format!("{EVENTS}ns-2/pod-0250.z{n:04}");
                let rev = api
                    .create(&key, b"k8s\x00late", 0)
                    .await
                    .expect("Txn")
                    .expect("new");
                ledger.put(rev, &key, b"k8s\x00late");
                if n % 3 == 0 {
                    let victim = event_key(n % NAMESPACES, 400 + n / 3);
                    let (_, kv) = api.get(&victim).await.expect("get");
                    let kv = kv.expect("victim exists");
                    match api.delete(&victim, kv.mod_revision).await.expect("Txn") {
                        Outcome::Done(rev) => ledger.delete(rev, victim.as_bytes()),
                        other => panic!("delete {victim}: {other:?}"),
                    }
                }
            }
        })
    };
    let mut lists = Vec::new();
    for limit in [500, 333, 100] {
        let listed = api.list(EVENTS, limit, 0).await.expect("paged list");
        lists.push((EVENTS.to_string(), listed));
    }
    let ns2 = format!("{EVENTS}ns-2/");
    let listed = api.list(&ns2, 64, 0).await.expect("namespace list");
    lists.push((ns2, listed));
    writer.await.expect("writer task");
    for (prefix, listed) in &lists {
        let want = ledger.state_at(prefix, listed.revision);
        let got: BTreeMap<Bytes, Bytes> = listed
            .kvs
            .iter()
            .map(|kv| (kv.key.clone(), kv.value.clone()))
            .collect();
        assert_eq!(
            got.len(),
            want.len(),
            "list of {prefix} at {} ({} pages)",
            listed.revision,
            listed.pages
        );
        assert!(
            got == want,
            "list of {prefix} at {} differs from the writes",
            listed.revision
        );
        assert!(listed.pages > 1, "the list was paged");
    }
    let lists: Vec<_> = lists.into_iter().map(|(_, l)| l).collect();

    // Deterministically: page 1, then a create and a delete behind the
    // continue key, then page 2 pinned to page 1's revision sees neither.
    let ns3 = format!("{EVENTS}ns-3/");
    let end: Bytes = prefix_end(ns3.as_bytes()).into();
    let p1 = api
        .range(pb::RangeRequest {
            key: b(&ns3),
            range_end: end.clone(),
            limit: 10,
            ..Default::default()
        })
        .await
        .expect("page 1");
    let pinned = p1.header.as_ref().expect("header").revision;
    assert!(p1.more && p1.count > 10 && p1.kvs.len() == 10);
    let late = format!("{EVENTS}ns-3/pod-0499.zzz");
    let rev = api
        .create(&late, b"late", 0)
        .await
        .expect("Txn")
        .expect("new");
    ledger.put(rev, &late, b"late");
    let victim = event_key(3, 499);
    let (_, kv) = api.get(&victim).await.expect("get");
    match api
        .delete(&victim, kv.expect("exists").mod_revision)
        .await
        .expect("Txn")
    {
        Outcome::Done(rev) => ledger.delete(rev, victim.as_bytes()),
        other => panic!("{other:?}"),
    }
    let mut cont = p1.kvs.last().expect("kvs").key.to_vec();
    cont.push(0);
    let p2 = api
        .range(pb::RangeRequest {
            key: cont.into(),
            range_end: end,
            revision: pinned,
            ..Default::default()
        })
        .await
        .expect("page 2");
    assert_eq!(p2.count, p1.count - 10);
    assert_eq!(p2.kvs.len() as i64, p2.count);
    assert!(!p2.more);
    assert!(p2.header.as_ref().expect("header").revision > pinned);
    assert_eq!(p2.kvs.last().expect("kvs").key.as_ref(), victim.as_bytes());
    assert!(p2.kvs.iter().all(|kv| kv.key.as_ref() != late.as_bytes()));

    // A list at an exact older revision (RV=X, resourceVersionMatch=Exact)
    // sees that revision's state, and a continue from it stays there.
    let old = lists[0].revision;
    let again = api.list(EVENTS, 1000, old).await.expect("exact-RV list");
    assert_eq!(again.kvs, lists[0].kvs);
    // A future revision is ErrFutureRev.
    let current = api.current_rv(EVENTS).await;
    assert_raw_err(
        api.range(pb::RangeRequest {
            key: b(EVENTS),
            range_end: prefix_end(EVENTS.as_bytes()).into(),
            limit: 500,
            revision: current + 1000,
            ..Default::default()
        })
        .await,
        tonic::Code::OutOfRange,
        ERR_FUTURE_REV,
    );

    // An unpaged list: everything, `more` false, count == len.
    let live = ledger.state_at(EVENTS, i64::MAX);
    let unpaged = api.list(EVENTS, 0, 0).await.expect("unpaged");
    assert_eq!(unpaged.pages, 1);
    assert_eq!(unpaged.kvs.len(), live.len());
    // Stats(): count_only.
    assert_eq!(api.count(EVENTS).await, live.len() as i64);
    assert_eq!(api.count(&format!("{EVENTS}ns-9/")).await, 0);
    // 1.34+ getKeys: keys_only.
    let keys = api
        .range(pb::RangeRequest {
            key: b(EVENTS),
            range_end: prefix_end(EVENTS.as_bytes()).into(),
            keys_only: true,
            ..Default::default()
        })
        .await
        .expect("keys_only");
    assert_eq!(keys.count, live.len() as i64);
    assert!(keys.kvs.iter().all(|kv| kv.value.is_empty()));
    assert!(keys.kvs.iter().map(|kv| &kv.key).eq(live.keys()));

    // The direct watch saw every write exactly once, in order, with prev_kv
    // on every update and delete.
    let writes = ledger.writes();
    let last = writes.last().expect("writes").rev;
    watch
        .wait_for("direct watch catches up", Duration::from_secs(10), |s| {
            s.rv >= last
        })
        .await;
    watch.assert_matches(EVENTS, &writes);
    watch.seen(|s| {
        assert!(s.progress.is_empty(), "no progress_notify was asked for");
        let deletes = s
            .events
            .iter()
            .filter(|e| e.r#type == EventType::Delete as i32)
            .count();
        assert_eq!(deletes, 51, "50 deletes while listing, 1 between pages");
    });

    // Compacted history: a list at a compacted revision is 410 Gone.
    api.compact(old).await.expect("compact");
    assert_raw_err(
        api.list(EVENTS, 500, old - 1).await.map(|l| l.revision),
        tonic::Code::OutOfRange,
        ERR_COMPACTED,
    );
    let at_compaction = api
        .list(EVENTS, 500, old)
        .await
        .expect("the compacted revision itself");
    assert_eq!(at_compaction.kvs, lists[0].kvs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn expired_event_lease_deletes_all_its_keys_at_one_revision() {
    let server = Ephd::start(&[]);
    let api = Apiserver::connect(&server.endpoint()).await;
    let ledger = Ledger::default();
    let long = api.grant(EVENT_LEASE_TTL).await;
    let granted_at = Instant::now();
    let short = api.grant(2).await;
    let watch = Watcher::open(
        api.channel(),
        direct_watch(EVENTS, api.current_rv(EVENTS).await + 1),
    )
    .await;

    const SHORT: usize = 40;
    for i in 0..SHORT {
        let key = event_key(0, i);
        let rev = api
            .create(&key, &event_object(0, i, 1), short)
            .await
            .expect("Txn")
            .expect("created");
        ledger.put(rev, &key, &event_object(0, i, 1));
    }
    // Some of them are updated (still on the short lease), one moves to the
    // long lease (a later GuaranteedUpdate with a fresh lease): it must
    // survive the short lease.
    for i in 0..5 {
        let key = event_key(0, i);
        let (_, kv) = api.get(&key).await.expect("get");
        let kv = kv.expect("exists");
        let lease = if i == 0 { long } else { short };
        let value = event_object(0, i, 2);
        match api
            .update(&key, &value, lease, kv.mod_revision)
            .await
            .expect("Txn")
        {
            Outcome::Done(rev) => ledger.put(rev, &key, &value),
            other => panic!("{other:?}"),
        }
    }
    for i in 0..5 {
        let key = event_key(1, i);
        let rev = api
            .create(&key, &event_object(1, i, 1), long)
            .await
            .expect("Txn")
            .expect("created");
        ledger.put(rev, &key, &event_object(1, i, 1));
    }

    // Expiry: every key still on the short lease goes at one revision.
    let deleted_keys = SHORT - 1;
    watch
        .wait_for("short lease expiry", Duration::from_secs(8), |s| {
            s.events
                .iter()
                .filter(|e| e.r#type == EventType::Delete as i32)
                .count()
                >= deleted_keys
        })
        .await;
    let elapsed = granted_at.elapsed();
    assert!(
        elapsed >= Duration::from_millis(1900),
        "keys deleted {elapsed:?} after a 2 s grant"
    );
    watch.assert_clean();
    let deletes: Vec<_> = watch.seen(|s| {
        s.events
            .iter()
            .filter(|e| e.r#type == EventType::Delete as i32)
            .cloned()
            .collect()
    });
    assert_eq!(deletes.len(), deleted_keys, "exactly the short-lease keys");
    let rev = deletes[0].kv.as_ref().expect("kv").mod_revision;
    let state = ledger.state_at(EVENTS, i64::MAX);
    for e in &deletes {
        let kv = e.kv.as_ref().expect("kv");
        assert_eq!(
            kv.mod_revision, rev,
            "every expired key deleted at ONE revision"
        );
        let prev = e.prev_kv.as_ref().expect("DELETE carries prev_kv");
        assert_eq!(prev.lease, short);
        assert_eq!(
            Some(&prev.value),
            state.get(&kv.key),
            "prev_kv is the last value"
        );
        ledger.delete(rev, &kv.key);
    }
    let writes = ledger.writes();
    watch.assert_matches(EVENTS, &writes);
    assert!(
        rev > writes
            .iter()
            .filter(|w| w.value.is_some())
            .map(|w| w.rev)
            .max()
            .unwrap()
    );

    // What is left: the moved key and the long-lease keys.
    let listed = api.list(EVENTS, 0, 0).await.expect("list");
    let keys: Vec<String> = listed.kvs.iter().map(|kv| text(&kv.key)).collect();
    let mut want = vec![event_key(0, 0)];
    want.extend((0..5).map(|i| event_key(1, i)));
    assert_eq!(keys, want);
    assert!(listed.kvs.iter().all(|kv| kv.lease == long));
    assert_eq!(api.count(EVENTS).await, 6);
    let gone = api.time_to_live(short, false).await;
    assert_eq!(gone.ttl, -1, "the expired lease is gone");
    let kept = api.time_to_live(long, true).await;
    assert_eq!(kept.keys.len(), 6);
}

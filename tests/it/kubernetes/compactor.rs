//! The apiserver's compactor (`compact.go`): the `compact_rev_key` CAS loop,
//! `Compact` on the previous tick's revision, what reads and watches below
//! the compaction get, the 1.34+ compaction watcher, the health probe, and
//! two apiservers racing the CAS.

use ephd::proto::etcdserverpb as pb;
use ephd::proto::mvccpb::event::EventType;

use super::apiserver::{
    b, header_rev, text, Apiserver, Compactor, Tick, Watcher, COMPACT_REV_KEY, ERR_COMPACTED,
    ERR_FUTURE_REV, LEASES,
};
use crate::harness::{Ephd, Server};
use crate::support::{assert_raw_err, ephd};

async fn heartbeat(api: &Apiserver, n: usize) -> i64 {
    let key = format!("{LEASES}kube-node-lease/node-{}", n % 4);
    let (_, kv) = api.get(&key).await.expect("get");
    let rev = kv.map_or(0, |kv| kv.mod_revision);
    match api
        .update(&key, format!("renew-{n}").as_bytes(), 0, rev)
        .await
        .expect("Txn")
    {
        super::apiserver::Outcome::Done(r) => r,
        other => panic!("heartbeat: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compactor_loop_compacts_the_previous_ticks_revision() {
    let server = Ephd::start(&[]);
    let api = Apiserver::connect(&server.endpoint()).await;

    // ephd (revision continuity) pre-creates compact_rev_key: a fresh
    // apiserver (local version 0) loses its first CAS and adopts version 1;
    // its value is the start revision (1.34+ parses it).
    let start = api.current_rv(LEASES).await;
    let mut c = Compactor::default();
    match c.tick(&api).await {
        Tick::Lost { version, value } => {
            assert_eq!(version, 1);
            let v: i64 = text(&value)
                .parse()
                .expect("compact_rev_key holds an integer");
            assert!(
                v > 0 && v <= start,
                "compact_rev_key = {v}, start revision {start}"
            );
        }
        other => panic!("first tick against ephd: {other:?}"),
    }
    let r1 = c.rev;
    assert_eq!(c.time, 1);

    // The 1.34+ compaction watcher: Get, then watch from header.revision.
    let (h, kv) = api.get(COMPACT_REV_KEY).await.expect("get");
    assert!(kv.is_some());
    let cwatch = Watcher::open(
        api.channel(),
        pb::WatchCreateRequest {
            key: b(COMPACT_REV_KEY),
            start_revision: h,
            ..Default::default()
        },
    )
    .await;

    let mut last = 0;
    for n in 0..10 {
        last = heartbeat(&api, n).await;
    }
    assert!(last > r1);
    // Second tick wins (version 1 → 2), writes itoa(r1) and compacts at r1.
    match c.tick(&api).await {
        Tick::Won {
            compacted: Some((rev, Ok(_))),
        } => assert_eq!(rev, r1),
        other => panic!("second tick: {other:?}"),
    }
    assert_eq!(c.time, 2);
    let r2 = c.rev;
    assert!(r2 > last, "the CAS put got a new revision");
    let (_, kv) = api.get(COMPACT_REV_KEY).await.expect("get");
    let kv = kv.expect("compact_rev_key");
    assert_eq!((kv.version, text(&kv.value)), (2, r1.to_string()));
    assert_eq!(kv.mod_revision, r2);

    // The compaction watcher sees the CAS put with the new value.
    cwatch
        .wait_for("compaction watcher event", crate::support::WAIT, |s| {
            s.events.iter().any(|e| {
                e.r#type == EventType::Put as i32
                    && e.kv.as_ref().is_some_and(|kv| kv.value == r1.to_string())
            })
        })
        .await;
    cwatch.assert_clean();

    // Reads below the compaction are 410; the compacted revision itself and
    // everything after stay readable.
    let key = format!("{LEASES}kube-node-lease/node-1");
    assert_raw_err(
        api.get_at(&key, r1 - 1).await,
        tonic::Code::OutOfRange,
        ERR_COMPACTED,
    );
    let (hrev, _) = api
        .get_at(&key, r1)
        .await
        .expect("read at the compacted revision");
    assert!(hrev >= r2, "header.revision is the current revision");
    assert_raw_err(
        api.list(LEASES, 2, r1 - 1).await.map(|l| l.revision),
        tonic::Code::OutOfRange,
        ERR_COMPACTED,
    );
    let listed = api
        .list(LEASES, 2, r1)
        .await
        .expect("list at the compaction");
    assert!(listed.kvs.is_empty(), "r1 precedes every heartbeat");
    let listed = api
        .list(LEASES, 2, r2)
        .await
        .expect("list after the compaction");
    assert_eq!((listed.kvs.len(), listed.pages), (4, 2));

    // A watch from below the compaction: created, then canceled with
    // compact_revision (the client's ErrCompacted → 410 → relist).
    let w = Watcher::open(api.channel(), super::apiserver::cache_watch(LEASES, r1 - 1)).await;
    let cancel = w.canceled().await;
    assert_eq!(cancel.compact_revision, r1);
    assert!(cancel.events.is_empty());
    assert_eq!(cancel.watch_id, w.watch_id);
    // From the compacted revision itself: fine, and it replays history.
    let w = Watcher::open(api.channel(), super::apiserver::cache_watch(LEASES, r1)).await;
    let n = heartbeat(&api, 99).await;
    w.wait_for("replay and live", crate::support::WAIT, |s| s.rv >= n)
        .await;
    w.assert_clean();
    w.seen(|s| {
        assert!(s.canceled.is_none());
        assert!(s
            .events
            .iter()
            .all(|e| e.kv.as_ref().unwrap().mod_revision >= r1));
    });

    // Compact's own errors: a future revision, and at/below the compaction.
    let current = api.current_rv(LEASES).await;
    assert_raw_err(
        api.compact(current + 10).await,
        tonic::Code::OutOfRange,
        ERR_FUTURE_REV,
    );
    assert_raw_err(
        api.compact(r1).await,
        tonic::Code::OutOfRange,
        ERR_COMPACTED,
    );

    // The health probe answers without error (the key does not exist).
    api.health().await.expect("health Get");

    // More ticks with traffic in between: each wins and compacts at the
    // previous tick's revision.
    for t in 3..6i64 {
        let prev = c.rev;
        heartbeat(&api, t as usize).await;
        match c.tick(&api).await {
            Tick::Won {
                compacted: Some((rev, Ok(_))),
            } => assert_eq!(rev, prev),
            other => panic!("tick {t}: {other:?}"),
        }
        assert_eq!(c.time, t);
        assert_raw_err(
            api.get_at(&key, prev - 1).await,
            tonic::Code::OutOfRange,
            ERR_COMPACTED,
        );
    }
    api.health().await.expect("health Get");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compactor_bootstraps_compact_rev_key_in_etcd_mode() {
    // Without revision continuity there is no compact_rev_key: the first
    // CAS (VERSION == 0 on a missing key) wins and creates it; the first
    // tick never compacts.
    let server = ephd(&[]);
    let api = Apiserver::connect(&server.endpoint()).await;
    let (h, kv) = api.get(COMPACT_REV_KEY).await.expect("get");
    assert!(kv.is_none());
    assert_eq!(h, 1);
    let mut c = Compactor::default();
    assert_eq!(c.tick(&api).await, Tick::Won { compacted: None });
    assert_eq!(c.time, 1);
    let (_, kv) = api.get(COMPACT_REV_KEY).await.expect("get");
    let kv = kv.expect("created by the CAS");
    assert_eq!((kv.version, text(&kv.value)), (1, "0".to_string()));
    heartbeat(&api, 0).await;
    let r = c.rev;
    match c.tick(&api).await {
        Tick::Won {
            compacted: Some((rev, Ok(_))),
        } => assert_eq!(rev, r),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_apiservers_race_the_compactor_cas() {
    let server = Ephd::start(&[]);
    let a = Apiserver::connect(&server.endpoint()).await;
    let b_ = Apiserver::connect(&server.endpoint()).await;
    let (mut ca, mut cb) = (Compactor::default(), Compactor::default());
    // Both start at local version 0 and lose against the pre-created key.
    let (ta, tb) = tokio::join!(ca.tick(&a), cb.tick(&b_));
    assert!(matches!(ta, Tick::Lost { version: 1, .. }), "{ta:?}");
    assert!(matches!(tb, Tick::Lost { version: 1, .. }), "{tb:?}");
    let mut compactions = Vec::new();
    for round in 0..6 {
        heartbeat(&a, round).await;
        heartbeat(&b_, round + 1).await;
        let before = ca.time;
        assert_eq!(ca.time, cb.time, "both adopted the same version");
        let (ta, tb) = tokio::join!(ca.tick(&a), cb.tick(&b_));
        let (won, lost) = match (&ta, &tb) {
            (Tick::Won { compacted }, Tick::Lost { version, value }) => {
                (compacted.clone(), (*version, value.clone()))
            }
            (Tick::Lost { version, value }, Tick::Won { compacted }) => {
                (compacted.clone(), (*version, value.clone()))
            }
            other => panic!("round {round}: exactly one CAS must win: {other:?}"),
        };
        assert_eq!(lost.0, before + 1, "the loser adopts the winner's version");
        assert_eq!(ca.time, before + 1);
        assert_eq!(cb.time, before + 1);
        let (rev, result) = won.expect("a winner with a previous tick compacts");
        assert_eq!(
            text(&lost.1),
            rev.to_string(),
            "compact_rev_key holds the winner's previous revision"
        );
        result.unwrap_or_else(|e| panic!("round {round}: Compact({rev}) failed: {e:?}"));
        compactions.push(rev);
    }
    assert!(
        compactions.windows(2).all(|w| w[0] < w[1]),
        "compactions move forward: {compactions:?}"
    );
    let (_, kv) = a.get(COMPACT_REV_KEY).await.expect("get");
    assert_eq!(kv.expect("key").version, ca.time);
    let last = *compactions.last().unwrap();
    let resp = a
        .range(pb::RangeRequest {
            key: b(LEASES),
            range_end: crate::support::prefix_end(LEASES.as_bytes()).into(),
            revision: last - 1,
            ..Default::default()
        })
        .await;
    assert_raw_err(
        resp.map(|r| header_rev(&r.header)),
        tonic::Code::OutOfRange,
        ERR_COMPACTED,
    );
    a.health().await.expect("health");
}

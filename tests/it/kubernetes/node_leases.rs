//! Node-lease heartbeats (coordination.k8s.io Leases, watch-cached): the
//! busiest traffic an apiserver sends to the leases override. Kubelets create
//! their lease once, then renew it with a single `GuaranteedUpdate` Txn based
//! on the watch cache's copy; the cache follows the prefix with `prev_kv` and
//! `progress_notify`, and consistent reads wait for it with progress requests.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ephd::proto::etcdserverpb::{
    self as pb, watch_client::WatchClient, watch_request::RequestUnion,
};
use futures::future::join_all;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::apiserver::{
    cache_watch, direct_watch, Apiserver, Ledger, Outcome, Watcher, EVENTS, LEASES,
};
use crate::harness::{Ephd, Server};
use crate::support::within;

const NODES: usize = 50;
const ROUNDS: usize = 5;

fn node_key(i: usize) -> String {
    format!("{LEASES}kube-node-lease/node-{i:03}")
}

/// A Lease object as stored: the `k8s\0` protobuf envelope, opaque bytes.
fn lease_object(i: usize, renew: usize) -> Vec<u8> {
    let mut v = b"k8s\x00\x0a\x16coordination.k8s.io/v1".to_vec();
    v.extend_from_slice(format!("\x12Lease node-{i:03} renewTime={renew}").as_bytes());
    v.push(0xff);
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn node_lease_heartbeats_through_the_watch_cache() {
    // Periodic progress every 500 ms too, so both kinds of progress race the
    // heartbeats.
    let server = Ephd::start(&["--experimental-watch-progress-notify-interval", "500ms"]);
    let api = Apiserver::connect(&server.endpoint()).await;
    let ledger = Ledger::default();

    // Every kubelet's first heartbeat: store.Create.
    let created = join_all((0..NODES).map(|i| {
        let api = api.clone();
        async move {
            let key = node_key(i);
            let rev = api
                .create(&key, &lease_object(i, 0), 0)
                .await
                .expect("create Txn")
                .unwrap_or_else(|| panic!("create {key}: key unexpectedly exists"));
            (i, rev)
        }
    }))
    .await;
    let mut cached = vec![0i64; NODES];
    for (i, rev) in created {
        ledger.put(rev, &node_key(i), &lease_object(i, 0));
        cached[i] = rev;
    }
    let mut revs: Vec<i64> = cached.clone();
    revs.sort_unstable();
    revs.dedup();
    assert_eq!(revs.len(), NODES, "every create got its own revision");

    // A second create of the same lease is a 409, not an overwrite.
    assert_eq!(
        api.create(&node_key(0), b"again", 0).await.expect("Txn"),
        None
    );

    // The watch cache starts: a paginated list (limit 10000), then a watch
    // from listRV + 1.
    let listed = api.list(LEASES, 10_000, 0).await.expect("initial list");
    assert_eq!(listed.pages, 1);
    let state = ledger.state_at(LEASES, listed.revision);
    assert_eq!(
        listed
            .kvs
            .iter()
            .map(|kv| (kv.key.clone(), kv.value.clone()))
            .collect::<Vec<_>>(),
        state.into_iter().collect::<Vec<_>>(),
        "the list is exactly the created leases"
    );
    let cache = Watcher::open(api.channel(), cache_watch(LEASES, listed.revision + 1)).await;
    assert!(cache.created_revision >= listed.revision);

    // An event write moves the global revision without any lease event: only
    // a progress notification can bring the cache to the current RV.
    let ev = api
        .create(&format!("{EVENTS}default/boot"), b"k8s\x00event", 0)
        .await
        .expect("Txn")
        .expect("created");
    ledger.put(ev, &format!("{EVENTS}default/boot"), b"k8s\x00event");
    let target = api.current_rv(LEASES).await;
    assert!(
        target >= ev,
        "GetCurrentResourceVersion is the store's revision"
    );
    cache.wait_until_fresh(target).await;

    for round in 1..=ROUNDS {
        // Every node renews concurrently from the cache's copy: one Txn each.
        let results = join_all((0..NODES).map(|i| {
            let api = api.clone();
            let expected = cached[i];
            async move {
                let out = api
                    .update(&node_key(i), &lease_object(i, round), 0, expected)
                    .await
                    .expect("renew Txn");
                (i, out)
            }
        }))
        .await;
        for (i, out) in results {
            match out {
                Outcome::Done(rev) => {
                    assert!(rev > cached[i], "a renewal moves the lease's RV forward");
                    ledger.put(rev, &node_key(i), &lease_object(i, round));
                    cached[i] = rev;
                }
                other => panic!("renewal of node {i} in round {round} failed: {other:?}"),
            }
        }
        // Some other resource is written between heartbeats.
        let key = format!("{EVENTS}default/round-{round}");
        let rev = api
            .create(&key, b"k8s\x00event", 0)
            .await
            .expect("Txn")
            .expect("created");
        ledger.put(rev, &key, b"k8s\x00event");

        // A consistent LIST from the cache waits for the current RV.
        let target = api.current_rv(&LEASES[..LEASES.len() - 1]).await;
        assert!(target >= rev);
        cache.wait_until_fresh(target).await;
        // The write's header.revision is the object's mod_revision.
        let (hrev, kv) = api.get(&node_key(round)).await.expect("get");
        let kv = kv.expect("lease exists");
        assert_eq!(kv.mod_revision, cached[round]);
        assert_eq!(kv.version, round as i64 + 1);
        assert_eq!(kv.value.as_ref(), lease_object(round, round).as_slice());
        assert!(hrev >= target);
    }

    // A renewal from a stale cache copy (an apiserver whose cache lags):
    // the failure branch returns the current object, which is retried.
    let i = 7;
    let before = api.current_rv(LEASES).await;
    let stale = ledger
        .writes()
        .iter()
        .find(|w| w.key.as_ref() == node_key(i).as_bytes())
        .expect("node 7 was created")
        .rev;
    let current = match api
        .update(&node_key(i), b"stale", 0, stale)
        .await
        .expect("Txn")
    {
        Outcome::Conflict(kv) => kv,
        other => panic!("a stale renewal must fail with the current kv, got {other:?}"),
    };
    assert_eq!(current.mod_revision, cached[i]);
    assert_eq!(current.value.as_ref(), lease_object(i, ROUNDS).as_slice());
    assert_eq!(current.version, ROUNDS as i64 + 1);
    assert_eq!(current.create_revision, stale);
    assert_eq!(
        api.current_rv(LEASES).await,
        before,
        "a Txn whose compare fails does not bump the revision"
    );
    let fresh = lease_object(i, ROUNDS + 1);
    match api
        .update(&node_key(i), &fresh, 0, current.mod_revision)
        .await
        .expect("Txn")
    {
        Outcome::Done(rev) => {
            ledger.put(rev, &node_key(i), &fresh);
            cached[i] = rev;
        }
        other => panic!("the retry with the returned kv must succeed: {other:?}"),
    }
    // Create-on-update (expected rev 0) of an existing lease also fails with
    // the current object.
    match api.update(&node_key(i), b"x", 0, 0).await.expect("Txn") {
        Outcome::Conflict(kv) => assert_eq!(kv.mod_revision, cached[i]),
        other => panic!("update with rev 0 of a live key: {other:?}"),
    }
    // An update of a lease that does not exist: the failure Range is empty
    // (NotFound); with rev 0 it creates it.
    let missing = node_key(999);
    assert_eq!(
        api.update(&missing, b"x", 0, 12345).await.expect("Txn"),
        Outcome::NotFound
    );
    match api
        .update(&missing, &lease_object(999, 0), 0, 0)
        .await
        .expect("Txn")
    {
        Outcome::Done(rev) => ledger.put(rev, &missing, &lease_object(999, 0)),
        other => panic!("create-on-update of a missing key: {other:?}"),
    }

    // Two apiservers renewing the same lease from the same cached copy:
    // exactly one wins, the other gets the winner's object.
    let other = Apiserver::connect(&server.endpoint()).await;
    let i = 3;
    let key = node_key(i);
    let (a, b) = tokio::join!(
        api.update(&key, b"k8s\x00from-a", 0, cached[i]),
        other.update(&key, b"k8s\x00from-b", 0, cached[i]),
    );
    let (a, b) = (a.expect("Txn a"), b.expect("Txn b"));
    let (rev, winner, loser_view) = match (a, b) {
        (Outcome::Done(r), Outcome::Conflict(kv)) => (r, b"k8s\x00from-a", kv),
        (Outcome::Conflict(kv), Outcome::Done(r)) => (r, b"k8s\x00from-b", kv),
        other => panic!("exactly one of two racing renewals must win: {other:?}"),
    };
    assert_eq!(loser_view.mod_revision, rev);
    assert_eq!(loser_view.value.as_ref(), winner);
    ledger.put(rev, &node_key(i), winner);
    cached[i] = rev;

    // A node is deleted (conditionalDelete): stale rev first, then the
    // right one; the DELETE event must carry prev_kv.
    let i = NODES - 1;
    match api.delete(&node_key(i), stale).await.expect("Txn") {
        Outcome::Conflict(kv) => assert_eq!(kv.mod_revision, cached[i]),
        other => panic!("stale delete: {other:?}"),
    }
    match api.delete(&node_key(i), cached[i]).await.expect("Txn") {
        Outcome::Done(rev) => ledger.delete(rev, node_key(i).as_bytes()),
        other => panic!("delete: {other:?}"),
    }
    assert_eq!(
        api.delete(&node_key(i), cached[i]).await.expect("Txn"),
        Outcome::NotFound
    );

    // Final consistent read, then every event checked against every write.
    let target = api.current_rv(LEASES).await;
    cache.wait_until_fresh(target).await;
    let writes = ledger.writes();
    cache.assert_matches(LEASES, &writes);
    cache.seen(|s| {
        assert!(
            s.progress.iter().any(|p| p.requested),
            "the consistent-read waits were answered by requested progress (watch_id -1)"
        );
        assert!(s.canceled.is_none(), "the cache watch was canceled");
    });

    // The cache's state (the list plus its events) is what a fresh list sees.
    let relist = api.list(LEASES, 10, 0).await.expect("relist");
    assert_eq!(
        relist.pages,
        relist.kvs.len().div_ceil(10),
        "limit 10 pages"
    );
    let want = ledger.state_at(LEASES, relist.revision);
    assert_eq!(
        relist
            .kvs
            .iter()
            .map(|kv| (kv.key.clone(), kv.value.clone()))
            .collect::<Vec<_>>(),
        want.into_iter().collect::<Vec<_>>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn progress_requests_never_overtake_concurrent_heartbeats() {
    // Heartbeats keep landing while the cache requests progress as fast as a
    // waiting consistent read would: every `watch_id -1` reply must come after
    // all events at or below its revision.
    let server = Ephd::start(&[]);
    let api = Apiserver::connect(&server.endpoint()).await;
    let ledger = Ledger::default();
    let listed = api.list(LEASES, 10_000, 0).await.expect("list");
    let cache = Watcher::open(api.channel(), cache_watch(LEASES, listed.revision + 1)).await;
    let writers: Vec<_> = (0..8)
        .map(|w| {
            let api = api.clone();
            let ledger = ledger.clone();
            tokio::spawn(async move {
                let key = node_key(100 + w);
                let mut rev = 0;
                for n in 0..40 {
                    let value = lease_object(100 + w, n);
                    match api.update(&key, &value, 0, rev).await.expect("Txn") {
                        Outcome::Done(r) => {
                            ledger.put(r, &key, &value);
                            rev = r;
                        }
                        other => panic!("heartbeat of {key}: {other:?}"),
                    }
                }
            })
        })
        .collect();
    let requester = async {
        for _ in 0..60 {
            cache.request_progress().await;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    let (_, results) = tokio::join!(requester, join_all(writers));
    for r in results {
        r.expect("writer task");
    }
    let target = api.current_rv(LEASES).await;
    cache.wait_until_fresh(target).await;
    cache.assert_matches(LEASES, &ledger.writes());
    assert_eq!(ledger.writes().len(), 8 * 40);
    cache.seen(|s| assert!(s.progress.iter().filter(|p| p.requested).count() > 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn progress_on_a_shared_stream_covers_every_watch_on_it() {
    // clientv3 multiplexes every watch of a client (same metadata) on one
    // stream: the leases cache watch and a direct events watch here. A
    // requested progress (watch_id -1) is fanned out to both, so it must
    // follow every event at or below its revision on BOTH watches.
    let server = Ephd::start(&[]);
    let api = Apiserver::connect(&server.endpoint()).await;
    let start = api.current_rv(LEASES).await + 1;
    let (tx, rx) = mpsc::channel(64);
    let create = |req| pb::WatchRequest {
        request_union: Some(RequestUnion::CreateRequest(req)),
    };
    tx.send(create(cache_watch(LEASES, start)))
        .await
        .expect("send");
    let mut stream = within(
        "open watch stream",
        WatchClient::new(api.channel()).watch(ReceiverStream::new(rx)),
    )
    .await
    .expect("watch stream")
    .into_inner();
    let first = next(&mut stream).await;
    assert!(first.created && !first.canceled);
    // clientv3 sends the next create only after `created` for the previous.
    tx.send(create(direct_watch(EVENTS, start)))
        .await
        .expect("send");
    let second = next(&mut stream).await;
    assert!(second.created && !second.canceled);
    let (leases_id, events_id) = (first.watch_id, second.watch_id);
    assert_ne!(leases_id, events_id, "watch IDs are unique on a stream");

    let ledger = Ledger::default();
    let writer = {
        let api = api.clone();
        let ledger = ledger.clone();
        tokio::spawn(async move {
            let mut lease_rev = 0;
            for n in 0..160 {
                if n % 2 == 0 {
                    let key = node_key(0);
                    let value = lease_object(0, n);
                    match api.update(&key, &value, 0, lease_rev).await.expect("Txn") {
                        Outcome::Done(r) => {
                            ledger.put(r, &key, &value);
                            lease_rev = r;
                        }
                        other => panic!("{other:?}"),
                    }
                } else {
                    let key = format!("{EVENTS}default/ev-{n:04}");
                    let r = api
                        .create(&key, b"k8s\x00ev", 0)
                        .await
                        .expect("Txn")
                        .expect("new");
                    ledger.put(r, &key, b"k8s\x00ev");
                }
            }
        })
    };
    let stop = Arc::new(AtomicBool::new(false));
    let requester = {
        let tx = tx.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let req = pb::WatchRequest {
                    request_union: Some(RequestUnion::ProgressRequest(pb::WatchProgressRequest {})),
                };
                if tx.send(req).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
        })
    };

    // (watch_id, mod_revision, key) of every event; (revision, events so far)
    // of every progress.
    let mut events: Vec<(i64, i64, Bytes)> = Vec::new();
    let mut progress: Vec<(i64, usize)> = Vec::new();
    let mut last_write = None;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "progress never caught up"
        );
        let resp = next(&mut stream).await;
        assert!(!resp.created && !resp.canceled, "{resp:?}");
        if resp.events.is_empty() {
            assert_eq!(resp.watch_id, -1, "requested progress uses watch_id -1");
            let r = resp.header.as_ref().expect("header").revision;
            progress.push((r, events.len()));
            if last_write.is_some_and(|l| r >= l) {
                break;
            }
        } else {
            for e in &resp.events {
                let kv = e.kv.as_ref().expect("kv");
                events.push((resp.watch_id, kv.mod_revision, kv.key.clone()));
            }
        }
        if last_write.is_none() && writer.is_finished() {
            last_write = ledger.writes().last().map(|w| w.rev);
        }
    }
    stop.store(true, Ordering::Relaxed);
    requester.await.expect("requester");
    writer.await.expect("writer");

    let writes = ledger.writes();
    for (id, prefix) in [(leases_id, LEASES), (events_id, EVENTS)] {
        let got: Vec<(i64, Bytes)> = events
            .iter()
            .filter(|(w, _, _)| *w == id)
            .map(|(_, r, k)| (*r, k.clone()))
            .collect();
        let want: Vec<(i64, Bytes)> = writes
            .iter()
            .filter(|w| w.key.starts_with(prefix.as_bytes()))
            .map(|w| (w.rev, w.key.clone()))
            .collect();
        assert_eq!(got, want, "events of the {prefix} watch");
    }
    assert!(progress.len() > 5, "progress requests were answered");
    for (r, delivered) in &progress {
        let due = writes.iter().filter(|w| w.rev <= *r).count();
        assert_eq!(
            *delivered, due,
            "progress @{r} arrived after {delivered} events on the stream, but {due} writes \
             (of either watch) are at or below it"
        );
    }
}

async fn next(stream: &mut tonic::Streaming<pb::WatchResponse>) -> pb::WatchResponse {
    within("next watch response", stream.message())
        .await
        .expect("watch stream did not fail")
        .expect("watch stream did not end")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn future_start_revisions_and_progress_on_an_empty_stream() {
    let server = Ephd::start(&[]);
    let api = Apiserver::connect(&server.endpoint()).await;
    let (tx, rx) = mpsc::channel(16);
    // RequestProgress can open a stream that has no watch yet: the request
    // must be ignored (or answered harmlessly), never break the stream.
    tx.send(pb::WatchRequest {
        request_union: Some(RequestUnion::ProgressRequest(pb::WatchProgressRequest {})),
    })
    .await
    .expect("send");
    let mut stream = within(
        "open watch stream",
        WatchClient::new(api.channel()).watch(ReceiverStream::new(rx)),
    )
    .await
    .expect("watch stream")
    .into_inner();
    // A watch from a future revision (a client resuming ahead of a store
    // that lags, or listRV + 1 == current + 1): accepted, silent until the
    // store reaches it.
    let current = api.current_rv(LEASES).await;
    let start = current + 3;
    tx.send(pb::WatchRequest {
        request_union: Some(RequestUnion::CreateRequest(cache_watch(LEASES, start))),
    })
    .await
    .expect("send");
    let mut resp = next(&mut stream).await;
    if !resp.created {
        // A harmless answer to the early progress request is allowed.
        assert!(
            resp.events.is_empty() && !resp.canceled && resp.watch_id == -1,
            "unexpected response to a progress request on an empty stream: {resp:?}"
        );
        resp = next(&mut stream).await;
    }
    assert!(
        resp.created && !resp.canceled,
        "future watch accepted: {resp:?}"
    );
    let id = resp.watch_id;
    let mut revs = Vec::new();
    let mut rev = 0;
    for n in 0..5 {
        match api
            .update(&node_key(0), &lease_object(0, n), 0, rev)
            .await
            .expect("Txn")
        {
            Outcome::Done(r) => {
                revs.push(r);
                rev = r;
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(revs[0], current + 1);
    let mut got = Vec::new();
    while got.len() < 3 {
        let resp = next(&mut stream).await;
        assert_eq!(resp.watch_id, id, "{resp:?}");
        assert!(!resp.canceled && !resp.events.is_empty(), "{resp:?}");
        got.extend(
            resp.events
                .iter()
                .map(|e| e.kv.as_ref().unwrap().mod_revision),
        );
    }
    assert_eq!(
        got,
        revs[2..],
        "delivery starts exactly at the start revision"
    );
}

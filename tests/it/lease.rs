//! Lease service: grant, revoke, keep-alive, time-to-live, listing and
//! expiry, and what they do to attached keys and to watchers.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use ephd::proto::etcdserverpb::{lease_client::LeaseClient, LeaseKeepAliveRequest};
use ephd::proto::mvccpb::event::EventType;
use etcd_client::{Client, GetOptions, LeaseGrantOptions, LeaseTimeToLiveOptions, PutOptions};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;

use crate::harness::Server;
use crate::support::{assert_err, prefix_end, rev, watch_req, within, RawWatch, TestServer};

const LEASE_NOT_FOUND: &str = "etcdserver: requested lease not found";

async fn grant(c: &mut Client, ttl: i64, id: i64) -> (i64, i64) {
    let opts = (id != 0).then(|| LeaseGrantOptions::new().with_id(id));
    let g = within("grant", c.lease_grant(ttl, opts))
        .await
        .expect("grant succeeds");
    assert_eq!(g.error(), "");
    (g.id(), g.ttl())
}

async fn put_leased(c: &mut Client, key: &str, lease: i64) -> i64 {
    let opts = (lease != 0).then(|| PutOptions::new().with_lease(lease));
    rev(within("put", c.put(key, "v", opts))
        .await
        .expect("put succeeds")
        .header())
}

async fn ttl_of(c: &mut Client, id: i64) -> i64 {
    within("time to live", c.lease_time_to_live(id, None))
        .await
        .expect("time to live succeeds")
        .ttl()
}

async fn lease_ids(c: &mut Client) -> BTreeSet<i64> {
    within("leases", c.leases())
        .await
        .expect("leases succeeds")
        .leases()
        .iter()
        .map(|l| l.id())
        .collect()
}

async fn live_keys(c: &mut Client) -> Vec<String> {
    within("range", c.get("", Some(GetOptions::new().with_all_keys())))
        .await
        .expect("range succeeds")
        .kvs()
        .iter()
        .map(|kv| kv.key_str().unwrap().to_string())
        .collect()
}

/// One raw keep-alive request for `id` on a fresh stream; returns the TTL
/// the server answered with.
async fn raw_keep_alive(endpoint: &str, id: i64) -> i64 {
    raw_keep_alive_answer(endpoint, id).await.1
}

/// One raw keep-alive request for `id` on a fresh stream; returns the
/// answer's header revision and TTL.
async fn raw_keep_alive_answer(endpoint: &str, id: i64) -> (i64, i64) {
    let (tx, rx) = mpsc::channel(1);
    // Queued before the call: a Go server sends headers with its first answer.
    tx.send(LeaseKeepAliveRequest { id }).await.unwrap();
    let channel = crate::harness::connect_channel(endpoint).await;
    let mut stream = within(
        "keep-alive stream",
        LeaseClient::new(channel).lease_keep_alive(ReceiverStream::new(rx)),
    )
    .await
    .expect("keep-alive stream opens")
    .into_inner();
    let resp = within("keep-alive answer", stream.message())
        .await
        .expect("keep-alive answer")
        .expect("stream not ended");
    assert_eq!(resp.id, id);
    (resp.header.map_or(-1, |h| h.revision), resp.ttl)
}

#[tokio::test]
async fn grant_assigns_ids_and_enforces_ttl_bounds() {
    let server = TestServer::start();
    let mut c = server.client().await;
    let (a, ttl_a) = grant(&mut c, 60, 0).await;
    let (b, _) = grant(&mut c, 60, 0).await;
    assert!(a != 0 && b != 0 && a != b, "server-chosen IDs: {a}, {b}");
    assert_eq!(ttl_a, 60);

    assert_eq!(
        grant(&mut c, 30, 1234).await,
        (1234, 30),
        "client-chosen ID"
    );
    assert_err(
        c.lease_grant(30, Some(LeaseGrantOptions::new().with_id(1234)))
            .await,
        Code::FailedPrecondition,
        "etcdserver: lease already exists",
    );

    // Below the minimum TTL (2 s for etcd's default election timeout).
    assert_eq!(grant(&mut c, 1, 11).await, (11, 2));
    assert_eq!(grant(&mut c, 0, 12).await, (12, 2));
    assert_eq!(grant(&mut c, 9_000_000_000, 13).await, (13, 9_000_000_000));
    assert_err(
        c.lease_grant(9_000_000_001, Some(LeaseGrantOptions::new().with_id(14)))
            .await,
        Code::OutOfRange,
        "etcdserver: too large lease TTL",
    );

    assert_eq!(
        lease_ids(&mut c).await,
        BTreeSet::from([a, b, 1234, 11, 12, 13])
    );
    let g = within("grant", c.lease_grant(60, None)).await.unwrap();
    assert_eq!(rev(g.header()), 1, "grants do not change the key space");
}

#[tokio::test]
async fn revoke_deletes_attached_keys_at_one_revision() {
    let server = TestServer::start();
    let mut c = server.client().await;
    let (lease, _) = grant(&mut c, 600, 0).await;
    let (other, _) = grant(&mut c, 600, 0).await;
    put_leased(&mut c, "p/a", lease).await; // r2
    put_leased(&mut c, "p/b", lease).await; // r3
    put_leased(&mut c, "p/c", lease).await; // r4
    put_leased(&mut c, "p/d", 0).await; // r5
    put_leased(&mut c, "p/e", other).await; // r6
    put_leased(&mut c, "q", lease).await; // r7

    let mut w = RawWatch::open(&server.endpoint()).await;
    let mut req = watch_req(b"p/", &prefix_end(b"p/"), 0);
    req.prev_kv = true;
    w.create_ok(req).await;

    let r = within("revoke", c.lease_revoke(lease)).await.unwrap();
    assert_eq!(rev(r.header()), 8, "one revision for all attached keys");

    let mut events = Vec::new();
    while events.len() < 3 {
        events.extend(w.next().await.events);
    }
    assert_eq!(events.len(), 3);
    for (e, key) in events.iter().zip(["p/a", "p/b", "p/c"]) {
        assert_eq!(e.r#type, EventType::Delete as i32);
        let kv = e.kv.as_ref().unwrap();
        assert_eq!((&kv.key[..], kv.mod_revision), (key.as_bytes(), 8));
        let prev = e.prev_kv.as_ref().expect("prev_kv requested");
        assert_eq!((&prev.key[..], prev.lease), (key.as_bytes(), lease));
    }
    assert_eq!(live_keys(&mut c).await, ["p/d", "p/e"]);
    assert_eq!(lease_ids(&mut c).await, BTreeSet::from([other]));
    assert_eq!(ttl_of(&mut c, lease).await, -1);

    assert_err(c.lease_revoke(lease).await, Code::NotFound, LEASE_NOT_FOUND);
    assert_err(
        c.put("p/x", "v", Some(PutOptions::new().with_lease(lease)))
            .await,
        Code::NotFound,
        LEASE_NOT_FOUND,
    );
    let (empty, _) = grant(&mut c, 600, 0).await;
    let r = within("revoke", c.lease_revoke(empty)).await.unwrap();
    assert_eq!(
        rev(r.header()),
        8,
        "revoking a lease without keys writes nothing"
    );
}

#[tokio::test]
async fn keep_alive_refreshes_the_ttl() {
    let server = TestServer::start();
    let mut c = server.client().await;
    let (id, _) = grant(&mut c, 3, 0).await;
    let fresh = ttl_of(&mut c, id).await;
    assert!(
        (2..=3).contains(&fresh),
        "remaining TTL right after grant: {fresh}"
    );

    // Wait (polling, bounded) until the lease has visibly aged.
    let deadline = Instant::now() + Duration::from_secs(5);
    while ttl_of(&mut c, id).await > 1 {
        assert!(Instant::now() < deadline, "lease TTL never went down");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let (mut keeper, mut answers) = within("keep-alive", c.lease_keep_alive(id))
        .await
        .expect("keep-alive stream");
    assert_eq!(keeper.id(), id);
    let refreshed = ttl_of(&mut c, id).await;
    assert!(refreshed >= 2, "TTL after keep-alive: {refreshed}");

    within("keep-alive", keeper.keep_alive()).await.unwrap();
    let a = within("keep-alive answer", answers.message())
        .await
        .unwrap()
        .expect("an answer per request");
    assert_eq!((a.id(), a.ttl()), (id, 3));

    // Unknown leases are answered with TTL 0 rather than an error.
    assert_eq!(raw_keep_alive(&server.endpoint(), id + 1).await, 0);
}

/// The header revisions and TTLs of keep-alives around a revoke, the same
/// on ephd and on stock etcd: etcd fills the header before refreshing, so a
/// keep-alive of a live lease reports a revision at which it was alive.
#[tokio::test]
async fn keep_alive_headers_match_stock_etcd() {
    async fn scenario(endpoint: &str) -> Vec<(i64, i64)> {
        let mut c = crate::harness::connect_client(endpoint).await;
        let mut seen = Vec::new();
        grant(&mut c, 30, 77).await;
        seen.push(raw_keep_alive_answer(endpoint, 77).await);
        put_leased(&mut c, "k1", 77).await;
        put_leased(&mut c, "k2", 77).await;
        seen.push(raw_keep_alive_answer(endpoint, 77).await);
        within("revoke", c.lease_revoke(77)).await.unwrap();
        seen.push(raw_keep_alive_answer(endpoint, 77).await);
        seen.push(raw_keep_alive_answer(endpoint, 78).await);
        seen
    }
    let ephd = crate::support::ephd(&[]);
    let etcd = crate::harness::StockEtcd::start();
    let on_ephd = scenario(&ephd.endpoint()).await;
    let on_etcd = scenario(&etcd.endpoint()).await;
    assert_eq!(on_ephd, on_etcd, "(header revision, ttl) per keep-alive");
    assert_eq!(on_etcd, vec![(1, 30), (3, 30), (4, 0), (4, 0)]);
}

#[tokio::test]
async fn time_to_live_lists_attached_keys() {
    let server = TestServer::start();
    let mut c = server.client().await;
    let (id, _) = grant(&mut c, 60, 77).await;
    put_leased(&mut c, "k2", id).await;
    put_leased(&mut c, "k1", id).await;
    put_leased(&mut c, "k3", 0).await;

    let with_keys = || Some(LeaseTimeToLiveOptions::new().with_keys());
    let keys_of = |r: &etcd_client::LeaseTimeToLiveResponse| {
        let mut k: Vec<String> = r
            .keys()
            .iter()
            .map(|k| String::from_utf8(k.clone()).unwrap())
            .collect();
        k.sort();
        k
    };
    let r = within("ttl", c.lease_time_to_live(id, with_keys()))
        .await
        .unwrap();
    assert_eq!((r.id(), r.granted_ttl()), (77, 60));
    assert!((58..=60).contains(&r.ttl()), "ttl {}", r.ttl());
    assert_eq!(keys_of(&r), ["k1", "k2"]);

    let r = within("ttl", c.lease_time_to_live(id, None)).await.unwrap();
    assert!(r.keys().is_empty(), "keys only when asked for");

    // Overwriting without the lease detaches; deleting detaches.
    put_leased(&mut c, "k1", 0).await;
    let r = within("ttl", c.lease_time_to_live(id, with_keys()))
        .await
        .unwrap();
    assert_eq!(keys_of(&r), ["k2"]);
    within("delete", c.delete("k2", None)).await.unwrap();
    let r = within("ttl", c.lease_time_to_live(id, with_keys()))
        .await
        .unwrap();
    assert!(r.keys().is_empty());

    let r = within("ttl", c.lease_time_to_live(78, with_keys()))
        .await
        .unwrap();
    assert_eq!((r.id(), r.ttl(), r.granted_ttl()), (78, -1, 0));
    assert!(r.keys().is_empty());
}

#[tokio::test]
async fn expired_leases_delete_their_keys_and_notify_watchers() {
    let server = TestServer::start();
    let mut c = server.client().await;
    // `kept` is granted first: once `expiring` is gone, `kept` would have
    // expired too without its keep-alives.
    let (kept, _) = grant(&mut c, 2, 0).await;
    let (expiring, ttl) = grant(&mut c, 2, 0).await;
    assert_eq!(ttl, 2);
    put_leased(&mut c, "e/kept", kept).await; // r2
    put_leased(&mut c, "e/x1", expiring).await; // r3
    put_leased(&mut c, "e/x2", expiring).await; // r4

    let mut w = RawWatch::open(&server.endpoint()).await;
    let mut req = watch_req(b"e/", &prefix_end(b"e/"), 0);
    req.prev_kv = true;
    w.create_ok(req).await;

    let (mut keeper, mut answers) = within("keep-alive", c.lease_keep_alive(kept))
        .await
        .expect("keep-alive stream");
    let keep_going = tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(400)).await;
            if keeper.keep_alive().await.is_err() {
                return;
            }
            match answers.message().await {
                Ok(Some(a)) => assert_eq!(a.ttl(), 2, "kept lease stays alive"),
                _ => return,
            }
        }
    });

    let start = Instant::now();
    let deadline = start + Duration::from_secs(6);
    loop {
        let keys = live_keys(&mut c).await;
        if keys == ["e/kept"] {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "keys of a 2 s lease still there after 6 s: {keys:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let mut events = Vec::new();
    while events.len() < 2 {
        events.extend(w.next().await.events);
    }
    assert_eq!(events.len(), 2);
    let expiry_rev = events[0].kv.as_ref().unwrap().mod_revision;
    assert_eq!(expiry_rev, 5, "both keys are deleted at one revision");
    for (e, key) in events.iter().zip(["e/x1", "e/x2"]) {
        assert_eq!(e.r#type, EventType::Delete as i32);
        let kv = e.kv.as_ref().unwrap();
        assert_eq!((&kv.key[..], kv.mod_revision), (key.as_bytes(), expiry_rev));
        assert_eq!(e.prev_kv.as_ref().unwrap().lease, expiring);
    }

    assert_eq!(ttl_of(&mut c, expiring).await, -1);
    assert_eq!(raw_keep_alive(&server.endpoint(), expiring).await, 0);
    assert!(ttl_of(&mut c, kept).await >= 1, "the kept lease is alive");
    assert_eq!(lease_ids(&mut c).await, BTreeSet::from([kept]));
    assert_err(
        c.put("e/late", "v", Some(PutOptions::new().with_lease(expiring)))
            .await,
        Code::NotFound,
        LEASE_NOT_FOUND,
    );
    keep_going.abort();
}

#[tokio::test]
async fn revoke_spares_keys_that_moved_to_another_lease() {
    let server = TestServer::start();
    let mut c = server.client().await;
    let (l1, _) = grant(&mut c, 600, 0).await;
    let (l2, _) = grant(&mut c, 600, 0).await;
    put_leased(&mut c, "moved", l1).await; // r2
    put_leased(&mut c, "unleased", l1).await; // r3
    put_leased(&mut c, "kept", l1).await; // r4
    put_leased(&mut c, "doomed", l1).await; // r5
    put_leased(&mut c, "moved", l2).await; // r6: now on l2
    put_leased(&mut c, "unleased", 0).await; // r7: no lease
    within(
        "put",
        c.put("kept", "w", Some(PutOptions::new().with_ignore_lease())),
    )
    .await
    .unwrap(); // r8: still on l1

    let r = within(
        "ttl",
        c.lease_time_to_live(l1, Some(LeaseTimeToLiveOptions::new().with_keys())),
    )
    .await
    .unwrap();
    let mut attached: Vec<&[u8]> = r.keys().iter().map(|k| k.as_slice()).collect();
    attached.sort();
    assert_eq!(attached, [&b"doomed"[..], b"kept"]);

    let r = within("revoke", c.lease_revoke(l1)).await.unwrap();
    assert_eq!(rev(r.header()), 9);
    assert_eq!(live_keys(&mut c).await, ["moved", "unleased"]);
    let moved = within("get", c.get("moved", None)).await.unwrap();
    assert_eq!(moved.kvs()[0].lease(), l2);
}

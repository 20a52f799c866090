//! Serving the way clientv3 connects: HTTP/2 keepalive pings, hundreds of
//! concurrent streams on one connection, huge unpaged lists, and the
//! `Status` version check that gates RequestWatchProgress.

use std::time::{Duration, Instant};

use ephd::proto::etcdserverpb::{self as pb, maintenance_client::MaintenanceClient};
use futures::future::join_all;
use tonic::transport::Endpoint;

use super::apiserver::{b, cache_watch, Apiserver, Watcher, EVENTS, LEASES};
use crate::harness::{Ephd, Server};
use crate::support::{prefix_end, within, within_for};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalive_pings_every_second_are_tolerated() {
    let server = Ephd::start(&[]);
    // Far more aggressive than the apiserver (30 s / 10 s): a server that
    // enforces grpc-go's default ping policy would answer GOAWAY
    // too_many_pings and the open watch would fail.
    let channel = within(
        "connect with keepalive",
        Endpoint::from_shared(server.endpoint())
            .expect("endpoint")
            .http2_keep_alive_interval(Duration::from_secs(1))
            .keep_alive_timeout(Duration::from_secs(1))
            .keep_alive_while_idle(true)
            .connect(),
    )
    .await
    .expect("connect");
    let api = Apiserver::on(channel.clone());
    let listed = api.list(LEASES, 10_000, 0).await.expect("list");
    let cache = Watcher::open(channel.clone(), cache_watch(LEASES, listed.revision + 1)).await;
    let key = format!("{LEASES}kube-node-lease/node-0");
    let mut rev = 0;
    let started = Instant::now();
    let mut n = 0;
    while started.elapsed() < Duration::from_millis(5500) {
        // Mostly idle connection (pings only), one heartbeat a second.
        tokio::time::sleep(Duration::from_millis(1000)).await;
        match api
            .update(&key, format!("renew {n}").as_bytes(), 0, rev)
            .await
            .expect("heartbeat over the pinged connection")
        {
            super::apiserver::Outcome::Done(r) => rev = r,
            other => panic!("{other:?}"),
        }
        n += 1;
    }
    cache
        .wait_for(
            "events over the pinged connection",
            crate::support::WAIT,
            |s| s.rv >= rev,
        )
        .await;
    cache.assert_clean();
    cache.seen(|s| {
        assert_eq!(s.events.len(), n);
        assert!(s.canceled.is_none());
    });
    let target = api.current_rv(LEASES).await;
    cache.wait_until_fresh(target).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hundreds_of_concurrent_streams_on_one_connection() {
    const STREAMS: usize = 320;
    let server = Ephd::start(&[]);
    let channel = crate::harness::connect_channel(&server.endpoint()).await;
    let api = Apiserver::on(channel.clone());
    let start = api.current_rv(EVENTS).await + 1;
    // 320 watch streams, all open at once on the one HTTP/2 connection.
    let watchers = within_for(
        Duration::from_secs(20),
        "open 320 watch streams",
        join_all((0..STREAMS).map(|i| {
            let ch = channel.clone();
            async move {
                let prefix = format!("{EVENTS}ns-{}/", i % 8);
                Watcher::open(ch, super::apiserver::direct_watch(&prefix, start)).await
            }
        })),
    )
    .await;
    // One write per namespace reaches every stream watching it.
    let mut revs = Vec::new();
    for ns in 0..8 {
        let key = format!("{EVENTS}ns-{ns}/e");
        revs.push(api.create(&key, b"v", 0).await.expect("Txn").expect("new"));
    }
    for (i, w) in watchers.iter().enumerate() {
        let want = revs[i % 8];
        w.wait_for("event on every stream", crate::support::WAIT, |s| {
            s.rv >= want
        })
        .await;
        w.assert_clean();
        w.seen(|s| assert_eq!(s.events.len(), 1));
    }
    // While they stay open: 500 concurrent unary Ranges on the same channel.
    let results = within_for(
        Duration::from_secs(20),
        "500 concurrent Ranges",
        join_all((0..500).map(|i| {
            let api = api.clone();
            async move {
                api.range(pb::RangeRequest {
                    key: b(&format!("{EVENTS}ns-{}/e", i % 8)),
                    ..Default::default()
                })
                .await
            }
        })),
    )
    .await;
    for r in results {
        let r = r.expect("every concurrent Range succeeds");
        assert_eq!(r.kvs.len(), 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_twenty_megabyte_unpaged_list_is_returned_whole() {
    const KEYS: usize = 2000;
    const SIZE: usize = 10 * 1024;
    let server = Ephd::start(&[]);
    let api = Apiserver::connect(&server.endpoint()).await;
    let results = join_all((0..8).map(|w| {
        let api = api.clone();
        async move {
            for i in (w..KEYS).step_by(8) {
                let mut value = vec![b'a' + (i % 26) as u8; SIZE];
                value[..8].copy_from_slice(format!("{i:08}").as_bytes());
                let key = format!("{EVENTS}big/e-{i:05}");
                api.create(&key, &value, 0)
                    .await
                    .expect("Txn")
                    .expect("new");
            }
        }
    }));
    within_for(Duration::from_secs(30), "writing 20 MB", results).await;
    let resp = within_for(
        Duration::from_secs(20),
        "unpaged 20 MB Range",
        api.range(pb::RangeRequest {
            key: b(EVENTS),
            range_end: prefix_end(EVENTS.as_bytes()).into(),
            ..Default::default()
        }),
    )
    .await
    .expect("the whole list comes back");
    assert_eq!(resp.kvs.len(), KEYS);
    assert_eq!(resp.count, KEYS as i64);
    assert!(!resp.more);
    let bytes: usize = resp.kvs.iter().map(|kv| kv.value.len()).sum();
    assert_eq!(bytes, KEYS * SIZE);
    for (i, kv) in resp.kvs.iter().enumerate() {
        assert_eq!(kv.key.as_ref(), format!("{EVENTS}big/e-{i:05}").as_bytes());
        assert_eq!(&kv.value[..8], format!("{i:08}").as_bytes());
    }
}

#[tokio::test]
async fn status_version_enables_request_watch_progress() {
    // The 1.31+ feature checker: `version` must parse as semver and be
    // >= 3.5.13 (or in [3.4.31, 3.5.0)), else watch progress is disabled for
    // every resource of the apiserver.
    let server = Ephd::start(&[]);
    let resp = within(
        "Status",
        MaintenanceClient::new(server.channel().await).status(pb::StatusRequest {}),
    )
    .await
    .expect("Status")
    .into_inner();
    let v = resp.version.trim_start_matches('v');
    let parts: Vec<u64> = v
        .split(['-', '+'])
        .next()
        .expect("version")
        .split('.')
        .map(|p| p.parse().expect("numeric semver part"))
        .collect();
    assert_eq!(parts.len(), 3, "x.y.z: {}", resp.version);
    let (maj, min, patch) = (parts[0], parts[1], parts[2]);
    let supported =
        (maj, min, patch) >= (3, 5, 13) || ((maj, min, patch) >= (3, 4, 31) && (maj, min) < (3, 5));
    assert!(
        supported,
        "version {} disables RequestWatchProgress",
        resp.version
    );
    assert!(resp.db_size > 0, "the DB-size monitor reads db_size");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_writes_get_the_error_the_apiserver_retries_on() {
    // isTooLargeError matches "etcdserver: request is too large"; the
    // apiserver then retries once without managedFields.
    let server = Ephd::start(&[]);
    let api = Apiserver::connect(&server.endpoint()).await;
    let key = format!("{EVENTS}default/huge");
    let value = vec![b'x'; 1_600_000];
    crate::support::assert_raw_err(
        api.create(&key, &value, 0).await,
        tonic::Code::InvalidArgument,
        "etcdserver: request is too large",
    );
    // Just under the limit is fine.
    let value = vec![b'x'; 1_500_000];
    api.create(&key, &value, 0)
        .await
        .expect("Txn")
        .expect("created");
}

//! Store-core micro-benchmarks: no network, no gRPC, one thread.
//!
//! `cargo bench --bench store` (add `-- --quick` for a fast check). Each
//! benchmark reports time per operation; see bench/README.md for what the
//! shapes stand for. History is compacted every 4096 ops outside the timed
//! part, so the store stays the size a running server keeps it at.

use bytes::Bytes;

/// The server's allocator, so allocation-heavy paths (new keys, lease
/// revokes) cost here what they cost in `ephd`.
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use ephd::mvcc::{
    Compare, CompareResult, CompareTarget, PutRequest, RangeRequest, RequestOp, Store, StoreConfig,
    TxnRequest,
};
use ephd::watch::{Output, WatchSpec, WatchStream};
use std::hint::black_box;
use std::time::{Duration, Instant};

const KEY_SPACE: u64 = 10_000;

fn key(prefix: &str, i: u64) -> Bytes {
    Bytes::from(format!("{prefix}{i:08}"))
}

fn value(size: usize) -> Bytes {
    Bytes::from(vec![b'v'; size])
}

fn put(store: &Store, key: &Bytes, value: &Bytes, lease: i64) -> i64 {
    store
        .put(PutRequest {
            key: key.clone(),
            value: value.clone(),
            lease,
            ..Default::default()
        })
        .expect("put")
        .revision
}

fn prefix_end(prefix: &str) -> Bytes {
    let mut end = prefix.as_bytes().to_vec();
    *end.last_mut().expect("non-empty prefix") += 1;
    Bytes::from(end)
}

/// Times `iters` calls of `op`, compacting all history every 4096 calls
/// (untimed) so versions do not pile up across criterion's many iterations.
fn timed(store: &Store, iters: u64, mut op: impl FnMut(u64)) -> Duration {
    let mut total = Duration::ZERO;
    let mut done = 0;
    while done < iters {
        let n = (iters - done).min(4096);
        let t0 = Instant::now();
        for i in done..done + n {
            op(i);
        }
        total += t0.elapsed();
        done += n;
        let _ = store.compact(store.current_revision());
    }
    total
}

/// Plain puts of 1 KiB values over 10,000 keys.
fn bench_put(c: &mut Criterion) {
    let mut g = c.benchmark_group("put");
    g.throughput(Throughput::Elements(1));
    let store = Store::new(StoreConfig::default());
    let keys: Vec<Bytes> = (0..KEY_SPACE).map(|i| key("/registry/bench/", i)).collect();
    let val = value(1024);
    g.bench_function("1KiB_value_10k_keys", |b| {
        b.iter_custom(|iters| {
            timed(&store, iters, |i| {
                black_box(put(&store, &keys[(i % KEY_SPACE) as usize], &val, 0));
            })
        })
    });
    g.finish();
}

/// The apiserver's update: `Txn(MOD(key) == rev → Put, else Get)`.
fn bench_cas(c: &mut Criterion) {
    let mut g = c.benchmark_group("txn");
    g.throughput(Throughput::Elements(1));
    let store = Store::new(StoreConfig::default());
    let val = value(300);
    let keys: Vec<Bytes> = (0..1000)
        .map(|i| key("/registry/leases/kube-node-lease/node-", i))
        .collect();
    let mut revs: Vec<i64> = keys.iter().map(|k| put(&store, k, &val, 0)).collect();
    g.bench_function("cas_update_300B_1k_keys", |b| {
        b.iter_custom(|iters| {
            timed(&store, iters, |i| {
                let slot = (i % keys.len() as u64) as usize;
                let k = &keys[slot];
                let resp = store
                    .txn(TxnRequest {
                        compare: vec![Compare {
                            result: CompareResult::Equal,
                            target: CompareTarget::Mod(revs[slot]),
                            key: k.clone(),
                            range_end: Bytes::new(),
                        }],
                        success: vec![RequestOp::Put(PutRequest {
                            key: k.clone(),
                            value: val.clone(),
                            ..Default::default()
                        })],
                        failure: vec![RequestOp::Range(RangeRequest {
                            key: k.clone(),
                            ..Default::default()
                        })],
                    })
                    .expect("txn");
                assert!(resp.succeeded, "CAS must succeed: we hold the latest rev");
                revs[slot] = resp.revision;
            })
        })
    });
    g.finish();
}

/// A full list of 10,000 1 KiB objects, unpaginated and in pages of 500
/// pinned to the first page's revision (the apiserver's paginated LIST).
fn bench_range(c: &mut Criterion) {
    let mut g = c.benchmark_group("range");
    g.throughput(Throughput::Elements(KEY_SPACE));
    let store = Store::new(StoreConfig::default());
    let prefix = "/registry/pods/default/";
    let val = value(1024);
    for i in 0..KEY_SPACE {
        put(&store, &key(prefix, i), &val, 0);
    }
    let (start, end) = (Bytes::from(prefix), prefix_end(prefix));
    g.bench_function("10k_keys_1KiB", |b| {
        b.iter(|| {
            let resp = store
                .range(&RangeRequest {
                    key: start.clone(),
                    range_end: end.clone(),
                    ..Default::default()
                })
                .expect("range");
            assert_eq!(resp.kvs.len() as u64, KEY_SPACE);
            black_box(resp)
        })
    });
    g.bench_function("10k_keys_1KiB_pages_of_500", |b| {
        b.iter(|| {
            let (mut from, mut rev, mut got) = (start.clone(), 0, 0);
            loop {
                let resp = store
                    .range(&RangeRequest {
                        key: from.clone(),
                        range_end: end.clone(),
                        limit: 500,
                        revision: rev,
                        ..Default::default()
                    })
                    .expect("range");
                rev = resp.revision;
                got += resp.kvs.len();
                match resp.kvs.last() {
                    Some(last) if resp.more => {
                        let mut next = last.key.to_vec();
                        next.push(0);
                        from = Bytes::from(next);
                    }
                    _ => break,
                }
            }
            assert_eq!(got as u64, KEY_SPACE);
        })
    });
    g.bench_function("10k_keys_count_only", |b| {
        b.iter(|| {
            black_box(
                store
                    .range(&RangeRequest {
                        key: start.clone(),
                        range_end: end.clone(),
                        count_only: true,
                        ..Default::default()
                    })
                    .expect("range"),
            )
        })
    });
    g.finish();
}

fn watch_stream(store: &Store, watchers: usize, prefix: &str) -> WatchStream {
    let mut ws = WatchStream::new();
    for _ in 0..watchers {
        let out = ws.create(
            store,
            WatchSpec {
                key: Bytes::from(prefix.to_string()),
                range_end: prefix_end(prefix),
                prev_kv: true,
                ..Default::default()
            },
        );
        assert!(matches!(out[0], Output::Created { .. }));
    }
    ws
}

/// One put to a watched prefix, then `WatchStream::poll` delivering it to 1
/// or 100 watchers of one stream; and 100 watchers whose prefix does not
/// match (the cost of matching alone).
fn bench_watch(c: &mut Criterion) {
    let mut g = c.benchmark_group("watch");
    g.throughput(Throughput::Elements(1));
    let val = value(300);
    for (name, watchers, watched) in [
        ("put_poll_1_watcher", 1, "/registry/leases/"),
        ("put_poll_100_watchers", 100, "/registry/leases/"),
        ("put_poll_100_watchers_no_match", 100, "/registry/pods/"),
    ] {
        let store = Store::new(StoreConfig::default());
        let keys: Vec<Bytes> = (0..1000).map(|i| key("/registry/leases/n-", i)).collect();
        let mut ws = watch_stream(&store, watchers, watched);
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                timed(&store, iters, |i| {
                    put(&store, &keys[(i % 1000) as usize], &val, 0);
                    let out = ws.poll(&store, 512);
                    debug_assert_eq!(
                        out.len(),
                        if watched == "/registry/leases/" {
                            watchers
                        } else {
                            0
                        }
                    );
                    black_box(out);
                })
            })
        });
    }
    // Catch-up: 100 watchers each reading a backlog of 512 revisions at once.
    let store = Store::new(StoreConfig::default());
    let keys: Vec<Bytes> = (0..1000).map(|i| key("/registry/leases/n-", i)).collect();
    g.throughput(Throughput::Elements(512 * 100));
    g.bench_function("backlog_512_revs_100_watchers", |b| {
        b.iter_batched(
            || {
                let _ = store.compact(store.current_revision());
                let ws = watch_stream(&store, 100, "/registry/leases/");
                for i in 0..512 {
                    put(&store, &keys[i % 1000], &val, 0);
                }
                ws
            },
            |mut ws| {
                let out = ws.poll(&store, 512);
                debug_assert_eq!(out.len(), 100);
                black_box(out)
            },
            BatchSize::PerIteration,
        )
    });
    g.finish();
}

/// Lease expiry: revoking a lease with 1,000 keys attached (one write that
/// deletes them all), and the whole grant → attach 1,000 → revoke cycle.
fn bench_lease(c: &mut Criterion) {
    let mut g = c.benchmark_group("lease");
    g.throughput(Throughput::Elements(1000));
    let store = Store::new(StoreConfig::default());
    let val = value(700);
    let mut round = 0u64;
    let mut attach = |store: &Store| {
        round += 1;
        if round.is_multiple_of(64) {
            let _ = store.compact(store.current_revision());
        }
        let id = store.lease_grant(0, 3600).expect("grant").id;
        for i in 0..1000 {
            put(
                store,
                &key(&format!("/registry/events/r{round}/"), i),
                &val,
                id,
            );
        }
        id
    };
    g.bench_function("revoke_1000_keys", |b| {
        b.iter_batched(
            || attach(&store),
            |id| black_box(store.lease_revoke(id).expect("revoke")),
            BatchSize::PerIteration,
        )
    });
    g.bench_function("grant_attach_1000_revoke", |b| {
        b.iter(|| {
            let id = attach(&store);
            black_box(store.lease_revoke(id).expect("revoke"))
        })
    });
    g.finish();
}

criterion_group!(
    benches,
    bench_put,
    bench_cas,
    bench_range,
    bench_watch,
    bench_lease
);
criterion_main!(benches);

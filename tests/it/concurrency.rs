//! Concurrency: racing create-if-absent transactions, readers that must
//! never see a torn revision, read-your-writes across connections, and a
//! watcher that stops reading while the rest of the server keeps going.
//!
//! Every wait is bounded; the bounds only catch hangs and say nothing about
//! speed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse, WatchOptions,
};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use tokio::task::JoinSet;

use crate::harness::{connect_client, Server};
use crate::support::{prefix_end, rev, watch_req, within, within_for, RawWatch, TestServer};

/// Bound for a whole concurrent phase (many requests), not for one request.
const PHASE: Duration = Duration::from_secs(60);

async fn clients(endpoint: &str, n: usize) -> Vec<Client> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(connect_client(endpoint).await);
    }
    out
}

/// A connection whose HTTP/2 receive windows are the protocol minimum, so a
/// stream that is not read stops accepting data after ~64 KiB and the
/// server side of it must hold back (instead of the client buffering MBs).
async fn small_window_channel(endpoint: &str) -> tonic::transport::Channel {
    let ep = tonic::transport::Endpoint::from_shared(endpoint.to_string())
        .unwrap()
        .initial_stream_window_size(Some(65_535))
        .initial_connection_window_size(Some(65_535))
        .connect_timeout(Duration::from_secs(5));
    within("connect", ep.connect()).await.expect("connects")
}

/// Writes `writers` x `puts` distinct keys `{prefix}{w}/{i}` with `value`
/// over separate connections, every put bounded; returns when all are done.
async fn write_many(endpoint: &str, prefix: &str, writers: usize, puts: usize, value: &str) {
    let conns = clients(endpoint, writers).await;
    let mut tasks = JoinSet::new();
    for (w, mut c) in conns.into_iter().enumerate() {
        let value = value.to_string();
        let prefix = prefix.to_string();
        tasks.spawn(async move {
            for i in 0..puts {
                within(
                    "put while a watcher is stalled",
                    c.put(format!("{prefix}{w}/{i:04}"), value.as_str(), None),
                )
                .await
                .expect("put succeeds");
            }
        });
    }
    within_for(PHASE, "writers", async {
        while let Some(res) = tasks.join_next().await {
            res.expect("writer did not panic");
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn create_if_absent_races_have_exactly_one_winner_per_key() {
    const TASKS: usize = 32;
    const KEYS: usize = 50;
    let server = TestServer::start();
    let conns = clients(&server.endpoint(), 4).await;

    let mut tasks = JoinSet::new();
    for t in 0..TASKS {
        let mut c = conns[t % conns.len()].clone();
        tasks.spawn(async move {
            let mut order: Vec<usize> = (0..KEYS).collect();
            order.shuffle(&mut rand::rngs::StdRng::seed_from_u64(t as u64));
            // (key, revision) of the creates this task won, and the value
            // it read for every key it lost.
            let mut won = Vec::new();
            let mut lost = Vec::new();
            for k in order {
                let key = format!("race/{k:02}");
                let r = within(
                    "txn",
                    c.txn(
                        Txn::new()
                            .when([Compare::mod_revision(key.as_str(), CompareOp::Equal, 0)])
                            .and_then([TxnOp::put(key.as_str(), format!("task-{t}"), None)])
                            .or_else([TxnOp::get(key.as_str(), None)]),
                    ),
                )
                .await
                .expect("txn succeeds");
                if r.succeeded() {
                    won.push((key, rev(r.header())));
                } else {
                    let seen = match &r.op_responses()[..] {
                        [TxnOpResponse::Get(g)] => {
                            assert_eq!(g.kvs().len(), 1, "a lost create sees the key");
                            String::from_utf8(g.kvs()[0].value().to_vec()).unwrap()
                        }
                        other => panic!("failure branch answered {other:?}"),
                    };
                    lost.push((key, seen));
                }
            }
            (t, won, lost)
        });
    }
    let mut winners: BTreeMap<String, Vec<(usize, i64)>> = BTreeMap::new();
    let mut observed: Vec<(String, String)> = Vec::new();
    within_for(PHASE, "racing tasks", async {
        while let Some(res) = tasks.join_next().await {
            let (t, won, lost) = res.expect("task did not panic");
            for (key, r) in won {
                winners.entry(key).or_default().push((t, r));
            }
            observed.extend(lost);
        }
    })
    .await;

    assert_eq!(winners.len(), KEYS, "every key was created");
    let mut c = conns[0].clone();
    let mut revisions = BTreeSet::new();
    for (key, w) in &winners {
        assert_eq!(w.len(), 1, "{key} created by several tasks: {w:?}");
        let (t, r) = w[0];
        let got = within("get", c.get(key.as_str(), None)).await.unwrap();
        let kv = &got.kvs()[0];
        assert_eq!(kv.value(), format!("task-{t}").as_bytes(), "{key}");
        assert_eq!((kv.version(), kv.mod_revision()), (1, r), "{key}");
        revisions.insert(r);
    }
    assert_eq!(
        revisions,
        (2..2 + KEYS as i64).collect(),
        "one revision per winning create, no other writes"
    );
    for (key, seen) in observed {
        let (t, _) = winners[&key][0];
        assert_eq!(seen, format!("task-{t}"), "losers read the winner's value");
    }
    assert_eq!(
        within(
            "total",
            c.get("race/", Some(GetOptions::new().with_prefix()))
        )
        .await
        .unwrap()
        .count(),
        KEYS as i64
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn readers_never_see_a_torn_revision() {
    const WRITERS: usize = 4;
    const OPS: usize = 100;
    const READERS: usize = 4;
    let server = TestServer::start();
    let conns = clients(&server.endpoint(), 4).await;
    let done = Arc::new(AtomicBool::new(false));

    // Every key is written exactly once, so its revision r_k is known from
    // the write's response; every fifth write is a two-key txn (one
    // revision for both keys).
    let mut writers = JoinSet::new();
    for w in 0..WRITERS {
        let mut c = conns[w % conns.len()].clone();
        writers.spawn(async move {
            let mut written = Vec::new();
            for i in 0..OPS {
                let key = format!("t/{w}/{i:03}");
                if i % 5 == 0 {
                    let (a, b) = (format!("{key}a"), format!("{key}b"));
                    let r = within(
                        "txn",
                        c.txn(Txn::new().and_then([
                            TxnOp::put(a.as_str(), "v", None),
                            TxnOp::put(b.as_str(), "v", None),
                        ])),
                    )
                    .await
                    .expect("txn succeeds");
                    let r = rev(r.header());
                    written.push((a, r));
                    written.push((b, r));
                } else {
                    let r = within("put", c.put(key.as_str(), "v", None))
                        .await
                        .expect("put succeeds");
                    written.push((key, rev(r.header())));
                }
            }
            written
        });
    }

    // Readers: the current view, and a view a few revisions back.
    let mut readers = JoinSet::new();
    for r in 0..READERS {
        let mut c = conns[(r + 1) % conns.len()].clone();
        let done = done.clone();
        readers.spawn(async move {
            let mut seen: Vec<(i64, Vec<(String, i64)>)> = Vec::new();
            let mut n = 0u64;
            loop {
                let finished = done.load(Ordering::Acquire);
                let mut opts = GetOptions::new().with_prefix();
                let mut at = None;
                // The read after the writers finished is of the current
                // view, so every reader ends having seen all the writes.
                if n % 2 == 1 && !finished {
                    if let Some((last, _)) = seen.last() {
                        let back = (last - 3).max(1);
                        opts = opts.with_revision(back);
                        at = Some(back);
                    }
                }
                let resp = within("range", c.get("t/", Some(opts)))
                    .await
                    .expect("range succeeds");
                let view_rev = at.unwrap_or_else(|| rev(resp.header()));
                let kvs = resp
                    .kvs()
                    .iter()
                    .map(|kv| (kv.key_str().unwrap().to_string(), kv.mod_revision()))
                    .collect();
                assert_eq!(resp.count() as usize, resp.kvs().len());
                seen.push((view_rev, kvs));
                n += 1;
                // One more read after the writers finished, then stop.
                if finished {
                    return seen;
                }
            }
        });
    }

    let mut revision_of: BTreeMap<String, i64> = BTreeMap::new();
    within_for(PHASE, "writers", async {
        while let Some(res) = writers.join_next().await {
            revision_of.extend(res.expect("writer did not panic"));
        }
    })
    .await;
    done.store(true, Ordering::Release);
    let mut views = Vec::new();
    within_for(PHASE, "readers", async {
        while let Some(res) = readers.join_next().await {
            views.extend(res.expect("reader did not panic"));
        }
    })
    .await;

    let total = WRITERS * (OPS + OPS / 5);
    assert_eq!(revision_of.len(), total, "distinct keys written once each");
    let last = *revision_of.values().max().unwrap();
    assert_eq!(last, 1 + (WRITERS * OPS) as i64, "one revision per write");
    assert!(views.len() >= READERS * 2);
    for (at, kvs) in &views {
        let expected: Vec<(String, i64)> = revision_of
            .iter()
            .filter(|(_, r)| *r <= at)
            .map(|(k, r)| (k.clone(), *r))
            .collect();
        assert_eq!(
            kvs, &expected,
            "the view at revision {at} must hold exactly the writes at or below it"
        );
    }
    let final_views = views.iter().filter(|(at, _)| *at == last).count();
    assert!(final_views >= 1, "the last reads saw everything");
}

/// Read-your-writes across connections: once a write is answered, a read on
/// any other connection sees it, even while other writers hold earlier
/// revisions still being applied (the server answers a write only when every
/// revision up to its own is visible).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_write_is_readable_everywhere_once_answered() {
    const WRITERS: usize = 8;
    const OPS: usize = 150;
    let server = TestServer::start();
    let conns = clients(&server.endpoint(), 4).await;
    let mut tasks = JoinSet::new();
    for w in 0..WRITERS {
        let mut writer = conns[w % conns.len()].clone();
        let mut reader = conns[(w + 1) % conns.len()].clone();
        tasks.spawn(async move {
            for i in 0..OPS {
                let key = format!("ryw/{w}/{i:03}");
                let written = if i % 3 == 0 {
                    let r = within(
                        "txn",
                        writer.txn(Txn::new().and_then([TxnOp::put(key.as_str(), "v", None)])),
                    )
                    .await
                    .expect("txn succeeds");
                    rev(r.header())
                } else {
                    let r = within("put", writer.put(key.as_str(), "v", None))
                        .await
                        .expect("put succeeds");
                    rev(r.header())
                };
                let got = within("get", reader.get(key.as_str(), None))
                    .await
                    .expect("get succeeds");
                assert!(
                    rev(got.header()) >= written,
                    "a read after the write's answer is at revision {} < {written}",
                    rev(got.header())
                );
                let kv = got.kvs().first().unwrap_or_else(|| {
                    panic!("{key}, written at {written}, is missing on another connection")
                });
                assert_eq!(kv.mod_revision(), written);
            }
        });
    }
    within_for(PHASE, "writers", async {
        while let Some(res) = tasks.join_next().await {
            res.expect("writer did not panic");
        }
    })
    .await;
}

/// The same for LeaseRevoke: once a revoke is answered, the keys it deleted
/// are gone on every other connection, while other writers keep revisions in
/// flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_revoke_is_visible_everywhere_once_answered() {
    const TASKS: usize = 6;
    const ROUNDS: usize = 100;
    let server = TestServer::start();
    let conns = clients(&server.endpoint(), 4).await;
    // Plain writers keep revisions in flight the whole time.
    let done = Arc::new(AtomicBool::new(false));
    let mut noise = JoinSet::new();
    for n in 0..4 {
        let mut c = conns[n % conns.len()].clone();
        let done = done.clone();
        noise.spawn(async move {
            let mut i = 0u64;
            while !done.load(Ordering::Acquire) {
                within(
                    "noise put",
                    c.put(format!("noise/{n}/{}", i % 64), "v", None),
                )
                .await
                .expect("put succeeds");
                i += 1;
            }
        });
    }
    let mut tasks = JoinSet::new();
    for t in 0..TASKS {
        let mut writer = conns[t % conns.len()].clone();
        let mut reader = conns[(t + 1) % conns.len()].clone();
        tasks.spawn(async move {
            for i in 0..ROUNDS {
                let key = format!("ryw-revoke/{t}/{i:03}");
                let lease = within("grant", writer.lease_grant(60, None))
                    .await
                    .expect("grant succeeds")
                    .id();
                within(
                    "put",
                    writer.put(key.as_str(), "v", Some(PutOptions::new().with_lease(lease))),
                )
                .await
                .expect("put succeeds");
                let revoked = within("revoke", writer.lease_revoke(lease))
                    .await
                    .expect("revoke succeeds");
                let revoked = rev(revoked.header());
                let got = within("get", reader.get(key.as_str(), None))
                    .await
                    .expect("get succeeds");
                assert!(
                    rev(got.header()) >= revoked,
                    "a read after the revoke's answer is at revision {} < {revoked}",
                    rev(got.header())
                );
                assert!(
                    got.kvs().is_empty(),
                    "{key} outlived its revoked lease on another connection"
                );
            }
        });
    }
    within_for(PHASE, "revokers", async {
        while let Some(res) = tasks.join_next().await {
            res.expect("revoker did not panic");
        }
    })
    .await;
    done.store(true, Ordering::Release);
    within_for(PHASE, "plain writers", async {
        while let Some(res) = noise.join_next().await {
            res.expect("writer did not panic");
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_watcher_that_stops_reading_blocks_nobody() {
    const WRITERS: usize = 4;
    const PUTS: usize = 1000;
    let server = TestServer::start();
    let endpoint = server.endpoint();
    let value = "x".repeat(1200); // ~5 MB of events in total

    // The stalled watcher has its own connection, so only its own HTTP/2
    // stream fills up. It reads its `created` answer and then nothing.
    let mut stalled = RawWatch::open_on(small_window_channel(&endpoint).await);
    let stalled_id = stalled
        .create_ok(watch_req(b"s/", &prefix_end(b"s/"), 0))
        .await
        .watch_id;

    let live_client = connect_client(&endpoint).await;
    let mut live = within(
        "watch",
        live_client
            .watch_client()
            .watch("s/", Some(WatchOptions::new().with_prefix())),
    )
    .await
    .expect("watch stream");
    let created = within("created", live.message()).await.unwrap().unwrap();
    assert!(created.created());

    let expected_events = WRITERS * PUTS;
    let live_reader = tokio::spawn(async move {
        let mut revs = Vec::with_capacity(expected_events);
        while revs.len() < expected_events {
            let r = within("live watcher event", live.message())
                .await
                .expect("live watch stream ok")
                .expect("live watch stream open");
            revs.extend(r.events().iter().map(|e| e.kv().unwrap().mod_revision()));
        }
        revs
    });

    write_many(&endpoint, "s/", WRITERS, PUTS, &value).await;

    let revs = within_for(PHASE, "live watcher", live_reader)
        .await
        .expect("live watcher did not panic");
    let last = 1 + expected_events as i64;
    assert_eq!(
        revs,
        (2..=last).collect::<Vec<_>>(),
        "the live watcher got every event once, in order"
    );
    let mut c = connect_client(&endpoint).await;
    let count = within(
        "range",
        c.get(
            "s/",
            Some(GetOptions::new().with_prefix().with_count_only()),
        ),
    )
    .await
    .unwrap();
    assert_eq!(
        (count.count(), rev(count.header())),
        (expected_events as i64, last)
    );

    // Once it reads again, the stalled watcher gets everything too.
    let mut next_rev = 2;
    within_for(PHASE, "stalled watcher catching up", async {
        while next_rev <= last {
            let r = stalled.next().await;
            assert_eq!(r.watch_id, stalled_id);
            for e in &r.events {
                let kv = e.kv.as_ref().unwrap();
                assert_eq!(kv.mod_revision, next_rev, "no gap, no duplicate");
                assert_eq!(kv.value.len(), value.len());
                next_rev += 1;
            }
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn puts_racing_a_lease_revoke_leave_no_key_on_the_dead_lease() {
    const TASKS: usize = 8;
    let server = TestServer::start();
    let endpoint = server.endpoint();
    let mut c = connect_client(&endpoint).await;
    let lease = within("grant", c.lease_grant(600, None))
        .await
        .unwrap()
        .id();
    let conns = clients(&endpoint, 4).await;

    // Each task attaches fresh keys to the lease until the lease is gone.
    let mut tasks = JoinSet::new();
    for t in 0..TASKS {
        let mut c = conns[t % conns.len()].clone();
        tasks.spawn(async move {
            let mut attached = 0usize;
            for i in 0.. {
                let opts = etcd_client::PutOptions::new().with_lease(lease);
                match within("put", c.put(format!("l/{t}/{i:05}"), "v", Some(opts))).await {
                    Ok(_) => attached += 1,
                    Err(e) => {
                        let s = crate::support::grpc_status(e);
                        assert_eq!(
                            (s.code(), s.message()),
                            (
                                tonic::Code::NotFound,
                                "etcdserver: requested lease not found"
                            )
                        );
                        return attached;
                    }
                }
            }
            unreachable!()
        });
    }
    // Revoke once some keys are attached.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let n = within(
            "count",
            c.get(
                "l/",
                Some(GetOptions::new().with_prefix().with_count_only()),
            ),
        )
        .await
        .unwrap()
        .count();
        if n >= 200 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "puts made no progress"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    within("revoke", c.lease_revoke(lease)).await.unwrap();
    let mut attached = 0;
    within_for(PHASE, "put tasks", async {
        while let Some(res) = tasks.join_next().await {
            attached += res.expect("task did not panic");
        }
    })
    .await;
    assert!(attached >= 200);
    let left = within("range", c.get("l/", Some(GetOptions::new().with_prefix())))
        .await
        .unwrap();
    assert_eq!(
        left.count(),
        0,
        "every key attached before the revoke was deleted by it, and none after"
    );
    // All the attached keys went away in one revision.
    let deleted_at = rev(left.header());
    let history = within(
        "range",
        c.get(
            "l/",
            Some(
                GetOptions::new()
                    .with_prefix()
                    .with_count_only()
                    .with_revision(deleted_at - 1),
            ),
        ),
    )
    .await
    .unwrap();
    assert_eq!(history.count() as usize, attached);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stalled_watcher_overtaken_by_compaction_is_canceled() {
    let server = TestServer::start();
    let endpoint = server.endpoint();
    let mut stalled = RawWatch::open_on(small_window_channel(&endpoint).await);
    let id = stalled
        .create_ok(watch_req(b"s/", &prefix_end(b"s/"), 0))
        .await
        .watch_id;
    // ~3.6 MB of events: far more than the stream's window and buffers.
    write_many(&endpoint, "s/", 3, 1000, &"x".repeat(1200)).await;
    let mut c = connect_client(&endpoint).await;
    let compacted = rev(within(
        "range",
        c.get("s/", Some(GetOptions::new().with_count_only())),
    )
    .await
    .unwrap()
    .header());
    within("compact", c.compact(compacted, None)).await.unwrap();

    // Reading again: what was already in flight, in order and without gaps,
    // then the cancellation, since the rest of its history is gone.
    let mut next = 2;
    let canceled = within_for(PHASE, "stalled watcher", async {
        loop {
            let r = stalled.next().await;
            assert_eq!(r.watch_id, id);
            if r.canceled {
                return r;
            }
            for e in &r.events {
                assert_eq!(e.kv.as_ref().unwrap().mod_revision, next, "no gap");
                next += 1;
            }
        }
    })
    .await;
    assert_eq!(canceled.compact_revision, compacted);
    assert!(canceled.events.is_empty());
    assert!(
        next < compacted,
        "the watcher really was behind: next revision {next}, compacted {compacted}"
    );
}

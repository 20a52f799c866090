//! Watch service: multiplexed watchers, IDs, history replay, filters,
//! prev_kv, fragmentation, cancellation and progress notifications.
//!
//! Raw bidirectional streams (`support::RawWatch`) are used wherever the
//! exact wire responses matter; the multiplexing test goes through the
//! `etcd-client` crate's shared watch stream.

use ephd::proto::etcdserverpb::{watch_create_request::FilterType, WatchResponse};
use ephd::proto::mvccpb::{event::EventType, Event};
use etcd_client::{Client, WatchOptions};
use prost::Message;
use std::collections::BTreeMap;

use crate::harness::Server;
use crate::support::{ephd, prefix_end, rev, watch_req, within, RawWatch, TestServer};

/// A compact, comparable view of one event: type, key, mod revision,
/// value and (if present) the previous value.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Ev {
    put: bool,
    key: String,
    rev: i64,
    value: String,
    prev: Option<String>,
}

fn ev(e: &Event) -> Ev {
    let kv = e.kv.as_ref().expect("event has a kv");
    Ev {
        put: e.r#type == EventType::Put as i32,
        key: String::from_utf8(kv.key.to_vec()).unwrap(),
        rev: kv.mod_revision,
        value: String::from_utf8(kv.value.to_vec()).unwrap(),
        prev: e
            .prev_kv
            .as_ref()
            .map(|p| String::from_utf8(p.value.to_vec()).unwrap()),
    }
}

fn put_ev(key: &str, rev: i64, value: &str, prev: Option<&str>) -> Ev {
    Ev {
        put: true,
        key: key.into(),
        rev,
        value: value.into(),
        prev: prev.map(String::from),
    }
}

fn del_ev(key: &str, rev: i64, prev: Option<&str>) -> Ev {
    Ev {
        put: false,
        key: key.into(),
        rev,
        value: String::new(),
        prev: prev.map(String::from),
    }
}

async fn put(c: &mut Client, key: &str, value: &str) -> i64 {
    rev(within("put", c.put(key, value, None))
        .await
        .expect("put succeeds")
        .header())
}

/// Reads event responses until `n` events arrived in total; returns them
/// grouped by watch ID in arrival order. Any other kind of response fails.
async fn collect_events(w: &mut RawWatch, n: usize) -> BTreeMap<i64, Vec<Ev>> {
    let mut out: BTreeMap<i64, Vec<Ev>> = BTreeMap::new();
    let mut got = 0;
    while got < n {
        let r = w.next().await;
        assert!(
            !r.created && !r.canceled && !r.events.is_empty(),
            "expected events, got {r:?}"
        );
        got += r.events.len();
        out.entry(r.watch_id)
            .or_default()
            .extend(r.events.iter().map(ev));
    }
    assert_eq!(got, n, "more events than expected: {out:?}");
    out
}

fn is_progress(r: &WatchResponse) -> bool {
    !r.created && !r.canceled && r.events.is_empty() && r.compact_revision == 0
}

#[tokio::test]
async fn watches_multiplex_on_one_client_stream() {
    let server = TestServer::start();
    let mut c = server.client().await;
    let mut stream = within("watch", c.watch_client().watch("a", None))
        .await
        .expect("watch stream");
    within(
        "watch",
        stream.watch(
            "b/",
            Some(WatchOptions::new().with_prefix().with_watch_id(100)),
        ),
    )
    .await
    .unwrap();
    within(
        "watch",
        stream.watch("a", Some(WatchOptions::new().with_range("c"))),
    )
    .await
    .unwrap();
    let mut created = Vec::new();
    for _ in 0..3 {
        let r = within("created", stream.message()).await.unwrap().unwrap();
        assert!(r.created() && !r.canceled(), "{r:?}");
        assert_eq!(rev(r.header()), 1);
        created.push(r.watch_id());
    }
    assert_eq!(created, [0, 100, 1], "server-assigned IDs start at 0");

    put(&mut c, "a", "1").await; // r2
    put(&mut c, "b/x", "2").await; // r3
    put(&mut c, "c", "3").await; // r4: nobody watches it
    put(&mut c, "a", "4").await; // r5
    let mut by_id: BTreeMap<i64, Vec<(String, i64)>> = BTreeMap::new();
    let mut n = 0;
    while n < 6 {
        let r = within("events", stream.message()).await.unwrap().unwrap();
        assert!(!r.created() && !r.canceled(), "{r:?}");
        for e in r.events() {
            let kv = e.kv().unwrap();
            by_id
                .entry(r.watch_id())
                .or_default()
                .push((kv.key_str().unwrap().to_string(), kv.mod_revision()));
            n += 1;
        }
    }
    let s = |k: &str, r: i64| (k.to_string(), r);
    assert_eq!(by_id[&0], [s("a", 2), s("a", 5)]);
    assert_eq!(by_id[&100], [s("b/x", 3)]);
    assert_eq!(by_id[&1], [s("a", 2), s("b/x", 3), s("a", 5)]);
    assert_eq!(n, 6);

    within("cancel", stream.cancel(1)).await.unwrap();
    let r = within("canceled", stream.message()).await.unwrap().unwrap();
    assert!(r.canceled(), "{r:?}");
    assert_eq!(r.watch_id(), 1);
    put(&mut c, "a", "6").await; // r6
    let r = within("event", stream.message()).await.unwrap().unwrap();
    assert_eq!(r.watch_id(), 0, "the canceled watcher gets nothing: {r:?}");
    assert_eq!(r.events().len(), 1);
    assert_eq!(r.events()[0].kv().unwrap().mod_revision(), 6);
}

#[tokio::test]
async fn watch_ids_client_chosen_server_assigned_and_duplicate() {
    let server = TestServer::start();
    let mut w = RawWatch::open(&server.endpoint()).await;
    let with_id = |id: i64| {
        let mut r = watch_req(b"k", b"", 0);
        r.watch_id = id;
        r
    };
    assert_eq!(w.create_ok(with_id(7)).await.watch_id, 7);
    assert_eq!(w.create_ok(with_id(0)).await.watch_id, 0);
    assert_eq!(w.create_ok(with_id(0)).await.watch_id, 1);
    for dup in [1, 7] {
        w.create(with_id(dup)).await;
        let r = w.next().await;
        assert!(r.created && r.canceled, "{r:?}");
        assert_eq!(r.watch_id, -1);
        assert_eq!(
            r.cancel_reason,
            "mvcc: duplicate watch ID provided on the WatchStream"
        );
        assert_eq!(r.header.as_ref().unwrap().revision, 1);
    }
    assert_eq!(w.create_ok(with_id(0)).await.watch_id, 2);
    assert_eq!(w.create_ok(with_id(3)).await.watch_id, 3);
    // Server-assigned IDs skip IDs the client took.
    assert_eq!(w.create_ok(with_id(0)).await.watch_id, 4);
}

#[tokio::test]
async fn watch_with_empty_range_is_created_and_canceled() {
    let server = TestServer::start();
    let mut w = RawWatch::open(&server.endpoint()).await;
    for (key, end) in [(&b"b"[..], &b"a"[..]), (b"a", b"a")] {
        w.create(watch_req(key, end, 0)).await;
        let r = w.next().await;
        assert!(r.created && r.canceled, "{r:?}");
        assert_eq!(r.watch_id, -1);
        assert_eq!(r.cancel_reason, "mvcc: watcher range is empty");
    }
    // The stream keeps working and no ID was used up.
    assert_eq!(w.create_ok(watch_req(b"a", b"b", 0)).await.watch_id, 0);
}

#[tokio::test]
async fn replay_from_past_revision_continues_live_without_gap_or_duplicate() {
    let server = TestServer::start();
    let mut c = server.client().await;
    for i in 0..10 {
        put(&mut c, &format!("p/{i}"), &i.to_string()).await; // r2..r11
    }
    put(&mut c, "q", "not watched").await; // r12
    const LIVE: i64 = 150;
    let endpoint = server.endpoint();
    let writer = tokio::spawn(async move {
        let mut c = crate::harness::connect_client(&endpoint).await;
        for i in 10..10 + LIVE {
            put(&mut c, &format!("p/{i}"), &i.to_string()).await; // r13..
        }
    });
    let mut w = RawWatch::open(&server.endpoint()).await;
    w.create_ok(watch_req(b"p/", &prefix_end(b"p/"), 3)).await;
    let total = 9 + LIVE as usize; // r3..r11, then the live writes
    let events = collect_events(&mut w, total).await.remove(&0).unwrap();
    within("writer", writer).await.unwrap();
    let revs: Vec<i64> = events.iter().map(|e| e.rev).collect();
    let expected: Vec<i64> = (3..=11).chain(13..13 + LIVE).collect();
    assert_eq!(revs, expected, "every revision once, in order");
    for e in &events {
        let i: i64 = e.value.parse().unwrap();
        assert_eq!(e.key, format!("p/{i}"));
        assert!(e.put && e.prev.is_none());
    }
}

#[tokio::test]
async fn future_start_revision_stays_silent_until_reached() {
    let server = TestServer::start();
    let mut c = server.client().await;
    let mut w = RawWatch::open(&server.endpoint()).await;
    let future = w.create_ok(watch_req(b"k", b"", 4)).await.watch_id;
    let barrier = w.create_ok(watch_req(b"k", b"", 0)).await.watch_id;
    put(&mut c, "k", "2").await; // r2
    put(&mut c, "k", "3").await; // r3
    let got = collect_events(&mut w, 2).await;
    assert_eq!(got.keys().copied().collect::<Vec<_>>(), [barrier]);
    assert_eq!(
        got[&barrier],
        [put_ev("k", 2, "2", None), put_ev("k", 3, "3", None)]
    );
    put(&mut c, "k", "4").await; // r4
    let got = collect_events(&mut w, 2).await;
    assert_eq!(got[&future], [put_ev("k", 4, "4", None)]);
    assert_eq!(got[&barrier], [put_ev("k", 4, "4", None)]);
}

#[tokio::test]
async fn compacted_start_revision_is_created_then_canceled() {
    let server = TestServer::start();
    let mut c = server.client().await;
    for i in 2..=6 {
        put(&mut c, "k", &i.to_string()).await; // r2..r6
    }
    within("compact", c.compact(4, None)).await.unwrap();
    let mut w = RawWatch::open(&server.endpoint()).await;
    let id = w.create_ok(watch_req(b"k", b"", 3)).await.watch_id;
    let r = w.next().await;
    assert!(r.canceled && !r.created, "{r:?}");
    assert_eq!((r.watch_id, r.compact_revision), (id, 4));
    assert!(r.events.is_empty());

    // Starting exactly at the compacted revision replays from there.
    let id = w.create_ok(watch_req(b"k", b"", 4)).await.watch_id;
    let got = collect_events(&mut w, 3).await;
    assert_eq!(
        got[&id],
        [
            put_ev("k", 4, "4", None),
            put_ev("k", 5, "5", None),
            put_ev("k", 6, "6", None)
        ]
    );
}

#[tokio::test]
async fn prev_kv_is_sent_only_when_requested() {
    let server = TestServer::start();
    let mut c = server.client().await;
    let mut w = RawWatch::open(&server.endpoint()).await;
    let mut with_prev = watch_req(b"k", b"", 0);
    with_prev.prev_kv = true;
    let a = w.create_ok(with_prev).await.watch_id;
    let b = w.create_ok(watch_req(b"k", b"", 0)).await.watch_id;
    put(&mut c, "k", "v1").await; // r2
    put(&mut c, "k", "v2").await; // r3
    within("delete", c.delete("k", None)).await.unwrap(); // r4
    let got = collect_events(&mut w, 6).await;
    assert_eq!(
        got[&a],
        [
            put_ev("k", 2, "v1", None),
            put_ev("k", 3, "v2", Some("v1")),
            del_ev("k", 4, Some("v2")),
        ]
    );
    assert_eq!(
        got[&b],
        [
            put_ev("k", 2, "v1", None),
            put_ev("k", 3, "v2", None),
            del_ev("k", 4, None),
        ]
    );
    // The raw delete event: only key and mod_revision; prev_kv is complete.
    let mut raw = RawWatch::open(&server.endpoint()).await;
    let mut req = watch_req(b"k", b"", 4);
    req.prev_kv = true;
    raw.create_ok(req).await;
    let r = raw.next().await;
    let e = &r.events[0];
    let kv = e.kv.as_ref().unwrap();
    assert_eq!(e.r#type, EventType::Delete as i32);
    assert_eq!(
        (&kv.key[..], kv.create_revision, kv.mod_revision, kv.version),
        (&b"k"[..], 0, 4, 0)
    );
    assert!(kv.value.is_empty() && kv.lease == 0);
    let p = e.prev_kv.as_ref().unwrap();
    assert_eq!(
        (&p.value[..], p.create_revision, p.mod_revision, p.version),
        (&b"v2"[..], 2, 3, 2)
    );
}

#[tokio::test]
async fn noput_and_nodelete_filters() {
    let server = TestServer::start();
    let mut c = server.client().await;
    let mut w = RawWatch::open(&server.endpoint()).await;
    let end = prefix_end(b"p/");
    let mut noput = watch_req(b"p/", &end, 0);
    noput.filters = vec![FilterType::Noput as i32];
    let mut nodelete = watch_req(b"p/", &end, 0);
    nodelete.filters = vec![FilterType::Nodelete as i32];
    let np = w.create_ok(noput).await.watch_id;
    let nd = w.create_ok(nodelete).await.watch_id;
    put(&mut c, "p/a", "1").await; // r2
    put(&mut c, "p/b", "2").await; // r3
    within("delete", c.delete("p/a", None)).await.unwrap(); // r4
    put(&mut c, "p/a", "3").await; // r5
    within(
        "delete",
        c.delete("p/", Some(etcd_client::DeleteOptions::new().with_prefix())),
    )
    .await
    .unwrap(); // r6
    let got = collect_events(&mut w, 6).await;
    assert_eq!(
        got[&np],
        [
            del_ev("p/a", 4, None),
            del_ev("p/a", 6, None),
            del_ev("p/b", 6, None)
        ]
    );
    assert_eq!(
        got[&nd],
        [
            put_ev("p/a", 2, "1", None),
            put_ev("p/b", 3, "2", None),
            put_ev("p/a", 5, "3", None)
        ]
    );
}

#[tokio::test]
async fn cancel_stops_a_watcher_and_unknown_ids_get_no_answer() {
    let server = TestServer::start();
    let mut c = server.client().await;
    let mut w = RawWatch::open(&server.endpoint()).await;
    let a = w.create_ok(watch_req(b"k", b"", 0)).await.watch_id;
    let b = w.create_ok(watch_req(b"k", b"", 0)).await.watch_id;
    w.cancel(a).await;
    let r = w.next().await;
    assert!(r.canceled && !r.created, "{r:?}");
    assert_eq!(r.watch_id, a);
    assert!(r.events.is_empty());

    put(&mut c, "k", "1").await; // r2
    let got = collect_events(&mut w, 1).await;
    assert_eq!(got[&b], [put_ev("k", 2, "1", None)]);

    w.cancel(999).await;
    put(&mut c, "k", "2").await; // r3
    let r = w.next().await;
    assert!(
        !r.canceled,
        "canceling an unknown ID is not answered: {r:?}"
    );
    assert_eq!(r.watch_id, b);
    assert_eq!(
        r.events.iter().map(ev).collect::<Vec<_>>(),
        [put_ev("k", 3, "2", None)]
    );
}

#[tokio::test]
async fn fragmented_responses_reassemble_to_all_events() {
    let server = ephd(&["--max-request-bytes", "1024"]);
    let mut c = server.client().await;
    let value = "v".repeat(400);
    for i in 0..6 {
        put(&mut c, &format!("f/{i}"), &value).await; // r2..r7
    }
    let end = prefix_end(b"f/");

    let mut frag = RawWatch::open(&server.endpoint()).await;
    let mut req = watch_req(b"f/", &end, 2);
    req.fragment = true;
    let id = frag.create_ok(req).await.watch_id;
    let mut pieces = Vec::new();
    loop {
        let r = frag.next().await;
        assert_eq!(r.watch_id, id);
        assert!(!r.events.is_empty(), "{r:?}");
        let last = !r.fragment;
        pieces.push(r);
        if last {
            break;
        }
    }
    assert!(pieces.len() >= 2, "6 x 400 bytes must be split under 1024");
    for p in &pieces {
        assert!(
            p.encoded_len() < 1024 || p.events.len() == 1,
            "fragment of {} bytes with {} events",
            p.encoded_len(),
            p.events.len()
        );
        assert_eq!(p.header.as_ref().unwrap().revision, 7);
    }
    let events: Vec<Ev> = pieces
        .iter()
        .flat_map(|p| p.events.iter().map(ev))
        .collect();
    let expected: Vec<Ev> = (0..6)
        .map(|i| put_ev(&format!("f/{i}"), i + 2, &value, None))
        .collect();
    assert_eq!(events, expected);

    // Without `fragment` the same history comes unsplit.
    let mut whole = RawWatch::open(&server.endpoint()).await;
    let id = whole.create_ok(watch_req(b"f/", &end, 2)).await.watch_id;
    let mut events = Vec::new();
    let mut largest = 0;
    while events.len() < 6 {
        let r = whole.next().await;
        assert_eq!(r.watch_id, id);
        assert!(!r.fragment);
        largest = largest.max(r.encoded_len());
        events.extend(r.events.iter().map(ev));
    }
    assert_eq!(events, expected);
    assert!(
        largest >= 1024,
        "an unfragmented response exceeds the limit"
    );
}

#[tokio::test]
async fn periodic_progress_notifications_for_watchers_that_ask() {
    let server = ephd(&["--experimental-watch-progress-notify-interval", "1s"]);
    let mut c = server.client().await;
    put(&mut c, "k", "1").await; // r2
    let mut w = RawWatch::open(&server.endpoint()).await;
    let mut req = watch_req(b"k", b"", 0);
    req.progress_notify = true;
    let notified = w.create_ok(req).await.watch_id;
    let silent = w.create_ok(watch_req(b"k", b"", 0)).await.watch_id;
    assert_ne!(notified, silent);

    let r = w.next().await;
    assert!(is_progress(&r), "{r:?}");
    assert_eq!(r.watch_id, notified, "only the watcher that asked");
    assert_eq!(r.header.as_ref().unwrap().revision, 2);

    put(&mut c, "unwatched", "x").await; // r3
                                         // A tick may still report 2 if it raced the put; the next one reports 3.
    for attempt in 0.. {
        let r = w.next().await;
        assert!(is_progress(&r), "{r:?}");
        assert_eq!(r.watch_id, notified);
        match r.header.as_ref().unwrap().revision {
            2 if attempt < 3 => continue,
            3 => break,
            other => panic!("progress #{attempt} at revision {other}, store is at 3"),
        }
    }
}

#[tokio::test]
async fn progress_request_revision_covers_every_delivered_event() {
    // etcd >= 3.5 semantics (3.4 answered at once, before pending events).
    let server = ephd(&[]);
    let mut c = server.client().await;
    let mut w = RawWatch::open(&server.endpoint()).await;

    // No watchers: not answered, as stock etcd 3.6 does (it answers only
    // while every watcher of the stream is synced); the next response is
    // the creation below.
    w.request_progress().await;
    let id = w
        .create_ok(watch_req(b"p/", &prefix_end(b"p/"), 0))
        .await
        .watch_id;

    // Idle: the answer is the current revision.
    put(&mut c, "other", "x").await; // r2
    w.request_progress().await;
    let r = w.next().await;
    assert!(is_progress(&r), "{r:?}");
    assert_eq!(r.watch_id, -1);
    assert_eq!(r.header.as_ref().unwrap().revision, 2);

    // Busy: every answer R comes after every event at or below R.
    const WRITES: i64 = 300;
    let endpoint = server.endpoint();
    let writer = tokio::spawn(async move {
        let mut c = crate::harness::connect_client(&endpoint).await;
        for i in 0..WRITES {
            put(&mut c, &format!("p/{i}"), "v").await; // r3..
        }
    });
    let last = 2 + WRITES;
    let mut seen = 2;
    let mut responses = 0;
    let mut progress_answers = 0;
    let mut pending = false;
    while seen < last || pending {
        if !pending && responses % 4 == 0 {
            w.request_progress().await;
            pending = true;
        }
        responses += 1;
        let r = w.next().await;
        if is_progress(&r) {
            assert_eq!(r.watch_id, -1);
            let at = r.header.as_ref().unwrap().revision;
            assert!(
                at <= seen,
                "progress at {at} before the event at {} was delivered",
                seen + 1
            );
            pending = false;
            progress_answers += 1;
            continue;
        }
        assert_eq!(r.watch_id, id, "{r:?}");
        for e in r.events.iter().map(ev) {
            assert_eq!(e.rev, seen + 1, "events arrive once, in revision order");
            seen = e.rev;
        }
    }
    within("writer", writer).await.unwrap();
    assert!(progress_answers >= 1);
}

#[tokio::test]
async fn prev_kv_below_the_compacted_revision_is_not_sent() {
    // etcd reads an event's prev_kv at mod_revision - 1; below the compacted
    // revision that read fails and the event goes out without prev_kv
    // (WatchCreateRequest.prev_kv: "If the previous KV is already
    // compacted, nothing will be returned").
    let server = TestServer::start();
    let mut c = server.client().await;
    put(&mut c, "k", "v1").await; // r2
    put(&mut c, "k", "v2").await; // r3
    put(&mut c, "k", "v3").await; // r4
    within("compact", c.compact(3, None)).await.unwrap();
    let mut w = RawWatch::open(&server.endpoint()).await;
    let mut req = watch_req(b"k", b"", 3);
    req.prev_kv = true;
    let id = w.create_ok(req).await.watch_id;
    let got = collect_events(&mut w, 2).await;
    assert_eq!(
        got[&id],
        [put_ev("k", 3, "v2", None), put_ev("k", 4, "v3", Some("v2"))]
    );
}

#[tokio::test]
async fn events_of_one_revision_arrive_in_one_response() {
    let server = TestServer::start();
    let mut c = server.client().await;
    let mut w = RawWatch::open(&server.endpoint()).await;
    let id = w
        .create_ok(watch_req(b"t/", &prefix_end(b"t/"), 0))
        .await
        .watch_id;
    within(
        "txn",
        c.txn(etcd_client::Txn::new().and_then([
            etcd_client::TxnOp::put("t/a", "1", None),
            etcd_client::TxnOp::put("t/b", "2", None),
            etcd_client::TxnOp::put("u", "not watched", None),
            etcd_client::TxnOp::put("t/c", "3", None),
        ])),
    )
    .await
    .unwrap(); // r2
    let r = w.next().await;
    assert_eq!(r.watch_id, id);
    assert_eq!(
        r.events.iter().map(ev).collect::<Vec<_>>(),
        [
            put_ev("t/a", 2, "1", None),
            put_ev("t/b", 2, "2", None),
            put_ev("t/c", 2, "3", None)
        ],
        "a revision is never split across responses"
    );
    assert_eq!(r.header.as_ref().unwrap().revision, 2);
}

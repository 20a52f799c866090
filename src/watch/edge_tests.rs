//! Edge cases of watch streams, in process: compacted and future start
//! revisions, cancellation by compaction, filters, and the order of
//! progress notifications relative to events.

use super::*;
use crate::mvcc::{DeleteRequest, PutRequest, StoreConfig};

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

fn put(store: &Store, k: &str) -> i64 {
    store
        .put(PutRequest {
            key: b(k),
            value: b("v"),
            ..Default::default()
        })
        .unwrap()
        .revision
}

fn watch(store: &Store, ws: &mut WatchStream, spec: WatchSpec) -> Vec<Output> {
    ws.create(store, spec)
}

fn prefix(start_revision: i64) -> WatchSpec {
    WatchSpec {
        key: b("k"),
        range_end: b("l"),
        start_revision,
        ..Default::default()
    }
}

/// Every (watch id, event revision) delivered by `outs`, in order.
fn delivered(outs: &[Output]) -> Vec<(i64, i64)> {
    outs.iter()
        .flat_map(|o| match o {
            Output::Events {
                watch_id, events, ..
            } => events
                .iter()
                .map(|e| (*watch_id, e.kv.mod_revision))
                .collect(),
            _ => Vec::new(),
        })
        .collect()
}

#[test]
fn a_start_below_the_compaction_is_created_then_canceled() {
    let store = Store::new(StoreConfig::default());
    for _ in 0..5 {
        put(&store, "k1");
    }
    store.compact(4).unwrap();
    let mut ws = WatchStream::new();
    let outs = watch(&store, &mut ws, prefix(3));
    assert_eq!(
        outs,
        vec![
            Output::Created {
                watch_id: 0,
                revision: 6
            },
            Output::Compacted {
                watch_id: 0,
                compact_revision: 4
            }
        ]
    );
    assert!(ws.is_empty(), "the canceled watcher is gone");
    // Exactly at the compacted revision is still allowed.
    let outs = watch(&store, &mut ws, prefix(4));
    assert_eq!(outs.len(), 1);
    assert_eq!(
        delivered(&ws.poll(&store, 100)),
        vec![(1, 4), (1, 5), (1, 6)]
    );
}

#[test]
fn a_future_start_waits_for_its_revision() {
    let store = Store::new(StoreConfig::default());
    let now = put(&store, "k1");
    let mut ws = WatchStream::new();
    watch(&store, &mut ws, prefix(now + 3));
    assert!(ws.poll(&store, 100).is_empty());
    put(&store, "k1");
    put(&store, "k2");
    assert!(
        delivered(&ws.poll(&store, 100)).is_empty(),
        "below its start"
    );
    let r = put(&store, "k3");
    assert_eq!(delivered(&ws.poll(&store, 100)), vec![(0, r)]);
}

#[test]
fn a_lagging_watcher_is_canceled_once_compaction_passes_it() {
    let store = Store::new(StoreConfig::default());
    let mut ws = WatchStream::new();
    watch(&store, &mut ws, prefix(0)); // from now: revision 2 on
    watch(
        &store,
        &mut ws,
        WatchSpec {
            key: b("other"),
            ..Default::default()
        },
    );
    for _ in 0..4 {
        put(&store, "k1"); // 2..=5
    }
    store.compact(4).unwrap();
    let outs = ws.poll(&store, 100);
    assert_eq!(
        outs,
        vec![
            Output::Compacted {
                watch_id: 0,
                compact_revision: 4
            },
            Output::Compacted {
                watch_id: 1,
                compact_revision: 4
            }
        ],
        "both still needed revision 2"
    );
    assert!(ws.is_empty());
}

#[test]
fn filters_and_prev_kv() {
    let store = Store::new(StoreConfig::default());
    let mut ws = WatchStream::new();
    watch(
        &store,
        &mut ws,
        WatchSpec {
            no_put: true,
            prev_kv: true,
            ..prefix(0)
        },
    );
    watch(
        &store,
        &mut ws,
        WatchSpec {
            no_delete: true,
            ..prefix(0)
        },
    );
    let created = put(&store, "k1");
    let updated = put(&store, "k1");
    let deleted = store
        .delete_range(DeleteRequest {
            key: b("k1"),
            ..Default::default()
        })
        .unwrap()
        .revision;
    let outs = ws.poll(&store, 100);
    let mut got = delivered(&outs);
    got.sort();
    assert_eq!(got, vec![(0, deleted), (1, created), (1, updated)]);
    for out in &outs {
        if let Output::Events {
            watch_id, events, ..
        } = out
        {
            for e in events {
                let has_prev = e.prev_kv.is_some();
                assert_eq!(has_prev, *watch_id == 0, "prev_kv only when asked for");
            }
        }
    }
}

#[test]
fn requested_progress_comes_after_every_pending_event() {
    let store = Store::new(StoreConfig::default());
    let mut ws = WatchStream::new();
    watch(&store, &mut ws, prefix(0));
    for _ in 0..10 {
        put(&store, "k1");
    }
    ws.request_progress(&store);
    let mut outs = Vec::new();
    for _ in 0..20 {
        outs.extend(ws.poll(&store, 3));
    }
    let progress_at = outs
        .iter()
        .position(|o| matches!(o, Output::Progress { .. }))
        .expect("answered once caught up");
    assert_eq!(progress_at, outs.len() - 1, "after every event, once");
    let last_event = delivered(&outs).last().unwrap().1;
    assert_eq!(
        outs[progress_at],
        Output::Progress {
            watch_id: -1,
            revision: last_event
        }
    );
}

/// etcd 3.6 answers a progress request only while every watcher of the
/// stream is synced, and drops it otherwise (kube-apiserver asks again).
#[test]
fn progress_is_not_answered_while_a_watcher_is_unsynced_or_absent() {
    let store = Store::new(StoreConfig::default());
    let first = put(&store, "k1");
    put(&store, "k1");
    let mut ws = WatchStream::new();
    ws.request_progress(&store);
    assert!(ws.poll(&store, 10).is_empty(), "no watcher: no answer");

    // Replaying history: unsynced until caught up.
    watch(&store, &mut ws, prefix(first));
    ws.request_progress(&store);
    let outs = ws.poll(&store, 10);
    assert!(!delivered(&outs).is_empty());
    assert!(
        !outs.iter().any(|o| matches!(o, Output::Progress { .. })),
        "asked while replaying: dropped"
    );
    ws.request_progress(&store);
    assert!(matches!(
        ws.poll(&store, 10).as_slice(),
        [Output::Progress { watch_id: -1, .. }]
    ));

    // A watcher that starts above the current revision holds it back.
    let current = store.log().latest();
    watch(&store, &mut ws, prefix(current + 1));
    ws.request_progress(&store);
    assert!(ws.poll(&store, 10).is_empty(), "future watcher: no answer");
    let r = put(&store, "k1");
    ws.poll(&store, 10);
    ws.request_progress(&store);
    assert_eq!(
        ws.poll(&store, 10),
        vec![Output::Progress {
            watch_id: -1,
            revision: r
        }]
    );
}

#[test]
fn periodic_progress_goes_only_to_idle_caught_up_watchers_that_asked() {
    let store = Store::new(StoreConfig::default());
    let mut ws = WatchStream::new();
    watch(
        &store,
        &mut ws,
        WatchSpec {
            progress_notify: true,
            ..prefix(0)
        },
    );
    watch(&store, &mut ws, prefix(0)); // did not ask
    let r = put(&store, "k1");
    // Behind: no progress may overtake the pending event.
    assert!(ws.progress_tick(&store).is_empty());
    assert_eq!(delivered(&ws.poll(&store, 100)), vec![(0, r), (1, r)]);
    // Events were sent since the last tick: not idle.
    assert!(ws.progress_tick(&store).is_empty());
    assert_eq!(
        ws.progress_tick(&store),
        vec![Output::Progress {
            watch_id: 0,
            revision: r
        }]
    );
}

#[test]
fn ids_and_ranges_are_checked_at_creation() {
    let store = Store::new(StoreConfig::default());
    let mut ws = WatchStream::new();
    let spec = WatchSpec {
        watch_id: 7,
        ..prefix(0)
    };
    assert!(matches!(
        watch(&store, &mut ws, spec.clone())[..],
        [Output::Created { watch_id: 7, .. }]
    ));
    assert!(matches!(
        watch(&store, &mut ws, spec)[..],
        [Output::CreateFailed { .. }]
    ));
    let backwards = WatchSpec {
        key: b("z"),
        range_end: b("a"),
        ..Default::default()
    };
    assert!(matches!(
        watch(&store, &mut ws, backwards)[..],
        [Output::CreateFailed { .. }]
    ));
    // Server-chosen IDs skip the ones clients took.
    let first = watch(&store, &mut ws, prefix(0));
    assert!(matches!(first[..], [Output::Created { watch_id: 0, .. }]));
    assert_eq!(ws.cancel(&store, 99), None, "unknown IDs get no answer");
    assert!(ws.cancel(&store, 7).is_some());
}

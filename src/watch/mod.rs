//! Watch streams: many watchers per client stream, replay from any retained
//! revision, live delivery, and progress notifications.
//!
//! A [`WatchStream`] is the state of one client stream, driven by the gRPC
//! adapter: it never buffers events itself. Each watcher keeps only the next
//! revision it needs and every [`WatchStream::poll`] reads the store's
//! revision-ordered change log from the lowest such revision. Catch-up from
//! history and live delivery are therefore the same code path, events come
//! exactly once and in revision order, and a consumer that stops reading
//! holds up nobody: its stream simply stops polling while writers keep
//! appending to the log (whose size compaction bounds).

use crate::error::{ERR_DUPLICATE_ID, ERR_EMPTY_RANGE};
use crate::mvcc::range::in_range;
use crate::mvcc::{Event, EventKind, Store};
use bytes::Bytes;
use std::collections::BTreeMap;

/// A watch create request, already decoded from the wire.
#[derive(Debug, Clone, Default)]
pub struct WatchSpec {
    /// Client-chosen ID, or 0 to let the stream pick one.
    pub watch_id: i64,
    /// First key.
    pub key: Bytes,
    /// Range end with Range's conventions.
    pub range_end: Bytes,
    /// First revision to deliver; 0 means "from now".
    pub start_revision: i64,
    /// Skip PUT events.
    pub no_put: bool,
    /// Skip DELETE events.
    pub no_delete: bool,
    /// Include the previous version in events.
    pub prev_kv: bool,
    /// Split large responses into fragments.
    pub fragment: bool,
    /// Send periodic progress notifications when idle.
    pub progress_notify: bool,
}

/// Something to send to the client, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// The watch exists (`created = true`).
    Created {
        /// Its ID.
        watch_id: i64,
        /// Store revision at creation.
        revision: i64,
    },
    /// The create failed (`created`, `canceled`, `watch_id = -1`).
    CreateFailed {
        /// Store revision at the attempt.
        revision: i64,
        /// etcd's reason text.
        reason: &'static str,
    },
    /// Events for one watcher, in revision order.
    Events {
        /// The watcher.
        watch_id: i64,
        /// Revision up to which this stream has read.
        revision: i64,
        /// The events (prev_kv already removed when not requested).
        events: Vec<Event>,
        /// Whether the watcher accepts fragmented responses.
        fragment: bool,
    },
    /// The watcher needs history that compaction removed; it is canceled.
    Compacted {
        /// The watcher.
        watch_id: i64,
        /// The compacted revision.
        compact_revision: i64,
    },
    /// The watcher was canceled at the client's request.
    Canceled {
        /// The watcher.
        watch_id: i64,
        /// Store revision at cancellation.
        revision: i64,
    },
    /// Everything at or below `revision` has been sent (`watch_id = -1` for
    /// a requested, stream-wide progress).
    Progress {
        /// The watcher, or -1.
        watch_id: i64,
        /// The revision.
        revision: i64,
    },
}

/// Bytes of keys and values (previous versions included) one
/// [`WatchStream::poll`] reads from the log, beyond its first revision.
///
/// Each poll's outputs become responses that wait in the stream's channel
/// and HTTP/2 buffers until the client reads them, so this bounds what a
/// stream that stopped reading holds (about its channel's length times
/// this, shared with the store until compaction, plus one encoded response)
/// and how large one response gets while a watcher catches up over large
/// values. A revision is never split, so a single larger revision still
/// comes whole.
pub const BATCH_BYTES: usize = 1 << 20;

struct Watcher {
    spec: WatchSpec,
    next_rev: i64,
    // No events sent since the last periodic progress tick.
    idle: bool,
    // Created to replay history (a start revision at or below the current
    // one) and not caught up since: etcd's "unsynced" watcher.
    catching_up: bool,
}

/// One client stream's watchers; see the module docs.
#[derive(Default)]
pub struct WatchStream {
    watchers: BTreeMap<i64, Watcher>,
    next_id: i64,
    progress_requested: bool,
}

impl WatchStream {
    /// A stream with no watchers.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of active watchers.
    pub fn len(&self) -> usize {
        self.watchers.len()
    }

    /// Whether the stream has no watchers.
    pub fn is_empty(&self) -> bool {
        self.watchers.is_empty()
    }

    /// Creates a watcher, with etcd's normalisation of the range and its
    /// rules for IDs, future and compacted start revisions.
    pub fn create(&mut self, store: &Store, mut spec: WatchSpec) -> Vec<Output> {
        let current = store.log().latest();
        if spec.key.is_empty() {
            spec.key = Bytes::from_static(b"\0");
        }
        let end = &spec.range_end;
        if !end.is_empty() && end.as_ref() != b"\0" && spec.key.as_ref() >= end.as_ref() {
            return vec![Output::CreateFailed {
                revision: current,
                reason: ERR_EMPTY_RANGE,
            }];
        }
        let id = if spec.watch_id == 0 {
            while self.watchers.contains_key(&self.next_id) {
                self.next_id += 1;
            }
            self.next_id += 1;
            self.next_id - 1
        } else if self.watchers.contains_key(&spec.watch_id) {
            return vec![Output::CreateFailed {
                revision: current,
                reason: ERR_DUPLICATE_ID,
            }];
        } else {
            spec.watch_id
        };
        spec.watch_id = id;
        let start = if spec.start_revision == 0 {
            current + 1
        } else {
            spec.start_revision
        };
        let mut out = vec![Output::Created {
            watch_id: id,
            revision: current,
        }];
        let compacted = store.compacted_revision();
        if start < compacted {
            out.push(Output::Compacted {
                watch_id: id,
                compact_revision: compacted,
            });
            return out;
        }
        self.watchers.insert(
            id,
            Watcher {
                spec,
                next_rev: start,
                idle: true,
                catching_up: start <= current,
            },
        );
        out
    }

    /// Cancels a watcher; unknown IDs get no answer, as in etcd.
    pub fn cancel(&mut self, store: &Store, watch_id: i64) -> Option<Output> {
        self.watchers.remove(&watch_id).map(|_| Output::Canceled {
            watch_id,
            revision: store.log().latest(),
        })
    }

    /// A stream-wide progress request, answered as etcd 3.6 answers it: not
    /// at all when the stream has no watcher, or when one of its watchers is
    /// still replaying history or starts above the current revision (etcd
    /// sends progress only while every watcher of the stream is synced, and
    /// drops the request otherwise; clients ask again). Otherwise the next
    /// [`WatchStream::poll`] answers it once the events already written are
    /// delivered, so the revision never overtakes an event.
    pub fn request_progress(&mut self, store: &Store) {
        let current = store.log().latest();
        let synced = |w: &Watcher| {
            let start = w.spec.start_revision;
            !w.catching_up && (start == 0 || start <= current)
        };
        if !self.watchers.is_empty() && self.watchers.values().all(synced) {
            self.progress_requested = true;
        }
    }

    /// Whether some watcher still has committed revisions to read.
    pub fn behind(&self, store: &Store) -> bool {
        let latest = store.log().latest();
        self.watchers.values().any(|w| w.next_rev <= latest)
    }

    /// Delivers up to `max_revisions` revisions of the log (and about
    /// [`BATCH_BYTES`]) to every watcher that needs them, then answers a pending progress request if all
    /// watchers are caught up.
    pub fn poll(&mut self, store: &Store, max_revisions: usize) -> Vec<Output> {
        let mut out = Vec::new();
        let latest = store.log().latest();
        let from = self
            .watchers
            .values()
            .map(|w| w.next_rev)
            .filter(|r| *r <= latest)
            .min();
        if let Some(from) = from {
            let (compacted, mut batch, limited) = store.read_log(from, max_revisions, BATCH_BYTES);
            // Watchers that still need history compaction removed are
            // canceled, as etcd does with unsynced watchers.
            let lagging: Vec<i64> = self
                .watchers
                .iter()
                .filter(|(_, w)| w.next_rev <= latest && w.next_rev < compacted)
                .map(|(id, _)| *id)
                .collect();
            for id in lagging {
                self.watchers.remove(&id);
                out.push(Output::Compacted {
                    watch_id: id,
                    compact_revision: compacted,
                });
            }
            batch.retain(|b| b.revision <= latest);
            let upto = if limited {
                batch.last().map_or(latest, |b| b.revision)
            } else {
                latest
            };
            for (id, w) in self.watchers.iter_mut() {
                if w.next_rev > upto {
                    continue;
                }
                let events: Vec<Event> = batch
                    .iter()
                    .filter(|b| b.revision >= w.next_rev && b.revision <= upto)
                    .map(|b| &b.event)
                    .filter(|e| matches(&w.spec, e))
                    .map(|e| deliverable(&w.spec, e, compacted))
                    .collect();
                w.next_rev = upto + 1;
                if w.next_rev > latest {
                    w.catching_up = false;
                }
                if !events.is_empty() {
                    w.idle = false;
                    out.push(Output::Events {
                        watch_id: *id,
                        revision: upto,
                        events,
                        fragment: w.spec.fragment,
                    });
                }
            }
        }
        if self.progress_requested && !self.behind(store) {
            // Answered once every watcher has caught up, so the revision never
            // overtakes an event.
            self.progress_requested = false;
            out.push(Output::Progress {
                watch_id: -1,
                revision: latest,
            });
        }
        out
    }

    /// The periodic progress tick: watchers that asked for progress
    /// notifications and got no events since the last tick are told the
    /// current revision (only when caught up, so it never overtakes events).
    pub fn progress_tick(&mut self, store: &Store) -> Vec<Output> {
        let latest = store.log().latest();
        let mut out = Vec::new();
        for (id, w) in self.watchers.iter_mut() {
            if !w.spec.progress_notify {
                continue;
            }
            if w.idle && w.next_rev > latest {
                out.push(Output::Progress {
                    watch_id: *id,
                    revision: latest,
                });
            }
            w.idle = true;
        }
        out
    }
}

fn matches(spec: &WatchSpec, e: &Event) -> bool {
    let filtered = match e.kind {
        EventKind::Put => spec.no_put,
        EventKind::Delete => spec.no_delete,
    };
    !filtered && in_range(&e.kv.key, &spec.key, &spec.range_end)
}

/// The event as this watcher gets it. Like etcd, which reads the previous
/// version at `mod_revision - 1`, `prev_kv` is left out when that revision
/// has been compacted.
fn deliverable(spec: &WatchSpec, e: &Event, compacted: i64) -> Event {
    let mut e = e.clone();
    if !spec.prev_kv || e.is_create() || e.kv.mod_revision - 1 < compacted {
        e.prev_kv = None;
    }
    e
}

#[cfg(test)]
mod edge_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mvcc::{PutRequest, StoreConfig};

    fn put(store: &Store, k: &str) {
        store
            .put(PutRequest {
                key: Bytes::copy_from_slice(k.as_bytes()),
                value: Bytes::from_static(b"v"),
                ..Default::default()
            })
            .unwrap();
    }

    #[test]
    fn replays_history_then_follows_live_without_gaps() {
        let store = Store::new(StoreConfig::default());
        put(&store, "a");
        put(&store, "b");
        let mut ws = WatchStream::new();
        let created = ws.create(
            &store,
            WatchSpec {
                key: Bytes::from_static(b"a"),
                range_end: Bytes::from_static(b"z"),
                start_revision: 2,
                ..Default::default()
            },
        );
        assert_eq!(created.len(), 1);
        put(&store, "c");
        let out = ws.poll(&store, 2);
        let Output::Events { events, .. } = &out[0] else {
            panic!("{out:?}")
        };
        assert_eq!(events.len(), 2, "first batch is bounded to two revisions");
        let out = ws.poll(&store, 2);
        let Output::Events { events, .. } = &out[0] else {
            panic!("{out:?}")
        };
        assert_eq!(events[0].kv.key.as_ref(), b"c");
        assert!(ws.poll(&store, 2).is_empty());
    }
}

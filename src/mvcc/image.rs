//! The whole MVCC state as plain data ([`StoreImage`]): what a cluster
//! member's Raft snapshot carries, so a member that catches up by snapshot
//! holds exactly what the others hold, history included.
//!
//! * [`Store::image`] captures it. The store's versions and events are
//!   shared (`Arc`), so a capture copies pointers, not keys and values; it
//!   is meant for the apply thread, which is the only writer in cluster
//!   mode, so the image is the state at one applied index.
//! * [`Store::install_image`] replaces a running store's state with an
//!   image, in place, atomically for readers (they wait on the compaction
//!   gate) and seamlessly for watchers: the change log is replaced too, and
//!   a watcher's cursor keeps pointing at the same revision of the same
//!   history (Raft only sends a snapshot of the log prefix this member is
//!   part of). A watcher whose cursor is below the image's compacted
//!   revision is cancelled as compacted, as after any compaction.

use super::history::Version;
use super::log::LoggedEvent;
use super::store::Store;
use super::types::{AlarmAction, AlarmMember, Event, KeyValue, Kv};
use bytes::Bytes;
use std::collections::HashMap;
use std::ops::Bound;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One version of a key in an image: its revision and its key-value, or
/// `None` for a deletion tombstone.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageVersion {
    /// The revision of the write that made it.
    pub revision: i64,
    /// The key-value, `None` for a deletion.
    pub kv: Option<Kv>,
}

/// A lease in an image: what the lessor of the member that captured it
/// knew (its remaining time at the capture).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageLease {
    /// Lease ID.
    pub id: i64,
    /// Granted TTL in seconds.
    pub ttl: i64,
    /// Milliseconds left at the capture.
    pub remaining_ms: i64,
}

/// The whole MVCC state of a store; see the module docs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StoreImage {
    /// The current revision.
    pub revision: i64,
    /// The compacted revision (-1: never compacted).
    pub compacted: i64,
    /// Applied mutating requests (Status' single-member raft index).
    pub applied_count: u64,
    /// Every key with a history, in key order, each with its versions
    /// oldest first (tombstones included): what reads at old revisions see.
    pub keys: Vec<(Bytes, Vec<ImageVersion>)>,
    /// The change log since the compacted revision, in log order: what a
    /// watch from a past revision replays.
    pub events: Vec<LoggedEvent>,
    /// Every lease.
    pub leases: Vec<ImageLease>,
    /// Every raised alarm.
    pub alarms: Vec<AlarmMember>,
    /// The limits in force when they were replicated (`limits.rs`);
    /// `None`: the store's own flags, which an install leaves alone.
    pub limits: Option<super::Limits>,
}

impl Store {
    /// Captures the whole state (see the module docs). The caller makes
    /// sure nothing writes meanwhile (in cluster mode: the apply thread).
    pub fn image(&self) -> StoreImage {
        let _gate = self.compaction_gate().read();
        let mut keys = Vec::new();
        self.index()
            .for_range(Bound::Unbounded, None, &mut |entry| {
                let versions = entry.versions.read();
                if !versions.is_empty() {
                    keys.push((
                        entry.key.clone(),
                        versions
                            .iter()
                            .map(|v| ImageVersion {
                                revision: v.rev,
                                kv: v.kv.clone(),
                            })
                            .collect(),
                    ));
                }
                true
            });
        let (events, _) = self.log().read_from(i64::MIN, usize::MAX, usize::MAX);
        let leases = self
            .lessor()
            .all(false, Instant::now())
            .into_iter()
            .map(|l| ImageLease {
                id: l.id,
                ttl: l.granted_ttl,
                remaining_ms: l.remaining_ms,
            })
            .collect();
        StoreImage {
            revision: self.current_revision(),
            compacted: self.compacted_revision(),
            applied_count: self.stats().applied_index.load(Ordering::Relaxed),
            keys,
            events,
            leases,
            alarms: self.alarm_table().all(),
            limits: self.limits_replicated().then(|| self.limits()),
        }
    }

    /// Replaces this store's whole state with `image` (see the module
    /// docs). Readers wait meanwhile; watchers are woken at the image's
    /// revision once it is in place.
    pub fn install_image(&self, image: StoreImage) {
        let now = Instant::now();
        {
            let _writers = self.range_writers().write();
            let _gate = self.compaction_gate().write();
            self.page_counts().clear();
            let mut old = Vec::new();
            self.index().for_range(Bound::Unbounded, None, &mut |e| {
                old.push(e.key.clone());
                true
            });
            for key in &old {
                self.index().remove(key);
            }
            let stats = self.stats();
            stats.total_bytes.store(0, Ordering::Relaxed);
            stats.live_bytes.store(0, Ordering::Relaxed);
            stats.live_keys.store(0, Ordering::Relaxed);
            stats.versions.store(0, Ordering::Relaxed);
            stats.backend_total.store(0, Ordering::Relaxed);
            stats.backend_live.store(0, Ordering::Relaxed);
            stats
                .applied_index
                .store(image.applied_count, Ordering::Relaxed);
            let mut attached: HashMap<i64, Vec<Bytes>> = HashMap::new();
            for (key, versions) in image.keys {
                let entry = self.index().get_or_insert(&key);
                let mut history = entry.versions.write();
                let mut last_live = None;
                for v in versions {
                    // Versions share the index's copy of the key.
                    let kv = v.kv.map(|kv| share_key(kv, &entry.key));
                    last_live = kv.as_ref().map(|kv| kv.lease);
                    stats.push_version(
                        &mut history,
                        Version {
                            rev: v.revision,
                            kv,
                        },
                    );
                }
                if let Some(lease) = last_live.filter(|l| *l != 0) {
                    attached.entry(lease).or_default().push(entry.key.clone());
                }
            }
            let events = image
                .events
                .into_iter()
                .map(|e| LoggedEvent {
                    revision: e.revision,
                    event: self.interned(e.event),
                })
                .collect();
            self.sequencer().reset(image.revision, events);
            self.set_compacted(image.compacted);
            self.lessor().clear();
            for l in image.leases {
                let keys = attached.remove(&l.id).unwrap_or_default();
                let remaining = Duration::from_millis(l.remaining_ms.max(0) as u64);
                self.lessor().restore(l.id, l.ttl, remaining, keys, now);
            }
            self.alarm_table().clear();
            for a in image.alarms {
                self.alarm_table()
                    .apply(AlarmAction::Activate, a.member_id, a.alarm);
            }
            if let Some(limits) = image.limits {
                self.set_limits(limits);
            }
        }
        self.log().publish(image.revision);
    }

    /// An event whose key-values are the very ones the histories hold when
    /// they are there, so an installed image costs no more memory than the
    /// store it was captured from.
    fn interned(&self, mut event: Event) -> Event {
        let find = |kv: &Kv| -> Option<Kv> {
            let entry = self.index().get(&kv.key)?;
            let versions = entry.versions.read();
            versions
                .iter()
                .filter_map(|v| v.kv.as_ref())
                .find(|h| h.mod_revision == kv.mod_revision && ***h == **kv)
                .cloned()
        };
        if let Some(kv) = find(&event.kv) {
            event.kv = kv;
        }
        if let Some(prev) = event.prev_kv.as_ref().and_then(find) {
            event.prev_kv = Some(prev);
        }
        event
    }
}

fn share_key(kv: Kv, key: &Bytes) -> Kv {
    if kv.key.as_ptr() == key.as_ptr() {
        return kv;
    }
    Arc::new(KeyValue {
        key: key.clone(),
        ..(*kv).clone()
    })
}

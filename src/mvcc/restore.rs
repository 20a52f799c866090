//! Loading a store from a snapshot: key-values keep their revisions, and
//! leases their remaining time.

use super::history::Version;
use super::store::Store;
use super::types::KeyValue;
use crate::lease::RestoredLease;
use bytes::Bytes;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// TTL of a re-created lease when neither the snapshot nor the adoption
/// setting gives one: etcd's event TTL.
const FALLBACK_TTL: i64 = 3660;

impl Store {
    /// Loads key-values restored from a snapshot, keeping their revisions,
    /// and re-creates their leases. Only for a store that has served nothing
    /// yet, built with an `initial_revision` above every restored revision.
    /// Keys naming a lease the snapshot lacks get a fresh lease with the
    /// adoption TTL (or etcd's event TTL, 3660 s) so they still expire.
    pub fn load(&self, kvs: Vec<KeyValue>, leases: Vec<RestoredLease>) {
        let now = Instant::now();
        let mut attached: HashMap<i64, Vec<Bytes>> = HashMap::new();
        for kv in kvs {
            let entry = self.index().get_or_insert(&kv.key);
            let kv = Arc::new(KeyValue {
                key: entry.key.clone(),
                ..kv
            });
            if kv.lease != 0 {
                attached.entry(kv.lease).or_default().push(kv.key.clone());
            }
            self.stats().push_version(
                &mut entry.versions.write(),
                Version {
                    rev: kv.mod_revision,
                    kv: Some(kv),
                },
            );
        }
        for l in leases {
            let keys = attached.remove(&l.id).unwrap_or_default();
            self.lessor().restore(l.id, l.ttl, l.remaining, keys, now);
        }
        let fallback = self
            .config()
            .lessor
            .adopt_unknown_ttl
            .unwrap_or(FALLBACK_TTL);
        let mut missing: Vec<_> = attached.into_iter().collect();
        missing.sort_by_key(|(id, _)| *id);
        for (id, keys) in missing {
            tracing::warn!(
                lease = id,
                keys = keys.len(),
                "snapshot keys name a missing lease; re-creating it"
            );
            self.lessor().restore(
                id,
                fallback,
                Duration::from_secs(fallback as u64),
                keys,
                now,
            );
        }
    }
}

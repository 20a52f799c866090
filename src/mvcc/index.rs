//! The key index: every key that has a history, ordered for ranges and
//! hashed for point lookups.
//!
//! Kubernetes writes and reads single keys far more often than it lists, and
//! a skip-list search over a large key space costs a cache miss per level
//! (the skip-list search was a large share of the put profile before this
//! index existed; BENCHMARKS.md has the profile). So each key's history
//! lives in one shared [`KeyEntry`], reachable two ways:
//! * a lock-free ordered skip list (crossbeam), for ranges and inserts;
//! * a sharded hash table, for point lookups, where a hit needs one hash and
//!   a couple of cache lines.
//!
//! Both always hold the same entries. Inserts happen under the key's hash
//! shard write lock (so two writers creating one key agree on one entry);
//! removals happen only in compaction, which holds the store exclusively.

use bytes::Bytes;
use crossbeam_skiplist::SkipMap;
use hashbrown::HashTable;
use parking_lot::RwLock;
use std::hash::BuildHasher;
use std::ops::Bound;
use std::sync::Arc;

use super::history::History;

/// Number of hash shards: enough that writers on two cores rarely meet on a
/// shard lock, few enough that empty shards cost nothing noticeable.
const SHARDS: usize = 64;

/// One key's history, oldest first, and the key's canonical bytes (shared by
/// the index and every version of the key, never a slice of a request).
pub(crate) struct KeyEntry {
    pub(crate) key: Bytes,
    pub(crate) versions: RwLock<History>,
}

/// A shared handle to a key's entry.
pub(crate) type EntryRef = Arc<KeyEntry>;

/// The ordered and hashed key index; see the module docs.
pub(crate) struct Index {
    ordered: SkipMap<Bytes, EntryRef>,
    shards: Box<[RwLock<HashTable<EntryRef>>]>,
    hasher: foldhash::fast::RandomState,
}

impl Default for Index {
    fn default() -> Self {
        Index {
            ordered: SkipMap::new(),
            shards: (0..SHARDS).map(|_| RwLock::new(HashTable::new())).collect(),
            hasher: foldhash::fast::RandomState::default(),
        }
    }
}

impl Index {
    fn shard(&self, hash: u64) -> &RwLock<HashTable<EntryRef>> {
        // The table uses the low bits; pick the shard from the high ones.
        &self.shards[(hash >> 58) as usize % SHARDS]
    }

    /// The entry of `key`, if it has one.
    pub(crate) fn get(&self, key: &[u8]) -> Option<EntryRef> {
        let hash = self.hasher.hash_one(key);
        self.shard(hash)
            .read()
            .find(hash, |e| e.key.as_ref() == key)
            .cloned()
    }

    /// The entry of `key`, created empty if missing. A new entry gets its own
    /// copy of the key, so the index never pins a request buffer.
    pub(crate) fn get_or_insert(&self, key: &[u8]) -> EntryRef {
        let hash = self.hasher.hash_one(key);
        let shard = self.shard(hash);
        if let Some(e) = shard.read().find(hash, |e| e.key.as_ref() == key) {
            return e.clone();
        }
        let mut table = shard.write();
        if let Some(e) = table.find(hash, |e| e.key.as_ref() == key) {
            return e.clone();
        }
        let entry = Arc::new(KeyEntry {
            key: Bytes::copy_from_slice(key),
            versions: RwLock::new(History::new()),
        });
        self.ordered.insert(entry.key.clone(), entry.clone());
        table.insert_unique(hash, entry.clone(), |e| {
            self.hasher.hash_one(e.key.as_ref())
        });
        entry
    }

    /// Removes `key`'s entry. Only compaction calls this, holding the store
    /// exclusively, after the key's history became empty.
    pub(crate) fn remove(&self, key: &[u8]) {
        let hash = self.hasher.hash_one(key);
        let mut table = self.shard(hash).write();
        if let Ok(found) = table.find_entry(hash, |e| e.key.as_ref() == key) {
            found.remove();
        }
        // Give memory back only after a mass deletion. Shrinking as soon as a
        // quarter is used made churn (events created, expired, compacted
        // away, created again) rehash the table over and over, and each
        // rehash reads every key through two pointers.
        if table.capacity() > 1024 && table.len() * 16 < table.capacity() {
            table.shrink_to_fit(|e| self.hasher.hash_one(e.key.as_ref()));
        }
        drop(table);
        self.ordered.remove(key);
    }

    /// Entries with keys in `[from, to)` (`to == None`: no upper bound), in
    /// key order. Each item is visited while the skip list keeps it alive.
    ///
    /// This walks entry by entry (`lower_bound`, then `move_next`) rather
    /// than with `SkipMap::range`: in crossbeam-skiplist 0.1.3 the range
    /// iterator keeps a reference on every node it steps past, so a key that
    /// compaction later removed was never freed (about 245 bytes a key, found
    /// by the `store_ops` fuzz target's leak check). An entry handle releases
    /// its node when it moves on or is dropped.
    pub(crate) fn for_range(
        &self,
        from: Bound<&[u8]>,
        to: Option<&[u8]>,
        f: &mut dyn FnMut(&EntryRef) -> bool,
    ) {
        let Some(mut item) = self.ordered.lower_bound::<[u8]>(from) else {
            return;
        };
        loop {
            if to.is_some_and(|end| item.key().as_ref() >= end) {
                return;
            }
            if !f(item.value()) || !item.move_next() {
                return;
            }
        }
    }

    /// Number of keys with an entry (live or with history only).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.ordered.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashed_and_ordered_views_agree() {
        let index = Index::default();
        let keys: Vec<Vec<u8>> = (0..500u32)
            .rev()
            .map(|i| format!("/k/{i:05}").into_bytes())
            .collect();
        for k in &keys {
            let a = index.get_or_insert(k);
            let b = index.get_or_insert(k);
            assert!(Arc::ptr_eq(&a, &b), "one entry per key");
            assert_eq!(a.key.as_ref(), k.as_slice());
        }
        assert_eq!(index.len(), 500);
        let mut seen = Vec::new();
        index.for_range(Bound::Included(b"/k/00100"), Some(b"/k/00105"), &mut |e| {
            seen.push(e.key.clone());
            true
        });
        assert_eq!(seen.len(), 5);
        assert!(
            seen.windows(2).all(|w| w[0] < w[1]),
            "range is in key order"
        );
        for i in (0..500u32).step_by(2) {
            index.remove(format!("/k/{i:05}").as_bytes());
        }
        assert_eq!(index.len(), 250);
        assert!(index.get(b"/k/00100").is_none());
        assert!(index.get(b"/k/00101").is_some());
        let mut count = 0;
        index.for_range(Bound::Unbounded, None, &mut |e| {
            assert!(index.get(&e.key).is_some(), "every ordered key is hashed");
            count += 1;
            true
        });
        assert_eq!(count, 250);
    }

    /// Keys that a range walked past and that were then removed must be
    /// freed: nothing but the index may keep their entries alive.
    #[test]
    fn removed_entries_are_freed_after_a_range_walked_them() {
        let index = Index::default();
        let key = |i: u32| format!("/registry/events/ns/e{i:04}").into_bytes();
        let weak: Vec<std::sync::Weak<KeyEntry>> = (0..1_000)
            .map(|i| Arc::downgrade(&index.get_or_insert(&key(i))))
            .collect();
        // A full walk, a bounded one, and one stopped early by the callback.
        let mut n = 0;
        index.for_range(Bound::Unbounded, None, &mut |_| {
            n += 1;
            true
        });
        assert_eq!(n, 1_000);
        n = 0;
        index.for_range(Bound::Included(&key(100)), Some(&key(200)), &mut |_| {
            n += 1;
            true
        });
        assert_eq!(n, 100);
        n = 0;
        index.for_range(Bound::Excluded(&key(10)), None, &mut |e| {
            n += 1;
            e.key.as_ref() < key(20).as_slice()
        });
        assert_eq!(n, 10);
        for i in 0..1_000 {
            index.remove(&key(i));
        }
        assert_eq!(index.len(), 0);
        // The skip list frees removed nodes through epoch-based reclamation,
        // which waits until no thread (other tests' included) is pinned in
        // an older epoch: pin and flush until everything deferred ran. A
        // leaked reference never goes, and fails the test at the deadline.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let alive = loop {
            crossbeam_epoch::pin().flush();
            let alive = weak.iter().filter(|w| w.strong_count() > 0).count();
            if alive == 0 || std::time::Instant::now() > deadline {
                break alive;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        };
        assert_eq!(alive, 0, "entries still referenced after removal");
    }

    /// Removing almost every key shrinks the hash shards (a rehash): every
    /// key left must still be found, and removed ones must stay gone.
    #[test]
    fn lookups_survive_a_shrink_after_mass_removal() {
        let index = Index::default();
        let key = |i: u32| format!("/registry/events/ns/e{i:06}").into_bytes();
        for i in 0..200_000 {
            index.get_or_insert(&key(i));
        }
        for i in (0..200_000).filter(|i| i % 100 != 0) {
            index.remove(&key(i));
        }
        assert_eq!(index.len(), 2_000);
        for i in 0..200_000 {
            assert_eq!(index.get(&key(i)).is_some(), i % 100 == 0, "key {i}");
        }
        let total: usize = index.shards.iter().map(|s| s.read().capacity()).sum();
        assert!(
            total < 200_000,
            "the shards gave memory back: capacity {total}"
        );
    }
}

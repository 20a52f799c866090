//! The key index: every key that has a history, ordered for ranges and
//! hashed for point lookups.
//!
//! Kubernetes writes and reads single keys far more often than it lists, and
//! an ordered search over a large key space costs a cache miss per level
//! (the ordered search was a large share of the put profile before this
//! index existed; BENCHMARKS.md has the profile). So each key's history
//! lives in one shared [`KeyEntry`], reachable two ways:
//! * an ordered B-tree, for ranges and inserts;
//! * a sharded hash table, for point lookups, where a hit needs one hash and
//!   a couple of cache lines.
//!
//! Both always hold the same entries. Inserts happen under the key's hash
//! shard write lock (so two writers creating one key agree on one entry);
//! removals happen only in compaction, which holds the store exclusively.
//!
//! Why a B-tree under one lock rather than a lock-free skip list (crossbeam,
//! used before): a new key is inserted on every member for every create,
//! and a skip-list insert visits about twice as many nodes as there are
//! levels, each a cache miss plus another for the key bytes it compares.
//! The B-tree's insert took 2 to 3 times less CPU with 100,000 keys, and
//! the profile of a three-member cluster under `benchmark put` showed the
//! skip-list insert as half of the apply thread's time
//! (BENCHMARKS.md, "The key index as a B-tree"). The lock is never held while a caller's
//! code runs: a range walk copies at most [`WALK_CHUNK`] entry handles
//! under a read lock, releases it, visits them, and seeks past the last one
//! for the next chunk, so a long list delays an insert by one chunk's copy
//! at most.

use bytes::Bytes;
use hashbrown::HashTable;
use parking_lot::RwLock;
use std::collections::BTreeMap;
use std::hash::BuildHasher;
use std::ops::Bound;
use std::sync::Arc;

use super::history::History;

/// Number of hash shards: enough that writers on two cores rarely meet on a
/// shard lock, few enough that empty shards cost nothing noticeable.
const SHARDS: usize = 64;

/// Entries a range walk copies under one read lock of the ordered tree:
/// enough that the seek to the next chunk is a small share of the walk,
/// few enough that an insert waits microseconds at most behind a list.
pub(crate) const WALK_CHUNK: usize = 128;

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
    ordered: RwLock<BTreeMap<TreeKey, EntryRef>>,
    shards: Box<[RwLock<HashTable<EntryRef>>]>,
    hasher: foldhash::fast::RandomState,
}

impl Default for Index {
    fn default() -> Self {
        Index {
            ordered: RwLock::new(BTreeMap::new()),
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
        self.ordered
            .write()
            .insert(TreeKey::new(entry.key.clone()), entry.clone());
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
        self.ordered.write().remove(key);
    }

    /// Entries with keys in `[from, to)` (`to == None`: no upper bound), in
    /// key order, visited until `f` answers false. The tree is read in
    /// chunks of [`WALK_CHUNK`] (module docs): `f` runs without its lock, so
    /// it may insert or remove keys. A key inserted meanwhile is visited
    /// if it lies beyond the chunk in hand, not otherwise.
    pub(crate) fn for_range(
        &self,
        from: Bound<&[u8]>,
        to: Option<&[u8]>,
        f: &mut dyn FnMut(&EntryRef) -> bool,
    ) {
        let mut chunk: Vec<EntryRef> = Vec::new();
        let mut after: Option<Bytes> = None;
        loop {
            chunk.clear();
            {
                let tree = self.ordered.read();
                let lower = match &after {
                    Some(k) => Bound::Excluded(k.as_ref()),
                    None => from,
                };
                let upper = to.map_or(Bound::Unbounded, Bound::Excluded);
                // An empty or inverted range is no range (BTreeMap panics).
                if bounds_empty(lower, upper) {
                    return;
                }
                chunk.extend(
                    tree.range::<[u8], _>((lower, upper))
                        .take(WALK_CHUNK)
                        .map(|(_, e)| e.clone()),
                );
            }
            for entry in &chunk {
                if !f(entry) {
                    return;
                }
            }
            if chunk.len() < WALK_CHUNK {
                return;
            }
            after = chunk.last().map(|e| e.key.clone());
        }
    }

    /// Number of keys with an entry (live or with history only).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.ordered.read().len()
    }
}

/// A key of the ordered tree: its bytes, and its first eight bytes as a
/// number, compared first. Inserting a key compares it with a few keys per
/// level of the tree, and each full comparison reads the other key's bytes
/// from an allocation of their own, a cache miss each; keys that differ in
/// their first eight bytes are ordered by the numbers alone. The order is
/// the keys' byte order: a shorter key is padded with zeros, and where the
/// numbers differ at a padded byte the longer key has a non-zero byte
/// there after the same bytes, so it is the greater one either way.
#[derive(Clone)]
struct TreeKey {
    head: u64,
    key: Bytes,
}

impl TreeKey {
    fn new(key: Bytes) -> TreeKey {
        let mut head = [0u8; 8];
        let n = key.len().min(8);
        head[..n].copy_from_slice(&key[..n]);
        TreeKey {
            head: u64::from_be_bytes(head),
            key,
        }
    }
}

impl PartialEq for TreeKey {
    fn eq(&self, other: &Self) -> bool {
        self.head == other.head && self.key == other.key
    }
}

impl Eq for TreeKey {}

impl PartialOrd for TreeKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for TreeKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.head
            .cmp(&other.head)
            .then_with(|| self.key.cmp(&other.key))
    }
}

/// Lookups and ranges by plain bytes, which order the same way.
impl std::borrow::Borrow<[u8]> for TreeKey {
    fn borrow(&self) -> &[u8] {
        &self.key
    }
}

/// Whether no key lies between `lower` and `upper`; `BTreeMap::range`
/// panics on such bounds instead of returning nothing.
fn bounds_empty(lower: Bound<&[u8]>, upper: Bound<&[u8]>) -> bool {
    match (lower, upper) {
        (Bound::Included(l), Bound::Included(u)) => l > u,
        (Bound::Included(l) | Bound::Excluded(l), Bound::Excluded(u))
        | (Bound::Excluded(l), Bound::Included(u)) => l >= u,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tree_keys_order_as_their_bytes() {
        let mut keys: Vec<Vec<u8>> = vec![
            vec![],
            vec![0],
            vec![0, 0],
            vec![1],
            vec![1, 0],
            vec![1, 0, 0, 0, 0, 0, 0, 0],
            vec![1, 0, 0, 0, 0, 0, 0, 0, 0],
            vec![1, 0, 0, 0, 0, 0, 0, 0, 1],
            vec![1, 0, 0, 0, 0, 0, 0, 1],
            vec![255; 9],
            b"/registry/leases/kube-node-lease/node-1".to_vec(),
            b"/registry/leases/kube-node-lease/node-10".to_vec(),
            b"/registry/leases/kube-node-lease/node-2".to_vec(),
        ];
        // And pseudo-random short keys, many sharing prefixes and zeros.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..400 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = (x % 11) as usize;
            keys.push((0..len).map(|i| ((x >> (i * 5)) % 3) as u8).collect());
        }
        let tree: Vec<TreeKey> = keys
            .iter()
            .map(|k| TreeKey::new(Bytes::copy_from_slice(k)))
            .collect();
        for (a, ta) in keys.iter().zip(&tree) {
            for (b, tb) in keys.iter().zip(&tree) {
                assert_eq!(ta.cmp(tb), a.cmp(b), "{a:?} against {b:?}");
                assert_eq!(ta == tb, a == b);
            }
        }
    }

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
        let alive = weak.iter().filter(|w| w.strong_count() > 0).count();
        assert_eq!(alive, 0, "entries still referenced after removal");
    }

    /// A walk longer than one chunk visits every key once, in order, from
    /// either kind of lower bound; empty and inverted ranges visit nothing;
    /// and the callback, which runs without the tree's lock, may insert
    /// keys: one behind the walk is not visited, one beyond the chunk in hand
    /// is.
    #[test]
    fn walks_cross_chunks_in_order_and_tolerate_inserts_from_the_callback() {
        let index = Index::default();
        let key = |i: usize| format!("/k/{i:05}").into_bytes();
        let n = WALK_CHUNK * 3 + 7;
        for i in (0..n).rev() {
            index.get_or_insert(&key(i * 2));
        }
        let walk = |from: Bound<&[u8]>, to: Option<&[u8]>| {
            let mut seen = Vec::new();
            index.for_range(from, to, &mut |e| {
                seen.push(e.key.clone());
                true
            });
            seen
        };
        let all = walk(Bound::Unbounded, None);
        let expected: Vec<Bytes> = (0..n).map(|i| Bytes::from(key(i * 2))).collect();
        assert_eq!(all, expected);
        // Exactly one chunk, then a range ending on a chunk's last key.
        let first = walk(Bound::Included(&key(0)), Some(&key(WALK_CHUNK * 2)));
        assert_eq!(first, expected[..WALK_CHUNK]);
        let from = key(2);
        assert_eq!(walk(Bound::Excluded(&from), None), expected[2..]);
        assert_eq!(walk(Bound::Included(&key(3)), None), expected[2..]);
        assert!(walk(Bound::Included(&key(10)), Some(&key(10))).is_empty());
        assert!(walk(Bound::Excluded(&key(10)), Some(&key(10))).is_empty());
        assert!(walk(Bound::Included(&key(20)), Some(&key(10))).is_empty());
        assert!(walk(Bound::Excluded(&key(20)), Some(&key(10))).is_empty());
        // Inserting from the callback: an odd key just behind the current
        // one, and one two chunks ahead.
        let mut seen = 0;
        let mut ahead_seen = false;
        let ahead = key(WALK_CHUNK * 4 + 1);
        index.for_range(Bound::Unbounded, None, &mut |e| {
            seen += 1;
            ahead_seen |= e.key.as_ref() == ahead.as_slice();
            if e.key.as_ref() == key(20).as_slice() {
                index.get_or_insert(&key(19));
                index.get_or_insert(&ahead);
            }
            true
        });
        assert!(ahead_seen, "a key inserted ahead of the walk is visited");
        assert_eq!(seen, n + 1, "the key inserted behind the walk is not");
        assert_eq!(index.len(), n + 2);
    }

    /// Walks running while other threads create keys see every key at most
    /// once, in strictly increasing order, and every key that existed
    /// before they started.
    #[test]
    fn walks_beside_concurrent_inserts_stay_ordered_and_complete() {
        let index = Arc::new(Index::default());
        let key = |i: u32| format!("/registry/events/ns/e{i:07}").into_bytes();
        for i in (0..20_000).step_by(2) {
            index.get_or_insert(&key(i));
        }
        let writers: Vec<_> = (0..2u32)
            .map(|w| {
                let index = index.clone();
                std::thread::spawn(move || {
                    for i in (0..20_000u32).filter(|i| i % 4 == 1 + 2 * w) {
                        index.get_or_insert(&key(i));
                    }
                })
            })
            .collect();
        for _ in 0..20 {
            let mut last: Option<Bytes> = None;
            let mut even = 0;
            index.for_range(Bound::Unbounded, None, &mut |e| {
                if let Some(prev) = &last {
                    assert!(prev < &e.key, "out of order or repeated");
                }
                let n: u32 = std::str::from_utf8(&e.key[21..]).unwrap().parse().unwrap();
                even += usize::from(n.is_multiple_of(2));
                last = Some(e.key.clone());
                true
            });
            assert_eq!(even, 10_000, "every key there before the walk is visited");
        }
        for w in writers {
            w.join().unwrap();
        }
        assert_eq!(index.len(), 20_000);
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

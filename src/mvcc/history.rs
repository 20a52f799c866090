//! One key's version history: the versions a reader can still ask for,
//! oldest first, and the rules for reading and pruning it.
//!
//! This is the lowest layer of the store: it knows nothing about locks,
//! revisions being allocated or the index that holds histories.

use super::types::{KeyValue, Kv};

/// One version in a key's history; `kv == None` is a deletion tombstone.
#[derive(Debug, Clone)]
pub(crate) struct Version {
    /// The revision of the write that made this version.
    pub(crate) rev: i64,
    /// The key-value, or `None` for a deletion.
    pub(crate) kv: Option<Kv>,
}

/// A key's history, oldest first. Most keys hold a single version between
/// compactions, so it is stored inline: no allocation of its own.
pub(crate) type History = smallvec::SmallVec<[Version; 1]>;

/// The version visible at `rev`, if the key was live then.
pub(crate) fn visible(versions: &[Version], rev: i64) -> Option<&Kv> {
    versions
        .iter()
        .rev()
        .find(|v| v.rev <= rev)
        .and_then(|v| v.kv.as_ref())
}

/// The newest version, if the key is live now.
pub(crate) fn latest(versions: &[Version]) -> Option<&Kv> {
    versions.last().and_then(|v| v.kv.as_ref())
}

/// Bytes a version accounts for in the store's size counters.
pub(crate) fn kv_bytes(kv: &KeyValue) -> i64 {
    (kv.key.len() + kv.value.len()) as i64
}

/// Appends a version. Most keys hold one or two versions between
/// compactions, so a short history grows one slot at a time instead of
/// doubling.
pub(crate) fn push(versions: &mut History, version: Version) {
    if versions.len() == versions.capacity() && versions.len() < 4 {
        versions.reserve_exact(1);
    }
    versions.push(version);
}

/// The bytes `version` would take in etcd's backend (`backend_size.rs`).
pub(crate) fn backend_bytes(version: &Version) -> i64 {
    version
        .kv
        .as_ref()
        .map_or(super::backend_size::TOMBSTONE, |kv| {
            super::backend_size::version(kv_bytes(kv))
        })
}

/// What a compaction freed in one history.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Freed {
    /// Key and value bytes.
    pub kv_bytes: i64,
    /// Versions removed, tombstones included.
    pub versions: i64,
    /// Their bytes in etcd's backend measure.
    pub backend_bytes: i64,
}

/// Compaction at `rev`: removes every version below `rev` except the newest
/// one at or below it, and that one too if it is a tombstone (nobody can
/// read a deleted key at or after `rev`). Returns what it freed.
pub(crate) fn prune(versions: &mut History, rev: i64) -> Freed {
    let Some(keep_from) = versions.iter().rposition(|v| v.rev <= rev) else {
        return Freed::default();
    };
    let drop_to = if versions[keep_from].kv.is_none() {
        keep_from + 1
    } else {
        keep_from
    };
    if drop_to == 0 {
        return Freed::default();
    }
    let dropped = &versions[..drop_to];
    let freed = Freed {
        kv_bytes: dropped
            .iter()
            .filter_map(|v| v.kv.as_ref().map(|kv| kv_bytes(kv)))
            .sum(),
        versions: drop_to as i64,
        backend_bytes: dropped.iter().map(backend_bytes).sum(),
    };
    versions.drain(..drop_to);
    if versions.capacity() > 2 * versions.len() + 1 {
        versions.shrink_to_fit();
    }
    freed
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use std::sync::Arc;

    fn v(rev: i64, live: bool) -> Version {
        Version {
            rev,
            kv: live.then(|| {
                Arc::new(KeyValue {
                    key: Bytes::from_static(b"k"),
                    value: Bytes::from_static(b"val"),
                    mod_revision: rev,
                    ..Default::default()
                })
            }),
        }
    }

    fn revs(h: &History) -> Vec<i64> {
        h.iter().map(|v| v.rev).collect()
    }

    #[test]
    fn reads_pick_the_newest_version_at_or_below_the_revision() {
        let h: History = smallvec::smallvec![v(2, true), v(4, false), v(6, true)];
        assert!(visible(&h, 1).is_none(), "before the key existed");
        assert_eq!(visible(&h, 3).unwrap().mod_revision, 2);
        assert!(visible(&h, 4).is_none(), "deleted at 4");
        assert!(visible(&h, 5).is_none());
        assert_eq!(visible(&h, 6).unwrap().mod_revision, 6);
        assert_eq!(visible(&h, i64::MAX).unwrap().mod_revision, 6);
        assert_eq!(latest(&h).unwrap().mod_revision, 6);
        let dead: History = smallvec::smallvec![v(2, true), v(3, false)];
        assert!(latest(&dead).is_none());
    }

    #[test]
    fn prune_keeps_the_newest_version_at_or_below_the_compaction() {
        let mut h: History = smallvec::smallvec![v(2, true), v(4, true), v(6, true)];
        let freed = prune(&mut h, 5);
        assert_eq!(
            (freed.kv_bytes, freed.versions),
            (4, 1),
            "one version of k=val freed"
        );
        assert_eq!(freed.backend_bytes, backend_bytes(&v(2, true)));
        assert_eq!(revs(&h), vec![4, 6]);
        // Reads at and above the compaction are unchanged.
        assert_eq!(visible(&h, 5).unwrap().mod_revision, 4);
        assert_eq!(visible(&h, 6).unwrap().mod_revision, 6);
    }

    #[test]
    fn prune_drops_a_tombstone_at_or_below_the_compaction() {
        let mut h: History = smallvec::smallvec![v(2, true), v(4, false)];
        let freed = prune(&mut h, 5);
        assert_eq!(
            (freed.kv_bytes, freed.versions),
            (4, 2),
            "the version and its tombstone"
        );
        assert_eq!(
            freed.backend_bytes,
            backend_bytes(&v(2, true)) + super::super::backend_size::TOMBSTONE
        );
        assert!(h.is_empty(), "a deleted key leaves no history");
        let mut h: History = smallvec::smallvec![v(2, true), v(4, false), v(7, true)];
        prune(&mut h, 4);
        assert_eq!(revs(&h), vec![7], "exactly at the tombstone's revision");
    }

    #[test]
    fn prune_leaves_histories_entirely_above_the_compaction() {
        let mut h: History = smallvec::smallvec![v(7, true), v(8, false)];
        assert_eq!(prune(&mut h, 5), Freed::default());
        assert_eq!(revs(&h), vec![7, 8]);
        let mut h: History = smallvec::smallvec![v(5, true)];
        assert_eq!(
            prune(&mut h, 5),
            Freed::default(),
            "the newest version at the revision stays"
        );
        assert_eq!(revs(&h), vec![5]);
    }

    #[test]
    fn push_grows_short_histories_one_slot_at_a_time() {
        let mut h = History::new();
        for rev in 1..=3 {
            push(&mut h, v(rev, true));
            assert_eq!(h.capacity(), h.len().max(1), "exact growth while short");
        }
    }
}

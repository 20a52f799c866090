//! Which keys a write locks, and how it reads and writes through them.
//!
//! Writers that touch only single keys (every Kubernetes write) lock just
//! those keys' histories, in key order, so writers of different keys run in
//! parallel. A write that touches a range (a range delete, a range compare
//! or a range read inside a write txn) holds the store's range-writer lock
//! exclusively instead, and then reaches every key directly.

use super::history::{visible, History};
use super::index::{EntryRef, Index};
use super::range::KvSource;
use super::types::*;
use super::view::LockedRead;
use bytes::Bytes;
use parking_lot::RwLockWriteGuard;

/// The keys a write must lock, or whether it needs every key (any range in
/// a compare or op, nested txns included).
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct LockPlan {
    /// The single keys, sorted and without duplicates.
    pub(crate) keys: Vec<Bytes>,
    /// Whether the write touches a range.
    pub(crate) all_keys: bool,
}

impl LockPlan {
    /// The plan for a write txn.
    pub(crate) fn for_txn(req: &TxnRequest) -> Self {
        let mut plan = LockPlan::default();
        plan.collect(req);
        plan.keys.sort();
        plan.keys.dedup();
        plan
    }

    fn add(&mut self, key: &Bytes, range_end: &Bytes) {
        if range_end.is_empty() {
            self.keys.push(key.clone());
        } else {
            self.all_keys = true;
        }
    }

    fn collect(&mut self, req: &TxnRequest) {
        for c in &req.compare {
            self.add(&c.key, &c.range_end);
        }
        for op in req.success.iter().chain(req.failure.iter()) {
            match op {
                RequestOp::Range(r) => self.add(&r.key, &r.range_end),
                RequestOp::Put(p) => self.add(&p.key, &Bytes::new()),
                RequestOp::Delete(d) => self.add(&d.key, &d.range_end),
                RequestOp::Txn(t) => self.collect(t),
                RequestOp::Empty => {}
            }
        }
    }
}

/// How a write reaches key histories.
pub(crate) enum KeyAccess<'g> {
    /// Through the write locks it holds on single keys.
    Locked {
        /// The index's own key bytes, sorted, one per guard.
        keys: Vec<Bytes>,
        /// The locked histories, in the same order.
        guards: Vec<RwLockWriteGuard<'g, History>>,
    },
    /// Directly: the writer holds the range-writer lock exclusively.
    AllKeys,
}

impl<'g> KeyAccess<'g> {
    /// Write-locks the histories of `entries` (sorted by key, so concurrent
    /// writers always lock in the same order).
    pub(crate) fn lock(entries: &'g [EntryRef]) -> Self {
        KeyAccess::Locked {
            keys: entries.iter().map(|e| e.key.clone()).collect(),
            guards: entries.iter().map(|e| e.versions.write()).collect(),
        }
    }

    fn slot(&self, key: &Bytes) -> Option<usize> {
        match self {
            KeyAccess::Locked { keys, .. } => keys.binary_search(key).ok(),
            KeyAccess::AllKeys => None,
        }
    }

    /// Key bytes to keep beyond the request: the index's own when the key
    /// is locked, otherwise a copy, never a slice that pins the request
    /// buffer.
    pub(crate) fn owned_key(&self, key: &Bytes) -> Bytes {
        match (self, self.slot(key)) {
            (KeyAccess::Locked { keys, .. }, Some(i)) => keys[i].clone(),
            _ => Bytes::copy_from_slice(key),
        }
    }

    /// The history of `key` for appending a version, with the key's
    /// canonical (index-owned) bytes.
    pub(crate) fn with_history<R>(
        &mut self,
        index: &Index,
        key: &Bytes,
        f: impl FnOnce(Bytes, &mut History) -> R,
    ) -> R {
        let slot = self.slot(key);
        match self {
            KeyAccess::Locked { keys, guards } => {
                let i = slot.expect("written keys are locked");
                f(keys[i].clone(), &mut guards[i])
            }
            KeyAccess::AllKeys => {
                let entry = index.get_or_insert(key);
                let key = entry.key.clone();
                let mut versions = entry.versions.write();
                f(key, &mut versions)
            }
        }
    }
}

/// Reads for the write path: the newest state of locked keys, or any state
/// when the writer holds every key.
pub(crate) struct WriteView<'a, 'g> {
    pub(crate) index: &'a Index,
    pub(crate) access: &'a KeyAccess<'g>,
}

impl KvSource for WriteView<'_, '_> {
    fn for_each_visible_while(
        &self,
        key: &Bytes,
        end: &Bytes,
        rev: i64,
        f: &mut dyn FnMut(&Kv) -> bool,
    ) {
        match self.access {
            KeyAccess::AllKeys => LockedRead(self.index).for_each_visible_while(key, end, rev, f),
            KeyAccess::Locked { guards, .. } => {
                debug_assert!(end.is_empty(), "single-key writes touch single keys only");
                if let Some(i) = self.access.slot(key) {
                    if let Some(kv) = visible(&guards[i], rev) {
                        f(kv);
                    }
                }
            }
        }
    }
}

impl WriteView<'_, '_> {
    /// The newest version of `key`, if live.
    pub(crate) fn latest(&self, key: &Bytes) -> Option<Kv> {
        self.at(key, i64::MAX)
    }

    /// The version of `key` visible at `rev`.
    pub(crate) fn at(&self, key: &Bytes, rev: i64) -> Option<Kv> {
        let mut out = None;
        self.for_each_visible(key, &Bytes::new(), rev, &mut |kv| out = Some(kv.clone()));
        out
    }

    /// The newest live versions in a range.
    pub(crate) fn latest_range(&self, key: &Bytes, end: &Bytes) -> Vec<Kv> {
        let mut out = Vec::new();
        self.for_each_visible(key, end, i64::MAX, &mut |kv| out.push(kv.clone()));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    fn put(k: &str) -> RequestOp {
        RequestOp::Put(PutRequest {
            key: b(k),
            ..Default::default()
        })
    }

    fn compare(k: &str, end: &str) -> Compare {
        Compare {
            result: CompareResult::Equal,
            target: CompareTarget::Version(0),
            key: b(k),
            range_end: b(end),
        }
    }

    #[test]
    fn single_key_writes_lock_their_keys_sorted_once() {
        let req = TxnRequest {
            compare: vec![compare("c", "")],
            success: vec![put("b"), put("a")],
            failure: vec![
                RequestOp::Range(RangeRequest {
                    key: b("c"),
                    ..Default::default()
                }),
                RequestOp::Delete(DeleteRequest {
                    key: b("d"),
                    ..Default::default()
                }),
            ],
        };
        let plan = LockPlan::for_txn(&req);
        assert!(!plan.all_keys);
        assert_eq!(plan.keys, vec![b("a"), b("b"), b("c"), b("d")]);
    }

    #[test]
    fn any_range_anywhere_needs_every_key() {
        let with = |compare_end: &str, op: RequestOp| TxnRequest {
            compare: vec![compare("k", compare_end)],
            success: vec![op],
            failure: vec![],
        };
        assert!(
            LockPlan::for_txn(&with("z", put("a"))).all_keys,
            "range compare"
        );
        let range_delete = RequestOp::Delete(DeleteRequest {
            key: b("a"),
            range_end: b("\0"),
            prev_kv: false,
        });
        assert!(LockPlan::for_txn(&with("", range_delete)).all_keys);
        let range_read = RequestOp::Range(RangeRequest {
            key: b("a"),
            range_end: b("b"),
            ..Default::default()
        });
        let nested = RequestOp::Txn(TxnRequest {
            compare: vec![],
            success: vec![],
            failure: vec![range_read],
        });
        assert!(
            LockPlan::for_txn(&with("", nested)).all_keys,
            "a range in a nested branch not taken still counts"
        );
    }

    #[test]
    fn locked_writes_see_only_their_keys() {
        let index = Index::default();
        let a = index.get_or_insert(b"a");
        let entries = vec![a];
        let mut access = KeyAccess::lock(&entries);
        access.with_history(&index, &b("a"), |key, h| {
            assert_eq!(key, b("a"));
            h.push(crate::mvcc::history::Version {
                rev: 5,
                kv: Some(std::sync::Arc::new(KeyValue {
                    key,
                    mod_revision: 5,
                    ..Default::default()
                })),
            });
        });
        let view = WriteView {
            index: &index,
            access: &access,
        };
        assert_eq!(view.latest(&b("a")).unwrap().mod_revision, 5);
        assert!(view.at(&b("a"), 4).is_none());
        assert!(
            view.latest(&b("zz")).is_none(),
            "unlocked keys are invisible"
        );
        let owned = access.owned_key(&b("a"));
        assert_eq!(owned.as_ptr(), entries[0].key.as_ptr(), "the index's bytes");
    }
}

//! Transactions: validation, the lock plan, compare evaluation and the
//! write pipeline every mutating request goes through (Put and DeleteRange
//! are one-op transactions; lease revocation is a multi-key delete).

use super::index::EntryRef;
use super::range::{execute_range, KvSource};
use super::store::{visible, History, Snapshot, Store, Version};
use super::types::*;
use crate::error::{Error, Result};
use bytes::Bytes;
use parking_lot::RwLockWriteGuard;
use std::cmp::Ordering;
use std::collections::HashSet;
use std::sync::Arc;

// ------------------------------------------------------------- validation

/// etcd's request checks for a txn, in etcd's order: op counts, compare
/// keys, then every op recursively (nested txns get what is left of the
/// op budget).
fn check_txn(req: &TxnRequest, max_ops: i64) -> Result<()> {
    let opc = req
        .compare
        .len()
        .max(req.success.len())
        .max(req.failure.len()) as i64;
    if opc > max_ops {
        return Err(Error::TooManyOps);
    }
    if req.compare.iter().any(|c| c.key.is_empty()) {
        return Err(Error::EmptyKey);
    }
    for op in req.success.iter().chain(req.failure.iter()) {
        check_op(op, max_ops - opc)?;
    }
    Ok(())
}

fn check_op(op: &RequestOp, max_ops: i64) -> Result<()> {
    match op {
        RequestOp::Range(r) => check_range(r),
        RequestOp::Put(p) => check_put(p),
        RequestOp::Delete(d) => check_key(&d.key),
        RequestOp::Txn(t) => check_txn(t, max_ops),
        RequestOp::Empty => Err(Error::KeyNotFound),
    }
}

/// etcd 3.5+'s Range checks (3.4 crashed on an undefined sort target).
pub(crate) fn check_range(r: &RangeRequest) -> Result<()> {
    check_key(&r.key)?;
    if r.sort_order == SortOrder::Unknown || r.sort_target == SortTarget::Unknown {
        return Err(Error::InvalidSortOption);
    }
    Ok(())
}

pub(crate) fn check_key(key: &Bytes) -> Result<()> {
    if key.is_empty() {
        Err(Error::EmptyKey)
    } else {
        Ok(())
    }
}

pub(crate) fn check_put(p: &PutRequest) -> Result<()> {
    check_key(&p.key)?;
    if p.ignore_value && !p.value.is_empty() {
        return Err(Error::ValueProvided);
    }
    if p.ignore_lease && p.lease != 0 {
        return Err(Error::LeaseProvided);
    }
    Ok(())
}

/// A deleted interval as etcd's overlap check sees it: `[begin, end)` by
/// plain byte comparison (so a `"\0"` end matches nothing, as in etcd), or a
/// single key when `end` is empty.
struct DelInterval {
    begin: Bytes,
    end: Bytes,
}

impl DelInterval {
    fn contains(&self, k: &Bytes) -> bool {
        if self.end.is_empty() {
            *k == self.begin
        } else {
            self.begin <= *k && *k < self.end
        }
    }
}

/// etcd's rule that one txn must not write a key twice: no two puts of a
/// key, and no put inside a deleted range, across nesting levels (the two
/// branches of a nested txn may put the same key).
fn check_intervals(ops: &[RequestOp]) -> Result<(HashSet<Bytes>, Vec<DelInterval>)> {
    let mut dels: Vec<DelInterval> = ops
        .iter()
        .filter_map(|op| match op {
            RequestOp::Delete(d) => Some(DelInterval {
                begin: d.key.clone(),
                end: d.range_end.clone(),
            }),
            _ => None,
        })
        .collect();
    let hits = |dels: &[DelInterval], k: &Bytes| dels.iter().any(|d| d.contains(k));
    let mut puts: HashSet<Bytes> = HashSet::new();
    for op in ops {
        let RequestOp::Txn(t) = op else { continue };
        let (puts_then, dels_then) = check_intervals(&t.success)?;
        let (puts_else, dels_else) = check_intervals(&t.failure)?;
        for k in &puts_then {
            if puts.contains(k) || hits(&dels, k) {
                return Err(Error::DuplicateKey);
            }
            puts.insert(k.clone());
        }
        for k in &puts_else {
            if (puts.contains(k) && !puts_then.contains(k)) || hits(&dels, k) {
                return Err(Error::DuplicateKey);
            }
            puts.insert(k.clone());
        }
        dels.extend(
            dels_then
                .into_iter()
                .filter(|d| d.end.is_empty() || d.begin < d.end),
        );
        dels.extend(
            dels_else
                .into_iter()
                .filter(|d| d.end.is_empty() || d.begin < d.end),
        );
    }
    for op in ops {
        let RequestOp::Put(p) = op else { continue };
        if puts.contains(&p.key) || hits(&dels, &p.key) {
            return Err(Error::DuplicateKey);
        }
        puts.insert(p.key.clone());
    }
    Ok((puts, dels))
}

/// etcd treats a txn as read-only only when both branches hold nothing but
/// ranges (a nested txn makes it a write txn even if it only reads).
fn is_read_only(req: &TxnRequest) -> bool {
    req.success
        .iter()
        .chain(req.failure.iter())
        .all(|op| matches!(op, RequestOp::Range(_)))
}

// ------------------------------------------------------------- lock plan

/// Which keys a write must lock, or whether it needs the store exclusively
/// (any range in a compare or op).
#[derive(Default)]
struct LockPlan {
    keys: Vec<Bytes>,
    exclusive: bool,
}

impl LockPlan {
    fn add(&mut self, key: &Bytes, range_end: &Bytes) {
        if range_end.is_empty() {
            self.keys.push(key.clone());
        } else {
            self.exclusive = true;
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

    fn finish(mut self) -> Self {
        self.keys.sort();
        self.keys.dedup();
        self
    }
}

/// How a write reaches key histories: through the locks it holds (shared
/// mode, single keys only) or directly (exclusive mode).
enum Access<'g> {
    Shared {
        /// The index's own key bytes, sorted, one per guard.
        keys: Vec<Bytes>,
        guards: Vec<RwLockWriteGuard<'g, History>>,
    },
    Exclusive,
}

impl<'g> Access<'g> {
    /// Write-locks the histories of `entries` (sorted by key, so concurrent
    /// writers always lock in the same order).
    fn lock(entries: &'g [EntryRef]) -> Self {
        Access::Shared {
            keys: entries.iter().map(|e| e.key.clone()).collect(),
            guards: entries.iter().map(|e| e.versions.write()).collect(),
        }
    }

    fn slot(&self, key: &Bytes) -> Option<usize> {
        match self {
            Access::Shared { keys, .. } => keys.binary_search(key).ok(),
            Access::Exclusive => None,
        }
    }

    /// Key bytes to keep beyond the request: the index's own when the key
    /// is locked, otherwise a copy, never a slice that pins the request
    /// buffer.
    fn owned_key(&self, key: &Bytes) -> Bytes {
        match (self, self.slot(key)) {
            (Access::Shared { keys, .. }, Some(i)) => keys[i].clone(),
            _ => Bytes::copy_from_slice(key),
        }
    }
}

/// Reads for the write path: newest state of locked keys, or any state in
/// exclusive mode.
struct WriteView<'a, 'g> {
    store: &'a Store,
    access: &'a Access<'g>,
}

impl KvSource for WriteView<'_, '_> {
    fn for_each_visible(&self, key: &Bytes, end: &Bytes, rev: i64, f: &mut dyn FnMut(&Kv)) {
        match self.access {
            Access::Exclusive => Snapshot(self.store).for_each_visible(key, end, rev, f),
            Access::Shared { guards, .. } => {
                debug_assert!(end.is_empty(), "shared-mode writes touch single keys only");
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
    fn latest(&self, key: &Bytes) -> Option<Kv> {
        self.at(key, i64::MAX)
    }

    fn at(&self, key: &Bytes, rev: i64) -> Option<Kv> {
        let mut out = None;
        self.for_each_visible(key, &Bytes::new(), rev, &mut |kv| out = Some(kv.clone()));
        out
    }

    fn latest_range(&self, key: &Bytes, end: &Bytes) -> Vec<Kv> {
        let mut out = Vec::new();
        self.for_each_visible(key, end, i64::MAX, &mut |kv| out.push(kv.clone()));
        out
    }
}

// ---------------------------------------------------------------- compares

fn compare_holds(c: &Compare, source: &dyn KvSource, rev: i64) -> bool {
    let mut kvs = Vec::new();
    source.for_each_visible(&c.key, &c.range_end, rev, &mut |kv| kvs.push(kv.clone()));
    if kvs.is_empty() {
        // A missing key compares as all zeroes, except that a value compare
        // always fails (there is no way to express "missing value").
        if matches!(c.target, CompareTarget::Value(_)) {
            return false;
        }
        return compare_kv(c, &KeyValue::default());
    }
    kvs.iter().all(|kv| compare_kv(c, kv))
}

fn compare_kv(c: &Compare, kv: &KeyValue) -> bool {
    let ord = match &c.target {
        CompareTarget::Version(v) => kv.version.cmp(v),
        CompareTarget::Create(v) => kv.create_revision.cmp(v),
        CompareTarget::Mod(v) => kv.mod_revision.cmp(v),
        CompareTarget::Lease(v) => kv.lease.cmp(v),
        CompareTarget::Value(v) => kv.value.as_ref().cmp(v.as_ref()),
        CompareTarget::Unknown => Ordering::Equal,
    };
    match c.result {
        CompareResult::Equal => ord == Ordering::Equal,
        CompareResult::NotEqual => ord != Ordering::Equal,
        CompareResult::Greater => ord == Ordering::Greater,
        CompareResult::Less => ord == Ordering::Less,
        CompareResult::Unknown => true,
    }
}

/// Which branch each txn (and each nested txn on the taken path) takes; all
/// compares are evaluated against the state before the txn, as in etcd.
struct Path {
    succeeded: bool,
    nested: Vec<Path>,
}

impl Path {
    fn evaluate(req: &TxnRequest, source: &dyn KvSource, rev: i64) -> Path {
        let succeeded = req.compare.iter().all(|c| compare_holds(c, source, rev));
        let ops = if succeeded {
            &req.success
        } else {
            &req.failure
        };
        let nested = ops
            .iter()
            .filter_map(|op| match op {
                RequestOp::Txn(t) => Some(Path::evaluate(t, source, rev)),
                _ => None,
            })
            .collect();
        Path { succeeded, nested }
    }

    fn ops<'r>(&self, req: &'r TxnRequest) -> &'r [RequestOp] {
        if self.succeeded {
            &req.success
        } else {
            &req.failure
        }
    }

    /// Visits every op on the taken path depth-first in op order (a nested
    /// txn's ops where the nested txn stands), the order of etcd's checks.
    fn visit<'r>(
        &self,
        req: &'r TxnRequest,
        f: &mut dyn FnMut(&'r RequestOp) -> Result<()>,
    ) -> Result<()> {
        let mut nested = self.nested.iter();
        for op in self.ops(req) {
            match op {
                RequestOp::Txn(t) => {
                    if let Some(p) = nested.next() {
                        p.visit(t, f)?;
                    }
                }
                _ => f(op)?,
            }
        }
        Ok(())
    }
}

// ------------------------------------------------------------- execution

/// Commits an allocated revision exactly once. Should applying a write ever
/// panic, the revision is still committed (without events) when the guard
/// drops, so later writers waiting for it cannot hang.
struct CommitGuard<'a> {
    store: &'a Store,
    rev: i64,
    done: bool,
}

impl CommitGuard<'_> {
    fn finish(mut self, events: Vec<Event>) {
        self.done = true;
        self.store.commit(self.rev, events);
    }
}

impl Drop for CommitGuard<'_> {
    fn drop(&mut self) {
        if !self.done {
            tracing::error!(
                revision = self.rev,
                "a write failed mid-apply; committing its revision empty"
            );
            self.store.commit(self.rev, Vec::new());
        }
    }
}

struct Apply {
    rev: i64,
    begin: i64,
    changed: bool,
    events: Vec<Event>,
}

impl Store {
    /// Txn with etcd's semantics. Every write in ephd comes through here.
    /// Returns once the txn's revision is visible to readers, waiting on the
    /// calling thread; async callers use [`Store::txn_async`].
    pub fn txn(&self, req: TxnRequest) -> Result<TxnResponse> {
        let (resp, wait_for) = self.txn_unpublished(req)?;
        self.wait_visible(wait_for);
        Ok(resp)
    }

    /// [`Store::txn`] for async callers: while an earlier revision is still
    /// being applied by another thread, the task yields to the runtime
    /// instead of spinning or calling `sched_yield` on its worker thread.
    pub async fn txn_async(&self, req: TxnRequest) -> Result<TxnResponse> {
        let (resp, wait_for) = self.txn_unpublished(req)?;
        self.visible(wait_for).await;
        Ok(resp)
    }

    /// Applies a txn; returns its response and the revision that must be
    /// visible before the response may be sent.
    fn txn_unpublished(&self, req: TxnRequest) -> Result<(TxnResponse, i64)> {
        check_txn(&req, self.config.max_txn_ops as i64)?;
        check_intervals(&req.success)?;
        check_intervals(&req.failure)?;
        if is_read_only(&req) {
            return self.read_txn(&req).map(|r| (r, 0));
        }
        let plan = {
            let mut p = LockPlan::default();
            p.collect(&req);
            p.finish()
        };
        let (resp, wait_for) = if plan.exclusive {
            let _exclusive = self.mode.write();
            self.check_running()?;
            self.apply_txn(&req, &mut Access::Exclusive)?
        } else {
            let _shared = self.mode.read();
            self.check_running()?;
            let entries: Vec<EntryRef> = plan.keys.iter().map(|k| self.entry_for(k)).collect();
            let mut access = Access::lock(&entries);
            self.apply_txn(&req, &mut access)?
        };
        Ok((resp, wait_for))
    }

    /// The index entry for `key`, created empty if missing.
    pub(crate) fn entry_for(&self, key: &Bytes) -> EntryRef {
        self.index.get_or_insert(key)
    }

    fn read_txn(&self, req: &TxnRequest) -> Result<TxnResponse> {
        let _gate = self.compaction_gate.read();
        let rev = self.current_revision();
        let snap = Snapshot(self);
        let path = Path::evaluate(req, &snap, rev);
        path.visit(req, &mut |op| match op {
            RequestOp::Range(r) => self.check_read_revision(r.revision, rev).map(drop),
            _ => Ok(()),
        })?;
        let responses = path
            .ops(req)
            .iter()
            .map(|op| match op {
                RequestOp::Range(r) => {
                    let at = if r.revision > 0 { r.revision } else { rev };
                    ResponseOp::Range(execute_range(r, at, rev, &snap))
                }
                _ => unreachable!("read-only txns hold only ranges"),
            })
            .collect();
        Ok(TxnResponse {
            revision: rev,
            succeeded: path.succeeded,
            responses,
        })
    }

    /// Runs a write txn with its keys locked. Returns the response and the
    /// revision to wait for before answering.
    fn apply_txn(&self, req: &TxnRequest, access: &mut Access<'_>) -> Result<(TxnResponse, i64)> {
        let view = WriteView {
            store: self,
            access: &*access,
        };
        let path = Path::evaluate(req, &view, i64::MAX);
        let begin = self.allocated_revision();

        // etcd checks puts along the whole path first (the ignore flags,
        // then the lease, op by op), then ranges.
        let mut changes = false;
        let mut attachments: Vec<(i64, Bytes)> = Vec::new();
        let adopting = self.lessor().config().adopt_unknown_ttl.is_some();
        path.visit(req, &mut |op| {
            match op {
                RequestOp::Put(p) => {
                    changes = true;
                    if p.ignore_value || p.ignore_lease {
                        view.latest(&p.key).ok_or(Error::KeyNotFound)?;
                    }
                    if p.lease != 0 {
                        if !adopting && !self.lessor().contains(p.lease) {
                            return Err(Error::LeaseNotFound);
                        }
                        // The lessor keeps the key as long as the lease lives.
                        attachments.push((p.lease, access.owned_key(&p.key)));
                    }
                }
                RequestOp::Delete(d) => {
                    changes = changes || !view.latest_range(&d.key, &d.range_end).is_empty();
                }
                _ => {}
            }
            Ok(())
        })?;
        path.visit(req, &mut |op| match op {
            RequestOp::Range(r) => self.check_read_revision(r.revision, begin).map(drop),
            _ => Ok(()),
        })?;
        self.lessor().attach_all(&attachments)?;

        let rev = if changes {
            self.allocate_revision()
        } else {
            begin
        };
        let guard = changes.then(|| CommitGuard {
            store: self,
            rev,
            done: false,
        });
        let mut apply = Apply {
            rev,
            begin: if changes { rev - 1 } else { begin },
            changed: false,
            events: Vec::new(),
        };
        let mut resp = self.apply_ops(req, &path, access, &mut apply);
        resp.revision = apply.rev;
        if let Some(guard) = guard {
            guard.finish(apply.events);
        }
        Ok((resp, rev))
    }

    fn apply_ops(
        &self,
        req: &TxnRequest,
        path: &Path,
        access: &mut Access<'_>,
        a: &mut Apply,
    ) -> TxnResponse {
        let mut nested = path.nested.iter();
        let mut responses = Vec::new();
        for op in path.ops(req) {
            let resp = match op {
                RequestOp::Range(r) => {
                    let current = if a.changed { a.rev } else { a.begin };
                    let at = if r.revision > 0 { r.revision } else { current };
                    let view = WriteView {
                        store: self,
                        access: &*access,
                    };
                    ResponseOp::Range(execute_range(r, at, current, &view))
                }
                RequestOp::Put(p) => ResponseOp::Put(self.apply_put(p, access, a)),
                RequestOp::Delete(d) => ResponseOp::Delete(self.apply_delete(d, access, a)),
                RequestOp::Txn(t) => {
                    let p = nested.next().expect("a path per nested txn");
                    ResponseOp::Txn(self.apply_ops(t, p, access, a))
                }
                RequestOp::Empty => unreachable!("rejected by validation"),
            };
            responses.push(resp);
        }
        TxnResponse {
            revision: 0,
            succeeded: path.succeeded,
            responses,
        }
    }

    fn apply_put(&self, p: &PutRequest, access: &mut Access<'_>, a: &mut Apply) -> PutResponse {
        let prev = WriteView {
            store: self,
            access: &*access,
        }
        .latest(&p.key);
        let (create_revision, version) = match &prev {
            Some(kv) => (kv.create_revision, kv.version + 1),
            None => (a.rev, 1),
        };
        let value = match (&prev, p.ignore_value) {
            (Some(kv), true) => kv.value.clone(),
            _ => Bytes::copy_from_slice(&p.value),
        };
        let lease = match (&prev, p.ignore_lease) {
            (Some(kv), true) => kv.lease,
            _ => p.lease,
        };
        if let Some(old) = prev.as_ref().map(|kv| kv.lease) {
            if old != 0 && old != lease {
                self.lessor().detach(old, &p.key);
            }
        }
        let rev = a.rev;
        // Watchers get the key as it was before this revision (etcd reads it
        // at `rev - 1`), which differs from `prev` only when one txn touched
        // the key twice (a from-key delete and a put, which etcd allows).
        let event_prev = WriteView {
            store: self,
            access: &*access,
        }
        .at(&p.key, rev - 1);
        let kv = self.push_to(access, &p.key, rev, |key| {
            Some(Arc::new(KeyValue {
                key,
                create_revision,
                mod_revision: rev,
                version,
                value,
                lease,
            }))
        });
        a.changed = true;
        a.events.push(Event {
            kind: EventKind::Put,
            kv: kv.expect("a put makes a live version"),
            prev_kv: event_prev,
        });
        PutResponse {
            revision: a.rev,
            prev_kv: if p.prev_kv { prev } else { None },
        }
    }

    fn apply_delete(
        &self,
        d: &DeleteRequest,
        access: &mut Access<'_>,
        a: &mut Apply,
    ) -> DeleteResponse {
        let doomed = WriteView {
            store: self,
            access: &*access,
        }
        .latest_range(&d.key, &d.range_end);
        for prev in &doomed {
            self.delete_one(access, prev, a);
        }
        let deleted = doomed.len() as i64;
        DeleteResponse {
            revision: if deleted > 0 || a.changed {
                a.rev
            } else {
                a.begin
            },
            deleted,
            prev_kvs: if d.prev_kv { doomed } else { Vec::new() },
        }
    }

    fn delete_one(&self, access: &mut Access<'_>, prev: &Kv, a: &mut Apply) {
        if prev.lease != 0 {
            self.lessor().detach(prev.lease, &prev.key);
        }
        let event_prev = WriteView {
            store: self,
            access: &*access,
        }
        .at(&prev.key, a.rev - 1);
        self.push_to(access, &prev.key, a.rev, |_| None);
        a.changed = true;
        a.events.push(Event {
            kind: EventKind::Delete,
            kv: Arc::new(KeyValue {
                key: prev.key.clone(),
                mod_revision: a.rev,
                ..Default::default()
            }),
            prev_kv: event_prev,
        });
    }

    /// Appends a version (live, or a tombstone when `make` returns `None`)
    /// at the txn's revision to `key`'s history. `make` gets the canonical,
    /// index-owned key bytes so versions share them.
    fn push_to(
        &self,
        access: &mut Access<'_>,
        key: &Bytes,
        rev: i64,
        make: impl FnOnce(Bytes) -> Option<Kv>,
    ) -> Option<Kv> {
        let slot = access.slot(key);
        let (entry_key, mut exclusive_entry, versions) = match access {
            Access::Shared { guards, keys } => {
                let i = slot.expect("written keys are locked");
                (keys[i].clone(), None, Some(&mut guards[i]))
            }
            Access::Exclusive => {
                let entry = self.entry_for(key);
                (entry.key.clone(), Some(entry), None)
            }
        };
        let kv = make(entry_key);
        let version = Version {
            rev,
            kv: kv.clone(),
        };
        match versions {
            Some(v) => self.push_version(v, version),
            None => {
                let entry = exclusive_entry.take().expect("exclusive entry");
                self.push_version(&mut entry.versions.write(), version);
            }
        }
        kv
    }

    /// Revokes a lease and deletes the keys still attached to it at one
    /// revision. Returns the revision the caller must wait to be visible
    /// before it answers (see [`Store::lease_revoke`]).
    pub(crate) fn revoke_unpublished(&self, lease: i64) -> Result<i64> {
        let keys = self.lessor().take_for_revoke(lease)?;
        let rev = {
            let _shared = self.mode.read();
            if self.check_running().is_err() {
                // Shutting down: the lease is gone from memory; its keys stay
                // in the final snapshot and expire after the restart.
                return Ok(self.current_revision());
            }
            let entries: Vec<EntryRef> = keys.iter().map(|k| self.entry_for(k)).collect();
            let mut access = Access::lock(&entries);
            let doomed: Vec<Kv> = {
                let view = WriteView {
                    store: self,
                    access: &access,
                };
                keys.iter()
                    .filter_map(|k| view.latest(k))
                    .filter(|kv| kv.lease == lease)
                    .collect()
            };
            if doomed.is_empty() {
                // A revoke is one applied request; with keys, `commit` counts it.
                self.note_applied();
                self.allocated_revision()
            } else {
                let rev = self.allocate_revision();
                let guard = CommitGuard {
                    store: self,
                    rev,
                    done: false,
                };
                let mut a = Apply {
                    rev,
                    begin: rev - 1,
                    changed: false,
                    events: Vec::new(),
                };
                for kv in &doomed {
                    self.delete_one(&mut access, kv, &mut a);
                }
                guard.finish(a.events);
                rev
            }
        };
        Ok(rev)
    }
}

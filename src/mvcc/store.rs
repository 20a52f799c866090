//! The store: ordered index, per-key history, revision sequencer.
//!
//! # Concurrency
//! * The index (`index.rs`) holds every key twice: in a lock-free ordered
//!   skip list for ranges and in a sharded hash table for point lookups; each
//!   key owns a small lock around its version history.
//! * Writers that touch only single keys (every Kubernetes write) take a
//!   shared "mode" lock plus the locks of their keys, in key order, so writers
//!   of different keys run in parallel. Writers that touch ranges (range
//!   deletes, range compares, range reads inside write txns) and compaction
//!   batches take the mode lock exclusively.
//! * A revision is allocated only once a write is known to change something,
//!   while its keys are locked. After applying its versions the writer hands
//!   its events to the sequencer, which publishes revisions strictly in order:
//!   the *committed* watermark is the highest revision with every revision
//!   below it applied, and it is what readers call "current". A reader at
//!   revision N therefore sees all of 1..N and nothing of N+1.
//! * Readers never take the mode lock; they read each key's history under
//!   its lock and pick the newest version at or below their revision. A
//!   compaction gate (read-mostly lock) keeps a read from racing the moment
//!   the compacted revision moves.

use super::index::Index;
use super::log::{EventLog, LoggedEvent};
use super::range::{execute_range, range_bound, KvSource};
use super::types::*;
use crate::error::{Error, Result};
use crate::lease::{LeaseInfo, Lessor, LessorConfig};
use bytes::Bytes;
use parking_lot::{Mutex, RwLock};
use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

/// Store settings.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// Most compares, or ops per branch, a txn may have (`--max-txn-ops`).
    pub max_txn_ops: usize,
    /// Revision the store starts at (etcd starts at 1). Higher values keep
    /// revisions monotonic across restarts; everything below is compacted.
    pub initial_revision: i64,
    /// Lease settings.
    pub lessor: LessorConfig,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            max_txn_ops: 128,
            initial_revision: 1,
            lessor: LessorConfig::default(),
        }
    }
}

/// One version in a key's history; `kv == None` is a deletion tombstone.
#[derive(Debug, Clone)]
pub(crate) struct Version {
    pub(crate) rev: i64,
    pub(crate) kv: Option<Kv>,
}

/// A key's history, oldest first. Most keys hold a single version between
/// compactions, so it is stored inline: no allocation of its own (16 bytes
/// per key saved).
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

/// Counters reported by Maintenance.Status and metrics.
#[derive(Debug, Default)]
pub struct Stats {
    /// Bytes of keys and values of every retained version.
    pub total_bytes: AtomicI64,
    /// Bytes of keys and values of the newest live versions.
    pub live_bytes: AtomicI64,
    /// Live keys.
    pub live_keys: AtomicI64,
    /// Applied mutating requests (etcd's raft index analogue).
    pub applied_index: AtomicU64,
}

fn kv_bytes(kv: &KeyValue) -> i64 {
    (kv.key.len() + kv.value.len()) as i64
}

/// The multi-version store; see the module docs for the design.
pub struct Store {
    pub(crate) index: Index,
    pub(crate) mode: RwLock<()>,
    pub(crate) compaction_gate: RwLock<()>,
    compacted: AtomicI64,
    allocated: AtomicI64,
    committed: AtomicI64,
    pending: Mutex<BTreeMap<i64, Vec<Event>>>,
    stopped: std::sync::atomic::AtomicBool,
    log: EventLog,
    lessor: Lessor,
    stats: Stats,
    pub(crate) config: StoreConfig,
}

impl Store {
    /// An empty store at `config.initial_revision`. When that is above 1,
    /// every revision below it reads as compacted, as after etcd's
    /// `snapshot restore --bump-revision --mark-compacted`.
    pub fn new(config: StoreConfig) -> Self {
        let start = config.initial_revision.max(1);
        let compacted = if start > 1 { start } else { -1 };
        Store {
            index: Index::default(),
            mode: RwLock::new(()),
            compaction_gate: RwLock::new(()),
            compacted: AtomicI64::new(compacted),
            allocated: AtomicI64::new(start),
            committed: AtomicI64::new(start),
            pending: Mutex::new(BTreeMap::new()),
            stopped: std::sync::atomic::AtomicBool::new(false),
            log: EventLog::new(start),
            lessor: Lessor::new(config.lessor.clone()),
            stats: Stats::default(),
            config,
        }
    }

    /// The latest committed revision: every revision up to it is visible.
    pub fn current_revision(&self) -> i64 {
        self.committed.load(Ordering::Acquire)
    }

    /// The compacted revision (reads below it fail); -1 if never compacted.
    pub fn compacted_revision(&self) -> i64 {
        self.compacted.load(Ordering::Acquire)
    }

    /// The change log watchers read.
    pub fn log(&self) -> &EventLog {
        &self.log
    }

    /// The events of up to `max_revisions` revisions of the change log at or
    /// after `from` (see [`EventLog::read_from`]), with the compacted
    /// revision read atomically with them: a watcher checked against that
    /// revision can never miss revisions trimmed by a compaction racing the
    /// read.
    pub fn read_log(&self, from: i64, max_revisions: usize) -> (i64, Vec<LoggedEvent>, bool) {
        let _gate = self.compaction_gate.read();
        let (events, limited) = self.log.read_from(from, max_revisions);
        (self.compacted_revision(), events, limited)
    }

    /// The lease owner.
    pub fn lessor(&self) -> &Lessor {
        &self.lessor
    }

    /// Size and apply counters.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Refuses every later write with "etcdserver: server stopped". Waits for
    /// writes in flight (they hold the mode lock shared), so once this
    /// returns the store's contents are final: what shutdown snapshots.
    pub fn stop_writes(&self) {
        let _exclusive = self.mode.write();
        self.stopped.store(true, Ordering::Release);
    }

    /// Fails once [`Store::stop_writes`] has run; checked under the mode lock.
    pub(crate) fn check_running(&self) -> Result<()> {
        if self.stopped.load(Ordering::Acquire) {
            Err(Error::Stopped)
        } else {
            Ok(())
        }
    }

    /// Counts one applied request that changes no key (lease grant etc.),
    /// so the reported index moves like etcd's raft index.
    pub fn note_applied(&self) {
        self.stats.applied_index.fetch_add(1, Ordering::Relaxed);
    }

    // ---------------------------------------------------------------- reads

    /// Range with etcd's semantics.
    pub fn range(&self, req: &RangeRequest) -> Result<RangeResponse> {
        super::txn::check_range(req)?;
        let _gate = self.compaction_gate.read();
        let current = self.current_revision();
        let rev = self.check_read_revision(req.revision, current)?;
        Ok(execute_range(req, rev, current, &Snapshot(self)))
    }

    /// Resolves a requested read revision (0 = current) against `current`
    /// and the compacted revision, in etcd's order of checks.
    pub(crate) fn check_read_revision(&self, requested: i64, current: i64) -> Result<i64> {
        if requested > current {
            return Err(Error::FutureRev);
        }
        let rev = if requested <= 0 { current } else { requested };
        if rev < self.compacted_revision() {
            return Err(Error::Compacted);
        }
        Ok(rev)
    }

    /// Every live key-value at the current revision, in key order (for
    /// snapshots and persistence), with that revision.
    pub fn snapshot_latest(&self) -> (i64, Vec<Kv>) {
        let _gate = self.compaction_gate.read();
        let rev = self.current_revision();
        let mut out = Vec::new();
        Snapshot(self).for_each_visible(
            &Bytes::from_static(b"\0"),
            &Bytes::from_static(b"\0"),
            rev,
            &mut |kv| out.push(kv.clone()),
        );
        (rev, out)
    }

    /// A hash of every version in `(compacted, rev]`, stable for identical
    /// histories; the analogue of etcd's HashKV. Returns (hash, compacted, rev).
    pub fn hash_kv(&self, rev: i64) -> Result<(u32, i64, i64)> {
        let _gate = self.compaction_gate.read();
        let current = self.current_revision();
        let rev = self.check_read_revision(rev, current)?;
        let compacted = self.compacted_revision();
        let mut h: u32 = 0x811c_9dc5;
        let mut mix = |bytes: &[u8]| {
            for b in bytes {
                h ^= *b as u32;
                h = h.wrapping_mul(0x0100_0193);
            }
        };
        self.index.for_range(Bound::Unbounded, None, &mut |entry| {
            let versions = entry.versions.read();
            for v in versions.iter().filter(|v| v.rev <= rev) {
                mix(&entry.key);
                mix(&v.rev.to_be_bytes());
                match &v.kv {
                    Some(kv) => {
                        mix(&kv.value);
                        mix(&kv.lease.to_be_bytes());
                    }
                    None => mix(b"\xfftombstone"),
                }
            }
            true
        });
        Ok((h, compacted, rev))
    }

    // --------------------------------------------------------------- writes

    /// Put as a one-op write. After the request checks, etcd's unary put
    /// looks up the lease before it checks the ignore flags.
    pub fn put(&self, req: PutRequest) -> Result<PutResponse> {
        put_response(self.txn(self.put_txn(req)?)?)
    }

    /// [`Store::put`] for async callers (see [`Store::txn_async`]).
    pub async fn put_async(&self, req: PutRequest) -> Result<PutResponse> {
        put_response(self.txn_async(self.put_txn(req)?).await?)
    }

    /// A put as a one-op txn, after the checks etcd makes before its txn's.
    fn put_txn(&self, req: PutRequest) -> Result<TxnRequest> {
        super::txn::check_put(&req)?;
        if req.lease != 0
            && !self.lessor.contains(req.lease)
            && self.lessor.config().adopt_unknown_ttl.is_none()
        {
            return Err(Error::LeaseNotFound);
        }
        Ok(TxnRequest {
            compare: Vec::new(),
            success: vec![RequestOp::Put(req)],
            failure: Vec::new(),
        })
    }

    /// DeleteRange as a one-op write.
    pub fn delete_range(&self, req: DeleteRequest) -> Result<DeleteResponse> {
        delete_response(self.txn(delete_txn(req))?)
    }

    /// [`Store::delete_range`] for async callers (see [`Store::txn_async`]).
    pub async fn delete_range_async(&self, req: DeleteRequest) -> Result<DeleteResponse> {
        delete_response(self.txn_async(delete_txn(req)).await?)
    }

    /// Allocates the next revision; only called with the written keys locked
    /// and once the write is certain to change something.
    pub(crate) fn allocate_revision(&self) -> i64 {
        self.allocated.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// The newest allocated revision: what a write that changes nothing
    /// reports, since every key it looked at is at or below it.
    pub(crate) fn allocated_revision(&self) -> i64 {
        self.allocated.load(Ordering::Acquire)
    }

    /// Publishes revision `rev` with its events once every earlier revision
    /// is published; keeps the log in revision order.
    pub(crate) fn commit(&self, rev: i64, events: Vec<Event>) {
        self.stats.applied_index.fetch_add(1, Ordering::Relaxed);
        let mut pending = self.pending.lock();
        let mut next = self.committed.load(Ordering::Acquire) + 1;
        if rev != next {
            pending.insert(rev, events);
            return;
        }
        self.log.append(rev, events);
        while let Some(events) = pending.remove(&(next + 1)) {
            next += 1;
            self.log.append(next, events);
        }
        self.committed.store(next, Ordering::Release);
        // Wake watchers and writers waiting in `visible` only now that the
        // revisions are readable.
        self.log.publish(next);
    }

    /// Waits until revision `rev` is visible to readers, so that a client
    /// that got a response for it can read it back (linearizability).
    /// Blocks the calling thread; async code uses [`Store::visible`].
    pub(crate) fn wait_visible(&self, rev: i64) {
        let mut spins = 0u32;
        while self.current_revision() < rev {
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
            spins += 1;
        }
    }

    /// Completes once revision `rev` is visible to readers. The revisions
    /// below it belong to writes in flight on other threads, which finish in
    /// microseconds unless their thread was preempted; then this task parks
    /// until the sequencer publishes, instead of holding its worker thread.
    pub async fn visible(&self, rev: i64) {
        for _ in 0..32 {
            if self.current_revision() >= rev {
                return;
            }
            std::hint::spin_loop();
        }
        // Subscribing before the re-check closes the race with a publish in
        // between: `commit` stores the watermark before it notifies.
        let mut published = self.log.subscribe();
        while self.current_revision() < rev {
            if published.changed().await.is_err() {
                return;
            }
        }
    }

    /// Records a new version in a key's history and keeps the counters.
    pub(crate) fn push_version(&self, versions: &mut History, version: Version) {
        let prev_live = latest(versions).map(|kv| kv_bytes(kv));
        let new_live = version.kv.as_ref().map(|kv| kv_bytes(kv));
        if let Some(n) = new_live {
            self.stats.total_bytes.fetch_add(n, Ordering::Relaxed);
        }
        let delta = new_live.unwrap_or(0) - prev_live.unwrap_or(0);
        self.stats.live_bytes.fetch_add(delta, Ordering::Relaxed);
        let keys_delta = new_live.is_some() as i64 - prev_live.is_some() as i64;
        self.stats
            .live_keys
            .fetch_add(keys_delta, Ordering::Relaxed);
        // Most keys hold one or two versions between compactions: grow the
        // history one slot at a time while it is short instead of doubling.
        if versions.len() == versions.capacity() && versions.len() < 4 {
            versions.reserve_exact(1);
        }
        versions.push(version);
    }

    // --------------------------------------------------------------- leases

    /// Grants a lease (counted as an applied request).
    pub fn lease_grant(&self, id: i64, ttl: i64) -> Result<(i64, i64)> {
        self.check_running()?;
        let granted = self.lessor.grant(id, ttl)?;
        self.note_applied();
        Ok(granted)
    }

    /// Revokes a lease: every key still attached to it is deleted at one
    /// revision, in key order, with DELETE events. Returns the revision after.
    /// Waits for the revision on the calling thread, like [`Store::txn`].
    pub fn lease_revoke(&self, id: i64) -> Result<i64> {
        let rev = self.revoke_unpublished(id)?;
        self.wait_visible(rev);
        Ok(rev)
    }

    /// [`Store::lease_revoke`] for async callers (see [`Store::txn_async`]).
    pub async fn lease_revoke_async(&self, id: i64) -> Result<i64> {
        let rev = self.revoke_unpublished(id)?;
        self.visible(rev).await;
        Ok(rev)
    }

    /// TTL information of one lease.
    pub fn lease_time_to_live(&self, id: i64, keys: bool) -> Option<LeaseInfo> {
        self.lessor.info(id, keys)
    }

    // -------------------------------------------------------------- restore

    /// Loads key-values restored from a snapshot, keeping their revisions,
    /// and re-creates their leases. Only for a store that has served nothing
    /// yet, built with an `initial_revision` above every restored revision.
    /// Keys naming a lease the snapshot lacks get a fresh lease with the
    /// adoption TTL (or etcd's event TTL, 3660 s) so they still expire.
    pub fn load(&self, kvs: Vec<KeyValue>, leases: Vec<crate::persist::RestoredLease>) {
        use std::collections::HashMap;
        let mut attached: HashMap<i64, Vec<Bytes>> = HashMap::new();
        for kv in kvs {
            let entry = self.index.get_or_insert(&kv.key);
            let kv = Arc::new(KeyValue {
                key: entry.key.clone(),
                ..kv
            });
            if kv.lease != 0 {
                attached.entry(kv.lease).or_default().push(kv.key.clone());
            }
            self.push_version(
                &mut entry.versions.write(),
                Version {
                    rev: kv.mod_revision,
                    kv: Some(kv),
                },
            );
        }
        for l in leases {
            let keys = attached.remove(&l.id).unwrap_or_default();
            self.lessor.restore(l.id, l.ttl, l.remaining, keys);
        }
        let fallback = self.config.lessor.adopt_unknown_ttl.unwrap_or(3660);
        for (id, keys) in attached {
            tracing::warn!(
                lease = id,
                keys = keys.len(),
                "snapshot keys name a missing lease; re-creating it"
            );
            self.lessor.restore(
                id,
                fallback,
                std::time::Duration::from_secs(fallback as u64),
                keys,
            );
        }
    }

    // ----------------------------------------------------------- compaction

    /// Compacts history at `rev`: reads below it fail from now on, and every
    /// key keeps its newest version at or below it (unless that is a delete).
    pub fn compact(&self, rev: i64) -> Result<i64> {
        {
            let _gate = self.compaction_gate.write();
            let current = self.current_revision();
            if rev <= self.compacted_revision() {
                return Err(Error::Compacted);
            }
            if rev > current {
                return Err(Error::FutureRev);
            }
            self.compacted.store(rev, Ordering::Release);
        }
        self.note_applied();
        self.log.trim_below(rev);
        self.prune_history(rev);
        Ok(self.current_revision())
    }

    /// Drops versions no reader can ask for any more, in batches so writers
    /// are never held up for long.
    fn prune_history(&self, rev: i64) {
        const BATCH: usize = 1024;
        let mut from: Option<Bytes> = None;
        loop {
            let _exclusive = self.mode.write();
            let mut seen = 0;
            let mut last = None;
            let mut emptied = Vec::new();
            let lower = match &from {
                Some(k) => Bound::Excluded(k.as_ref()),
                None => Bound::Unbounded,
            };
            self.index.for_range(lower, None, &mut |entry| {
                if seen == BATCH {
                    return false;
                }
                seen += 1;
                let mut versions = entry.versions.write();
                let freed = prune_versions(&mut versions, rev);
                self.stats.total_bytes.fetch_sub(freed, Ordering::Relaxed);
                if versions.is_empty() {
                    emptied.push(entry.key.clone());
                }
                last = Some(entry.key.clone());
                true
            });
            for key in &emptied {
                self.index.remove(key);
            }
            match last {
                Some(k) if seen == BATCH => from = Some(k),
                _ => return,
            }
        }
    }
}

fn put_response(resp: TxnResponse) -> Result<PutResponse> {
    match resp.responses.into_iter().next() {
        Some(ResponseOp::Put(p)) => Ok(p),
        _ => unreachable!("a put txn answers with a put response"),
    }
}

fn delete_txn(req: DeleteRequest) -> TxnRequest {
    TxnRequest {
        compare: Vec::new(),
        success: vec![RequestOp::Delete(req)],
        failure: Vec::new(),
    }
}

fn delete_response(resp: TxnResponse) -> Result<DeleteResponse> {
    match resp.responses.into_iter().next() {
        Some(ResponseOp::Delete(d)) => Ok(d),
        _ => unreachable!("a delete txn answers with a delete response"),
    }
}

/// Removes versions below `rev` except the newest one at or below it, and
/// that one too if it is a tombstone. Returns the bytes freed.
fn prune_versions(versions: &mut History, rev: i64) -> i64 {
    let Some(keep_from) = versions.iter().rposition(|v| v.rev <= rev) else {
        return 0;
    };
    let drop_to = if versions[keep_from].kv.is_none() {
        keep_from + 1
    } else {
        keep_from
    };
    if drop_to == 0 {
        return 0;
    }
    let freed = versions[..drop_to]
        .iter()
        .filter_map(|v| v.kv.as_ref().map(|kv| kv_bytes(kv)))
        .sum();
    versions.drain(..drop_to);
    if versions.capacity() > 2 * versions.len() + 1 {
        versions.shrink_to_fit();
    }
    freed
}

/// Reads through each key's lock: what unary ranges, read-only txns and
/// exclusive-mode writers use.
pub(crate) struct Snapshot<'a>(pub(crate) &'a Store);

impl KvSource for Snapshot<'_> {
    fn for_each_visible(&self, key: &Bytes, end: &Bytes, rev: i64, f: &mut dyn FnMut(&Kv)) {
        match range_bound(end) {
            None => {
                if let Some(entry) = self.0.index.get(key) {
                    if let Some(kv) = visible(&entry.versions.read(), rev) {
                        f(kv);
                    }
                }
            }
            Some(upper) => {
                if let Some(end) = &upper {
                    if end.as_ref() <= key.as_ref() {
                        return;
                    }
                }
                let to = upper.as_ref().map(|e| e.as_ref());
                self.0
                    .index
                    .for_range(Bound::Included(key.as_ref()), to, &mut |entry| {
                        if let Some(kv) = visible(&entry.versions.read(), rev) {
                            f(kv);
                        }
                        true
                    });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(rev: i64, live: bool) -> Version {
        Version {
            rev,
            kv: live.then(|| {
                Arc::new(KeyValue {
                    key: Bytes::from_static(b"k"),
                    mod_revision: rev,
                    ..Default::default()
                })
            }),
        }
    }

    #[test]
    fn prune_keeps_newest_version_at_or_below_compaction() {
        let mut h: History = smallvec::smallvec![v(2, true), v(4, true), v(6, true)];
        prune_versions(&mut h, 5);
        assert_eq!(h.iter().map(|v| v.rev).collect::<Vec<_>>(), vec![4, 6]);
        let mut h: History = smallvec::smallvec![v(2, true), v(4, false)];
        prune_versions(&mut h, 5);
        assert!(h.is_empty(), "a tombstone at or below the compaction goes");
        let mut h: History = smallvec::smallvec![v(7, true)];
        prune_versions(&mut h, 5);
        assert_eq!(h.len(), 1);
    }
}

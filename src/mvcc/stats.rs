//! Size and apply counters, kept as versions come and go; what
//! Maintenance.Status, the metrics and the space quota read.
//!
//! Two measures of the retained versions (deletion tombstones included),
//! both functions of the store's contents only, never of the allocator's
//! state:
//! * [`Stats::memory_bytes`]: the key and value bytes plus a fixed
//!   [`VERSION_OVERHEAD`] per version, about what they take in memory; the
//!   memory bound limits it.
//! * [`Stats::backend_bytes`]: what they would take in etcd's bbolt file
//!   (`backend_size.rs`); `--quota-backend-bytes` limits it, and Status
//!   and the metrics report it as the DB size, as etcd does.

use super::backend_size;
use super::history::{self, kv_bytes, History, Version};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

/// Bytes of memory a retained version takes beyond its key and value: the
/// index's B-tree slot and hash slot, the key's entry, the shared
/// `KeyValue` record, allocator rounding and the change-log entry that
/// lives until the next compaction. Measured (RELIABILITY.md, "Accounted
/// memory against RSS"): RSS grows by 1.00x the accounted figure for
/// single-version node Leases, 1.11x for Events (allocator rounding and the
/// lease's key set), 0.73x for ten versions a key.
pub const VERSION_OVERHEAD: i64 = 384;

/// Counters reported by Maintenance.Status and metrics.
#[derive(Debug, Default)]
pub struct Stats {
    /// Bytes of keys and values of every retained version.
    pub total_bytes: AtomicI64,
    /// Bytes of keys and values of the newest live versions.
    pub live_bytes: AtomicI64,
    /// Live keys.
    pub live_keys: AtomicI64,
    /// Retained versions, tombstones included.
    pub versions: AtomicI64,
    /// etcd's backend bytes of every retained version.
    pub backend_total: AtomicI64,
    /// etcd's backend bytes of the newest live versions.
    pub backend_live: AtomicI64,
    /// Applied mutating requests (etcd's raft index analogue).
    pub applied_index: AtomicU64,
}

impl Stats {
    /// Records a new version in a key's history and keeps the counters.
    pub(crate) fn push_version(&self, versions: &mut History, version: Version) {
        let prev_live = history::latest(versions).map(|kv| kv_bytes(kv));
        let new_live = version.kv.as_ref().map(|kv| kv_bytes(kv));
        if let Some(n) = new_live {
            self.total_bytes.fetch_add(n, Ordering::Relaxed);
        }
        let backend = history::backend_bytes(&version);
        self.backend_total.fetch_add(backend, Ordering::Relaxed);
        let live_backend = if new_live.is_some() { backend } else { 0 };
        let prev_backend = prev_live.map_or(0, backend_size::version);
        self.backend_live
            .fetch_add(live_backend - prev_backend, Ordering::Relaxed);
        self.versions.fetch_add(1, Ordering::Relaxed);
        let delta = new_live.unwrap_or(0) - prev_live.unwrap_or(0);
        self.live_bytes.fetch_add(delta, Ordering::Relaxed);
        let keys_delta = new_live.is_some() as i64 - prev_live.is_some() as i64;
        self.live_keys.fetch_add(keys_delta, Ordering::Relaxed);
        history::push(versions, version);
    }

    /// Compacts one history at `rev` and accounts for the bytes freed.
    pub(crate) fn prune(&self, versions: &mut History, rev: i64) {
        let freed = history::prune(versions, rev);
        self.total_bytes
            .fetch_sub(freed.kv_bytes, Ordering::Relaxed);
        self.versions.fetch_sub(freed.versions, Ordering::Relaxed);
        self.backend_total
            .fetch_sub(freed.backend_bytes, Ordering::Relaxed);
    }

    /// The store's accounted memory: key and value bytes of every retained
    /// version plus `VERSION_OVERHEAD` per version. What the memory bound
    /// limits.
    pub fn memory_bytes(&self) -> i64 {
        self.total_bytes.load(Ordering::Relaxed)
            + VERSION_OVERHEAD * self.versions.load(Ordering::Relaxed)
    }

    /// The accounted memory of the newest live versions only: what a
    /// compaction at the current revision would leave.
    pub fn memory_in_use(&self) -> i64 {
        self.live_bytes.load(Ordering::Relaxed)
            + VERSION_OVERHEAD * self.live_keys.load(Ordering::Relaxed)
    }

    /// The retained versions' bytes in etcd's backend measure: what
    /// `--quota-backend-bytes` limits and Status reports as `dbSize`.
    pub fn backend_bytes(&self) -> i64 {
        self.backend_total.load(Ordering::Relaxed)
    }

    /// [`Stats::backend_bytes`] of the newest live versions only (Status'
    /// `dbSizeInUse`): what a compaction at the current revision would
    /// leave.
    pub fn backend_in_use(&self) -> i64 {
        self.backend_live.load(Ordering::Relaxed)
    }

    /// Counts one applied mutating request.
    pub(crate) fn applied(&self) {
        self.applied_index.fetch_add(1, Ordering::Relaxed);
    }
}

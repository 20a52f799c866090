//! Size and apply counters, kept as versions come and go; what
//! Maintenance.Status and the metrics report.

use super::history::{self, kv_bytes, History, Version};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

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

impl Stats {
    /// Records a new version in a key's history and keeps the counters.
    pub(crate) fn push_version(&self, versions: &mut History, version: Version) {
        let prev_live = history::latest(versions).map(|kv| kv_bytes(kv));
        let new_live = version.kv.as_ref().map(|kv| kv_bytes(kv));
        if let Some(n) = new_live {
            self.total_bytes.fetch_add(n, Ordering::Relaxed);
        }
        let delta = new_live.unwrap_or(0) - prev_live.unwrap_or(0);
        self.live_bytes.fetch_add(delta, Ordering::Relaxed);
        let keys_delta = new_live.is_some() as i64 - prev_live.is_some() as i64;
        self.live_keys.fetch_add(keys_delta, Ordering::Relaxed);
        history::push(versions, version);
    }

    /// Compacts one history at `rev` and accounts for the bytes freed.
    pub(crate) fn prune(&self, versions: &mut History, rev: i64) {
        let freed = history::prune(versions, rev);
        self.total_bytes.fetch_sub(freed, Ordering::Relaxed);
    }

    /// Counts one applied mutating request.
    pub(crate) fn applied(&self) {
        self.applied_index.fetch_add(1, Ordering::Relaxed);
    }
}

//! What happens before the server serves: the snapshot restored, the start
//! revision chosen, and kube-apiserver's compaction key created.

use crate::config::Config;
use crate::lease::LessorConfig;
use crate::mvcc::{PutRequest, RangeRequest, Store, StoreConfig};
use crate::persist;
use bytes::Bytes;
use std::time::{SystemTime, UNIX_EPOCH};

/// Revisions a restored high-water mark is bumped by: covers writes made
/// after the last periodic snapshot before a crash.
const RESTORE_MARGIN: i64 = 10_000_000;
/// Revisions per millisecond of wall clock in the derived start revision: a
/// previous run would need to average more than a million writes per second
/// to have issued a revision above the next run's start.
const REVISIONS_PER_MS: i64 = 1_000;
/// The key kube-apiserver's compactor coordinates through.
pub const COMPACT_REV_KEY: &str = "compact_rev_key";
/// The revision a fresh store starts at; see `--revision-continuity`.
pub fn start_revision(continuity: bool, restored: Option<i64>) -> i64 {
    let restored = restored.unwrap_or(0);
    if !continuity {
        return restored.max(1);
    }
    let wall_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0);
    (wall_ms.saturating_mul(REVISIONS_PER_MS)).max(restored.saturating_add(RESTORE_MARGIN))
}

/// Builds the store: restores the snapshot if there is one, picks the start
/// revision, and creates `compact_rev_key` when revisions continue.
pub(super) fn build_store(config: &Config) -> Result<Store, String> {
    let restored = match &config.data_dir {
        Some(dir) => persist::read(dir)
            .map_err(|e| format!("cannot read snapshot in {}: {e}", dir.display()))?,
        None => None,
    };
    let start = start_revision(
        config.revision_continuity,
        restored.as_ref().map(|r| r.revision),
    );
    let adopt = (config.lease_adopt_unknown_ttl > 0).then_some(config.lease_adopt_unknown_ttl);
    let store = Store::new(StoreConfig {
        max_txn_ops: config.max_txn_ops,
        initial_revision: start,
        lessor: LessorConfig {
            adopt_unknown_ttl: adopt,
            ..LessorConfig::default()
        },
    });
    if let Some(r) = restored {
        tracing::info!(
            keys = r.kvs.len(),
            leases = r.leases.len(),
            high_water_mark = r.revision,
            complete = r.complete,
            "restored snapshot"
        );
        store.load(r.kvs, r.leases);
    }
    if config.revision_continuity {
        let key = Bytes::from_static(COMPACT_REV_KEY.as_bytes());
        let existing = store
            .range(&RangeRequest {
                key: key.clone(),
                ..Default::default()
            })
            .map_err(|e| e.to_string())?;
        if existing.kvs.is_empty() {
            store
                .put(PutRequest {
                    key,
                    value: Bytes::from(start.to_string()),
                    ..Default::default()
                })
                .map_err(|e| e.to_string())?;
        }
        tracing::info!(
            start_revision = start,
            "revisions continue above every earlier run; older ones read as compacted"
        );
    }
    Ok(store)
}

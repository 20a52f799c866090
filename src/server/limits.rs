//! Cluster mode: the leader replicates its apply-affecting settings
//! (`mvcc/limits.rs`: `--max-txn-ops`, `--quota-backend-bytes`,
//! `--lease-adopt-unknown-ttl`), so that every member decides every entry
//! alike even when the members' flags differ (a quota derived from each
//! machine's memory differs from machine to machine). Whenever this member
//! leads and the limits in force are not its own (or were never
//! replicated), it proposes its own; every member applies them in log
//! order. A rolling change of a flag takes effect when a member that has
//! the new value leads.

use crate::api::Shared;
use crate::mvcc::Entry;
use std::time::Duration;

/// How often a member looks whether it leads with other limits in force
/// (a fresh member's first writes wait for the first replicated limits).
const TICK: Duration = Duration::from_millis(50);

/// Runs for the member's life (cluster mode only).
pub(super) async fn replicate_limits(shared: Shared) {
    let Some(node) = shared.backend.cluster_node().cloned() else {
        return;
    };
    let own = shared.store.own_limits();
    let mut stop = shared.stop.clone();
    loop {
        let store = &shared.store;
        if node.status().is_leader() && !(store.limits_replicated() && store.limits() == own) {
            match node.propose(Entry::Limits(own)).await {
                Ok(_) => tracing::info!(limits = ?own, "this leader's limits replicated"),
                Err(e) => tracing::debug!(error = %e, "limits not committed yet"),
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(TICK) => {}
            _ = crate::api::stopped(&mut stop) => return,
        }
    }
}

//! A new cluster's initial revision, carried in its Raft log: with
//! `--revision-continuity` (the default; `--etcd-compat` turns it off and
//! the cluster starts at 1, as etcd does) the first leader proposes
//! [`Entry::Initialize`] with the wall-clock revision a single member
//! would start at (`revisions.rs`), so a cluster that replaces an earlier
//! one (same endpoints, every member restarted empty) starts above every
//! revision that one could have issued, and kube-apiserver's watch caches
//! never see revisions go backwards. Every member applies it at the same
//! log position; it also creates `compact_rev_key`.
//!
//! Client writes wait until this member has applied it
//! (`cluster/log/initial_gate.rs`), so none is acknowledged below it.

use super::revisions::REVISIONS_PER_MS;
use crate::api::Shared;
use crate::cluster::initialized;
use crate::mvcc::Entry;
use std::time::Duration;

/// How often a member looks whether it leads a cluster not yet initialized.
const TICK: Duration = Duration::from_millis(50);

/// Until the store has had its initial revision (it holds
/// `compact_rev_key`, or installed a snapshot of a store that had):
/// whenever this member leads, proposes the initial revision. Runs on
/// every member of a cluster with revision continuity; ends once the
/// entry is applied here.
pub(super) async fn propose_initial_revision(shared: Shared) {
    let Some(node) = shared.backend.cluster_node().cloned() else {
        return;
    };
    let mut stop = shared.stop.clone();
    loop {
        if initialized(&shared.store) {
            return;
        }
        if node.status().is_leader() {
            let revision = crate::persist::wall_clock_ms().saturating_mul(REVISIONS_PER_MS);
            match node.propose(Entry::Initialize { revision }).await {
                Ok(applied) => {
                    tracing::info!(?applied, "initial revision chosen for the new cluster");
                    return;
                }
                Err(e) => tracing::debug!(error = %e, "initial revision not committed yet"),
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(TICK) => {}
            _ = crate::api::stopped(&mut stop) => return,
        }
    }
}

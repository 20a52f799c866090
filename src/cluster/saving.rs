//! Writing a cluster member's saved state (`saved.rs`) while it runs and
//! when it stops.

use super::node::Node;
use super::saved;
use crate::error::Error;
use crate::mvcc::snapshot::Snapshot;
use crate::mvcc::Store;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{oneshot, watch};

impl Node {
    /// The applied state, captured on the apply thread in log order.
    pub async fn capture_saved(&self) -> crate::error::Result<Snapshot> {
        let (tx, rx) = oneshot::channel();
        self.send(super::input::Input::Save(tx))?;
        rx.await.map_err(|_| Error::Stopped)
    }

    /// The state once the node has stopped ([`Node::stop`]): nothing
    /// applies any more, so the store is read directly.
    pub fn capture_stopped(&self, store: &Store) -> Snapshot {
        let status = self.status();
        saved::capture(store, self.members(), status.applied(), status.term())
    }
}

/// Writes `snap` into `dir` off the async workers.
pub async fn write(dir: PathBuf, cluster_id: u64, snap: Snapshot) -> Result<(), String> {
    let revision = snap.image.revision;
    let index = snap.raft_index;
    let shown = dir.display().to_string();
    let written = tokio::task::spawn_blocking(move || saved::write(&dir, cluster_id, &snap))
        .await
        .map_err(|e| format!("the snapshot writer failed: {e}"))?
        .map_err(|e| format!("cannot write the cluster snapshot into {shown}: {e}"))?;
    tracing::info!(revision, raft_index = index, bytes = written, dir = %shown, "cluster state saved");
    Ok(())
}

/// Every `interval` until `stop`: captures the applied state and writes
/// it into `dir`. A failed write is logged and tried again next time.
pub async fn save_loop(
    node: Arc<Node>,
    dir: PathBuf,
    cluster_id: u64,
    interval: Duration,
    mut stop: watch::Receiver<bool>,
) {
    // The index last written: an idle member does not write the same
    // state again.
    let mut written = None;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = stop.wait_for(|stopped| *stopped) => return,
        }
        match node.capture_saved().await {
            Ok(snap) if written == Some(snap.raft_index) => {}
            Ok(snap) => {
                written = Some(snap.raft_index);
                if let Err(e) = write(dir.clone(), cluster_id, snap).await {
                    tracing::error!(error = %e, "periodic cluster snapshot failed");
                }
            }
            Err(e) => tracing::error!(error = %e, "cannot capture the cluster state"),
        }
    }
}

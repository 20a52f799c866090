//! Writing a cluster member's saved state (`saved_state.rs`) while it runs and
//! when it stops.

use crate::cluster::member::saved_state;
use crate::cluster::node::raft_node::Node;
use crate::error::Error;
use crate::mvcc::snapshot::Snapshot;
use crate::mvcc::Store;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{oneshot, watch};

impl Node {
    /// The applied state, captured on the apply thread in log order.
    pub async fn capture_saved(&self) -> crate::error::Result<Snapshot> {
        let (tx, rx) = oneshot::channel();
        self.send(crate::cluster::log::input::Input::Save(tx))?;
        rx.await.map_err(|_| Error::Stopped)
    }

    /// The state once the node has stopped ([`Node::stop`]): nothing
    /// applies any more, so the store is read directly.
    pub fn capture_stopped(&self, store: &Store) -> Snapshot {
        let status = self.status();
        saved_state::capture(store, self.members(), status.applied(), status.term())
    }
}

/// Writes `snap` into the member's saved-state files off the async
/// workers (nothing without `--data-dir`).
pub async fn write(node: &Node, snap: Snapshot) -> Result<(), String> {
    let Some(files) = node.saved_files().cloned() else {
        return Ok(());
    };
    let revision = snap.image.revision;
    let index = snap.raft_index;
    let shown = files.dir().display().to_string();
    let written = tokio::task::spawn_blocking(move || files.write(&snap))
        .await
        .map_err(|e| format!("the snapshot writer failed: {e}"))?
        .map_err(|e| format!("cannot write the cluster snapshot into {shown}: {e}"))?;
    match written {
        Some(bytes) => {
            tracing::info!(revision, raft_index = index, bytes, dir = %shown, "cluster state saved")
        }
        None => tracing::debug!(raft_index = index, "a newer cluster state is saved already"),
    }
    Ok(())
}

/// Every `interval` until `stop`: captures the applied state and writes
/// it into the member's saved-state files. A failed write is logged and
/// tried again next time.
pub async fn save_loop(node: Arc<Node>, interval: Duration, mut stop: watch::Receiver<bool>) {
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
                if let Err(e) = write(&node, snap).await {
                    tracing::error!(error = %e, "periodic cluster snapshot failed");
                }
            }
            Err(e) => tracing::error!(error = %e, "cannot capture the cluster state"),
        }
    }
}

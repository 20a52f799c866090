//! Maintenance.Snapshot: the store streamed to the client as an etcd
//! database (see `persist::etcd_db`) followed by its SHA-256, as etcd
//! sends it, so `etcdctl snapshot save` writes a file that etcd's tools
//! check and restore and that ephd restores with `--restore-snapshot`.
//!
//! The snapshot is taken at one revision: every key as of that revision
//! (reads never take the write path's locks, so writers go on while it is
//! read), then the leases with their remaining time and the auth state.
//! On a thread of its own the database is written to a temporary file
//! (under `TMPDIR`), then sent in [`CHUNK_BYTES`] messages that each say
//! how many bytes are still to come, then one message with the SHA-256 of
//! those bytes; at most [`QUEUED`] messages wait for a slow client. The
//! file is removed when the stream ends, however it ends.

use crate::mvcc::Store;
use crate::persist::etcd_db;
use crate::proto::etcdserverpb as pb;
use futures::Stream;
use std::fs::File;
use std::io::{self, Read};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc;
use tonic::Status;

/// Bytes per message, etcd's snapshot send buffer size.
pub const CHUNK_BYTES: usize = 32 * 1024;
/// Messages encoded ahead of what the client has taken.
pub const QUEUED: usize = 8;

/// The response stream of Maintenance.Snapshot.
pub type SnapshotOut = Pin<Box<dyn Stream<Item = Result<pb::SnapshotResponse, Status>> + Send>>;

/// Starts streaming a snapshot of `store`.
pub(super) fn stream(store: Arc<Store>) -> Result<SnapshotOut, Status> {
    let (tx, rx) = mpsc::channel(QUEUED);
    std::thread::Builder::new()
        .name("ephd-snapshot".into())
        .spawn(move || produce(&store, tx))
        .map_err(|e| Status::unavailable(format!("ephd: cannot start a snapshot: {e}")))?;
    Ok(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx)))
}

type Sender = mpsc::Sender<Result<pb::SnapshotResponse, Status>>;

/// Takes the snapshot and sends it into `tx` (on the snapshot thread).
fn produce(store: &Store, tx: Sender) {
    let started = Instant::now();
    let (revision, kvs) = store.live_kvs();
    let leases = store.leases_for_snapshot();
    let auth = store.auth().image(false);
    tracing::info!(
        revision,
        keys = kvs.len(),
        leases = leases.len(),
        "sending a snapshot to a client"
    );
    let contents = etcd_db::Contents {
        revision,
        kvs: &kvs,
        leases: &leases,
        auth: &auth,
    };
    let result = tempfile::tempdir().and_then(|dir| {
        let path = dir.path().join("snapshot.db");
        etcd_db::write(&path, &contents)?;
        send_file(&path, &tx)
    });
    match result {
        Ok(total) => tracing::info!(
            revision,
            total_bytes = total,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "sent a snapshot"
        ),
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => {
            tracing::info!(revision, "snapshot client went away")
        }
        Err(e) => {
            tracing::error!(error = %e, "snapshot failed");
            let _ = tx.blocking_send(Err(Status::internal(format!("ephd: snapshot failed: {e}"))));
        }
    }
}

/// Sends the database at `path` and then its SHA-256; returns the
/// database's size.
fn send_file(path: &std::path::Path, tx: &Sender) -> io::Result<u64> {
    let mut file = File::open(path)?;
    let total = file.metadata()?.len();
    let mut sha = ring::digest::Context::new(&ring::digest::SHA256);
    let mut sent = 0u64;
    let send = |blob: Vec<u8>, remaining_bytes: u64| {
        let msg = pb::SnapshotResponse {
            header: None,
            remaining_bytes,
            blob: blob.into(),
            version: etcd_db::STORAGE_VERSION.to_string(),
        };
        tx.blocking_send(Ok(msg))
            .map_err(|_| io::Error::from(io::ErrorKind::BrokenPipe))
    };
    while sent < total {
        let n = CHUNK_BYTES.min((total - sent) as usize);
        let mut blob = vec![0u8; n];
        file.read_exact(&mut blob)?;
        sha.update(&blob);
        sent += n as u64;
        send(blob, total - sent)?;
    }
    send(sha.finish().as_ref().to_vec(), 0)?;
    Ok(total)
}

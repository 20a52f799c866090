//! Maintenance.Snapshot: the store streamed to the client as one ephd
//! snapshot file (the `--data-dir` format, see `persist`), so what
//! `etcdctl snapshot save` writes is a file ephd restores with
//! `--restore-snapshot` or from `--data-dir`. It is not etcd's bbolt
//! database: etcd's tools cannot read it, and ephd cannot read theirs.
//!
//! The snapshot is taken at one revision: every key as of that revision
//! (reads never take the write path's locks, so writers go on while it is
//! read), then the leases with their remaining time. It is encoded on a
//! thread of its own, cut into [`CHUNK_BYTES`] messages that each say how
//! many bytes are still to come, as etcd's do; at most [`QUEUED`] messages
//! wait for a slow client, so the stream costs the list of key references
//! plus a few hundred KiB, whatever the store's size. There is no SHA-256
//! trailer as etcd sends: the file carries its own checksums (per record and
//! over the whole file), which every reader checks.

use crate::mvcc::Store;
use crate::persist;
use crate::proto::etcdserverpb as pb;
use bytes::BytesMut;
use futures::Stream;
use std::io;
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

/// Takes the snapshot and encodes it into `tx` (on the snapshot thread).
fn produce(store: &Store, tx: Sender) {
    let started = Instant::now();
    let (revision, kvs) = store.live_kvs();
    let leases = store.leases_for_snapshot();
    let auth = store.auth().image(false);
    let written = persist::wall_clock_ms();
    let total = persist::encoded_len(revision, written, &kvs, &leases, Some(&auth));
    tracing::info!(
        revision,
        keys = kvs.len(),
        leases = leases.len(),
        total_bytes = total,
        "sending a snapshot to a client (ephd's snapshot format)"
    );
    let mut out = Chunker {
        tx,
        buf: BytesMut::with_capacity(CHUNK_BYTES),
        total,
        sent: 0,
    };
    let result = persist::encode_to(&mut out, revision, written, &kvs, &leases, Some(&auth))
        .and_then(|_| out.finish());
    match result {
        Ok(()) => tracing::info!(
            revision,
            total_bytes = total,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "sent a snapshot"
        ),
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => {
            tracing::info!(revision, sent_bytes = out.sent, "snapshot client went away")
        }
        Err(e) => {
            tracing::error!(error = %e, "snapshot failed");
            let _ = out
                .tx
                .blocking_send(Err(Status::internal(format!("ephd: snapshot failed: {e}"))));
        }
    }
}

/// Cuts what is written into messages of [`CHUNK_BYTES`].
struct Chunker {
    tx: Sender,
    buf: BytesMut,
    total: u64,
    sent: u64,
}

impl Chunker {
    fn send(&mut self, n: usize) -> io::Result<()> {
        let blob = self.buf.split_to(n).freeze();
        self.sent += n as u64;
        let msg = pb::SnapshotResponse {
            header: None,
            remaining_bytes: self.total.saturating_sub(self.sent),
            blob,
            version: String::new(),
        };
        self.tx
            .blocking_send(Ok(msg))
            .map_err(|_| io::Error::from(io::ErrorKind::BrokenPipe))
    }

    /// Sends what is left (the whole snapshot always ends in a message).
    fn finish(&mut self) -> io::Result<()> {
        if !self.buf.is_empty() || self.sent == 0 {
            self.send(self.buf.len())?;
        }
        if self.sent != self.total {
            return Err(io::Error::other(format!(
                "encoded {} bytes, expected {}",
                self.sent, self.total
            )));
        }
        Ok(())
    }
}

impl io::Write for Chunker {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let mut rest = data;
        while !rest.is_empty() {
            let room = CHUNK_BYTES - self.buf.len();
            let take = room.min(rest.len());
            self.buf.extend_from_slice(&rest[..take]);
            rest = &rest[take..];
            if self.buf.len() == CHUNK_BYTES {
                self.send(CHUNK_BYTES)?;
                self.buf.reserve(CHUNK_BYTES);
            }
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

//! The sending side of one peer link: two lanes, each a task with a
//! connection of its own, that encode the Raft messages queued for the peer
//! and send them in batches to its `ephd.internal.RaftTransport` service.
//!
//! * The **control** lane carries everything small and urgent: heartbeats
//!   and their answers, votes, append answers, ReadIndex, leader transfer.
//!   When it has nothing to send it probes the peer every half second, so
//!   [`PeerHealth`] knows whether the peer answers.
//! * The **bulk** lane carries appends (all of them, so they keep their
//!   order) and snapshots; a snapshot is sent apart, its data in chunks
//!   on a stream of its own (`snapshot_send.rs`).
//!   A follower catching up a long log or a large snapshot keeps this lane
//!   busy for seconds; measured on the failover benchmark, heartbeats queued
//!   behind that traffic on one connection reached the follower too late,
//!   and the leader's answers from the others were delayed the same way. On
//!   a lane of their own they never wait behind it (etcd keeps appends on a
//!   stream of their own and sends snapshots apart too).
//!
//! Messages are encoded here, on the tokio runtime, not on the Raft thread:
//! a leader feeding a member that catches up produces hundreds of MiB of
//! appends and a snapshot that may be hundreds of MiB, and encoding them on
//! the Raft thread held its ticks and heartbeats back. A snapshot is encoded
//! on a blocking thread. A bulk batch may take longer than the usual send
//! timeout: its timeout grows with its size ([`bulk_timeout`]).
//!
//! Raft tolerates lost and reordered messages; order is kept within a lane,
//! so appends and the snapshot before them arrive in order.

use super::catchup;
use super::input::Input;
use super::queue::Sender;
use super::removal::Removal;
use super::snapshot_send;
use crate::proto::ephd::internal::{raft_transport_client::RaftTransportClient, RaftBatch};
use bytes::Bytes;
use parking_lot::Mutex;
use protobuf::Message as _;
use raft::prelude::{Message, MessageType};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tonic::transport::ClientTlsConfig;

/// Most messages in one batch.
const BATCH_MESSAGES: usize = 512;
/// Most bytes in one batch (a single larger message is sent alone).
const BATCH_BYTES: usize = 8 * 1024 * 1024;
/// Largest snapshot in one message: what an ephd from before chunked
/// snapshots (`snapshot_send.rs`) sends in one `Send` call, still accepted
/// from it. Chunked snapshots are bounded by the receiver's memory instead
/// (`snapshot_recv.rs`).
pub const MAX_SNAPSHOT_BYTES: usize = 1 << 30;
/// Largest batch a member accepts: a few batches' worth, or an older
/// member's snapshot with the batch it came in.
pub const MAX_BATCH_BYTES: usize = MAX_SNAPSHOT_BYTES + 4 * BATCH_BYTES;
/// How long one connection attempt to a peer may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// How long a control batch (and the base of a bulk batch) may take.
const SEND_TIMEOUT: Duration = Duration::from_secs(5);
/// The slowest transfer a bulk batch is given time for, in bytes per
/// second, on top of [`SEND_TIMEOUT`]: a 600 MB snapshot gets a minute
/// rather than five seconds (after which it was sent again from scratch,
/// bigger each time).
const BULK_BYTES_PER_SEC: usize = 10 << 20;
/// How long the control lane may stay idle before an empty batch checks
/// that the peer still answers.
const PROBE_INTERVAL: Duration = Duration::from_millis(500);
/// Messages larger than this are encoded on a blocking thread (a
/// snapshot), so they hold no tokio worker.
const ENCODE_INLINE_BYTES: u32 = 1 << 20;

/// Since when each peer has answered every batch (absent: its last batch
/// failed, or none was sent yet).
#[derive(Debug, Default)]
pub(super) struct PeerHealth(Mutex<HashMap<u64, Instant>>);

impl PeerHealth {
    fn answered(&self, id: u64) {
        self.0.lock().entry(id).or_insert_with(Instant::now);
    }

    pub(super) fn failed(&self, id: u64) {
        self.0.lock().remove(&id);
    }

    /// Since when peer `id` has answered without interruption.
    pub(super) fn active_since(&self, id: u64) -> Option<Instant> {
        self.0.lock().get(&id).copied()
    }
}

/// Which lane a message travels on (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Lane {
    /// Small, urgent messages; probes the peer when idle.
    Control,
    /// Appends and snapshots.
    Bulk,
}

impl Lane {
    /// The lane for `m`.
    pub(super) fn of(m: &Message) -> Lane {
        match m.get_msg_type() {
            // Every append, even an empty one (a commit update or a
            // probe): one overtaking the appends before it would be
            // refused as a gap and send the follower back to probing.
            MessageType::MsgSnapshot | MessageType::MsgAppend => Lane::Bulk,
            _ => Lane::Control,
        }
    }
}

/// How long a bulk batch of `bytes` may take to be delivered.
pub(super) fn bulk_timeout(bytes: usize) -> Duration {
    SEND_TIMEOUT + Duration::from_secs_f64(bytes as f64 / BULK_BYTES_PER_SEC as f64)
}

/// A lazily connecting channel to a peer's `url`, over TLS when `tls` is
/// set (peer TLS). Each call opens a connection of its own.
pub(super) fn peer_channel(
    url: &str,
    tls: Option<ClientTlsConfig>,
) -> Result<tonic::transport::Channel, String> {
    let ep = tonic::transport::Endpoint::from_shared(url.to_string()).map_err(|e| e.to_string())?;
    let ep = match tls {
        Some(tls) => ep.tls_config(tls).map_err(|e| e.to_string())?,
        None => ep,
    };
    Ok(ep
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true)
        .connect_lazy())
}

/// Where a lane sends, and where it reports snapshots' delivery.
#[derive(Clone)]
pub(super) struct Target {
    /// This member, the sender of every batch.
    pub(super) me: u64,
    pub(super) id: u64,
    pub(super) name: String,
    pub(super) url: String,
    pub(super) tls: Option<ClientTlsConfig>,
    pub(super) inbox: Sender<Input>,
    pub(super) removal: Arc<Removal>,
}

/// Encodes `m`; a large one (a snapshot) on a blocking thread.
async fn encode(m: Message) -> Option<Bytes> {
    let encoded = if m.compute_size() > ENCODE_INLINE_BYTES {
        tokio::task::spawn_blocking(move || m.write_to_bytes())
            .await
            .ok()?
    } else {
        m.write_to_bytes()
    };
    match encoded {
        Ok(b) => Some(Bytes::from(b)),
        Err(e) => {
            tracing::error!(error = %e, "cannot encode a raft message");
            None
        }
    }
}

/// Sends what is queued on one lane for one peer, a batch per call, until
/// the Raft thread drops the queue.
pub(super) async fn send_loop(
    to: Target,
    lane: Lane,
    mut queue: mpsc::Receiver<Message>,
    health: Arc<PeerHealth>,
) {
    let Target { id, name, url, .. } = &to;
    let channel = match peer_channel(url, to.tls.clone()) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(peer = %name, url = %url, error = %e, "invalid peer URL or TLS settings");
            return;
        }
    };
    let mut client = RaftTransportClient::new(channel).max_encoding_message_size(MAX_BATCH_BYTES);
    let mut reachable = true;
    loop {
        // A peer Raft has nothing to say to (a follower to another
        // follower) gets an empty control batch now and then, so that
        // `health` knows whether it is reachable, as etcd's always-open
        // peer streams do.
        let first = if lane == Lane::Control {
            match tokio::time::timeout(PROBE_INTERVAL, queue.recv()).await {
                Ok(Some(m)) => Some(m),
                Ok(None) => return,
                Err(_) => None,
            }
        } else {
            match queue.recv().await {
                Some(m) => Some(m),
                None => return,
            }
        };
        let mut bytes = 0;
        let mut messages: Vec<Bytes> = Vec::new();
        let mut next = first;
        while let Some(m) = next.take() {
            if m.get_msg_type() == MessageType::MsgSnapshot {
                // Sent apart, its data in chunks; its answer is the
                // delivery report raft needs.
                let sent = snapshot_send::send_snapshot(&mut client, to.me, m).await;
                if sent.as_ref().is_err_and(super::removal::says_removed) {
                    to.removal.raise(to.me, &format!("member {name} says so"));
                    return;
                }
                catchup::report(&to.inbox, *id, sent.is_ok());
            } else if let Some(b) = encode(m).await {
                bytes += b.len();
                messages.push(b);
            }
            if messages.len() < BATCH_MESSAGES && bytes < BATCH_BYTES {
                next = queue.try_recv().ok();
            }
        }
        if messages.is_empty() && lane == Lane::Bulk {
            continue;
        }
        let batch = RaftBatch {
            messages,
            from: to.me,
            ack: 0,
        };
        let limit = match lane {
            Lane::Control => SEND_TIMEOUT,
            Lane::Bulk => bulk_timeout(bytes),
        };
        let sent = match tokio::time::timeout(limit, client.send(batch)).await {
            Ok(r) => r,
            Err(_) => Err(tonic::Status::deadline_exceeded(format!(
                "no answer within {limit:?}"
            ))),
        };
        if let Err(e) = &sent {
            if super::removal::says_removed(e) {
                // Nothing more to send: this member stops.
                to.removal.raise(to.me, &format!("member {name} says so"));
                return;
            }
        }
        if lane == Lane::Bulk {
            if let Err(e) = &sent {
                tracing::debug!(peer = %name, error = %e, bytes, "raft bulk batch not delivered");
            }
            continue;
        }
        match &sent {
            Ok(_) => health.answered(*id),
            Err(_) => health.failed(*id),
        }
        match sent {
            Ok(_) if !reachable => {
                reachable = true;
                tracing::info!(peer = %name, url = %url, "peer reachable again");
            }
            Ok(_) => {}
            Err(e) if reachable => {
                reachable = false;
                tracing::warn!(peer = %name, url = %url, error = %e, "peer unreachable; raft messages to it are dropped until it answers");
            }
            Err(_) => {}
        }
    }
}

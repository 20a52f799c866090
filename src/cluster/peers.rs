//! Raft messages to the other members: one client channel per peer, with a
//! bounded queue drained by one task, which sends what has queued up as one
//! batch per call to the peer's `ephd.internal.RaftTransport` service
//! (`transport.rs`). Messages are encoded with raft-rs' own protobuf types.
//! When the queue is full or the peer is unreachable, messages are dropped:
//! Raft is built for a lossy network and retries (heartbeats, append
//! probes), so the Raft thread never waits for a peer.
//!
//! Peers are dynamic: a member added by an applied conf change gets a
//! queue, a removed one loses its queue (its task ends), and one whose peer
//! URLs changed gets a new connection. Each task records since when its
//! peer has answered without interruption ([`PeerHealth`]), which the
//! reconfiguration checks read as etcd reads its transport's.

use super::membership::MemberInfo;
use crate::proto::ephd::internal::{raft_transport_client::RaftTransportClient, RaftBatch};
use bytes::Bytes;
use parking_lot::Mutex;
use protobuf::Message as _;
use raft::prelude::Message;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Messages queued for one peer at most.
const QUEUE: usize = 4096;
/// Most messages in one batch.
const BATCH_MESSAGES: usize = 512;
/// Most bytes in one batch (a single larger message is sent alone).
const BATCH_BYTES: usize = 8 * 1024 * 1024;
/// Largest batch a member accepts: a few batches' worth.
pub const MAX_BATCH_BYTES: usize = 4 * BATCH_BYTES;
/// How long one connection attempt to a peer may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// How long one batch may take to be delivered.
const SEND_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a peer's queue may stay idle before an empty batch checks that
/// the peer still answers.
const PROBE_INTERVAL: Duration = Duration::from_millis(500);

/// Since when each peer has answered every batch (absent: its last batch
/// failed, or none was sent yet).
#[derive(Debug, Default)]
pub(super) struct PeerHealth(Mutex<HashMap<u64, Instant>>);

impl PeerHealth {
    fn answered(&self, id: u64) {
        self.0.lock().entry(id).or_insert_with(Instant::now);
    }

    fn failed(&self, id: u64) {
        self.0.lock().remove(&id);
    }

    /// Since when peer `id` has answered without interruption.
    pub(super) fn active_since(&self, id: u64) -> Option<Instant> {
        self.0.lock().get(&id).copied()
    }
}

/// How the set of peers changes with an applied membership change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum PeerChange {
    /// Nothing to do.
    None,
    /// Connect to this peer (again, if its URL changed).
    Upsert {
        /// Member ID.
        id: u64,
        /// For log lines.
        name: String,
        /// Where it is reached.
        url: String,
    },
    /// Stop sending to this peer.
    Remove(u64),
}

/// One peer's queue, and where its task sends.
struct Queue {
    url: String,
    tx: mpsc::Sender<Bytes>,
}

/// The sending side: a queue per peer.
pub(super) struct Peers {
    me: u64,
    /// The runtime the sender tasks run on (the Raft thread is not one of
    /// its threads).
    runtime: tokio::runtime::Handle,
    queues: HashMap<u64, Queue>,
    health: Arc<PeerHealth>,
}

impl Peers {
    /// Starts one sender task per other member, on the current tokio
    /// runtime.
    pub(super) fn start<'a>(
        members: impl IntoIterator<Item = &'a MemberInfo>,
        me: u64,
        health: Arc<PeerHealth>,
    ) -> Peers {
        let mut peers = Peers {
            me,
            runtime: tokio::runtime::Handle::current(),
            queues: HashMap::new(),
            health,
        };
        for m in members {
            if let Some(url) = m.peer_urls.first() {
                peers.change(PeerChange::Upsert {
                    id: m.id,
                    name: display_name(m),
                    url: url.clone(),
                });
            }
        }
        peers
    }

    /// Adds, re-points or drops a peer.
    pub(super) fn change(&mut self, change: PeerChange) {
        match change {
            PeerChange::None => {}
            PeerChange::Upsert { id, .. } if id == self.me => {}
            PeerChange::Upsert { id, name, url } => {
                if self.queues.get(&id).is_some_and(|q| q.url == url) {
                    return;
                }
                let (tx, rx) = mpsc::channel(QUEUE);
                tracing::info!(peer = %name, url = %url, "sending raft messages to a peer");
                self.runtime
                    .spawn(send_loop(id, name, url.clone(), rx, self.health.clone()));
                // Replacing the old queue ends the old task.
                self.queues.insert(id, Queue { url, tx });
            }
            PeerChange::Remove(id) => {
                if self.queues.remove(&id).is_some() {
                    self.health.failed(id);
                    tracing::info!(peer = %format_args!("{id:x}"), "no more raft messages to a removed member");
                }
            }
        }
    }

    /// Queues `msgs` for their peers; drops what does not fit.
    pub(super) fn send_all(&self, msgs: Vec<Message>) {
        for m in msgs {
            let Some(queue) = self.queues.get(&m.get_to()) else {
                continue;
            };
            match m.write_to_bytes() {
                Ok(bytes) => {
                    let _ = queue.tx.try_send(Bytes::from(bytes));
                }
                Err(e) => tracing::error!(error = %e, "cannot encode a raft message"),
            }
        }
    }
}

/// A member's name for log lines: its `--name`, or its ID before it has
/// published one.
pub(super) fn display_name(m: &MemberInfo) -> String {
    if m.name.is_empty() {
        format!("{:x}", m.id)
    } else {
        m.name.clone()
    }
}

/// Sends what is queued for one peer, a batch per call, until the Raft
/// thread drops the queue.
async fn send_loop(
    id: u64,
    name: String,
    url: String,
    mut queue: mpsc::Receiver<Bytes>,
    health: Arc<PeerHealth>,
) {
    let channel = match tonic::transport::Endpoint::from_shared(url.clone()) {
        Ok(ep) => ep
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(SEND_TIMEOUT)
            .tcp_nodelay(true)
            .connect_lazy(),
        Err(e) => {
            tracing::error!(peer = %name, url = %url, error = %e, "invalid peer URL");
            return;
        }
    };
    let mut client = RaftTransportClient::new(channel).max_encoding_message_size(MAX_BATCH_BYTES);
    let mut reachable = true;
    loop {
        // A peer Raft has nothing to say to (a follower to another
        // follower) gets an empty batch now and then, so that `health`
        // knows whether it is reachable, as etcd's always-open peer
        // streams do.
        let first = match tokio::time::timeout(PROBE_INTERVAL, queue.recv()).await {
            Ok(Some(m)) => Some(m),
            Ok(None) => return,
            Err(_) => None,
        };
        let mut bytes = first.as_ref().map_or(0, |m| m.len());
        let mut messages: Vec<Bytes> = first.into_iter().collect();
        while !messages.is_empty() && messages.len() < BATCH_MESSAGES && bytes < BATCH_BYTES {
            match queue.try_recv() {
                Ok(m) => {
                    bytes += m.len();
                    messages.push(m);
                }
                Err(_) => break,
            }
        }
        let sent = client.send(RaftBatch { messages }).await;
        match &sent {
            Ok(_) => health.answered(id),
            Err(_) => health.failed(id),
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

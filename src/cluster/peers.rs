//! Raft messages to the other members: one client channel per peer, with a
//! bounded queue drained by one task, which sends what has queued up as one
//! batch per call to the peer's `ephd.internal.RaftTransport` service
//! (`transport.rs`). Messages are encoded with raft-rs' own protobuf types.
//! When the queue is full or the peer is unreachable, messages are dropped:
//! Raft is built for a lossy network and retries (heartbeats, append
//! probes), so the Raft thread never waits for a peer.

use super::catchup;
use super::node::Input;
use crate::config::{ClusterConfig, PeerTls};
use crate::proto::ephd::internal::{raft_transport_client::RaftTransportClient, RaftBatch};
use bytes::Bytes;
use crossbeam_channel::Sender;
use parking_lot::Mutex;
use protobuf::Message as _;
use raft::prelude::{Message, MessageType};
use std::collections::HashMap;
use std::time::Duration;
use tokio::sync::mpsc;
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

/// Messages queued for one peer at most.
const QUEUE: usize = 4096;
/// Most messages in one batch.
const BATCH_MESSAGES: usize = 512;
/// Most bytes in one batch (a single larger message is sent alone).
const BATCH_BYTES: usize = 8 * 1024 * 1024;
/// Largest snapshot a member sends or accepts (snapshots travel as one
/// message; chunking them is not built yet).
pub const MAX_SNAPSHOT_BYTES: usize = 1 << 30;
/// Largest batch a member accepts: a few batches' worth, or a snapshot
/// with the batch it came in.
pub const MAX_BATCH_BYTES: usize = MAX_SNAPSHOT_BYTES + 4 * BATCH_BYTES;
/// How long one connection attempt to a peer may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// How long one batch may take to be delivered.
const SEND_TIMEOUT: Duration = Duration::from_secs(5);

/// The sending side: a queue per peer.
pub(super) struct Peers {
    queues: HashMap<u64, mpsc::Sender<Outgoing>>,
    /// Peers whose snapshot message could not even be queued: raft must
    /// hear that it failed (see [`Peers::take_undelivered`]).
    undelivered: Mutex<Vec<u64>>,
}

/// A message queued for a peer; a snapshot's delivery is reported to the
/// Raft thread, which must tell raft.
struct Outgoing {
    bytes: Bytes,
    snapshot: bool,
}

impl Peers {
    /// Starts one sender task per other member, on the current tokio
    /// runtime. Fails when the peer TLS files cannot be read.
    pub(super) fn start(
        config: &ClusterConfig,
        me: u64,
        inbox: Sender<Input>,
    ) -> Result<Peers, String> {
        let tls = config.peer_tls.as_ref().map(client_tls).transpose()?;
        let mut queues = HashMap::new();
        for m in config.members.iter().filter(|m| m.id != me) {
            let (tx, rx) = mpsc::channel(QUEUE);
            let url = m.peer_urls[0].clone();
            let to = Target {
                id: m.id,
                name: m.name.clone(),
                url,
                tls: tls.clone(),
                inbox: inbox.clone(),
            };
            tokio::spawn(send_loop(to, rx));
            queues.insert(m.id, tx);
        }
        Ok(Peers {
            queues,
            undelivered: Mutex::new(Vec::new()),
        })
    }

    /// Peers whose snapshot message was dropped before it was queued.
    pub(super) fn take_undelivered(&self) -> Vec<u64> {
        std::mem::take(&mut *self.undelivered.lock())
    }

    /// Queues `msgs` for their peers; drops what does not fit.
    pub(super) fn send_all(&self, msgs: Vec<Message>) {
        for m in msgs {
            let Some(queue) = self.queues.get(&m.get_to()) else {
                continue;
            };
            let snapshot = m.get_msg_type() == MessageType::MsgSnapshot;
            let queued = match m.write_to_bytes() {
                Ok(bytes) => queue
                    .try_send(Outgoing {
                        bytes: Bytes::from(bytes),
                        snapshot,
                    })
                    .is_ok(),
                Err(e) => {
                    tracing::error!(error = %e, "cannot encode a raft message");
                    false
                }
            };
            if snapshot && !queued {
                self.undelivered.lock().push(m.get_to());
            }
        }
    }
}

/// Where a send loop sends (over TLS with peer TLS), and where it reports
/// snapshots' delivery.
struct Target {
    id: u64,
    name: String,
    url: String,
    tls: Option<ClientTlsConfig>,
    inbox: Sender<Input>,
}

/// The TLS settings this member dials its peers with: the peer CA to
/// verify them, and its own peer certificate as client certificate (etcd
/// presents the same one both ways). Read once at startup; a rotated peer
/// certificate reaches outgoing connections at the next restart, while the
/// peer listener picks it up at once (`server::tls`).
fn client_tls(peer: &PeerTls) -> Result<ClientTlsConfig, String> {
    let read = |p: &std::path::Path, flag: &str| {
        std::fs::read(p).map_err(|e| format!("cannot read {flag} {}: {e}", p.display()))
    };
    let ca = read(&peer.ca, "--peer-trusted-ca-file")?;
    let cert = read(&peer.cert, "--peer-cert-file")?;
    let key = read(&peer.key, "--peer-key-file")?;
    Ok(ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca))
        .identity(Identity::from_pem(cert, key)))
}

/// Sends what is queued for one peer, a batch per call, until the Raft
/// thread drops the queue.
async fn send_loop(to: Target, mut queue: mpsc::Receiver<Outgoing>) {
    let Target { name, url, .. } = &to;
    let endpoint = tonic::transport::Endpoint::from_shared(url.clone())
        .map_err(|e| e.to_string())
        .and_then(|ep| match to.tls.clone() {
            Some(tls) => ep.tls_config(tls).map_err(|e| e.to_string()),
            None => Ok(ep),
        });
    let channel = match endpoint {
        Ok(ep) => ep
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(SEND_TIMEOUT)
            .tcp_nodelay(true)
            .connect_lazy(),
        Err(e) => {
            tracing::error!(peer = %name, url = %url, error = %e, "invalid peer URL or TLS settings");
            return;
        }
    };
    let mut client = RaftTransportClient::new(channel).max_encoding_message_size(MAX_BATCH_BYTES);
    let mut reachable = true;
    while let Some(first) = queue.recv().await {
        let mut bytes = first.bytes.len();
        let mut snapshots = usize::from(first.snapshot);
        let mut messages = vec![first.bytes];
        while messages.len() < BATCH_MESSAGES && bytes < BATCH_BYTES {
            match queue.try_recv() {
                Ok(m) => {
                    bytes += m.bytes.len();
                    snapshots += usize::from(m.snapshot);
                    messages.push(m.bytes);
                }
                Err(_) => break,
            }
        }
        let sent = client.send(RaftBatch { messages }).await;
        for _ in 0..snapshots {
            catchup::report(&to.inbox, to.id, sent.is_ok());
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

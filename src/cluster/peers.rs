//! Raft messages to the other members: one client channel per peer, with a
//! bounded queue drained by one task, which sends what has queued up as one
//! batch on a long-lived stream to the peer's `ephd.internal.RaftTransport`
//! service (`peer_stream.rs`, `transport.rs`); a batch with a snapshot goes
//! as a unary call of its own, as does every batch to a member that serves
//! no stream. Messages are encoded with raft-rs' own protobuf types.
//! When the queue is full or the peer is unreachable, messages are dropped:
//! Raft is built for a lossy network and retries (heartbeats, append
//! probes), so the Raft thread never waits for a peer. A snapshot's
//! delivery (or its loss) is reported back to the Raft thread, which must
//! tell raft (`catchup.rs`).
//!
//! Peers are dynamic: a member added by an applied conf change gets a
//! queue, a removed one loses its queue (its task ends), and one whose peer
//! URLs changed gets a new connection. Each task records since when its
//! peer has answered without interruption ([`PeerHealth`]), which the
//! reconfiguration checks read as etcd reads its transport's. With peer
//! TLS every connection is TLS, with this member's peer certificate. A
//! peer that answers that this member was removed raises its removal
//! (`removal.rs`).

use super::catchup;
use super::input::{Input, PeerChange};
use super::membership::MemberInfo;
use super::peer_stream::{self, Link};
use super::queue::Sender;
use super::removal::Removal;
use crate::config::PeerTls;
use crate::proto::ephd::internal::{raft_transport_client::RaftTransportClient, RaftBatch};
use bytes::Bytes;
use parking_lot::Mutex;
use protobuf::Message as _;
use raft::prelude::{Message, MessageType};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tonic::transport::{Certificate, ClientTlsConfig, Identity};
use tonic::Status;

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

/// A message queued for a peer; a snapshot's delivery is reported to the
/// Raft thread, which must tell raft.
struct Outgoing {
    bytes: Bytes,
    snapshot: bool,
}

/// One peer's queue, and where its task sends.
struct Queue {
    url: String,
    tx: mpsc::Sender<Outgoing>,
}

/// The sending side: a queue per peer.
pub(super) struct Peers {
    me: u64,
    /// The runtime the sender tasks run on (the Raft thread is not one of
    /// its threads).
    runtime: tokio::runtime::Handle,
    queues: HashMap<u64, Queue>,
    health: Arc<PeerHealth>,
    /// Where send loops report snapshots' delivery.
    inbox: Sender<Input>,
    /// Peer TLS for outgoing connections.
    tls: Option<ClientTlsConfig>,
    /// Peers whose snapshot message could not even be queued: raft must
    /// hear that it failed (see [`Peers::take_undelivered`]).
    undelivered: Mutex<Vec<u64>>,
    /// Raised when a peer answers that this member was removed.
    removal: Arc<Removal>,
}

impl Peers {
    /// Starts one sender task per other member, on the current tokio
    /// runtime, over peer TLS when [`init_tls`] set it.
    pub(super) fn start<'a>(
        members: impl IntoIterator<Item = &'a MemberInfo>,
        me: u64,
        health: Arc<PeerHealth>,
        inbox: Sender<Input>,
        removal: Arc<Removal>,
    ) -> Result<Peers, String> {
        let mut peers = Peers {
            me,
            runtime: tokio::runtime::Handle::current(),
            queues: HashMap::new(),
            health,
            inbox,
            tls: PEER_TLS.get().cloned().flatten(),
            undelivered: Mutex::new(Vec::new()),
            removal,
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
        Ok(peers)
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
                let to = Target {
                    me: self.me,
                    id,
                    name,
                    url: url.clone(),
                    tls: self.tls.clone(),
                    inbox: self.inbox.clone(),
                    removal: self.removal.clone(),
                };
                self.runtime.spawn(send_loop(to, rx, self.health.clone()));
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

    /// Peers whose snapshot message was dropped before it was queued.
    pub(super) fn take_undelivered(&self) -> Vec<u64> {
        std::mem::take(&mut *self.undelivered.lock())
    }

    /// Queues `msgs` for their peers; drops what does not fit.
    pub(super) fn send_all(&self, msgs: Vec<Message>) {
        for m in msgs {
            let snapshot = m.get_msg_type() == MessageType::MsgSnapshot;
            let queued = match (self.queues.get(&m.get_to()), m.write_to_bytes()) {
                (None, _) => false,
                (Some(queue), Ok(bytes)) => queue
                    .tx
                    .try_send(Outgoing {
                        bytes: Bytes::from(bytes),
                        snapshot,
                    })
                    .is_ok(),
                (Some(_), Err(e)) => {
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

/// A member's name for log lines: its `--name`, or its ID before it has
/// published one.
pub(super) fn display_name(m: &MemberInfo) -> String {
    if m.name.is_empty() {
        format!("{:x}", m.id)
    } else {
        m.name.clone()
    }
}

/// The process's peer TLS for outgoing connections, set once at startup
/// by [`init_tls`] (`None`: plaintext peers).
static PEER_TLS: std::sync::OnceLock<Option<ClientTlsConfig>> = std::sync::OnceLock::new();

/// Reads the peer TLS files (when peer TLS is on) for every outgoing peer
/// connection of this process: Raft messages, forwarded keep-alives, and
/// the membership calls of a starting member. Fails when a file cannot be
/// read; a second call keeps the first settings.
pub fn init_tls(peer: Option<&PeerTls>) -> Result<(), String> {
    let tls = peer.map(client_tls).transpose()?;
    let _ = PEER_TLS.set(tls);
    Ok(())
}

/// An endpoint for a peer's `url`, with the process's peer TLS if any.
pub(super) fn endpoint(url: &str) -> Result<tonic::transport::Endpoint, String> {
    let ep = tonic::transport::Endpoint::from_shared(url.to_string()).map_err(|e| e.to_string())?;
    match PEER_TLS.get().cloned().flatten() {
        Some(tls) => ep.tls_config(tls).map_err(|e| e.to_string()),
        None => Ok(ep),
    }
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

/// A lazily connecting channel to a peer's `url`, over TLS when `tls` is
/// set (peer TLS).
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
        .timeout(SEND_TIMEOUT)
        .tcp_nodelay(true)
        .connect_lazy())
}

/// Where a send loop sends, and where it reports snapshots' delivery.
struct Target {
    /// This member, the sender of every batch.
    me: u64,
    id: u64,
    name: String,
    url: String,
    tls: Option<ClientTlsConfig>,
    inbox: Sender<Input>,
    removal: Arc<Removal>,
}

/// Sends what is queued for one peer until the Raft thread drops the
/// queue: each batch on the peer's stream (`peer_stream.rs`), a batch with
/// a snapshot (and every batch to a member that serves no stream) as a
/// unary call, whose answer is the snapshot's delivery report.
async fn send_loop(to: Target, mut queue: mpsc::Receiver<Outgoing>, health: Arc<PeerHealth>) {
    let Target { name, url, .. } = &to;
    let channel = match peer_channel(url, to.tls.clone()) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(peer = %name, url = %url, error = %e, "invalid peer URL or TLS settings");
            return;
        }
    };
    let mut client = RaftTransportClient::new(channel).max_encoding_message_size(MAX_BATCH_BYTES);
    let mut reachable = true;
    let mut link: Option<Link> = None;
    // False once the peer answered that it serves no stream (an older
    // member): unary calls only, as before streams.
    let mut streams = true;
    loop {
        // A peer Raft has nothing to say to (a follower to another
        // follower) gets an empty batch now and then, so that `health`
        // knows whether it is reachable, as etcd's always-open peer
        // streams do.
        let first = tokio::select! {
            got = tokio::time::timeout(PROBE_INTERVAL, queue.recv()) => match got {
                Ok(Some(m)) => Some(m),
                Ok(None) => return,
                Err(_) => None,
            },
            answer = peer_stream::answer(&mut link) => {
                if answer.is_err() {
                    link = None;
                }
                if !outcome(&to, &health, &mut reachable, answer) {
                    return;
                }
                continue;
            }
        };
        let mut bytes = first.as_ref().map_or(0, |m| m.bytes.len());
        let mut snapshots = first.as_ref().map_or(0, |m| usize::from(m.snapshot));
        let mut messages: Vec<Bytes> = first.into_iter().map(|m| m.bytes).collect();
        while !messages.is_empty() && messages.len() < BATCH_MESSAGES && bytes < BATCH_BYTES {
            match queue.try_recv() {
                Ok(m) => {
                    bytes += m.bytes.len();
                    snapshots += usize::from(m.snapshot);
                    messages.push(m.bytes);
                }
                Err(_) => break,
            }
        }
        let batch = RaftBatch {
            messages,
            from: to.me,
            ack: 0,
        };
        if snapshots == 0 && streams {
            if link.as_ref().is_some_and(|l| l.overdue(SEND_TIMEOUT)) {
                link = None;
                let late = Status::deadline_exceeded("the peer did not answer on its stream");
                if !outcome(&to, &health, &mut reachable, Err(late)) {
                    return;
                }
            }
            if link.is_none() {
                match Link::open(&mut client).await {
                    Ok(l) => link = Some(l),
                    Err(e) if e.code() == tonic::Code::Unimplemented => streams = false,
                    Err(e) => {
                        // The batch is dropped, as a failed call's was.
                        if !outcome(&to, &health, &mut reachable, Err(e)) {
                            return;
                        }
                        continue;
                    }
                }
            }
            if let Some(l) = &mut link {
                if !l.send(batch, SEND_TIMEOUT).await {
                    link = None;
                    let stuck = Status::deadline_exceeded("the stream to the peer is stuck");
                    if !outcome(&to, &health, &mut reachable, Err(stuck)) {
                        return;
                    }
                }
                continue;
            }
        }
        let sent = client.send(batch).await.map(|_| ());
        for _ in 0..snapshots {
            catchup::report(&to.inbox, to.id, sent.is_ok());
        }
        if !outcome(&to, &health, &mut reachable, sent) {
            return;
        }
    }
}

/// Records whether peer `to` answered; false when it said this member was
/// removed (raised: this member stops, nothing more to send).
fn outcome(
    to: &Target,
    health: &PeerHealth,
    reachable: &mut bool,
    answer: Result<(), Status>,
) -> bool {
    let Target { id, name, url, .. } = to;
    match answer {
        Ok(()) => {
            health.answered(*id);
            if !*reachable {
                *reachable = true;
                tracing::info!(peer = %name, url = %url, "peer reachable again");
            }
        }
        Err(e) if super::removal::says_removed(&e) => {
            to.removal.raise(to.me, &format!("member {name} says so"));
            return false;
        }
        Err(e) => {
            health.failed(*id);
            if *reachable {
                *reachable = false;
                tracing::warn!(peer = %name, url = %url, error = %e, "peer unreachable; raft messages to it are dropped until it answers");
            }
        }
    }
    true
}

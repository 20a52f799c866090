//! The sending side of one peer link: two lanes, each a task with a
//! connection of its own, that encode the Raft messages queued for the peer
//! and send them in batches on a long-lived connection per lane: a framed
//! lane (`frames.rs`), or a stream of the peer's
//! `ephd.internal.RaftTransport` gRPC service (`peer_stream.rs`) when the
//! peer serves no framed lanes.
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
//! the Raft thread held its ticks and heartbeats back. A large message is
//! encoded on a blocking thread. A bulk batch may take longer than the usual send
//! timeout: its timeout grows with its size ([`bulk_timeout`]).
//!
//! Raft tolerates lost and reordered messages; order is kept within a lane,
//! so appends and the snapshot before them arrive in order.

use crate::cluster::log::catchup;
use crate::cluster::log::input::Input;
use crate::cluster::log::queue::Sender;
use crate::cluster::replicated::removal::Removal;
use crate::cluster::transport::frames::{FramedLink, NotOpened};
use crate::cluster::transport::link::{answer, AnyLink, Framed};
use crate::cluster::transport::peer_dial::{self, Dialer};
use crate::cluster::transport::peer_metrics::{Outgoing, PeerMetrics};
use crate::cluster::transport::peer_settings::PeerSettings;
use crate::cluster::transport::peer_stream::{self, Link};
use crate::cluster::transport::snapshot_send;
use crate::proto::ephd::internal::{raft_transport_client::RaftTransportClient, RaftBatch};
use bytes::Bytes;
use futures::FutureExt;
use parking_lot::Mutex;
use protobuf::Message as _;
use raft::prelude::{Message, MessageType};
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tonic::transport::Channel;
use tonic::Status;

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
/// failed, or none was sent yet), and the peer metrics, whose active and
/// disconnected peers follow those changes.
pub(in crate::cluster) struct PeerHealth {
    since: Mutex<HashMap<u64, Instant>>,
    metrics: PeerMetrics,
}

impl PeerHealth {
    /// The health of member `me`'s peers, none answering yet.
    pub(in crate::cluster) fn new(me: u64) -> PeerHealth {
        PeerHealth {
            since: Mutex::default(),
            metrics: PeerMetrics::new(me),
        }
    }

    fn answered(&self, id: u64) {
        if let Entry::Vacant(e) = self.since.lock().entry(id) {
            e.insert(Instant::now());
            self.metrics.connected(id);
        }
    }

    pub(in crate::cluster) fn failed(&self, id: u64) {
        if self.since.lock().remove(&id).is_some() {
            self.metrics.disconnected(id);
        }
    }

    /// Member `id` is no peer any more.
    pub(in crate::cluster) fn removed(&self, id: u64) {
        self.since.lock().remove(&id);
        self.metrics.removed(id);
    }

    /// Since when peer `id` has answered without interruption.
    pub(in crate::cluster) fn active_since(&self, id: u64) -> Option<Instant> {
        self.since.lock().get(&id).copied()
    }

    /// The peer metrics (`peer_metrics.rs`).
    pub(in crate::cluster) fn metrics(&self) -> &PeerMetrics {
        &self.metrics
    }
}

/// Which lane a message travels on (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::cluster) enum Lane {
    /// Small, urgent messages; probes the peer when idle.
    Control,
    /// Appends and snapshots.
    Bulk,
}

impl Lane {
    /// The lane for `m`.
    pub(in crate::cluster) fn of(m: &Message) -> Lane {
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
pub(in crate::cluster) fn bulk_timeout(bytes: usize) -> Duration {
    SEND_TIMEOUT + Duration::from_secs_f64(bytes as f64 / BULK_BYTES_PER_SEC as f64)
}

/// A lazily connecting channel to a peer's `url`, over TLS when `tls` is
/// set (peer TLS; each new connection with the settings current then).
/// Each call opens a connection of its own.
pub(in crate::cluster) fn peer_channel(
    url: &str,
    tls: Option<Arc<Dialer>>,
) -> Result<Channel, String> {
    peer_dial::lazy_channel(tls, url, CONNECT_TIMEOUT)
}

/// Where a lane sends, and where it reports snapshots' delivery.
#[derive(Clone)]
pub(in crate::cluster) struct Target {
    /// This member, the sender of every batch.
    pub(in crate::cluster) me: u64,
    pub(in crate::cluster) id: u64,
    pub(in crate::cluster) name: String,
    pub(in crate::cluster) url: String,
    pub(in crate::cluster) inbox: Sender<Input>,
    pub(in crate::cluster) removal: Arc<Removal>,
    /// The link's traffic metrics.
    pub(in crate::cluster) out: Arc<Outgoing>,
    /// Framed lanes or gRPC streams, the snapshot chunk size, peer TLS.
    pub(in crate::cluster) settings: PeerSettings,
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

/// What a lane's queue gave.
enum Next {
    Message(Message),
    /// The control lane was idle for [`PROBE_INTERVAL`]: time to probe.
    Idle,
    /// The Raft thread dropped the queue: the lane ends.
    Closed,
}

/// The next message on `lane`'s queue; the control lane gives up after
/// [`PROBE_INTERVAL`], so an idle peer is still probed.
async fn next(lane: Lane, queue: &mut mpsc::Receiver<Message>) -> Next {
    let got = match lane {
        Lane::Control => match tokio::time::timeout(PROBE_INTERVAL, queue.recv()).await {
            Ok(got) => got,
            Err(_) => return Next::Idle,
        },
        Lane::Bulk => queue.recv().await,
    };
    got.map_or(Next::Closed, Next::Message)
}

/// Sends what is queued on one lane for one peer until the Raft thread
/// drops the queue: each batch on the lane's stream to the peer
/// (`peer_stream.rs`); a snapshot apart, as a call whose answer is its
/// delivery report; everything as unary calls to a member that serves no
/// stream (an older build).
pub(in crate::cluster) async fn send_loop(
    to: Target,
    lane: Lane,
    mut queue: mpsc::Receiver<Message>,
    health: Arc<PeerHealth>,
) {
    let Target { name, url, .. } = &to;
    let channel = match peer_channel(url, to.settings.dialer.tls()) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(peer = %name, url = %url, error = %e, "invalid peer URL or TLS settings");
            return;
        }
    };
    let client_of =
        |channel| RaftTransportClient::new(channel).max_encoding_message_size(MAX_BATCH_BYTES);
    let mut client = client_of(channel);
    let mut state = LaneState {
        to: &to,
        lane,
        health: &health,
        reachable: true,
    };
    let mut link: Option<AnyLink> = None;
    // False once the peer answered that it serves no stream.
    let mut streams = true;
    let mut framed = Framed::new(to.settings.framed_lanes);
    loop {
        // A peer Raft has nothing to say to (a follower to another
        // follower) gets an empty control batch now and then, so that
        // `health` knows whether it is reachable, as etcd's always-open
        // peer streams do.
        let first = tokio::select! {
            got = next(lane, &mut queue) => match got {
                Next::Message(m) => Some(m),
                Next::Idle => None,
                Next::Closed => return,
            },
            answer = answer(&mut link) => {
                if answer.is_err() {
                    link = None;
                }
                if !state.outcome(answer) {
                    return;
                }
                continue;
            }
        };
        // Gathers a batch; stops at a snapshot, which goes after the
        // appends queued before it.
        let mut bytes = 0;
        let mut messages: Vec<Bytes> = Vec::new();
        let mut snapshot = None;
        let mut next = first;
        while let Some(m) = next.take() {
            if m.get_msg_type() == MessageType::MsgSnapshot {
                snapshot = Some(m);
                break;
            }
            if let Some(b) = encode(m).await {
                bytes += b.len();
                messages.push(b);
            }
            if messages.len() < BATCH_MESSAGES && bytes < BATCH_BYTES {
                next = queue.try_recv().ok();
            }
        }
        let probe = messages.is_empty() && snapshot.is_none();
        if !messages.is_empty() || (probe && lane == Lane::Control) {
            let batch = RaftBatch {
                messages,
                from: to.me,
                ack: 0,
            };
            let limit = state.limit(bytes);
            let count = batch.messages.len();
            let counted = crate::cluster::transport::peer_metrics::batch_bytes(&batch, bytes);
            // The control lane's acks time the round trip.
            let timed = (lane == Lane::Control).then_some(&to.out);
            let sent = if streams {
                let mut opened = Opening {
                    to: &to,
                    client: &mut client,
                    framed: &mut framed,
                    timed,
                };
                match stream_send(&mut opened, &mut link, batch, limit).await {
                    Streamed::Sent => None,
                    Streamed::Failed(e) => Some(Err(e)),
                    Streamed::Stuck(e) => {
                        // The connection may be the stuck part: the next
                        // stream goes on a new one.
                        if let Ok(c) = peer_channel(url, to.settings.dialer.tls()) {
                            client = client_of(c);
                        }
                        Some(Err(e))
                    }
                    Streamed::Unimplemented(batch) => {
                        streams = false;
                        Some(unary(&mut client, batch, limit).await)
                    }
                }
            } else {
                Some(unary(&mut client, batch, limit).await)
            };
            let delivered = sent.as_ref().is_none_or(Result::is_ok);
            to.out.sent.batch(counted, count, delivered);
            if let Some(sent) = sent {
                if !state.outcome(sent) {
                    return;
                }
            }
        }
        if let Some(m) = snapshot {
            // Sent apart, its data in chunks (`snapshot_send.rs`).
            // Its data (protobuf's u32 size would not hold a large one).
            let size = m.get_snapshot().get_data().len();
            let sent = snapshot_send::send_snapshot(
                &mut client,
                to.me,
                m,
                to.settings.snapshot_chunk_bytes,
            )
            .await;
            to.out.sent.batch(size, 1, sent.is_ok());
            catchup::report(&to.inbox, to.id, sent.is_ok());
            if !state.outcome(sent) {
                return;
            }
        }
    }
}

/// What handing a batch to the lane's stream came to.
enum Streamed {
    /// Handed over; its ack (if it asked) comes on the stream.
    Sent,
    /// The stream could not be opened: the batch is dropped, as a failed
    /// call's was.
    Failed(Status),
    /// Opening the stream, or the peer's ack, took longer than the batch's
    /// limit, or the stream took no batch within it (stuck or gone): the
    /// batch is dropped and the connection replaced.
    Stuck(Status),
    /// The peer serves no stream: the batch, to be sent as a unary call.
    Unimplemented(RaftBatch),
}

/// What opening a lane's connection needs.
struct Opening<'a> {
    to: &'a Target,
    client: &'a mut RaftTransportClient<Channel>,
    framed: &'a mut Framed,
    /// Where the acks' round trips go (the control lane).
    timed: Option<&'a Arc<Outgoing>>,
}

/// Hands `batch` to the connection in `link`, opening one when there is
/// none (or when the peer has not acked within `limit`): framed when the
/// peer serves framed lanes, a gRPC stream otherwise.
async fn stream_send(
    opening: &mut Opening<'_>,
    link: &mut Option<AnyLink>,
    batch: RaftBatch,
    limit: Duration,
) -> Streamed {
    if link.as_ref().is_some_and(|l| l.overdue(limit)) {
        *link = None;
        return Streamed::Stuck(Status::deadline_exceeded(
            "the peer did not answer on its stream",
        ));
    }
    if matches!(link, Some(AnyLink::Grpc(_))) && opening.framed.try_now() {
        // The fallback is over: the peer may have been upgraded.
        *link = None;
    }
    let Opening {
        to,
        client,
        framed,
        timed,
    } = opening;
    if link.is_none() && framed.try_now() {
        match open_framed(to, timed.cloned(), limit).await {
            Ok(l) => *link = Some(AnyLink::Framed(l)),
            Err(NotOpened::NotOffered) => framed.fall_back(&to.name),
            Err(NotOpened::Failed(e)) => return Streamed::Failed(e),
        }
    }
    if link.is_none() {
        // Bounded like every other wait on the peer: a connection that
        // never answers the stream's opening would hold the lane forever
        // (no probe, no retry).
        match tokio::time::timeout(limit, Link::open(client, timed.cloned())).await {
            Ok(Ok(l)) => *link = Some(AnyLink::Grpc(l)),
            Ok(Err(e)) if e.code() == tonic::Code::Unimplemented => {
                return Streamed::Unimplemented(batch)
            }
            Ok(Err(e)) => return Streamed::Failed(e),
            Err(_) => {
                return Streamed::Stuck(Status::deadline_exceeded(format!(
                    "the peer did not open a stream within {limit:?}"
                )))
            }
        }
    }
    let Some(l) = link else {
        return Streamed::Failed(Status::internal("no stream"));
    };
    if l.send(batch, limit).await {
        return Streamed::Sent;
    }
    // A framed lane the peer closed after refusing this member (it was
    // removed) fails the next write; the refusal may be read already.
    let refused = match link.take() {
        Some(AnyLink::Framed(mut l)) => l.answer().now_or_never().and_then(Result::err),
        _ => None,
    };
    match refused {
        Some(status) => Streamed::Failed(status),
        None => Streamed::Stuck(Status::deadline_exceeded("the stream to the peer is stuck")),
    }
}

/// Dials a framed lane to `to` and says hello, all within `limit`.
async fn open_framed(
    to: &Target,
    timed: Option<Arc<Outgoing>>,
    limit: Duration,
) -> Result<FramedLink, NotOpened> {
    let opening = async {
        let (io, offered) =
            peer_dial::connect_framed(to.settings.dialer.tls(), &to.url, CONNECT_TIMEOUT)
                .await
                .map_err(|e| {
                    NotOpened::Failed(match e.refused {
                        true => crate::cluster::transport::frames::peer_gone(e.message),
                        false => Status::unavailable(e.message),
                    })
                })?;
        if !offered {
            return Err(NotOpened::NotOffered);
        }
        FramedLink::hello(io, timed, MAX_BATCH_BYTES).await
    };
    match tokio::time::timeout(limit, opening).await {
        Ok(opened) => opened,
        Err(_) => Err(NotOpened::Failed(Status::deadline_exceeded(format!(
            "the peer did not open a framed lane within {limit:?}"
        )))),
    }
}

/// Sends `batch` as one unary call, within `limit`.
async fn unary(
    client: &mut RaftTransportClient<Channel>,
    batch: RaftBatch,
    limit: Duration,
) -> Result<(), Status> {
    match tokio::time::timeout(limit, client.send(batch)).await {
        Ok(r) => r.map(|_| ()),
        Err(_) => Err(Status::deadline_exceeded(format!(
            "no answer within {limit:?}"
        ))),
    }
}

/// What a lane knows about its peer between batches.
struct LaneState<'a> {
    to: &'a Target,
    lane: Lane,
    health: &'a PeerHealth,
    /// Whether the last answer came (for logging changes only).
    reachable: bool,
}

impl LaneState<'_> {
    /// How long a batch of `bytes` may take on this lane (handed to the
    /// stream, or answered).
    fn limit(&self, bytes: usize) -> Duration {
        match self.lane {
            Lane::Control => SEND_TIMEOUT,
            // A stream's ack may wait behind the batches handed before.
            Lane::Bulk => bulk_timeout(bytes.max(peer_stream::HANDED * BATCH_BYTES)),
        }
    }

    /// Records whether the peer answered; false when it said this member
    /// was removed (raised: this member stops, nothing more to send).
    /// Only the control lane, which probes, records the peer's health.
    fn outcome(&mut self, answer: Result<(), Status>) -> bool {
        let Target { id, name, url, .. } = self.to;
        match answer {
            Err(e) if crate::cluster::replicated::removal::says_removed(&e) => {
                self.to
                    .removal
                    .raise(self.to.me, &format!("member {name} says so"));
                return false;
            }
            Err(e) if self.lane == Lane::Bulk => {
                tracing::debug!(peer = %name, error = %e, "raft bulk batch not delivered");
            }
            Ok(()) if self.lane == Lane::Bulk => {}
            Ok(()) => {
                self.health.answered(*id);
                if !self.reachable {
                    self.reachable = true;
                    tracing::info!(peer = %name, url = %url, "peer reachable again");
                }
            }
            Err(e) => {
                self.health.failed(*id);
                // A member stopping with SIGTERM hands its leadership over
                // first; one whose process is gone cannot.
                if crate::cluster::transport::frames::says_peer_gone(&e) {
                    // If it led, the lowest surviving voter campaigns now
                    // rather than after an election timeout.
                    let _ = self.to.inbox.try_send(Input::LeaderGone(*id));
                }
                if self.reachable {
                    self.reachable = false;
                    tracing::warn!(peer = %name, url = %url, error = %e, "peer unreachable; raft messages to it are dropped until it answers");
                }
            }
        }
        true
    }
}

#[cfg(test)]
#[path = "sender_tests.rs"]
mod tests;

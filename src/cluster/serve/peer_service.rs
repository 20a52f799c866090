//! Raft messages from the other members: a small gRPC service
//! (`ephd.internal.RaftTransport`) on the peer listener, which hands each
//! message to the Raft loop, whether it came on a peer's stream or in a
//! unary call (older members) (none from a member the cluster removed,
//! which is told so: `removal.rs`). A snapshot comes on a stream of its
//! own, its data in chunks, reassembled by `snapshot_recv.rs`. The sending
//! side is `peers.rs`.

use crate::cluster::log::input::Input;
use crate::cluster::log::queue::{Sender, TrySendError};
use crate::cluster::node::lease_forward;
use crate::cluster::node::raft_node::Node;
use crate::cluster::replicated::removal;
use crate::cluster::transport::snapshot_recv::{self, Bounds, Gate};
use crate::proto::ephd::internal::{
    raft_transport_server::RaftTransport, RaftAck, RaftBatch, SnapshotFrame,
};
use crate::proto::etcdserverpb as pb;
use futures::Stream;
use protobuf::Message as _;
use raft::prelude::Message;
use std::pin::Pin;
use std::sync::Arc;
use tonic::{Request, Response, Status, Streaming};

/// The receiving side, served on the peer listener: hands each message to
/// the Raft loop, and answers what followers forward to the leader.
#[derive(Clone)]
pub struct PeerService {
    id: u64,
    inbox: Sender<Input>,
    node: Arc<Node>,
    /// One chunked snapshot received at a time.
    snapshots: Arc<Gate>,
}

impl PeerService {
    /// The service for `node`.
    pub fn new(node: &Arc<Node>) -> Self {
        PeerService {
            id: node.id(),
            inbox: node.inbox(),
            node: node.clone(),
            snapshots: Arc::default(),
        }
    }

    /// Whether this member serves framed lanes.
    pub(in crate::cluster) fn framed_lanes(&self) -> bool {
        self.node.peer_settings().framed_lanes
    }
}

impl PeerService {
    /// Hands a batch's messages to the Raft loop; refuses the batch of a
    /// removed member, and a message that does not parse.
    pub(in crate::cluster) fn take(&self, batch: RaftBatch) -> Result<(), Status> {
        let traffic = self.node.peer_metrics().incoming(batch.from);
        let bytes = batch.messages.iter().map(|m| m.len()).sum();
        traffic.bytes(crate::cluster::transport::peer_metrics::batch_bytes(
            &batch, bytes,
        ));
        // A removed member is told so, and its messages are not taken.
        let sender = removal::check_sender(&self.node.members().current.read(), batch.from);
        let parsed = batch.messages.iter().try_for_each(|bytes| {
            // Shares the batch's buffer: a snapshot's data is not copied.
            let m = Message::parse_from_carllerche_bytes(bytes)
                .map_err(|e| Status::invalid_argument(format!("not a raft message: {e}")))?;
            if self.admit(&m, sender.is_err()) {
                self.node.queue(Input::Step(Box::new(m)));
            }
            Ok(())
        });
        // What was queued before a message that does not parse is taken.
        self.node.run_loop();
        if parsed.is_err() {
            traffic.failed(1);
        }
        parsed.and(sender)
    }

    /// Whether `m` goes to the Raft loop (its sender noted); `refused`:
    /// the member that sent it was removed.
    fn admit(&self, m: &Message, refused: bool) -> bool {
        if m.get_to() != self.id {
            // Meant for another member (a misconfigured peer URL).
            return false;
        }
        // A removed member (or one of a cluster forced anew) never takes
        // part again: its votes and appends are dropped, as etcd
        // rejects its streams; only a removed leader's hand-over is taken.
        let removed = refused || self.node.members().current.read().is_removed(m.get_from());
        if removed && !removal::taken_from_removed(m) {
            return false;
        }
        self.node.seen.record(m);
        true
    }

    /// A chunked snapshot's header, before its data is read: refused as
    /// [`PeerService::take`] refuses a batch (a removed sender is told
    /// so), and also when the message would not be taken, since its
    /// answer tells the sender the snapshot was delivered.
    fn admit_snapshot(&self, h: &snapshot_recv::Header) -> Result<(), Status> {
        removal::check_sender(&self.node.members().current.read(), h.from)?;
        if self.admit(&h.message, false) {
            Ok(())
        } else {
            Err(Status::failed_precondition(format!(
                "snapshot stream: a snapshot from member {:x} to member {:x} is not taken by member {:x}",
                h.message.get_from(),
                h.message.get_to(),
                self.id
            )))
        }
    }
}

/// The answers on a peer's stream: an ack per batch that asks for one;
/// ends with the refusal of a batch (a removed sender, a message that does
/// not parse) or when the sender ends the stream.
type Acks = Pin<Box<dyn Stream<Item = Result<RaftAck, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl RaftTransport for PeerService {
    async fn send(&self, req: Request<RaftBatch>) -> Result<Response<RaftAck>, Status> {
        self.take(req.into_inner())
            .map(|()| Response::new(RaftAck { ack: 0 }))
    }

    async fn send_snapshot(
        &self,
        req: Request<Streaming<SnapshotFrame>>,
    ) -> Result<Response<RaftAck>, Status> {
        let mut frames = req.into_inner();
        let bounds = Bounds::up_to(self.node.peer_settings().snapshot_receive_limit);
        // The sender, once the header names it.
        let mut from = None;
        let received = snapshot_recv::receive(&mut frames, &self.snapshots, bounds, |h| {
            from = Some(h.from);
            self.admit_snapshot(h)
        })
        .await;
        let metrics = self.node.peer_metrics();
        let received = received.inspect_err(|e| {
            tracing::warn!(error = %e, "raft snapshot stream refused");
            if let Some(from) = from {
                metrics.incoming(from).failed(1);
            }
        })?;
        let size = received.message.get_snapshot().get_data().len();
        metrics.incoming(received.from).bytes(size);
        tracing::info!(
            from = %format_args!("{:x}", received.from),
            bytes = size,
            chunks = received.chunks,
            "raft snapshot received"
        );
        // Not dropped when the Raft loop's inbox is full, as a batch's
        // messages are: this one may have taken minutes to arrive.
        let step = Input::Step(Box::new(received.message));
        if let Err(TrySendError::Full(step)) = self.inbox.try_send(step) {
            let inbox = self.inbox.clone();
            let _ = tokio::task::spawn_blocking(move || {
                let _ = inbox.send(step);
            })
            .await;
        }
        Ok(Response::new(RaftAck { ack: 0 }))
    }

    type StreamStream = Acks;

    async fn stream(&self, req: Request<Streaming<RaftBatch>>) -> Result<Response<Acks>, Status> {
        // Read as the answers are polled: no task of its own per stream.
        let state = Some((req.into_inner(), self.clone()));
        let acks = futures::stream::unfold(state, |state| async move {
            let (mut batches, service) = state?;
            loop {
                match batches.message().await {
                    Ok(Some(batch)) => {
                        let ack = batch.ack;
                        if let Err(refused) = service.take(batch) {
                            return Some((Err(refused), None));
                        }
                        if ack != 0 {
                            return Some((Ok(RaftAck { ack }), Some((batches, service))));
                        }
                    }
                    // The sender ended the stream, or the connection broke
                    // (which etcd does not count as a receive failure).
                    Ok(None) | Err(_) => return None,
                }
            }
        });
        Ok(Response::new(Box::pin(acks)))
    }

    async fn lease_keep_alive(
        &self,
        req: Request<pb::LeaseKeepAliveRequest>,
    ) -> Result<Response<pb::LeaseKeepAliveResponse>, Status> {
        lease_forward::serve_keep_alive(&self.node, req.into_inner().id)
            .await
            .map(Response::new)
    }

    async fn lease_time_to_live(
        &self,
        req: Request<pb::LeaseTimeToLiveRequest>,
    ) -> Result<Response<pb::LeaseTimeToLiveResponse>, Status> {
        lease_forward::serve_time_to_live(&self.node, req.into_inner())
            .await
            .map(Response::new)
    }
}

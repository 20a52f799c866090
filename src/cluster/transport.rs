//! Raft messages from the other members: a small gRPC service
//! (`ephd.internal.RaftTransport`) on the peer listener, which hands each
//! message to the Raft thread (none from a member the cluster removed,
//! which is told so: `removal.rs`). The sending side is `peers.rs`.

use super::input::Input;
use super::lease_forward;
use super::node::Node;
use super::removal;
use crate::proto::ephd::internal::{raft_transport_server::RaftTransport, RaftAck, RaftBatch};
use crate::proto::etcdserverpb as pb;
use crossbeam_channel::Sender;
use protobuf::Message as _;
use raft::prelude::Message;
use std::sync::Arc;
use tonic::{Request, Response, Status};

/// The receiving side, served on the peer listener: hands each message to
/// the Raft thread, and answers what followers forward to the leader.
pub struct PeerService {
    id: u64,
    inbox: Sender<Input>,
    node: Arc<Node>,
}

impl PeerService {
    /// The service for `node`.
    pub fn new(node: &Arc<Node>) -> Self {
        PeerService {
            id: node.id(),
            inbox: node.inbox(),
            node: node.clone(),
        }
    }
}

#[tonic::async_trait]
impl RaftTransport for PeerService {
    async fn send(&self, req: Request<RaftBatch>) -> Result<Response<RaftAck>, Status> {
        let batch = req.into_inner();
        // A removed member is told so, and its messages are not taken.
        let sender = removal::check_sender(&self.node.members().current.read(), batch.from);
        for bytes in batch.messages {
            // Shares the batch's buffer: a snapshot's data is not copied.
            let m = Message::parse_from_carllerche_bytes(&bytes)
                .map_err(|e| Status::invalid_argument(format!("not a raft message: {e}")))?;
            if m.get_to() != self.id {
                // Meant for another member (a misconfigured peer URL).
                continue;
            }
            // A removed member (or one of a cluster forced anew) never takes
            // part again: its votes and appends are dropped, as etcd
            // rejects its streams; only a removed leader's hand-over is taken.
            let removed =
                sender.is_err() || self.node.members().current.read().is_removed(m.get_from());
            if removed && !removal::taken_from_removed(&m) {
                continue;
            }
            self.node.seen.record(&m);
            // Full: dropped, Raft retries.
            let _ = self.inbox.try_send(Input::Step(Box::new(m)));
        }
        sender.map(|()| Response::new(RaftAck {}))
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

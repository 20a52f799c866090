//! Raft messages from the other members: a small gRPC service
//! (`ephd.internal.RaftTransport`) on the peer listener, which hands each
//! message to the Raft thread. The sending side is `peers.rs`.

use super::node::{Input, Node};
use crate::proto::ephd::internal::{raft_transport_server::RaftTransport, RaftAck, RaftBatch};
use crossbeam_channel::Sender;
use protobuf::Message as _;
use raft::prelude::Message;
use tonic::{Request, Response, Status};

/// The receiving side, served on the peer listener: hands each message to
/// the Raft thread.
pub struct PeerService {
    id: u64,
    inbox: Sender<Input>,
}

impl PeerService {
    /// The service for `node`.
    pub fn new(node: &Node) -> Self {
        PeerService {
            id: node.id(),
            inbox: node.inbox(),
        }
    }
}

#[tonic::async_trait]
impl RaftTransport for PeerService {
    async fn send(&self, req: Request<RaftBatch>) -> Result<Response<RaftAck>, Status> {
        for bytes in req.into_inner().messages {
            let m = Message::parse_from_bytes(&bytes)
                .map_err(|e| Status::invalid_argument(format!("not a raft message: {e}")))?;
            if m.get_to() != self.id {
                // Meant for another member (a misconfigured peer URL).
                continue;
            }
            // Full: dropped, Raft retries.
            let _ = self.inbox.try_send(Input::Step(Box::new(m)));
        }
        Ok(Response::new(RaftAck {}))
    }
}

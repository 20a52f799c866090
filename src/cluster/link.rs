//! A lane's connection to its peer (`sender.rs`): a framed lane
//! (`frames.rs`) when the peer serves them, its gRPC stream
//! (`peer_stream.rs`) otherwise, and when a lane tries a framed lane again
//! after a peer did not offer one.

use super::frames::{self, FramedLink};
use super::peer_stream::Link;
use crate::proto::ephd::internal::RaftBatch;
use std::time::{Duration, Instant};
use tonic::Status;

/// A lane's open connection: framed, or a gRPC stream.
pub(super) enum AnyLink {
    /// A framed lane.
    Framed(FramedLink),
    /// A stream of the peer's gRPC service.
    Grpc(Link),
}

impl AnyLink {
    /// Hands `batch` to the connection within `limit`, asking for an ack
    /// when it is time; false when it could not.
    pub(super) async fn send(&mut self, batch: RaftBatch, limit: Duration) -> bool {
        match self {
            AnyLink::Framed(l) => l.send(batch, limit).await,
            AnyLink::Grpc(l) => l.send(batch, limit).await,
        }
    }

    /// Whether the awaited ack is later than `limit`.
    pub(super) fn overdue(&self, limit: Duration) -> bool {
        match self {
            AnyLink::Framed(l) => l.overdue(limit),
            AnyLink::Grpc(l) => l.overdue(limit),
        }
    }
}

/// The next answer on `link`; never, without one (for a `select!`).
pub(super) async fn answer(link: &mut Option<AnyLink>) -> Result<(), Status> {
    match link {
        Some(AnyLink::Framed(l)) => l.answer().await,
        Some(AnyLink::Grpc(l)) => l.answer().await,
        None => std::future::pending().await,
    }
}

/// Whether a lane opens framed lanes: unless they are turned off, or the
/// peer lately did not offer them (then its gRPC stream for a while).
pub(super) struct Framed {
    enabled: bool,
    grpc_until: Option<Instant>,
}

impl Framed {
    pub(super) fn new() -> Framed {
        Framed {
            enabled: frames::enabled(),
            grpc_until: None,
        }
    }

    /// Whether the next connection tries a framed lane.
    pub(super) fn try_now(&self) -> bool {
        self.enabled && self.grpc_until.is_none_or(|t| Instant::now() >= t)
    }

    /// The peer did not offer framed lanes: gRPC for a while.
    pub(super) fn fall_back(&mut self, peer: &str) {
        if self.grpc_until.is_none() {
            tracing::info!(peer = %peer, "the peer serves no framed raft lanes (an older member?); using its gRPC stream");
        }
        self.grpc_until = Some(Instant::now() + frames::GRPC_FALLBACK);
    }
}

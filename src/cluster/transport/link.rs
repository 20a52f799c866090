//! A lane's connection to its peer (`sender.rs`): a framed lane
//! (`frames.rs`) when the peer serves them, its gRPC stream
//! (`peer_stream.rs`) otherwise, and when a lane tries a framed lane again
//! after a peer did not offer one.

use crate::cluster::transport::frames::{self, FramedLink};
use crate::cluster::transport::peer_stream::Link;
use crate::proto::ephd::internal::RaftBatch;
use std::time::{Duration, Instant};
use tonic::Status;

/// A lane's open connection: framed, or a gRPC stream.
pub(in crate::cluster) enum AnyLink {
    /// A framed lane.
    Framed(FramedLink),
    /// A stream of the peer's gRPC service.
    Grpc(Link),
}

impl AnyLink {
    /// Hands `batch` to the connection within `limit`, asking for an ack
    /// when it is time; false when it could not.
    pub(in crate::cluster) async fn send(&mut self, batch: RaftBatch, limit: Duration) -> bool {
        match self {
            AnyLink::Framed(l) => l.send(batch, limit).await,
            AnyLink::Grpc(l) => l.send(batch, limit).await,
        }
    }

    /// Whether the awaited ack is later than `limit`.
    pub(in crate::cluster) fn overdue(&self, limit: Duration) -> bool {
        match self {
            AnyLink::Framed(l) => l.overdue(limit),
            AnyLink::Grpc(l) => l.overdue(limit),
        }
    }
}

/// The next answer on `link`; never, without one (for a `select!`).
pub(in crate::cluster) async fn answer(link: &mut Option<AnyLink>) -> Result<(), Status> {
    match link {
        Some(AnyLink::Framed(l)) => l.answer().await,
        Some(AnyLink::Grpc(l)) => l.answer().await,
        None => std::future::pending().await,
    }
}

/// Whether a lane opens framed lanes: unless they are turned off, or the
/// peer lately did not offer them (then its gRPC stream for a while).
pub(in crate::cluster) struct Framed {
    enabled: bool,
    grpc_until: Option<Instant>,
}

impl Framed {
    pub(in crate::cluster) fn new(enabled: bool) -> Framed {
        Framed {
            enabled,
            grpc_until: None,
        }
    }

    /// Whether the next connection tries a framed lane.
    pub(in crate::cluster) fn try_now(&self) -> bool {
        self.try_at(Instant::now())
    }

    fn try_at(&self, now: Instant) -> bool {
        self.enabled && self.grpc_until.is_none_or(|t| now >= t)
    }

    /// The peer did not offer framed lanes: gRPC for a while.
    pub(in crate::cluster) fn fall_back(&mut self, peer: &str) {
        self.fall_back_at(peer, Instant::now());
    }

    fn fall_back_at(&mut self, peer: &str, now: Instant) {
        if self.grpc_until.is_none() {
            tracing::info!(peer = %peer, "the peer serves no framed raft lanes (an older member?); using its gRPC stream");
        }
        self.grpc_until = Some(now + frames::GRPC_FALLBACK);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer that did not offer framed lanes (an older member) gets its
    /// gRPC stream for [`frames::GRPC_FALLBACK`], then a framed lane is
    /// tried again (it may have been upgraded meanwhile); each further
    /// refusal starts the wait again. With framed lanes turned off, never.
    #[test]
    fn framed_lanes_are_tried_again_after_the_fallback_period() {
        let wait = frames::GRPC_FALLBACK;
        let t0 = Instant::now();
        let mut f = Framed {
            enabled: true,
            grpc_until: None,
        };
        assert!(f.try_at(t0), "framed first");
        f.fall_back_at("m2", t0);
        assert!(!f.try_at(t0), "gRPC right after a refusal");
        assert!(!f.try_at(t0 + wait - Duration::from_millis(1)));
        assert!(f.try_at(t0 + wait), "framed again once the period is over");
        let t1 = t0 + wait;
        f.fall_back_at("m2", t1);
        assert!(!f.try_at(t1 + wait / 2), "a second refusal waits again");
        assert!(f.try_at(t1 + wait));
        let off = Framed {
            enabled: false,
            grpc_until: None,
        };
        assert!(!off.try_at(t0 + 10 * wait), "turned off: never framed");
    }
}

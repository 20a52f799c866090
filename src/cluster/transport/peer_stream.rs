//! The stream a lane (`sender.rs`) sends its Raft messages to a peer on
//! (`RaftTransport.Stream`): every batch but snapshots.
//!
//! Why a stream: a unary call per batch costs both members a new HTTP/2
//! stream (request and response headers, trailers, a task on the receiver,
//! a trip through the channel's buffer task) for every batch, and with one
//! call in flight per peer a batch also waits for the previous answer. On
//! one long-lived stream a batch is one DATA frame, sent as soon as it is
//! built.
//!
//! What the unary answer told the sender is kept: the receiver answers the
//! batches that ask for it (a [`RaftAck`] with the batch's number). A
//! busy stream asks every [`ACK_INTERVAL`], an idle peer's probe always
//! asks, and one ack is awaited at a time; an ack that has not come within
//! the send timeout, a batch that cannot be handed to the stream within it,
//! or the stream ending means the peer does not answer: the stream is
//! dropped and the next batch opens a new one. A receiver that refuses the
//! sender (it was removed) ends the stream with that status.

use crate::cluster::transport::peer_metrics::Outgoing;
use crate::proto::ephd::internal::{
    raft_transport_client::RaftTransportClient, RaftAck, RaftBatch,
};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tonic::transport::Channel;
use tonic::{Status, Streaming};

/// How often a busy stream asks the peer to confirm it still answers.
pub(in crate::cluster) const ACK_INTERVAL: Duration = Duration::from_millis(100);
/// Batches handed to the stream and not yet written, at most: a few, so
/// that while the connection is backed up messages gather in the peer's
/// queue into larger batches instead of queueing here.
pub(in crate::cluster) const HANDED: usize = 4;

/// An open stream to a peer.
pub(in crate::cluster) struct Link {
    tx: mpsc::Sender<RaftBatch>,
    answers: Streaming<RaftAck>,
    acks: Acks,
}

impl Link {
    /// Opens a stream on `client`, whose acks' round trips go to `timed`
    /// when set. An older member that serves only the unary call answers
    /// `Unimplemented`.
    pub(in crate::cluster) async fn open(
        client: &mut RaftTransportClient<Channel>,
        timed: Option<Arc<Outgoing>>,
    ) -> Result<Link, Status> {
        let (tx, rx) = mpsc::channel(HANDED);
        let answer = client
            .stream(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await?;
        Ok(Link {
            tx,
            answers: answer.into_inner(),
            acks: Acks::new(timed),
        })
    }

    /// Hands `batch` to the stream, asking for an ack when it is time
    /// (see [`AckClock::ask`]); false when it could not be handed within
    /// `limit` (the connection is stuck) or the stream is gone.
    pub(in crate::cluster) async fn send(&mut self, mut batch: RaftBatch, limit: Duration) -> bool {
        self.acks.stamp(&mut batch);
        matches!(
            tokio::time::timeout(limit, self.tx.send(batch)).await,
            Ok(Ok(()))
        )
    }

    /// Whether the awaited ack is later than `limit`.
    pub(in crate::cluster) fn overdue(&self, limit: Duration) -> bool {
        self.acks.overdue(limit)
    }

    /// The peer's next answer: `Ok` for an ack, the status the stream
    /// ended with otherwise.
    pub(in crate::cluster) async fn answer(&mut self) -> Result<(), Status> {
        match self.answers.message().await {
            Ok(Some(ack)) => {
                self.acks.answered(ack.ack);
                Ok(())
            }
            Ok(None) => Err(Status::unavailable("the peer ended the stream")),
            Err(e) => Err(e),
        }
    }
}

/// The acks a link (a gRPC stream, or a framed lane) asks for and awaits,
/// and where their round trips go.
pub(in crate::cluster) struct Acks {
    clock: AckClock,
    /// Where the acks' round trips go (the control lane's link).
    timed: Option<Arc<Outgoing>>,
}

impl Acks {
    /// No ack asked yet; round trips go to `timed` when set.
    pub(in crate::cluster) fn new(timed: Option<Arc<Outgoing>>) -> Acks {
        Acks {
            clock: AckClock::default(),
            timed,
        }
    }

    /// Sets the ack `batch` asks for, now (0: none; see [`AckClock::ask`]).
    pub(in crate::cluster) fn stamp(&mut self, batch: &mut RaftBatch) {
        batch.ack = self.clock.ask(Instant::now(), batch.messages.is_empty());
    }

    /// Ack `n` came: its round trip is recorded if it was the awaited one.
    pub(in crate::cluster) fn answered(&mut self, n: u64) {
        if let (Some(at), Some(t)) = (self.clock.answered(n), &self.timed) {
            t.round_trip(at.elapsed());
        }
    }

    /// Whether the awaited ack is later than `limit`.
    pub(in crate::cluster) fn overdue(&self, limit: Duration) -> bool {
        self.clock.overdue(Instant::now(), limit)
    }
}

/// When a stream asks for acks, and which one it awaits: one at a time,
/// at most every [`ACK_INTERVAL`] while busy, and on every probe (an empty
/// batch, sent when the peer's queue was idle), so an idle peer is checked
/// as often as before streams.
#[derive(Debug, Default)]
pub(in crate::cluster) struct AckClock {
    /// The number of the last ack asked for.
    last: u64,
    /// The ack awaited, and when it was asked for.
    waiting: Option<(u64, Instant)>,
    /// When the last ack was asked for.
    asked: Option<Instant>,
}

impl AckClock {
    /// The `ack` number a batch sent at `now` carries (0: none asked).
    pub(in crate::cluster) fn ask(&mut self, now: Instant, probe: bool) -> u64 {
        let due = self
            .asked
            .is_none_or(|at| now.saturating_duration_since(at) >= ACK_INTERVAL);
        if self.waiting.is_some() || !(probe || due) {
            return 0;
        }
        self.last += 1;
        self.waiting = Some((self.last, now));
        self.asked = Some(now);
        self.last
    }

    /// Ack `n` came: when it was asked for, if it was the awaited one.
    pub(in crate::cluster) fn answered(&mut self, n: u64) -> Option<Instant> {
        match self.waiting {
            Some((w, at)) if w == n => {
                self.waiting = None;
                Some(at)
            }
            _ => None,
        }
    }

    /// Whether the awaited ack, asked for before `now`, is later than
    /// `limit`.
    pub(in crate::cluster) fn overdue(&self, now: Instant, limit: Duration) -> bool {
        self.waiting
            .is_some_and(|(_, at)| now.saturating_duration_since(at) > limit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_batch_asks_then_one_ack_at_a_time() {
        let t0 = Instant::now();
        let mut c = AckClock::default();
        assert_eq!(c.ask(t0, false), 1);
        // Awaiting 1: neither a busy batch nor a probe asks again.
        assert_eq!(c.ask(t0 + ACK_INTERVAL * 3, false), 0);
        assert_eq!(c.ask(t0 + ACK_INTERVAL * 3, true), 0);
        // An ack of another number does not count.
        assert_eq!(c.answered(7), None);
        assert_eq!(c.ask(t0 + ACK_INTERVAL * 3, false), 0);
        // The awaited one gives when it was asked for: its round trip.
        assert_eq!(c.answered(1), Some(t0));
        assert_eq!(c.answered(1), None, "answered once");
        assert_eq!(c.ask(t0 + ACK_INTERVAL * 3, false), 2);
    }

    #[test]
    fn a_busy_stream_asks_every_interval_and_a_probe_always() {
        let t0 = Instant::now();
        let mut c = AckClock::default();
        assert_eq!(c.ask(t0, false), 1);
        c.answered(1);
        let soon = t0 + ACK_INTERVAL / 2;
        assert_eq!(c.ask(soon, false), 0, "too soon after the last ask");
        assert_eq!(c.ask(soon, true), 2, "a probe asks anyway");
        c.answered(2);
        assert_eq!(c.ask(soon + ACK_INTERVAL, false), 3);
    }

    #[test]
    fn an_ack_is_overdue_only_past_the_limit_and_only_while_awaited() {
        let t0 = Instant::now();
        let limit = Duration::from_secs(5);
        let mut c = AckClock::default();
        assert!(!c.overdue(t0 + limit * 2, limit), "nothing awaited");
        c.ask(t0, false);
        assert!(!c.overdue(t0 + limit, limit));
        assert!(c.overdue(t0 + limit + Duration::from_millis(1), limit));
        c.answered(1);
        assert!(!c.overdue(t0 + limit * 2, limit));
    }
}

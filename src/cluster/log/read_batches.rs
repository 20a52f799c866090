//! Linearizable reads share ReadIndex rounds, as etcd's read loop batches
//! them: every read a Raft round takes becomes one ReadIndex request
//! (one heartbeat to every follower on the leader, one message to the
//! leader on a follower) instead of one per read.
//!
//! A batch is sent after each of its reads was asked, so the index its
//! answer carries (the leader's commit index, confirmed by a quorum) is at
//! least as new as anything committed before any of them began: serving
//! each at that index is linearizable. The same holds for every batch sent
//! before it, so an answer also serves the older batches still waiting
//! (a leader that changed, or dropped a request, never answers those).

use std::collections::VecDeque;

/// Batches kept waiting for an answer at most; older ones are dropped,
/// and their reads ask again after their attempt times out.
const WAITING_BATCHES: usize = 4096;

/// The reads of this round, and the batches sent and not answered yet.
#[derive(Default)]
pub(in crate::cluster) struct ReadBatches {
    asked: Vec<u64>,
    /// Oldest first: the ReadIndex context sent (the batch's first read),
    /// and every read of the batch.
    sent: VecDeque<(u64, Vec<u64>)>,
}

impl ReadBatches {
    /// A read numbered `read` waits for a read index.
    pub(in crate::cluster) fn ask(&mut self, read: u64) {
        self.asked.push(read);
    }

    /// The context of one ReadIndex request for every read asked since the
    /// last call (None: none was).
    pub(in crate::cluster) fn send(&mut self) -> Option<u64> {
        let first = *self.asked.first()?;
        self.sent
            .push_back((first, std::mem::take(&mut self.asked)));
        if self.sent.len() > WAITING_BATCHES {
            self.sent.pop_front();
        }
        Some(first)
    }

    /// Raft answered the request with context `ctx`: the reads it serves
    /// (its own and those of every batch sent before it). Nothing for a
    /// context no waiting batch sent.
    pub(in crate::cluster) fn answered(&mut self, ctx: u64) -> Vec<u64> {
        let Some(at) = self.sent.iter().position(|(sent, _)| *sent == ctx) else {
            return Vec::new();
        };
        self.sent
            .drain(..=at)
            .flat_map(|(_, reads)| reads)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reads_of_a_round_share_one_request() {
        let mut batches = ReadBatches::default();
        assert_eq!(batches.send(), None, "nothing asked, nothing sent");
        for read in [7, 8, 9] {
            batches.ask(read);
        }
        assert_eq!(batches.send(), Some(7));
        assert_eq!(batches.send(), None, "each read is sent once");
        assert_eq!(batches.answered(7), vec![7, 8, 9]);
        assert!(batches.answered(7).is_empty(), "answered once");
    }

    #[test]
    fn an_answer_also_serves_every_batch_sent_before_it() {
        let mut batches = ReadBatches::default();
        batches.ask(1);
        batches.send();
        batches.ask(2);
        batches.ask(3);
        batches.send();
        batches.ask(4);
        batches.send();
        assert_eq!(batches.answered(2), vec![1, 2, 3]);
        assert!(
            batches.answered(1).is_empty(),
            "a stale answer serves nothing"
        );
        assert_eq!(batches.answered(4), vec![4]);
    }

    #[test]
    fn unknown_contexts_serve_nothing_and_waiting_batches_are_bounded() {
        let mut batches = ReadBatches::default();
        assert!(batches.answered(99).is_empty());
        for read in 0..(WAITING_BATCHES as u64 + 10) {
            batches.ask(read);
            batches.send();
        }
        assert!(
            batches.answered(0).is_empty(),
            "the oldest batches were dropped"
        );
        assert_eq!(batches.answered(10), vec![10]);
        assert_eq!(batches.sent.len(), WAITING_BATCHES - 1);
    }
}

//! The Raft state other threads read: the leader, the term, the commit
//! and applied indexes, whether this member leads and since when, and the
//! log's counters. The Raft and apply threads publish it (`raft_node.rs`);
//! Status, the expiry task, `hasleader` and tests read it.

use crate::cluster::log::catchup::LogCounters;
use crate::error::Error;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// The Raft state other threads may read (for Status, the expiry task and
/// tests), published by the Raft and apply threads.
#[derive(Debug, Default)]
pub struct RaftStatus {
    pub(in crate::cluster) leader: AtomicU64,
    pub(in crate::cluster) term: AtomicU64,
    pub(in crate::cluster) committed: AtomicU64,
    pub(in crate::cluster) applied: AtomicU64,
    pub(in crate::cluster) is_leader: AtomicBool,
    /// When this member last became leader (etcd's `leadElectedTime`), for
    /// telling why a proposal timed out.
    pub(in crate::cluster) leader_elected: parking_lot::Mutex<Option<std::time::Instant>>,
    /// New leaders this member has seen (etcd's
    /// `etcd_server_leader_changes_seen_total`).
    pub(in crate::cluster) leader_changes: AtomicU64,
    pub(in crate::cluster) log: Arc<LogCounters>,
    /// Woken when this member comes to know a new leader, for requests
    /// that wait for one (etcd holds a proposal until its member knows a
    /// leader, rather than failing it during an election) or fail when one
    /// comes (etcd's linearizable reads in flight).
    pub(in crate::cluster) new_leader: tokio::sync::Notify,
    /// Set once the Raft loop has ended (a stop, or a panic in a round):
    /// no leader will come, so nobody should wait for one.
    pub(in crate::cluster) stopped: AtomicBool,
    /// Proposals the Raft loop holds because it knows no leader (never
    /// handed to raft yet). Touched only while there are such, never on
    /// the common path.
    pub(in crate::cluster) held: parking_lot::Mutex<std::collections::HashSet<u64>>,
    /// While this member knows no leader because an election that should
    /// end soon is under way (see [`ElectionUnderway`]): when it stops
    /// being expected to end.
    pub(in crate::cluster) election_ends_by: parking_lot::Mutex<Option<std::time::Instant>>,
}

/// What tells a short election from a leaderless member: a member that
/// campaigns with its peers' pre-votes (or at a leader transfer's bidding),
/// or a follower whose term moved past the last leader's because a peer
/// campaigns, expects a leader within a round trip or two. A member that
/// stepped down for want of a quorum, or that asks for pre-votes nobody
/// grants, does not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::cluster) enum ElectionUnderway {
    /// A leader is known.
    Led,
    /// Campaigning past the pre-vote, or following a peer's campaign.
    Electing,
    /// No leader, and none in sight.
    Leaderless,
}

impl ElectionUnderway {
    /// Classifies Raft's state: `led_term` is the term of the last leader
    /// this member knew.
    pub(in crate::cluster) fn of(
        leader: u64,
        role: raft::StateRole,
        term: u64,
        led_term: u64,
    ) -> Self {
        use raft::StateRole::*;
        match (leader, role) {
            (l, _) if l != 0 => Self::Led,
            (_, Candidate) => Self::Electing,
            (_, Follower) if term > led_term => Self::Electing,
            _ => Self::Leaderless,
        }
    }
}

impl RaftStatus {
    /// The leader this member knows of, if any.
    pub fn leader(&self) -> Option<u64> {
        Some(self.leader.load(Ordering::Relaxed)).filter(|l| *l != 0)
    }

    /// Waits until this member knows a leader: `timed_out` when none comes
    /// before `deadline`, `etcdserver: server stopped` once the Raft loop
    /// has ended.
    pub(in crate::cluster) async fn wait_for_leader(
        &self,
        deadline: tokio::time::Instant,
        timed_out: Error,
    ) -> Result<(), Error> {
        // Every write and linearizable read passes here: with a leader
        // known, no waiter is registered.
        if self.stopped.load(Ordering::Relaxed) {
            return Err(Error::Stopped);
        }
        if self.leader().is_some() {
            return Ok(());
        }
        let known = async {
            loop {
                let found = self.new_leader.notified();
                tokio::pin!(found);
                // Registered before the check, so a leader published
                // between the check and the wait still wakes it.
                found.as_mut().enable();
                if self.stopped.load(Ordering::Relaxed) {
                    return Err(Error::Stopped);
                }
                if self.leader().is_some() {
                    return Ok(());
                }
                found.await;
            }
        };
        tokio::time::timeout_at(deadline, known)
            .await
            .unwrap_or(Err(timed_out))
    }

    /// Marks the Raft loop ended and wakes whoever waits for a leader.
    pub(in crate::cluster) fn stop(&self) {
        self.stopped.store(true, Ordering::Relaxed);
        self.new_leader.notify_waiters();
    }

    /// Completes once this member has seen a new leader since
    /// [`RaftStatus::leader_changes`] was `changes`.
    pub(in crate::cluster) async fn new_leader_since(&self, changes: u64) {
        loop {
            let found = self.new_leader.notified();
            tokio::pin!(found);
            found.as_mut().enable();
            if self.leader_changes() != changes {
                return;
            }
            found.await;
        }
    }

    /// Publishes the leader this member knows (0 for none), counting and
    /// announcing a new one; returns the one it knew before.
    pub(in crate::cluster) fn set_leader(&self, leader: u64) -> u64 {
        let before = self.leader.swap(leader, Ordering::Relaxed);
        if leader != 0 && leader != before {
            self.leader_changes.fetch_add(1, Ordering::Relaxed);
            self.new_leader.notify_waiters();
        }
        before
    }

    /// Records whether an election is under way: the window opens when one
    /// starts and lasts `window`, however many rounds report it (the Raft
    /// loop reports changes only).
    pub(in crate::cluster) fn set_election(
        &self,
        state: ElectionUnderway,
        now: std::time::Instant,
        window: std::time::Duration,
    ) {
        let mut ends = self.election_ends_by.lock();
        *ends = match state {
            ElectionUnderway::Electing => Some(ends.unwrap_or(now + window)),
            _ => None,
        };
    }

    /// When an election under way should have ended, if one is.
    pub fn election_ends_by(&self) -> Option<std::time::Instant> {
        *self.election_ends_by.lock()
    }

    /// Whether this member is the leader.
    pub fn is_leader(&self) -> bool {
        self.is_leader.load(Ordering::Relaxed)
    }

    /// The current term.
    pub fn term(&self) -> u64 {
        self.term.load(Ordering::Relaxed)
    }

    /// The highest log index known committed.
    pub fn committed(&self) -> u64 {
        self.committed.load(Ordering::Relaxed)
    }

    /// The highest log index applied to the store.
    pub fn applied(&self) -> u64 {
        self.applied.load(Ordering::Relaxed)
    }

    /// How many times this member has seen a new leader (the first
    /// election included).
    pub fn leader_changes(&self) -> u64 {
        self.leader_changes.load(Ordering::Relaxed)
    }

    /// The in-memory log's bounds and snapshot counters.
    pub fn log(&self) -> &LogCounters {
        &self.log
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::time::{timeout, Instant};

    #[test]
    fn only_an_election_with_votes_in_sight_is_under_way() {
        use raft::StateRole::*;
        use ElectionUnderway as E;
        assert_eq!(E::of(7, Follower, 3, 3), E::Led);
        assert_eq!(E::of(0, Candidate, 4, 3), E::Electing);
        assert_eq!(E::of(0, Follower, 4, 3), E::Electing, "a peer campaigns");
        assert_eq!(E::of(0, Follower, 3, 3), E::Leaderless, "stepped down");
        assert_eq!(E::of(0, PreCandidate, 3, 3), E::Leaderless);
    }

    #[test]
    fn the_election_window_opens_once_and_closes_with_a_leader() {
        let status = RaftStatus::default();
        let t0 = std::time::Instant::now();
        let second = Duration::from_secs(1);
        status.set_election(ElectionUnderway::Electing, t0, second);
        status.set_election(ElectionUnderway::Electing, t0 + second / 2, second);
        assert_eq!(
            status.election_ends_by(),
            Some(t0 + second),
            "not pushed back"
        );
        status.set_election(ElectionUnderway::Led, t0 + second / 2, second);
        assert_eq!(status.election_ends_by(), None);
        status.set_election(ElectionUnderway::Electing, t0, second);
        status.set_election(ElectionUnderway::Leaderless, t0, second);
        assert_eq!(status.election_ends_by(), None);
    }

    #[tokio::test]
    async fn waiting_for_a_leader_ends_when_one_is_published_or_at_the_deadline() {
        let status = Arc::new(RaftStatus::default());
        let soon = Instant::now() + Duration::from_millis(50);
        let waited = status.wait_for_leader(soon, Error::Timeout).await;
        assert_eq!(waited, Err(Error::Timeout), "no leader yet");

        let publisher = status.clone();
        let publish = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            publisher.set_leader(0);
            publisher.set_leader(7);
        });
        let later = Instant::now() + Duration::from_secs(10);
        assert_eq!(status.wait_for_leader(later, Error::Timeout).await, Ok(()));
        publish.await.unwrap();
        let now = Instant::now();
        assert_eq!(status.wait_for_leader(now, Error::Timeout).await, Ok(()));
    }

    #[tokio::test]
    async fn waiting_for_a_leader_ends_when_the_raft_loop_stops() {
        let status = Arc::new(RaftStatus::default());
        let stopper = status.clone();
        let stop = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            stopper.stop();
        });
        let later = Instant::now() + Duration::from_secs(10);
        let waited = status.wait_for_leader(later, Error::Timeout).await;
        assert_eq!(waited, Err(Error::Stopped));
        stop.await.unwrap();
        let waited = status.wait_for_leader(later, Error::Timeout).await;
        assert_eq!(waited, Err(Error::Stopped), "stopped stays stopped");
    }

    #[tokio::test]
    async fn a_new_leader_is_seen_but_losing_one_or_the_same_again_is_not() {
        let status = RaftStatus::default();
        assert_eq!(status.set_leader(7), 0);
        let changes = status.leader_changes();
        assert_eq!(changes, 1);
        let quick = Duration::from_millis(30);
        assert_eq!(status.set_leader(7), 7);
        assert_eq!(status.set_leader(0), 7);
        assert!(timeout(quick, status.new_leader_since(changes))
            .await
            .is_err());
        // Back to the same leader after none: counted, as etcd counts it.
        status.set_leader(7);
        assert!(timeout(quick, status.new_leader_since(changes))
            .await
            .is_ok());
        let changes = status.leader_changes();
        status.set_leader(9);
        assert!(timeout(quick, status.new_leader_since(changes))
            .await
            .is_ok());
        assert_eq!(status.leader_changes(), 3);
    }
}

//! The Raft state other threads read: the leader, the term, the commit
//! and applied indexes, whether this member leads and since when, and the
//! log's counters. The Raft and apply threads publish it (`node.rs`);
//! Status, the expiry task, `hasleader` and tests read it.

use super::catchup::LogCounters;
use crate::error::Error;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// The Raft state other threads may read (for Status, the expiry task and
/// tests), published by the Raft and apply threads.
#[derive(Debug, Default)]
pub struct RaftStatus {
    pub(super) leader: AtomicU64,
    pub(super) term: AtomicU64,
    pub(super) committed: AtomicU64,
    pub(super) applied: AtomicU64,
    pub(super) is_leader: AtomicBool,
    /// When this member last became leader (etcd's `leadElectedTime`), for
    /// telling why a proposal timed out.
    pub(super) leader_elected: parking_lot::Mutex<Option<std::time::Instant>>,
    /// New leaders this member has seen (etcd's
    /// `etcd_server_leader_changes_seen_total`).
    pub(super) leader_changes: AtomicU64,
    pub(super) log: Arc<LogCounters>,
    /// Woken when this member comes to know a new leader, for requests
    /// that wait for one (etcd holds a proposal until its member knows a
    /// leader, rather than failing it during an election) or fail when one
    /// comes (etcd's linearizable reads in flight).
    pub(super) new_leader: tokio::sync::Notify,
    /// Set once the Raft loop has ended (a stop, or a panic in a round):
    /// no leader will come, so nobody should wait for one.
    pub(super) stopped: AtomicBool,
    /// Proposals the Raft loop holds because it knows no leader (never
    /// handed to raft yet). Touched only while there are such, never on
    /// the common path.
    pub(super) held: parking_lot::Mutex<std::collections::HashSet<u64>>,
}

impl RaftStatus {
    /// The leader this member knows of, if any.
    pub fn leader(&self) -> Option<u64> {
        Some(self.leader.load(Ordering::Relaxed)).filter(|l| *l != 0)
    }

    /// Waits until this member knows a leader: `timed_out` when none comes
    /// before `deadline`, `etcdserver: server stopped` once the Raft loop
    /// has ended.
    pub(super) async fn wait_for_leader(
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
    pub(super) fn stop(&self) {
        self.stopped.store(true, Ordering::Relaxed);
        self.new_leader.notify_waiters();
    }

    /// Completes once this member has seen a new leader since
    /// [`RaftStatus::leader_changes`] was `changes`.
    pub(super) async fn new_leader_since(&self, changes: u64) {
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
    pub(super) fn set_leader(&self, leader: u64) -> u64 {
        let before = self.leader.swap(leader, Ordering::Relaxed);
        if leader != 0 && leader != before {
            self.leader_changes.fetch_add(1, Ordering::Relaxed);
            self.new_leader.notify_waiters();
        }
        before
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

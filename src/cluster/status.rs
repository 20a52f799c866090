//! The Raft state other threads read: the leader, the term, the commit
//! and applied indexes, whether this member leads and since when, and the
//! log's counters. The Raft and apply threads publish it (`node.rs`);
//! Status, the expiry task, `hasleader` and tests read it.

use super::catchup::LogCounters;
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
}

impl RaftStatus {
    /// The leader this member knows of, if any.
    pub fn leader(&self) -> Option<u64> {
        Some(self.leader.load(Ordering::Relaxed)).filter(|l| *l != 0)
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

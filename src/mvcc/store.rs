//! The store itself: the parts every operation shares, and the rules for
//! who may touch them when.
//!
//! # Concurrency
//! * The index (`index.rs`) holds every key twice: in an ordered B-tree for
//!   ranges (its lock is taken briefly, only to create a key or to copy a
//!   chunk of a range walk) and in a sharded hash table for point lookups;
//!   each key owns a small lock around its version history.
//! * Writers that touch only single keys (every Kubernetes write) hold the
//!   range-writer lock shared plus the locks of their keys, in key order, so
//!   writers of different keys run in parallel (`locks.rs`). Writers that
//!   touch ranges (range deletes, range compares, range reads inside write
//!   txns), compaction batches and shutdown hold it exclusively.
//! * A revision is allocated only once a write is known to change something,
//!   while its keys are locked; the sequencer (`sequencer.rs`) publishes
//!   revisions strictly in order. Its watermark is what readers call
//!   "current": a reader at revision N sees all of 1..N and nothing of N+1.
//! * Readers never take the range-writer lock; they read each key's history
//!   under its lock and pick the newest version at or below their revision
//!   (`view.rs`). A compaction gate (read-mostly lock) keeps a read from
//!   racing the moment the compacted revision moves.
//!
//! The operations live beside this file, one concern each: `apply.rs` (the
//! one write path), `write.rs` (how a write changes histories), `read.rs`,
//! `compact.rs`, `leases.rs` (every lease rule) and `restore.rs`.

use super::alarms::Alarms;
use super::index::Index;
use super::log::EventLog;
use super::page_counts::PageCounts;
use super::sequencer::Sequencer;
use super::stats::Stats;
use crate::auth::AuthStore;
use crate::error::{Error, Result};
use crate::lease::{Lessor, LessorConfig};
use parking_lot::RwLock;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

/// Store settings.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// Most compares, or ops per branch, a txn may have (`--max-txn-ops`).
    pub max_txn_ops: usize,
    /// Revision the store starts at (etcd starts at 1), chosen by the
    /// caller. Higher values keep revisions monotonic across restarts;
    /// everything below reads as compacted.
    pub initial_revision: i64,
    /// Lease settings.
    pub lessor: LessorConfig,
    /// The space quota (`--quota-backend-bytes`): a write that takes space
    /// and would bring [`Stats::backend_bytes`] (etcd's measure) to it
    /// fails with "database space exceeded" and raises the NOSPACE alarm.
    /// Checked before a write is applied or proposed (`quota.rs`), never
    /// inside the apply path. `None`: no quota.
    pub quota_bytes: Option<i64>,
    /// The memory bound of the stored data: the same refusal when a write
    /// would bring [`Stats::memory_bytes`] above it. `None`: no bound.
    pub memory_bound_bytes: Option<i64>,
    /// The member ID a NOSPACE alarm raised by the quota is recorded under.
    pub member_id: u64,
    /// Auth settings (token TTL, bcrypt cost).
    pub auth: crate::auth::AuthConfig,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            max_txn_ops: 128,
            initial_revision: 1,
            lessor: LessorConfig::default(),
            quota_bytes: None,
            memory_bound_bytes: None,
            member_id: 0,
            auth: crate::auth::AuthConfig::default(),
        }
    }
}

/// The multi-version store; see the module docs for the design.
pub struct Store {
    index: Index,
    sequencer: Sequencer,
    range_writers: RwLock<()>,
    compaction_gate: RwLock<()>,
    journal_cut: RwLock<()>,
    compacted: AtomicI64,
    stopped: AtomicBool,
    lessor: Lessor,
    alarms: Alarms,
    auth: AuthStore,
    stats: Stats,
    limits: super::limits::LimitsCell,
    page_counts: PageCounts,
    config: StoreConfig,
}

impl Store {
    /// An empty store at `config.initial_revision`. When that is above 1,
    /// every revision below it reads as compacted, as after etcd's
    /// `snapshot restore --bump-revision --mark-compacted`.
    pub fn new(config: StoreConfig) -> Self {
        let start = config.initial_revision.max(1);
        let compacted = if start > 1 { start } else { -1 };
        Store {
            index: Index::default(),
            sequencer: Sequencer::new(start),
            range_writers: RwLock::new(()),
            compaction_gate: RwLock::new(()),
            journal_cut: RwLock::new(()),
            compacted: AtomicI64::new(compacted),
            stopped: AtomicBool::new(false),
            lessor: Lessor::new(config.lessor.clone()),
            alarms: Alarms::default(),
            auth: AuthStore::new(config.auth.clone()),
            stats: Stats::default(),
            limits: super::limits::LimitsCell::new(super::Limits {
                max_txn_ops: config.max_txn_ops,
                quota_bytes: config.quota_bytes,
                adopt_unknown_ttl: config.lessor.adopt_unknown_ttl,
            }),
            page_counts: PageCounts::default(),
            config,
        }
    }

    /// The latest committed revision: every revision up to it is visible.
    pub fn current_revision(&self) -> i64 {
        self.sequencer.committed()
    }

    /// The compacted revision (reads below it fail); -1 if never compacted.
    pub fn compacted_revision(&self) -> i64 {
        self.compacted.load(Ordering::Acquire)
    }

    /// The change log watchers read.
    pub fn log(&self) -> &EventLog {
        self.sequencer.log()
    }

    /// Users, roles, permissions and tokens: changed only through
    /// [`Store::apply`], like the keys.
    pub fn auth(&self) -> &AuthStore {
        &self.auth
    }

    /// Size and apply counters.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    pub(super) fn limits_cell(&self) -> &super::limits::LimitsCell {
        &self.limits
    }

    /// The settings in force.
    pub fn config(&self) -> &StoreConfig {
        &self.config
    }

    /// Refuses every later write with "etcdserver: server stopped". Waits for
    /// writes in flight (they hold the range-writer lock shared), so once
    /// this returns the store's contents are final: what shutdown snapshots.
    pub fn stop_writes(&self) {
        let _all = self.range_writers.write();
        self.stopped.store(true, Ordering::Release);
    }

    // ------------------------------------------- for the operations' files

    pub(super) fn index(&self) -> &Index {
        &self.index
    }

    /// The counts the next pages of recent paged lists have left.
    pub(super) fn page_counts(&self) -> &PageCounts {
        &self.page_counts
    }

    pub(super) fn sequencer(&self) -> &Sequencer {
        &self.sequencer
    }

    pub(super) fn lessor(&self) -> &Lessor {
        &self.lessor
    }

    pub(super) fn alarm_table(&self) -> &Alarms {
        &self.alarms
    }

    /// Single-key writers hold it shared, range writers exclusively.
    pub(super) fn range_writers(&self) -> &RwLock<()> {
        &self.range_writers
    }

    /// Reads hold it shared; moving the compacted revision holds it
    /// exclusively.
    pub(super) fn compaction_gate(&self) -> &RwLock<()> {
        &self.compaction_gate
    }

    /// With a journal: keyed writes hold it shared from their first check
    /// until their revision is handed over, every other change exclusively
    /// (`journal.rs`). Without one nobody takes it.
    pub(super) fn journal_cut(&self) -> &RwLock<()> {
        &self.journal_cut
    }

    /// Moves the compacted revision; only with the compaction gate held
    /// exclusively.
    pub(super) fn set_compacted(&self, rev: i64) {
        self.compacted.store(rev, Ordering::Release);
    }

    /// Fails once [`Store::stop_writes`] has run; checked with the
    /// range-writer lock held.
    pub(super) fn check_running(&self) -> Result<()> {
        if self.stopped.load(Ordering::Acquire) {
            Err(Error::Stopped)
        } else {
            Ok(())
        }
    }

    /// Resolves a requested read revision (0 = current) against `current`
    /// and the compacted revision, in etcd's order of checks.
    pub(super) fn check_read_revision(&self, requested: i64, current: i64) -> Result<i64> {
        if requested > current {
            return Err(Error::FutureRev);
        }
        let rev = if requested <= 0 { current } else { requested };
        if rev < self.compacted_revision() {
            return Err(Error::Compacted);
        }
        Ok(rev)
    }
}

//! The write-ahead journal's hook into the store: every change, in the
//! order a replay must apply it, handed to a [`Journal`] before it is
//! acknowledged; and [`Store::replay`], which applies a journal's records
//! to a restored store through the apply path.
//!
//! # Order
//! Writes to different keys apply in parallel, so the journal cannot take
//! changes in call order. It takes them in the order a serial replay
//! reproduces:
//! * A change that took a revision (a put, delete, txn, a lease revoke that
//!   deleted keys) is handed over by the sequencer in revision order, with
//!   the request that made it ([`Change::Write`]; a revoke as its entry).
//!   A write that failed mid-apply leaves its revision empty
//!   ([`Change::Empty`]), so the revisions after it still replay as theirs.
//! * A change without a revision (a lease grant, a revoke of a lease with
//!   no keys, a compaction, an alarm, an auth change) runs while no write is
//!   in flight (the journal cut, held exclusively) and is handed over right
//!   after it applied: after every revision below it, before every one
//!   above. Writers hold the cut shared from their first check to their
//!   revision's hand-over, so a write that checked a lease, an alarm or a
//!   permission replays after the change it saw and before the ones it did
//!   not.
//!
//! # Durability before visibility
//! With a journal, the sequencer publishes a revision (readers and
//! watchers see it, its writer answers) only once the journal reports it
//! durable ([`Store::journal_durable`]). So nothing a client or watcher
//! saw is missing from the journal after a crash, and a change without a
//! revision is answered only once its record is durable.

use super::entry::Entry;
use super::store::Store;
use super::types::TxnRequest;
use std::sync::Arc;

/// A change as the journal records it.
#[derive(Debug, Clone, Copy)]
pub enum Change<'a> {
    /// The write txn that took the revision (a unary put or delete as its
    /// one-op txn), replayed as it ran: after the request's checks.
    Write(&'a TxnRequest),
    /// An entry replayed through the apply path.
    Entry(&'a Entry),
    /// A revision that holds no change.
    Empty,
}

/// A record read back from a journal, to replay.
#[derive(Debug)]
pub enum Replayed {
    /// See [`Change::Write`].
    Write(TxnRequest),
    /// See [`Change::Entry`].
    Entry(Entry),
    /// See [`Change::Empty`].
    Empty,
}

/// Where changes go before they are acknowledged; implemented by the
/// write-ahead log (`crate::wal`).
pub trait Journal: Send + Sync {
    /// The bytes of a change's record; called outside every store lock.
    fn encode(&self, change: Change<'_>) -> Vec<u8>;
    /// Appends an encoded record of a change that took `revision` (None:
    /// no revision), in the order described in the module docs. Returns
    /// its position: positions grow by one per record.
    fn append(&self, revision: Option<i64>, record: Vec<u8>) -> u64;
    /// The newest position appended.
    fn appended(&self) -> u64;
    /// The newest position that is durable (in the file, and synced in the
    /// modes that sync).
    fn durable(&self) -> u64;
    /// Wakes whenever [`Journal::durable`] moves.
    fn subscribe(&self) -> tokio::sync::watch::Receiver<u64>;
}

/// Why a replay stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayError(pub String);

impl std::fmt::Display for ReplayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Whether an entry is a write that takes its revision under the shared
/// cut (see the module docs); every other entry runs under the exclusive
/// one.
pub(super) fn is_keyed_write(entry: &Entry) -> bool {
    match entry {
        Entry::Put(_) | Entry::Delete(_) | Entry::Txn(_) => true,
        Entry::Authorized { entry, .. } => is_keyed_write(entry),
        _ => false,
    }
}

/// Whether an entry can change anything at all (an alarm listing cannot).
pub(super) fn changes_state(entry: &Entry) -> bool {
    match entry {
        Entry::Alarm { action, .. } => *action != super::types::AlarmAction::Get,
        Entry::Authorized { entry, .. } => changes_state(entry),
        _ => true,
    }
}

impl Store {
    /// Hands every later change to `journal` before it is acknowledged, and
    /// publishes revisions only once it reports them durable. Called once,
    /// before the store serves (every revision so far is published and none
    /// is in flight). The journal calls [`Store::journal_durable`] as its
    /// records become durable.
    pub fn attach_journal(&self, journal: Arc<dyn Journal>) {
        let _cut = self.journal_cut().write();
        self.sequencer().attach(journal);
    }

    /// The attached journal's report that every record up to one that took
    /// `revision` is durable: the revisions up to it become visible.
    pub fn journal_durable(&self, revision: i64) {
        self.sequencer().release(revision);
    }

    /// Applies one record of a journal to a store restored to the state the
    /// journal's records start from. A record that took a revision must
    /// take exactly that revision again; a record without one must take
    /// none. Records whose entry fails replay the same failure as when they
    /// ran, so they change nothing; that is not an error. Called before the
    /// store serves, with no journal attached.
    pub fn replay(
        &self,
        revision: Option<i64>,
        record: Replayed,
    ) -> std::result::Result<(), ReplayError> {
        let before = self.sequencer().allocated();
        // An initial-revision entry jumps ahead before its revision.
        let jumps = matches!(record, Replayed::Entry(Entry::Initialize { .. }));
        if let (Some(rev), false) = (revision, jumps) {
            if rev != before + 1 {
                return Err(ReplayError(format!(
                    "a record of revision {rev} follows revision {before}"
                )));
            }
        }
        let outcome = match record {
            Replayed::Write(req) => self.write_txn(&req, None).map(|_| ()),
            Replayed::Entry(entry) => self.apply_unpublished(entry).map(|_| ()),
            Replayed::Empty => {
                self.sequencer().next().finish(Vec::new(), None);
                Ok(())
            }
        };
        let after = self.sequencer().allocated();
        self.sequencer().wait_visible(after);
        self.arm_new_leases();
        match (revision, outcome) {
            (Some(rev), _) if after != rev => Err(ReplayError(format!(
                "the record of revision {rev} replayed to revision {after}"
            ))),
            (None, _) if after != before => Err(ReplayError(format!(
                "a record without a revision took revision {after}"
            ))),
            _ => Ok(()),
        }
    }

    /// A consistent cut of the store for a snapshot that a journal's
    /// replay continues: with writes held off for a moment (and every
    /// record so far durable), the revision, the leases and the auth state
    /// are read together with the newest journal position; the keys are
    /// then read at that revision with the compaction gate held, while
    /// writes go on.
    pub fn snapshot_cut(&self) -> SnapshotCut {
        let cut = self.journal_cut().write();
        let journal = self.sequencer().journal();
        self.sequencer().wait_visible(self.sequencer().allocated());
        let position = journal.as_ref().map(|j| j.appended());
        let _gate = self.compaction_gate().read();
        let revision = self.current_revision();
        let leases = self.leases_for_snapshot();
        let auth = self.auth().image(false);
        drop(cut);
        let kvs = self.visible_kvs(revision);
        SnapshotCut {
            position,
            revision,
            kvs,
            leases,
            auth,
        }
    }
}

/// The state a snapshot writes, captured at one point of the journal.
pub struct SnapshotCut {
    /// The newest journal record the state includes (None: no journal).
    pub position: Option<u64>,
    /// The revision of the state.
    pub revision: i64,
    /// Every live key-value at it, in key order.
    pub kvs: Vec<super::types::Kv>,
    /// Every lease with its remaining time.
    pub leases: Vec<crate::lease::LeaseInfo>,
    /// Users, roles and the enabled flag.
    pub auth: crate::auth::AuthImage,
}

//! The write-ahead journal's hook into the store: every change, in the
//! order a replay must apply it, handed to a [`Journal`] before it is
//! acknowledged; and [`Store::replay`](super::Store::replay), which applies a journal's records
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
//! durable ([`Store::journal_durable`](super::Store::journal_durable)). So nothing a client or watcher
//! saw is missing from the journal after a crash, and a change without a
//! revision is answered only once its record is durable.

use super::entry::Entry;
use super::types::TxnRequest;

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

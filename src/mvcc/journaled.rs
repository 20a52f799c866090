//! The store's side of its journal (`journal.rs`): attaching one,
//! publishing what it made durable, replaying its records at start, and
//! the consistent cut a snapshot that the replay continues is taken at.

use super::entry::Entry;
use super::journal::{Journal, ReplayError, Replayed};
use super::store::Store;
use std::sync::Arc;

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

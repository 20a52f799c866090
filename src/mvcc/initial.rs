//! The initial-revision entry of a cluster ([`Entry::Initialize`]): the
//! store jumps to a revision its first leader chose, everything below
//! reading as compacted, as a single member starts above every revision an
//! earlier run issued (`server/revisions.rs`).
//!
//! [`Entry::Initialize`]: super::Entry::Initialize

use super::store::Store;
use crate::error::Result;

/// The key kube-apiserver's compactor coordinates through; created with
/// the initial revision, as a single member creates it at start.
pub const COMPACT_REV_KEY: &str = "compact_rev_key";

impl Store {
    /// Moves a store that resumed saved state (cluster mode's
    /// `--force-new-cluster` with `--data-dir`) up to `revision`, as
    /// `Store::bump_to` does; nothing when it is already there.
    pub fn resume_above(&self, revision: i64) -> Result<()> {
        self.bump_to(revision)
    }

    /// Moves the store up to `revision` if it is below: revisions continue
    /// from there, and reads and watches below it answer "compacted" (the
    /// history below is dropped, as by a compaction at `revision`).
    pub(super) fn bump_to(&self, revision: i64) -> Result<()> {
        if self.current_revision() >= revision {
            return Ok(());
        }
        {
            let _writers = self.range_writers().write();
            let _gate = self.compaction_gate().write();
            self.check_running()?;
            self.sequencer().bump(revision);
            self.set_compacted(revision);
        }
        self.stats().applied();
        self.log().trim_below(revision);
        self.prune_history(revision);
        self.log().publish(revision);
        Ok(())
    }
}

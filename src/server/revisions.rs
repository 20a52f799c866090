//! The start revision, and the reservation that keeps the next one above
//! every revision this run issues.
//!
//! # Why revisions never go backwards (with `--revision-continuity`)
//! The start revision is the maximum of every source that bounds what an
//! earlier run may have issued:
//!
//! * the state file's `revisions-used-up-to` plus one. The running server
//!   writes it *ahead* of the store: at start, before serving, it records
//!   the start plus [`RESERVE_AHEAD`]; a task checking every second
//!   records a new bound `current + RESERVE_AHEAD` once the store is within
//!   half of it. The store would have to issue five million revisions
//!   within one check for the bound to be passed unrecorded (ephd does a
//!   few hundred thousand per second at most); if it ever is, an ERROR says
//!   so. This source does not depend on the clock, so a clock stepped back
//!   cannot make revisions go backwards when `--data-dir` is set;
//! * the newest snapshot's revision, and the revision named by any
//!   snapshot generation (damaged ones included), plus [`RESTORE_MARGIN`]
//!   for the writes after it: this covers data directories written before
//!   the state file existed, and a lost state file;
//! * the wall clock, [`REVISIONS_PER_MS`] revisions per millisecond: a
//!   previous run would have to average a million writes per second to get
//!   above it. Without `--data-dir` it is the only source, and its limit is
//!   stated in the README: a clock stepped back by more than the previous
//!   run's length lets revisions go backwards. There is nowhere to keep
//!   anything without a data directory.
//!
//! The wall clock is a parameter (`wall_ms`), read once at start by the
//! caller, so tests step it.

use crate::mvcc::{RangeRequest, Store};
use crate::persist::{self, RevisionState};
use bytes::Bytes;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// Revisions added to a snapshot's revision: covers writes made after the
/// last snapshot before a crash.
pub const RESTORE_MARGIN: i64 = 10_000_000;
/// Revisions per millisecond of wall clock in the clock-derived start.
pub const REVISIONS_PER_MS: i64 = 1_000;
/// How far ahead of the store the state file's bound is kept.
pub const RESERVE_AHEAD: i64 = 10_000_000;
/// How often the reservation (and `compact_rev_key`) is checked.
const GUARD_TICK: Duration = Duration::from_secs(1);
/// The key kube-apiserver's compactor coordinates through.
pub const COMPACT_REV_KEY: &str = "compact_rev_key";

/// What is known, at start, of the revisions earlier runs reached.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Known {
    /// The restored snapshot's revision.
    pub snapshot: Option<i64>,
    /// The highest revision any snapshot generation names, damaged or not
    /// (0 if none).
    pub named: i64,
    /// The state file's `revisions-used-up-to`.
    pub state: Option<i64>,
}

/// The revision a store starts at. Without continuity it is the restored
/// snapshot's revision (or 1), like etcd; with it, above everything in
/// `known` and above the wall-clock revision (see the module docs).
pub fn start_revision(continuity: bool, known: &Known, wall_ms: i64) -> i64 {
    let restored = known.snapshot.unwrap_or(0);
    if !continuity {
        return restored.max(1);
    }
    let by_clock = wall_ms.saturating_mul(REVISIONS_PER_MS);
    let by_snapshots = restored.max(known.named).saturating_add(RESTORE_MARGIN);
    let by_state = known.state.map_or(0, |s| s.saturating_add(1));
    by_clock.max(by_snapshots).max(by_state)
}

/// Whether the store holds kube-apiserver's compaction key.
pub fn has_compact_rev_key(store: &Store) -> bool {
    store
        .range(&RangeRequest {
            key: Bytes::from_static(COMPACT_REV_KEY.as_bytes()),
            count_only: true,
            ..Default::default()
        })
        .is_ok_and(|r| r.count > 0)
}

/// What one check of [`RevisionGuard::step`] found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Step {
    /// The state changed and should be written.
    pub write: bool,
    /// `compact_rev_key` just appeared in a run without continuity or
    /// data directory: warn.
    pub warn_compact_key: bool,
    /// The store passed the recorded bound before it was extended.
    pub overrun: Option<i64>,
}

/// Keeps the state file's bound ahead of the store and notices
/// `compact_rev_key`; driven by `guard_revisions`.
#[derive(Debug)]
pub struct RevisionGuard {
    /// The data directory, if any.
    pub dir: Option<PathBuf>,
    /// The state as last decided (written to `dir` if there is one).
    pub state: RevisionState,
    /// A write of `state` is still owed (the last one failed, or the state
    /// changed).
    pub dirty: bool,
}

impl RevisionGuard {
    /// Updates the state for the store at `current` with `compact_key`
    /// present or not.
    pub fn step(&mut self, current: i64, compact_key: bool) -> Step {
        let mut out = Step::default();
        if compact_key && !self.state.compact_rev_key {
            self.state.compact_rev_key = true;
            self.dirty = true;
            out.warn_compact_key = !self.state.continuity && self.dir.is_none();
        }
        if current > self.state.used_up_to {
            out.overrun = Some(self.state.used_up_to);
        }
        if current > self.state.used_up_to - RESERVE_AHEAD / 2 {
            self.state.used_up_to = current.saturating_add(RESERVE_AHEAD);
            self.dirty = true;
        }
        out.write = self.dirty && self.dir.is_some();
        out
    }

    /// Whether a task has anything to do: keep a state file, or watch for
    /// `compact_rev_key` to warn about it.
    pub fn needed(&self) -> bool {
        self.dir.is_some() || (!self.state.continuity && !self.state.compact_rev_key)
    }
}

/// Checks the reservation and `compact_rev_key` every [`GUARD_TICK`] until
/// shutdown.
pub(super) async fn guard_revisions(
    store: Arc<Store>,
    mut guard: RevisionGuard,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(GUARD_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = crate::api::stopped(&mut stop) => return,
        }
        if !guard.needed() {
            return;
        }
        let key = !guard.state.compact_rev_key && has_compact_rev_key(&store);
        let step = guard.step(store.current_revision(), key || guard.state.compact_rev_key);
        if step.warn_compact_key {
            tracing::warn!(
                key = COMPACT_REV_KEY,
                "kube-apiserver's compaction key was written, but this run has \
                 --revision-continuity=false and no --data-dir: a restart starts empty at \
                 revision 1 without the key, and every kube-apiserver's compactor then panics \
                 (it indexes the missing key) and revisions go backwards under its watch caches; \
                 run with --revision-continuity=true (the default) or with --data-dir"
            );
        }
        if let Some(bound) = step.overrun {
            tracing::error!(
                bound,
                current = store.current_revision(),
                "the store passed the revision bound recorded in the state file before it was \
                 extended; after a crash now, the next start may reuse revisions"
            );
        }
        if step.write {
            let (dir, state) = (guard.dir.clone().expect("write needs a dir"), guard.state);
            let written = tokio::task::spawn_blocking(move || {
                persist::state::write(&dir, &state, persist::wall_clock_ms()).map_err(|e| {
                    format!(
                        "cannot write {}: {e}",
                        dir.join(persist::STATE_FILE).display()
                    )
                })
            })
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r);
            match written {
                Ok(()) => guard.dirty = false,
                Err(e) => tracing::error!(error = %e, "revision state not saved; retrying"),
            }
        }
    }
}

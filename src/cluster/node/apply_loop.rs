//! Applying committed entries, in log order, and who does it.
//!
//! The Raft loop queues what it committed (`Work::Entries`), and snapshot
//! work (install, capture, save) comes the same way. The applier sits
//! behind one lock in [`ApplyCore`], and two kinds of thread take from
//! the queue, always while holding that lock, so the order is the log's:
//!
//! * the apply thread, woken for every kind of work (snapshots, large
//!   batches, and whatever is left over);
//! * a thread that just ran a Raft round on a hot path (a client's
//!   request task, a peer's lane reader, see `raft_loop.rs`): when the
//!   lock is free and the queued batches are small and light (no entry
//!   that may touch any number of keys, `entry_weight.rs`) it applies
//!   them itself ([`ApplyCore::combine`]) and leaves the rest to the
//!   apply thread.
//!
//! Why: below peak each put's batch travels mostly on its own, and handing
//! it to a parked apply thread cost a futex wake and a context switch on
//! every member, and then another to wake the request's task from outside
//! the runtime. On two cores shared by three members and a load tool each
//! such crossing waits for a core, and those waits are most of a put's
//! latency at half of peak (BENCHMARKS.md, "Applying where the round
//! ran"). A single member applies on the request's thread the same way.
//! Large batches (peak load, catch-up) and heavy entries (range deletes,
//! compactions, lease revokes) still go to the apply thread, so a request
//! task or a lane reader is never held for long, and the Raft thread never
//! applies: ticks and heartbeats do not wait for the store.
//!
//! A panic while applying stops applying for good, as it ended the apply
//! thread before: the queue closes and waiting requests time out.

use crate::cluster::log::catchup::{self, Work};
use crate::cluster::log::entry_weight;
use crate::cluster::log::initial_gate::InitialGate;
use crate::cluster::log::input::Input;
use crate::cluster::log::queue::{Bell, Receiver, Sender};
use crate::cluster::log::raft_status::RaftStatus;
use crate::cluster::log::waiters::Waiters;
use crate::cluster::member::applied_membership::{self, Members};
use crate::cluster::member::saved_state;
use crate::cluster::member::snapshot_sections;
use crate::entry_bytes as entry;
use crate::error::{Error, Result};
use crate::mvcc::{Applied, Store};
use bytes::Bytes;
use parking_lot::Mutex;
use raft::prelude::EntryType;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Entries in one batch that a round's thread applies itself at most.
const COMBINED_ENTRIES: usize = 64;
/// Bytes of entries in one batch that a round's thread applies itself at
/// most.
const COMBINED_BYTES: usize = 256 * 1024;
/// Batches one combining thread applies at most before it leaves the rest
/// to the apply thread.
const COMBINED_BATCHES: usize = 4;

/// The applier behind its lock, with the queue into it.
pub(in crate::cluster) struct ApplyCore {
    /// `None` once applying has stopped (a panic).
    state: Mutex<Option<Applying>>,
    /// Wakes the apply thread.
    bell: Bell<Work>,
}

/// What [`ApplyCore::combine`] does with the next queued work.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Next {
    Nothing,
    Apply,
    Leave,
}

struct Applying {
    applier: Applier,
    committed: Receiver<Work>,
}

impl ApplyCore {
    /// Puts `applier` and the receiving side of its queue behind the lock.
    pub(in crate::cluster) fn new(applier: Applier, committed: Receiver<Work>) -> Arc<ApplyCore> {
        Arc::new(ApplyCore {
            bell: committed.bell(),
            state: Mutex::new(Some(Applying { applier, committed })),
        })
    }

    /// On a thread that just ran a Raft round: applies the small batches of
    /// light entries queued ([`small`]), when nobody else is applying, and wakes the apply thread for
    /// anything else. When the lock is taken the holder finds the batches
    /// after it lets go (the apply thread looks at the queue before it
    /// parks; a combining holder looks again here).
    pub(in crate::cluster) fn combine(&self) {
        for _ in 0..COMBINED_BATCHES {
            let Some(mut guard) = self.state.try_lock() else {
                return;
            };
            let Some(a) = guard.as_mut() else {
                return;
            };
            let next = match a.committed.peek() {
                None => Next::Nothing,
                Some(Work::Entries(batch)) if small(batch) => Next::Apply,
                Some(_) => Next::Leave,
            };
            match next {
                Next::Apply => {
                    let Some(work) = a.committed.try_recv() else {
                        return;
                    };
                    if !apply_guarded(&mut guard, work) {
                        return;
                    }
                }
                Next::Nothing => {
                    drop(guard);
                    // Looked at after the unlock: work queued by a thread
                    // that found the lock taken is taken here or by it.
                    if !self.bell.has_queued() {
                        return;
                    }
                }
                Next::Leave => {
                    drop(guard);
                    // Taken into the receiver's own buffer, which the apply
                    // thread's wait does not look at: ring.
                    self.bell.ring();
                    return;
                }
            }
        }
        self.bell.ring();
    }

    /// After the Raft thread's rounds: wakes the apply thread for what
    /// they queued (the Raft thread never applies).
    pub(in crate::cluster) fn hand_off(&self) {
        if self.bell.has_queued() {
            self.bell.ring();
        }
    }

    /// The apply thread: applies whatever is queued whenever it is woken,
    /// until every sender is gone or applying has stopped.
    pub(in crate::cluster) fn run(self: Arc<ApplyCore>) {
        loop {
            let open = self
                .bell
                .wait_until(Instant::now() + Duration::from_secs(3600));
            let mut guard = self.state.lock();
            loop {
                let Some(work) = guard.as_mut().and_then(|a| a.committed.try_recv()) else {
                    break;
                };
                if !apply_guarded(&mut guard, work) {
                    return;
                }
            }
            if !open {
                // Every sender is gone (the Raft loop stopped) and what
                // they queued is applied: nothing more comes.
                *guard = None;
                return;
            }
            if guard.is_none() {
                return;
            }
        }
    }
}

/// Whether a batch is small enough for a round's thread to apply: a
/// bounded number of light entries (`entry_weight.rs`: none that may touch
/// any number of keys); membership changes go to the apply thread too,
/// whose sends to the Raft loop may wait.
pub(in crate::cluster) fn small(batch: &[raft::prelude::Entry]) -> bool {
    batch.len() <= COMBINED_ENTRIES
        && batch.iter().map(|e| e.get_data().len()).sum::<usize>() <= COMBINED_BYTES
        && batch.iter().all(|e| {
            e.get_entry_type() == EntryType::EntryNormal
                && (e.data.is_empty() || entry_weight::light(&e.data))
        })
}

/// Applies `work` with the lock held in `state`; a panic stops applying
/// (the queue closes) and answers false.
fn apply_guarded(state: &mut Option<Applying>, work: Work) -> bool {
    let Some(a) = state.as_mut() else {
        return false;
    };
    if catch_unwind(AssertUnwindSafe(|| a.applier.handle(work))).is_ok() {
        return true;
    }
    tracing::error!("applying stopped after a panic");
    *state = None;
    false
}

/// What applies committed entries: the store, and where results and the
/// applied index go.
pub(in crate::cluster) struct Applier {
    pub(in crate::cluster) id: u64,
    pub(in crate::cluster) store: Arc<Store>,
    pub(in crate::cluster) waiters: Arc<Waiters<Result<Applied>>>,
    pub(in crate::cluster) status: Arc<RaftStatus>,
    pub(in crate::cluster) applied: Arc<watch::Sender<u64>>,
    /// Where a captured snapshot goes once encoded.
    pub(in crate::cluster) inbox: Sender<Input>,
    /// The term of the last applied entry.
    pub(in crate::cluster) term: u64,
    pub(in crate::cluster) members: Arc<Members>,
    pub(in crate::cluster) gate: Arc<InitialGate>,
    /// Results of this member's proposals in the current batch.
    pub(in crate::cluster) answers: Vec<(u64, Result<Applied>)>,
}

impl Applier {
    fn handle(&mut self, work: Work) {
        let batch = match work {
            Work::Entries(batch) => batch,
            Work::Install(snap) => {
                let (index, sections) = catchup::install(
                    &self.store,
                    &snap,
                    self.status.log(),
                    snapshot_sections::decode,
                );
                snapshot_sections::install(
                    sections,
                    &self.store,
                    &self.members,
                    self.id,
                    &self.inbox,
                );
                self.gate.installed(&self.store);
                self.term = snap.get_metadata().term;
                self.status.applied.store(index, Ordering::Relaxed);
                self.applied.send_replace(index);
                return;
            }
            Work::Save(tx) => {
                let index = self.status.applied();
                drop(tx.send(saved_state::capture(
                    &self.store,
                    &self.members,
                    index,
                    self.term,
                )));
                return;
            }
            Work::Capture => {
                let index = self.status.applied();
                let sections = snapshot_sections::capture(&self.store, &self.members);
                catchup::capture(&self.store, sections, index, self.term, self.inbox.clone());
                return;
            }
        };
        for mut e in batch {
            if e.get_index() <= self.status.applied() {
                // Already in an installed snapshot.
                continue;
            }
            match e.get_entry_type() {
                EntryType::EntryNormal if !e.get_data().is_empty() => {
                    self.apply_one(e.get_index(), e.get_term(), e.take_data());
                }
                EntryType::EntryConfChange => {
                    applied_membership::apply_entry(
                        &self.members,
                        self.id,
                        &self.inbox,
                        e.get_data(),
                    );
                }
                // Empty entries (a new leader's first) change nothing;
                // ephd proposes no ConfChangeV2.
                _ => {}
            }
            self.term = e.get_term();
            self.status.applied.store(e.get_index(), Ordering::Relaxed);
        }
        self.applied.send_replace(self.status.applied());
        self.waiters.finish_all(&mut self.answers);
    }

    fn apply_one(&mut self, index: u64, term: u64, data: Bytes) {
        if let Some((proposer, proposal, result)) = apply_normal(&self.store, index, term, data) {
            self.gate.applied(&result);
            if proposer == self.id {
                self.answers.push((proposal, result));
            }
        }
    }
}

/// Applies the data of a committed normal entry at `index` in `term` to
/// `store`: every member, and a member replaying its log's committed
/// entries into a forced cluster (`force.rs`), the same way. Returns who
/// proposed it (member, proposal) and its result; None when the bytes do
/// not decode, which every member finds alike (the proposer times out).
pub(in crate::cluster) fn apply_normal(
    store: &Store,
    index: u64,
    term: u64,
    data: Bytes,
) -> Option<(u64, u64, Result<Applied>)> {
    match entry::decode(data) {
        Ok(p) => {
            // A term-checked entry (a lease revoke or checkpoint) that a
            // later term committed was proposed by a deposed leader: every
            // member sees the same terms, so every member refuses.
            let result = if p.term != 0 && p.term != term {
                Err(Error::LeaderChanged)
            } else {
                store.apply_replicated(p.entry)
            };
            Some((p.proposer, p.proposal, result))
        }
        Err(e) => {
            tracing::error!(index, error = %e, "raft entry skipped");
            None
        }
    }
}

//! The Raft loop: raft-rs' `RawNode` and the rounds that drive it, and
//! who runs those rounds.
//!
//! A round takes the queued inputs (peer messages, proposals, read
//! requests), ticks when a tick is due, and handles the `Ready` that
//! follows (messages to peers, entries into the in-memory log, committed
//! entries to the apply thread). The loop sits behind a lock in [`Core`],
//! and two kinds of thread run rounds:
//!
//! * the Raft thread, which wakes for every tick (so elections and
//!   heartbeats never depend on request handling) and for inputs nobody
//!   else takes;
//! * whoever queued an input on the hot paths (a client's proposal or
//!   read, a peer's messages): it queues quietly and then runs the round
//!   itself if the lock is free ([`Core::combine`]). When the lock is
//!   taken, the holder finds the input on its next look at the queue.
//!
//! Why: handing every input to the Raft thread cost a futex wake and a
//! context switch per crossing, about a quarter of all wake-ups of a
//! three-member cluster under load (`sched_wakeup` counts in
//! BENCHMARKS.md), and context switches were the largest single cost per
//! put on these machines. A round never waits for anything (queues to the
//! peers' senders and the apply thread are unbounded or refuse when full),
//! so running one on a tokio worker is as short as on the Raft thread.
//!
//! A panic in a round (raft-rs stops on a broken invariant) ends the loop
//! as it ended the Raft thread before: the loop is dropped, its inbox
//! closes, and proposals fail with `etcdserver: server stopped`.

use crate::cluster::log::catchup::{CatchUp, LogStore, Work};
use crate::cluster::log::input::Input;
use crate::cluster::log::queue::{Bell, Receiver, Sender, TrySendError};
use crate::cluster::log::raft_status::RaftStatus;
use crate::cluster::log::read_batches::ReadBatches;
use crate::cluster::log::waiters::Waiters;
use crate::cluster::member::applied_membership::{self, Members};
use crate::cluster::node::apply_loop::ApplyCore;
use crate::cluster::transport::peers::Peers;
use crate::error::{Error, Result};
use crate::mvcc::Applied;
use parking_lot::Mutex;
use raft::{RawNode, StateRole};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Inputs handled between two looks at the clock and at `Ready`.
const INPUTS_PER_ROUND: usize = 1024;
/// Proposed bytes taken in one round at most (the entries one batched
/// append carries, see `batch_append` in `raft_node.rs`), besides the last
/// proposal.
pub(in crate::cluster) const PROPOSED_BYTES_PER_ROUND: usize = 4 * 1024 * 1024;
/// Rounds one combining sender runs at most before it leaves the rest to
/// the Raft thread, so a request's task is not kept for long.
const COMBINED_ROUNDS: usize = 4;

/// What a round left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Round {
    /// Nothing taken that is not handled.
    Done,
    /// Inputs taken but not handled yet (the round's bound was reached).
    More,
    /// The loop stops (`Input::Stop`, or a panic).
    Stop,
}

/// The Raft loop behind its lock, and the queue into it.
pub(in crate::cluster) struct Core {
    raft: Mutex<Option<RaftLoop>>,
    inbox: Sender<Input>,
    /// Where committed entries are applied (`apply_loop.rs`).
    apply: Arc<ApplyCore>,
}

impl Core {
    /// Puts `raft` behind the lock; `inbox` is the sending side of its
    /// input queue, `apply` where its committed entries go.
    pub(in crate::cluster) fn new(
        raft: RaftLoop,
        inbox: Sender<Input>,
        apply: Arc<ApplyCore>,
    ) -> Arc<Core> {
        Arc::new(Core {
            raft: Mutex::new(Some(raft)),
            inbox,
            apply,
        })
    }

    /// The sending side of the loop's input queue, for inputs that wake
    /// the Raft thread (a plain send) rather than run a round here.
    pub(in crate::cluster) fn sender(&self) -> &Sender<Input> {
        &self.inbox
    }

    /// Queues `input` without waking the Raft thread, then runs rounds
    /// here while the lock is free (see the module docs). Fails with
    /// `TooManyRequests` when the queue holds its bound, `Stopped` when
    /// the loop has stopped.
    pub(in crate::cluster) fn deliver(&self, input: Input) -> Result<()> {
        self.queue(input)?;
        self.combine();
        Ok(())
    }

    /// Queues `input` without waking anyone; [`Core::combine`] takes it.
    /// Fails as [`Core::deliver`] does.
    pub(in crate::cluster) fn queue(&self, input: Input) -> Result<()> {
        match self.inbox.try_send_quiet(input) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => Err(Error::TooManyRequests),
            Err(TrySendError::Disconnected(_)) => Err(Error::Stopped),
        }
    }

    /// Runs rounds on this thread while the lock is free and inputs wait.
    /// Returns at once when another thread holds the lock: it looks at the
    /// queue again after its round. After `COMBINED_ROUNDS` the Raft
    /// thread is woken for the rest.
    pub(in crate::cluster) fn combine(&self) {
        for _ in 0..COMBINED_ROUNDS {
            let Some(mut raft) = self.raft.try_lock() else {
                return;
            };
            let round = run_round(&mut raft);
            drop(raft);
            // What the round committed is applied here when small and
            // nobody else is applying (`apply_loop.rs`).
            self.apply.combine();
            // Looked at after the unlock: an input queued by a sender
            // that found the lock taken is seen here or by that sender.
            if round == Round::Stop || (round == Round::Done && !self.inbox.has_queued()) {
                return;
            }
        }
        self.inbox.wake();
    }

    /// The Raft thread: a round at every tick and whenever it is woken for
    /// inputs, until the loop stops.
    pub(in crate::cluster) fn run(self: Arc<Core>, bell: Bell<Input>) {
        loop {
            let Some(next_tick) = self.raft.lock().as_ref().map(|r| r.next_tick) else {
                return;
            };
            if !bell.wait_until(next_tick) {
                // Every sender is gone.
                *self.raft.lock() = None;
                return;
            }
            let mut raft = self.raft.lock();
            let stop = loop {
                match run_round(&mut raft) {
                    Round::More => continue,
                    Round::Done => break false,
                    Round::Stop => break true,
                }
            };
            drop(raft);
            // The Raft thread never applies: it wakes the apply thread.
            self.apply.hand_off();
            if stop {
                return;
            }
        }
    }
}

/// One round of the loop in `slot`; a stop or a panic drops the loop.
fn run_round(slot: &mut Option<RaftLoop>) -> Round {
    let Some(raft) = slot.as_mut() else {
        return Round::Stop;
    };
    let round = match catch_unwind(AssertUnwindSafe(|| raft.round())) {
        Ok(round) => round,
        Err(_) => {
            tracing::error!("the raft loop stopped after a panic");
            Round::Stop
        }
    };
    if round == Round::Stop {
        if let Some(raft) = slot.take() {
            // Requests waiting for a leader answer `server stopped` now.
            raft.status.stop();
        }
    }
    round
}

/// How long an election with votes in sight is expected to take, in
/// heartbeat intervals (the interval is about a round trip between
/// members): a vote and its answer, then the winner's first append. A
/// `hasleader` call waits that long for its outcome (`leadership.rs`).
const ELECTION_WINDOW_HEARTBEATS: u32 = 2;

/// The Raft state and what a round needs: owned by [`Core`], used by one
/// thread at a time.
pub(in crate::cluster) struct RaftLoop {
    pub(in crate::cluster) raw: RawNode<LogStore>,
    pub(in crate::cluster) inputs: Receiver<Input>,
    pub(in crate::cluster) peers: Peers,
    pub(in crate::cluster) to_apply: Sender<Work>,
    pub(in crate::cluster) waiters: Arc<Waiters<Result<Applied>>>,
    pub(in crate::cluster) reads: Arc<Waiters<u64>>,
    /// The reads of this round, sent as one ReadIndex request.
    pub(in crate::cluster) read_batches: ReadBatches,
    pub(in crate::cluster) status: Arc<RaftStatus>,
    /// The heartbeat interval: one raft tick.
    pub(in crate::cluster) tick: Duration,
    /// When the next tick is due.
    pub(in crate::cluster) next_tick: Instant,
    pub(in crate::cluster) catchup: CatchUp,
    pub(in crate::cluster) members: Arc<Members>,
    /// Client proposals taken while no leader was known, with their
    /// numbers (see [`RaftLoop::propose`]).
    pub(in crate::cluster) held: Vec<(u64, Vec<u8>)>,
    /// The Raft log on disk (`--wal` with `--data-dir`): what the member
    /// appended and voted is written there before it says so.
    pub(in crate::cluster) log: Option<crate::wal::RaftLog>,
    /// The saved state's files, where a snapshot from the leader is
    /// written before the log records it.
    pub(in crate::cluster) files: Option<Arc<crate::cluster::member::saved_state::SavedFiles>>,
    /// The term of the last leader this member knew.
    pub(in crate::cluster) led_term: u64,
    /// What was last published of an election (`raft_status.rs`).
    pub(in crate::cluster) election: crate::cluster::log::raft_status::ElectionUnderway,
}

impl RaftLoop {
    /// One round: takes the inputs queued (up to `INPUTS_PER_ROUND`, or
    /// `PROPOSED_BYTES_PER_ROUND` of proposals), asks one read index for
    /// the reads among them (`read_batches.rs`), ticks when a tick is
    /// due, and handles the `Ready` that follows.
    fn round(&mut self) -> Round {
        let mut proposed = 0;
        for _ in 0..INPUTS_PER_ROUND {
            if proposed > PROPOSED_BYTES_PER_ROUND {
                break;
            }
            match self.inputs.try_recv() {
                Some(input) => {
                    proposed += input.proposed_bytes();
                    if !self.take(input) {
                        return Round::Stop;
                    }
                }
                None => break,
            }
        }
        if let Some(ctx) = self.read_batches.send() {
            self.raw.read_index(ctx.to_be_bytes().to_vec());
        }
        let now = Instant::now();
        if now >= self.next_tick {
            self.raw.tick();
            self.next_tick += self.tick;
            if self.next_tick < now {
                // The loop was held up for more than a tick: do not tick
                // in a burst to catch up.
                self.next_tick = now + self.tick;
            }
        }
        self.release_held();
        self.on_ready();
        for to in self.peers.take_undelivered() {
            self.catchup.delivered(&mut self.raw, to, false);
        }
        let applied = self.status.applied();
        self.catchup
            .after_round(&mut self.raw, applied, &self.to_apply);
        self.publish();
        if self.inputs.has_taken() {
            Round::More
        } else {
            Round::Done
        }
    }

    /// Takes one input; false to stop.
    fn take(&mut self, input: Input) -> bool {
        match input {
            Input::Step(m) => {
                // A message from an unknown or stale peer is dropped by raft.
                if let Err(e) = self.raw.step(*m) {
                    tracing::debug!(error = %e, "raft message dropped");
                }
            }
            Input::Propose { proposal, data } => self.propose(proposal, data),
            Input::ReadIndex { ctx } => self.read_batches.ask(ctx),
            Input::TransferLeader(to) => {
                crate::cluster::log::leader_transfer::start(&mut self.raw, to)
            }
            Input::LeaderGone(gone) => {
                let health = &self.members.health;
                crate::cluster::log::leader_transfer::leader_gone(&mut self.raw, gone, |id| {
                    health.active_since(id).is_some()
                })
            }
            Input::SnapshotBuilt { index, term, data } => {
                self.catchup.built(&self.raw, index, term, data)
            }
            Input::SnapshotStatus { to, ok } => self.catchup.delivered(&mut self.raw, to, ok),
            Input::Save(tx) => drop(self.to_apply.send(Work::Save(tx))),
            Input::Stop => return false,
            other => applied_membership::take(&mut self.raw, &mut self.peers, &self.members, other),
        }
        true
    }

    /// Proposes a client's entry. Without a known leader (an election is
    /// running) it is held until there is one, as etcd's Raft node takes
    /// no proposal then; a refusal with a leader (a leadership transfer
    /// under way) answers raft's `raft proposal dropped` at once, as etcd.
    fn propose(&mut self, proposal: u64, data: Vec<u8>) {
        if self.raw.raft.leader_id == 0 {
            self.status.held.lock().insert(proposal);
            self.held.push((proposal, data));
        } else if self.raw.propose(Vec::new(), data).is_err() {
            self.waiters.finish(proposal, Err(Error::ProposalDropped));
        }
    }

    /// Proposes the held proposals once a leader is known; forgets those
    /// whose request is gone (timed out, its client left), so a member
    /// without a leader for long holds nothing nobody waits for. The
    /// shared set of held numbers decides between this and a request that
    /// times out meanwhile (`Node::propose_by`): whoever takes a number
    /// out of it first, so a write answered as never proposed never is.
    fn release_held(&mut self) {
        if self.held.is_empty() {
            return;
        }
        let leader = self.raw.raft.leader_id != 0;
        let mut set = self.status.held.lock();
        let waiters = &self.waiters;
        self.held.retain(|(p, _)| {
            let keep = set.contains(p) && waiters.is_waiting(*p);
            if !keep || leader {
                set.remove(p);
            }
            keep
        });
        drop(set);
        if leader {
            for (proposal, data) in std::mem::take(&mut self.held) {
                self.propose(proposal, data);
            }
        }
    }

    /// Handles a `Ready` in raft-rs' order: messages a leader may send at
    /// once, committed entries, new entries into the log, the hard state,
    /// messages that had to wait for them, then the light ready.
    fn on_ready(&mut self) {
        if !self.raw.has_ready() {
            return;
        }
        let mut rd = self.raw.ready();
        self.peers.send_all(rd.take_messages());
        for rs in rd.take_read_states() {
            if let Ok(ctx) = <[u8; 8]>::try_from(rs.request_ctx.as_slice()) {
                let mut served: Vec<(u64, u64)> = (self.read_batches)
                    .answered(u64::from_be_bytes(ctx))
                    .into_iter()
                    .map(|read| (read, rs.index))
                    .collect();
                self.reads.finish_all(&mut served);
            }
        }
        if !rd.snapshot().is_empty() {
            let snap = rd.snapshot().clone();
            self.log_installed(&snap);
            self.catchup.received(&mut self.raw, snap, &self.to_apply);
        }
        self.apply(rd.take_committed_entries());
        if !rd.entries().is_empty() {
            if let Err(e) = self.raw.mut_store().wl().append(rd.entries()) {
                tracing::error!(error = %e, "cannot append to the raft log");
            }
        }
        if let Some(hs) = rd.hs() {
            self.raw.mut_store().wl().set_hardstate(hs.clone());
        }
        if let Some(log) = &mut self.log {
            // On disk before any message that says it is.
            log.append(rd.entries());
            if let Some(hs) = rd.hs() {
                log.hard_state(hs);
            }
            log.flush();
        }
        self.peers.send_all(rd.take_persisted_messages());
        let mut light = self.raw.advance(rd);
        if let Some(commit) = light.commit_index() {
            self.raw
                .mut_store()
                .wl()
                .mut_hard_state()
                .set_commit(commit);
        }
        self.peers.send_all(light.take_messages());
        self.apply(light.take_committed_entries());
        self.raw.advance_apply();
    }

    /// A snapshot from the leader replaces the log up to its index: its
    /// state is saved first, then the log says so (a restart finds the
    /// state the log continues; a crash in between leaves a log that
    /// does not continue the saved state, which is not used).
    fn log_installed(&mut self, snap: &raft::prelude::Snapshot) {
        let (Some(log), Some(files)) = (&mut self.log, &self.files) else {
            return;
        };
        let meta = snap.get_metadata();
        match files.write_encoded(meta.index, snap.get_data()) {
            Ok(_) => {}
            Err(e) => tracing::error!(
                index = meta.index,
                error = %e,
                "cannot save the snapshot from the leader; this member's raft log will not be \
                 used at its next start"
            ),
        }
        log.installed(meta);
    }

    /// Hands committed entries to the apply thread, in order.
    fn apply(&self, entries: Vec<raft::prelude::Entry>) {
        if let Some(last) = entries.last() {
            self.status
                .committed
                .store(last.get_index(), Ordering::Relaxed);
            // Quietly: whoever ran this round applies them or wakes the
            // apply thread after it (`Core::combine`, `Core::run`).
            let _ = self.to_apply.try_send_quiet(Work::Entries(entries));
        }
    }

    fn publish(&mut self) {
        let raft = &self.raw.raft;
        let before = self.status.set_leader(raft.leader_id);
        if raft.leader_id == raft.id && before != raft.id {
            *self.status.leader_elected.lock() = Some(std::time::Instant::now());
        }
        self.status.term.store(raft.term, Ordering::Relaxed);
        if raft.leader_id != 0 {
            self.led_term = raft.term;
        }
        let election = crate::cluster::log::raft_status::ElectionUnderway::of(
            raft.leader_id,
            raft.state,
            raft.term,
            self.led_term,
        );
        // Only a change is published: most rounds have the same leader.
        if election != self.election {
            self.election = election;
            let window = (self.tick * ELECTION_WINDOW_HEARTBEATS)
                .min(self.tick * raft.election_timeout() as u32);
            self.status
                .set_election(election, std::time::Instant::now(), window);
        }
        self.status
            .is_leader
            .store(raft.state == StateRole::Leader, Ordering::Relaxed);
    }
}

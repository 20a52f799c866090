//! The bounded Raft log and catch-up by snapshot.
//!
//! * Every `--snapshot-count` applied entries (default
//!   [`DEFAULT_SNAPSHOT_COUNT`], smaller than etcd's 100,000 because the log
//!   lives in memory) a member compacts its in-memory Raft log, keeping the
//!   last `--experimental-snapshot-catchup-entries` entries (etcd's 5,000)
//!   for followers that are a little behind. So the log holds at most
//!   about `count + keep` entries whatever any follower does: a dead or
//!   cut-off member cannot pin it.
//! * A follower further behind than the kept log needs a snapshot. Raft
//!   asks the storage ([`LogStore`]) for one; the first time, the storage
//!   answers "temporarily unavailable" and this module asks the apply
//!   thread to capture the store (a [`StoreImage`]: pointer copies, at the
//!   apply thread's applied index) and a thread of its own to encode it
//!   (`snapshot.rs`), so neither ticks nor applies wait for the encoding.
//!   Raft asks again on the follower's next heartbeat answer and then gets
//!   it. The newest encoded snapshot is kept for the next follower that
//!   needs one (one encoded copy at most), and dropped once the log has
//!   been compacted past it.
//! * The log is not compacted past what a live follower that is catching
//!   up still needs (a snapshot on its way, the ready snapshot, its matched
//!   index; bounded, see `compaction_target`), so a member that installs a
//!   snapshot under load goes on from the log rather than needing another.
//! * Snapshots are built on demand rather than every `--snapshot-count`
//!   entries (what etcd does, since it must persist them): compacting an
//!   in-memory log needs no snapshot, only the promise that one can be
//!   made at any index at or above the compaction point, and a healthy
//!   cluster then never spends time or memory on encoding.
//! * A follower installs a received snapshot on its apply thread, in log
//!   order, replacing its store's whole state in place
//!   ([`Store::install_image`]): readers wait for the swap, watchers keep
//!   their cursors and read on from the installed change log, which holds
//!   the very events they would have applied (a watcher below the
//!   snapshot's compaction is cancelled as compacted, as after any
//!   compaction). The member list and the auth state (users, roles,
//!   enabled flag, auth revision, live tokens) travel beside the store as
//!   the snapshot's sections and are installed with it.

use crate::cluster::log::input::Input;
use crate::cluster::log::queue::{Sender, TrySendError};
use crate::mvcc::snapshot::{self, Sections};
use crate::mvcc::Store;
use bytes::Bytes;
use parking_lot::Mutex;
use raft::prelude::{Entry as LogEntry, Snapshot as RaftSnapshot};
use raft::storage::MemStorage;
use raft::{
    GetEntriesContext, ProgressState, RaftState, RawNode, SnapshotStatus, StateRole, Storage,
    StorageError,
};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub use crate::config::{DEFAULT_CATCHUP_ENTRIES, DEFAULT_SNAPSHOT_COUNT};

/// What the Raft thread hands the apply thread, in log order.
pub(in crate::cluster) enum Work {
    /// Committed entries to apply.
    Entries(Vec<LogEntry>),
    /// A snapshot received from the leader, to install in place of the
    /// store's state.
    Install(RaftSnapshot),
    /// Capture the store at the applied index for a snapshot.
    Capture,
    /// Capture the store at the applied index for `--data-dir` (`saved_state.rs`).
    Save(tokio::sync::oneshot::Sender<snapshot::Snapshot>),
}

/// Counters about the log and snapshots, for `/metrics`.
#[derive(Debug, Default)]
pub struct LogCounters {
    first: AtomicU64,
    last: AtomicU64,
    built: AtomicU64,
    sent: AtomicU64,
    installed: AtomicU64,
    snapshot_bytes: AtomicU64,
    predating: AtomicU64,
}

impl LogCounters {
    /// The first index the in-memory Raft log still holds.
    pub fn first_index(&self) -> u64 {
        self.first.load(Ordering::Relaxed)
    }

    /// The last index of the in-memory Raft log.
    pub fn last_index(&self) -> u64 {
        self.last.load(Ordering::Relaxed)
    }

    /// Snapshots this member installed from a leader.
    pub fn installed(&self) -> u64 {
        self.installed.load(Ordering::Relaxed)
    }

    /// The Prometheus text of these counters, appended to the server's.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let mut one = |name: &str, kind: &str, help: &str, v: u64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}"
            );
        };
        one(
            "ephd_raft_log_first_index",
            "gauge",
            "First index the in-memory Raft log holds (entries below were compacted).",
            self.first_index(),
        );
        one(
            "ephd_raft_log_last_index",
            "gauge",
            "Last index of the in-memory Raft log.",
            self.last_index(),
        );
        one(
            "ephd_raft_snapshots_built_total",
            "counter",
            "Snapshots of the store built for followers behind the kept log.",
            self.built.load(Ordering::Relaxed),
        );
        one(
            "ephd_raft_snapshots_sent_total",
            "counter",
            "Snapshots delivered to followers.",
            self.sent.load(Ordering::Relaxed),
        );
        one(
            "ephd_raft_snapshots_predating_member_total",
            "counter",
            "Times the kept snapshot was not sent to a member because its member list predates \
             that member (a fresh one is built instead).",
            self.predating.load(Ordering::Relaxed),
        );
        one(
            "ephd_raft_snapshots_installed_total",
            "counter",
            "Snapshots received from a leader and installed.",
            self.installed(),
        );
        one(
            "ephd_raft_snapshot_bytes",
            "gauge",
            "Size of the newest snapshot built or installed.",
            self.snapshot_bytes.load(Ordering::Relaxed),
        );
        out
    }
}

/// Raft's storage: the in-memory log (raft-rs' `MemStorage`) and the
/// newest encoded snapshot, built on demand (see the module docs).
#[derive(Clone)]
pub(in crate::cluster) struct LogStore {
    mem: MemStorage,
    slot: Arc<Mutex<Slot>>,
    counters: Arc<LogCounters>,
}

#[derive(Default)]
struct Slot {
    ready: Option<RaftSnapshot>,
    wanted: bool,
}

impl LogStore {
    /// A log over `mem`, counting in `counters`.
    pub(in crate::cluster) fn new(mem: MemStorage, counters: Arc<LogCounters>) -> Self {
        LogStore {
            mem,
            slot: Arc::default(),
            counters,
        }
    }

    /// The in-memory log, to append to and to keep raft's hard state in.
    pub(in crate::cluster) fn wl(
        &self,
    ) -> std::sync::RwLockWriteGuard<'_, raft::storage::MemStorageCore> {
        self.mem.wl()
    }
}

impl Storage for LogStore {
    fn initial_state(&self) -> raft::Result<RaftState> {
        self.mem.initial_state()
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        context: GetEntriesContext,
    ) -> raft::Result<Vec<LogEntry>> {
        self.mem.entries(low, high, max_size, context)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        self.mem.term(idx)
    }

    fn first_index(&self) -> raft::Result<u64> {
        self.mem.first_index()
    }

    fn last_index(&self) -> raft::Result<u64> {
        self.mem.last_index()
    }

    /// The kept snapshot if it reaches the kept log and its member list
    /// has member `to`; otherwise asks for a new one and answers
    /// "temporarily unavailable" (raft asks again). A member added after
    /// the kept snapshot was built (a second member rejoining as a learner)
    /// refuses to restore a snapshot that does not list it, and raft would
    /// send it again and again: it gets a fresh one.
    fn snapshot(&self, request_index: u64, to: u64) -> raft::Result<RaftSnapshot> {
        let floor = request_index.max(self.mem.first_index()?.saturating_sub(1));
        let mut slot = self.slot.lock();
        let lists_to = |s: &RaftSnapshot| {
            let conf = s.get_metadata().get_conf_state();
            [
                conf.get_voters(),
                conf.get_learners(),
                conf.get_voters_outgoing(),
                conf.get_learners_next(),
            ]
            .iter()
            .any(|ids| ids.contains(&to))
        };
        match &slot.ready {
            Some(s) if s.get_metadata().index >= floor && lists_to(s) => Ok(s.clone()),
            Some(s) if s.get_metadata().index >= floor => {
                self.counters.predating.fetch_add(1, Ordering::Relaxed);
                tracing::info!(
                    to = %format_args!("{to:x}"),
                    index = s.get_metadata().index,
                    "the kept raft snapshot predates this member: building a fresh one"
                );
                slot.ready = None;
                slot.wanted = true;
                Err(raft::Error::Store(
                    StorageError::SnapshotTemporarilyUnavailable,
                ))
            }
            _ => {
                slot.wanted = true;
                Err(raft::Error::Store(
                    StorageError::SnapshotTemporarilyUnavailable,
                ))
            }
        }
    }
}

/// The Raft thread's side: compaction and snapshot requests.
pub(in crate::cluster) struct CatchUp {
    count: u64,
    keep: u64,
    compacted_at: u64,
    /// A capture was asked of the apply thread and its snapshot is not in
    /// yet: no compaction meanwhile, so its index stays in the log.
    building: bool,
    counters: Arc<LogCounters>,
}

impl CatchUp {
    /// The policy for `--snapshot-count` `count` and `keep` catch-up
    /// entries.
    pub(in crate::cluster) fn new(count: u64, keep: u64, counters: Arc<LogCounters>) -> Self {
        CatchUp {
            count: count.max(1),
            keep: keep.max(1),
            compacted_at: 0,
            building: false,
            counters,
        }
    }

    /// After each round of the Raft loop: asks for a snapshot if raft
    /// wanted one, compacts the log every `count` applied entries, and
    /// publishes the log's bounds.
    pub(in crate::cluster) fn after_round(
        &mut self,
        raw: &mut RawNode<LogStore>,
        applied: u64,
        to_apply: &Sender<Work>,
    ) {
        let store = raw.store().clone();
        {
            let mut slot = store.slot.lock();
            if slot.wanted && !self.building {
                slot.wanted = false;
                self.building = to_apply.send(Work::Capture).is_ok();
            }
        }
        let bounds = |mem: &MemStorage| {
            (
                mem.first_index().unwrap_or(1),
                mem.last_index().unwrap_or(0),
            )
        };
        if !self.building && applied >= self.compacted_at + self.count {
            let (first, last) = bounds(&store.mem);
            let ready = store
                .slot
                .lock()
                .ready
                .as_ref()
                .map(|s| s.get_metadata().index);
            let target = compaction_target(raw, applied, first, ready, (self.keep, self.count));
            if target > first && target <= last {
                if let Err(e) = store.mem.wl().compact(target) {
                    tracing::error!(error = %e, "cannot compact the raft log");
                }
            }
            self.compacted_at = applied;
            let (first, _) = bounds(&store.mem);
            let mut slot = store.slot.lock();
            if slot
                .ready
                .as_ref()
                .is_some_and(|s| s.get_metadata().index + 1 < first)
            {
                // Behind the log: no follower can use it any more.
                slot.ready = None;
            }
        }
        let (first, last) = bounds(&store.mem);
        self.counters.first.store(first, Ordering::Relaxed);
        self.counters.last.store(last, Ordering::Relaxed);
    }

    /// The encoded snapshot the apply thread captured at `index` (term
    /// `term`) is ready: kept for raft to send.
    pub(in crate::cluster) fn built(
        &mut self,
        raw: &RawNode<LogStore>,
        index: u64,
        term: u64,
        data: Bytes,
    ) {
        self.building = false;
        let store = raw.store();
        let conf = match store.initial_state() {
            Ok(s) => s.conf_state,
            Err(_) => return,
        };
        let mut snap = RaftSnapshot::default();
        let meta = snap.mut_metadata();
        meta.index = index;
        meta.term = term;
        meta.set_conf_state(conf);
        self.counters.built.fetch_add(1, Ordering::Relaxed);
        self.counters
            .snapshot_bytes
            .store(data.len() as u64, Ordering::Relaxed);
        snap.set_data(data);
        tracing::info!(
            index,
            term,
            "raft snapshot ready for a follower behind the log"
        );
        let mut slot = store.slot.lock();
        // Raft asked again while this one was being built (at every
        // heartbeat answer): those asks are answered by it. Left set, the
        // flag started a second full capture right after the first
        // (measured: one wasted capture and encoding per replacement).
        slot.wanted = false;
        slot.ready = Some(snap);
    }

    /// A snapshot to `to` was delivered or failed: raft resumes sending
    /// entries, or sends the snapshot again.
    pub(in crate::cluster) fn delivered(&self, raw: &mut RawNode<LogStore>, to: u64, ok: bool) {
        if ok {
            self.counters.sent.fetch_add(1, Ordering::Relaxed);
            tracing::info!(to = %format_args!("{to:x}"), "raft snapshot sent");
            raw.report_snapshot(to, SnapshotStatus::Finish);
        } else {
            tracing::warn!(to = %format_args!("{to:x}"), "raft snapshot not delivered; raft will retry");
            raw.report_snapshot(to, SnapshotStatus::Failure);
        }
    }

    /// A `Ready` carried a snapshot from the leader: it replaces the log,
    /// is kept (this member may lead later), and goes to the apply thread
    /// ahead of the entries that follow it.
    pub(in crate::cluster) fn received(
        &self,
        raw: &mut RawNode<LogStore>,
        snap: RaftSnapshot,
        to_apply: &Sender<Work>,
    ) {
        let index = snap.get_metadata().index;
        if let Err(e) = raw.mut_store().mem.wl().apply_snapshot(snap.clone()) {
            tracing::error!(index, error = %e, "cannot apply a raft snapshot to the log");
            return;
        }
        tracing::info!(
            index,
            bytes = snap.get_data().len(),
            "installing a raft snapshot from the leader"
        );
        raw.store().slot.lock().ready = Some(snap.clone());
        let _ = to_apply.send(Work::Install(snap));
    }
}

/// How many `--snapshot-count`s of entries beyond the usual bound the
/// log may keep for followers that are catching up (see
/// [`compaction_target`]).
const PIN_COUNTS: u64 = 4;
/// The `count` [`PIN_COUNTS`] multiplies at least, so a small
/// `--snapshot-count` still lets a follower catch up a busy log.
const PIN_MIN_COUNT: u64 = 2_500;

/// Where to compact the log to (entries below it are dropped): `keep`
/// entries below `applied`, but not past what a live follower that is
/// catching up still needs: a follower in contact (raft's `recent_active`,
/// cleared every election timeout without an answer) that can still be
/// served from the log, or one a snapshot is on its way to (it needs the
/// entries after the snapshot's index); and while an active follower is
/// behind the log, not past the `ready` snapshot it is about to get.
/// Without this, a member catching
/// up under load needed a snapshot again right after installing one, since
/// the log had been compacted past it meanwhile (the failover benchmark:
/// snapshots of 300 MB, then 400, 470, 540, 590 MB for one member that
/// never caught up). Bounded: a snapshot in flight pins until its send
/// ends (its timeout grows with its size, `sender.rs`); the rest pins at
/// most [`PIN_COUNTS`] `count`s of entries more, so a slow or lying follower
/// cannot pin the log for ever.
fn compaction_target(
    raw: &RawNode<LogStore>,
    applied: u64,
    first: u64,
    ready: Option<u64>,
    (keep, count): (u64, u64),
) -> u64 {
    let target = applied.saturating_sub(keep);
    let raft = &raw.raft;
    if raft.state != StateRole::Leader {
        return target;
    }
    // A snapshot on its way: its send has a timeout of its own (scaled to
    // its size), after which raft hears it failed; so this pin ends.
    let sending = raft
        .prs()
        .iter()
        .filter(|(id, p)| **id != raft.id && p.state == ProgressState::Snapshot)
        .map(|(_, p)| p.pending_snapshot)
        .min();
    let live = raft
        .prs()
        .iter()
        .filter(|(id, p)| **id != raft.id && p.recent_active)
        .filter_map(|(_, p)| match p.state {
            ProgressState::Snapshot => None,
            _ if p.matched + 1 >= first => Some(p.matched),
            // Behind the log: it needs the snapshot that is ready.
            _ => ready,
        })
        .min();
    let lowest = applied.saturating_sub(keep + PIN_COUNTS * count.max(PIN_MIN_COUNT));
    let target = live.map_or(target, |n| target.min(n).max(lowest));
    sending.map_or(target, |n| target.min(n))
}

/// The apply thread's side of a capture: the image at `index` (term
/// `term`) is encoded on a thread of its own and handed to the Raft thread.
/// `sections` is the state kept beside the store at the same index
/// (`snapshot_sections.rs`).
pub(in crate::cluster) fn capture(
    store: &Store,
    sections: Sections,
    index: u64,
    term: u64,
    inbox: Sender<Input>,
) {
    let image = store.image();
    let snap = snapshot::Snapshot {
        raft_index: index,
        raft_term: term,
        image,
        sections,
    };
    let spawned = std::thread::Builder::new()
        .name("ephd-snapshot".into())
        .spawn(move || {
            let data = Bytes::from(snapshot::encode(&snap));
            let _ = inbox.send(Input::SnapshotBuilt { index, term, data });
        });
    if let Err(e) = spawned {
        tracing::error!(error = %e, "cannot start the snapshot encoder");
    }
}

/// The apply thread's side of an install: decodes the whole snapshot
/// first, its sections with `decode_sections` too, then replaces the
/// store's state. Returns the installed index and the decoded sections,
/// for the caller to install.
/// A snapshot that does not decode means this member can no longer follow
/// the log (the leader compacted what it lacks): it stops with an error
/// rather than serve a store that differs from the others.
pub(in crate::cluster) fn install<S>(
    store: &Store,
    snap: &RaftSnapshot,
    counters: &LogCounters,
    decode_sections: impl FnOnce(&Sections) -> Result<S, String>,
) -> (u64, S) {
    let index = snap.get_metadata().index;
    let decoded = match snapshot::decode(snap.get_data()) {
        Ok(d) if d.raft_index == index => d,
        Ok(d) => fatal(index, &format!("it says index {}", d.raft_index)),
        Err(e) => fatal(index, &e),
    };
    let sections = match decode_sections(&decoded.sections) {
        Ok(s) => s,
        Err(e) => fatal(index, &e),
    };
    store.install_image(decoded.image);
    counters.installed.fetch_add(1, Ordering::Relaxed);
    counters
        .snapshot_bytes
        .store(snap.get_data().len() as u64, Ordering::Relaxed);
    tracing::info!(
        index,
        revision = store.current_revision(),
        "raft snapshot installed"
    );
    (index, sections)
}

fn fatal(index: u64, why: &str) -> ! {
    tracing::error!(
        index,
        reason = why,
        "the raft snapshot from the leader is damaged; stopping"
    );
    std::process::exit(1);
}

/// Reports a snapshot's delivery to the Raft thread; waits for room in its
/// inbox off the async workers when it is full, since a lost report would
/// leave raft waiting for it.
pub(in crate::cluster) fn report(inbox: &Sender<Input>, to: u64, ok: bool) {
    if let Err(TrySendError::Full(input)) = inbox.try_send(Input::SnapshotStatus { to, ok }) {
        let inbox = inbox.clone();
        tokio::task::spawn_blocking(move || {
            let _ = inbox.send(input);
        });
    }
}

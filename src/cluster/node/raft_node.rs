//! The Raft node of a cluster member: raft-rs' `RawNode` in the Raft loop
//! (`raft_loop.rs`), and an apply thread that applies committed entries.
//!
//! * The Raft loop owns the `RawNode`: it ticks every heartbeat interval,
//!   steps messages from peers, takes proposals, and handles each `Ready`
//!   (messages to peers, entries into the in-memory log, committed entries
//!   to the apply thread). Its rounds run on the Raft thread, which ticks
//!   on its own clock so request load cannot delay heartbeats, and on the
//!   threads that bring proposals and peer messages when nobody else is
//!   running a round. A round never waits for the store.
//! * Committed entries are applied in log order through `Store::apply`
//!   (the same function a single member calls) by the apply thread, or,
//!   for small batches, by the thread that ran the round
//!   (`apply_loop.rs`); the result of each entry this member proposed goes
//!   to the request waiting for it.

use crate::cluster::log::catchup::{CatchUp, LogStore};
use crate::cluster::log::initial_gate::{InitialGate, WritesWaitFor};
use crate::cluster::log::input::Input;
use crate::cluster::log::queue::{self, Sender};
use crate::cluster::log::raft_logger;
use crate::cluster::log::raft_status::RaftStatus;
use crate::cluster::log::timeouts;
use crate::cluster::log::waiters::Waiters;
use crate::cluster::member::applied_membership::{Boot, Members};
use crate::cluster::member::restart::Disk;
use crate::cluster::member::saved_state::{self, SavedFiles};
use crate::cluster::node::apply_loop::{Applier, ApplyCore};
use crate::cluster::node::raft_loop::{Core, RaftLoop};
use crate::cluster::transport::peer_settings::PeerSettings;
use crate::cluster::transport::peers::Peers;
use crate::config::ClusterConfig;
use crate::entry_bytes as entry;
use crate::error::{Error, Result};
use crate::mvcc::{Applied, Entry, Store};
use crate::wal::{Identity, RaftLog, RaftLogStart};
use parking_lot::Mutex;
use raft::{RawNode, ReadOnlyOption};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Inputs the Raft loop takes; bounded, so a flood of peer messages or
/// proposals is refused rather than queued without limit.
const INBOX: usize = 16 * 1024;
/// Largest append message to a peer (raft still sends one entry if it is
/// larger).
const MAX_MSG_BYTES: u64 = 1024 * 1024;
/// Append messages in flight to one peer.
const MAX_INFLIGHT: usize = 256;

/// A running Raft member: what proposes and what reports Raft's state.
pub struct Node {
    id: u64,
    /// The Raft loop, which inputs on the hot paths run themselves
    /// (`raft_loop.rs`).
    core: Arc<Core>,
    waiters: Arc<Waiters<Result<Applied>>>,
    reads: Arc<Waiters<u64>>,
    /// Proposal and read-index numbers.
    next_number: AtomicU64,
    status: Arc<RaftStatus>,
    /// The applied index, for reads waiting to reach their read index.
    applied: Arc<watch::Sender<u64>>,
    timeout: Duration,
    election: Duration,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// The voters, links to the other members, and the lease state that
    /// only the leader's clock decides (see `lease_forward.rs`).
    pub(in crate::cluster) leases: crate::cluster::member::lease_state::LeaseForward,
    /// Membership: applied state, waiting changes, peer health.
    members: Arc<Members>,
    /// Writes wait here for the initial revision (`initial_gate.rs`).
    pub(in crate::cluster) gate: Arc<InitialGate>,
    /// Members whose raft messages reached this one (`heard_from.rs`).
    pub(in crate::cluster) seen: crate::cluster::log::heard_from::Seen,
    /// The saved state's files, with `--data-dir`.
    files: Option<Arc<SavedFiles>>,
    /// Where the Raft log reports its writes.
    log_metrics: Option<Arc<std::sync::OnceLock<crate::wal::WalMetrics>>>,
    /// How this member talks to its peers.
    settings: PeerSettings,
}

/// Starts the Raft log of `disk`, if it has one: continuing what an
/// earlier run left when `boot` restarts from it, otherwise after writing
/// the state this member starts from (so a restart finds the saved state
/// the new log continues).
fn start_log(
    boot: &Boot,
    store: &Store,
    members: &Members,
    mem: &raft::storage::MemStorage,
    disk: &Disk,
) -> std::result::Result<Option<RaftLog>, String> {
    let Some((settings, earlier)) = &disk.log else {
        return Ok(None);
    };
    let (base, term) = boot.resume.unwrap_or((0, 0));
    if boot.log.is_none() {
        disk.files
            .write(&saved_state::capture(store, members, base, term))
            .map_err(|e| {
                format!(
                    "cannot write the starting state into {}: {e}",
                    disk.files.dir().display()
                )
            })?;
    }
    let earlier = earlier.as_ref().filter(|_| boot.log.is_some());
    let log = RaftLog::start(
        RaftLogStart {
            dir: settings.dir.clone(),
            mode: settings.mode,
            boot_id: settings.boot_id.clone(),
            identity: Identity {
                member_id: boot.id,
                cluster_id: boot.cluster_id,
            },
            hard_state: mem.rl().hard_state().clone(),
            next_position: earlier.map_or(1, |e| e.next_position),
            kept: earlier.map(|e| e.segments.clone()).unwrap_or_default(),
        },
        crate::wal::SEGMENT_BYTES,
    )
    .map_err(|e| {
        format!(
            "cannot start the raft log in {}: {e}",
            settings.dir.display()
        )
    })?;
    let mut log = log;
    if boot.log.is_none() && base > 0 {
        // The log starts after the state it was resumed from.
        let meta = raft::prelude::SnapshotMetadata {
            index: base,
            term,
            ..Default::default()
        };
        log.installed(&meta);
        log.flush();
    }
    disk.files.report_covered_to(log.covered());
    Ok(Some(log))
}

impl Node {
    /// Starts the member's Raft and apply threads and its connections to
    /// the other members (tasks on the current tokio runtime). Every member
    /// starts with the configuration the cluster's log starts from (the
    /// initial cluster) and an empty log; a joining member replays the log
    /// from there. `wait`: what its writes wait for (`initial_gate.rs`).
    /// `disk`: what it keeps in `--data-dir` (`restart.rs`); a member
    /// that does not restart from its log writes its starting state first,
    /// so that its new log continues it.
    pub fn start(
        config: &ClusterConfig,
        store: Arc<Store>,
        boot: Boot,
        wait: WritesWaitFor,
        disk: Option<Disk>,
        settings: PeerSettings,
    ) -> std::result::Result<Arc<Node>, String> {
        let id = boot.id;
        let status = Arc::new(RaftStatus::default());
        let mem = saved_state::storage(&boot);
        let members = Arc::new(Members::new(&boot, config));
        let (log, files) = match disk {
            Some(disk) => (
                start_log(&boot, &store, &members, &mem, &disk)?,
                Some(disk.files),
            ),
            None => (None, None),
        };
        let log_metrics = log.as_ref().map(|l| l.metrics());
        let storage = LogStore::new(mem, status.log.clone());
        let raft_config = raft::Config {
            id,
            heartbeat_tick: 1,
            election_tick: config.election_ticks(),
            pre_vote: true,
            check_quorum: true,
            read_only_option: ReadOnlyOption::Safe,
            max_size_per_msg: MAX_MSG_BYTES,
            max_inflight_msgs: MAX_INFLIGHT,
            applied: boot.resume.map_or(0, |(index, _)| index),
            // Proposals taken in one round go to each follower in ONE
            // append (raft-rs merges them) rather than one append per
            // proposal, each answered on its own. Measured under etcd's
            // `benchmark put` on three members: 20 % fewer thread switches
            // and about 9 % less CPU per put (medians of 8 alternated runs:
            // 85.5 against 94 µs). A round's proposals are bounded by
            // INPUTS_PER_ROUND and PROPOSED_BYTES_PER_ROUND (`raft_loop.rs`),
            // which bounds such an append.
            batch_append: true,
            ..Default::default()
        };
        raft_config
            .validate()
            .map_err(|e| format!("raft settings: {e}"))?;
        let mut raw = RawNode::new(&raft_config, storage, &raft_logger::logger())
            .map_err(|e| format!("cannot start raft: {e}"))?;
        // As etcd (its initial election tick advance): a member restarting
        // from its log starts one tick short of its election timeout, so
        // members that restart together (a majority) elect within a tick
        // or two rather than a whole timeout. A member that starts beside
        // a leader hears its heartbeat first, and pre-vote keeps an early
        // campaign from disturbing a working leader. Not on a first start:
        // the other members may still be answering probes on their peer
        // URLs (`join.rs`), where a framed lane finds no framed server.
        if boot.log.is_some() {
            for _ in 1..config.election_ticks() {
                raw.tick();
            }
        }
        let (inbox, inputs) = queue::bounded(INBOX);
        let peers = Peers::start(
            boot.current.members(),
            id,
            members.health.clone(),
            inbox.clone(),
            members.removal.clone(),
            settings.clone(),
        )?;
        let (to_apply, committed) = queue::unbounded();
        let waiters = Arc::new(Waiters::default());
        let reads = Arc::new(Waiters::default());
        let (base, base_term) = boot.resume.unwrap_or((0, 0));
        status.applied.store(base, Ordering::Relaxed);
        let applied = Arc::new(watch::channel(base).0);
        let bell = inputs.bell();
        let led_term = raw.raft.term;
        let raft_loop = RaftLoop {
            raw,
            inputs,
            peers,
            to_apply,
            waiters: waiters.clone(),
            reads: reads.clone(),
            read_batches: Default::default(),
            status: status.clone(),
            tick: config.heartbeat,
            next_tick: Instant::now() + config.heartbeat,
            catchup: CatchUp::new(
                config.snapshot_count,
                config.catchup_entries,
                status.log.clone(),
            ),
            members: members.clone(),
            held: Vec::new(),
            log,
            files: files.clone(),
            led_term,
            election: crate::cluster::log::raft_status::ElectionUnderway::Leaderless,
        };
        let leases = crate::cluster::member::lease_state::LeaseForward::new(
            id,
            members.clone(),
            store.clone(),
            settings.dialer.clone(),
        );
        // A resumed store is past its initial revision (`saved_state.rs`), and
        // applies the log it kept after the limits that log holds.
        let fresh = boot.resume.is_none();
        let gate = Arc::new(InitialGate::new(WritesWaitFor {
            initial_revision: wait.initial_revision && fresh,
            replicated_limits: wait.replicated_limits && fresh && !store.limits_replicated(),
        }));
        let applier = Applier {
            id,
            store,
            waiters: waiters.clone(),
            status: status.clone(),
            applied: applied.clone(),
            inbox: inbox.clone(),
            term: base_term,
            members: members.clone(),
            gate: gate.clone(),
            answers: Vec::new(),
        };
        let apply = ApplyCore::new(applier, committed);
        let core = Core::new(raft_loop, inbox.clone(), apply.clone());
        let raft_core = core.clone();
        let raft_thread = std::thread::Builder::new()
            .name("ephd-raft".into())
            .spawn(move || raft_core.run(bell))
            .map_err(|e| format!("cannot start the raft thread: {e}"))?;
        let apply_thread = std::thread::Builder::new()
            .name("ephd-apply".into())
            .spawn(move || apply.run())
            .map_err(|e| format!("cannot start the apply thread: {e}"))?;
        tracing::info!(
            member_id = %format_args!("{id:x}"),
            members = config.members.len(),
            heartbeat_ms = config.heartbeat.as_millis() as u64,
            election_ms = config.election.as_millis() as u64,
            "raft member started"
        );
        let node = Arc::new(Node {
            id,
            core,
            waiters,
            reads,
            // Proposal numbers only need to be unique per member while
            // their entries can still be applied; a random start keeps a
            // restarted member from reusing a number still in the log.
            next_number: AtomicU64::new(rand::random::<u64>() >> 1),
            status,
            applied,
            // etcd's request timeout: 5 s plus two election timeouts.
            timeout: Duration::from_secs(5) + 2 * config.election,
            election: config.election,
            threads: Mutex::new(vec![raft_thread, apply_thread]),
            leases,
            members,
            gate,
            seen: Default::default(),
            files,
            log_metrics,
            settings,
        });
        Ok(node)
    }

    /// How this member talks to its peers.
    pub(in crate::cluster) fn peer_settings(&self) -> &PeerSettings {
        &self.settings
    }

    /// The saved state's files (`--data-dir`).
    pub(in crate::cluster) fn saved_files(&self) -> Option<&Arc<SavedFiles>> {
        self.files.as_ref()
    }

    /// Reports the Raft log's writes to these metrics.
    pub fn report_log_to(&self, metrics: crate::wal::WalMetrics) {
        if let Some(slot) = &self.log_metrics {
            let _ = slot.set(metrics);
        }
    }

    /// Membership's shared state (`reconfig.rs`).
    pub(in crate::cluster) fn members(&self) -> &Arc<Members> {
        &self.members
    }

    /// A new proposal or read number.
    pub(in crate::cluster) fn next_number(&self) -> u64 {
        self.next_number.fetch_add(1, Ordering::Relaxed)
    }

    /// This member's ID.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Raft's state as this member sees it.
    pub fn status(&self) -> &RaftStatus {
        &self.status
    }

    /// etcd's peer network metrics of this member (`peer_metrics.rs`).
    pub fn peer_metrics(&self) -> &crate::cluster::transport::peer_metrics::PeerMetrics {
        self.members.health.metrics()
    }

    /// The sender peers' messages go to (see `peer_service.rs`).
    pub(in crate::cluster) fn inbox(&self) -> Sender<Input> {
        self.core.sender().clone()
    }

    /// Queues a peer's message for the Raft loop without running it (see
    /// [`Node::run_loop`]); a message that finds the queue full is dropped
    /// (Raft sends it again).
    pub(in crate::cluster) fn queue(&self, input: Input) {
        let _ = self.core.queue(input);
    }

    /// Runs the Raft loop's rounds on this thread when nobody else is
    /// (`raft_loop.rs`), for what [`Node::queue`] queued.
    pub(in crate::cluster) fn run_loop(&self) {
        self.core.combine();
    }

    /// Proposes `entry` and waits until this member has applied it; returns
    /// this member's result of applying it. A proposal not applied within
    /// the request timeout fails with `etcdserver: request timed out` (with
    /// etcd's "possibly due to previous leader failure" or "connection
    /// lost" when that is why, see `timeouts.rs`) and is never proposed
    /// again (it may still commit later). As in etcd, a member that knows
    /// no leader holds the write until it knows one (an election), and
    /// answers `context deadline exceeded` (DeadlineExceeded) if none comes within
    /// the timeout; so does a write the Raft loop took and held because
    /// the leader was lost just before (never proposed, then). Writes then
    /// wait for the initial revision
    /// (`initial_gate.rs`) within that timeout.
    pub async fn propose(&self, entry: Entry) -> Result<Applied> {
        self.propose_in_term(entry, 0).await
    }

    /// [`Node::propose`], for an entry every member refuses (with
    /// `etcdserver: leader changed`) unless the log entry carrying it has
    /// Raft term `term`: lease revokes and checkpoints, which a deposed
    /// leader must not decide. `term == 0` checks nothing.
    pub async fn propose_in_term(&self, entry: Entry, term: u64) -> Result<Applied> {
        let deadline = tokio::time::Instant::now() + self.timeout;
        // As etcd: during an election the write waits for the new leader.
        self.status
            .wait_for_leader(deadline, Error::NoLeaderInTime)
            .await?;
        self.gate.pass(&entry, deadline).await?;
        self.propose_by(entry, term, deadline).await
    }

    /// Hands `entry` to the Raft loop and waits for this member's result
    /// of applying it until `deadline`.
    pub(in crate::cluster) async fn propose_by(
        &self,
        entry: Entry,
        term: u64,
        deadline: tokio::time::Instant,
    ) -> Result<Applied> {
        let proposal = self.next_number.fetch_add(1, Ordering::Relaxed);
        let data = entry::encode(self.id, proposal, term, entry);
        let (rx, _pending) = self.waiters.wait(proposal);
        let proposed = std::time::Instant::now();
        self.send(Input::Propose { proposal, data })?;
        match tokio::time::timeout_at(deadline, rx).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(Error::Stopped),
            // Still held for want of a leader: never proposed, as etcd's
            // Raft node never takes a proposal without a leader, and etcd
            // answers with the raw context error then.
            Err(_) if self.status.held.lock().remove(&proposal) => Err(Error::NoLeaderInTime),
            Err(_) => Err(self.timeout_reason(proposed)),
        }
    }

    /// Why a proposal made at `proposed` timed out (`timeouts.rs`).
    fn timeout_reason(&self, proposed: std::time::Instant) -> Error {
        let voters: Vec<u64> = self.members.current.read().voters().map(|m| m.id).collect();
        let health = &self.members.health;
        timeouts::reason(
            proposed,
            timeouts::Now {
                me: self.id,
                election: self.election,
                leader_elected: *self.status.leader_elected.lock(),
                leader: self.status.leader(),
                voters: &voters,
                active_since: &|id| health.active_since(id),
            },
        )
    }

    /// Waits until a read served from this member's store after it returns
    /// is linearizable: the leader confirms with a quorum that it is still
    /// leader and gives its commit index (ReadIndex, `ReadOnlySafe`), and
    /// this member waits until it has applied that index. A leader cut off
    /// from the majority never confirms, so the read times out. As in
    /// etcd, a member that knows no leader waits for one, and a read in
    /// flight when a new leader comes fails with `etcdserver: leader
    /// changed`.
    pub async fn read_barrier(&self) -> Result<()> {
        let deadline = tokio::time::Instant::now() + self.timeout;
        // As etcd: a read in flight when this member sees a new leader
        // fails with `etcdserver: leader changed` (clients retry it); one
        // sent during an election waits for that.
        let changes = self.status.leader_changes();
        let index = loop {
            self.status
                .wait_for_leader(deadline, Error::Timeout)
                .await?;
            if self.status.leader_changes() != changes {
                return Err(Error::LeaderChanged);
            }
            let ctx = self.next_number.fetch_add(1, Ordering::Relaxed);
            let (rx, _pending) = self.reads.wait(ctx);
            self.send(Input::ReadIndex { ctx })?;
            // A new leader drops read requests until it has committed an
            // entry of its term: ask again after an election timeout.
            let attempt = (tokio::time::Instant::now() + self.election).min(deadline);
            tokio::select! {
                biased;
                answer = tokio::time::timeout_at(attempt, rx) => match answer {
                    Ok(Ok(index)) => break index,
                    Ok(Err(_)) => return Err(Error::Stopped),
                    Err(_) if attempt >= deadline => return Err(Error::Timeout),
                    Err(_) => {}
                },
                () = self.status.new_leader_since(changes) => return Err(Error::LeaderChanged),
            }
        };
        let mut applied = self.applied.subscribe();
        // The watch's borrow is dropped inside, so this future stays Send.
        let reached = async move { applied.wait_for(|a| *a >= index).await.is_ok() };
        match tokio::time::timeout_at(deadline, reached).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(Error::Stopped),
            Err(_) => Err(Error::Timeout),
        }
    }

    /// The election timeout (`--election-timeout`).
    pub fn election_timeout(&self) -> Duration {
        self.election
    }

    /// etcd's request timeout: 5 s plus two election timeouts.
    pub fn request_timeout(&self) -> Duration {
        self.timeout
    }

    /// Queues `input` for the Raft loop and runs the loop's round on this
    /// thread when nobody else is (`raft_loop.rs`). `TooManyRequests` when
    /// the queue is full, `Stopped` when the loop has stopped.
    pub(in crate::cluster) fn send(&self, input: Input) -> Result<()> {
        self.core.deliver(input)
    }

    /// Stops the Raft and apply threads (blocking until they end); waiting
    /// requests fail with `etcdserver: server stopped`.
    pub fn stop(&self) {
        let _ = self.core.sender().send(Input::Stop);
        for t in self.threads.lock().drain(..) {
            let _ = t.join();
        }
        self.waiters.clear();
        self.reads.clear();
        self.members.waiters.clear();
    }
}

//! The server's background tasks: lease expiry, auto-compaction (and the
//! compaction safety net) and periodic snapshots. Each turns a decision made
//! with the clock into an ordinary store operation: the store core reads no
//! clock.

use crate::api::Shared;
use crate::cluster::Node;
use crate::config::AutoCompaction;
use crate::mvcc::Store;
use crate::mvcc::{Command, Compaction};
use crate::persist;
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// How often lease expiry is checked.
const EXPIRY_TICK: Duration = Duration::from_millis(100);
/// Leases revoked per tick at most (1,000/s, etcd's revoke rate), so an
/// expiry storm cannot starve other requests.
const REVOKES_PER_TICK: usize = 100;

/// Writes a snapshot now (off the async workers). With a write-ahead log,
/// the snapshot records the log position it covers, and the log segments
/// that every kept snapshot covers are removed.
pub(super) async fn write_snapshot(
    store: &Arc<Store>,
    dir: &std::path::Path,
) -> Result<(), String> {
    let store = store.clone();
    let dir = dir.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let started = Instant::now();
        let cut = store.snapshot_cut();
        let written = persist::write(
            &dir,
            cut.revision,
            &cut.kvs,
            &cut.leases,
            Some(&cut.auth),
            persist::wall_clock_ms(),
            cut.position,
        )
        .map_err(|e| format!("cannot write snapshot to {}: {e}", dir.display()))?;
        tracing::info!(
            revision = cut.revision,
            keys = cut.kvs.len(),
            leases = cut.leases.len(),
            bytes = written.bytes,
            pruned = written.pruned.len(),
            wal_position = cut.position,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "snapshot written"
        );
        if cut.position.is_some() {
            drop_log_covered_by_every_snapshot(&dir);
        }
        Ok(())
    })
    .await
    .map_err(|e| format!("snapshot task failed: {e}"))?
}

/// Removes the log segments the oldest kept snapshot covers: whichever
/// snapshot a restart falls back to, the records after it stay.
fn drop_log_covered_by_every_snapshot(dir: &std::path::Path) {
    let oldest = match persist::list(dir) {
        Ok(generations) => generations.into_iter().last(),
        Err(_) => return,
    };
    let Some(position) = oldest.and_then(|(_, path)| persist::wal_position_of(&path)) else {
        return;
    };
    let wal = crate::wal::dir_in(dir);
    match crate::wal::drop_covered(&wal, position) {
        Ok(removed) if !removed.is_empty() => {
            tracing::debug!(
                removed = removed.len(),
                position,
                "removed covered log segments"
            )
        }
        Ok(_) => {}
        Err(e) => {
            tracing::warn!(dir = %wal.display(), error = %e, "cannot remove covered log segments")
        }
    }
}

/// Writes snapshots every `interval` (if non-zero) until shutdown; the final
/// one is written by [`Server::run`] once writes are fenced.
pub(super) async fn snapshot_loop(
    store: Arc<Store>,
    dir: PathBuf,
    interval: Duration,
    mut stop: watch::Receiver<bool>,
) -> Result<(), String> {
    let period = if interval.is_zero() {
        Duration::from_secs(u64::MAX / 4)
    } else {
        interval
    };
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = tick.tick() => {
                if let Err(e) = write_snapshot(&store, &dir).await {
                    tracing::error!(error = %e, "periodic snapshot failed");
                }
            }
            _ = crate::api::stopped(&mut stop) => return Ok(()),
        }
    }
}

/// What the compactor task does: one of etcd's auto-compaction modes, or,
/// when none is configured, the compaction safety net.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum CompactionPolicy {
    /// `--auto-compaction-mode=periodic`: keep this much wall-clock history.
    Periodic(Duration),
    /// `--auto-compaction-mode=revision`: keep this many revisions.
    Revisions(i64),
    /// `--compaction-safety-net`: when nothing has compacted for this long,
    /// compact to the revision that was current this long ago.
    SafetyNet(Duration),
}

impl CompactionPolicy {
    /// The policy for the flags: auto-compaction when it is configured;
    /// otherwise the safety net unless it is 0. The two never run together:
    /// an operator who set a retention has bounded history already, and the
    /// net could only contradict that choice.
    pub(super) fn from_flags(auto: AutoCompaction, safety_net: Duration) -> Option<Self> {
        match auto {
            AutoCompaction::Periodic(d) => Some(CompactionPolicy::Periodic(d)),
            AutoCompaction::Revisions(n) => Some(CompactionPolicy::Revisions(n)),
            AutoCompaction::Off if safety_net.is_zero() => None,
            AutoCompaction::Off => Some(CompactionPolicy::SafetyNet(safety_net)),
        }
    }

    /// How often the compactor looks at the store. Periodic mode and the
    /// safety net sample the revision every tenth of their duration, as
    /// etcd's periodic compactor does; revision mode checks every five
    /// minutes, as etcd's does.
    fn tick(self) -> Duration {
        match self {
            CompactionPolicy::Periodic(d) | CompactionPolicy::SafetyNet(d) => {
                (d / SAMPLES as u32).max(Duration::from_millis(100))
            }
            CompactionPolicy::Revisions(_) => Duration::from_secs(300),
        }
    }
}

/// Revision samples kept by periodic mode and the safety net: the oldest of
/// `SAMPLES + 1` samples, one tick apart, was taken at least one duration ago.
const SAMPLES: usize = 10;

/// The compactor's decisions, apart from the clock and the store so they
/// can be tested with made-up times: [`Compactor::tick`] is given the time,
/// the current and the compacted revision, and says where to compact.
#[derive(Debug)]
pub(super) struct Compactor {
    policy: CompactionPolicy,
    samples: VecDeque<i64>,
    /// The compacted revision at the previous tick, and since when it has
    /// not moved: how the safety net learns that someone else compacted
    /// (a client's Compact RPC, or the net's own compaction) without the
    /// store keeping any clock.
    compacted: i64,
    unchanged_since: Instant,
}

impl Compactor {
    /// A compactor starting at `now`, with the store compacted at
    /// `compacted` (start-up counts as the last compaction).
    pub(super) fn new(policy: CompactionPolicy, now: Instant, compacted: i64) -> Self {
        Compactor {
            policy,
            samples: VecDeque::with_capacity(SAMPLES + 1),
            compacted,
            unchanged_since: now,
        }
    }

    /// One tick: the revision to compact at, if any.
    pub(super) fn tick(&mut self, now: Instant, current: i64, compacted: i64) -> Option<i64> {
        if compacted != self.compacted {
            self.compacted = compacted;
            self.unchanged_since = now;
        }
        let target = match self.policy {
            CompactionPolicy::Revisions(n) => current - n,
            CompactionPolicy::Periodic(_) | CompactionPolicy::SafetyNet(_) => {
                self.samples.push_back(current);
                if self.samples.len() <= SAMPLES {
                    return None;
                }
                self.samples.pop_front().unwrap_or(0)
            }
        };
        if let CompactionPolicy::SafetyNet(d) = self.policy {
            if now.saturating_duration_since(self.unchanged_since) < d {
                return None;
            }
        }
        (target > compacted).then_some(target)
    }
}

/// Compacts history by itself according to `policy` (see
/// [`CompactionPolicy`]) until shutdown.
///
/// In cluster mode (`node`) every member samples its revisions, since
/// every member applies the same ones, but only the leader acts: it
/// proposes the compaction, which every member applies at the same point
/// of the log. A member compacting on its own would make the members
/// differ. A member that becomes leader has its samples ready, and sees
/// the compactions it applied as anyone's (the safety net's clock).
pub(super) async fn auto_compact(
    store: Arc<Store>,
    policy: CompactionPolicy,
    mut stop: watch::Receiver<bool>,
    node: Option<Arc<Node>>,
) {
    let mut compactor = Compactor::new(policy, Instant::now(), store.compacted_revision());
    if let CompactionPolicy::SafetyNet(d) = policy {
        tracing::info!(
            after_s = d.as_secs_f64(),
            "compaction safety net on: history is compacted when nothing has compacted it \
             for this long (--compaction-safety-net; 0 turns it off)"
        );
    }
    let mut tick = tokio::time::interval(policy.tick());
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = crate::api::stopped(&mut stop) => return,
        }
        let Some(target) = compactor.tick(
            Instant::now(),
            store.current_revision(),
            store.compacted_revision(),
        ) else {
            continue;
        };
        let done = match &node {
            Some(node) if !node.status().is_leader() => continue,
            Some(node) => {
                let compaction = Compaction { revision: target }.into_entry();
                Ok(node.propose(compaction).await.and_then(Compaction::answer))
            }
            None => {
                let s = store.clone();
                tokio::task::spawn_blocking(move || s.compact(target)).await
            }
        };
        match done {
            Ok(Ok(_)) => match policy {
                CompactionPolicy::SafetyNet(d) => tracing::warn!(
                    revision = target,
                    no_compaction_for_s = d.as_secs_f64(),
                    "compaction safety net: nothing compacted history for this long, so ephd \
                     compacted it to the revision that was current that long ago, so it cannot \
                     grow without bound (kube-apiserver compacts every 5 minutes by itself: is \
                     none connected?). Set --auto-compaction-retention to choose the retention, \
                     or --compaction-safety-net=0 to keep all history until a client compacts"
                ),
                _ => tracing::info!(revision = target, "auto-compacted"),
            },
            Ok(Err(e)) => tracing::debug!(revision = target, error = %e, "auto-compaction skipped"),
            Err(e) => tracing::error!(error = %e, "auto-compaction task failed"),
        }
    }
}

/// Revokes expired leases, at most [`REVOKES_PER_TICK`] per tick. In
/// cluster mode only the leader decides expiry, and proposes the revokes.
pub(super) async fn expire_leases(shared: Shared) {
    let mut stop = shared.stop.clone();
    let mut tick = tokio::time::interval(EXPIRY_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut rounds = crate::cluster::node::lease_forward::LeaderRounds::default();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = crate::api::stopped(&mut stop) => return,
        }
        if let Some(node) = shared.backend.cluster_node() {
            crate::cluster::node::lease_forward::leader_round(
                &shared.metrics.lease_expired,
                node,
                &mut rounds,
            )
            .await;
            continue;
        }
        let s = shared.clone();
        let revoked = tokio::task::spawn_blocking(move || {
            for (id, result) in s.store.revoke_expired(Instant::now(), REVOKES_PER_TICK) {
                match result {
                    Ok(rev) => {
                        s.metrics.lease_expired.inc();
                        tracing::debug!(lease = id, rev, "lease expired");
                    }
                    Err(e) => tracing::debug!(lease = id, error = %e, "expired lease already gone"),
                }
            }
        });
        if let Err(e) = revoked.await {
            tracing::error!(error = %e, "lease expiry task failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: Duration = Duration::from_secs(3600);
    const MINUTE: Duration = Duration::from_secs(60);

    /// Drives a compactor through `ticks` ticks of `policy.tick()` each, with
    /// the store's revision going up by 100 per tick and `client` saying, per
    /// tick, where a client compacts (if at all). Applies the compactor's own
    /// decisions. Returns (tick, time since start, target) for each of them.
    fn run(
        policy: CompactionPolicy,
        ticks: usize,
        mut client: impl FnMut(usize, i64) -> Option<i64>,
    ) -> Vec<(usize, Duration, i64)> {
        let start = Instant::now();
        let mut compactor = Compactor::new(policy, start, 0);
        let (mut current, mut compacted) = (1, 0);
        let mut history = vec![(start, current)];
        let mut decisions = Vec::new();
        // The first tick of a tokio interval is immediate: tick 0 is the
        // start itself.
        assert_eq!(compactor.tick(start, current, compacted), None);
        for i in 1..=ticks {
            let now = start + policy.tick() * i as u32;
            current += 100;
            history.push((now, current));
            if let Some(rev) = client(i, current) {
                compacted = compacted.max(rev);
            }
            if let Some(target) = compactor.tick(now, current, compacted) {
                assert!(target > compacted && target <= current);
                compacted = target;
                decisions.push((i, now - start, target));
                if let CompactionPolicy::SafetyNet(d) | CompactionPolicy::Periodic(d) = policy {
                    // It keeps at least the duration of history: the target
                    // was the current revision at least `d` ago.
                    let (at, _) = history.iter().find(|(_, r)| *r == target).unwrap();
                    assert!(
                        now - *at >= d,
                        "target {target} is only {:?} old",
                        now - *at
                    );
                }
            }
        }
        decisions
    }

    #[test]
    fn the_safety_net_never_fires_while_a_client_compacts_every_five_minutes() {
        // kube-apiserver's compactor: every 5 minutes, at the revision it
        // saw 5 minutes earlier. Ten hours of it.
        let policy = CompactionPolicy::SafetyNet(HOUR);
        assert_eq!(policy.tick(), 6 * MINUTE);
        // With 6-minute ticks, a compaction before every tick is the
        // closest to every five minutes.
        let decisions = run(policy, 100, |_, current| Some(current - 50));
        assert_eq!(decisions, [], "the net never compacted");
        // Compacting every 48 minutes (rarer than the ticks, more often than
        // the hour) is enough too.
        let decisions = run(policy, 100, |i, current| {
            (i % 8 == 0).then_some(current - 300)
        });
        assert_eq!(decisions, []);
    }

    #[test]
    fn the_safety_net_compacts_to_the_revision_of_one_duration_ago_when_nothing_compacts() {
        let policy = CompactionPolicy::SafetyNet(HOUR);
        let decisions = run(policy, 45, |_, _| None);
        // First after one hour, to the revision current at the start; its
        // own compaction restarts the wait, so then every hour and a tick.
        assert_eq!(
            decisions,
            [
                (10, HOUR, 1),
                (21, HOUR + 66 * MINUTE, 1 + 11 * 100),
                (32, 2 * HOUR + 72 * MINUTE, 1 + 22 * 100),
                (43, 3 * HOUR + 78 * MINUTE, 1 + 33 * 100),
            ]
        );
    }

    #[test]
    fn the_safety_net_waits_one_duration_after_the_last_compaction_by_anyone() {
        let policy = CompactionPolicy::SafetyNet(HOUR);
        // A client compacts at tick 15 only: the net first fires one hour
        // (ten ticks) after the start, then one hour after tick 15, not one
        // hour after its own compaction (tick 10, seen at tick 11).
        let decisions = run(policy, 30, |i, current| (i == 15).then_some(current - 100));
        assert_eq!(
            decisions,
            [(10, HOUR, 1), (25, 2 * HOUR + 30 * MINUTE, 1 + 15 * 100)]
        );
        // When the client compacted right up to its current revision, the
        // sample from an hour before tick 25 is not past it: the net waits
        // for the next sample that is.
        let decisions = run(policy, 30, |i, current| (i == 15).then_some(current));
        assert_eq!(
            decisions,
            [(10, HOUR, 1), (26, 2 * HOUR + 36 * MINUTE, 1 + 16 * 100)]
        );
    }

    #[test]
    fn a_quiet_store_is_compacted_to_its_current_revision() {
        // No writes at all after some history: the net still compacts (to
        // the current revision), so the old versions go.
        let start = Instant::now();
        let policy = CompactionPolicy::SafetyNet(Duration::from_secs(10));
        let mut c = Compactor::new(policy, start, 0);
        let mut fired = Vec::new();
        for i in 0..=20u32 {
            if let Some(t) = c.tick(start + policy.tick() * i, 500, 0) {
                fired.push((i, t));
                break;
            }
        }
        assert_eq!(fired, [(10, 500)]);
    }

    #[test]
    fn auto_compaction_modes_behave_as_before() {
        // Periodic: every tenth of the retention, to the sample ten ticks old.
        let decisions = run(CompactionPolicy::Periodic(HOUR), 12, |_, _| None);
        assert_eq!(
            decisions,
            [
                (10, HOUR, 1),
                (11, HOUR + 6 * MINUTE, 101),
                (12, HOUR + 12 * MINUTE, 201)
            ]
        );
        // Periodic mode ignores clients' compactions (as etcd's does): it
        // compacts whenever its target is ahead of the compacted revision.
        let decisions = run(CompactionPolicy::Periodic(HOUR), 12, |i, c| {
            (i == 11).then_some(c - 950)
        });
        assert_eq!(decisions.len(), 2);
        // Revision mode: every five minutes, keeping that many revisions.
        let decisions = run(CompactionPolicy::Revisions(250), 4, |_, _| None);
        assert_eq!(
            decisions,
            [(3, 15 * MINUTE, 301 - 250), (4, 20 * MINUTE, 401 - 250)]
        );
    }

    #[test]
    fn auto_compaction_flags_take_precedence_over_the_safety_net() {
        let p = |auto, net| CompactionPolicy::from_flags(auto, net);
        assert_eq!(
            p(AutoCompaction::Off, HOUR),
            Some(CompactionPolicy::SafetyNet(HOUR))
        );
        assert_eq!(p(AutoCompaction::Off, Duration::ZERO), None);
        assert_eq!(
            p(AutoCompaction::Periodic(MINUTE), HOUR),
            Some(CompactionPolicy::Periodic(MINUTE))
        );
        assert_eq!(
            p(AutoCompaction::Revisions(10), HOUR),
            Some(CompactionPolicy::Revisions(10))
        );
        assert_eq!(
            CompactionPolicy::SafetyNet(Duration::from_millis(20)).tick(),
            Duration::from_millis(100),
            "ticks are never shorter than 100 ms"
        );
    }
}

//! The server's background tasks: lease expiry, auto-compaction and
//! periodic snapshots. Each turns a decision made with the clock into an
//! ordinary store operation.

use crate::api::Shared;
use crate::config::AutoCompaction;
use crate::mvcc::Store;
use crate::persist;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// How often lease expiry is checked.
const EXPIRY_TICK: Duration = Duration::from_millis(100);
/// Leases revoked per tick at most (1,000/s, etcd's revoke rate), so an
/// expiry storm cannot starve other requests.
const REVOKES_PER_TICK: usize = 100;

/// Writes a snapshot now (off the async workers).
pub(super) async fn write_snapshot(
    store: &Arc<Store>,
    dir: &std::path::Path,
) -> Result<(), String> {
    let store = store.clone();
    let dir = dir.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let started = Instant::now();
        let (rev, kvs) = store.live_kvs();
        let leases = store.leases_for_snapshot();
        let written = persist::write(&dir, rev, &kvs, &leases, persist::wall_clock_ms())
            .map_err(|e| format!("cannot write snapshot to {}: {e}", dir.display()))?;
        tracing::info!(
            revision = rev,
            keys = kvs.len(),
            leases = leases.len(),
            bytes = written.bytes,
            pruned = written.pruned.len(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "snapshot written"
        );
        Ok(())
    })
    .await
    .map_err(|e| format!("snapshot task failed: {e}"))?
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

/// etcd's auto-compaction. Periodic mode samples the revision every tenth
/// of the retention and compacts to the sample taken one retention ago;
/// revision mode compacts to `current - retention` every five minutes.
pub(super) async fn auto_compact(
    store: Arc<Store>,
    mode: AutoCompaction,
    mut stop: watch::Receiver<bool>,
) {
    let (every, keep_samples) = match mode {
        AutoCompaction::Periodic(d) => ((d / 10).max(Duration::from_millis(100)), 10usize),
        AutoCompaction::Revisions(_) => (Duration::from_secs(300), 0),
        AutoCompaction::Off => return,
    };
    let mut samples = std::collections::VecDeque::new();
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = crate::api::stopped(&mut stop) => return,
        }
        let target = match mode {
            AutoCompaction::Periodic(_) => {
                samples.push_back(store.current_revision());
                if samples.len() <= keep_samples {
                    continue;
                }
                samples.pop_front().unwrap_or(0)
            }
            AutoCompaction::Revisions(n) => store.current_revision() - n,
            AutoCompaction::Off => return,
        };
        if target <= store.compacted_revision() {
            continue;
        }
        let s = store.clone();
        match tokio::task::spawn_blocking(move || s.compact(target)).await {
            Ok(Ok(_)) => tracing::info!(revision = target, "auto-compacted"),
            Ok(Err(e)) => tracing::debug!(revision = target, error = %e, "auto-compaction skipped"),
            Err(e) => tracing::error!(error = %e, "auto-compaction task failed"),
        }
    }
}

/// Revokes expired leases, at most [`REVOKES_PER_TICK`] per tick.
pub(super) async fn expire_leases(shared: Shared) {
    let mut stop = shared.stop.clone();
    let mut tick = tokio::time::interval(EXPIRY_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = crate::api::stopped(&mut stop) => return,
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

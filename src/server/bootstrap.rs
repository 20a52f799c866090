//! What happens before the server serves: the newest readable snapshot
//! restored, the start revision chosen, kube-apiserver's compaction key
//! created, and the revision state written. `--restore-snapshot` (see
//! `restore.rs`) takes the place of the data directory's generations.
//!
//! # Recovery rules (`--data-dir`)
//! * The newest snapshot generation that reads intact is restored, all of
//!   it; a damaged one is never restored in part.
//! * Default (Kubernetes-safe) mode: a damaged generation is moved aside
//!   (`*.corrupt-<time>`, never overwritten or removed) with an ERROR
//!   saying what it was and what is lost, and the next older one is tried.
//!   If none is left, ephd starts empty above the highest revision known
//!   from any source (generation names, the state file, the wall clock)
//!   with an ERROR saying that every key and lease was lost. Kubernetes
//!   recovers from that (kubelets re-create leases within seconds, events
//!   are expendable, watchers relist after "compacted"); it does not
//!   recover from revisions going backwards or an ephd that never starts.
//! * `--strict-restore`, and `--revision-continuity=false` (the closest
//!   thing to an exact-etcd mode today: etcd never loses acknowledged
//!   data, so continuing without it would not be etcd's behaviour): if the
//!   newest generation is damaged, ephd refuses to start and moves nothing,
//!   so retrying (a kubelet restarting the pod) cannot quietly fall back to
//!   an older generation. A damaged state file is handled the same way.
//! * Errors that are not the file's content (permissions, I/O) always
//!   refuse to start: the file may be fine.
//!
//! # `--revision-continuity=false` after kube-apiserver's compaction key
//! kube-apiserver's compactor reads `compact_rev_key` after a failed
//! compare and indexes the first result: if the key disappears (a restart
//! that starts empty at revision 1), every apiserver panics in a loop. When
//! the state file shows the previous run had the key and this start would
//! not have it (no snapshot restored, or one without it), ephd refuses to
//! start and says why: one process refusing with a reason is a smaller
//! failure than every apiserver crashing with an index-out-of-range, and the
//! fix is one flag (or removing the state file on purpose). When the key is
//! restored, ephd starts but warns that the previous run kept revision
//! continuity. Without `--data-dir` nothing is known at start; the running
//! server warns once the key is written (see `revisions.rs`).

use super::memory::SpaceBounds;
use super::revisions::{
    has_compact_rev_key, start_revision, Known, RevisionGuard, COMPACT_REV_KEY, RESERVE_AHEAD,
    REVISIONS_PER_MS,
};
use crate::api::ServerInfo;
use crate::cluster::member::saved_state::Saved;
use crate::config::Config;
use crate::lease::LessorConfig;
use crate::mvcc::{PutRequest, RangeRequest, Replayed, Store, StoreConfig};
use crate::persist::{self, Damaged, ReadError, RecoverError, Recovery, RevisionState};
use crate::wal::WalMode;
use bytes::Bytes;
use std::path::Path;

/// The store, ready to serve, and what keeps its revisions safe.
pub(super) struct Boot {
    pub store: Store,
    pub guard: RevisionGuard,
    /// The write-ahead log to start before serving, if any.
    pub wal: Option<WalPlan>,
}

/// The log a single member starts once its store is shared.
pub(super) struct WalPlan {
    pub dir: std::path::PathBuf,
    pub mode: WalMode,
    /// The position of its first record.
    pub next_position: u64,
    /// The store changed outside the log at start (restored, moved up,
    /// `compact_rev_key` created): a snapshot covering that must be written
    /// before anything is served, so the log's records continue it.
    pub snapshot_first: bool,
}

fn describe(d: &Damaged) -> String {
    let rev = d.revision.map_or("unknown".into(), |r| r.to_string());
    match &d.moved_to {
        Some(to) => format!(
            "{} (revision {rev}): {}; moved aside to {}",
            d.path.display(),
            d.reason,
            to.display()
        ),
        None => format!("{} (revision {rev}): {}", d.path.display(), d.reason),
    }
}

/// Restores the snapshot generations of `dir` by the rules above.
fn recover_snapshots(dir: &Path, strict: bool, wall_ms: i64) -> Result<Recovery, String> {
    persist::recover(dir, strict, wall_ms).map_err(|e| match e {
        RecoverError::Io(e) => format!("cannot restore from {}: {e}", dir.display()),
        RecoverError::Refused(d) => format!(
            "refusing to start: the newest snapshot is damaged: {}. With --strict-restore or \
             --revision-continuity=false ephd restores the newest snapshot or nothing; nothing \
             was changed. To start anyway, move the file aside yourself (ephd then restores the \
             next older generation, if any), or start once without --strict-restore and with \
             revision continuity, which moves it aside itself",
            describe(&d)
        ),
    })
}

/// Reads the state file; a damaged one is moved aside (default mode) or
/// refuses the start (strict).
fn read_state(dir: &Path, strict: bool, wall_ms: i64) -> Result<Option<RevisionState>, String> {
    let path = dir.join(persist::STATE_FILE);
    match persist::state::read(dir) {
        Ok(s) => Ok(s),
        Err(ReadError::Io(e)) => Err(format!("cannot read {}: {e}", path.display())),
        Err(ReadError::Damaged { reason, .. }) if strict => Err(format!(
            "refusing to start: the revision state file {} is damaged: {reason}; nothing was \
             changed (move it aside to start anyway)",
            path.display()
        )),
        Err(ReadError::Damaged { reason, .. }) => {
            let moved = persist::move_aside(&path, wall_ms)
                .map_err(|e| format!("cannot move {} aside: {e}", path.display()))?;
            tracing::error!(
                path = %path.display(),
                moved_to = %moved.display(),
                reason,
                "the revision state file is damaged; moved aside. The start revision is taken \
                 from the snapshots and the wall clock only"
            );
            Ok(None)
        }
    }
}

/// The `--revision-continuity=false` checks against the previous run's
/// state (see the module docs).
fn check_continuity_off(prev: Option<RevisionState>, key_restored: bool) -> Result<(), String> {
    let Some(prev) = prev else { return Ok(()) };
    if prev.compact_rev_key && !key_restored {
        return Err(format!(
            "refusing to start: the previous run held kube-apiserver's {COMPACT_REV_KEY} (its \
             state file says so), but this start restores no snapshot with it and has \
             --revision-continuity=false, so it would start at revision 1 without the key. \
             kube-apiserver's compactor panics when {COMPACT_REV_KEY} disappears, and its \
             watch caches break when revisions go backwards. Run with \
             --revision-continuity=true (the default), or remove {} to start from revision 1 \
             on purpose",
            persist::STATE_FILE
        ));
    }
    if prev.continuity {
        tracing::warn!(
            "the previous run had revision continuity and this one has \
             --revision-continuity=false: revisions continue from the snapshot only, so writes \
             lost in a crash will have their revisions issued again; kube-apiserver relies on \
             continuity and on {COMPACT_REV_KEY} never disappearing"
        );
    }
    Ok(())
}

/// Logs what a recovery lost.
fn report_losses(recovery: &Recovery, prev: Option<RevisionState>, start: i64) {
    let lost = recovery.damaged.iter().map(describe).collect::<Vec<_>>();
    let newest_damaged = recovery
        .damaged
        .iter()
        .filter_map(|d| d.revision)
        .max()
        .map_or("unknown".to_string(), |r| r.to_string());
    match (&recovery.restored, lost.is_empty()) {
        (Some((path, r)), false) => tracing::error!(
            restored = %path.display(),
            restored_revision = r.revision,
            damaged = ?lost,
            "newer snapshots are damaged: restored an older one. Writes after revision {} up to \
             revision {newest_damaged} (and any after it) are LOST",
            r.revision,
        ),
        (None, false) => tracing::error!(
            start_revision = start,
            damaged = ?lost,
            "no snapshot could be read: starting EMPTY. Every key and lease of the previous \
             run is LOST (its newest snapshot was at revision {newest_damaged}); the damaged \
             files are kept for inspection",
        ),
        (None, true) if prev.is_some() => tracing::warn!(
            used_up_to = prev.map(|s| s.used_up_to),
            "the revision state file shows an earlier run but there is no snapshot (it \
             stopped before its first snapshot, or the snapshots were removed): starting empty"
        ),
        _ => {}
    }
}

/// Builds the store as of wall-clock time `wall_ms`: restores the newest
/// readable snapshot, picks the start revision, creates `compact_rev_key`
/// when revisions continue, and writes the revision state before anything
/// is served.
pub(super) fn build_store(
    config: &Config,
    wall_ms: i64,
    bounds: SpaceBounds,
) -> Result<Boot, String> {
    let continuity = config.revision_continuity;
    let strict = config.strict_restore || !continuity;
    let (recovery, prev) = match (&config.restore_snapshot, &config.data_dir) {
        (Some(file), dir) => (
            super::restore::from_file(file, dir.as_deref(), wall_ms)?,
            match dir {
                Some(dir) => read_state(dir, strict, wall_ms)?,
                None => None,
            },
        ),
        (None, Some(dir)) => (
            recover_snapshots(dir, strict, wall_ms)?,
            read_state(dir, strict, wall_ms)?,
        ),
        (None, None) => (Recovery::default(), None),
    };
    let restored = recovery.restored.as_ref().map(|(_, r)| r);
    let key_restored = restored.is_some_and(|r| {
        r.kvs
            .binary_search_by(|kv| kv.key.as_ref().cmp(COMPACT_REV_KEY.as_bytes()))
            .is_ok()
    });
    if !continuity {
        check_continuity_off(prev, key_restored)?;
    }
    let log = match &config.data_dir {
        Some(dir) => read_log(
            dir,
            recovery.restored.as_ref().map(|(_, r)| r),
            config.restore_snapshot.is_some(),
            config.wal_mode(),
            wall_ms,
        )?,
        None => LogStart::default(),
    };
    let known = Known {
        snapshot: restored.map(|r| r.revision),
        named: recovery.highest_named,
        state: prev.map(|s| s.used_up_to),
    };
    let start = start_revision(continuity, &known, wall_ms);
    report_losses(&recovery, prev, start);
    let adopt = (config.lease_adopt_unknown_ttl > 0).then_some(config.lease_adopt_unknown_ttl);
    let store = Store::new(StoreConfig {
        max_txn_ops: config.max_txn_ops,
        // A snapshot is restored at its own revision, so the log's records
        // replay at theirs; the revision moves up afterwards if need be.
        initial_revision: restored.map_or(start, |r| r.revision),
        lessor: LessorConfig {
            adopt_unknown_ttl: adopt,
            ..LessorConfig::default()
        },
        quota_bytes: bounds.quota_bytes,
        memory_bound_bytes: bounds.memory_bound_bytes,
        member_id: ServerInfo::new(&config.name, config.advertised_urls()).member_id,
        auth: config.auth.auth_config(),
    });
    let restored_revision = restored.map(|r| r.revision);
    if let Some((path, r)) = recovery.restored {
        tracing::info!(
            path = %path.display(),
            keys = r.kvs.len(),
            leases = r.leases.len(),
            revision = r.revision,
            auth_enabled = r.auth.as_ref().is_some_and(|a| a.state.enabled),
            "restored snapshot"
        );
        store.load(r.kvs, r.leases);
        if let Some(auth) = r.auth {
            // Users and roles come back; tokens never do (clients
            // authenticate again, as after an etcd restart).
            store.auth().install(auth);
        }
    }
    let continues = replay_log(&store, log.records, log.trusted);
    if continuity && !continues {
        // Revisions a client saw may be missing from what was restored:
        // continue above every one that could have been issued.
        // Without a snapshot the store started there already.
        let start = match restored_revision {
            Some(_) => start_revision(
                true,
                &Known {
                    snapshot: Some(store.current_revision()),
                    ..known
                },
                wall_ms,
            ),
            None => start,
        };
        store
            .resume_above(start)
            .map_err(|e| format!("cannot move the restored store's revision up: {e}"))?;
    }
    let mut changed_outside_log = !continues;
    if continuity {
        let key = Bytes::from_static(COMPACT_REV_KEY.as_bytes());
        let existing = store
            .range(&RangeRequest {
                key: key.clone(),
                ..Default::default()
            })
            .map_err(|e| e.to_string())?;
        if existing.kvs.is_empty() {
            let start = store.current_revision();
            store
                .put(PutRequest {
                    key,
                    value: Bytes::from(start.to_string()),
                    ..Default::default()
                })
                .map_err(|e| e.to_string())?;
            changed_outside_log = true;
        }
        if continues {
            tracing::info!(
                revision = store.current_revision(),
                "the write-ahead log holds every acknowledged write: revisions continue where \
                 they stopped"
            );
        } else {
            tracing::info!(
                start_revision = store.current_revision(),
                "revisions continue above every earlier run; older ones read as compacted"
            );
        }
    }
    let guard = RevisionGuard {
        dir: config.data_dir.clone(),
        state: RevisionState {
            used_up_to: store.current_revision().saturating_add(RESERVE_AHEAD),
            continuity,
            compact_rev_key: has_compact_rev_key(&store),
        },
        dirty: false,
    };
    if let Some(dir) = &guard.dir {
        persist::state::write(dir, &guard.state, wall_ms).map_err(|e| {
            format!(
                "cannot write the revision state {}: {e}",
                dir.join(persist::STATE_FILE).display()
            )
        })?;
    }
    if let (Some(dir), Some(_)) = (&guard.dir, &config.restore_snapshot) {
        // The restored state becomes the directory's first generation, so
        // a restart continues from it and not from the file again.
        let (rev, kvs) = store.live_kvs();
        let auth = store.auth().image(false);
        let leases = store.leases_for_snapshot();
        persist::write(dir, rev, &kvs, &leases, Some(&auth), wall_ms, None).map_err(|e| {
            format!(
                "cannot write the restored snapshot to {}: {e}",
                dir.display()
            )
        })?;
    }
    let wal = match (&config.data_dir, config.wal_mode()) {
        (Some(dir), mode) if mode != WalMode::None => Some(WalPlan {
            dir: crate::wal::dir_in(dir),
            mode,
            next_position: log.last_position + 1,
            snapshot_first: changed_outside_log,
        }),
        _ => None,
    };
    Ok(Boot { store, guard, wal })
}

/// What the log held for this start.
#[derive(Default)]
struct LogStart {
    /// The records after the restored snapshot, to replay.
    records: Vec<(Option<i64>, Replayed)>,
    /// The newest position among them (the snapshot's if none).
    last_position: u64,
    /// The snapshot and these records hold every acknowledged change.
    trusted: bool,
}

/// Reads the write-ahead log in `dir` after the restored snapshot's
/// position. A log that no restored snapshot continues (none was restored,
/// it was written without a log, or `--restore-snapshot` replaces the
/// state) is set aside whole, never replayed onto another state.
fn read_log(
    dir: &Path,
    restored: Option<&persist::Restored>,
    restoring_file: bool,
    mode: WalMode,
    wall_ms: i64,
) -> Result<LogStart, String> {
    let wal = crate::wal::dir_in(dir);
    let position = restored
        .and_then(|r| r.wal_position)
        .filter(|_| !restoring_file);
    let Some(position) = position else {
        set_aside_log(&wal, restoring_file, wall_ms)?;
        return Ok(LogStart::default());
    };
    let recovered = crate::wal::recover(&wal, position, &crate::wal::boot_id())
        .map_err(|e| format!("cannot read the write-ahead log in {}: {e}", wal.display()))?;
    for note in &recovered.notes {
        if recovered.trusted {
            tracing::warn!(dir = %wal.display(), "{note}");
        } else {
            tracing::error!(dir = %wal.display(), "{note}");
        }
    }
    for path in &recovered.damaged {
        let moved = persist::move_aside(path, wall_ms)
            .map_err(|e| format!("cannot move {} aside: {e}", path.display()))?;
        tracing::error!(
            path = %path.display(),
            moved_to = %moved.display(),
            "a write-ahead log segment is damaged or out of sequence: the changes after its \
             last whole record are LOST; moved aside"
        );
    }
    tracing::info!(
        dir = %wal.display(),
        from_position = position,
        records = recovered.records.len(),
        trusted = recovered.trusted,
        "read the write-ahead log"
    );
    if mode == WalMode::None {
        // Replayed now; with no log from here on, later snapshots do not
        // continue it.
        let moved = persist::move_aside(&wal, wall_ms)
            .map_err(|e| format!("cannot move {} aside: {e}", wal.display()))?;
        tracing::warn!(
            moved_to = %moved.display(),
            "--wal none: the previous run's write-ahead log is replayed and moved aside"
        );
    }
    Ok(LogStart {
        records: recovered.records,
        last_position: recovered.last_position,
        trusted: recovered.trusted,
    })
}

/// Moves a log directory that no snapshot continues aside (never removed).
fn set_aside_log(wal: &Path, restoring_file: bool, wall_ms: i64) -> Result<(), String> {
    let has_segments = std::fs::read_dir(wal).is_ok_and(|mut d| d.next().is_some());
    if !has_segments {
        return Ok(());
    }
    let moved = persist::move_aside(wal, wall_ms)
        .map_err(|e| format!("cannot move {} aside: {e}", wal.display()))?;
    if restoring_file {
        tracing::warn!(
            moved_to = %moved.display(),
            "--restore-snapshot replaces the state: the write-ahead log of the previous state \
             was moved aside"
        );
    } else {
        tracing::error!(
            moved_to = %moved.display(),
            "the write-ahead log continues no snapshot that could be restored (the snapshot it \
             continues is damaged or missing, or was written without a log): its changes are \
             LOST; moved aside"
        );
    }
    Ok(())
}

/// Replays the log's records; whether the store is now exactly where the
/// previous run left it (a trusted log, replayed to its end).
fn replay_log(store: &Store, records: Vec<(Option<i64>, Replayed)>, trusted: bool) -> bool {
    let total = records.len();
    for (n, (revision, record)) in records.into_iter().enumerate() {
        if let Err(e) = store.replay(revision, record) {
            tracing::error!(
                record = n,
                of = total,
                error = %e,
                "replaying the write-ahead log diverged: the changes from this record on are \
                 LOST"
            );
            return false;
        }
    }
    trusted
}

/// The store of a cluster member: empty at revision 1, as etcd's, with
/// nothing written at start (every write must come through the Raft log:
/// with revision continuity the first leader proposes the initial
/// revision, which also creates `compact_rev_key`; `initial.rs`).
/// A member that resumes saved state (`--data-dir` with
/// `--force-new-cluster`) gets it from [`resume_cluster_store`].
pub(super) fn build_cluster_store(config: &Config, member_id: u64, bounds: SpaceBounds) -> Store {
    let adopt = (config.lease_adopt_unknown_ttl > 0).then_some(config.lease_adopt_unknown_ttl);
    Store::new(StoreConfig {
        max_txn_ops: config.max_txn_ops,
        initial_revision: 1,
        lessor: LessorConfig {
            adopt_unknown_ttl: adopt,
            ..LessorConfig::default()
        },
        quota_bytes: bounds.quota_bytes,
        memory_bound_bytes: bounds.memory_bound_bytes,
        member_id,
        auth: config.auth.auth_config(),
    })
}

/// Cluster mode with `--data-dir`: this member's saved state, if any
/// (`cluster/member/saved_state.rs`), of the cluster its files belong to
/// ([`files_cluster_id`]).
pub(super) fn load_saved(config: &Config) -> Result<Option<Saved>, String> {
    match (&config.cluster, &config.data_dir) {
        (Some(_), Some(dir)) => {
            crate::cluster::member::saved_state::load(dir, files_cluster_id(config)?)
        }
        _ => Ok(None),
    }
}

/// The cluster ID a member's files are named by: the cluster its Raft log
/// directory names, when its data dir holds one, as etcd takes its
/// cluster from its data dir and not from `--initial-cluster` (a member
/// that joined a running cluster got that cluster's ID, which its
/// `--initial-cluster` does not give; nor does an `--initial-cluster`
/// that has since been made to list an added member); otherwise the one
/// `--initial-cluster` gives. 0 outside cluster mode.
fn files_cluster_id(config: &Config) -> Result<u64, String> {
    let (Some(c), Some(dir)) = (&config.cluster, &config.data_dir) else {
        return Ok(0);
    };
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(c.cluster_id()),
        Err(e) => return Err(format!("cannot read --data-dir {}: {e}", dir.display())),
    };
    let ids: Vec<u64> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let hex = name.strip_prefix("raft-log-")?;
            (hex.len() == 16).then(|| u64::from_str_radix(hex, 16).ok())?
        })
        .collect();
    match ids[..] {
        [id] => Ok(id),
        [] => Ok(c.cluster_id()),
        _ => Err(format!(
            "--data-dir {} holds the raft logs of {} clusters; keep the one this member \
             belongs to",
            dir.display(),
            ids.len()
        )),
    }
}

/// Cluster mode with `--data-dir`: where the member's Raft log is and how
/// it is written (`--wal`; with `none` an earlier log is only set aside).
pub(super) fn raft_log_settings(
    config: &Config,
) -> Option<crate::cluster::member::restart::LogSettings> {
    let (Some(c), Some(dir)) = (&config.cluster, &config.data_dir) else {
        return None;
    };
    let cluster_id = files_cluster_id(config).unwrap_or_else(|_| c.cluster_id());
    Some(crate::cluster::member::restart::LogSettings {
        cluster_id,
        dir: crate::wal::raft_log_dir(dir, cluster_id),
        mode: config.wal_mode(),
        boot_id: crate::wal::boot_id(),
    })
}

/// What a cluster member started with `boot` keeps in `--data-dir`: its
/// saved state's files and, unless `--wal none`, its Raft log, continuing
/// `earlier` when it restarts from it.
pub(super) fn cluster_disk(
    config: &Config,
    boot: &crate::cluster::Boot,
    settings: Option<crate::cluster::member::restart::LogSettings>,
    earlier: Option<crate::wal::RecoveredRaftLog>,
) -> Option<crate::cluster::member::restart::Disk> {
    let dir = config.data_dir.clone()?;
    // Restarting from its log, the member's saved state is on disk and
    // never written over by an older one; otherwise it starts anew.
    let newest = boot
        .log
        .as_ref()
        .map(|_| boot.resume.map_or(0, |(index, _)| index));
    Some(crate::cluster::member::restart::Disk {
        files: std::sync::Arc::new(crate::cluster::member::saved_state::SavedFiles::new(
            dir.clone(),
            boot.cluster_id,
            newest,
        )),
        // Named by the cluster the member runs in (a joined member's is
        // not the one its --initial-cluster gives).
        log: settings
            .filter(|s| s.mode != crate::wal::WalMode::None)
            .map(|s| {
                let s = crate::cluster::member::restart::LogSettings {
                    cluster_id: boot.cluster_id,
                    dir: crate::wal::raft_log_dir(&dir, boot.cluster_id),
                    ..s
                };
                (s, earlier)
            }),
    })
}

/// Puts `saved` into the new (empty) store of a member forced into a new
/// cluster: the whole MVCC state and the auth state. With revision
/// continuity the store then jumps to the wall-clock revision a new
/// cluster starts at, so revisions continue above every one the old
/// cluster could have issued after the state was saved, as a single
/// member's do after a restart (`revisions.rs`). The member is alone in
/// its cluster, so this needs no log entry: members added later catch up
/// by snapshot.
pub(super) fn resume_cluster_store(
    store: &Store,
    saved: Option<Saved>,
    forced_tail: &[raft::prelude::Entry],
    continuity: bool,
) -> Result<(), String> {
    let from = match saved {
        Some(saved) => {
            let auth = match saved.snapshot.sections.auth.as_deref() {
                Some(bytes) => crate::auth::AuthImage::decode(bytes)
                    .map_err(|e| format!("{}: its auth state: {e}", saved.path.display()))?,
                None => crate::auth::AuthImage::pristine(),
            };
            store.install_image(saved.snapshot.image);
            store.auth().install(auth);
            saved.path.display().to_string()
        }
        None => "no saved state".to_string(),
    };
    crate::cluster::replay_forced_tail(store, forced_tail);
    if continuity {
        let revision = crate::persist::wall_clock_ms().saturating_mul(REVISIONS_PER_MS);
        store
            .resume_above(revision)
            .map_err(|e| format!("cannot move the resumed store's revision up: {e}"))?;
    }
    tracing::info!(
        revision = store.current_revision(),
        from = %from,
        log_entries = forced_tail.len(),
        "resumed the saved cluster state"
    );
    Ok(())
}

#[cfg(test)]
#[path = "bootstrap_tests.rs"]
mod tests;

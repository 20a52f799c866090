//! A member restarting from its own disk, as an etcd member does: its
//! saved state (`saved.rs`) and, after it, its Raft log (`wal::RaftLog`:
//! entries, term, vote). When the log can be trusted to hold everything
//! the member acknowledged and voted for, the member starts under the ID
//! it ran as, with its votes and entries, without asking anyone: a
//! cluster whose members all come back this way (a whole-cluster restart,
//! two of three killed) forms again by itself with every committed entry,
//! as Raft guarantees for members that never forget.
//!
//! A log that cannot be trusted (written without syncing before this
//! machine's last boot, damaged, not continuing the saved state, or
//! another cluster's) is set aside, never deleted, and the member takes
//! the path of a member without one (`join.rs`): it never votes or
//! acknowledges under its old ID again.

use super::members::{Boot, LoggedRaft};
use super::membership::Membership;
use super::saved::Saved;
use crate::config::ClusterConfig;
use crate::wal::{self, RecoveredRaftLog, WalMode};
use std::path::{Path, PathBuf};

/// Where a member's Raft log is written and how.
#[derive(Debug, Clone)]
pub struct LogSettings {
    /// The log's directory (`wal::raft_log_dir`).
    pub dir: PathBuf,
    /// `--wal`.
    pub mode: WalMode,
    /// This machine's boot ID.
    pub boot_id: String,
}

/// What a cluster member keeps in `--data-dir` while it runs: its saved
/// state's files, and its Raft log unless `--wal none`.
pub struct Disk {
    /// The saved state's files.
    pub files: std::sync::Arc<super::saved::SavedFiles>,
    /// Where the log goes, and what an earlier run left of it that this
    /// run continues (from [`from_log`]).
    pub log: Option<(LogSettings, Option<RecoveredRaftLog>)>,
}

/// A member's restart from its log: what its node starts with, and where
/// its log continues.
pub struct Restart {
    /// What its node starts with.
    pub boot: Boot,
    /// The log as read (its segments are kept until covered).
    pub log: RecoveredRaftLog,
}

/// The restart the log in `settings` allows after `saved`, if any. A log
/// that is not used is set aside (renamed, with a WARN saying why), so
/// the new log of this run starts clean; `Err` only when that fails.
pub fn from_log(
    config: &ClusterConfig,
    settings: &LogSettings,
    saved: Option<&Saved>,
    client_urls: Vec<String>,
) -> Result<Option<Restart>, String> {
    let read = wal::recover_raft_log(&settings.dir, &settings.boot_id)
        .map_err(|e| format!("cannot read the raft log in {}: {e}", settings.dir.display()))?;
    let Some(log) = read else {
        return Ok(None);
    };
    let usable = match usable(config, settings, saved, &log) {
        Ok(usable) => usable,
        Err(why) => {
            let aside = set_aside(&settings.dir)?;
            tracing::warn!(
                log = %settings.dir.display(),
                moved_to = %aside.display(),
                reason = %why,
                notes = ?log.notes,
                "the raft log is not used: this member starts as one without it and never \
                 votes or acknowledges under the ID it wrote the log as"
            );
            return Ok(None);
        }
    };
    let (identity, membership, base, entries) = usable;
    for note in &log.notes {
        tracing::info!(log = %settings.dir.display(), note = %note, "raft log repaired");
    }
    let me = membership.get(identity.member_id);
    tracing::info!(
        member_id = %format_args!("{:x}", identity.member_id),
        saved_index = base.0,
        entries = entries.len(),
        term = log.hard_state.term,
        commit = log.hard_state.commit,
        "restarting from this member's saved state and raft log, under its own ID"
    );
    let boot = Boot {
        id: identity.member_id,
        cluster_id: identity.cluster_id,
        promote: me.is_some_and(|m| m.is_learner) && !config.existing,
        initial: membership.clone(),
        current: membership,
        name: config.name.clone(),
        client_urls,
        resume: (base.0 > 0).then_some(base),
        log: Some(LoggedRaft {
            hard_state: log.hard_state.clone(),
            entries,
        }),
    };
    Ok(Some(Restart { boot, log }))
}

type Usable = (wal::Identity, Membership, (u64, u64), Vec<raft::prelude::Entry>);

/// The log's identity, the membership at the saved state, the saved
/// state's index and term, and the entries after it; or why the log
/// cannot restart this member.
fn usable(
    config: &ClusterConfig,
    settings: &LogSettings,
    saved: Option<&Saved>,
    log: &RecoveredRaftLog,
) -> Result<Usable, String> {
    if settings.mode == WalMode::None {
        return Err("--wal none: a log kept would be stale after this run".into());
    }
    if config.force_new_cluster {
        return Err("--force-new-cluster starts a new cluster from the saved state".into());
    }
    if !log.trusted {
        return Err(format!("it may miss what this member acknowledged: {}", log.notes.join("; ")));
    }
    let identity = log.identity.ok_or("it does not say whose it is")?;
    if identity.cluster_id != config.cluster_id() {
        return Err(format!(
            "it belongs to cluster {:x}, not {:x}",
            identity.cluster_id,
            config.cluster_id()
        ));
    }
    let (base, membership) = match saved {
        Some(s) => (
            (s.snapshot.raft_index, s.snapshot.raft_term),
            s.membership()
                .ok_or_else(|| format!("{} holds no member list", s.path.display()))?,
        ),
        None if identity.member_id == config.member_id() => ((0, 0), Membership::initial(config)),
        None => return Err("no saved state holds the member list it continues".into()),
    };
    if log.hard_state.term < base.1 {
        return Err(format!(
            "its term {} is older than the saved state's {}",
            log.hard_state.term, base.1
        ));
    }
    let entries = log.after(base.0, base.1)?;
    Ok((identity, membership, base, entries))
}

/// Renames `dir` to `<dir>.set-aside-<unix seconds>`; returns the new name.
pub fn set_aside(dir: &Path) -> Result<PathBuf, String> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut aside = PathBuf::from(format!("{}.set-aside-{secs}", dir.display()));
    let mut n = 1;
    while aside.exists() {
        aside = PathBuf::from(format!("{}.set-aside-{secs}-{n}", dir.display()));
        n += 1;
    }
    std::fs::rename(dir, &aside)
        .map_err(|e| format!("cannot move the raft log {} aside: {e}", dir.display()))?;
    Ok(aside)
}

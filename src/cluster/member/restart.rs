//! A member restarting from its own disk, as an etcd member does: its
//! saved state (`saved_state.rs`) and, after it, its Raft log (`wal::RaftLog`:
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

use crate::cluster::member::applied_membership::{Boot, LoggedRaft};
use crate::cluster::member::saved_state::Saved;
use crate::cluster::replicated::member_list::Membership;
use crate::config::ClusterConfig;
use crate::wal::{self, RecoveredRaftLog, WalMode};
use std::path::{Path, PathBuf};

/// Where a member's Raft log is written and how.
#[derive(Debug, Clone)]
pub struct LogSettings {
    /// The cluster whose log it is: the one `--initial-cluster` gives, or
    /// for a member that joined a running cluster, the one its files name.
    pub cluster_id: u64,
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
    pub files: std::sync::Arc<crate::cluster::member::saved_state::SavedFiles>,
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
    let read = wal::recover_raft_log(&settings.dir, &settings.boot_id).map_err(|e| {
        format!(
            "cannot read the raft log in {}: {e}",
            settings.dir.display()
        )
    })?;
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

/// What a member started with `--force-new-cluster` carries over from its
/// Raft log, as etcd keeps the committed entries of its WAL: the entries
/// after `saved` up to the log's commit index, when the log is trusted and
/// continues `saved` (none otherwise, with a WARN saying why). The
/// entries it held beyond the commit index were never acknowledged, and
/// are dropped as etcd drops them. The log is set aside in every case: the
/// new cluster's log starts clean.
pub fn forced_tail(
    config: &ClusterConfig,
    settings: &LogSettings,
    saved: Option<&Saved>,
) -> Result<Vec<raft::prelude::Entry>, String> {
    let read = wal::recover_raft_log(&settings.dir, &settings.boot_id).map_err(|e| {
        format!(
            "cannot read the raft log in {}: {e}",
            settings.dir.display()
        )
    })?;
    let Some(log) = read else {
        return Ok(Vec::new());
    };
    let tail = continuing(config, settings, saved, &log).map(|(_, _, _, mut entries)| {
        entries.retain(|e| e.index <= log.hard_state.commit);
        entries
    });
    let aside = set_aside(&settings.dir)?;
    match tail {
        Ok(entries) => {
            tracing::warn!(
                log = %settings.dir.display(),
                moved_to = %aside.display(),
                entries = entries.len(),
                commit = log.hard_state.commit,
                "--force-new-cluster carries the committed entries of this member's raft \
                 log after its saved state into the new cluster"
            );
            Ok(entries)
        }
        Err(why) => {
            tracing::warn!(
                log = %settings.dir.display(),
                moved_to = %aside.display(),
                reason = %why,
                notes = ?log.notes,
                "the raft log is not used by --force-new-cluster: the new cluster starts from \
                 the saved state alone"
            );
            Ok(Vec::new())
        }
    }
}

type Usable = (
    wal::Identity,
    Membership,
    (u64, u64),
    Vec<raft::prelude::Entry>,
);

/// The log's identity, the membership at the saved state, the saved
/// state's index and term, and the entries after it; or why the log
/// cannot restart this member.
fn usable(
    config: &ClusterConfig,
    settings: &LogSettings,
    saved: Option<&Saved>,
    log: &RecoveredRaftLog,
) -> Result<Usable, String> {
    if config.force_new_cluster {
        return Err("--force-new-cluster starts a new cluster (forced_tail)".into());
    }
    continuing(config, settings, saved, log)
}

/// [`usable`] apart from `--force-new-cluster`: the log's identity, the
/// membership at the saved state, its index and term, and the entries
/// after it; or why the log cannot be trusted to continue `saved`.
fn continuing(
    config: &ClusterConfig,
    settings: &LogSettings,
    saved: Option<&Saved>,
    log: &RecoveredRaftLog,
) -> Result<Usable, String> {
    if settings.mode == WalMode::None {
        return Err("--wal none: a log kept would be stale after this run".into());
    }
    if !log.trusted {
        return Err(format!(
            "it may miss what this member acknowledged: {}",
            log.notes.join("; ")
        ));
    }
    let identity = log.identity.ok_or("it does not say whose it is")?;
    if identity.cluster_id != settings.cluster_id {
        return Err(format!(
            "it belongs to cluster {:x}, not {:x}",
            identity.cluster_id, settings.cluster_id
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mvcc::snapshot::{Sections, Snapshot};
    use crate::mvcc::StoreImage;
    use crate::wal::{Identity, RaftLog, RaftLogStart};
    use raft::prelude::{Entry, HardState};

    fn config() -> ClusterConfig {
        ClusterConfig::for_tests(&["m0", "m1", "m2"], "m1")
    }

    fn settings(dir: &Path, mode: WalMode, boot: &str) -> LogSettings {
        LogSettings {
            cluster_id: config().cluster_id(),
            dir: dir.join("raft-log"),
            mode,
            boot_id: boot.into(),
        }
    }

    /// A log of `config`'s member with entries 1..=last in term 2.
    fn write_log(s: &LogSettings, c: &ClusterConfig, last: u64) {
        write_log_committed(s, c, last, last);
    }

    /// [`write_log`] with the commit index at `commit`.
    fn write_log_committed(s: &LogSettings, c: &ClusterConfig, last: u64, commit: u64) {
        let hs = HardState {
            term: 2,
            vote: c.member_id(),
            commit,
            ..Default::default()
        };
        let mut log = RaftLog::start(
            RaftLogStart {
                dir: s.dir.clone(),
                mode: s.mode,
                boot_id: s.boot_id.clone(),
                identity: Identity {
                    member_id: c.member_id(),
                    cluster_id: c.cluster_id(),
                },
                hard_state: HardState::default(),
                next_position: 1,
                kept: Vec::new(),
            },
            1 << 20,
        )
        .unwrap();
        let entries: Vec<Entry> = (1..=last)
            .map(|index| Entry {
                index,
                term: 2,
                ..Default::default()
            })
            .collect();
        log.append(&entries);
        log.hard_state(&hs);
        log.flush();
    }

    fn saved_at(c: &ClusterConfig, index: u64, term: u64) -> Saved {
        Saved {
            snapshot: Snapshot {
                raft_index: index,
                raft_term: term,
                image: StoreImage {
                    revision: 10,
                    compacted: -1,
                    ..Default::default()
                },
                sections: Sections {
                    members: Some(Membership::initial(c).encode()),
                    auth: None,
                },
            },
            path: "/d/ephd-cluster.snap".into(),
            written_unix: 1,
            handed_out: Default::default(),
        }
    }

    #[test]
    fn a_forced_member_carries_the_committed_entries_after_its_saved_state_and_sets_the_log_aside()
    {
        let dir = tempfile::tempdir().unwrap();
        let c = ClusterConfig {
            force_new_cluster: true,
            ..config()
        };
        let s = settings(dir.path(), WalMode::Buffered, "boot-1");
        write_log_committed(&s, &c, 9, 7);
        let tail = forced_tail(&c, &s, Some(&saved_at(&c, 4, 2))).unwrap();
        let indexes: Vec<u64> = tail.iter().map(|e| e.index).collect();
        assert_eq!(indexes, [5, 6, 7], "committed entries only");
        assert!(!s.dir.exists(), "the log is set aside");
        // An untrusted log (another boot, buffered) carries nothing.
        let s = settings(dir.path(), WalMode::Buffered, "boot-1");
        write_log_committed(&s, &c, 9, 7);
        let other_boot = settings(dir.path(), WalMode::Buffered, "boot-2");
        let tail = forced_tail(&c, &other_boot, Some(&saved_at(&c, 4, 2))).unwrap();
        assert!(tail.is_empty());
        assert!(!s.dir.exists(), "the untrusted log is set aside too");
    }

    #[test]
    fn a_trusted_log_restarts_the_member_under_its_id_with_the_entries_after_the_saved_state() {
        let dir = tempfile::tempdir().unwrap();
        let c = config();
        let s = settings(dir.path(), WalMode::Buffered, "boot-1");
        write_log(&s, &c, 9);
        let restart = from_log(&c, &s, Some(&saved_at(&c, 4, 2)), vec![])
            .unwrap()
            .expect("restarts from its log");
        assert_eq!(restart.boot.id, c.member_id());
        assert_eq!(restart.boot.resume, Some((4, 2)));
        let log = restart.boot.log.unwrap();
        assert_eq!(log.hard_state.vote, c.member_id());
        let indexes: Vec<u64> = log.entries.iter().map(|e| e.index).collect();
        assert_eq!(indexes, [5, 6, 7, 8, 9]);
        // Without a saved state, the log continues the initial cluster.
        let restart = from_log(&c, &s, None, vec![]).unwrap().unwrap();
        assert_eq!(restart.boot.resume, None);
        assert_eq!(restart.boot.log.unwrap().entries.len(), 9);
    }

    #[test]
    fn a_log_that_cannot_be_trusted_is_set_aside_and_not_used() {
        let c = config();
        for (why, mode, reader_boot, saved) in [
            (
                "another boot, buffered",
                WalMode::Buffered,
                "boot-2",
                Some((4, 2)),
            ),
            ("--wal none now", WalMode::None, "boot-1", Some((4, 2))),
            (
                "another term at the saved index",
                WalMode::Buffered,
                "boot-1",
                Some((4, 3)),
            ),
            (
                "a saved state past the log's end",
                WalMode::Buffered,
                "boot-1",
                Some((20, 2)),
            ),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let written = settings(dir.path(), WalMode::Buffered, "boot-1");
            write_log(&written, &c, 9);
            let s = LogSettings {
                mode,
                boot_id: reader_boot.into(),
                ..written.clone()
            };
            let saved = saved.map(|(i, t)| saved_at(&c, i, t));
            let restart = from_log(&c, &s, saved.as_ref(), vec![]).unwrap();
            assert!(restart.is_none(), "{why}: used");
            assert!(!s.dir.exists(), "{why}: left in place");
            let aside = std::fs::read_dir(dir.path())
                .unwrap()
                .filter(|e| {
                    e.as_ref()
                        .unwrap()
                        .file_name()
                        .to_string_lossy()
                        .contains("set-aside")
                })
                .count();
            assert_eq!(aside, 1, "{why}");
        }
        // Another cluster's log (another token) is not this member's.
        let dir = tempfile::tempdir().unwrap();
        let s = settings(dir.path(), WalMode::Buffered, "boot-1");
        write_log(&s, &c, 3);
        let other = LogSettings {
            cluster_id: c.cluster_id() ^ 1,
            ..s.clone()
        };
        assert!(from_log(&c, &other, None, vec![]).unwrap().is_none());
        // No log at all: nothing to restart from, nothing moved.
        let empty = tempfile::tempdir().unwrap();
        let s = settings(empty.path(), WalMode::Buffered, "boot-1");
        assert!(from_log(&c, &s, None, vec![]).unwrap().is_none());
    }
}

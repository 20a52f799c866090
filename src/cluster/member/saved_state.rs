//! `--data-dir` in cluster mode: each member keeps a copy of its applied
//! state on disk, so a cluster whose every member stopped (a whole-cluster
//! restart, a power loss) can resume from it instead of starting empty.
//!
//! # What is written
//! One file per cluster, `ephd-cluster-<cluster ID, 16 hex digits>.snap`,
//! in the format a Raft snapshot has on the wire (`mvcc::snapshot`: the
//! whole MVCC state with its history since the last compaction, leases
//! with their remaining time, alarms, the member list and the auth state,
//! checksummed and read all or nothing). It is captured on the apply
//! thread every `--snapshot-interval` and once more when the member stops
//! (SIGTERM), written to a temporary file, fsynced and renamed into place;
//! the file it replaces is kept as `<name>.prev`. A file that does not
//! read whole is renamed `<name>.corrupt-<unix seconds>` (never removed)
//! and the previous one is tried.
//!
//! # What is not
//! Raft's own state (its log, term and vote): written only now and then,
//! it would be stale, and a member voting or acknowledging from a stale
//! Raft state could elect two leaders or lose committed entries. So a
//! saved state is never used to rejoin a running cluster (the member
//! catches up from the leader as a member restarted without state does,
//! `rejoin.rs`), and a whole cluster resumes from ONE file: by itself
//! through the first member of `--initial-cluster` once a majority waits,
//! from the newest file among the waiting members (`resume.rs`,
//! `newest_saved_state.rs`: a newer file is fetched and installed as the first
//! member's own), or through the member an operator starts with
//! `--force-new-cluster` (`force.rs`, its own file). That member's
//! cluster holds the state (with a fresh revision above every earlier one
//! when `--revision-continuity` is on) and the others catch up from it.
//! Every write after the chosen file was written is lost, as a crash
//! loses the writes after the last `--data-dir` snapshot in single-member
//! mode.

use crate::cluster::member::applied_membership::{Boot, Members};
use crate::cluster::replicated::member_list::Membership;
use crate::mvcc::snapshot::{self, Snapshot};
use crate::mvcc::Store;
use raft::prelude::{Snapshot as RaftSnapshot, SnapshotMetadata};
use raft::storage::MemStorage;
use std::fs::{self, File};
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// A member's saved state, read whole from its data directory.
#[derive(Debug)]
pub struct Saved {
    /// The state: store, members, auth, and the Raft index and term it
    /// was captured at.
    pub snapshot: Snapshot,
    /// The file it was read from.
    pub path: PathBuf,
    /// When the file was written (seconds since the Unix epoch; 0 when the
    /// file system does not say).
    pub written_unix: u64,
    /// When a piece of the file was last handed out to a member fetching
    /// it (`saved_state_pieces.rs`).
    pub handed_out: crate::cluster::member::saved_state_pieces::HandedOut,
}

impl Saved {
    /// One line for logs and refusals: what the file holds.
    pub fn describe(&self) -> String {
        format!(
            "{} (revision {}, raft index {}, term {}, written at unix time {})",
            self.path.display(),
            self.snapshot.image.revision,
            self.snapshot.raft_index,
            self.snapshot.raft_term,
            self.written_unix
        )
    }

    /// The member list the state holds, if it decodes.
    pub(in crate::cluster) fn membership(&self) -> Option<Membership> {
        Membership::decode(self.snapshot.sections.members.as_deref()?).ok()
    }
}

/// The applied state at `index` (term `term`), on the apply thread (the
/// only writer, so the store does not change meanwhile).
pub(in crate::cluster) fn capture(
    store: &Store,
    members: &Members,
    index: u64,
    term: u64,
) -> Snapshot {
    Snapshot {
        raft_index: index,
        raft_term: term,
        image: store.image(),
        sections: crate::cluster::member::snapshot_sections::capture(store, members),
    }
}

/// The Raft storage a member starts with: the configuration its log
/// starts from, and for a member resuming saved state (`Boot::resume`) a
/// snapshot at the saved index, so its log continues after it.
pub(in crate::cluster) fn storage(boot: &Boot) -> MemStorage {
    let mem = MemStorage::new_with_conf_state(boot.initial.conf_state());
    if let Some((index, term)) = boot.resume {
        let mut meta = SnapshotMetadata {
            index,
            term,
            ..Default::default()
        };
        meta.set_conf_state(boot.initial.conf_state());
        let mut snap = RaftSnapshot::default();
        snap.set_metadata(meta);
        // Only fails for a snapshot older than the storage's: it is empty.
        let _ = mem.wl().apply_snapshot(snap);
    }
    if let Some(log) = &boot.log {
        let base = boot.resume.map_or(0, |(index, _)| index);
        if let Err(e) = mem.wl().append(&log.entries) {
            tracing::error!(error = %e, "cannot restore the raft log's entries");
        }
        let mut hard_state = log.hard_state.clone();
        hard_state.commit = hard_state.commit.max(base);
        mem.wl().set_hardstate(hard_state);
    }
    mem
}

/// A member's saved-state files while it runs: writes one at a time
/// (the periodic save, a snapshot installed from the leader and the last
/// save at shutdown all write the same file), never an older state over a
/// newer one, and tells the Raft log which entries the files on disk
/// cover. Both the current file and `.prev` (read when the current one is
/// damaged) must cover an entry before the log drops it.
pub struct SavedFiles {
    dir: PathBuf,
    cluster_id: u64,
    /// The Raft index of the current file and of `.prev`, as written in
    /// this run (`None`: not known).
    written: parking_lot::Mutex<(Option<u64>, Option<u64>)>,
    /// Where the covered index goes (the Raft log's, `wal::RaftLog`).
    covered: std::sync::OnceLock<std::sync::Arc<std::sync::atomic::AtomicU64>>,
}

impl SavedFiles {
    /// The files of cluster `cluster_id` in `dir`; `newest`: the index of
    /// the file read at start.
    pub fn new(dir: PathBuf, cluster_id: u64, newest: Option<u64>) -> SavedFiles {
        SavedFiles {
            dir,
            cluster_id,
            written: parking_lot::Mutex::new((newest, None)),
            covered: std::sync::OnceLock::new(),
        }
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Reports the covered index to `covered` from now on.
    pub(in crate::cluster) fn report_covered_to(
        &self,
        covered: std::sync::Arc<std::sync::atomic::AtomicU64>,
    ) {
        let _ = self.covered.set(covered);
    }

    /// Writes `snap` unless a newer state is on disk already; the bytes
    /// written, `None` when skipped.
    pub fn write(&self, snap: &Snapshot) -> io::Result<Option<u64>> {
        self.write_encoded(snap.raft_index, &snapshot::encode(snap))
    }

    /// Writes an encoded snapshot (`mvcc::snapshot` format, the bytes a
    /// Raft snapshot carries) of index `index`, as [`SavedFiles::write`].
    pub fn write_encoded(&self, index: u64, bytes: &[u8]) -> io::Result<Option<u64>> {
        let mut written = self.written.lock();
        if written.0.is_some_and(|newest| newest > index) {
            return Ok(None);
        }
        fs::create_dir_all(&self.dir)?;
        let tmp = self.dir.join(format!("{}.tmp", file_name(self.cluster_id)));
        {
            let mut f = File::create(&tmp)?;
            f.write_all(bytes)?;
            f.sync_all()?;
        }
        install(&self.dir, self.cluster_id, &tmp)?;
        let previous = written.0;
        *written = (Some(index), previous);
        if let (Some(covered), Some(previous)) = (self.covered.get(), previous) {
            covered.store(previous, std::sync::atomic::Ordering::Release);
        }
        Ok(Some(bytes.len() as u64))
    }
}

/// The file name of cluster `cluster_id`'s saved state.
pub fn file_name(cluster_id: u64) -> String {
    format!("ephd-cluster-{cluster_id:016x}.snap")
}

/// Writes `snap` as cluster `cluster_id`'s saved state in `dir`
/// (temporary file, fsync, rename, directory fsync; the replaced file
/// kept as `.prev`). Returns the number of bytes written.
#[cfg(test)]
pub fn write(dir: &Path, cluster_id: u64, snap: &Snapshot) -> io::Result<u64> {
    let files = SavedFiles::new(dir.to_path_buf(), cluster_id, None);
    Ok(files.write(snap)?.unwrap_or(0))
}

/// Makes `tmp` (a complete file in `dir`, already fsynced) cluster
/// `cluster_id`'s saved state: the current file, if any, becomes `.prev`,
/// `tmp` is renamed into place and the directory fsynced. Returns the
/// file's path.
pub fn install(dir: &Path, cluster_id: u64, tmp: &Path) -> io::Result<PathBuf> {
    let name = file_name(cluster_id);
    let path = dir.join(&name);
    if path.exists() {
        fs::rename(&path, dir.join(format!("{name}.prev")))?;
    }
    fs::rename(tmp, &path)?;
    File::open(dir)?.sync_all()?;
    Ok(path)
}

/// Reads and checks the saved state in `path` (a file fetched from
/// another member, before it is installed): decoded whole, every record's
/// and the whole file's checksum verified, or an error. Nothing is moved.
pub fn read(path: &Path) -> Result<Saved, String> {
    let bytes = fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let snapshot = snapshot::decode(&bytes).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(Saved {
        snapshot,
        path: path.to_path_buf(),
        written_unix: modified_unix(path),
        handed_out: Default::default(),
    })
}

/// When `path` was last written (seconds since the Unix epoch; 0 when
/// the file system does not say).
fn modified_unix(path: &Path) -> u64 {
    fs::metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs())
}

/// Reads cluster `cluster_id`'s saved state from `dir`: the newest file
/// that reads whole, `None` when there is none. A damaged file is moved
/// aside (and said in the log) and the previous one tried; an I/O error
/// other than "not found" is an error (the operator must look).
pub fn load(dir: &Path, cluster_id: u64) -> Result<Option<Saved>, String> {
    let name = file_name(cluster_id);
    for path in [dir.join(&name), dir.join(format!("{name}.prev"))] {
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
        };
        match snapshot::decode(&bytes) {
            Ok(snapshot) => {
                let written_unix = modified_unix(&path);
                return Ok(Some(Saved {
                    snapshot,
                    path,
                    written_unix,
                    handed_out: Default::default(),
                }));
            }
            Err(why) => {
                let secs = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs());
                let aside = PathBuf::from(format!("{}.corrupt-{secs}", path.display()));
                fs::rename(&path, &aside)
                    .map_err(|e| format!("cannot move {} aside: {e}", path.display()))?;
                tracing::error!(
                    file = %path.display(),
                    moved_to = %aside.display(),
                    reason = %why,
                    "the saved cluster state is damaged; trying the previous one"
                );
            }
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mvcc::snapshot::Sections;
    use crate::mvcc::StoreImage;

    fn snap(revision: i64, index: u64) -> Snapshot {
        Snapshot {
            raft_index: index,
            raft_term: 3,
            image: StoreImage {
                revision,
                compacted: -1,
                ..Default::default()
            },
            sections: Sections {
                members: Some(vec![1, 2, 3]),
                auth: None,
            },
        }
    }

    #[test]
    fn the_newest_write_is_read_back_and_the_one_before_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        assert!(load(dir.path(), 7).unwrap().is_none());
        write(dir.path(), 7, &snap(5, 10)).unwrap();
        write(dir.path(), 7, &snap(9, 20)).unwrap();
        let saved = load(dir.path(), 7).unwrap().unwrap();
        assert_eq!(saved.snapshot, snap(9, 20));
        assert!(saved
            .describe()
            .contains("revision 9, raft index 20, term 3"));
        assert!(dir.path().join(format!("{}.prev", file_name(7))).exists());
        // Another cluster's file is not this one's.
        assert!(load(dir.path(), 8).unwrap().is_none());
    }

    #[test]
    fn a_damaged_file_is_moved_aside_and_the_previous_one_read() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), 7, &snap(5, 10)).unwrap();
        write(dir.path(), 7, &snap(9, 20)).unwrap();
        let path = dir.path().join(file_name(7));
        let mut bytes = fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        fs::write(&path, &bytes).unwrap();
        let saved = load(dir.path(), 7).unwrap().unwrap();
        assert_eq!(saved.snapshot, snap(5, 10));
        let names: Vec<String> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            names.iter().any(|n| n.contains(".snap.corrupt-")),
            "{names:?}"
        );
        // Both damaged: nothing to resume from, and nothing removed.
        fs::write(dir.path().join(format!("{}.prev", file_name(7))), b"junk").unwrap();
        assert!(load(dir.path(), 7).unwrap().is_none());
        let corrupt = fs::read_dir(dir.path())
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .contains("corrupt")
            })
            .count();
        assert_eq!(corrupt, 2);
    }
}

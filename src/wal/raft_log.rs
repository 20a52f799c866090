//! A cluster member's Raft log on disk: the entries it appended, its hard
//! state (term, vote, commit) and the snapshots it installed from the
//! leader, written before the member acknowledges an entry or a vote, and
//! read back at start, so that a member restarts under its own ID with
//! its votes and entries, as an etcd member restarts from its disk.
//!
//! The Raft loop writes it itself, once per round ([`RaftLog::flush`]
//! before the messages that must wait for the disk are sent): a round
//! takes every proposal queued meanwhile, so one `write()` (and in `fsync`
//! mode one `fdatasync()`) covers all of them, a group commit without a
//! thread hop.
//!
//! Each segment begins with the member's identity and its hard state, so
//! a closed segment whose every entry a saved state covers can be removed
//! without losing either. Segments share the single member's format
//! (`segment.rs`); recovery shares its rules (`recover.rs`): a torn tail
//! is cut, damage in an older segment makes the log untrusted, and so does
//! a segment written without syncing before this machine's last boot.

use super::recover::walk;
use super::segment::{self, KIND_HARD_STATE, KIND_IDENTITY, KIND_RAFT_ENTRY, KIND_RAFT_SNAPSHOT};
use super::writer::{create_segment, write_until_in, Segment, WalMetrics};
use crate::config::WalMode;
use protobuf::Message as _;
use raft::prelude::{Entry, HardState, SnapshotMetadata};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Whose log it is: a member's entries and votes are its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity {
    /// The member's ID when it wrote the log.
    pub member_id: u64,
    /// Its cluster's ID.
    pub cluster_id: u64,
}

impl Identity {
    fn encode(&self) -> Vec<u8> {
        let mut out = self.member_id.to_le_bytes().to_vec();
        out.extend_from_slice(&self.cluster_id.to_le_bytes());
        out
    }

    fn decode(bytes: &[u8]) -> Result<Identity, String> {
        if bytes.len() != 16 {
            return Err(format!("an identity of {} bytes", bytes.len()));
        }
        Ok(Identity {
            member_id: u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")),
            cluster_id: u64::from_le_bytes(bytes[8..].try_into().expect("8 bytes")),
        })
    }
}

/// A segment kept from an earlier run (or closed in this one), with the
/// highest entry index it holds: it is removed once a saved state covers
/// that index.
#[derive(Debug, Clone)]
pub struct KeptSegment {
    /// The segment file.
    pub path: PathBuf,
    /// Its highest entry (or installed snapshot) index.
    pub newest_index: u64,
}

/// The Raft log being written.
pub struct RaftLog {
    dir: PathBuf,
    mode: WalMode,
    boot_id: String,
    identity: Identity,
    file: File,
    /// The current segment's length, header included.
    file_len: u64,
    segment_bytes: u64,
    current: KeptSegment,
    closed: Vec<KeptSegment>,
    /// The position of the next record.
    next: u64,
    buf: Vec<u8>,
    /// The newest hard state written (repeated at each segment's start).
    hard_state: HardState,
    /// Entries up to this index are in a saved state that stays on disk.
    covered: Arc<AtomicU64>,
    metrics: Arc<std::sync::OnceLock<WalMetrics>>,
}

/// Where a log starts: in which directory, how it syncs, for whom, and
/// after what an earlier run left.
pub struct RaftLogStart {
    /// The log's directory ([`raft_log_dir`]).
    pub dir: PathBuf,
    /// How writes are made durable.
    pub mode: WalMode,
    /// This machine's boot, for the segments' headers.
    pub boot_id: String,
    /// The member writing it.
    pub identity: Identity,
    /// The hard state the member starts with.
    pub hard_state: HardState,
    /// The first position of the new segment (after the kept ones).
    pub next_position: u64,
    /// Segments an earlier run left that are still needed.
    pub kept: Vec<KeptSegment>,
}

impl RaftLog {
    /// Starts a new segment holding the identity and hard state, synced
    /// before it returns.
    pub fn start(start: RaftLogStart, segment_bytes: u64) -> std::io::Result<RaftLog> {
        std::fs::create_dir_all(&start.dir)?;
        let first = start.next_position.max(1);
        let (file, file_len) = create_segment(&start.dir, first, start.mode, &start.boot_id)?;
        let mut log = RaftLog {
            current: KeptSegment {
                path: start.dir.join(segment::name(first)),
                newest_index: 0,
            },
            dir: start.dir,
            mode: start.mode,
            boot_id: start.boot_id,
            identity: start.identity,
            file,
            file_len,
            segment_bytes,
            closed: start.kept,
            next: first,
            buf: Vec::new(),
            hard_state: start.hard_state,
            covered: Arc::default(),
            metrics: Arc::default(),
        };
        log.open_segment_records();
        log.write_buffered(true);
        Ok(log)
    }

    /// Where saves report the index their kept files cover, so segments
    /// at or below it can go.
    pub fn covered(&self) -> Arc<AtomicU64> {
        self.covered.clone()
    }

    /// Where the metrics to report writes to can be set, once, while
    /// the log is written elsewhere.
    pub fn metrics(&self) -> Arc<std::sync::OnceLock<WalMetrics>> {
        self.metrics.clone()
    }

    /// Queues entries appended to Raft's log (a conflicting suffix is
    /// replaced: a later entry with an index already written wins).
    pub fn append(&mut self, entries: &[Entry]) {
        for entry in entries {
            let bytes = entry.write_to_bytes().expect("a raft entry always encodes");
            self.frame(KIND_RAFT_ENTRY, entry.index, &bytes);
        }
    }

    /// Queues a new hard state.
    pub fn hard_state(&mut self, hard_state: &HardState) {
        let bytes = hard_state
            .write_to_bytes()
            .expect("a hard state always encodes");
        self.frame(KIND_HARD_STATE, 0, &bytes);
        self.hard_state = hard_state.clone();
    }

    /// Queues the metadata of a snapshot installed from the leader, which
    /// replaces the log up to its index. The caller has saved the
    /// snapshot's state before (`cluster/member/saved_state.rs`).
    pub fn installed(&mut self, meta: &SnapshotMetadata) {
        let bytes = meta
            .write_to_bytes()
            .expect("snapshot metadata always encodes");
        self.frame(KIND_RAFT_SNAPSHOT, meta.index, &bytes);
    }

    /// Writes what is queued (and syncs it in `fsync` mode); returns once
    /// it is in. A failing disk is retried until it takes the bytes:
    /// nothing queued is acknowledged meanwhile.
    pub fn flush(&mut self) {
        if self.buf.is_empty() {
            return;
        }
        self.write_buffered(self.mode == WalMode::Fsync);
        if self.file_len >= self.segment_bytes {
            self.rotate();
        }
    }

    /// Syncs the current segment (at shutdown).
    pub fn close(&mut self) {
        self.flush();
        if let Err(e) = self.file.sync_data() {
            tracing::error!(error = %e, "cannot sync the raft log at shutdown");
        }
    }

    fn frame(&mut self, kind: u8, index: u64, payload: &[u8]) {
        segment::frame(&mut self.buf, kind, self.next, index as i64, payload);
        self.next += 1;
        self.current.newest_index = self.current.newest_index.max(index);
    }

    fn open_segment_records(&mut self) {
        let identity = self.identity.encode();
        self.frame(KIND_IDENTITY, 0, &identity);
        let hard_state = self.hard_state.clone();
        self.hard_state(&hard_state);
    }

    fn write_buffered(&mut self, sync: bool) {
        let segment = Segment {
            file: &mut self.file,
            len: self.file_len,
            dir: &self.dir,
        };
        write_until_in(segment, &self.buf, sync, self.metrics.get());
        self.file_len += self.buf.len() as u64;
        self.buf.clear();
    }

    /// Closes the current segment and starts the next one; removes the
    /// closed segments a saved state covers.
    fn rotate(&mut self) {
        if self.mode != WalMode::Fsync {
            // Closed segments are synced once, so a segment that a reboot
            // would need holds what the kernel had at rotation.
            let _ = self.file.sync_data();
        }
        let (file, file_len) = loop {
            match create_segment(&self.dir, self.next, self.mode, &self.boot_id) {
                Ok(created) => break created,
                Err(e) => {
                    tracing::error!(error = %e, "cannot start a new raft log segment");
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        };
        let closed = std::mem::replace(
            &mut self.current,
            KeptSegment {
                path: self.dir.join(segment::name(self.next)),
                newest_index: 0,
            },
        );
        self.closed.push(closed);
        self.file = file;
        self.file_len = file_len;
        self.open_segment_records();
        self.write_buffered(true);
        self.drop_covered();
    }

    fn drop_covered(&mut self) {
        let covered = self.covered.load(Ordering::Acquire);
        self.closed.retain(|s| {
            if s.newest_index > covered {
                return true;
            }
            match std::fs::remove_file(&s.path) {
                Ok(()) => false,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
                Err(e) => {
                    tracing::warn!(segment = %s.path.display(), error = %e, "cannot remove a raft log segment");
                    true
                }
            }
        });
    }
}

impl Drop for RaftLog {
    fn drop(&mut self) {
        self.close();
    }
}

/// What a member's Raft log held.
#[derive(Debug, Default)]
pub struct RecoveredRaftLog {
    /// Whose log it is (from its newest segment).
    pub identity: Option<Identity>,
    /// The newest hard state.
    pub hard_state: HardState,
    /// The entries, in index order without gaps (a later write of an index
    /// replaced what followed it).
    pub entries: Vec<Entry>,
    /// The newest snapshot installed from the leader: (index, term).
    pub installed: Option<(u64, u64)>,
    /// The log holds everything this member wrote: see `recover.rs`.
    pub trusted: bool,
    /// What was repaired, or why it is not trusted.
    pub notes: Vec<String>,
    /// The position the next segment starts at.
    pub next_position: u64,
    /// The segments read, for removal once covered.
    pub segments: Vec<KeptSegment>,
    /// Segments that could not be read to their end.
    pub damaged: Vec<PathBuf>,
}

impl RecoveredRaftLog {
    /// The entries after a saved state at `base_index` (term `base_term`),
    /// or why they do not continue it: a snapshot installed after the
    /// saved state, a gap after it, another term at its index, a saved
    /// state past the log's end, or a commit index past the log.
    pub fn after(&self, base_index: u64, base_term: u64) -> Result<Vec<Entry>, String> {
        if let Some((index, _)) = self.installed.filter(|(i, _)| *i > base_index) {
            return Err(format!(
                "the log continues a snapshot at index {index}, newer than the saved state \
                 (index {base_index})"
            ));
        }
        if let Some(at) = self.entries.iter().find(|e| e.index == base_index) {
            if base_index > 0 && at.term != base_term {
                return Err(format!(
                    "its entry at the saved index {base_index} has term {}, the saved state {base_term}",
                    at.term
                ));
            }
        }
        let after: Vec<Entry> = self
            .entries
            .iter()
            .filter(|e| e.index > base_index)
            .cloned()
            .collect();
        if let Some(first) = after.first().filter(|e| e.index != base_index + 1) {
            return Err(format!(
                "its entries after the saved index {base_index} start at {}",
                first.index
            ));
        }
        let end = self
            .entries
            .last()
            .map(|e| e.index)
            .max(self.installed.map(|(i, _)| i))
            .unwrap_or(0);
        if base_index > end {
            // The member applied only what it had written: entries it
            // applied are missing from the log.
            return Err(format!(
                "the saved state (index {base_index}) is past the log's end (index {end})"
            ));
        }
        let last = after.last().map_or(base_index, |e| e.index);
        if self.hard_state.commit > last {
            return Err(format!(
                "its commit index {} is past its last entry {last}",
                self.hard_state.commit
            ));
        }
        Ok(after)
    }
}

/// Reads the Raft log in `dir`; `None` when there is none. A torn tail is
/// cut off the newest segment. `boot_id`: this machine's boot.
pub fn recover_raft_log(dir: &Path, boot_id: &str) -> std::io::Result<Option<RecoveredRaftLog>> {
    let Some((oldest, _)) = segment::list(dir)?.into_iter().next() else {
        return Ok(None);
    };
    let mut out = RecoveredRaftLog::default();
    // Segments that saved states covered are gone: the log starts at the
    // oldest one left.
    let walked = walk(dir, oldest.saturating_sub(1), boot_id, |_, record| {
        match record.kind {
            KIND_IDENTITY => out.identity = Some(Identity::decode(&record.payload)?),
            KIND_HARD_STATE => {
                out.hard_state = HardState::parse_from_bytes(&record.payload)
                    .map_err(|e| format!("undecodable hard state: {e}"))?
            }
            KIND_RAFT_SNAPSHOT => {
                let meta = SnapshotMetadata::parse_from_bytes(&record.payload)
                    .map_err(|e| format!("undecodable snapshot metadata: {e}"))?;
                out.entries.clear();
                out.installed = Some((meta.index, meta.term));
            }
            KIND_RAFT_ENTRY => {
                let entry = Entry::parse_from_bytes(&record.payload)
                    .map_err(|e| format!("undecodable raft entry: {e}"))?;
                if let Some(last) = out.entries.last().map(|e| e.index) {
                    if entry.index > last + 1 {
                        return Err(format!(
                            "entry {} follows entry {last}: the entries between are missing",
                            entry.index
                        ));
                    }
                    let keep = out.entries.partition_point(|e| e.index < entry.index);
                    out.entries.truncate(keep);
                }
                out.entries.push(entry);
            }
            kind => return Err(format!("a record of kind {kind} in a raft log")),
        }
        Ok(())
    })?;
    out.trusted = walked.trusted && out.identity.is_some();
    if out.identity.is_none() {
        out.notes
            .push("no segment says which member the log belongs to".into());
    }
    out.notes.extend(walked.notes);
    out.damaged = walked.damaged;
    out.next_position = walked.last_position + 1;
    out.segments = walked
        .segments
        .into_iter()
        .map(|(path, newest)| KeptSegment {
            path,
            newest_index: newest.max(0) as u64,
        })
        .collect();
    Ok(Some(out))
}

/// The Raft log's directory in a data directory, for cluster `cluster_id`.
pub fn raft_log_dir(data_dir: &Path, cluster_id: u64) -> PathBuf {
    data_dir.join(format!("raft-log-{cluster_id:016x}"))
}

//! Optional persistence (`--data-dir`): snapshots of every live key, every
//! lease with its remaining TTL and the revision, kept in generations, and a
//! small state file that keeps revisions from going backwards.
//!
//! ephd is an in-memory store: snapshots exist so a rolling restart loses
//! nothing, not to survive every crash. A crash loses the writes since the
//! last snapshot, which `--snapshot-interval` bounds.
//!
//! # Snapshot format
//! `EPHDSNAP2\n`, then records `[len: u32 LE][crc32 of body: u32 LE][body]`
//! with `body = [kind: u8][protobuf payload]`: one meta record (revision,
//! wall-clock time written) first, the key-values in strictly ascending key
//! order, the leases, the auth state when auth was ever used (users with
//! their bcrypt hashes, roles, the enabled flag and auth revision; never
//! tokens), and an end record carrying the number of records
//! before it, the CRC-32 of every byte before it and that byte count.
//! Nothing may follow the end record. A snapshot streamed to a client
//! (Maintenance.Snapshot) has one more record right before the end record:
//! zeros sized so that the file is 32 bytes over a multiple of 512, the only
//! length `etcdctl snapshot save` accepts (it expects etcd's page-sized
//! database and a SHA-256 after it); a reader refuses padding that is not
//! zeros or is followed by anything but the end record.
//!
//! Reading is all or nothing: a record failing its checksum, a length out
//! of range, a file cut short, a count or whole-file checksum that does not
//! match, a record that does not decode, keys out of order, revisions above
//! the snapshot's, an unknown record kind or trailing bytes make the whole
//! file an error that says what and where ([`ReadError::Damaged`]). There
//! is no partial restore: a prefix of a snapshot is not a state the store
//! ever had (keys without their leases, a revision without its keys).
//!
//! The format written before generations existed (`EPHDSNAP1\n`, one file
//! `ephd.snap`) has the same framing without the whole-file checksum; it
//! is still read, with the same strictness otherwise. On start a legacy
//! `ephd.snap` is renamed, unchanged, to the generation name of the
//! revision in its meta record, and from then on is a generation like any
//! other (an upgrade loses nothing; its meta record unreadable, it is tried
//! first and treated as damaged).
//!
//! # Generations
//! Each snapshot is a new file `ephd.snap.<revision, 20 digits>`, written
//! to `ephd.snap.tmp`, fsynced, renamed into place and the directory
//! fsynced; then all but the newest [`KEEP_GENERATIONS`] are removed. A
//! damaged file is renamed to `<name>.corrupt-<unix seconds>` and never
//! removed by ephd. See [`recover`] for the start-up rules and
//! `server::bootstrap` for what the server does with the outcome.
//!
//! # Revision state
//! `ephd.state` (see [`state`]) records the highest revision the running
//! store may issue, reserved ahead and written before the store gets there,
//! so a restart can start above it whatever the wall clock says.
//!
//! # Clock
//! Every function that needs the wall clock takes it as a parameter
//! (`now_unix_ms`), so tests can step it; [`wall_clock_ms`] reads the real
//! one.

pub mod etcd_db;
mod format;
#[cfg(test)]
mod generation_tests;
mod generations;
pub mod state;
#[cfg(test)]
mod tests;

pub use format::read_file;

/// The write-ahead log position the snapshot at `path` covers, if it was
/// written with a log and its meta record reads.
pub fn wal_position_of(path: &Path) -> Option<u64> {
    format::peek_wal_position(path)
}
pub use generations::{
    generation_name, list, move_aside, parse_generation, recover, write, Damaged, RecoverError,
    Recovery, Written, KEEP_GENERATIONS, LEGACY_FILE,
};
pub use state::{RevisionState, STATE_FILE};

use crate::lease::RestoredLease;
use crate::mvcc::KeyValue;
use std::fs::{self, File};
use std::io::{self, BufWriter};
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

/// What a snapshot held. Only ever produced from a file that read intact.
#[derive(Debug, Default)]
pub struct Restored {
    /// The revision the snapshot was taken at.
    pub revision: i64,
    /// When it was written (wall clock).
    pub written_unix_ms: i64,
    /// The newest write-ahead log position it covers (None: written
    /// without a log).
    pub wal_position: Option<u64>,
    /// Every live key-value, in key order.
    pub kvs: Vec<KeyValue>,
    /// Every lease, its remaining time reduced by the downtime.
    pub leases: Vec<RestoredLease>,
    /// Users, roles and the enabled flag, when the server ever used auth.
    pub auth: Option<crate::auth::AuthImage>,
}

/// Why a snapshot or state file could not be read.
#[derive(Debug)]
pub enum ReadError {
    /// The file is damaged or not one of ours.
    Damaged {
        /// What is wrong, and where.
        reason: String,
        /// The revision in its meta record, if that was intact.
        revision: Option<i64>,
    },
    /// Reading failed for a reason that is not the file's content
    /// (permissions, I/O errors).
    Io(io::Error),
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Damaged { reason, .. } => write!(f, "damaged: {reason}"),
            ReadError::Io(e) => write!(f, "cannot read: {e}"),
        }
    }
}

/// A whole snapshot (the current format) encoded in memory, exactly as
/// [`write`] puts it in a file. Hidden: it exists so the fuzz harness
/// (`ephd-fuzz/`) can build and damage snapshots without a file system.
#[doc(hidden)]
pub fn encode_in_memory(
    revision: i64,
    written_unix_ms: i64,
    kvs: &[crate::mvcc::Kv],
    leases: &[crate::lease::LeaseInfo],
    auth: Option<&crate::auth::AuthImage>,
) -> Vec<u8> {
    let mut out = Vec::new();
    format::encode(
        &mut out,
        &format::Meta::at(revision, written_unix_ms, None),
        kvs,
        leases,
        auth,
        false,
    )
    .expect("writing to memory cannot fail");
    out
}

/// Reads a snapshot from memory with the same all-or-nothing reader as
/// [`read_file`]. Hidden, for the fuzz harness like [`encode_in_memory`].
#[doc(hidden)]
pub fn decode_in_memory(bytes: &[u8], now_unix_ms: i64) -> Result<Restored, ReadError> {
    format::decode(bytes, now_unix_ms)
}

/// The wall clock in milliseconds since the Unix epoch (0 before it).
pub fn wall_clock_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// fsyncs a directory so a rename in it is durable (best effort: some
/// filesystems refuse to open directories for this).
fn sync_dir(dir: &Path) {
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
}

/// Writes `dir/name` atomically: `fill` writes `dir/tmp` (truncated
/// first, so a leftover from a crash is simply replaced), which is fsynced,
/// renamed over `name`, and the directory fsynced. Returns what `fill`
/// returned (a byte count).
fn write_atomically(
    dir: &Path,
    name: &str,
    tmp: &str,
    fill: impl FnOnce(&mut BufWriter<File>) -> io::Result<u64>,
) -> io::Result<u64> {
    fs::create_dir_all(dir)?;
    let tmp = dir.join(tmp);
    let mut w = BufWriter::with_capacity(1 << 20, File::create(&tmp)?);
    let n = fill(&mut w)?;
    let file = w.into_inner().map_err(|e| e.into_error())?;
    file.sync_all()?;
    drop(file);
    fs::rename(&tmp, dir.join(name))?;
    sync_dir(dir);
    Ok(n)
}

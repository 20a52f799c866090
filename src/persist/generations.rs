//! Snapshot generations in the data directory: writing one, pruning old
//! ones, moving damaged ones aside, and choosing which one to restore.

use super::format::{self, peek_revision};
use super::{write_atomically, ReadError, Restored};
use crate::lease::LeaseInfo;
use crate::mvcc::Kv;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// Name of the single snapshot file written before generations existed.
pub const LEGACY_FILE: &str = "ephd.snap";
/// The temporary file a snapshot is written to before it is renamed.
const TMP_FILE: &str = "ephd.snap.tmp";
/// Generations are `ephd.snap.<revision, 20 digits>`.
const PREFIX: &str = "ephd.snap.";
/// Good snapshots kept: the newest and the one before it. While a snapshot
/// is being written one more file (the temporary one) exists.
pub const KEEP_GENERATIONS: usize = 2;

/// The file name of the generation taken at `revision`.
pub fn generation_name(revision: i64) -> String {
    format!("{PREFIX}{revision:020}")
}

/// The revision a generation's file name carries; `None` for any other
/// name (temporary files, moved-aside files, the legacy file).
pub fn parse_generation(name: &str) -> Option<i64> {
    let digits = name.strip_prefix(PREFIX)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Every generation in `dir`, newest (highest revision) first.
pub fn list(dir: &Path) -> io::Result<Vec<(i64, PathBuf)>> {
    let mut out = Vec::new();
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        if let Some(rev) = entry.file_name().to_str().and_then(parse_generation) {
            out.push((rev, entry.path()));
        }
    }
    out.sort_by_key(|(rev, _)| std::cmp::Reverse(*rev));
    Ok(out)
}

/// What [`write()`] did.
#[derive(Debug)]
pub struct Written {
    /// The new generation.
    pub path: PathBuf,
    /// Its size.
    pub bytes: u64,
    /// Older generations removed.
    pub pruned: Vec<PathBuf>,
}

/// Writes the generation for `revision` atomically (temporary file, fsync,
/// rename, fsync of the directory), then removes all but the newest
/// [`KEEP_GENERATIONS`] (best effort). `auth` is written unless it is a
/// fresh server's (see `format::KIND_AUTH`). Only files named exactly like a generation are
/// ever removed: moved-aside files stay until an operator deletes them.
pub fn write(
    dir: &Path,
    revision: i64,
    kvs: &[Kv],
    leases: &[LeaseInfo],
    auth: Option<&crate::auth::AuthImage>,
    now_unix_ms: i64,
    wal_position: Option<u64>,
) -> io::Result<Written> {
    let name = generation_name(revision);
    let bytes = write_atomically(dir, &name, TMP_FILE, |w| {
        format::encode(
            w,
            &format::Meta::at(revision, now_unix_ms, wal_position),
            kvs,
            leases,
            auth,
            false,
        )
    })?;
    // Pruning is best effort: the new generation is safely in place, and a
    // generation left behind is removed by a later write.
    let mut pruned = Vec::new();
    for (_, path) in list(dir)?.into_iter().skip(KEEP_GENERATIONS) {
        match fs::remove_file(&path) {
            Ok(()) => pruned.push(path),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot remove an old snapshot")
            }
        }
    }
    Ok(Written {
        path: dir.join(name),
        bytes,
        pruned,
    })
}

/// Renames a damaged file to `<name>.corrupt-<unix seconds>` (with a
/// counter if that exists), never over another file. Returns the new path.
pub fn move_aside(path: &Path, now_unix_ms: i64) -> io::Result<PathBuf> {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "not a file name"))?;
    let dir = path.parent().unwrap_or(Path::new("."));
    let stamp = now_unix_ms.div_euclid(1000);
    let mut target = dir.join(format!("{name}.corrupt-{stamp}"));
    let mut n = 1;
    while target.symlink_metadata().is_ok() {
        n += 1;
        target = dir.join(format!("{name}.corrupt-{stamp}-{n}"));
    }
    fs::rename(path, &target)?;
    super::sync_dir(dir);
    Ok(target)
}

/// A snapshot that could not be read.
#[derive(Debug, Clone)]
pub struct Damaged {
    /// Where it was.
    pub path: PathBuf,
    /// Where it is now (`None` when it was left in place: strict mode).
    pub moved_to: Option<PathBuf>,
    /// The revision its name or intact meta record names, if any.
    pub revision: Option<i64>,
    /// What is wrong with it.
    pub reason: String,
}

/// The outcome of [`recover`].
#[derive(Debug, Default)]
pub struct Recovery {
    /// The generation restored and its contents.
    pub restored: Option<(PathBuf, Restored)>,
    /// Newer generations that were damaged and moved aside, newest first.
    pub damaged: Vec<Damaged>,
    /// The highest revision any generation names (restored, damaged or
    /// left untried), 0 if there is none.
    pub highest_named: i64,
}

/// Why [`recover`] gave up.
#[derive(Debug)]
pub enum RecoverError {
    /// Strict mode: the newest snapshot is damaged. Nothing was changed.
    Refused(Damaged),
    /// The directory or a file could not be read or renamed.
    Io(String),
}

/// Adopts a legacy `ephd.snap` as a generation: renamed, bytes unchanged,
/// to the name its meta record's revision gives. Returns it as a
/// candidate of unknown revision (tried first) when its meta record is
/// unreadable, and leaves it alone when the generation name is taken.
fn adopt_legacy(dir: &Path) -> Result<Option<PathBuf>, RecoverError> {
    let legacy = dir.join(LEGACY_FILE);
    if !legacy.exists() {
        return Ok(None);
    }
    let Some(rev) = peek_revision(&legacy) else {
        return Ok(Some(legacy));
    };
    let target = dir.join(generation_name(rev));
    if target.exists() {
        tracing::warn!(
            legacy = %legacy.display(),
            generation = %target.display(),
            "a snapshot of the same revision exists in the current format; the legacy file is left alone"
        );
        return Ok(None);
    }
    fs::rename(&legacy, &target).map_err(|e| {
        RecoverError::Io(format!(
            "cannot rename {} to {}: {e}",
            legacy.display(),
            target.display()
        ))
    })?;
    super::sync_dir(dir);
    tracing::info!(from = %legacy.display(), to = %target.display(), "adopted the snapshot of an earlier ephd version");
    Ok(None)
}

/// Finds the newest snapshot in `dir` that reads intact. A damaged one is
/// moved aside and the next older one is tried; with `strict` the first
/// damaged one stops everything instead and nothing is moved. Reading
/// errors that are not the file's fault (permissions, I/O) stop everything
/// in either mode, without moving anything.
pub fn recover(dir: &Path, strict: bool, now_unix_ms: i64) -> Result<Recovery, RecoverError> {
    let io_err = |what: &Path, e: io::Error| RecoverError::Io(format!("{}: {e}", what.display()));
    let unknown = adopt_legacy(dir)?;
    let mut candidates: Vec<(Option<i64>, PathBuf)> =
        unknown.map(|p| (None, p)).into_iter().collect();
    let listed = list(dir).map_err(|e| io_err(dir, e))?;
    let mut out = Recovery {
        highest_named: listed.first().map_or(0, |(rev, _)| *rev),
        ..Recovery::default()
    };
    candidates.extend(listed.into_iter().map(|(rev, p)| (Some(rev), p)));
    for (named, path) in candidates {
        match format::read_file(&path, now_unix_ms) {
            Ok(restored) => {
                out.highest_named = out.highest_named.max(restored.revision);
                out.restored = Some((path, restored));
                break;
            }
            Err(ReadError::Io(e)) => return Err(io_err(&path, e)),
            Err(ReadError::Damaged { reason, revision }) => {
                let revision = named.max(revision);
                let mut damaged = Damaged {
                    path: path.clone(),
                    moved_to: None,
                    revision,
                    reason,
                };
                if strict {
                    return Err(RecoverError::Refused(damaged));
                }
                let moved = move_aside(&path, now_unix_ms).map_err(|e| {
                    RecoverError::Io(format!(
                        "cannot move damaged snapshot {} aside: {e}",
                        path.display()
                    ))
                })?;
                damaged.moved_to = Some(moved);
                out.highest_named = out.highest_named.max(revision.unwrap_or(0));
                out.damaged.push(damaged);
            }
        }
    }
    Ok(out)
}

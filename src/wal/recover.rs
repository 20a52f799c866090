//! Reading the log back at start: every whole record after a snapshot's
//! position, in order, and whether the log can be trusted to hold every
//! change that was acknowledged.

use super::segment::{self, Record, KIND_EMPTY, KIND_ENTRY, KIND_WRITE};
use crate::config::WalMode;
use crate::mvcc::Replayed;
use std::path::{Path, PathBuf};

/// What the log held after a position.
#[derive(Debug, Default)]
pub struct Recovered {
    /// The records after the position, in order: the revision each took
    /// (None: none) and the change to replay.
    pub records: Vec<(Option<i64>, Replayed)>,
    /// The newest position read (the snapshot's, when nothing follows it).
    pub last_position: u64,
    /// Every acknowledged change is among the records: no segment is
    /// damaged or missing, and each one that holds records was synced on
    /// every write or written since this machine's boot (a buffered write
    /// survives a process crash, not a reboot).
    pub trusted: bool,
    /// Why the log is not trusted, or what was repaired, for the log.
    pub notes: Vec<String>,
    /// Segments that could not be read to their end (left in place, named
    /// here so the caller sets them aside before a new log starts).
    pub damaged: Vec<PathBuf>,
}

/// Reads the log in `dir` after `position` (what the restored snapshot
/// covers). A torn tail of the newest segment (a crash mid-write) is cut
/// off the file. `boot_id`: this machine's boot (empty: unknown).
pub fn recover(dir: &Path, position: u64, boot_id: &str) -> std::io::Result<Recovered> {
    let mut records = Vec::new();
    let walked = walk(dir, position, boot_id, |_, record| {
        let change = decode(&record)?;
        let revision = (record.revision > 0).then_some(record.revision);
        records.push((revision, change));
        Ok(())
    })?;
    Ok(Recovered {
        records,
        last_position: walked.last_position,
        trusted: walked.trusted,
        notes: walked.notes,
        damaged: walked.damaged,
    })
}

/// What walking a log's segments found, besides the records it visited.
#[derive(Debug, Default)]
pub(super) struct Walked {
    /// The newest position visited (`position` when none).
    pub last_position: u64,
    /// See [`Recovered::trusted`].
    pub trusted: bool,
    pub notes: Vec<String>,
    pub damaged: Vec<PathBuf>,
    /// The segments read whole, oldest first, with the newest revision
    /// field of their records.
    pub segments: Vec<(PathBuf, i64)>,
}

/// Visits every whole record after `position` in the log in `dir`, in
/// order; a record `visit` refuses (with why) ends the walk and makes the
/// log untrusted. A torn tail of the newest segment is cut off the file;
/// damage elsewhere, a gap between segments or a segment written without
/// syncing before this machine's boot makes it untrusted.
pub(super) fn walk(
    dir: &Path,
    position: u64,
    boot_id: &str,
    mut visit: impl FnMut(&Path, Record) -> Result<(), String>,
) -> std::io::Result<Walked> {
    let mut out = Walked {
        last_position: position,
        trusted: true,
        ..Walked::default()
    };
    let segments = segment::list(dir)?;
    if segments.is_empty() {
        out.trusted = false;
        out.notes.push(format!(
            "no write-ahead log in {}: the changes after the snapshot, if any, are lost",
            dir.display()
        ));
        return Ok(out);
    }
    let newest = segments.len() - 1;
    let mut expected: Option<u64> = None;
    for (i, (first, path)) in segments.iter().enumerate() {
        let bytes = std::fs::read(path)?;
        let read = match segment::read(&bytes) {
            Ok(read) => read,
            Err(why) if i == newest && bytes.len() < 64 => {
                // Created but never written: a crash as it started.
                out.notes
                    .push(format!("{}: {why}; removed", path.display()));
                std::fs::remove_file(path)?;
                break;
            }
            Err(why) => {
                out.trusted = false;
                out.notes.push(format!("{}: {why}", path.display()));
                out.damaged = from_here(&segments, i);
                break;
            }
        };
        if read.header.first != *first {
            out.trusted = false;
            out.notes.push(format!(
                "{}: its header says position {}",
                path.display(),
                read.header.first
            ));
            out.damaged = from_here(&segments, i);
            break;
        }
        let starts_in_time = match expected {
            Some(next) => *first == next,
            None => *first <= position + 1,
        };
        if !starts_in_time {
            out.trusted = false;
            out.notes.push(format!(
                "{} starts at position {first}, {} expected: the records in between are missing",
                path.display(),
                expected.unwrap_or(position + 1)
            ));
            out.damaged = from_here(&segments, i);
            break;
        }
        let last_in_segment = read.records.last().map(|r| r.position);
        let holds_new = last_in_segment.is_some_and(|last| last > position);
        // The newest segment is the one a reboot may have emptied.
        if (holds_new || i == newest)
            && read.header.mode != WalMode::Fsync
            && (boot_id.is_empty() || read.header.boot_id != boot_id)
        {
            out.trusted = false;
            out.notes.push(format!(
                "{} was written without syncing before this machine's last boot: changes \
                 acknowledged before the reboot may be missing from it",
                path.display()
            ));
        }
        let newest_revision = read.records.iter().map(|r| r.revision).max().unwrap_or(0);
        for record in read.records {
            if record.position <= position {
                continue;
            }
            let at = record.position;
            match visit(path, record) {
                Ok(()) => out.last_position = at,
                Err(why) => {
                    out.trusted = false;
                    out.notes.push(format!(
                        "{}: record {at} does not decode: {why}",
                        path.display(),
                    ));
                    out.damaged = from_here(&segments, i);
                    return Ok(out);
                }
            }
        }
        expected = Some(last_in_segment.map_or(*first, |last| last + 1));
        out.segments.push((path.clone(), newest_revision));
        if let Some(why) = read.cut {
            if i == newest {
                let file = std::fs::OpenOptions::new().write(true).open(path)?;
                file.set_len(read.whole as u64)?;
                file.sync_all()?;
                out.notes.push(format!(
                    "{}: cut a torn tail ({why}; {} bytes), the records of a write that was \
                     never acknowledged",
                    path.display(),
                    bytes.len() - read.whole
                ));
            } else {
                out.trusted = false;
                out.notes.push(format!("{}: {why}", path.display()));
                out.damaged = from_here(&segments, i);
                break;
            }
        }
    }
    Ok(out)
}

fn decode(record: &segment::Record) -> Result<Replayed, String> {
    if record.kind == KIND_EMPTY {
        return Ok(Replayed::Empty);
    }
    let payload = bytes::Bytes::copy_from_slice(&record.payload);
    match record.kind {
        KIND_WRITE => crate::proto::nesting::decode_txn(payload)
            .map(|txn| Replayed::Write(crate::wire::txn_request(txn)))
            .map_err(|e| format!("undecodable txn: {e:?}")),
        KIND_ENTRY => crate::entry_bytes::decode(payload).map(|p| Replayed::Entry(p.entry)),
        kind => Err(format!("unknown kind {kind}")),
    }
}

/// The segments from the `i`th on: what a damaged one leaves unusable.
fn from_here(segments: &[(u64, PathBuf)], i: usize) -> Vec<PathBuf> {
    segments[i..].iter().map(|(_, p)| p.clone()).collect()
}

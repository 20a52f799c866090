//! One segment file of the write-ahead log: its name, its header and its
//! records, and reading it back up to the last whole record.
//!
//! ```text
//! EPHDWAL1\n
//! [len: u32 LE][crc32 of body: u32 LE][body]   the header, then records
//! ```
//! The header's body is `[0][first position: u64][mode: u8][boot id]`; a
//! record's is `[kind: u8][position: u64][revision: i64][payload]`, kinds
//! 1 (a keyed write: etcd's TxnRequest message), 2 (an entry: the Raft log
//! entry format, `entry_bytes/`) and 3 (an empty revision); revision 0
//! when the change took none. A cluster member's Raft log (`raft_log.rs`)
//! uses kinds 4 (a Raft entry; the revision field holds its index), 5
//! (Raft's hard state), 6 (a snapshot installed from the leader: its
//! metadata) and 7 (the member and cluster IDs the log belongs to).
//! Positions grow by one from the header's first position, with no gap.

use crate::config::WalMode;
use std::path::{Path, PathBuf};

const MAGIC: &[u8] = b"EPHDWAL1\n";
const KIND_HEADER: u8 = 0;
/// A keyed write: the payload is etcd's TxnRequest message.
pub(super) const KIND_WRITE: u8 = 1;
/// An entry replayed through the apply path.
pub(super) const KIND_ENTRY: u8 = 2;
/// A revision with no change.
pub(super) const KIND_EMPTY: u8 = 3;
/// A Raft log entry (raft's `Entry` message).
pub(super) const KIND_RAFT_ENTRY: u8 = 4;
/// Raft's hard state (term, vote, commit).
pub(super) const KIND_HARD_STATE: u8 = 5;
/// A snapshot from the leader replaced the log up to its index.
pub(super) const KIND_RAFT_SNAPSHOT: u8 = 6;
/// The member and cluster the log belongs to.
pub(super) const KIND_IDENTITY: u8 = 7;
/// The largest record read back: a corrupt length must not allocate
/// gigabytes. A request is at most `--max-request-bytes` (1.5 MiB by
/// default, capped far below this).
const MAX_RECORD: usize = 256 << 20;

/// The file name of the segment whose first record has `position`.
pub(super) fn name(position: u64) -> String {
    format!("{position:020}.wal")
}

/// The first position of a segment named `name`.
pub(super) fn parse_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(".wal")?;
    (digits.len() == 20 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

/// Every segment in `dir`, oldest first.
pub(super) fn list(dir: &Path) -> std::io::Result<Vec<(u64, PathBuf)>> {
    let mut out = Vec::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        if let Some(first) = entry.file_name().to_str().and_then(parse_name) {
            out.push((first, entry.path()));
        }
    }
    out.sort();
    Ok(out)
}

/// Appends one framed record to `out`.
pub(super) fn frame(out: &mut Vec<u8>, kind: u8, position: u64, revision: i64, payload: &[u8]) {
    let len = 1 + 8 + 8 + payload.len();
    let start = out.len();
    out.extend_from_slice(&(len as u32).to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.push(kind);
    out.extend_from_slice(&position.to_le_bytes());
    out.extend_from_slice(&revision.to_le_bytes());
    out.extend_from_slice(payload);
    let crc = crc32fast::hash(&out[start + 8..]);
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

/// The start of a new segment: the magic and its header.
pub(super) fn header(first: u64, mode: WalMode, boot_id: &str) -> Vec<u8> {
    let mut payload = vec![mode as u8];
    payload.extend_from_slice(boot_id.as_bytes());
    let mut out = MAGIC.to_vec();
    frame(&mut out, KIND_HEADER, first, 0, &payload);
    out
}

/// A segment's header, as read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Header {
    pub first: u64,
    pub mode: WalMode,
    pub boot_id: String,
}

/// One record, as read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Record {
    pub kind: u8,
    pub position: u64,
    /// 0: the change took no revision.
    pub revision: i64,
    pub payload: Vec<u8>,
}

/// What a segment's bytes held.
#[derive(Debug)]
pub(super) struct Read {
    pub header: Header,
    pub records: Vec<Record>,
    /// Where the whole records end.
    pub whole: usize,
    /// Why reading stopped before the end of the bytes, if it did.
    pub cut: Option<String>,
}

/// Reads a segment's bytes up to the last whole record. A record cut short,
/// failing its checksum, out of position or of an unknown kind ends the
/// read there (`cut` says why); only a bad magic or header fails it.
pub(super) fn read(bytes: &[u8]) -> Result<Read, String> {
    let body = bytes
        .strip_prefix(MAGIC)
        .ok_or("not a write-ahead log segment (bad magic)")?;
    let mut offset = MAGIC.len();
    let (first, header) = match next(body, 0) {
        Next::Record(r, used) if r.kind == KIND_HEADER && !r.payload.is_empty() => {
            offset += used;
            (r.position, r)
        }
        _ => return Err("its header is damaged".into()),
    };
    let mode = WalMode::from_byte(header.payload[0]).ok_or("its header names an unknown mode")?;
    let header = Header {
        first,
        mode,
        boot_id: String::from_utf8_lossy(&header.payload[1..]).into_owned(),
    };
    let mut records = Vec::new();
    let mut cut = None;
    let mut expected = first;
    while offset < bytes.len() {
        match next(&bytes[offset..], offset) {
            Next::Record(r, used) => {
                if !(KIND_WRITE..=KIND_IDENTITY).contains(&r.kind) {
                    cut = Some(format!(
                        "record at offset {offset} is of unknown kind {}",
                        r.kind
                    ));
                    break;
                }
                if r.position != expected {
                    cut = Some(format!(
                        "record at offset {offset} has position {}, {expected} expected",
                        r.position
                    ));
                    break;
                }
                expected += 1;
                offset += used;
                records.push(r);
            }
            Next::Bad(why) => {
                cut = Some(why);
                break;
            }
        }
    }
    Ok(Read {
        header,
        records,
        whole: offset,
        cut,
    })
}

enum Next {
    Record(Record, usize),
    Bad(String),
}

fn next(bytes: &[u8], offset: usize) -> Next {
    if bytes.len() < 8 {
        return Next::Bad(format!("a record cut short at offset {offset}"));
    }
    let len = u32::from_le_bytes(bytes[..4].try_into().expect("4 bytes")) as usize;
    let crc = u32::from_le_bytes(bytes[4..8].try_into().expect("4 bytes"));
    if !(17..=MAX_RECORD).contains(&len) {
        return Next::Bad(format!("a record length of {len} at offset {offset}"));
    }
    let Some(body) = bytes.get(8..8 + len) else {
        return Next::Bad(format!("a record cut short at offset {offset}"));
    };
    if crc32fast::hash(body) != crc {
        return Next::Bad(format!("a record failing its checksum at offset {offset}"));
    }
    Next::Record(
        Record {
            kind: body[0],
            position: u64::from_le_bytes(body[1..9].try_into().expect("8 bytes")),
            revision: i64::from_le_bytes(body[9..17].try_into().expect("8 bytes")),
            payload: body[17..].to_vec(),
        },
        8 + len,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segment(first: u64, records: &[(&[u8], i64)]) -> Vec<u8> {
        let mut out = header(first, WalMode::Buffered, "boot-1");
        for (i, (payload, rev)) in records.iter().enumerate() {
            frame(&mut out, KIND_WRITE, first + i as u64, *rev, payload);
        }
        out
    }

    #[test]
    fn records_read_back_with_their_header() {
        let bytes = segment(5, &[(b"a", 10), (b"", 0), (b"ccc", 11)]);
        let read = read(&bytes).unwrap();
        assert_eq!(
            read.header,
            Header {
                first: 5,
                mode: WalMode::Buffered,
                boot_id: "boot-1".into()
            }
        );
        assert_eq!(read.records.len(), 3);
        assert_eq!(read.records[2].position, 7);
        assert_eq!(read.records[2].revision, 11);
        assert_eq!(read.records[2].payload, b"ccc");
        assert_eq!(read.whole, bytes.len());
        assert!(read.cut.is_none());
    }

    #[test]
    fn a_torn_tail_is_cut_at_the_last_whole_record() {
        let bytes = segment(1, &[(b"one", 1), (b"two", 2)]);
        let whole_one = segment(1, &[(b"one", 1)]).len();
        for cut_at in whole_one..bytes.len() {
            let read = read(&bytes[..cut_at]).unwrap();
            assert_eq!(read.records.len(), 1, "cut at {cut_at}");
            assert_eq!(read.whole, whole_one);
            assert_eq!(read.cut.is_some(), cut_at > whole_one);
        }
    }

    #[test]
    fn a_damaged_record_ends_the_read_there() {
        let mut bytes = segment(1, &[(b"one", 1), (b"two", 2), (b"three", 3)]);
        let second = segment(1, &[(b"one", 1)]).len();
        bytes[second + 20] ^= 0xff;
        let read = read(&bytes).unwrap();
        assert_eq!(read.records.len(), 1);
        assert!(read.cut.unwrap().contains("checksum"));
    }

    #[test]
    fn a_position_out_of_sequence_ends_the_read() {
        let mut bytes = segment(1, &[(b"one", 1)]);
        frame(&mut bytes, KIND_WRITE, 9, 2, b"x");
        let read = read(&bytes).unwrap();
        assert_eq!(read.records.len(), 1);
        assert!(read.cut.unwrap().contains("position 9, 2 expected"));
    }

    #[test]
    fn garbage_never_panics_and_never_reads_as_records() {
        assert!(read(b"").is_err());
        assert!(read(b"EPHDWAL1\n").is_err());
        let mut bytes = segment(1, &[(b"one", 1)]);
        bytes.extend_from_slice(&[0xff; 64]);
        let read = read(&bytes).unwrap();
        assert_eq!(read.records.len(), 1);
        assert!(read.cut.is_some());
    }

    #[test]
    fn names_sort_by_position() {
        assert_eq!(name(42), "00000000000000000042.wal");
        assert_eq!(parse_name(&name(42)), Some(42));
        assert_eq!(parse_name("42.wal"), None);
        assert_eq!(parse_name("00000000000000000042.wal.tmp"), None);
    }
}

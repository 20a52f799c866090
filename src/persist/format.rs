//! The snapshot file format: framing, encoding, and the all-or-nothing
//! reader (see the `persist` module docs for the layout and the rules).

use super::{ReadError, Restored};
use crate::auth::AuthImage;
use crate::lease::{LeaseInfo, RestoredLease};
use crate::mvcc::{KeyValue, Kv};
use crate::proto::mvccpb;
use prost::Message;
use std::fs::File;
use std::io::{self, BufReader, Read, Write};
use std::path::Path;
use std::time::Duration;

/// Magic of the current format: per-record checksums plus an end record
/// with the record count and a checksum over everything before it.
pub(super) const MAGIC_V2: &[u8; 10] = b"EPHDSNAP2\n";
/// Magic of the format written before generations existed (`ephd.snap`):
/// the same framing, an end record with the count only.
pub(super) const MAGIC_V1: &[u8; 10] = b"EPHDSNAP1\n";
pub(super) const KIND_META: u8 = 1;
pub(super) const KIND_KV: u8 = 2;
pub(super) const KIND_LEASE: u8 = 3;
pub(super) const KIND_END: u8 = 0xff;
/// A record of zeros right before the end record, sized so that the whole
/// file is 32 bytes more than a multiple of 512 bytes. `etcdctl snapshot
/// save` refuses a stream of any other length: it expects etcd's database
/// (whole 512-byte multiples) followed by a 32-byte SHA-256. Only streamed
/// snapshots carry it.
pub(super) const KIND_PAD: u8 = 4;
/// The auth state (users, roles, enabled flag, auth revision; never
/// tokens), at most once, after the leases. Written only when auth was
/// ever used, so snapshots of servers that never used it read in earlier
/// releases too.
pub(super) const KIND_AUTH: u8 = 5;
/// The length etcdctl accepts: `len % ALIGN_BLOCK == ALIGN_REST`.
pub(super) const ALIGN_BLOCK: u64 = 512;
/// See [`ALIGN_BLOCK`].
pub(super) const ALIGN_REST: u64 = 32;
/// Largest record accepted when reading (a corrupt length must not make us
/// allocate gigabytes). A key-value is at most `--max-request-bytes`.
const MAX_RECORD: u32 = 64 << 20;

/// The meta record: what the snapshot is of.
#[derive(Clone, PartialEq, Message)]
pub(super) struct Meta {
    #[prost(int64, tag = "1")]
    pub revision: i64,
    #[prost(int64, tag = "2")]
    pub written_unix_ms: i64,
    /// The newest write-ahead log position the snapshot covers; absent in
    /// a snapshot written without a log.
    #[prost(uint64, optional, tag = "3")]
    pub wal_position: Option<u64>,
}

impl Meta {
    /// A snapshot at `revision`, written at `written_unix_ms`, covering the
    /// write-ahead log up to `wal_position`.
    pub(super) fn at(revision: i64, written_unix_ms: i64, wal_position: Option<u64>) -> Self {
        Meta {
            revision,
            written_unix_ms,
            wal_position,
        }
    }
}

#[derive(Clone, PartialEq, Message)]
pub(super) struct LeaseRecord {
    #[prost(int64, tag = "1")]
    pub id: i64,
    #[prost(int64, tag = "2")]
    pub ttl: i64,
    #[prost(int64, tag = "3")]
    pub remaining_ms: i64,
}

/// The end record. `digest` and `bytes` are absent (zero) in format 1.
#[derive(Clone, PartialEq, Message)]
pub(super) struct End {
    /// Records before this one, the meta record included.
    #[prost(uint64, tag = "1")]
    pub records: u64,
    /// CRC-32 of every byte before this record, the magic included.
    #[prost(uint32, tag = "2")]
    pub digest: u32,
    /// Number of bytes before this record.
    #[prost(uint64, tag = "3")]
    pub bytes: u64,
}

/// A writer that tracks the checksum and length of what passes through.
struct Digesting<W> {
    inner: W,
    crc: crc32fast::Hasher,
    bytes: u64,
}

impl<W: Write> Digesting<W> {
    fn put(&mut self, data: &[u8]) -> io::Result<()> {
        self.crc.update(data);
        self.bytes += data.len() as u64;
        self.inner.write_all(data)
    }

    fn record(&mut self, kind: u8, payload: &[u8]) -> io::Result<()> {
        let (head, body) = frame(kind, payload);
        self.put(&head)?;
        self.put(&body)
    }
}

/// `[len: u32 LE][crc32 of body: u32 LE]` and `body = [kind][payload]`.
pub(super) fn frame(kind: u8, payload: &[u8]) -> ([u8; 8], Vec<u8>) {
    let mut body = Vec::with_capacity(payload.len() + 1);
    body.push(kind);
    body.extend_from_slice(payload);
    let mut head = [0u8; 8];
    head[..4].copy_from_slice(&(body.len() as u32).to_le_bytes());
    head[4..].copy_from_slice(&crc32fast::hash(&body).to_le_bytes());
    (head, body)
}

/// Encodes a whole snapshot (format 2) into `w`; returns the bytes written.
/// With `align`, a padding record makes the length one `etcdctl snapshot
/// save` accepts (see [`KIND_PAD`]).
pub(super) fn encode(
    w: &mut impl Write,
    meta: &Meta,
    kvs: &[Kv],
    leases: &[LeaseInfo],
    auth: Option<&AuthImage>,
    align: bool,
) -> io::Result<u64> {
    let mut d = Digesting {
        inner: w,
        crc: crc32fast::Hasher::new(),
        bytes: 0,
    };
    d.put(MAGIC_V2)?;
    d.record(KIND_META, &meta.encode_to_vec())?;
    let mut records = 1u64;
    for kv in kvs {
        d.record(KIND_KV, &kv_payload(kv))?;
        records += 1;
    }
    for l in leases {
        let rec = LeaseRecord {
            id: l.id,
            ttl: l.granted_ttl,
            remaining_ms: l.remaining_ms,
        };
        d.record(KIND_LEASE, &rec.encode_to_vec())?;
        records += 1;
    }
    if let Some(auth) = auth.filter(|a| !a.is_pristine()) {
        // Tokens are live credentials: never written to a file.
        let without_tokens = AuthImage {
            tokens: Vec::new(),
            ..auth.clone()
        };
        d.record(KIND_AUTH, &without_tokens.encode())?;
        records += 1;
    }
    if align {
        let pad = pad_len(d.bytes, records + 1, &d.crc)?;
        d.record(KIND_PAD, &vec![0u8; pad])?;
        records += 1;
    }
    let end = End {
        records,
        digest: d.crc.clone().finalize(),
        bytes: d.bytes,
    };
    d.record(KIND_END, &end.encode_to_vec())?;
    Ok(d.bytes)
}

/// The payload length of the padding record that makes the file's length
/// `ALIGN_REST` modulo `ALIGN_BLOCK`, given the bytes and checksum before
/// it and the record count including it. The end record's length depends
/// on the checksum it carries, so candidates are tried in turn.
fn pad_len(before: u64, records: u64, crc: &crc32fast::Hasher) -> io::Result<usize> {
    let zeros = [0u8; 4 * ALIGN_BLOCK as usize];
    for pad in 0..zeros.len() {
        let (head, body) = frame(KIND_PAD, &zeros[..pad]);
        let mut crc = crc.clone();
        crc.update(&head);
        crc.update(&body);
        let bytes = before + (head.len() + body.len()) as u64;
        let end = End {
            records,
            digest: crc.finalize(),
            bytes,
        };
        let (end_head, end_body) = frame(KIND_END, &end.encode_to_vec());
        let total = bytes + (end_head.len() + end_body.len()) as u64;
        if total % ALIGN_BLOCK == ALIGN_REST {
            return Ok(pad);
        }
    }
    Err(io::Error::other("no padding aligns the snapshot"))
}

/// Reads the snapshot at `path`, all or nothing: any damage is an error that
/// says what is wrong, never a partial result. `now_unix_ms` is the wall
/// clock used to take the downtime off the leases' remaining time.
pub fn read_file(path: &Path, now_unix_ms: i64) -> Result<Restored, ReadError> {
    let file = File::open(path).map_err(ReadError::Io)?;
    decode(BufReader::with_capacity(1 << 20, file), now_unix_ms)
}

/// The revision in the meta record at the start of the file at `path`, if
/// that much of it is intact (names a legacy file, or a damaged one).
pub(super) fn peek_revision(path: &Path) -> Option<i64> {
    let file = File::open(path).ok()?;
    let mut r = Reader::new(BufReader::new(file));
    r.magic().ok()?;
    let (kind, payload) = r.record(0).ok()?;
    (kind == KIND_META)
        .then(|| Meta::decode(payload.as_slice()).ok())
        .flatten()
        .map(|m| m.revision)
}

/// The write-ahead log position in the meta record of the file at `path`
/// (None: unreadable, or written without a log).
pub(super) fn peek_wal_position(path: &Path) -> Option<u64> {
    let file = File::open(path).ok()?;
    let mut r = Reader::new(BufReader::new(file));
    r.magic().ok()?;
    let (kind, payload) = r.record(0).ok()?;
    (kind == KIND_META)
        .then(|| Meta::decode(payload.as_slice()).ok())
        .flatten()
        .and_then(|m| m.wal_position)
}

/// Reads records, keeping the running checksum of what was read.
struct Reader<R> {
    r: R,
    crc: crc32fast::Hasher,
    offset: u64,
    /// The meta record's revision once read, for error reports.
    revision: Option<i64>,
}

impl<R: Read> Reader<R> {
    fn new(r: R) -> Self {
        Reader {
            r,
            crc: crc32fast::Hasher::new(),
            offset: 0,
            revision: None,
        }
    }

    fn damaged(&self, reason: String) -> ReadError {
        ReadError::Damaged {
            reason,
            revision: self.revision,
        }
    }

    fn exact(&mut self, buf: &mut [u8], what: impl FnOnce() -> String) -> Result<(), ReadError> {
        match self.r.read_exact(buf) {
            Ok(()) => {
                self.offset += buf.len() as u64;
                Ok(())
            }
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                Err(self.damaged(format!("cut short: {} (no end record)", what())))
            }
            Err(e) => Err(ReadError::Io(e)),
        }
    }

    /// Checks the magic; returns the format version (1 or 2).
    fn magic(&mut self) -> Result<u8, ReadError> {
        let mut magic = [0u8; 10];
        self.exact(&mut magic, || "the header is incomplete".into())?;
        self.crc.update(&magic);
        match &magic {
            m if m == MAGIC_V2 => Ok(2),
            m if m == MAGIC_V1 => Ok(1),
            _ => Err(self.damaged("not an ephd snapshot (bad header)".into())),
        }
    }

    /// Reads record number `n`; checks its length and checksum. Records
    /// other than the end record are added to the running checksum.
    fn record(&mut self, n: u64) -> Result<(u8, Vec<u8>), ReadError> {
        let at = self.offset;
        let mut head = [0u8; 8];
        self.exact(&mut head, || {
            format!("the file ends at byte {at}, before record {n}")
        })?;
        let len = u32::from_le_bytes(head[..4].try_into().expect("4 bytes"));
        let crc = u32::from_le_bytes(head[4..].try_into().expect("4 bytes"));
        if len == 0 || len > MAX_RECORD {
            return Err(self.damaged(format!(
                "record {n} at byte {at} has an impossible length {len}"
            )));
        }
        let mut body = vec![0u8; len as usize];
        self.exact(&mut body, || {
            format!("record {n} at byte {at} is incomplete")
        })?;
        if crc32fast::hash(&body) != crc {
            return Err(self.damaged(format!("record {n} at byte {at} fails its checksum")));
        }
        if body[0] != KIND_END {
            self.crc.update(&head);
            self.crc.update(&body);
        }
        let kind = body[0];
        body.remove(0);
        Ok((kind, body))
    }
}

/// A key-value record's payload: the key-value as etcd's `mvccpb.KeyValue`.
pub(super) fn kv_payload(kv: &KeyValue) -> Vec<u8> {
    mvccpb::KeyValue {
        key: kv.key.clone(),
        create_revision: kv.create_revision,
        mod_revision: kv.mod_revision,
        version: kv.version,
        value: kv.value.clone(),
        lease: kv.lease,
    }
    .encode_to_vec()
}

fn decode_err(n: u64, what: &str, e: prost::DecodeError) -> String {
    format!("record {n} ({what}) passes its checksum but does not decode: {e}")
}

/// Decodes a whole snapshot from `r` (format 1 or 2).
pub(super) fn decode(r: impl Read, now_unix_ms: i64) -> Result<Restored, ReadError> {
    let mut r = Reader::new(r);
    let version = r.magic()?;
    let (kind, payload) = r.record(0)?;
    if kind != KIND_META {
        return Err(r.damaged(format!("record 0 is of kind {kind}, not the meta record")));
    }
    let meta = Meta::decode(payload.as_slice()).map_err(|e| r.damaged(decode_err(0, "meta", e)))?;
    r.revision = Some(meta.revision);
    let mut out = Restored {
        revision: meta.revision,
        written_unix_ms: meta.written_unix_ms,
        wal_position: meta.wal_position,
        kvs: Vec::new(),
        leases: Vec::new(),
        auth: None,
    };
    // Saturating: both times come from the file or the clock, and a record
    // can pass its checksum and still hold any i64 (a hand-made or
    // hostile file); that must read as damaged data, not overflow.
    let downtime = now_unix_ms.saturating_sub(meta.written_unix_ms).max(0);
    let mut n = 1u64;
    let mut padded = false;
    loop {
        let (kind, payload) = r.record(n)?;
        if padded && kind != KIND_END {
            return Err(r.damaged(format!("record {n} follows the padding record")));
        }
        match kind {
            KIND_PAD => {
                if payload.iter().any(|b| *b != 0) {
                    return Err(r.damaged(format!("record {n}: padding that is not zeros")));
                }
                padded = true;
            }
            KIND_KV => {
                let kv = mvccpb::KeyValue::decode(payload.as_slice())
                    .map_err(|e| r.damaged(decode_err(n, "key-value", e)))?;
                if out.kvs.last().is_some_and(|prev| prev.key >= kv.key) {
                    return Err(r.damaged(format!("record {n}: keys out of order")));
                }
                if !(1 <= kv.create_revision
                    && kv.create_revision <= kv.mod_revision
                    && kv.mod_revision <= meta.revision
                    && kv.version >= 1)
                {
                    return Err(r.damaged(format!(
                        "record {n}: impossible revisions (create {}, mod {}, version {}) \
                         for a snapshot at revision {}",
                        kv.create_revision, kv.mod_revision, kv.version, meta.revision
                    )));
                }
                out.kvs.push(KeyValue {
                    key: kv.key,
                    create_revision: kv.create_revision,
                    mod_revision: kv.mod_revision,
                    version: kv.version,
                    value: kv.value,
                    lease: kv.lease,
                });
            }
            KIND_LEASE => {
                let l = LeaseRecord::decode(payload.as_slice())
                    .map_err(|e| r.damaged(decode_err(n, "lease", e)))?;
                let remaining = l.remaining_ms.saturating_sub(downtime).max(0) as u64;
                out.leases.push(RestoredLease {
                    id: l.id,
                    ttl: l.ttl,
                    remaining: Duration::from_millis(remaining),
                });
            }
            KIND_AUTH => {
                if out.auth.is_some() {
                    return Err(r.damaged(format!("record {n} is a second auth record")));
                }
                let auth = AuthImage::decode(&payload)
                    .map_err(|e| r.damaged(format!("record {n} ({e})")))?;
                out.auth = Some(auth);
            }
            KIND_END => {
                let end = End::decode(payload.as_slice())
                    .map_err(|e| r.damaged(decode_err(n, "end", e)))?;
                if end.records != n {
                    return Err(r.damaged(format!(
                        "the end record counts {} records, the file has {n}",
                        end.records
                    )));
                }
                let digest = r.crc.clone().finalize();
                let before = r.offset - 9 - payload.len() as u64;
                if version >= 2 && (end.digest != digest || end.bytes != before) {
                    return Err(r.damaged(format!(
                        "the whole-file checksum does not match (end record {:08x}, \
                         contents {digest:08x})",
                        end.digest
                    )));
                }
                let mut extra = [0u8; 1];
                return match r.r.read(&mut extra) {
                    Ok(0) => Ok(out),
                    Ok(_) => {
                        Err(r.damaged(format!("bytes follow the end record at byte {}", r.offset)))
                    }
                    Err(e) => Err(ReadError::Io(e)),
                };
            }
            KIND_META => return Err(r.damaged(format!("record {n} is a second meta record"))),
            other => {
                return Err(r.damaged(format!(
                    "record {n} is of unknown kind {other} (written by a newer ephd?)"
                )))
            }
        }
        n += 1;
    }
}

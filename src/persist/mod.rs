//! Optional persistence (`--data-dir`): a snapshot of every live key, every
//! lease with its remaining TTL, and the revision high-water mark, written
//! atomically on shutdown and periodically, and restored on start.
//!
//! ephd is an in-memory store: the snapshot exists so a rolling restart
//! loses nothing, not to survive every crash (writes after the last
//! snapshot are lost on a crash, which is what `--snapshot-interval` bounds).
//!
//! # Format
//! `EPHDSNAP1\n`, then records `[len: u32 LE][crc32 of body: u32 LE][body]`
//! where `body = [kind: u8][protobuf payload]`. The last record is an end
//! marker carrying the record count. A record whose checksum fails, or a
//! file cut short, ends the read at the last good record with a warning;
//! startup never panics on a bad file.

use crate::lease::{LeaseInfo, RestoredLease};
use crate::mvcc::{KeyValue, Kv};
use crate::proto::mvccpb;
use prost::Message;
use std::fs::{self, File};
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const MAGIC: &[u8] = b"EPHDSNAP1\n";
const FILE_NAME: &str = "ephd.snap";
const KIND_META: u8 = 1;
const KIND_KV: u8 = 2;
const KIND_LEASE: u8 = 3;
const KIND_END: u8 = 0xff;
/// Largest record accepted when reading (a corrupt length must not make us
/// allocate gigabytes).
const MAX_RECORD: u32 = 64 << 20;

#[derive(Clone, PartialEq, Message)]
struct Meta {
    #[prost(int64, tag = "1")]
    revision: i64,
    #[prost(int64, tag = "2")]
    written_unix_ms: i64,
}

#[derive(Clone, PartialEq, Message)]
struct LeaseRecord {
    #[prost(int64, tag = "1")]
    id: i64,
    #[prost(int64, tag = "2")]
    ttl: i64,
    #[prost(int64, tag = "3")]
    remaining_ms: i64,
}

#[derive(Clone, PartialEq, Message)]
struct End {
    #[prost(uint64, tag = "1")]
    records: u64,
}

/// What a snapshot held.
#[derive(Debug, Default)]
pub struct Restored {
    /// The revision the snapshot was taken at (the high-water mark).
    pub revision: i64,
    /// Every live key-value, in key order.
    pub kvs: Vec<KeyValue>,
    /// Every lease.
    pub leases: Vec<RestoredLease>,
    /// Whether the file ended cleanly with its end marker.
    pub complete: bool,
}

/// The snapshot file inside `dir`.
pub fn snapshot_path(dir: &Path) -> PathBuf {
    dir.join(FILE_NAME)
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

fn write_record(w: &mut impl Write, kind: u8, payload: &[u8]) -> io::Result<()> {
    let mut body = Vec::with_capacity(payload.len() + 1);
    body.push(kind);
    body.extend_from_slice(payload);
    w.write_all(&(body.len() as u32).to_le_bytes())?;
    w.write_all(&crc32fast::hash(&body).to_le_bytes())?;
    w.write_all(&body)
}

/// Writes a snapshot atomically: a temporary file, fsync, rename, fsync of
/// the directory. Returns the number of bytes written.
pub fn write(dir: &Path, revision: i64, kvs: &[Kv], leases: &[LeaseInfo]) -> io::Result<u64> {
    fs::create_dir_all(dir)?;
    let tmp = dir.join(format!("{FILE_NAME}.tmp"));
    let file = File::create(&tmp)?;
    let mut w = BufWriter::with_capacity(1 << 20, file);
    w.write_all(MAGIC)?;
    let meta = Meta {
        revision,
        written_unix_ms: now_ms(),
    };
    write_record(&mut w, KIND_META, &meta.encode_to_vec())?;
    let mut records = 1u64;
    for kv in kvs {
        let pb = mvccpb::KeyValue {
            key: kv.key.clone(),
            create_revision: kv.create_revision,
            mod_revision: kv.mod_revision,
            version: kv.version,
            value: kv.value.clone(),
            lease: kv.lease,
        };
        write_record(&mut w, KIND_KV, &pb.encode_to_vec())?;
        records += 1;
    }
    for l in leases {
        let rec = LeaseRecord {
            id: l.id,
            ttl: l.granted_ttl,
            remaining_ms: l.remaining_ms,
        };
        write_record(&mut w, KIND_LEASE, &rec.encode_to_vec())?;
        records += 1;
    }
    write_record(&mut w, KIND_END, &End { records }.encode_to_vec())?;
    let file = w.into_inner().map_err(|e| e.into_error())?;
    file.sync_all()?;
    let len = file.metadata()?.len();
    drop(file);
    fs::rename(&tmp, snapshot_path(dir))?;
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(len)
}

/// Reads the snapshot in `dir`, if there is one. Damage is reported through
/// `tracing` and stops the read at the last good record.
pub fn read(dir: &Path) -> io::Result<Option<Restored>> {
    let path = snapshot_path(dir);
    let file = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut r = BufReader::with_capacity(1 << 20, file);
    let mut magic = [0u8; MAGIC.len()];
    if r.read_exact(&mut magic).is_err() || magic != MAGIC {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} is not an ephd snapshot", path.display()),
        ));
    }
    let mut out = Restored::default();
    let mut written_ms = now_ms();
    let mut records = 0u64;
    loop {
        let mut head = [0u8; 8];
        if r.read_exact(&mut head).is_err() {
            tracing::warn!(path = %path.display(), records, "snapshot is cut short; restoring what is intact");
            break;
        }
        let len = u32::from_le_bytes(head[..4].try_into().expect("4 bytes"));
        let crc = u32::from_le_bytes(head[4..].try_into().expect("4 bytes"));
        if len == 0 || len > MAX_RECORD {
            tracing::warn!(path = %path.display(), records, "snapshot record has an impossible length; stopping");
            break;
        }
        let mut body = vec![0u8; len as usize];
        if r.read_exact(&mut body).is_err() {
            tracing::warn!(path = %path.display(), records, "snapshot is cut short; restoring what is intact");
            break;
        }
        if crc32fast::hash(&body) != crc {
            tracing::warn!(path = %path.display(), records, "snapshot record fails its checksum; stopping");
            break;
        }
        let payload = &body[1..];
        let decoded = match body[0] {
            KIND_META => Meta::decode(payload).map(|m| {
                out.revision = m.revision;
                written_ms = m.written_unix_ms;
            }),
            KIND_KV => mvccpb::KeyValue::decode(payload).map(|kv| {
                out.kvs.push(KeyValue {
                    key: kv.key,
                    create_revision: kv.create_revision,
                    mod_revision: kv.mod_revision,
                    version: kv.version,
                    value: kv.value,
                    lease: kv.lease,
                })
            }),
            KIND_LEASE => LeaseRecord::decode(payload).map(|l| {
                let downtime = (now_ms() - written_ms).max(0);
                let remaining = (l.remaining_ms - downtime).max(0) as u64;
                out.leases.push(RestoredLease {
                    id: l.id,
                    ttl: l.ttl,
                    remaining: Duration::from_millis(remaining),
                })
            }),
            KIND_END => End::decode(payload).map(|e| {
                out.complete = e.records == records;
            }),
            other => {
                tracing::warn!(kind = other, "unknown snapshot record kind; skipped");
                Ok(())
            }
        };
        if let Err(e) = decoded {
            tracing::warn!(path = %path.display(), records, error = %e, "undecodable snapshot record; stopping");
            break;
        }
        if body[0] == KIND_END {
            break;
        }
        records += 1;
    }
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use std::sync::Arc;

    fn kv(k: &str, rev: i64, lease: i64) -> Kv {
        Arc::new(KeyValue {
            key: Bytes::copy_from_slice(k.as_bytes()),
            create_revision: rev,
            mod_revision: rev,
            version: 1,
            value: Bytes::from_static(b"value"),
            lease,
        })
    }

    #[test]
    fn round_trips_and_survives_damage() {
        let dir = tempfile::tempdir().unwrap();
        let kvs = vec![kv("a", 2, 0), kv("b", 3, 7)];
        let leases = vec![LeaseInfo {
            id: 7,
            granted_ttl: 60,
            remaining_ttl: 59,
            remaining_ms: 59_000,
            keys: vec![],
        }];
        write(dir.path(), 3, &kvs, &leases).unwrap();
        let r = read(dir.path()).unwrap().unwrap();
        assert!(r.complete);
        assert_eq!(r.revision, 3);
        assert_eq!(r.kvs.len(), 2);
        assert_eq!(r.kvs[1].lease, 7);
        assert_eq!(r.leases[0].id, 7);
        assert!(r.leases[0].remaining <= Duration::from_secs(59));

        // Cut the file in the middle of the last records: the intact prefix
        // is restored, nothing panics.
        let path = snapshot_path(dir.path());
        let bytes = fs::read(&path).unwrap();
        fs::write(&path, &bytes[..bytes.len() - 10]).unwrap();
        let r = read(dir.path()).unwrap().unwrap();
        assert!(!r.complete);
        assert_eq!(r.kvs.len(), 2);

        // Flip a byte inside the first kv record: reading stops before it.
        let mut bad = bytes.clone();
        let at = MAGIC.len() + 8 + 20;
        bad[at] ^= 0xff;
        fs::write(&path, &bad).unwrap();
        let r = read(dir.path()).unwrap().unwrap();
        assert!(!r.complete);
        assert!(r.kvs.len() < 2);

        // Not a snapshot at all: an error, not a panic.
        fs::write(&path, b"garbage").unwrap();
        assert!(read(dir.path()).is_err());
    }
}

//! The state-machine snapshot (encoded here, in the store core, since it is
//! the whole store; cluster mode sends it) a cluster member sends a follower that is
//! further behind than the leader's Raft log reaches: the whole MVCC state
//! ([`StoreImage`]: every key's history since the last compaction, the
//! change log, the compacted and current revisions, leases with their
//! remaining time, alarms) plus opaque sections for the state other parts
//! of cluster mode replicate (membership, auth).
//!
//! # Format
//! `EPHDRAFT1\n`, then records framed like `--data-dir` snapshots
//! (`persist`): `[len: u32 LE][crc32 of body: u32 LE][body]`, `body =
//! [kind: u8][protobuf payload]`. One meta record first (revisions, the
//! Raft index and term it was taken at), then key histories in ascending
//! key order (a history larger than [`KEY_RECORD_BYTES`] goes on in further
//! records of the same key, its versions still ascending), change-log
//! events in log order (a put whose new
//! and previous versions the history holds names them by revision rather
//! than carrying their values again: kind 8, which an ephd older than this
//! format refuses as unknown), leases, alarms,
//! the optional members and auth sections, and an end record with the
//! number of records before it, the CRC-32 of every byte before it and
//! that byte count. Nothing may follow it.
//!
//! # Sizes
//! The whole snapshot may be any size: offsets are `usize`, the end
//! record counts bytes in a `u64`, CRC-32 covers any length. A record's
//! length is 32 bits (`snapshot_records.rs` says why that suffices); a
//! key's history, which grows with the versions kept since the last
//! compaction (a 1 MiB value rewritten 300 times is 300 MiB), is cut into
//! records of about [`KEY_RECORD_BYTES`].
//!
//! Decoding is all or nothing, as for `--data-dir` snapshots: any damage,
//! any record that breaks the store's invariants (keys out of order,
//! revisions above the snapshot's, an event below its compaction) or an
//! unknown kind makes the whole snapshot an error; the store is touched
//! only with a snapshot that decoded whole.

use super::snapshot_records::{Reader, Writer};
use crate::mvcc::{AlarmMember, Event, EventKind, ImageLease, ImageVersion, KeyValue, StoreImage};
use crate::mvcc::{Kv, LoggedEvent};
use crate::proto::mvccpb;
use bytes::Bytes;
use prost::Message;
use std::sync::Arc;

const MAGIC: &[u8; 10] = b"EPHDRAFT1\n";
const KIND_META: u8 = 1;
const KIND_KEY: u8 = 2;
const KIND_EVENT: u8 = 3;
const KIND_LEASE: u8 = 4;
const KIND_ALARM: u8 = 5;
const KIND_MEMBERS: u8 = 6;
const KIND_AUTH: u8 = 7;
const KIND_EVENT_REF: u8 = 8;
const KIND_END: u8 = 0xff;
/// The size a key's history is cut into records of (its versions' encoded
/// bytes; only a single version larger than this makes a larger record).
/// An ephd from before this cut refused records over 256 MiB, so a history
/// larger than that never reached one whole either way.
pub const KEY_RECORD_BYTES: usize = 64 << 20;

/// State of cluster mode kept outside the MVCC store, carried opaquely:
/// cluster mode fills them when it captures a snapshot and installs them
/// with it (`cluster/log/catchup.rs`); here they are only framed and
/// checksummed, never interpreted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sections {
    /// The encoded member list (`Membership::encode`).
    pub members: Option<Vec<u8>>,
    /// The encoded auth state (`AuthImage::encode`): users, roles, the
    /// enabled flag, the auth revision and live tokens; absent while auth
    /// was never used.
    pub auth: Option<Vec<u8>>,
}

/// A decoded snapshot.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    /// The Raft index the state was captured at.
    pub raft_index: u64,
    /// The Raft term of that index.
    pub raft_term: u64,
    /// The MVCC state.
    pub image: StoreImage,
    /// The opaque sections.
    pub sections: Sections,
}

#[derive(Clone, PartialEq, Message)]
struct Meta {
    #[prost(int64, tag = "1")]
    revision: i64,
    #[prost(int64, tag = "2")]
    compacted: i64,
    #[prost(uint64, tag = "3")]
    applied_count: u64,
    #[prost(uint64, tag = "4")]
    raft_index: u64,
    #[prost(uint64, tag = "5")]
    raft_term: u64,
    /// The replicated limits (`limits.rs`), when any: max txn ops, quota
    /// (0: none), adopt TTL (0: none).
    #[prost(bool, tag = "6")]
    has_limits: bool,
    #[prost(uint64, tag = "7")]
    max_txn_ops: u64,
    #[prost(int64, tag = "8")]
    quota_bytes: i64,
    #[prost(int64, tag = "9")]
    adopt_unknown_ttl: i64,
}

/// One key's history; the versions' key-values leave `key` empty (it is
/// the record's).
#[derive(Clone, PartialEq, Message)]
struct KeyRecord {
    #[prost(bytes = "bytes", tag = "1")]
    key: Bytes,
    #[prost(message, repeated, tag = "2")]
    versions: Vec<VersionRecord>,
}

/// A version: no key-value for a deletion tombstone.
#[derive(Clone, PartialEq, Message)]
struct VersionRecord {
    #[prost(int64, tag = "1")]
    revision: i64,
    #[prost(message, optional, tag = "2")]
    kv: Option<mvccpb::KeyValue>,
}

#[derive(Clone, PartialEq, Message)]
struct EventRecord {
    #[prost(int64, tag = "1")]
    revision: i64,
    #[prost(message, optional, tag = "2")]
    event: Option<mvccpb::Event>,
}

/// A put event whose new and previous versions are in the key's history
/// (as every put above the compaction is): the event names them by
/// revision instead of carrying their values again. Without it a snapshot
/// held every value three times (history, event, the next event's previous
/// value): 3 KB per 1 KiB put, 780 MB for a store of 250 MB of history on
/// the failover benchmark.
#[derive(Clone, PartialEq, Message)]
struct EventRefRecord {
    #[prost(int64, tag = "1")]
    revision: i64,
    #[prost(bytes = "bytes", tag = "2")]
    key: Bytes,
    /// The previous version's revision; 0: the event has none.
    #[prost(int64, tag = "3")]
    prev_revision: i64,
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
struct AlarmRecord {
    #[prost(uint64, tag = "1")]
    member_id: u64,
    #[prost(int32, tag = "2")]
    alarm: i32,
}

#[derive(Clone, PartialEq, Message)]
struct End {
    #[prost(uint64, tag = "1")]
    records: u64,
    #[prost(uint32, tag = "2")]
    digest: u32,
    #[prost(uint64, tag = "3")]
    bytes: u64,
}

fn pb_kv(kv: &KeyValue, with_key: bool) -> mvccpb::KeyValue {
    mvccpb::KeyValue {
        key: if with_key {
            kv.key.clone()
        } else {
            Bytes::new()
        },
        create_revision: kv.create_revision,
        mod_revision: kv.mod_revision,
        version: kv.version,
        value: kv.value.clone(),
        lease: kv.lease,
    }
}

fn core_kv(kv: mvccpb::KeyValue, key: Option<&Bytes>) -> Kv {
    Arc::new(KeyValue {
        key: key.cloned().unwrap_or(kv.key),
        create_revision: kv.create_revision,
        mod_revision: kv.mod_revision,
        version: kv.version,
        value: kv.value,
        lease: kv.lease,
    })
}

/// Encodes a snapshot (see the module docs for the layout).
pub fn encode(snap: &Snapshot) -> Vec<u8> {
    encode_cut(snap, KEY_RECORD_BYTES)
}

/// [`encode`] with histories cut into records of about `key_record_bytes`
/// (tests cut small ones).
pub(super) fn encode_cut(snap: &Snapshot, key_record_bytes: usize) -> Vec<u8> {
    let image = &snap.image;
    let mut w = Writer::new(MAGIC);
    let meta = Meta {
        revision: image.revision,
        compacted: image.compacted,
        applied_count: image.applied_count,
        raft_index: snap.raft_index,
        raft_term: snap.raft_term,
        has_limits: image.limits.is_some(),
        max_txn_ops: image.limits.map_or(0, |l| l.max_txn_ops as u64),
        quota_bytes: image.limits.and_then(|l| l.quota_bytes).unwrap_or(0),
        adopt_unknown_ttl: image.limits.and_then(|l| l.adopt_unknown_ttl).unwrap_or(0),
    };
    w.record(KIND_META, &meta.encode_to_vec());
    for (key, versions) in &image.keys {
        let mut rec = KeyRecord {
            key: key.clone(),
            versions: Vec::new(),
        };
        let mut bytes = 0;
        for v in versions {
            let v = VersionRecord {
                revision: v.revision,
                kv: v.kv.as_deref().map(|kv| pb_kv(kv, false)),
            };
            let len = v.encoded_len();
            if !rec.versions.is_empty() && bytes + len > key_record_bytes {
                w.record(KIND_KEY, &rec.encode_to_vec());
                rec.versions.clear();
                bytes = 0;
            }
            bytes += len;
            rec.versions.push(v);
        }
        w.record(KIND_KEY, &rec.encode_to_vec());
    }
    for e in &image.events {
        if let Some(rec) = history_ref(&image.keys, e) {
            w.record(KIND_EVENT_REF, &rec.encode_to_vec());
            continue;
        }
        let rec = EventRecord {
            revision: e.revision,
            event: Some(mvccpb::Event {
                r#type: match e.event.kind {
                    EventKind::Put => 0,
                    EventKind::Delete => 1,
                },
                kv: Some(pb_kv(&e.event.kv, true)),
                prev_kv: e.event.prev_kv.as_deref().map(|kv| pb_kv(kv, true)),
            }),
        };
        w.record(KIND_EVENT, &rec.encode_to_vec());
    }
    for l in &image.leases {
        let rec = LeaseRecord {
            id: l.id,
            ttl: l.ttl,
            remaining_ms: l.remaining_ms,
        };
        w.record(KIND_LEASE, &rec.encode_to_vec());
    }
    for a in &image.alarms {
        let rec = AlarmRecord {
            member_id: a.member_id,
            alarm: a.alarm,
        };
        w.record(KIND_ALARM, &rec.encode_to_vec());
    }
    if let Some(m) = &snap.sections.members {
        w.record(KIND_MEMBERS, m);
    }
    if let Some(a) = &snap.sections.auth {
        w.record(KIND_AUTH, a);
    }
    let end = End {
        records: w.records,
        digest: crc32fast::hash(&w.out),
        bytes: w.out.len() as u64,
    };
    w.record(KIND_END, &end.encode_to_vec());
    w.out
}

/// The versions of `key` in `keys` (sorted by key).
fn history<'a>(keys: &'a [(Bytes, Vec<ImageVersion>)], key: &[u8]) -> Option<&'a [ImageVersion]> {
    let i = keys.binary_search_by(|(k, _)| k.as_ref().cmp(key)).ok()?;
    Some(&keys[i].1)
}

/// The live key-value of `versions` (oldest first) at `revision`.
fn version_at(versions: &[ImageVersion], revision: i64) -> Option<&Kv> {
    let i = versions
        .binary_search_by(|v| v.revision.cmp(&revision))
        .ok()?;
    versions[i].kv.as_ref()
}

/// `e` as a reference into the histories, when it is a put whose new and
/// previous versions are the very ones the history holds.
fn history_ref(keys: &[(Bytes, Vec<ImageVersion>)], e: &LoggedEvent) -> Option<EventRefRecord> {
    if e.event.kind != EventKind::Put || e.event.kv.mod_revision != e.revision {
        return None;
    }
    let versions = history(keys, &e.event.kv.key)?;
    if !Arc::ptr_eq(version_at(versions, e.revision)?, &e.event.kv) {
        return None;
    }
    let prev_revision = match &e.event.prev_kv {
        None => 0,
        Some(p) if p.mod_revision >= 1 && p.mod_revision < e.revision => {
            if !Arc::ptr_eq(version_at(versions, p.mod_revision)?, p) {
                return None;
            }
            p.mod_revision
        }
        Some(_) => return None,
    };
    Some(EventRefRecord {
        revision: e.revision,
        key: e.event.kv.key.clone(),
        prev_revision,
    })
}

/// The event an [`EventRefRecord`] names, sharing the history's versions.
fn resolve_ref(image: &StoreImage, rec: &EventRefRecord, n: u64) -> Result<Event, String> {
    let missing = || format!("record {n}: an event naming a version the history lacks");
    let versions = history(&image.keys, &rec.key).ok_or_else(missing)?;
    let kv = version_at(versions, rec.revision).ok_or_else(missing)?;
    let prev_kv = match rec.prev_revision {
        0 => None,
        p if p >= 1 && p < rec.revision => Some(version_at(versions, p).ok_or_else(missing)?),
        p => return Err(format!("record {n}: impossible previous revision {p}")),
    };
    Ok(Event {
        kind: EventKind::Put,
        kv: kv.clone(),
        prev_kv: prev_kv.cloned(),
    })
}

fn bad(n: u64, what: &str, e: prost::DecodeError) -> String {
    format!("record {n} ({what}) passes its checksum but does not decode: {e}")
}

/// Decodes a snapshot, all or nothing (see the module docs); the error
/// says what is wrong and where.
pub fn decode(bytes: &[u8]) -> Result<Snapshot, String> {
    if bytes.get(..MAGIC.len()) != Some(MAGIC.as_slice()) {
        return Err("not an ephd raft snapshot (bad header)".into());
    }
    let mut r = Reader::new(bytes, MAGIC.len());
    let (kind, payload) = r.record(0)?;
    if kind != KIND_META {
        return Err(format!("record 0 is of kind {kind}, not the meta record"));
    }
    let meta = Meta::decode(payload).map_err(|e| bad(0, "meta", e))?;
    let (rev, compacted) = (meta.revision, meta.compacted);
    if rev < 1 || !(compacted == -1 || (1..=rev).contains(&compacted)) {
        return Err(format!(
            "impossible revisions: current {rev}, compacted {compacted}"
        ));
    }
    let mut snap = Snapshot {
        raft_index: meta.raft_index,
        raft_term: meta.raft_term,
        image: StoreImage {
            revision: rev,
            compacted,
            applied_count: meta.applied_count,
            limits: meta.has_limits.then(|| super::Limits {
                max_txn_ops: usize::try_from(meta.max_txn_ops).unwrap_or(usize::MAX),
                quota_bytes: Some(meta.quota_bytes).filter(|q| *q > 0),
                adopt_unknown_ttl: Some(meta.adopt_unknown_ttl).filter(|t| *t > 0),
            }),
            ..Default::default()
        },
        sections: Sections::default(),
    };
    let image = &mut snap.image;
    let mut n = 1u64;
    loop {
        let start = r.at;
        let (kind, payload) = r.record(n)?;
        match kind {
            KIND_KEY => {
                let rec = KeyRecord::decode(payload).map_err(|e| bad(n, "key", e))?;
                // The same key again: its history goes on.
                let more = image.keys.last().is_some_and(|(k, _)| *k == rec.key);
                if !more && image.keys.last().is_some_and(|(k, _)| *k > rec.key) {
                    return Err(format!("record {n}: keys out of order"));
                }
                let mut versions = Vec::with_capacity(rec.versions.len());
                let mut last = match image.keys.last() {
                    Some((_, v)) if more => v.last().map_or(0, |v| v.revision),
                    _ => 0,
                };
                for v in rec.versions {
                    if v.revision <= last || v.revision > rev {
                        return Err(format!(
                            "record {n}: version at impossible revision {}",
                            v.revision
                        ));
                    }
                    last = v.revision;
                    if let Some(kv) = &v.kv {
                        if kv.mod_revision != v.revision
                            || !(1 <= kv.create_revision && kv.create_revision <= kv.mod_revision)
                            || kv.version < 1
                        {
                            return Err(format!("record {n}: impossible key-value revisions"));
                        }
                    }
                    versions.push(ImageVersion {
                        revision: v.revision,
                        kv: v.kv.map(|kv| core_kv(kv, Some(&rec.key))),
                    });
                }
                if versions.is_empty() {
                    return Err(format!("record {n}: a key without versions"));
                }
                match image.keys.last_mut() {
                    Some((_, history)) if more => history.append(&mut versions),
                    _ => image.keys.push((rec.key, versions)),
                }
            }
            KIND_EVENT => {
                let rec = EventRecord::decode(payload).map_err(|e| bad(n, "event", e))?;
                let event = rec.event.unwrap_or_default();
                let kind = match event.r#type {
                    0 => EventKind::Put,
                    1 => EventKind::Delete,
                    t => return Err(format!("record {n}: unknown event type {t}")),
                };
                let prev = image.events.last().map_or(i64::MIN, |e| e.revision);
                let kv = event
                    .kv
                    .ok_or_else(|| format!("record {n}: an event without a key"))?;
                if rec.revision < prev
                    || rec.revision > rev
                    || rec.revision < compacted
                    || kv.mod_revision != rec.revision
                {
                    return Err(format!(
                        "record {n}: event at impossible revision {}",
                        rec.revision
                    ));
                }
                image.events.push(LoggedEvent {
                    revision: rec.revision,
                    event: Event {
                        kind,
                        kv: core_kv(kv, None),
                        prev_kv: event.prev_kv.map(|kv| core_kv(kv, None)),
                    },
                });
            }
            KIND_EVENT_REF => {
                let rec = EventRefRecord::decode(payload).map_err(|e| bad(n, "event", e))?;
                let prev = image.events.last().map_or(i64::MIN, |e| e.revision);
                if rec.revision < prev || rec.revision > rev || rec.revision < compacted {
                    return Err(format!(
                        "record {n}: event at impossible revision {}",
                        rec.revision
                    ));
                }
                let event = resolve_ref(image, &rec, n)?;
                image.events.push(LoggedEvent {
                    revision: rec.revision,
                    event,
                });
            }
            KIND_LEASE => {
                let l = LeaseRecord::decode(payload).map_err(|e| bad(n, "lease", e))?;
                image.leases.push(ImageLease {
                    id: l.id,
                    ttl: l.ttl,
                    remaining_ms: l.remaining_ms,
                });
            }
            KIND_ALARM => {
                let a = AlarmRecord::decode(payload).map_err(|e| bad(n, "alarm", e))?;
                image.alarms.push(AlarmMember {
                    member_id: a.member_id,
                    alarm: a.alarm,
                });
            }
            KIND_MEMBERS | KIND_AUTH => {
                let slot = if kind == KIND_MEMBERS {
                    &mut snap.sections.members
                } else {
                    &mut snap.sections.auth
                };
                if slot.replace(payload.to_vec()).is_some() {
                    return Err(format!("record {n}: a second section of kind {kind}"));
                }
            }
            KIND_END => {
                let end = End::decode(payload).map_err(|e| bad(n, "end", e))?;
                if end.records != n {
                    return Err(format!(
                        "the end record counts {} records, the snapshot has {n}",
                        end.records
                    ));
                }
                if end.bytes != start as u64 || end.digest != crc32fast::hash(&bytes[..start]) {
                    return Err("the whole-snapshot checksum does not match".into());
                }
                if r.at != bytes.len() {
                    return Err(format!("bytes follow the end record at byte {}", r.at));
                }
                return Ok(snap);
            }
            KIND_META => return Err(format!("record {n} is a second meta record")),
            other => {
                return Err(format!(
                    "record {n} is of unknown kind {other} (written by a newer ephd?)"
                ))
            }
        }
        n += 1;
    }
}

//! etcd's buckets, keys and records in its bbolt database.

use prost::Message;

/// The storage version etcd 3.6 records and sends with each snapshot
/// message.
pub const STORAGE_VERSION: &str = "3.6.0";
/// Bytes of the SHA-256 of the database that follows it in a snapshot.
pub const SHA256_LEN: usize = 32;

pub(super) const KEY: &[u8] = b"key";
pub(super) const META: &[u8] = b"meta";
pub(super) const LEASE: &[u8] = b"lease";
pub(super) const ALARM: &[u8] = b"alarm";
pub(super) const CLUSTER: &[u8] = b"cluster";
pub(super) const MEMBERS: &[u8] = b"members";
pub(super) const MEMBERS_REMOVED: &[u8] = b"members_removed";
pub(super) const AUTH: &[u8] = b"auth";
pub(super) const AUTH_USERS: &[u8] = b"authUsers";
pub(super) const AUTH_ROLES: &[u8] = b"authRoles";

pub(super) const CONSISTENT_INDEX: &[u8] = b"consistent_index";
pub(super) const TERM: &[u8] = b"term";
pub(super) const SCHEDULED_COMPACT: &[u8] = b"scheduledCompactRev";
pub(super) const FINISHED_COMPACT: &[u8] = b"finishedCompactRev";
pub(super) const META_STORAGE_VERSION: &[u8] = b"storageVersion";
pub(super) const CLUSTER_VERSION: &[u8] = b"clusterVersion";
pub(super) const AUTH_ENABLED: &[u8] = b"authEnabled";
pub(super) const AUTH_REVISION: &[u8] = b"authRevision";

/// bbolt's magic number, in the meta page that starts every database.
const BBOLT_MAGIC: u32 = 0xED0C_DAED;

/// Whether `head` (the first bytes of a file) starts a bbolt database: the
/// meta page's magic follows the 16-byte page header.
pub fn has_bbolt_magic(head: &[u8]) -> bool {
    head.get(16..20)
        .is_some_and(|m| u32::from_le_bytes([m[0], m[1], m[2], m[3]]) == BBOLT_MAGIC)
}

/// A `key` bucket key: the main and sub revision, big-endian, joined by
/// `_`.
pub(super) fn revision_key(main: i64, sub: i64) -> [u8; 17] {
    let mut k = [0u8; 17];
    k[..8].copy_from_slice(&main.to_be_bytes());
    k[8] = b'_';
    k[9..].copy_from_slice(&sub.to_be_bytes());
    k
}

/// A `key` bucket key's main revision and whether it marks a deletion
/// (a trailing `t`); `None` if it is not one.
pub(super) fn parse_revision_key(k: &[u8]) -> Option<(i64, bool)> {
    let tombstone = match k.len() {
        17 => false,
        18 if k[17] == b't' => true,
        _ => return None,
    };
    if k[8] != b'_' {
        return None;
    }
    Some((i64::from_be_bytes(k[..8].try_into().ok()?), tombstone))
}

/// A big-endian u64 value (consistent index, term, auth revision).
pub(super) fn parse_u64(v: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(v.try_into().ok()?))
}

/// A `lease` bucket record (etcd's `leasepb.Lease`).
#[derive(Clone, PartialEq, Message)]
pub(super) struct LeaseRecord {
    #[prost(int64, tag = "1")]
    pub id: i64,
    #[prost(int64, tag = "2")]
    pub ttl: i64,
    #[prost(int64, tag = "3")]
    pub remaining_ttl: i64,
}

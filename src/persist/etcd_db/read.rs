//! Reading an etcd database (from `etcdctl snapshot save`, an etcd data
//! dir's `member/snap/db`, or ephd's Maintenance.Snapshot) into the state a
//! start restores.

use super::bbolt::Bolt;
use super::layout::*;
use crate::auth::{perms, AuthImage, PermKind, Permission, Role, State, User};
use crate::lease::RestoredLease;
use crate::mvcc::KeyValue;
use crate::persist::{ReadError, Restored};
use crate::proto::{authpb, mvccpb};
use prost::Message;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

/// Reads the etcd database at `path`: a snapshot's SHA-256 trailer, if
/// there is one, must match; every record must decode. Leases keep the
/// time they had left when the file was written.
pub fn read(path: &Path, now_unix_ms: i64) -> Result<Restored, ReadError> {
    read_bytes(std::fs::read(path).map_err(ReadError::Io)?, now_unix_ms)
}

/// [`read`] of a file's bytes (what Maintenance.Snapshot streams).
pub fn read_bytes(mut bytes: Vec<u8>, now_unix_ms: i64) -> Result<Restored, ReadError> {
    let damaged = |reason: String| ReadError::Damaged {
        reason,
        revision: None,
    };
    // etcd's rule for a snapshot with its checksum after the database.
    if bytes.len() % 512 == SHA256_LEN {
        let cut = bytes.len() - SHA256_LEN;
        let sum = ring::digest::digest(&ring::digest::SHA256, &bytes[..cut]);
        if sum.as_ref() != &bytes[cut..] {
            return Err(damaged(
                "the SHA-256 after the database does not match it (the file is damaged or \
                 cut short)"
                    .into(),
            ));
        }
        bytes.truncate(cut);
    }
    let db = Bolt::new(bytes).map_err(|e| damaged(format!("bbolt: {e}")))?;
    contents(&db, now_unix_ms).map_err(damaged)
}

fn contents(db: &Bolt, now_unix_ms: i64) -> Result<Restored, String> {
    let keys = db
        .bucket(KEY)?
        .ok_or("no \"key\" bucket: not an etcd database")?;
    let mut live: BTreeMap<Vec<u8>, KeyValue> = BTreeMap::new();
    let mut newest = 0i64;
    for (k, v) in &keys {
        let (main, tombstone) =
            parse_revision_key(k).ok_or_else(|| format!("key bucket: {k:?} is not a revision"))?;
        newest = newest.max(main);
        let kv = mvccpb::KeyValue::decode(v.as_slice())
            .map_err(|e| format!("key bucket: revision {main}: {e}"))?;
        if kv.key.is_empty() {
            // `etcdutl snapshot restore --bump-revision` marks the new
            // revision with an empty record; no key is empty.
            continue;
        }
        if tombstone {
            live.remove(kv.key.as_ref());
        } else {
            // What etcd writes: a version's record under its own revision.
            if kv.mod_revision != main
                || kv.create_revision < 1
                || kv.create_revision > kv.mod_revision
                || kv.version < 1
            {
                return Err(format!(
                    "key bucket: revision {main}: impossible revisions (create {}, mod {}, \
                     version {})",
                    kv.create_revision, kv.mod_revision, kv.version
                ));
            }
            live.insert(
                kv.key.to_vec(),
                KeyValue {
                    key: kv.key,
                    create_revision: kv.create_revision,
                    mod_revision: kv.mod_revision,
                    version: kv.version,
                    value: kv.value,
                    lease: kv.lease,
                },
            );
        }
    }
    let meta = db.bucket(META)?.unwrap_or_default();
    let compacted = lookup(&meta, FINISHED_COMPACT)
        .and_then(parse_revision_key)
        .map_or(0, |(main, _)| main);
    Ok(Restored {
        revision: newest.max(compacted).max(1),
        written_unix_ms: now_unix_ms,
        wal_position: None,
        kvs: live.into_values().collect(),
        leases: leases(db)?,
        auth: auth(db)?,
    })
}

fn lookup<'a>(entries: &'a [(Vec<u8>, Vec<u8>)], key: &[u8]) -> Option<&'a [u8]> {
    entries
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_slice())
}

fn leases(db: &Bolt) -> Result<Vec<RestoredLease>, String> {
    db.bucket(LEASE)?
        .unwrap_or_default()
        .iter()
        .map(|(_, v)| {
            let l = LeaseRecord::decode(v.as_slice()).map_err(|e| format!("lease bucket: {e}"))?;
            if l.id <= 0 || l.ttl <= 0 {
                return Err(format!("lease bucket: lease {} with TTL {}", l.id, l.ttl));
            }
            let left = if l.remaining_ttl > 0 {
                l.remaining_ttl
            } else {
                l.ttl
            };
            Ok(RestoredLease {
                id: l.id,
                ttl: l.ttl,
                remaining: Duration::from_secs(left.max(0) as u64),
            })
        })
        .collect()
}

fn auth(db: &Bolt) -> Result<Option<AuthImage>, String> {
    let flags = db.bucket(AUTH)?.unwrap_or_default();
    let enabled = lookup(&flags, AUTH_ENABLED).is_some_and(|v| v == [1]);
    let revision = lookup(&flags, AUTH_REVISION)
        .and_then(parse_u64)
        .unwrap_or(1)
        .max(1);
    let mut state = State {
        enabled,
        ..State::default()
    };
    if let Some(users) = db.bucket(AUTH_USERS)? {
        for (_, v) in &users {
            let u =
                authpb::User::decode(v.as_slice()).map_err(|e| format!("authUsers bucket: {e}"))?;
            if u.name.is_empty() {
                return Err("authUsers bucket: a user without a name".into());
            }
            let no_password = u.options.is_some_and(|o| o.no_password);
            let hash = String::from_utf8_lossy(&u.password).into_owned();
            let mut roles = u.roles;
            roles.sort();
            roles.dedup();
            let user = User {
                password_hash: (!no_password && !hash.is_empty()).then_some(hash),
                roles,
            };
            state
                .users
                .insert(String::from_utf8_lossy(&u.name).into_owned(), user);
        }
    }
    if let Some(roles) = db.bucket(AUTH_ROLES)? {
        for (_, v) in &roles {
            let r =
                authpb::Role::decode(v.as_slice()).map_err(|e| format!("authRoles bucket: {e}"))?;
            if r.name.is_empty() {
                return Err("authRoles bucket: a role without a name".into());
            }
            let mut granted = Vec::new();
            for p in r.key_permission {
                perms::grant(
                    &mut granted,
                    Permission {
                        kind: PermKind::from_i32(p.perm_type),
                        key: p.key.to_vec(),
                        range_end: p.range_end.to_vec(),
                    },
                );
            }
            state.roles.insert(
                String::from_utf8_lossy(&r.name).into_owned(),
                Role { perms: granted },
            );
        }
    }
    let image = AuthImage {
        state,
        revision,
        tokens: Vec::new(),
    };
    Ok((!image.is_pristine()).then_some(image))
}

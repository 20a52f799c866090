//! Writing ephd's state as an etcd database.

use super::bbolt::Bolt;
use super::layout::*;
use crate::auth::AuthImage;
use crate::lease::LeaseInfo;
use crate::mvcc::Kv;
use crate::proto::{authpb, mvccpb};
use bbolt_rs::{BucketRwApi, DbApi, DbRwAPI, TxRwRefApi};
use prost::Message;
use std::io;
use std::path::Path;

/// How full each page is written.
const FILL: f64 = 0.9;

/// What goes into the database.
pub struct Contents<'a> {
    /// The revision the state was taken at.
    pub revision: i64,
    /// Every live key-value at `revision`.
    pub kvs: &'a [Kv],
    /// Every lease.
    pub leases: &'a [LeaseInfo],
    /// Users, roles, the enabled flag and the auth revision.
    pub auth: &'a AuthImage,
}

/// Writes `contents` as a new bbolt database at `path` (which must not
/// exist), every byte that is not the database's content zero.
pub fn write(path: &Path, contents: &Contents) -> io::Result<()> {
    let failed = |e: bbolt_rs::Error| io::Error::other(format!("bbolt: {e}"));
    let mut db = bbolt_rs::Bolt::open(path).map_err(failed)?;
    let mut by_revision: Vec<&Kv> = contents.kvs.iter().collect();
    // Keys written by one txn share its revision and are told apart by the
    // sub revision; which one came first is not kept, so key order.
    by_revision.sort_by(|a, b| (a.mod_revision, &a.key).cmp(&(b.mod_revision, &b.key)));
    db.update(|mut tx| {
        let mut keys = tx.create_bucket(KEY)?;
        // Written in key order, so pages can be filled (as etcd fills its
        // key bucket, whose keys only grow); bbolt's default leaves half.
        keys.set_fill_percent(FILL);
        let mut sub = 0;
        let mut prev = None;
        for kv in &by_revision {
            sub = if prev == Some(kv.mod_revision) {
                sub + 1
            } else {
                0
            };
            prev = Some(kv.mod_revision);
            let record = mvccpb::KeyValue {
                key: kv.key.clone(),
                create_revision: kv.create_revision,
                mod_revision: kv.mod_revision,
                version: kv.version,
                value: kv.value.clone(),
                lease: kv.lease,
            };
            keys.put(revision_key(kv.mod_revision, sub), record.encode_to_vec())?;
        }

        let mut meta = tx.create_bucket(META)?;
        // History before the snapshot's revision is not in the file: an
        // etcd reading it starts at that revision, compacted there.
        let compacted = revision_key(contents.revision, 0);
        meta.put(SCHEDULED_COMPACT, compacted)?;
        meta.put(FINISHED_COMPACT, compacted)?;
        meta.put(
            CONSISTENT_INDEX,
            (contents.revision.max(1) as u64).to_be_bytes(),
        )?;
        meta.put(TERM, 1u64.to_be_bytes())?;
        meta.put(META_STORAGE_VERSION, STORAGE_VERSION)?;

        let mut leases = tx.create_bucket(LEASE)?;
        for l in contents.leases {
            let record = LeaseRecord {
                id: l.id,
                ttl: l.granted_ttl,
                remaining_ttl: l.remaining_ttl.max(1),
            };
            leases.put((l.id as u64).to_be_bytes(), record.encode_to_vec())?;
        }

        let mut auth = tx.create_bucket(AUTH)?;
        auth.put(AUTH_ENABLED, [u8::from(contents.auth.state.enabled)])?;
        auth.put(AUTH_REVISION, contents.auth.revision.to_be_bytes())?;
        let mut users = tx.create_bucket(AUTH_USERS)?;
        for (name, u) in &contents.auth.state.users {
            let record = authpb::User {
                name: name.clone().into_bytes().into(),
                password: u
                    .password_hash
                    .clone()
                    .unwrap_or_default()
                    .into_bytes()
                    .into(),
                roles: u.roles.clone(),
                options: Some(authpb::UserAddOptions {
                    no_password: u.password_hash.is_none(),
                }),
            };
            users.put(name, record.encode_to_vec())?;
        }
        let mut roles = tx.create_bucket(AUTH_ROLES)?;
        for (name, r) in &contents.auth.state.roles {
            let record = authpb::Role {
                name: name.clone().into_bytes().into(),
                key_permission: r
                    .perms
                    .iter()
                    .map(|p| authpb::Permission {
                        perm_type: p.kind.as_i32(),
                        key: p.key.clone().into(),
                        range_end: p.range_end.clone().into(),
                    })
                    .collect(),
            };
            roles.put(name, record.encode_to_vec())?;
        }

        let mut cluster = tx.create_bucket(CLUSTER)?;
        cluster.put(CLUSTER_VERSION, STORAGE_VERSION)?;
        for empty in [ALARM, MEMBERS, MEMBERS_REMOVED] {
            tx.create_bucket(empty)?;
        }
        Ok(())
    })
    .map_err(failed)?;
    db.close();
    // bbolt-rs writes pages from memory it does not clear: only what the
    // pages hold may leave the process.
    let written = std::fs::read(path)?;
    let clean = Bolt::new(written)
        .and_then(Bolt::scrubbed)
        .map_err(|e| io::Error::other(format!("the database just written does not read: {e}")))?;
    std::fs::write(path, clean)
}

//! Auth on the write path: what a request made while auth was enabled may
//! do, checked where it applies (etcd's auth applier), and how an auth
//! change itself applies. The rules of users, roles and permissions are
//! the auth module's; this file says which permission each kind of entry
//! needs, with etcd 3.4's choices (a txn needs READ for every compare and
//! range and WRITE for every put and delete, nested txns included; a
//! lease revoke needs WRITE on every key attached to the lease; a put or
//! delete asking for `prev_kv` needs READ too).

use super::entry::{Applied, Entry};
use super::store::Store;
use super::types::*;
use crate::auth::{AuthInfo, AuthOp, PermKind};
use crate::error::Result;

impl Store {
    /// Checks that `by` may apply `entry`.
    pub(super) fn authorize(&self, by: &AuthInfo, entry: &Entry) -> Result<()> {
        let auth = self.auth();
        match entry {
            Entry::Put(r) => {
                if r.prev_kv {
                    auth.check(by, PermKind::Read, &r.key, &[])?;
                }
                auth.check(by, PermKind::Write, &r.key, &[])
            }
            Entry::Delete(r) => {
                auth.check(by, PermKind::Write, &r.key, &r.range_end)?;
                if r.prev_kv {
                    auth.check(by, PermKind::Read, &r.key, &r.range_end)?;
                }
                Ok(())
            }
            Entry::Txn(t) => self.authorize_txn(by, t),
            Entry::LeaseRevoke { id } => {
                for key in self.lessor().keys(*id) {
                    auth.check(by, PermKind::Write, &key, &[])?;
                }
                Ok(())
            }
            Entry::Auth(AuthOp::Authenticate { .. }) => Ok(()),
            Entry::Auth(_) => auth.check_admin(Some(by)),
            // etcd 3.4 checks no permission for these (a lease checkpoint
            // is the leader's own entry, never a client's).
            Entry::Compact { .. }
            | Entry::LeaseCheckpoint { .. }
            | Entry::Initialize { .. }
            | Entry::Limits(_)
            | Entry::LeaseGrant { .. }
            | Entry::Alarm { .. }
            | Entry::Authorized { .. } => Ok(()),
        }
    }

    fn authorize_txn(&self, by: &AuthInfo, t: &TxnRequest) -> Result<()> {
        let auth = self.auth();
        for op in t.success.iter().chain(&t.failure) {
            match op {
                RequestOp::Range(r) => auth.check(by, PermKind::Read, &r.key, &r.range_end)?,
                RequestOp::Put(p) => auth.check(by, PermKind::Write, &p.key, &[])?,
                RequestOp::Delete(d) => auth.check(by, PermKind::Write, &d.key, &d.range_end)?,
                RequestOp::Txn(inner) => self.authorize_txn(by, inner)?,
                RequestOp::Empty => {}
            }
        }
        for c in &t.compare {
            auth.check(by, PermKind::Read, &c.key, &c.range_end)?;
        }
        Ok(())
    }

    /// An auth change made while auth was disabled: if auth is enabled by
    /// now, it fails as a request without a token does (Authenticate needs
    /// no check).
    pub(super) fn authorize_plain_auth(&self, op: &AuthOp) -> Result<()> {
        match op {
            AuthOp::Authenticate { .. } => Ok(()),
            _ => self.auth().check_admin(None),
        }
    }

    /// Applies an auth change; it takes no revision of the key space.
    pub(super) fn apply_auth(&self, op: &AuthOp) -> Result<()> {
        let _writers = self.range_writers().read();
        self.check_running()?;
        let before = self.auth().revision();
        self.auth().apply(op)?;
        let after = self.auth().revision();
        if after != before {
            // `op`'s Debug hides password hashes and tokens.
            tracing::info!(op = ?op, auth_revision = after, "auth changed");
        }
        self.stats().applied();
        Ok(())
    }

    /// The result of an auth entry.
    pub(super) fn auth_applied(&self) -> Applied {
        Applied::Auth {
            revision: self.current_revision(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::{hash_password, AuthError};
    use crate::error::Error;
    use crate::mvcc::StoreConfig;
    use bytes::Bytes;

    fn put(key: &str) -> Entry {
        Entry::Put(PutRequest {
            key: Bytes::copy_from_slice(key.as_bytes()),
            value: Bytes::from_static(b"v"),
            ..Default::default()
        })
    }

    /// A store with auth enabled, root and u1 (READWRITE on `/a/`).
    fn store() -> Store {
        let s = Store::new(StoreConfig::default());
        let ops = [
            AuthOp::UserAdd {
                name: "root".into(),
                password_hash: Some(hash_password("pw", 4)),
            },
            AuthOp::UserGrantRole {
                user: "root".into(),
                role: "root".into(),
            },
            AuthOp::UserAdd {
                name: "u1".into(),
                password_hash: Some(hash_password("p", 4)),
            },
            AuthOp::RoleAdd { name: "r".into() },
            AuthOp::RoleGrantPermission {
                name: "r".into(),
                perm: Some(crate::auth::Permission {
                    kind: PermKind::ReadWrite,
                    key: b"/a/".to_vec(),
                    range_end: b"/a0".to_vec(),
                }),
            },
            AuthOp::UserGrantRole {
                user: "u1".into(),
                role: "r".into(),
            },
            AuthOp::Enable,
        ];
        for op in ops {
            s.apply(Entry::Auth(op)).unwrap();
        }
        s
    }

    fn as_user(s: &Store, user: &str, revision: u64, entry: Entry) -> Result<Applied> {
        s.apply(Entry::Authorized {
            by: AuthInfo {
                user: user.into(),
                revision,
            },
            entry: Box::new(entry),
        })
    }

    #[test]
    fn writes_are_checked_where_they_apply() {
        let s = store();
        let rev = s.auth().revision();
        assert!(as_user(&s, "u1", rev, put("/a/x")).is_ok());
        assert_eq!(
            as_user(&s, "u1", rev, put("/b")),
            Err(Error::Auth(AuthError::PermissionDenied))
        );
        // Checked at an older auth revision: refused, as etcd's apply does.
        s.apply(Entry::Auth(AuthOp::RoleAdd { name: "r2".into() }))
            .expect_err("a plain auth change while enabled has no user");
        as_user(
            &s,
            "root",
            rev,
            Entry::Auth(AuthOp::RoleAdd { name: "r2".into() }),
        )
        .unwrap();
        assert_eq!(
            as_user(&s, "u1", rev, put("/a/x")),
            Err(Error::Auth(AuthError::AuthOldRevision))
        );
        // Only root manages auth.
        assert_eq!(
            as_user(&s, "u1", rev + 1, Entry::Auth(AuthOp::Disable)),
            Err(Error::Auth(AuthError::PermissionDenied))
        );
    }

    /// As etcd checks a request (v3rpc) before its permissions (apply): a
    /// user's malformed request gets the request's error, not
    /// "permission denied", whatever the user may touch.
    #[test]
    fn a_users_malformed_request_gets_the_request_error_first() {
        let s = store();
        let u1 = AuthInfo {
            user: "u1".into(),
            revision: s.auth().revision(),
        };
        let empty = PutRequest::default();
        assert_eq!(
            s.apply_command(empty, Some(u1.clone())).unwrap_err(),
            Error::EmptyKey
        );
        let outside = PutRequest {
            key: Bytes::from_static(b"/b/x"),
            ..Default::default()
        };
        assert_eq!(
            s.apply_command(outside, Some(u1)).unwrap_err(),
            Error::Auth(AuthError::PermissionDenied)
        );
    }
}

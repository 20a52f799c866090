//! The auth state as snapshots carry it: users (with their password
//! hashes), roles, the enabled flag, the auth revision and, for Raft
//! snapshots only, the live simple tokens.
//!
//! Two kinds of snapshot need it. A `--data-dir` snapshot (and the stream
//! `etcdctl snapshot save` writes, which is the same format) must bring the
//! users and roles back after a restart, as etcd's database does; without
//! them a restarted server would come back with auth disabled and anyone
//! could write. A Raft snapshot must give a member that catches up by
//! snapshot the same auth state as the others, or it would decide
//! authorized entries differently. Tokens are live credentials, kept only
//! in memory: a Raft snapshot carries them (a client's token then works on
//! the caught-up member too), a file never does (after a restart clients
//! authenticate again, as after an etcd restart).
//!
//! The encoding is a protobuf message of its own, carried as one opaque
//! record by both snapshot formats. Decoding checks what applying ops
//! guarantees (names present and unique, known permission kinds, a
//! revision of at least 1) and rebuilds the sorted order the checks rely
//! on, so a hand-made or damaged image is refused, never half-installed.

use super::perms::{PermKind, Permission};
use super::state::{Role, State, User};
use prost::Message;
use std::collections::BTreeMap;

/// A copy of one member's auth state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuthImage {
    /// Users, roles and the enabled flag.
    pub state: State,
    /// The auth revision.
    pub revision: u64,
    /// Live simple tokens and their users (empty in `--data-dir` files).
    pub tokens: Vec<(String, String)>,
}

#[derive(Clone, PartialEq, Message)]
struct ImageRecord {
    #[prost(bool, tag = "1")]
    enabled: bool,
    #[prost(uint64, tag = "2")]
    revision: u64,
    #[prost(message, repeated, tag = "3")]
    users: Vec<UserRecord>,
    #[prost(message, repeated, tag = "4")]
    roles: Vec<RoleRecord>,
    #[prost(message, repeated, tag = "5")]
    tokens: Vec<TokenRecord>,
}

#[derive(Clone, PartialEq, Message)]
struct UserRecord {
    #[prost(string, tag = "1")]
    name: String,
    /// Absent for a user added with `no_password`.
    #[prost(string, optional, tag = "2")]
    password_hash: Option<String>,
    #[prost(string, repeated, tag = "3")]
    roles: Vec<String>,
}

#[derive(Clone, PartialEq, Message)]
struct RoleRecord {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(message, repeated, tag = "2")]
    perms: Vec<PermRecord>,
}

#[derive(Clone, PartialEq, Message)]
struct PermRecord {
    /// etcd's wire number: READ 0, WRITE 1, READWRITE 2.
    #[prost(int32, tag = "1")]
    kind: i32,
    #[prost(bytes = "vec", tag = "2")]
    key: Vec<u8>,
    #[prost(bytes = "vec", tag = "3")]
    range_end: Vec<u8>,
}

#[derive(Clone, PartialEq, Message)]
struct TokenRecord {
    #[prost(string, tag = "1")]
    token: String,
    #[prost(string, tag = "2")]
    user: String,
}

impl AuthImage {
    /// Whether this is the state of a server whose auth was never touched
    /// (nothing worth carrying).
    pub fn is_pristine(&self) -> bool {
        *self == AuthImage::pristine()
    }

    /// A fresh server's auth state: disabled, no users, no roles, auth
    /// revision 1.
    pub fn pristine() -> AuthImage {
        AuthImage {
            state: State::default(),
            revision: 1,
            tokens: Vec::new(),
        }
    }

    /// The bytes a snapshot record carries.
    pub fn encode(&self) -> Vec<u8> {
        ImageRecord {
            enabled: self.state.enabled,
            revision: self.revision,
            users: self
                .state
                .users
                .iter()
                .map(|(name, u)| UserRecord {
                    name: name.clone(),
                    password_hash: u.password_hash.clone(),
                    roles: u.roles.clone(),
                })
                .collect(),
            roles: self
                .state
                .roles
                .iter()
                .map(|(name, r)| RoleRecord {
                    name: name.clone(),
                    perms: r
                        .perms
                        .iter()
                        .map(|p| PermRecord {
                            kind: p.kind.as_i32(),
                            key: p.key.clone(),
                            range_end: p.range_end.clone(),
                        })
                        .collect(),
                })
                .collect(),
            tokens: self
                .tokens
                .iter()
                .map(|(token, user)| TokenRecord {
                    token: token.clone(),
                    user: user.clone(),
                })
                .collect(),
        }
        .encode_to_vec()
    }

    /// The image a snapshot record's bytes carry; an error says what is
    /// wrong with them.
    pub fn decode(bytes: &[u8]) -> Result<AuthImage, String> {
        let rec = ImageRecord::decode(bytes).map_err(|e| format!("auth state: {e}"))?;
        if rec.revision == 0 {
            return Err("auth state: auth revision 0".into());
        }
        let mut users = BTreeMap::new();
        for u in rec.users {
            if u.name.is_empty() {
                return Err("auth state: a user without a name".into());
            }
            let mut roles = u.roles;
            roles.sort();
            roles.dedup();
            let user = User {
                password_hash: u.password_hash,
                roles,
            };
            if users.insert(u.name.clone(), user).is_some() {
                return Err(format!("auth state: user {:?} twice", u.name));
            }
        }
        let mut roles = BTreeMap::new();
        for r in rec.roles {
            if r.name.is_empty() {
                return Err("auth state: a role without a name".into());
            }
            let mut perms = Vec::with_capacity(r.perms.len());
            for p in r.perms {
                if !(0..=2).contains(&p.kind) {
                    return Err(format!(
                        "auth state: role {:?} has a permission of unknown kind {}",
                        r.name, p.kind
                    ));
                }
                super::perms::grant(
                    &mut perms,
                    Permission {
                        kind: PermKind::from_i32(p.kind),
                        key: p.key,
                        range_end: p.range_end,
                    },
                );
            }
            if roles.insert(r.name.clone(), Role { perms }).is_some() {
                return Err(format!("auth state: role {:?} twice", r.name));
            }
        }
        let state = State {
            enabled: rec.enabled,
            users,
            roles,
        };
        if state.enabled && !state.is_root(super::ROOT) {
            return Err("auth state: enabled without a root user that has the root role".into());
        }
        Ok(AuthImage {
            state,
            revision: rec.revision,
            tokens: rec.tokens.into_iter().map(|t| (t.token, t.user)).collect(),
        })
    }
}

#[cfg(test)]
#[path = "image_tests.rs"]
mod tests;

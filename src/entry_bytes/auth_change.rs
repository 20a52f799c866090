//! An [`AuthOp`] as the `AuthChange` of a Raft log entry, and back.

use crate::auth::{AuthOp, PermKind, Permission};
use crate::proto::ephd::internal::{auth_change::Kind, AuthChange};
use bytes::Bytes;

/// The log form of `op`.
pub(crate) fn encode(op: AuthOp) -> AuthChange {
    let mut c = AuthChange::default();
    let kind = match op {
        AuthOp::Enable => Kind::Enable,
        AuthOp::Disable => Kind::Disable,
        AuthOp::UserAdd {
            name,
            password_hash,
        } => {
            c.name = name;
            c.password_hash = password_hash;
            Kind::UserAdd
        }
        AuthOp::UserDelete { name } => {
            c.name = name;
            Kind::UserDelete
        }
        AuthOp::UserChangePassword {
            name,
            password_hash,
        } => {
            c.name = name;
            c.password_hash = password_hash;
            Kind::UserChangePassword
        }
        AuthOp::UserGrantRole { user, role } => {
            c.name = user;
            c.role = role;
            Kind::UserGrantRole
        }
        AuthOp::UserRevokeRole { name, role } => {
            c.name = name;
            c.role = role;
            Kind::UserRevokeRole
        }
        AuthOp::RoleAdd { name } => {
            c.name = name;
            Kind::RoleAdd
        }
        AuthOp::RoleDelete { role } => {
            c.name = role;
            Kind::RoleDelete
        }
        AuthOp::RoleGrantPermission { name, perm } => {
            c.name = name;
            if let Some(p) = perm {
                c.perm_type = Some(p.kind.as_i32());
                c.key = Bytes::from(p.key);
                c.range_end = Bytes::from(p.range_end);
            }
            Kind::RoleGrantPermission
        }
        AuthOp::RoleRevokePermission {
            role,
            key,
            range_end,
        } => {
            c.name = role;
            c.key = Bytes::from(key);
            c.range_end = Bytes::from(range_end);
            Kind::RoleRevokePermission
        }
        AuthOp::Authenticate { name, token } => {
            c.name = name;
            c.token = token;
            Kind::Authenticate
        }
    };
    c.kind = kind as i32;
    c
}

/// The op a log entry's `AuthChange` stands for.
pub(crate) fn decode(c: AuthChange) -> Result<AuthOp, String> {
    let kind = Kind::try_from(c.kind).map_err(|_| format!("unknown auth change {}", c.kind))?;
    Ok(match kind {
        Kind::Enable => AuthOp::Enable,
        Kind::Disable => AuthOp::Disable,
        Kind::UserAdd => AuthOp::UserAdd {
            name: c.name,
            password_hash: c.password_hash,
        },
        Kind::UserDelete => AuthOp::UserDelete { name: c.name },
        Kind::UserChangePassword => AuthOp::UserChangePassword {
            name: c.name,
            password_hash: c.password_hash,
        },
        Kind::UserGrantRole => AuthOp::UserGrantRole {
            user: c.name,
            role: c.role,
        },
        Kind::UserRevokeRole => AuthOp::UserRevokeRole {
            name: c.name,
            role: c.role,
        },
        Kind::RoleAdd => AuthOp::RoleAdd { name: c.name },
        Kind::RoleDelete => AuthOp::RoleDelete { role: c.name },
        Kind::RoleGrantPermission => AuthOp::RoleGrantPermission {
            name: c.name,
            perm: c.perm_type.map(|t| Permission {
                kind: PermKind::from_i32(t),
                key: c.key.to_vec(),
                range_end: c.range_end.to_vec(),
            }),
        },
        Kind::RoleRevokePermission => AuthOp::RoleRevokePermission {
            role: c.name,
            key: c.key.to_vec(),
            range_end: c.range_end.to_vec(),
        },
        Kind::Authenticate => AuthOp::Authenticate {
            name: c.name,
            token: c.token,
        },
    })
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// One op of every kind, with every field set somewhere.
    pub(crate) fn every_op() -> Vec<AuthOp> {
        let perm = |kind| Permission {
            kind,
            key: b"a".to_vec(),
            range_end: b"b".to_vec(),
        };
        vec![
            AuthOp::Enable,
            AuthOp::Disable,
            AuthOp::UserAdd {
                name: "u".into(),
                password_hash: Some("$2b$04$x".into()),
            },
            AuthOp::UserAdd {
                name: "np".into(),
                password_hash: None,
            },
            AuthOp::UserDelete { name: "u".into() },
            AuthOp::UserChangePassword {
                name: "u".into(),
                password_hash: Some("h".into()),
            },
            AuthOp::UserGrantRole {
                user: "u".into(),
                role: "r".into(),
            },
            AuthOp::UserRevokeRole {
                name: "u".into(),
                role: "r".into(),
            },
            AuthOp::RoleAdd { name: "r".into() },
            AuthOp::RoleDelete { role: "r".into() },
            AuthOp::RoleGrantPermission {
                name: "r".into(),
                perm: Some(perm(PermKind::Read)),
            },
            AuthOp::RoleGrantPermission {
                name: "r".into(),
                perm: Some(perm(PermKind::ReadWrite)),
            },
            AuthOp::RoleGrantPermission {
                name: "r".into(),
                perm: None,
            },
            AuthOp::RoleRevokePermission {
                role: "r".into(),
                key: b"k".to_vec(),
                range_end: vec![0],
            },
            AuthOp::Authenticate {
                name: "u".into(),
                token: "tok.1".into(),
            },
        ]
    }

    #[test]
    fn every_op_survives_the_log() {
        for op in every_op() {
            assert_eq!(decode(encode(op.clone())).unwrap(), op);
        }
    }
}

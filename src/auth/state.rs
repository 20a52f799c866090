//! Users and roles, and how each auth change applies to them. Everything
//! here is deterministic: password hashes and tokens arrive made, in the
//! [`AuthOp`]; the rules and their order of checks are etcd 3.4's.

use super::perms::{self, Permission};
use super::{AuthError, AuthOp};
use std::collections::BTreeMap;

/// The name of the user and of the role that may do everything, and that
/// AuthEnable requires.
pub const ROOT: &str = "root";

/// One user.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct User {
    /// bcrypt hash of the password; `None` for a user added with
    /// `no_password` (it can only authenticate by TLS common name).
    pub password_hash: Option<String>,
    /// Granted role names, sorted.
    pub roles: Vec<String>,
}

/// One role: its permissions, sorted by key then range end.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Role {
    /// The granted permissions.
    pub perms: Vec<Permission>,
}

/// Users, roles and the enabled flag.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct State {
    /// Whether requests are checked.
    pub enabled: bool,
    /// Users by name.
    pub users: BTreeMap<String, User>,
    /// Roles by name.
    pub roles: BTreeMap<String, Role>,
}

/// What applying an op changed beyond the state: the caller bumps the
/// auth revision and drops tokens accordingly.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Effect {
    /// The auth revision moves (every change but Authenticate, AuthEnable
    /// and the no-ops, as etcd counts).
    pub bump: bool,
    /// Forget every token of this user.
    pub revoke_user: Option<String>,
    /// Forget every token.
    pub clear_tokens: bool,
}

fn changed() -> Result<Effect, AuthError> {
    Ok(Effect {
        bump: true,
        ..Effect::default()
    })
}

impl State {
    /// Whether `user` exists and has the `root` role.
    pub fn is_root(&self, user: &str) -> bool {
        self.users
            .get(user)
            .is_some_and(|u| u.roles.iter().any(|r| r == ROOT))
    }

    /// Applies one op (Authenticate's token excepted: see the caller).
    pub fn apply(&mut self, op: &AuthOp) -> Result<Effect, AuthError> {
        match op {
            AuthOp::Enable => {
                if self.enabled {
                    return Ok(Effect::default());
                }
                let root = self.users.get(ROOT).ok_or(AuthError::RootUserNotExist)?;
                if !root.roles.iter().any(|r| r == ROOT) {
                    return Err(AuthError::RootRoleNotExist);
                }
                // etcd counts disabling as an auth change, enabling not.
                self.enabled = true;
                Ok(Effect::default())
            }
            AuthOp::Disable => {
                if !self.enabled {
                    return Ok(Effect::default());
                }
                self.enabled = false;
                Ok(Effect {
                    bump: true,
                    clear_tokens: true,
                    ..Effect::default()
                })
            }
            AuthOp::UserAdd {
                name,
                password_hash,
            } => {
                if name.is_empty() {
                    return Err(AuthError::UserEmpty);
                }
                if self.users.contains_key(name) {
                    return Err(AuthError::UserAlreadyExist);
                }
                self.users.insert(
                    name.clone(),
                    User {
                        password_hash: password_hash.clone(),
                        roles: Vec::new(),
                    },
                );
                changed()
            }
            AuthOp::UserDelete { name } => {
                if self.enabled && name == ROOT {
                    return Err(AuthError::InvalidAuthMgmt);
                }
                self.users.remove(name).ok_or(AuthError::UserNotFound)?;
                Ok(Effect {
                    bump: true,
                    revoke_user: Some(name.clone()),
                    ..Effect::default()
                })
            }
            AuthOp::UserChangePassword {
                name,
                password_hash,
            } => {
                let user = self.users.get_mut(name).ok_or(AuthError::UserNotFound)?;
                user.password_hash = password_hash.clone();
                Ok(Effect {
                    bump: true,
                    revoke_user: Some(name.clone()),
                    ..Effect::default()
                })
            }
            AuthOp::UserGrantRole { user, role } => {
                // etcd looks up the user first, then the role; the `root`
                // role may be granted before it exists.
                if !self.users.contains_key(user) {
                    return Err(AuthError::UserNotFound);
                }
                if role != ROOT && !self.roles.contains_key(role) {
                    return Err(AuthError::RoleNotFound);
                }
                let u = self.users.get_mut(user).expect("looked up above");
                match u.roles.binary_search(role) {
                    Ok(_) => Ok(Effect::default()),
                    Err(i) => {
                        u.roles.insert(i, role.clone());
                        changed()
                    }
                }
            }
            AuthOp::UserRevokeRole { name, role } => {
                if self.enabled && name == ROOT && role == ROOT {
                    return Err(AuthError::InvalidAuthMgmt);
                }
                let u = self.users.get_mut(name).ok_or(AuthError::UserNotFound)?;
                let i = u
                    .roles
                    .binary_search(role)
                    .map_err(|_| AuthError::RoleNotGranted)?;
                u.roles.remove(i);
                changed()
            }
            AuthOp::RoleAdd { name } => {
                if name.is_empty() {
                    return Err(AuthError::RoleEmpty);
                }
                if self.roles.contains_key(name) {
                    return Err(AuthError::RoleAlreadyExist);
                }
                self.roles.insert(name.clone(), Role::default());
                changed()
            }
            AuthOp::RoleDelete { role } => {
                if self.enabled && role == ROOT {
                    return Err(AuthError::InvalidAuthMgmt);
                }
                self.roles.remove(role).ok_or(AuthError::RoleNotFound)?;
                for u in self.users.values_mut() {
                    if let Ok(i) = u.roles.binary_search(role) {
                        u.roles.remove(i);
                    }
                }
                changed()
            }
            AuthOp::RoleGrantPermission { name, perm } => {
                let role = self.roles.get_mut(name).ok_or(AuthError::RoleNotFound)?;
                let perm = perm.clone().ok_or(AuthError::PermissionNotGiven)?;
                perms::grant(&mut role.perms, perm);
                changed()
            }
            AuthOp::RoleRevokePermission {
                role,
                key,
                range_end,
            } => {
                let r = self.roles.get_mut(role).ok_or(AuthError::RoleNotFound)?;
                let i = r
                    .perms
                    .iter()
                    .position(|p| &p.key == key && &p.range_end == range_end)
                    .ok_or(AuthError::PermissionNotGranted)?;
                r.perms.remove(i);
                changed()
            }
            AuthOp::Authenticate { name, .. } => {
                if !self.enabled {
                    // The caller maps this to "authentication is not
                    // enabled" (not an AuthError).
                    return Err(AuthError::AuthFailed);
                }
                match self.users.get(name) {
                    Some(u) if u.password_hash.is_some() => Ok(Effect::default()),
                    Some(_) => Err(AuthError::NoPasswordUser),
                    None => Err(AuthError::AuthFailed),
                }
            }
        }
    }
}

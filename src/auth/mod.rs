//! etcd's auth: users, roles, key permissions, the enabled flag, the auth
//! revision and simple tokens, with etcd 3.4's rules and texts.
//!
//! # Where it sits
//! The store core owns one [`AuthStore`] (`Store::auth`), so every auth
//! change is an `mvcc::Entry::Auth` applied by `Store::apply` like any
//! write, and goes through the backend (`crate::backend`): in cluster mode, through the
//! Raft log to every member. Applying is deterministic: a password's bcrypt
//! hash ([`hash_password`]) and a token ([`AuthStore::new_token`]) are made by the
//! member that proposes, and the entry carries them.
//!
//! # Checks
//! While auth is enabled, the gRPC adapters turn a request's token (or its
//! TLS client certificate's common name) into an [`AuthInfo`]: the user and
//! the auth revision it was checked at. Reads are checked at once; writes
//! travel as `Entry::Authorized` and are checked where they apply, so a
//! request checked before an auth change and applied after it fails with
//! "revision of auth store is old", as in etcd.
//!
//! # Cost while disabled
//! [`AuthStore::active`] is one relaxed atomic load; while it is false (no
//! token was ever issued and auth is off) the adapters do nothing else.

mod image;
mod jwt;
pub mod perms;
mod state;
mod tokens;

#[cfg(test)]
mod tests;

pub use crate::error::{AuthError, WATCH_PERMISSION_DENIED};
pub use image::AuthImage;
pub use jwt::{JwtOptions, JwtTokens, DEFAULT_JWT_TTL};
pub use perms::{PermKind, Permission};
pub use state::{Role, State, User, ROOT};

use crate::error::{Error, Result};
use parking_lot::RwLock;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokens::Tokens;

/// etcd's default bcrypt cost (`--bcrypt-cost`).
pub const DEFAULT_BCRYPT_COST: u32 = 10;

/// etcd's default simple-token TTL (`--auth-token-ttl`, seconds).
pub const DEFAULT_TOKEN_TTL: Duration = Duration::from_secs(300);

/// Auth settings.
#[derive(Debug, Clone)]
pub struct AuthConfig {
    /// A simple token lapses after this long without use.
    pub token_ttl: Duration,
    /// bcrypt cost of password hashes made by this member.
    pub bcrypt_cost: u32,
    /// `--auth-token jwt,...`: tokens are signed JWTs with these keys
    /// instead of simple tokens.
    pub jwt: Option<Arc<JwtTokens>>,
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            token_ttl: DEFAULT_TOKEN_TTL,
            bcrypt_cost: DEFAULT_BCRYPT_COST,
            jwt: None,
        }
    }
}

/// Who a request comes from, as checked when it arrived: etcd's
/// `AuthInfo`. An empty user (revision 0) is a request without a token
/// while auth is enabled.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuthInfo {
    /// The user name.
    pub user: String,
    /// The auth revision when the request was checked.
    pub revision: u64,
}

/// One auth change, as an entry carries it. Hashes and tokens are made by
/// the proposer; `Debug` never prints them.
#[derive(Clone, PartialEq, Eq)]
pub enum AuthOp {
    /// AuthEnable.
    Enable,
    /// AuthDisable.
    Disable,
    /// UserAdd; no hash for a user added with `no_password`.
    UserAdd {
        /// The user.
        name: String,
        /// bcrypt hash of the password.
        password_hash: Option<String>,
    },
    /// UserDelete.
    UserDelete {
        /// The user.
        name: String,
    },
    /// UserChangePassword.
    UserChangePassword {
        /// The user.
        name: String,
        /// bcrypt hash of the new password.
        password_hash: Option<String>,
    },
    /// UserGrantRole.
    UserGrantRole {
        /// The user.
        user: String,
        /// The role.
        role: String,
    },
    /// UserRevokeRole.
    UserRevokeRole {
        /// The user.
        name: String,
        /// The role.
        role: String,
    },
    /// RoleAdd.
    RoleAdd {
        /// The role.
        name: String,
    },
    /// RoleDelete.
    RoleDelete {
        /// The role.
        role: String,
    },
    /// RoleGrantPermission (`None`: the request named no permission).
    RoleGrantPermission {
        /// The role.
        name: String,
        /// The permission.
        perm: Option<Permission>,
    },
    /// RoleRevokePermission.
    RoleRevokePermission {
        /// The role.
        role: String,
        /// The key of the permission.
        key: Vec<u8>,
        /// Its range end.
        range_end: Vec<u8>,
    },
    /// Authenticate: `token` becomes valid for `name` on every member.
    Authenticate {
        /// The user (its password was checked by the proposer).
        name: String,
        /// The simple token drawn by the proposer.
        token: String,
    },
}

impl fmt::Debug for AuthOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const HIDDEN: &str = "<hidden>";
        match self {
            AuthOp::Enable => f.write_str("Enable"),
            AuthOp::Disable => f.write_str("Disable"),
            AuthOp::UserAdd {
                name,
                password_hash,
            } => f
                .debug_struct("UserAdd")
                .field("name", name)
                .field("password_hash", &password_hash.as_ref().map(|_| HIDDEN))
                .finish(),
            AuthOp::UserDelete { name } => {
                f.debug_struct("UserDelete").field("name", name).finish()
            }
            AuthOp::UserChangePassword {
                name,
                password_hash,
            } => f
                .debug_struct("UserChangePassword")
                .field("name", name)
                .field("password_hash", &password_hash.as_ref().map(|_| HIDDEN))
                .finish(),
            AuthOp::UserGrantRole { user, role } => f
                .debug_struct("UserGrantRole")
                .field("user", user)
                .field("role", role)
                .finish(),
            AuthOp::UserRevokeRole { name, role } => f
                .debug_struct("UserRevokeRole")
                .field("name", name)
                .field("role", role)
                .finish(),
            AuthOp::RoleAdd { name } => f.debug_struct("RoleAdd").field("name", name).finish(),
            AuthOp::RoleDelete { role } => {
                f.debug_struct("RoleDelete").field("role", role).finish()
            }
            AuthOp::RoleGrantPermission { name, perm } => f
                .debug_struct("RoleGrantPermission")
                .field("name", name)
                .field("perm", perm)
                .finish(),
            AuthOp::RoleRevokePermission {
                role,
                key,
                range_end,
            } => f
                .debug_struct("RoleRevokePermission")
                .field("role", role)
                .field("key", key)
                .field("range_end", range_end)
                .finish(),
            AuthOp::Authenticate { name, .. } => f
                .debug_struct("Authenticate")
                .field("name", name)
                .field("token", &HIDDEN)
                .finish(),
        }
    }
}

/// A bcrypt hash of `password` at `cost` (the proposer's job: slow, and
/// salted at random). Run it off the async workers.
pub fn hash_password(password: &str, cost: u32) -> String {
    bcrypt::hash(password, cost).expect("bcrypt cost is validated at startup")
}

/// Users, roles, the enabled flag, the auth revision and the tokens of one
/// member.
pub struct AuthStore {
    /// Auth is enabled, or a token was issued since start: requests must
    /// be looked at (a stale token is refused even after AuthDisable, as
    /// etcd does).
    active: AtomicBool,
    enabled: AtomicBool,
    revision: AtomicU64,
    state: RwLock<State>,
    tokens: Tokens,
    /// The serial of the next simple token this member draws.
    token_serial: AtomicU64,
    config: AuthConfig,
}

impl AuthStore {
    /// An empty store: auth disabled, no users or roles, auth revision 1
    /// (etcd's first).
    pub fn new(config: AuthConfig) -> Self {
        AuthStore {
            active: AtomicBool::new(false),
            enabled: AtomicBool::new(false),
            revision: AtomicU64::new(1),
            state: RwLock::new(State::default()),
            tokens: Tokens::new(config.token_ttl),
            token_serial: AtomicU64::new(1),
            config,
        }
    }

    /// A fresh simple token (the proposer draws it; the entry carries it).
    /// Empty with JWT tokens: those are signed once the entry applied
    /// ([`AuthStore::issue_token`]), and no member keeps them.
    pub fn new_token(&self) -> String {
        if self.config.jwt.is_some() {
            return String::new();
        }
        tokens::generate(self.token_serial.fetch_add(1, Ordering::Relaxed))
    }

    /// The token Authenticate answers once its entry applied: the simple
    /// token `drawn`, or a JWT for `user` at the auth revision now.
    pub fn issue_token(&self, user: &str, drawn: String) -> Result<String> {
        match &self.config.jwt {
            None => Ok(drawn),
            Some(jwt) => jwt.assign(user, self.revision()),
        }
    }

    /// The settings in force.
    pub fn config(&self) -> &AuthConfig {
        &self.config
    }

    /// Whether requests need looking at (tokens, permissions): the only
    /// thing a request pays while auth was never used, one relaxed load.
    #[inline]
    pub fn active(&self) -> bool {
        self.active.load(Ordering::Relaxed)
    }

    /// Whether auth is enabled.
    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Acquire)
    }

    /// The auth revision: moves with every auth change.
    pub fn revision(&self) -> u64 {
        self.revision.load(Ordering::Acquire)
    }

    /// Applies one auth change (the entry's admin check is the caller's).
    pub fn apply(&self, op: &AuthOp) -> Result<()> {
        let mut state = self.state.write();
        if let AuthOp::Authenticate { name, token } = op {
            if !state.enabled {
                return Err(Error::AuthNotEnabled);
            }
            state.apply(op)?;
            if !token.is_empty() {
                self.tokens.insert(token.clone(), name.clone());
            }
            return Ok(());
        }
        let effect = state.apply(op)?;
        if effect.bump {
            self.revision.fetch_add(1, Ordering::AcqRel);
        }
        if let Some(user) = &effect.revoke_user {
            self.tokens.revoke_user(user);
        }
        if effect.clear_tokens {
            self.tokens.clear();
        }
        self.enabled.store(state.enabled, Ordering::Release);
        if state.enabled {
            self.active.store(true, Ordering::Relaxed);
        }
        Ok(())
    }

    /// A copy of the whole auth state for a snapshot; live tokens too with
    /// `with_tokens` (Raft snapshots; never files, see `image.rs`).
    pub fn image(&self, with_tokens: bool) -> AuthImage {
        let state = self.state.read();
        AuthImage {
            state: state.clone(),
            revision: self.revision(),
            tokens: if with_tokens {
                self.tokens.live()
            } else {
                Vec::new()
            },
        }
    }

    /// Replaces the whole auth state with a snapshot's: users, roles, the
    /// enabled flag, the auth revision and the tokens (the image's only; a
    /// token this member knew and the image lacks is forgotten).
    pub fn install(&self, image: AuthImage) {
        let mut state = self.state.write();
        *state = image.state;
        self.revision.store(image.revision, Ordering::Release);
        let any_token = !image.tokens.is_empty();
        self.tokens.replace(image.tokens);
        self.enabled.store(state.enabled, Ordering::Release);
        if state.enabled || any_token {
            self.active.store(true, Ordering::Relaxed);
        }
    }

    /// Who a request comes from: its token (`token` or `authorization`
    /// metadata) or else its verified TLS client certificate's common name.
    /// `Ok(None)`: auth is disabled, and then a token is not looked at
    /// (etcd 3.6 ignores tokens while auth is off, including ones issued
    /// before it was disabled). An unknown or lapsed token is "invalid auth
    /// token", which clients answer by authenticating again.
    pub fn caller(
        &self,
        token: Option<&str>,
        common_name: Option<&str>,
    ) -> Result<Option<AuthInfo>> {
        if !self.enabled() {
            return Ok(None);
        }
        if let (Some(t), Some(jwt)) = (token, &self.config.jwt) {
            // The revision the token was signed at: a token older than the
            // latest auth change is refused at the permission check.
            return match jwt.info(t) {
                Some((user, revision)) => Ok(Some(AuthInfo { user, revision })),
                None => Err(AuthError::InvalidAuthToken.into()),
            };
        }
        if let Some(t) = token {
            return match self.tokens.user(t) {
                Some(user) => Ok(Some(AuthInfo {
                    user,
                    revision: self.revision(),
                })),
                None => Err(AuthError::InvalidAuthToken.into()),
            };
        }
        Ok(Some(match common_name {
            Some(cn) => AuthInfo {
                user: cn.to_string(),
                revision: self.revision(),
            },
            None => AuthInfo::default(),
        }))
    }

    /// etcd's `isOpPermitted`: may `by` access `key`/`range_end` for
    /// `want` (READ or WRITE)? Everything is allowed while auth is off, and
    /// to a user with the `root` role.
    pub fn check(&self, by: &AuthInfo, want: PermKind, key: &[u8], range_end: &[u8]) -> Result<()> {
        if !self.enabled() {
            return Ok(());
        }
        if by.revision == 0 || by.user.is_empty() {
            return Err(AuthError::UserEmpty.into());
        }
        if by.revision < self.revision() {
            return Err(AuthError::AuthOldRevision.into());
        }
        let state = self.state.read();
        let Some(user) = state.users.get(&by.user) else {
            return Err(AuthError::PermissionDenied.into());
        };
        if user.roles.iter().any(|r| r == ROOT) {
            return Ok(());
        }
        let perms = user
            .roles
            .iter()
            .filter_map(|r| state.roles.get(r))
            .flat_map(|r| r.perms.iter());
        if perms::permitted(perms, want, key, range_end) {
            Ok(())
        } else {
            Err(AuthError::PermissionDenied.into())
        }
    }

    /// etcd's `IsAdminPermitted`: auth management, and the maintenance
    /// calls etcd reserves for `root`, need the `root` role while auth is
    /// enabled. `None`: a request without a token.
    pub fn check_admin(&self, by: Option<&AuthInfo>) -> Result<()> {
        if !self.enabled() {
            return Ok(());
        }
        let Some(by) = by.filter(|b| !b.user.is_empty()) else {
            return Err(AuthError::UserEmpty.into());
        };
        let state = self.state.read();
        if !state.users.contains_key(&by.user) {
            return Err(AuthError::UserNotFound.into());
        }
        if !state.is_root(&by.user) {
            return Err(AuthError::PermissionDenied.into());
        }
        Ok(())
    }

    /// The proposer's half of Authenticate: does `password` match? Slow
    /// (bcrypt): run it off the async workers.
    pub fn check_password(&self, name: &str, password: &str) -> Result<()> {
        if !self.enabled() {
            return Err(Error::AuthNotEnabled);
        }
        let hash = {
            let state = self.state.read();
            match state.users.get(name).map(|u| u.password_hash.clone()) {
                Some(Some(h)) => h,
                Some(None) => return Err(AuthError::NoPasswordUser.into()),
                None => return Err(AuthError::AuthFailed.into()),
            }
        };
        match bcrypt::verify(password, &hash) {
            Ok(true) => Ok(()),
            _ => Err(AuthError::AuthFailed.into()),
        }
    }

    /// UserGet: the user's roles, sorted.
    pub fn user_roles(&self, name: &str) -> Result<Vec<String>> {
        let state = self.state.read();
        let user = state.users.get(name).ok_or(AuthError::UserNotFound)?;
        Ok(user.roles.clone())
    }

    /// UserList: every user name, sorted.
    pub fn user_names(&self) -> Vec<String> {
        self.state.read().users.keys().cloned().collect()
    }

    /// RoleGet: the role's permissions, sorted by key.
    pub fn role_perms(&self, name: &str) -> Result<Vec<Permission>> {
        let state = self.state.read();
        let role = state.roles.get(name).ok_or(AuthError::RoleNotFound)?;
        Ok(role.perms.clone())
    }

    /// RoleList: every role name, sorted.
    pub fn role_names(&self) -> Vec<String> {
        self.state.read().roles.keys().cloned().collect()
    }

    /// Whether `user` exists and has `role` (a user may read its own
    /// roles without being root).
    pub fn has_role(&self, user: &str, role: &str) -> bool {
        self.state
            .read()
            .users
            .get(user)
            .is_some_and(|u| u.roles.iter().any(|r| r == role))
    }
}

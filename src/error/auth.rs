//! etcd's auth errors, each with the gRPC code and exact text etcd 3.4
//! sends. Clients act on them by text (clientv3 re-authenticates on
//! `invalid auth token`), so they live in one table like the rest of
//! [`crate::error`].

/// One auth error etcd can answer with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthError {
    /// AuthEnable without a user called `root`.
    RootUserNotExist,
    /// AuthEnable while `root` lacks the `root` role.
    RootRoleNotExist,
    /// UserAdd of a name that exists.
    UserAlreadyExist,
    /// An empty user name, or a request without a token while auth is on.
    UserEmpty,
    /// A user name that does not exist.
    UserNotFound,
    /// RoleAdd of a name that exists.
    RoleAlreadyExist,
    /// A role name that does not exist.
    RoleNotFound,
    /// An empty role name.
    RoleEmpty,
    /// Authenticate with an unknown user, a wrong password, or a user added
    /// without a password.
    AuthFailed,
    /// The caller's roles do not grant the access.
    PermissionDenied,
    /// UserRevokeRole of a role the user does not have.
    RoleNotGranted,
    /// RoleRevokePermission of a permission the role does not have.
    PermissionNotGranted,
    /// A token that is unknown or expired: clients re-authenticate on it.
    InvalidAuthToken,
    /// Deleting `root` (user or role), or revoking `root` from `root`,
    /// while auth is enabled.
    InvalidAuthMgmt,
    /// A request checked against an auth revision older than the one it
    /// is applied at.
    AuthOldRevision,
    /// RoleGrantPermission without a permission.
    PermissionNotGiven,
    /// Authenticate as a user added with `no_password`: etcd lets its
    /// auth package's own error through, as gRPC Unknown.
    NoPasswordUser,
    /// Authenticate on a member whose JWT key is a public key alone: it
    /// verifies tokens but signs none (etcd's auth error, as gRPC Unknown).
    VerifyOnly,
    /// Signing a JWT token failed (the key signed at start-up, so this is
    /// the crypto library's refusal; the log says why).
    SigningFailed,
}

/// The `cancel_reason` of a Watch create refused for lack of READ: the
/// permission-denied status as grpc-go prints it, which is what etcd puts
/// there.
pub const WATCH_PERMISSION_DENIED: &str =
    "rpc error: code = PermissionDenied desc = etcdserver: permission denied";

use super::Code;

impl AuthError {
    /// The gRPC code etcd uses.
    pub fn code(self) -> Code {
        use AuthError::*;
        match self {
            UserEmpty | RoleEmpty | AuthFailed | InvalidAuthMgmt | AuthOldRevision
            | PermissionNotGiven => Code::InvalidArgument,
            PermissionDenied => Code::PermissionDenied,
            NoPasswordUser | VerifyOnly | SigningFailed => Code::Unknown,
            InvalidAuthToken => Code::Unauthenticated,
            RootUserNotExist | RootRoleNotExist | UserAlreadyExist | UserNotFound
            | RoleAlreadyExist | RoleNotFound | RoleNotGranted | PermissionNotGranted => {
                Code::FailedPrecondition
            }
        }
    }

    /// etcd's exact text.
    pub fn message(self) -> &'static str {
        use AuthError::*;
        match self {
            RootUserNotExist => "etcdserver: root user does not exist",
            RootRoleNotExist => "etcdserver: root user does not have root role",
            UserAlreadyExist => "etcdserver: user name already exists",
            UserEmpty => "etcdserver: user name is empty",
            UserNotFound => "etcdserver: user name not found",
            RoleAlreadyExist => "etcdserver: role name already exists",
            RoleNotFound => "etcdserver: role name not found",
            RoleEmpty => "etcdserver: role name is empty",
            AuthFailed => "etcdserver: authentication failed, invalid user ID or password",
            PermissionDenied => "etcdserver: permission denied",
            RoleNotGranted => "etcdserver: role is not granted to the user",
            PermissionNotGranted => "etcdserver: permission is not granted to the role",
            InvalidAuthToken => "etcdserver: invalid auth token",
            InvalidAuthMgmt => "etcdserver: invalid auth management",
            AuthOldRevision => "etcdserver: revision of auth store is old",
            PermissionNotGiven => "etcdserver: permission not given",
            NoPasswordUser => {
                "auth: authentication failed, password was given for no password user"
            }
            VerifyOnly => "auth: token signing attempted with verify-only key",
            SigningFailed => "auth: failed to sign a JWT token",
        }
    }
}

impl From<AuthError> for super::Error {
    fn from(e: AuthError) -> Self {
        super::Error::Auth(e)
    }
}

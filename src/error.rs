//! The one table of etcd errors ephd can return.
//!
//! Clients (clientv3, kube-apiserver, the `etcd-client` crate) classify
//! errors by the exact gRPC status code *and* message text that etcd sends,
//! so every error the store core can produce is a variant here, and the
//! gRPC adapters map it with [`Error::code`] and [`Error::message`] only.
//! Nothing else in the crate invents error strings for clients.

use std::fmt;

/// gRPC status codes used by etcd errors, kept free of any gRPC crate so the
/// store core does not depend on the transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    /// The request is malformed (empty key, conflicting flags, too large).
    InvalidArgument,
    /// A revision outside the readable window, or a TTL out of range.
    OutOfRange,
    /// A referenced lease does not exist.
    NotFound,
    /// The request conflicts with current state (lease already exists, auth off).
    FailedPrecondition,
    /// The server cannot serve the request right now.
    Unavailable,
    /// The RPC exists in etcd's API but ephd does not serve it.
    Unimplemented,
}

/// Every error ephd returns to clients, each carrying etcd's exact text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// `key` was empty.
    EmptyKey,
    /// A put with `ignore_value`/`ignore_lease` on a missing key, or an empty txn op.
    KeyNotFound,
    /// `ignore_value` set together with a value.
    ValueProvided,
    /// `ignore_lease` set together with a lease.
    LeaseProvided,
    /// More compares or ops in a txn than `--max-txn-ops`.
    TooManyOps,
    /// Two writes to the same key in one txn.
    DuplicateKey,
    /// A sort order or target etcd does not define.
    InvalidSortOption,
    /// A read or compaction below the compacted revision.
    Compacted,
    /// A read or compaction above the current revision.
    FutureRev,
    /// A lease ID that is not granted.
    LeaseNotFound,
    /// A grant with a lease ID that is already granted.
    LeaseExist,
    /// A grant with a TTL above etcd's maximum.
    LeaseTtlTooLarge,
    /// A request above `--max-request-bytes`.
    RequestTooLarge,
    /// Auth RPCs while auth is disabled.
    AuthNotEnabled,
    /// A member ID the cluster does not have.
    MemberNotFound,
    /// The server is shutting down and accepts no more writes.
    Stopped,
    /// An RPC that ephd deliberately does not serve.
    Unimplemented(&'static str),
}

impl Error {
    /// The gRPC code etcd uses for this error.
    pub fn code(&self) -> Code {
        match self {
            Error::EmptyKey
            | Error::KeyNotFound
            | Error::ValueProvided
            | Error::LeaseProvided
            | Error::TooManyOps
            | Error::DuplicateKey
            | Error::InvalidSortOption
            | Error::RequestTooLarge => Code::InvalidArgument,
            Error::Compacted | Error::FutureRev | Error::LeaseTtlTooLarge => Code::OutOfRange,
            Error::LeaseNotFound | Error::MemberNotFound => Code::NotFound,
            Error::LeaseExist | Error::AuthNotEnabled => Code::FailedPrecondition,
            Error::Stopped => Code::Unavailable,
            Error::Unimplemented(_) => Code::Unimplemented,
        }
    }

    /// etcd's exact message text, which clients pattern-match.
    pub fn message(&self) -> &'static str {
        match self {
            Error::EmptyKey => "etcdserver: key is not provided",
            Error::KeyNotFound => "etcdserver: key not found",
            Error::ValueProvided => "etcdserver: value is provided",
            Error::LeaseProvided => "etcdserver: lease is provided",
            Error::TooManyOps => "etcdserver: too many operations in txn request",
            Error::DuplicateKey => "etcdserver: duplicate key given in txn request",
            Error::InvalidSortOption => "etcdserver: invalid sort option",
            Error::Compacted => "etcdserver: mvcc: required revision has been compacted",
            Error::FutureRev => "etcdserver: mvcc: required revision is a future revision",
            Error::LeaseNotFound => "etcdserver: requested lease not found",
            Error::LeaseExist => "etcdserver: lease already exists",
            Error::LeaseTtlTooLarge => "etcdserver: too large lease TTL",
            Error::RequestTooLarge => "etcdserver: request is too large",
            Error::AuthNotEnabled => "etcdserver: authentication is not enabled",
            Error::MemberNotFound => "etcdserver: member not found",
            Error::Stopped => "etcdserver: server stopped",
            Error::Unimplemented(what) => what,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
    }
}

impl std::error::Error for Error {}

/// Result type of the store core.
pub type Result<T> = std::result::Result<T, Error>;

//! The one table of etcd errors ephd can return.
//!
//! Clients (clientv3, kube-apiserver, the `etcd-client` crate) classify
//! errors by the exact gRPC status code *and* message text that etcd sends,
//! so every error the store core can produce is a variant here, and the
//! gRPC adapters map it with [`Error::code`] and [`Error::message`] only.
//! The reasons a watch create is refused with are not gRPC errors but texts
//! in the `cancel_reason` field; they are the constants below. Nothing else
//! in the crate invents error strings for clients.

mod auth;

pub use auth::{AuthError, WATCH_PERMISSION_DENIED};

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
    /// The request conflicts with current state (lease already exists).
    FailedPrecondition,
    /// The server cannot serve the request right now.
    Unavailable,
    /// The RPC exists in etcd's API but ephd does not serve it.
    Unimplemented,
    /// Out of space: the NOSPACE alarm is raised.
    ResourceExhausted,
    /// The CORRUPT alarm is raised.
    DataLoss,
    /// Auth: the caller's roles do not allow the request.
    PermissionDenied,
    /// Auth: the token is unknown or expired.
    Unauthenticated,
    /// The request's deadline passed before it could be served (a write
    /// waiting for a leader).
    DeadlineExceeded,
    /// An error etcd lets through without a gRPC code of its own (some of
    /// its auth package's, and ones missing from its gRPC error table).
    Unknown,
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
    /// A write that would take space while the NOSPACE alarm is raised.
    NoSpace,
    /// A write while the CORRUPT alarm is raised.
    Corrupt,
    /// A request shed because the server is overloaded (etcd sends it when
    /// its apply loop falls behind; ephd when a Range cannot get room for
    /// its response in time). Clients retry it.
    TooManyRequests,
    /// The server is shutting down and accepts no more writes.
    Stopped,
    /// Cluster mode: this member knows no leader (a `hasleader` request or
    /// stream, a lease call that found no leader within the request
    /// timeout).
    NoLeader,
    /// Cluster mode: a write that found no leader to propose it to within
    /// the request timeout. etcd holds such a proposal on the request's Go
    /// context, and answers that context's error (code DeadlineExceeded).
    NoLeaderInTime,
    /// Cluster mode: a write the leader refused to take into its log
    /// (leadership is being handed over): raft's error, which etcd passes
    /// through with code Unknown.
    ProposalDropped,
    /// A lease revoke or checkpoint proposed in an earlier term than the
    /// one that committed it (a deposed leader's): refused on every member.
    /// Also a linearizable read in flight when a new leader came.
    LeaderChanged,
    /// Cluster mode: a proposed write was not applied within the request
    /// timeout (a leader change may have lost it; it is never proposed
    /// again).
    Timeout,
    /// Cluster mode: [`Error::Timeout`] while the leader changed after the
    /// write was proposed (the old leader may have lost it, or committed
    /// it before it failed: its fate is unknown).
    TimeoutDueToLeaderFail,
    /// Cluster mode: [`Error::Timeout`] while this member lost its
    /// connection to the leader (or, as leader, to a quorum) after the
    /// write was proposed.
    TimeoutDueToConnectionLost,
    /// The server is shutting down and ends a long-lived stream (Watch,
    /// LeaseKeepAlive). Unavailable, so clients reconnect and resume instead
    /// of treating it as final.
    StreamShutdown,
    /// Authenticate while auth is disabled. Clients configured with a user
    /// name call Authenticate first and carry on without a token on exactly
    /// this answer.
    AuthNotEnabled,
    /// Every other auth error (users, roles, permissions, tokens): their
    /// table is in [`AuthError`].
    Auth(AuthError),
    /// MemberAdd, MemberRemove, MemberUpdate, MemberPromote: ephd is always
    /// a single member.
    MembershipUnsupported,
    /// Maintenance.Downgrade.
    DowngradeUnsupported,
    /// A membership change names a member that is not (or no longer) in
    /// the cluster.
    MemberNotFound,
    /// MemberAdd with an ID already in the cluster.
    MemberExist,
    /// MemberAdd or MemberUpdate with a peer URL another member has.
    PeerUrlExist,
    /// MemberAdd or MemberUpdate with peer URLs that are not URLs.
    MemberBadUrls,
    /// A reconfiguration that would leave too few started voters for a
    /// quorum.
    MemberNotEnoughStarted,
    /// MemberPromote of a voter.
    MemberNotLearner,
    /// MemberPromote of a learner that has not caught up with the leader.
    LearnerNotReady,
    /// MemberAdd of a learner beyond the limit.
    TooManyLearners,
    /// A reconfiguration while this member is not connected to every
    /// voter: it could break the active quorum.
    Unhealthy,
    /// A client call a learner does not serve (everything but Status,
    /// Snapshot and serializable Ranges, as etcd 3.6).
    NotSupportedForLearner,
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
            Error::MemberNotEnoughStarted | Error::ProposalDropped => Code::Unknown,
            Error::NoLeaderInTime => Code::DeadlineExceeded,
            Error::MemberExist
            | Error::PeerUrlExist
            | Error::MemberNotLearner
            | Error::LearnerNotReady
            | Error::TooManyLearners
            | Error::NotSupportedForLearner => Code::FailedPrecondition,
            Error::MemberBadUrls => Code::InvalidArgument,
            Error::Unhealthy => Code::Unavailable,
            Error::LeaseExist | Error::AuthNotEnabled => Code::FailedPrecondition,
            Error::Stopped
            | Error::StreamShutdown
            | Error::NoLeader
            | Error::LeaderChanged
            | Error::Timeout
            | Error::TimeoutDueToLeaderFail
            | Error::TimeoutDueToConnectionLost => Code::Unavailable,
            Error::NoSpace | Error::TooManyRequests => Code::ResourceExhausted,
            Error::Corrupt => Code::DataLoss,
            Error::Auth(e) => e.code(),
            Error::MembershipUnsupported | Error::DowngradeUnsupported => Code::Unimplemented,
        }
    }

    /// etcd's exact message text, which clients pattern-match (ephd's own
    /// texts, prefixed `ephd:`, for what etcd has no error for).
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
            Error::Stopped => "etcdserver: server stopped",
            Error::NoLeader => "etcdserver: no leader",
            Error::NoLeaderInTime => "context deadline exceeded",
            Error::ProposalDropped => "raft proposal dropped",
            Error::LeaderChanged => "etcdserver: leader changed",
            Error::Timeout => "etcdserver: request timed out",
            Error::TimeoutDueToLeaderFail => {
                "etcdserver: request timed out, possibly due to previous leader failure"
            }
            Error::TimeoutDueToConnectionLost => {
                "etcdserver: request timed out, possibly due to connection lost"
            }
            Error::NoSpace => "etcdserver: mvcc: database space exceeded",
            Error::Corrupt => "etcdserver: corrupt cluster",
            Error::TooManyRequests => "etcdserver: too many requests",
            Error::StreamShutdown => "ephd: server is shutting down",
            Error::AuthNotEnabled => "etcdserver: authentication is not enabled",
            Error::Auth(e) => e.message(),
            Error::MembershipUnsupported => {
                "ephd: membership changes are not supported (ephd runs as a single member)"
            }
            Error::DowngradeUnsupported => "ephd: downgrade is not supported",
            Error::MemberNotFound => "etcdserver: member not found",
            Error::MemberExist => "etcdserver: member ID already exist",
            Error::PeerUrlExist => "etcdserver: Peer URLs already exists",
            Error::MemberBadUrls => "etcdserver: given member URLs are invalid",
            Error::MemberNotEnoughStarted => {
                "etcdserver: re-configuration failed due to not enough started members"
            }
            Error::MemberNotLearner => "etcdserver: can only promote a learner member",
            Error::LearnerNotReady => {
                "etcdserver: can only promote a learner member which is in sync with leader"
            }
            Error::TooManyLearners => "etcdserver: too many learner members in cluster",
            Error::Unhealthy => "etcdserver: unhealthy cluster",
            Error::NotSupportedForLearner => "etcdserver: rpc not supported for learner",
        }
    }
}

/// The text grpc-go (and so etcd) answers a received message over the size
/// limit with, under `ResourceExhausted`: `found` bytes against `limit`.
pub fn message_too_large(found: usize, limit: usize) -> String {
    format!("grpc: received message larger than max ({found} vs. {limit})")
}

/// Watch create refused: the range is empty (`key >= range_end`). etcd's
/// `cancel_reason` text.
pub const ERR_EMPTY_RANGE: &str = "mvcc: watcher range is empty";

/// Watch create refused: the client reuses a watch ID on the same stream.
/// etcd's `cancel_reason` text.
pub const ERR_DUPLICATE_ID: &str = "mvcc: duplicate watch ID provided on the WatchStream";

/// Prefix of the Internal status sent when a response cannot be encoded
/// (followed by `: ` and prost's error); not an etcd error.
pub const INTERNAL_ENCODE_FAILED: &str = "cannot encode message";

/// Prefix of the Internal status sent when the blocking compaction task
/// fails (followed by `: ` and the task's error); not an etcd error.
pub const INTERNAL_COMPACTION_FAILED: &str = "compaction task failed";

/// Prefix of the Internal status sent when the blocking task building a
/// large Range fails (followed by `: ` and the task's error); not an etcd
/// error.
pub const INTERNAL_RANGE_FAILED: &str = "range task failed";

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
    }
}

impl std::error::Error for Error {}

/// Result type of the store core.
pub type Result<T> = std::result::Result<T, Error>;

#[cfg(test)]
mod tests {
    use super::*;

    /// Clients match these texts byte for byte (the etcd ones are compared
    /// with stock etcd in the integration tests); a change here is a change
    /// of the wire protocol.
    #[test]
    fn every_text_and_code_is_pinned() {
        let table = [
            (
                Error::EmptyKey,
                Code::InvalidArgument,
                "etcdserver: key is not provided",
            ),
            (
                Error::KeyNotFound,
                Code::InvalidArgument,
                "etcdserver: key not found",
            ),
            (
                Error::ValueProvided,
                Code::InvalidArgument,
                "etcdserver: value is provided",
            ),
            (
                Error::LeaseProvided,
                Code::InvalidArgument,
                "etcdserver: lease is provided",
            ),
            (
                Error::TooManyOps,
                Code::InvalidArgument,
                "etcdserver: too many operations in txn request",
            ),
            (
                Error::DuplicateKey,
                Code::InvalidArgument,
                "etcdserver: duplicate key given in txn request",
            ),
            (
                Error::InvalidSortOption,
                Code::InvalidArgument,
                "etcdserver: invalid sort option",
            ),
            (
                Error::Compacted,
                Code::OutOfRange,
                "etcdserver: mvcc: required revision has been compacted",
            ),
            (
                Error::FutureRev,
                Code::OutOfRange,
                "etcdserver: mvcc: required revision is a future revision",
            ),
            (
                Error::LeaseNotFound,
                Code::NotFound,
                "etcdserver: requested lease not found",
            ),
            (
                Error::LeaseExist,
                Code::FailedPrecondition,
                "etcdserver: lease already exists",
            ),
            (
                Error::LeaseTtlTooLarge,
                Code::OutOfRange,
                "etcdserver: too large lease TTL",
            ),
            (
                Error::RequestTooLarge,
                Code::InvalidArgument,
                "etcdserver: request is too large",
            ),
            (
                Error::Stopped,
                Code::Unavailable,
                "etcdserver: server stopped",
            ),
            (Error::NoLeader, Code::Unavailable, "etcdserver: no leader"),
            (
                Error::NoLeaderInTime,
                Code::DeadlineExceeded,
                "context deadline exceeded",
            ),
            (
                Error::ProposalDropped,
                Code::Unknown,
                "raft proposal dropped",
            ),
            (
                Error::LeaderChanged,
                Code::Unavailable,
                "etcdserver: leader changed",
            ),
            (
                Error::Timeout,
                Code::Unavailable,
                "etcdserver: request timed out",
            ),
            (
                Error::TimeoutDueToLeaderFail,
                Code::Unavailable,
                "etcdserver: request timed out, possibly due to previous leader failure",
            ),
            (
                Error::TimeoutDueToConnectionLost,
                Code::Unavailable,
                "etcdserver: request timed out, possibly due to connection lost",
            ),
            (
                Error::StreamShutdown,
                Code::Unavailable,
                "ephd: server is shutting down",
            ),
            (
                Error::NoSpace,
                Code::ResourceExhausted,
                "etcdserver: mvcc: database space exceeded",
            ),
            (
                Error::TooManyRequests,
                Code::ResourceExhausted,
                "etcdserver: too many requests",
            ),
            (
                Error::Corrupt,
                Code::DataLoss,
                "etcdserver: corrupt cluster",
            ),
            (
                Error::AuthNotEnabled,
                Code::FailedPrecondition,
                "etcdserver: authentication is not enabled",
            ),
            (
                Error::Auth(AuthError::InvalidAuthToken),
                Code::Unauthenticated,
                "etcdserver: invalid auth token",
            ),
            (
                Error::MembershipUnsupported,
                Code::Unimplemented,
                "ephd: membership changes are not supported (ephd runs as a single member)",
            ),
            (
                Error::DowngradeUnsupported,
                Code::Unimplemented,
                "ephd: downgrade is not supported",
            ),
            (
                Error::NotSupportedForLearner,
                Code::FailedPrecondition,
                "etcdserver: rpc not supported for learner",
            ),
        ];
        for (err, code, text) in table {
            assert_eq!((err.code(), err.message()), (code, text), "{err:?}");
            assert_eq!(err.to_string(), text);
        }
        assert_eq!(ERR_EMPTY_RANGE, "mvcc: watcher range is empty");
        assert_eq!(
            ERR_DUPLICATE_ID,
            "mvcc: duplicate watch ID provided on the WatchStream"
        );
    }
}

//! What the one write path takes and gives: an [`Entry`] per mutation and
//! its [`Applied`] result.
//!
//! An entry carries every decision that depends on anything but the store's
//! prior state: a lease ID chosen by the server, which lease expired, which
//! revision to compact at. Applying the same entries in the same order to
//! stores built with the same [`StoreConfig`](super::StoreConfig) therefore
//! gives the same responses, revisions, versions, lease table and events,
//! which is what a replicated log needs from its state machine.

use super::types::*;

/// One mutation of the store.
#[derive(Debug, Clone)]
pub enum Entry {
    /// A Put; etcd checks the lease before the ignore flags.
    Put(PutRequest),
    /// A DeleteRange.
    Delete(DeleteRequest),
    /// A Txn (a read-only one is answered without a revision).
    Txn(TxnRequest),
    /// Compact history at a revision.
    Compact {
        /// The revision; reads below it fail afterwards.
        revision: i64,
    },
    /// Grant a lease with an ID the caller chose (never 0).
    LeaseGrant {
        /// The lease ID.
        id: i64,
        /// Requested TTL in seconds (etcd's minimum and maximum apply).
        ttl: i64,
    },
    /// Revoke a lease, by request or because its owner saw it expire; its
    /// keys are deleted at one revision.
    LeaseRevoke {
        /// The lease ID.
        id: i64,
    },
    /// Cluster mode: the leader's view of how long leases have left, so
    /// that a new leader resumes from it (see `Lessor::checkpoint`).
    /// Changes no key and no revision.
    LeaseCheckpoint {
        /// (lease ID, milliseconds left; negative: the full TTL).
        checkpoints: Vec<(i64, i64)>,
    },
    /// Start the store at `revision` (a cluster's first leader chooses it,
    /// so a new cluster's revisions start above any an earlier incarnation
    /// could have issued, as a single member's do). Unless the store holds
    /// `compact_rev_key` already (then nothing changes, so a second
    /// proposal, a later leader's, is harmless): when the store is below
    /// `revision` it jumps there, everything below reading as compacted,
    /// and `compact_rev_key` is created.
    Initialize {
        /// The initial revision.
        revision: i64,
    },
    /// A cluster's apply-affecting settings, replicated by its leader
    /// (`limits.rs`): every member applies entries under them from here on.
    Limits(super::Limits),
    /// Raise, clear or list alarms.
    Alarm {
        /// What to do.
        action: AlarmAction,
        /// The member the alarm is about (any ID a client names).
        member_id: u64,
        /// etcd's alarm type number.
        alarm: i32,
    },
    /// An auth change (users, roles, permissions, enable/disable) or a
    /// token issued by Authenticate. Without an [`Entry::Authorized`]
    /// around it, it comes from a request made while auth was disabled: if
    /// auth is enabled by the time it applies, it fails as a request
    /// without a token does.
    Auth(crate::auth::AuthOp),
    /// A request made while auth was enabled, by `by`: its permissions are
    /// checked where it applies (etcd's auth applier), against the auth
    /// state of that moment.
    Authorized {
        /// Who made it, and the auth revision it was checked at.
        by: crate::auth::AuthInfo,
        /// The request.
        entry: Box<Entry>,
    },
}

/// The result of applying an [`Entry`], one variant per entry kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// Result of [`Entry::Put`].
    Put(PutResponse),
    /// Result of [`Entry::Delete`].
    Delete(DeleteResponse),
    /// Result of [`Entry::Txn`].
    Txn(TxnResponse),
    /// Result of [`Entry::Compact`]: the current revision afterwards.
    Compact {
        /// The header revision.
        revision: i64,
    },
    /// Result of [`Entry::LeaseGrant`].
    LeaseGrant {
        /// The granted ID.
        id: i64,
        /// The effective TTL.
        ttl: i64,
        /// The header revision.
        revision: i64,
    },
    /// Result of [`Entry::LeaseRevoke`]: the revision of the deletes, or the
    /// current one when the lease had no keys.
    LeaseRevoke {
        /// The header revision.
        revision: i64,
    },
    /// Result of [`Entry::LeaseCheckpoint`]: the current revision.
    LeaseCheckpoint {
        /// The header revision.
        revision: i64,
    },
    /// Result of [`Entry::Initialize`]: the current revision afterwards.
    Initialize {
        /// The header revision.
        revision: i64,
    },
    /// Result of [`Entry::Limits`]: the current revision (unchanged).
    Limits {
        /// The header revision.
        revision: i64,
    },
    /// Result of [`Entry::Alarm`]: the alarms listed, raised or cleared.
    Alarm {
        /// The alarms.
        alarms: Vec<AlarmMember>,
    },
    /// Result of [`Entry::Auth`]: the header revision.
    Auth {
        /// The header revision (the key-value store's current one).
        revision: i64,
    },
}

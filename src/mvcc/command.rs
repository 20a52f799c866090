//! Typed commands: each kind of mutation a client asks for, the [`Entry`]
//! it travels as, and the answer it gets back.
//!
//! The apply path takes and gives untyped entries and results (a log holds
//! every kind, in one order). A caller that sends a put wants a put's
//! answer: [`Command::answer`] is the one place where an [`Applied`] is
//! matched against the kind that was sent, for the single-member path
//! (`Store::apply_command`) and for a proposal in cluster mode alike.

use super::entry::{Applied, Entry};
use super::types::*;
use crate::auth::{AuthInfo, AuthOp};
use crate::error::{Error, Result};

/// A client's mutation of one kind.
pub trait Command: Sized {
    /// What applying it answers.
    type Answer;

    /// The entry it is applied (or proposed) as.
    fn into_entry(self) -> Entry;

    /// Its answer out of what the apply path returned for its entry, or
    /// that result back when it belongs to another kind.
    fn answer_of(applied: Applied) -> std::result::Result<Self::Answer, Applied>;

    /// Its answer out of what the apply path returned for its entry. An
    /// entry always applies as its own kind; a mismatch would be a bug of
    /// ours, logged and answered as a proposal whose answer was lost
    /// (`etcdserver: raft proposal dropped`, which clients retry).
    fn answer(applied: Applied) -> Result<Self::Answer> {
        Self::answer_of(applied).map_err(|other| {
            tracing::error!(
                applied = applied_kind(&other),
                expected = std::any::type_name::<Self>(),
                "an entry applied as another kind"
            );
            Error::ProposalDropped
        })
    }

    /// The entry of this command sent by `by` while auth is enabled: its
    /// permissions are checked where it applies (on every member).
    fn into_entry_by(self, by: Option<AuthInfo>) -> Entry {
        match by {
            None => self.into_entry(),
            Some(by) => Entry::Authorized {
                by,
                entry: Box::new(self.into_entry()),
            },
        }
    }
}

fn applied_kind(applied: &Applied) -> &'static str {
    match applied {
        Applied::Put(_) => "put",
        Applied::Delete(_) => "delete",
        Applied::Txn(_) => "txn",
        Applied::Compact { .. } => "compact",
        Applied::LeaseGrant { .. } => "lease grant",
        Applied::LeaseRevoke { .. } => "lease revoke",
        Applied::LeaseCheckpoint { .. } => "lease checkpoint",
        Applied::Initialize { .. } => "initialize",
        Applied::Limits { .. } => "limits",
        Applied::Alarm { .. } => "alarm",
        Applied::Auth { .. } => "auth",
    }
}

impl Command for PutRequest {
    type Answer = PutResponse;

    fn into_entry(self) -> Entry {
        Entry::Put(self)
    }

    fn answer_of(applied: Applied) -> std::result::Result<PutResponse, Applied> {
        match applied {
            Applied::Put(p) => Ok(p),
            other => Err(other),
        }
    }
}

impl Command for DeleteRequest {
    type Answer = DeleteResponse;

    fn into_entry(self) -> Entry {
        Entry::Delete(self)
    }

    fn answer_of(applied: Applied) -> std::result::Result<DeleteResponse, Applied> {
        match applied {
            Applied::Delete(d) => Ok(d),
            other => Err(other),
        }
    }
}

impl Command for TxnRequest {
    type Answer = TxnResponse;

    fn into_entry(self) -> Entry {
        Entry::Txn(self)
    }

    fn answer_of(applied: Applied) -> std::result::Result<TxnResponse, Applied> {
        match applied {
            Applied::Txn(t) => Ok(t),
            other => Err(other),
        }
    }
}

/// Compact history at `revision`; answers the current revision.
#[derive(Debug, Clone, Copy)]
pub struct Compaction {
    /// Reads below it fail afterwards.
    pub revision: i64,
}

impl Command for Compaction {
    type Answer = i64;

    fn into_entry(self) -> Entry {
        Entry::Compact {
            revision: self.revision,
        }
    }

    fn answer_of(applied: Applied) -> std::result::Result<i64, Applied> {
        match applied {
            Applied::Compact { revision } => Ok(revision),
            other => Err(other),
        }
    }
}

/// Grant lease `id` (chosen by the caller, never 0) for `ttl` seconds.
#[derive(Debug, Clone, Copy)]
pub struct LeaseGrant {
    /// The lease ID.
    pub id: i64,
    /// Requested TTL in seconds.
    pub ttl: i64,
}

impl Command for LeaseGrant {
    type Answer = LeaseGrantResponse;

    fn into_entry(self) -> Entry {
        Entry::LeaseGrant {
            id: self.id,
            ttl: self.ttl,
        }
    }

    fn answer_of(applied: Applied) -> std::result::Result<LeaseGrantResponse, Applied> {
        match applied {
            Applied::LeaseGrant { id, ttl, revision } => {
                Ok(LeaseGrantResponse { revision, id, ttl })
            }
            other => Err(other),
        }
    }
}

/// Revoke lease `id`; answers the revision of its keys' deletion.
#[derive(Debug, Clone, Copy)]
pub struct LeaseRevoke {
    /// The lease ID.
    pub id: i64,
}

impl Command for LeaseRevoke {
    type Answer = i64;

    fn into_entry(self) -> Entry {
        Entry::LeaseRevoke { id: self.id }
    }

    fn answer_of(applied: Applied) -> std::result::Result<i64, Applied> {
        match applied {
            Applied::LeaseRevoke { revision } => Ok(revision),
            other => Err(other),
        }
    }
}

/// An auth change answers the header revision.
impl Command for AuthOp {
    type Answer = i64;

    fn into_entry(self) -> Entry {
        Entry::Auth(self)
    }

    fn answer_of(applied: Applied) -> std::result::Result<i64, Applied> {
        match applied {
            Applied::Auth { revision } => Ok(revision),
            other => Err(other),
        }
    }
}

/// Raise, clear or list alarms; answers the alarms afterwards.
#[derive(Debug, Clone, Copy)]
pub struct AlarmChange {
    /// Raise, clear or list.
    pub action: AlarmAction,
    /// The member it concerns (0: every member, for a list).
    pub member_id: u64,
    /// The alarm type.
    pub alarm: i32,
}

impl Command for AlarmChange {
    type Answer = Vec<AlarmMember>;

    fn into_entry(self) -> Entry {
        Entry::Alarm {
            action: self.action,
            member_id: self.member_id,
            alarm: self.alarm,
        }
    }

    fn answer_of(applied: Applied) -> std::result::Result<Vec<AlarmMember>, Applied> {
        match applied {
            Applied::Alarm { alarms } => Ok(alarms),
            other => Err(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::validate::check_request;
    use super::*;

    #[test]
    fn requests_are_checked_as_etcd_checks_them_before_they_apply() {
        let check = |c: Entry, max_ops| check_request(&c, max_ops);
        let empty_put = PutRequest::default().into_entry();
        assert_eq!(check(empty_put, 128).unwrap_err(), Error::EmptyKey);
        let empty_delete = DeleteRequest::default().into_entry();
        assert_eq!(check(empty_delete, 128).unwrap_err(), Error::EmptyKey);
        let put = |k: &'static str| {
            RequestOp::Put(PutRequest {
                key: bytes::Bytes::from_static(k.as_bytes()),
                ..Default::default()
            })
        };
        let txn = TxnRequest {
            compare: Vec::new(),
            success: vec![put("a"), put("b")],
            failure: Vec::new(),
        };
        assert!(check(txn.clone().into_entry(), 2).is_ok());
        assert_eq!(
            check(txn.clone().into_entry(), 1).unwrap_err(),
            Error::TooManyOps
        );
        let by = AuthInfo {
            user: "bob".into(),
            revision: 1,
        };
        assert_eq!(
            check(txn.into_entry_by(Some(by)), 1).unwrap_err(),
            Error::TooManyOps,
            "a user's request is checked as well"
        );
        assert!(check(Compaction { revision: 5 }.into_entry(), 1).is_ok());
    }

    #[test]
    fn each_command_takes_the_answer_of_its_own_kind_only() {
        let put = Applied::Put(PutResponse::default());
        assert!(PutRequest::answer(put.clone()).is_ok());
        assert_eq!(TxnRequest::answer(put).unwrap_err(), Error::ProposalDropped);
        let grant = Applied::LeaseGrant {
            id: 7,
            ttl: 5,
            revision: 3,
        };
        let answer = LeaseGrant { id: 7, ttl: 5 }.into_entry();
        assert!(matches!(answer, Entry::LeaseGrant { id: 7, ttl: 5 }));
        assert_eq!(
            LeaseGrant::answer(grant).unwrap(),
            LeaseGrantResponse {
                revision: 3,
                id: 7,
                ttl: 5
            }
        );
        assert_eq!(
            Compaction::answer(Applied::LeaseRevoke { revision: 9 }).unwrap_err(),
            Error::ProposalDropped
        );
    }

    #[test]
    fn a_command_by_a_user_travels_inside_an_authorized_entry() {
        let by = AuthInfo {
            user: "alice".into(),
            revision: 1,
        };
        let entry = LeaseRevoke { id: 4 }.into_entry_by(Some(by));
        match entry {
            Entry::Authorized { by, entry } => {
                assert_eq!(by.user, "alice");
                assert!(matches!(*entry, Entry::LeaseRevoke { id: 4 }));
            }
            other => panic!("not authorized: {other:?}"),
        }
        assert!(matches!(
            LeaseRevoke { id: 4 }.into_entry_by(None),
            Entry::LeaseRevoke { id: 4 }
        ));
    }
}

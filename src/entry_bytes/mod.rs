//! A store [`Entry`] as the bytes of a log entry (a Raft entry, a record of
//! the write-ahead log), and back.
//!
//! The bytes are an `ephd.internal.RaftEntry` (`proto/ephd/raft_entry.proto`),
//! which wraps etcd's own request messages. Decoding uses the same wire →
//! core conversions as the gRPC services (`wire.rs`), so a
//! replicated request means exactly what the same request means when a
//! single member serves it. A txn travels as its encoded bytes and is
//! decoded with the bounded-depth decoder the KV service uses, because a
//! txn may nest deeper than prost's recursion limit.

mod auth_change;

use crate::auth::AuthInfo;
use crate::mvcc::{AlarmAction, Entry};
use crate::proto::ephd::internal::{
    raft_entry::Request, AuthorizedBy, InitialRevision, LeaseCheckpoint, LeaseCheckpoints, Limits,
    RaftEntry,
};
use crate::proto::etcdserverpb as pb;
use crate::proto::nesting;
use crate::wire;
use bytes::Bytes;
use prost::Message;

/// A decoded log entry: the mutation and who is waiting for its result.
#[derive(Debug)]
pub struct Proposal {
    /// The member that proposed it.
    pub proposer: u64,
    /// The proposal number on that member.
    pub proposal: u64,
    /// The term the proposer was in, for entries checked against the term
    /// of the log entry carrying them (0: not checked).
    pub term: u64,
    /// The mutation.
    pub entry: Entry,
}

/// Encodes `entry`, proposed by member `proposer` as its proposal number
/// `proposal` in Raft term `term` (0: not checked when applied), as the
/// data of a Raft log entry.
pub fn encode(proposer: u64, proposal: u64, term: u64, entry: Entry) -> Vec<u8> {
    let (authorized_by, entry) = match entry {
        Entry::Authorized { by, entry } => (
            Some(AuthorizedBy {
                user: by.user,
                revision: by.revision,
            }),
            *entry,
        ),
        other => (None, other),
    };
    let request = match entry {
        Entry::Put(r) => Request::Put(wire::put(r)),
        Entry::Delete(r) => Request::DeleteRange(wire::delete(r)),
        Entry::Txn(r) => Request::Txn(Bytes::from(wire::txn(r).encode_to_vec())),
        Entry::Compact { revision } => Request::Compaction(pb::CompactionRequest {
            revision,
            physical: false,
        }),
        Entry::LeaseGrant { id, ttl } => Request::LeaseGrant(pb::LeaseGrantRequest { ttl, id }),
        Entry::LeaseRevoke { id } => Request::LeaseRevoke(pb::LeaseRevokeRequest { id }),
        Entry::LeaseCheckpoint { checkpoints } => Request::LeaseCheckpoint(LeaseCheckpoints {
            checkpoints: checkpoints
                .into_iter()
                .map(|(id, remaining_ms)| LeaseCheckpoint { id, remaining_ms })
                .collect(),
        }),
        Entry::Initialize { revision } => Request::InitialRevision(InitialRevision { revision }),
        Entry::Limits(l) => Request::Limits(Limits {
            max_txn_ops: l.max_txn_ops as u64,
            quota_bytes: l.quota_bytes.unwrap_or(0),
            adopt_unknown_ttl: l.adopt_unknown_ttl.unwrap_or(0),
        }),
        Entry::Alarm {
            action,
            member_id,
            alarm,
        } => Request::Alarm(pb::AlarmRequest {
            action: match action {
                AlarmAction::Get => 0,
                AlarmAction::Activate => 1,
                AlarmAction::Deactivate => 2,
            },
            member_id,
            alarm,
        }),
        Entry::Auth(op) => Request::Auth(auth_change::encode(op)),
        Entry::Authorized { .. } => unreachable!("an authorized entry is never nested"),
    };
    RaftEntry {
        proposer,
        proposal,
        term,
        request: Some(request),
        authorized_by,
    }
    .encode_to_vec()
}

/// Decodes the data of a Raft log entry written by [`encode`]. Only a
/// member that speaks another version of this format could make it fail.
pub fn decode(data: Bytes) -> Result<Proposal, String> {
    let e = RaftEntry::decode(data).map_err(|e| format!("undecodable raft entry: {e}"))?;
    let entry = match e.request {
        Some(Request::Put(r)) => Entry::Put(wire::put_request(r)),
        Some(Request::DeleteRange(r)) => Entry::Delete(wire::delete_request(r)),
        Some(Request::Txn(bytes)) => Entry::Txn(wire::txn_request(
            nesting::decode_txn(bytes).map_err(|e| format!("undecodable txn in entry: {e:?}"))?,
        )),
        Some(Request::Compaction(r)) => Entry::Compact {
            revision: r.revision,
        },
        Some(Request::LeaseGrant(r)) => Entry::LeaseGrant {
            id: r.id,
            ttl: r.ttl,
        },
        Some(Request::LeaseRevoke(r)) => Entry::LeaseRevoke { id: r.id },
        Some(Request::LeaseCheckpoint(c)) => Entry::LeaseCheckpoint {
            checkpoints: c
                .checkpoints
                .into_iter()
                .map(|c| (c.id, c.remaining_ms))
                .collect(),
        },
        Some(Request::InitialRevision(r)) => Entry::Initialize {
            revision: r.revision,
        },
        Some(Request::Limits(l)) => Entry::Limits(crate::mvcc::Limits {
            max_txn_ops: usize::try_from(l.max_txn_ops).unwrap_or(usize::MAX),
            quota_bytes: Some(l.quota_bytes).filter(|q| *q > 0),
            adopt_unknown_ttl: Some(l.adopt_unknown_ttl).filter(|t| *t > 0),
        }),
        Some(Request::Alarm(r)) => Entry::Alarm {
            action: match r.action {
                1 => AlarmAction::Activate,
                2 => AlarmAction::Deactivate,
                _ => AlarmAction::Get,
            },
            member_id: r.member_id,
            alarm: r.alarm,
        },
        Some(Request::Auth(c)) => Entry::Auth(auth_change::decode(c)?),
        None => return Err("raft entry without a request".to_string()),
    };
    let entry = match e.authorized_by {
        Some(by) => Entry::Authorized {
            by: AuthInfo {
                user: by.user,
                revision: by.revision,
            },
            entry: Box::new(entry),
        },
        None => entry,
    };
    Ok(Proposal {
        proposer: e.proposer,
        proposal: e.proposal,
        term: e.term,
        entry,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mvcc::{
        Compare, CompareResult, CompareTarget, DeleteRequest, PutRequest, RangeRequest, RequestOp,
        SortOrder, SortTarget, TxnRequest,
    };

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    /// Every variant, with every field away from its default somewhere.
    fn every_entry() -> Vec<Entry> {
        let put = PutRequest {
            key: b("k"),
            value: b("v"),
            lease: 7,
            prev_kv: true,
            ignore_value: false,
            ignore_lease: true,
        };
        let range = RangeRequest {
            key: b("a"),
            range_end: b("z"),
            limit: 3,
            revision: 9,
            sort_order: SortOrder::Descend,
            sort_target: SortTarget::Mod,
            keys_only: true,
            count_only: false,
            min_mod_revision: 1,
            max_mod_revision: 2,
            min_create_revision: 3,
            max_create_revision: 4,
        };
        let odd_range = RangeRequest {
            sort_order: SortOrder::Unknown,
            sort_target: SortTarget::Unknown,
            count_only: true,
            ..range.clone()
        };
        let compares = vec![
            Compare {
                result: CompareResult::Equal,
                target: CompareTarget::Version(2),
                key: b("k"),
                range_end: Bytes::new(),
            },
            Compare {
                result: CompareResult::Greater,
                target: CompareTarget::Create(3),
                key: b("k"),
                range_end: b("l"),
            },
            Compare {
                result: CompareResult::Less,
                target: CompareTarget::Mod(4),
                key: b("k"),
                range_end: Bytes::new(),
            },
            Compare {
                result: CompareResult::NotEqual,
                target: CompareTarget::Value(b("x")),
                key: b("k"),
                range_end: Bytes::new(),
            },
            Compare {
                result: CompareResult::Unknown,
                target: CompareTarget::Lease(5),
                key: b("k"),
                range_end: Bytes::new(),
            },
            Compare {
                result: CompareResult::Equal,
                target: CompareTarget::Unknown,
                key: b("k"),
                range_end: Bytes::new(),
            },
        ];
        let delete = DeleteRequest {
            key: b("d"),
            range_end: b("e"),
            prev_kv: true,
        };
        let nested = TxnRequest {
            compare: compares[..1].to_vec(),
            success: vec![RequestOp::Range(odd_range)],
            failure: vec![RequestOp::Empty],
        };
        let txn = TxnRequest {
            compare: compares,
            success: vec![
                RequestOp::Put(put.clone()),
                RequestOp::Range(range),
                RequestOp::Txn(nested),
            ],
            failure: vec![RequestOp::Delete(delete.clone()), RequestOp::Empty],
        };
        vec![
            Entry::Put(put),
            Entry::Put(PutRequest::default()),
            Entry::Delete(delete),
            Entry::Txn(txn),
            Entry::Txn(TxnRequest::default()),
            Entry::Compact { revision: 42 },
            Entry::LeaseGrant { id: 99, ttl: 60 },
            Entry::LeaseRevoke { id: 99 },
            Entry::LeaseCheckpoint {
                checkpoints: vec![(99, 1500), (7, -1)],
            },
            Entry::Initialize {
                revision: 1_700_000_000_000_000,
            },
            Entry::Limits(crate::mvcc::Limits {
                max_txn_ops: 64,
                quota_bytes: Some(8 << 30),
                adopt_unknown_ttl: Some(3660),
            }),
            Entry::Limits(crate::mvcc::Limits {
                max_txn_ops: 128,
                quota_bytes: None,
                adopt_unknown_ttl: None,
            }),
            Entry::Alarm {
                action: AlarmAction::Get,
                member_id: 0,
                alarm: 0,
            },
            Entry::Alarm {
                action: AlarmAction::Activate,
                member_id: 17,
                alarm: 1,
            },
            Entry::Alarm {
                action: AlarmAction::Deactivate,
                member_id: u64::MAX,
                alarm: 2,
            },
        ]
        .into_iter()
        .chain(auth_change::tests::every_op().into_iter().map(Entry::Auth))
        .chain([Entry::Authorized {
            by: AuthInfo {
                user: "u".into(),
                revision: 7,
            },
            entry: Box::new(Entry::Put(PutRequest::default())),
        }])
        .collect()
    }

    #[test]
    fn every_entry_variant_survives_encode_and_decode() {
        for (i, entry) in every_entry().into_iter().enumerate() {
            let before = format!("{entry:?}");
            let bytes = encode(0xfeed, i as u64 + 1, 3, entry);
            let p = decode(Bytes::from(bytes.clone())).unwrap();
            assert_eq!((p.proposer, p.proposal, p.term), (0xfeed, i as u64 + 1, 3));
            assert_eq!(format!("{:?}", p.entry), before, "entry {i}");
            // And the decoded entry encodes to the very same bytes.
            assert_eq!(encode(0xfeed, i as u64 + 1, 3, p.entry), bytes, "entry {i}");
        }
    }

    #[test]
    fn a_txn_nested_deeper_than_prosts_limit_replicates() {
        let mut t = TxnRequest::default();
        for _ in 0..150 {
            t = TxnRequest {
                success: vec![RequestOp::Txn(t)],
                ..Default::default()
            };
        }
        let before = format!("{t:?}");
        let p = decode(Bytes::from(encode(1, 2, 0, Entry::Txn(t)))).unwrap();
        assert_eq!(format!("{:?}", p.entry), format!("Txn({before})"));
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert!(decode(Bytes::from_static(b"\xff\xff\xff")).is_err());
        assert!(decode(Bytes::new()).is_err(), "no request in it");
    }
}

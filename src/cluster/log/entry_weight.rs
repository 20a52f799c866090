//! Whether a log entry is light: cheap to apply whatever the store holds,
//! so that a thread that just ran a Raft round may apply it itself
//! (`apply_loop.rs`). Light: a put, a single-key delete, a txn made of
//! single-key reads, puts and deletes (Kubernetes' updates and deletes), a
//! lease grant or checkpoint, the initial revision, limits, an alarm.
//! Everything else may touch any number of keys (a range delete, a txn
//! with a range or a nested txn, a compaction, a lease revoke deleting its
//! keys, an auth change) and is left to the apply thread, so a peer's
//! lane reader or a client's task is never held by it.
//!
//! The entry's bytes (`encode` in `entry.rs`) are read with shallow
//! messages: the same field numbers, with everything but the request's
//! kind and range ends skipped, so nothing of a put's key or value is
//! copied.

use bytes::Bytes;
use prost::Message;

/// A message whose content is skipped.
#[derive(Clone, PartialEq, Message)]
struct Skipped {}

/// A range or delete-range request, its range end only.
#[derive(Clone, PartialEq, Message)]
struct RangeEnd {
    #[prost(bytes = "bytes", tag = "2")]
    range_end: Bytes,
}

/// One operation of a txn (etcd's `RequestOp`).
#[derive(Clone, PartialEq, Message)]
struct Op {
    #[prost(message, optional, tag = "1")]
    range: Option<RangeEnd>,
    #[prost(message, optional, tag = "2")]
    put: Option<Skipped>,
    #[prost(message, optional, tag = "3")]
    delete_range: Option<RangeEnd>,
    #[prost(message, optional, tag = "4")]
    txn: Option<Skipped>,
}

/// A txn's operations (etcd's `TxnRequest`; the compares are skipped).
#[derive(Clone, PartialEq, Message)]
struct Txn {
    #[prost(message, repeated, tag = "2")]
    success: Vec<Op>,
    #[prost(message, repeated, tag = "3")]
    failure: Vec<Op>,
}

/// The request kinds of `ephd.internal.RaftEntry` that can be light.
#[derive(Clone, PartialEq, Message)]
struct Kind {
    #[prost(message, optional, tag = "3")]
    put: Option<Skipped>,
    #[prost(message, optional, tag = "4")]
    delete_range: Option<RangeEnd>,
    #[prost(message, optional, tag = "5")]
    txn: Option<Txn>,
    #[prost(message, optional, tag = "7")]
    lease_grant: Option<Skipped>,
    #[prost(message, optional, tag = "9")]
    alarm: Option<Skipped>,
    #[prost(message, optional, tag = "11")]
    lease_checkpoint: Option<Skipped>,
    #[prost(message, optional, tag = "14")]
    initial_revision: Option<Skipped>,
    #[prost(message, optional, tag = "15")]
    limits: Option<Skipped>,
}

/// Whether the entry with these bytes is light (module docs). Bytes that
/// do not decode are not: the apply thread reports them.
pub(in crate::cluster) fn light(data: &Bytes) -> bool {
    let Ok(k) = Kind::decode(data.clone()) else {
        return false;
    };
    if let Some(d) = &k.delete_range {
        return d.range_end.is_empty();
    }
    if let Some(t) = &k.txn {
        return t.success.iter().chain(&t.failure).all(op_light);
    }
    k.put.is_some()
        || k.lease_grant.is_some()
        || k.alarm.is_some()
        || k.lease_checkpoint.is_some()
        || k.initial_revision.is_some()
        || k.limits.is_some()
}

fn op_light(op: &Op) -> bool {
    op.txn.is_none()
        && op.range.as_ref().is_none_or(|r| r.range_end.is_empty())
        && op
            .delete_range
            .as_ref()
            .is_none_or(|d| d.range_end.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::AuthInfo;
    use crate::entry_bytes::encode;
    use crate::mvcc::{DeleteRequest, Entry, PutRequest, RangeRequest, RequestOp, TxnRequest};

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    fn weighs(entry: Entry) -> bool {
        light(&Bytes::from(encode(1, 2, 3, entry)))
    }

    fn put(key: &str) -> PutRequest {
        PutRequest {
            key: b(key),
            value: Bytes::from(vec![7; 4096]),
            lease: 5,
            prev_kv: true,
            ..Default::default()
        }
    }

    fn delete(key: &str, range_end: &str) -> DeleteRequest {
        DeleteRequest {
            key: b(key),
            range_end: b(range_end),
            ..Default::default()
        }
    }

    fn get(key: &str, range_end: &str) -> RangeRequest {
        RangeRequest {
            key: b(key),
            range_end: b(range_end),
            ..Default::default()
        }
    }

    fn txn(success: Vec<RequestOp>, failure: Vec<RequestOp>) -> Entry {
        Entry::Txn(TxnRequest {
            compare: Vec::new(),
            success,
            failure,
        })
    }

    #[test]
    fn puts_single_key_deletes_and_kubernetes_txns_are_light() {
        assert!(weighs(Entry::Put(put("a"))));
        assert!(weighs(Entry::Delete(delete("a", ""))));
        // kube-apiserver's update: put if unchanged, else read the key.
        assert!(weighs(txn(
            vec![RequestOp::Put(put("a"))],
            vec![RequestOp::Range(get("a", ""))]
        )));
        // Its delete: delete if unchanged, else read the key.
        assert!(weighs(txn(
            vec![RequestOp::Delete(delete("a", ""))],
            vec![RequestOp::Range(get("a", ""))]
        )));
        assert!(weighs(txn(Vec::new(), Vec::new())));
        assert!(weighs(Entry::LeaseGrant { id: 1, ttl: 10 }));
        assert!(weighs(Entry::LeaseCheckpoint {
            checkpoints: vec![(1, 500), (2, -1)]
        }));
        assert!(weighs(Entry::Initialize { revision: 9 }));
        // An authorized put is a put.
        assert!(weighs(Entry::Authorized {
            by: AuthInfo {
                user: "u".into(),
                revision: 4,
            },
            entry: Box::new(Entry::Put(put("a"))),
        }));
    }

    #[test]
    fn what_may_touch_many_keys_is_heavy() {
        assert!(!weighs(Entry::Delete(delete("a", "b"))));
        assert!(!weighs(Entry::Delete(delete("\0", "\0"))));
        assert!(!weighs(Entry::Compact { revision: 5 }));
        assert!(!weighs(Entry::LeaseRevoke { id: 1 }));
        assert!(!weighs(txn(
            vec![RequestOp::Put(put("a"))],
            vec![RequestOp::Range(get("a", "b"))]
        )));
        assert!(!weighs(txn(
            vec![RequestOp::Delete(delete("a", "\0"))],
            Vec::new()
        )));
        assert!(!weighs(txn(
            vec![RequestOp::Txn(match txn(Vec::new(), Vec::new()) {
                Entry::Txn(t) => t,
                _ => unreachable!(),
            })],
            Vec::new()
        )));
        assert!(!weighs(Entry::Authorized {
            by: AuthInfo {
                user: "u".into(),
                revision: 4,
            },
            entry: Box::new(Entry::Delete(delete("a", "b"))),
        }));
    }

    #[test]
    fn garbage_is_heavy() {
        assert!(!light(&Bytes::from_static(b"\xff\xff\xff")));
        assert!(!light(&Bytes::new()));
    }
}

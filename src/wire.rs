//! etcd's wire requests ⇄ the store core's requests. The gRPC services
//! convert what clients send with these (`api/convert.rs` re-exports them),
//! and cluster mode uses both directions for the Raft log
//! (`entry_bytes/`), so a replicated request means exactly what the
//! same request means when one member serves it. Bytes are shared, never
//! copied.

use crate::mvcc as core;
use crate::proto::etcdserverpb as pb;

// ------------------------------------------------------------ wire → core

/// A Range request from the wire.
pub(crate) fn range_request(r: pb::RangeRequest) -> core::RangeRequest {
    core::RangeRequest {
        key: r.key,
        range_end: r.range_end,
        limit: r.limit,
        revision: r.revision,
        sort_order: match r.sort_order {
            0 => core::SortOrder::None,
            1 => core::SortOrder::Ascend,
            2 => core::SortOrder::Descend,
            _ => core::SortOrder::Unknown,
        },
        sort_target: match r.sort_target {
            0 => core::SortTarget::Key,
            1 => core::SortTarget::Version,
            2 => core::SortTarget::Create,
            3 => core::SortTarget::Mod,
            4 => core::SortTarget::Value,
            _ => core::SortTarget::Unknown,
        },
        keys_only: r.keys_only,
        count_only: r.count_only,
        min_mod_revision: r.min_mod_revision,
        max_mod_revision: r.max_mod_revision,
        min_create_revision: r.min_create_revision,
        max_create_revision: r.max_create_revision,
    }
}

/// A Put request from the wire.
pub(crate) fn put_request(r: pb::PutRequest) -> core::PutRequest {
    core::PutRequest {
        key: r.key,
        value: r.value,
        lease: r.lease,
        prev_kv: r.prev_kv,
        ignore_value: r.ignore_value,
        ignore_lease: r.ignore_lease,
    }
}

/// A DeleteRange request from the wire.
pub(crate) fn delete_request(r: pb::DeleteRangeRequest) -> core::DeleteRequest {
    core::DeleteRequest {
        key: r.key,
        range_end: r.range_end,
        prev_kv: r.prev_kv,
    }
}

fn compare(c: pb::Compare) -> core::Compare {
    use pb::compare::TargetUnion as U;
    // etcd reads the operand only if it is of the target's kind; otherwise
    // it compares against zero (or the empty value).
    let target = match (c.target, c.target_union) {
        (0, Some(U::Version(v))) => core::CompareTarget::Version(v),
        (0, _) => core::CompareTarget::Version(0),
        (1, Some(U::CreateRevision(v))) => core::CompareTarget::Create(v),
        (1, _) => core::CompareTarget::Create(0),
        (2, Some(U::ModRevision(v))) => core::CompareTarget::Mod(v),
        (2, _) => core::CompareTarget::Mod(0),
        (3, Some(U::Value(v))) => core::CompareTarget::Value(v),
        (3, _) => core::CompareTarget::Value(Default::default()),
        (4, Some(U::Lease(v))) => core::CompareTarget::Lease(v),
        (4, _) => core::CompareTarget::Lease(0),
        _ => core::CompareTarget::Unknown,
    };
    core::Compare {
        result: match c.result {
            0 => core::CompareResult::Equal,
            1 => core::CompareResult::Greater,
            2 => core::CompareResult::Less,
            3 => core::CompareResult::NotEqual,
            _ => core::CompareResult::Unknown,
        },
        target,
        key: c.key,
        range_end: c.range_end,
    }
}

fn request_op(op: pb::RequestOp) -> core::RequestOp {
    use pb::request_op::Request as R;
    match op.request {
        Some(R::RequestRange(r)) => core::RequestOp::Range(range_request(r)),
        Some(R::RequestPut(r)) => core::RequestOp::Put(put_request(r)),
        Some(R::RequestDeleteRange(r)) => core::RequestOp::Delete(delete_request(r)),
        Some(R::RequestTxn(r)) => core::RequestOp::Txn(txn_request(r)),
        None => core::RequestOp::Empty,
    }
}

/// A Txn request from the wire.
pub(crate) fn txn_request(r: pb::TxnRequest) -> core::TxnRequest {
    core::TxnRequest {
        compare: r.compare.into_iter().map(compare).collect(),
        success: r.success.into_iter().map(request_op).collect(),
        failure: r.failure.into_iter().map(request_op).collect(),
    }
}

// ------------------------------------------------------------ core → wire
//
// The inverse of the above, for the Raft log. A value the core keeps as
// `Unknown` goes out as -1, which converts back to `Unknown`.

/// A Put as etcd's wire message.
pub(crate) fn put(r: core::PutRequest) -> pb::PutRequest {
    pb::PutRequest {
        key: r.key,
        value: r.value,
        lease: r.lease,
        prev_kv: r.prev_kv,
        ignore_value: r.ignore_value,
        ignore_lease: r.ignore_lease,
    }
}

/// A DeleteRange as etcd's wire message.
pub(crate) fn delete(r: core::DeleteRequest) -> pb::DeleteRangeRequest {
    pb::DeleteRangeRequest {
        key: r.key,
        range_end: r.range_end,
        prev_kv: r.prev_kv,
    }
}

fn range_wire(r: core::RangeRequest) -> pb::RangeRequest {
    pb::RangeRequest {
        key: r.key,
        range_end: r.range_end,
        limit: r.limit,
        revision: r.revision,
        sort_order: match r.sort_order {
            core::SortOrder::None => 0,
            core::SortOrder::Ascend => 1,
            core::SortOrder::Descend => 2,
            core::SortOrder::Unknown => -1,
        },
        sort_target: match r.sort_target {
            core::SortTarget::Key => 0,
            core::SortTarget::Version => 1,
            core::SortTarget::Create => 2,
            core::SortTarget::Mod => 3,
            core::SortTarget::Value => 4,
            core::SortTarget::Unknown => -1,
        },
        serializable: false,
        keys_only: r.keys_only,
        count_only: r.count_only,
        min_mod_revision: r.min_mod_revision,
        max_mod_revision: r.max_mod_revision,
        min_create_revision: r.min_create_revision,
        max_create_revision: r.max_create_revision,
    }
}

fn compare_wire(c: core::Compare) -> pb::Compare {
    use pb::compare::TargetUnion as U;
    let (target, union) = match c.target {
        core::CompareTarget::Version(v) => (0, Some(U::Version(v))),
        core::CompareTarget::Create(v) => (1, Some(U::CreateRevision(v))),
        core::CompareTarget::Mod(v) => (2, Some(U::ModRevision(v))),
        core::CompareTarget::Value(v) => (3, Some(U::Value(v))),
        core::CompareTarget::Lease(v) => (4, Some(U::Lease(v))),
        core::CompareTarget::Unknown => (-1, None),
    };
    pb::Compare {
        result: match c.result {
            core::CompareResult::Equal => 0,
            core::CompareResult::Greater => 1,
            core::CompareResult::Less => 2,
            core::CompareResult::NotEqual => 3,
            core::CompareResult::Unknown => -1,
        },
        target,
        key: c.key,
        range_end: c.range_end,
        target_union: union,
    }
}

fn op_wire(op: core::RequestOp) -> pb::RequestOp {
    use pb::request_op::Request as R;
    pb::RequestOp {
        request: match op {
            core::RequestOp::Range(r) => Some(R::RequestRange(range_wire(r))),
            core::RequestOp::Put(r) => Some(R::RequestPut(put(r))),
            core::RequestOp::Delete(r) => Some(R::RequestDeleteRange(delete(r))),
            core::RequestOp::Txn(r) => Some(R::RequestTxn(txn(r))),
            core::RequestOp::Empty => None,
        },
    }
}

/// A Txn as etcd's wire message.
pub(crate) fn txn(r: core::TxnRequest) -> pb::TxnRequest {
    pb::TxnRequest {
        compare: r.compare.into_iter().map(compare_wire).collect(),
        success: r.success.into_iter().map(op_wire).collect(),
        failure: r.failure.into_iter().map(op_wire).collect(),
    }
}

//! Wire ⇄ core conversions. Bytes are shared, never copied.

use crate::mvcc as core;
use crate::proto::{etcdserverpb as pb, mvccpb};

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

pub(crate) fn txn_request(r: pb::TxnRequest) -> core::TxnRequest {
    core::TxnRequest {
        compare: r.compare.into_iter().map(compare).collect(),
        success: r.success.into_iter().map(request_op).collect(),
        failure: r.failure.into_iter().map(request_op).collect(),
    }
}

pub(crate) fn kv(kv: &core::KeyValue, keys_only: bool) -> mvccpb::KeyValue {
    mvccpb::KeyValue {
        key: kv.key.clone(),
        create_revision: kv.create_revision,
        mod_revision: kv.mod_revision,
        version: kv.version,
        value: if keys_only {
            Default::default()
        } else {
            kv.value.clone()
        },
        lease: kv.lease,
    }
}

/// A response header as nested responses carry it: only the revision.
fn inner_header(revision: i64) -> Option<pb::ResponseHeader> {
    Some(pb::ResponseHeader {
        revision,
        ..Default::default()
    })
}

pub(crate) fn range_response(
    r: core::RangeResponse,
    header: Option<pb::ResponseHeader>,
) -> pb::RangeResponse {
    pb::RangeResponse {
        header,
        kvs: r.kvs.iter().map(|k| kv(k, r.keys_only)).collect(),
        more: r.more,
        count: r.count,
    }
}

/// About how much memory a Range response takes from conversion until it
/// has been sent: each key-value's wire form (key, value, revisions and
/// field tags) plus the message struct it is encoded from.
pub(crate) fn range_response_size(r: &core::RangeResponse) -> u64 {
    const PER_KV: usize = 40 + std::mem::size_of::<mvccpb::KeyValue>();
    let bytes: usize = r
        .kvs
        .iter()
        .map(|k| k.key.len() + if r.keys_only { 0 } else { k.value.len() } + PER_KV)
        .sum();
    (bytes + 64) as u64
}

pub(crate) fn put_response(
    r: core::PutResponse,
    header: Option<pb::ResponseHeader>,
) -> pb::PutResponse {
    pb::PutResponse {
        header,
        prev_kv: r.prev_kv.as_deref().map(|k| kv(k, false)),
    }
}

pub(crate) fn delete_response(
    r: core::DeleteResponse,
    header: Option<pb::ResponseHeader>,
) -> pb::DeleteRangeResponse {
    pb::DeleteRangeResponse {
        header,
        deleted: r.deleted,
        prev_kvs: r.prev_kvs.iter().map(|k| kv(k, false)).collect(),
    }
}

pub(crate) fn txn_response(
    r: core::TxnResponse,
    header: Option<pb::ResponseHeader>,
) -> pb::TxnResponse {
    use pb::response_op::Response as R;
    pb::TxnResponse {
        header,
        succeeded: r.succeeded,
        responses: r
            .responses
            .into_iter()
            .map(|op| pb::ResponseOp {
                response: Some(match op {
                    core::ResponseOp::Range(r) => {
                        let h = inner_header(r.revision);
                        R::ResponseRange(range_response(r, h))
                    }
                    core::ResponseOp::Put(r) => {
                        let h = inner_header(r.revision);
                        R::ResponsePut(put_response(r, h))
                    }
                    core::ResponseOp::Delete(r) => {
                        let h = inner_header(r.revision);
                        R::ResponseDeleteRange(delete_response(r, h))
                    }
                    core::ResponseOp::Txn(r) => {
                        let h = inner_header(r.revision);
                        R::ResponseTxn(txn_response(r, h))
                    }
                }),
            })
            .collect(),
    }
}

pub(crate) fn event(e: &core::Event) -> mvccpb::Event {
    mvccpb::Event {
        r#type: match e.kind {
            core::EventKind::Put => mvccpb::event::EventType::Put as i32,
            core::EventKind::Delete => mvccpb::event::EventType::Delete as i32,
        },
        kv: Some(kv(&e.kv, false)),
        prev_kv: e.prev_kv.as_deref().map(|k| kv(k, false)),
    }
}

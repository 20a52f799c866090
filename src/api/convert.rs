//! Wire ⇄ core conversions. Bytes are shared, never copied.

use crate::mvcc as core;
use crate::proto::{etcdserverpb as pb, mvccpb};

pub(crate) use crate::wire::{delete_request, put_request, range_request, txn_request};

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

//! Request shapes, as kube-apiserver sends them.

use crate::pool::{call, Pool};
use bytes::Bytes;
use ephd::proto::etcdserverpb::{
    compare::{CompareResult, CompareTarget, TargetUnion},
    request_op::Request,
    response_op::Response,
    Compare, PutRequest, RangeRequest, RequestOp, TxnRequest, TxnResponse,
};
use std::time::Duration;

/// `MOD(key) == rev`.
pub fn mod_equals(key: &Bytes, rev: i64) -> Compare {
    Compare {
        result: CompareResult::Equal as i32,
        target: CompareTarget::Mod as i32,
        key: key.clone(),
        range_end: Bytes::new(),
        target_union: Some(TargetUnion::ModRevision(rev)),
    }
}

/// A Put op.
pub fn put_op(key: &Bytes, value: Bytes, lease: i64) -> RequestOp {
    RequestOp {
        request: Some(Request::RequestPut(PutRequest {
            key: key.clone(),
            value,
            lease,
            ..Default::default()
        })),
    }
}

/// A single-key Get op.
pub fn get_op(key: &Bytes) -> RequestOp {
    RequestOp {
        request: Some(Request::RequestRange(RangeRequest {
            key: key.clone(),
            ..Default::default()
        })),
    }
}

/// The apiserver's create: `Txn(MOD(key) == 0 → Put)`, no else branch.
pub fn create_txn(key: &Bytes, value: Bytes, lease: i64) -> TxnRequest {
    TxnRequest {
        compare: vec![mod_equals(key, 0)],
        success: vec![put_op(key, value, lease)],
        failure: Vec::new(),
    }
}

/// The apiserver's update (GuaranteedUpdate):
/// `Txn(MOD(key) == rev → Put, else Get(key))`.
pub fn cas_txn(key: &Bytes, rev: i64, value: Bytes, lease: i64) -> TxnRequest {
    TxnRequest {
        compare: vec![mod_equals(key, rev)],
        success: vec![put_op(key, value, lease)],
        failure: vec![get_op(key)],
    }
}

/// The revision in a response header (0 if absent).
pub fn header_rev(h: &Option<ephd::proto::etcdserverpb::ResponseHeader>) -> i64 {
    h.as_ref().map_or(0, |h| h.revision)
}

/// The key's mod revision from a failed CAS's Get (0 if the key is gone).
pub fn failed_cas_rev(resp: &TxnResponse) -> i64 {
    match resp.responses.first().and_then(|r| r.response.as_ref()) {
        Some(Response::ResponseRange(r)) => r.kvs.first().map_or(0, |kv| kv.mod_revision),
        _ => 0,
    }
}

/// The store's current revision (a count-only Range over `key`'s prefix).
pub async fn current_revision(pool: &Pool, key: &Bytes, timeout: Duration) -> Result<i64, String> {
    let mut kv = pool.kv(0);
    let resp = call(
        timeout,
        kv.range(RangeRequest {
            key: key.clone(),
            range_end: crate::keys::prefix_end(key),
            count_only: true,
            ..Default::default()
        }),
    )
    .await
    .map_err(|(k, m)| format!("reading the current revision: {k}: {m}"))?;
    Ok(header_rev(&resp.header))
}

/// Live keys under a prefix.
pub async fn count_prefix(pool: &Pool, prefix: &Bytes, timeout: Duration) -> Result<i64, String> {
    let mut kv = pool.kv(0);
    let resp = call(
        timeout,
        kv.range(RangeRequest {
            key: prefix.clone(),
            range_end: crate::keys::prefix_end(prefix),
            count_only: true,
            ..Default::default()
        }),
    )
    .await
    .map_err(|(k, m)| format!("counting keys: {k}: {m}"))?;
    Ok(resp.count)
}

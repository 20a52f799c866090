//! Normalization of responses before comparison. Only what must differ
//! between two correct servers is touched:
//! - `header.cluster_id`, `header.member_id`, `header.raft_term` (zeroed);
//! - server-chosen lease ids (mapped back to their issued-lease markers);
//! - the remaining TTL of a lease (time-dependent; tolerance of 3 s);
//! - orders etcd leaves unspecified: ties of non-key sorts (Go's unstable
//!   sort), lease lists and a lease's attached keys (Go map order).

use ephd::proto::etcdserverpb::{
    request_op, response_op, DeleteRangeResponse, LeaseGrantResponse, LeaseKeepAliveResponse,
    LeaseLeasesResponse, LeaseRevokeResponse, LeaseTimeToLiveResponse, PutResponse, RangeRequest,
    RangeResponse, RequestOp, ResponseHeader, ResponseOp, TxnRequest, TxnResponse, WatchResponse,
};
use ephd::proto::mvccpb::{Event, KeyValue};

use super::ops::{issued_lease, sorts_by_non_key};

/// Remaining-TTL slack accepted between two reads of the same lease.
const TTL_TOLERANCE_SECS: i64 = 3;

/// Normalizes the responses of one target, knowing its issued lease ids.
pub struct Normalizer<'a> {
    pub issued: &'a [i64],
}

impl Normalizer<'_> {
    /// Maps a server-chosen lease id back to its marker.
    pub fn lease(&self, id: i64) -> i64 {
        match self.issued.iter().position(|&l| l == id && id != 0) {
            Some(n) => issued_lease(n),
            None => id,
        }
    }

    /// Zeroes the fields two correct servers legitimately disagree on.
    pub fn header(&self, h: &mut Option<ResponseHeader>) {
        if let Some(h) = h {
            h.cluster_id = 0;
            h.member_id = 0;
            h.raft_term = 0;
        }
    }

    /// Maps the key-value's lease to its marker.
    pub fn kv(&self, kv: &mut KeyValue) {
        kv.lease = self.lease(kv.lease);
    }

    /// Header, leases, and unspecified tie order of non-key sorts.
    pub fn range(&self, req: &RangeRequest, resp: &mut RangeResponse) {
        self.header(&mut resp.header);
        resp.kvs.iter_mut().for_each(|kv| self.kv(kv));
        if sorts_by_non_key(req) {
            canonicalize_ties(req, resp);
        }
    }

    /// Header and the previous key-value's lease.
    pub fn put(&self, resp: &mut PutResponse) {
        self.header(&mut resp.header);
        if let Some(kv) = &mut resp.prev_kv {
            self.kv(kv);
        }
    }

    /// Header and the deleted key-values' leases.
    pub fn delete(&self, resp: &mut DeleteRangeResponse) {
        self.header(&mut resp.header);
        resp.prev_kvs.iter_mut().for_each(|kv| self.kv(kv));
    }

    /// Recurses into the responses of the branch that ran (ranges need
    /// their request to canonicalize sort ties).
    pub fn txn(&self, req: &TxnRequest, resp: &mut TxnResponse) {
        self.header(&mut resp.header);
        let ops = if resp.succeeded {
            &req.success
        } else {
            &req.failure
        };
        for (op, r) in ops.iter().zip(resp.responses.iter_mut()) {
            self.response_op(op, r);
        }
    }

    fn response_op(&self, op: &RequestOp, resp: &mut ResponseOp) {
        use request_op::Request as Q;
        use response_op::Response as R;
        match (&op.request, &mut resp.response) {
            (Some(Q::RequestRange(q)), Some(R::ResponseRange(r))) => self.range(q, r),
            (_, Some(R::ResponsePut(r))) => self.put(r),
            (_, Some(R::ResponseDeleteRange(r))) => self.delete(r),
            (Some(Q::RequestTxn(q)), Some(R::ResponseTxn(r))) => self.txn(q, r),
            (_, Some(R::ResponseRange(r))) => self.header(&mut r.header),
            (_, Some(R::ResponseTxn(r))) => self.header(&mut r.header),
            (_, None) => {}
        }
    }

    /// Header and the (possibly server-chosen) lease id.
    pub fn lease_grant(&self, resp: &mut LeaseGrantResponse) {
        self.header(&mut resp.header);
        resp.id = self.lease(resp.id);
    }

    /// Header only.
    pub fn lease_revoke(&self, resp: &mut LeaseRevokeResponse) {
        self.header(&mut resp.header);
    }

    /// Lease id, remaining TTL within tolerance, keys in sorted order.
    pub fn lease_ttl(&self, resp: &mut LeaseTimeToLiveResponse) {
        self.header(&mut resp.header);
        resp.id = self.lease(resp.id);
        let elapsed = resp.granted_ttl - resp.ttl;
        if resp.ttl > 0 && (0..=TTL_TOLERANCE_SECS).contains(&elapsed) {
            resp.ttl = resp.granted_ttl;
        }
        resp.keys.sort();
    }

    /// Lease ids, sorted: etcd does not specify the order of the list.
    pub fn lease_leases(&self, resp: &mut LeaseLeasesResponse) {
        self.header(&mut resp.header);
        resp.leases.iter_mut().for_each(|l| l.id = self.lease(l.id));
        resp.leases.sort_by_key(|l| l.id);
    }

    /// Header and lease id.
    pub fn keep_alive(&self, resp: &mut LeaseKeepAliveResponse) {
        self.header(&mut resp.header);
        resp.id = self.lease(resp.id);
    }

    /// Control responses (created / canceled / progress): header revision kept.
    pub fn watch_control(&self, resp: &mut WatchResponse) {
        self.header(&mut resp.header);
        resp.events.iter_mut().for_each(|e| self.event(e));
    }

    /// Leases of an event's key-value and previous key-value.
    pub fn event(&self, e: &mut Event) {
        if let Some(kv) = &mut e.kv {
            self.kv(kv);
        }
        if let Some(kv) = &mut e.prev_kv {
            self.kv(kv);
        }
    }
}

/// The value a non-key sort compares, as a sortable tuple.
fn sort_value(target: i32, kv: &KeyValue) -> (i64, Vec<u8>) {
    use ephd::proto::etcdserverpb::range_request::SortTarget;
    match SortTarget::try_from(target) {
        Ok(SortTarget::Version) => (kv.version, Vec::new()),
        Ok(SortTarget::Create) => (kv.create_revision, Vec::new()),
        Ok(SortTarget::Mod) => (kv.mod_revision, Vec::new()),
        Ok(SortTarget::Value) => (0, kv.value.to_vec()),
        _ => (0, kv.key.to_vec()),
    }
}

/// etcd sorts non-key targets with Go's unstable `sort.Sort`, so the order
/// of equal elements is unspecified: order each run of equal sort values by
/// key. When `limit` cut the result inside such a run, which members made
/// it is unspecified too: keep only their sort value.
fn canonicalize_ties(req: &RangeRequest, resp: &mut RangeResponse) {
    let target = req.sort_target;
    let kvs = &mut resp.kvs;
    let mut start = 0;
    while start < kvs.len() {
        let value = sort_value(target, &kvs[start]);
        let mut end = start + 1;
        while end < kvs.len() && sort_value(target, &kvs[end]) == value {
            end += 1;
        }
        kvs[start..end].sort_by(|a, b| a.key.cmp(&b.key));
        let cut_by_limit = resp.more && end == kvs.len();
        if cut_by_limit {
            for kv in &mut kvs[start..end] {
                *kv = only_sort_field(target, kv);
            }
        }
        start = end;
    }
}

/// A KeyValue holding nothing but the field a non-key sort compares.
fn only_sort_field(target: i32, kv: &KeyValue) -> KeyValue {
    use ephd::proto::etcdserverpb::range_request::SortTarget;
    let mut out = KeyValue::default();
    match SortTarget::try_from(target) {
        Ok(SortTarget::Version) => out.version = kv.version,
        Ok(SortTarget::Create) => out.create_revision = kv.create_revision,
        Ok(SortTarget::Mod) => out.mod_revision = kv.mod_revision,
        Ok(SortTarget::Value) => out.value = kv.value.clone(),
        _ => out.key = kv.key.clone(),
    }
    out
}

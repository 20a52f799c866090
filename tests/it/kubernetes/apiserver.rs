//! A client that speaks to an etcd v3 server exactly as kube-apiserver
//! 1.30–1.35 does for resources routed through `--etcd-servers-overrides`
//! (see /work/shared/design/k8s-etcd-contract.md): every request is built by
//! hand on the generated tonic clients so each field is the apiserver's.
//!
//! * writes are always `Txn` in the four shapes of `store.go`/`compact.go`
//!   (create, GuaranteedUpdate, conditional delete, compactor CAS), and the
//!   shape of every response is checked the way the apiserver (or clientv3's
//!   `kubernetes` wrapper) indexes it;
//! * lists page with `continue = lastKey + "\x00"`, the resource prefix's
//!   `range_end` and the revision pinned to the first page, and every page's
//!   `count`/`more` is checked against both 1.30's and 1.32+'s reading;
//! * [`Watcher`] is the watch cache's (or a direct) watch: it checks every
//!   response as clientv3 + `event.go` would and records what a watch cache
//!   would know (its resource version), so tests can run the apiserver's
//!   consistent-read wait loop ([`Watcher::wait_until_fresh`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ephd::proto::etcdserverpb::{
    self as pb,
    compare::{CompareResult, CompareTarget, TargetUnion},
    kv_client::KvClient,
    lease_client::LeaseClient,
    request_op::Request as Op,
    response_op::Response as OpResponse,
    watch_client::WatchClient,
    watch_request::RequestUnion,
};
use ephd::proto::mvccpb::{event::EventType, Event, KeyValue};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::Status;

use crate::harness::connect_channel;
use crate::support::{prefix_end, within, within_for};

/// `--etcd-prefix`'s default.
pub const REGISTRY: &str = "/registry";
/// The coordination.k8s.io Lease resource prefix (with the trailing slash
/// the storage adds for lists and watches).
pub const LEASES: &str = "/registry/leases/";
/// The core Event resource prefix.
pub const EVENTS: &str = "/registry/events/";
/// The compactor's coordination key (no prefix).
pub const COMPACT_REV_KEY: &str = "compact_rev_key";
/// The TTL kube-apiserver grants event leases with by default:
/// `--event-ttl` (1h) + min(reuse window (60 s), 5 % of it).
pub const EVENT_LEASE_TTL: i64 = 3660;
/// `defaultLeaseMaxObjectCount` in `lease_manager.go`.
pub const LEASE_MAX_OBJECTS: usize = 1000;
/// The apiserver's consistent-read wait bound (`blockTimeout`).
pub const BLOCK_TIMEOUT: Duration = Duration::from_secs(3);
/// How often the watch cache re-requests progress while a read waits.
pub const PROGRESS_REQUEST_PERIOD: Duration = Duration::from_millis(100);

/// etcd's error texts, which clientv3 maps to typed errors by exact match.
pub const ERR_COMPACTED: &str = "etcdserver: mvcc: required revision has been compacted";
pub const ERR_FUTURE_REV: &str = "etcdserver: mvcc: required revision is a future revision";
pub const ERR_LEASE_NOT_FOUND: &str = "etcdserver: requested lease not found";

/// Bytes of a string.
pub fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

/// A key as text (test keys are ASCII).
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The header revision of a response (every ephd response must have one).
#[track_caller]
pub fn header_rev(h: &Option<pb::ResponseHeader>) -> i64 {
    h.as_ref().expect("response carries a header").revision
}

fn compare(target: CompareTarget, key: &[u8], value: TargetUnion) -> pb::Compare {
    pb::Compare {
        result: CompareResult::Equal as i32,
        target: target as i32,
        key: Bytes::copy_from_slice(key),
        range_end: Bytes::new(),
        target_union: Some(value),
    }
}

/// `clientv3.Compare(clientv3.ModRevision(key), "=", rev)`.
pub fn mod_equals(key: &[u8], rev: i64) -> pb::Compare {
    compare(CompareTarget::Mod, key, TargetUnion::ModRevision(rev))
}

/// `clientv3.Compare(clientv3.Version(key), "=", v)`.
pub fn version_equals(key: &[u8], v: i64) -> pb::Compare {
    compare(CompareTarget::Version, key, TargetUnion::Version(v))
}

/// `clientv3.OpPut(key, value, clientv3.WithLease(lease))`.
pub fn put_op(key: &[u8], value: &[u8], lease: i64) -> pb::RequestOp {
    pb::RequestOp {
        request: Some(Op::RequestPut(pb::PutRequest {
            key: Bytes::copy_from_slice(key),
            value: Bytes::copy_from_slice(value),
            lease,
            ..Default::default()
        })),
    }
}

/// `clientv3.OpGet(key)`.
pub fn get_op(key: &[u8]) -> pb::RequestOp {
    pb::RequestOp {
        request: Some(Op::RequestRange(pb::RangeRequest {
            key: Bytes::copy_from_slice(key),
            ..Default::default()
        })),
    }
}

/// `clientv3.OpDelete(key)`.
pub fn delete_op(key: &[u8]) -> pb::RequestOp {
    pb::RequestOp {
        request: Some(Op::RequestDeleteRange(pb::DeleteRangeRequest {
            key: Bytes::copy_from_slice(key),
            ..Default::default()
        })),
    }
}

/// The answer to a `GuaranteedUpdate` or `conditionalDelete` attempt, read
/// the way the apiserver reads it.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// `succeeded`; the revision is `header.revision`, the object's new RV.
    Done(i64),
    /// Compare failed and the failure Range returned the current object:
    /// the apiserver retries with it.
    Conflict(KeyValue),
    /// Compare failed and the failure Range returned nothing: NotFound.
    NotFound,
}

/// What one paginated list returned.
#[derive(Debug, Clone)]
pub struct Listed {
    /// The list's resource version: the first page's `header.revision` (or
    /// the requested revision).
    pub revision: i64,
    /// Every key-value of every page, in order.
    pub kvs: Vec<KeyValue>,
    /// How many Range requests it took.
    pub pages: usize,
}

/// One kube-apiserver storage client (a clientv3 with its connection).
#[derive(Clone)]
pub struct Apiserver {
    channel: Channel,
}

impl Apiserver {
    /// A client on a new connection to `endpoint`.
    pub async fn connect(endpoint: &str) -> Apiserver {
        Apiserver::on(connect_channel(endpoint).await)
    }

    /// A client on an existing connection.
    pub fn on(channel: Channel) -> Apiserver {
        Apiserver { channel }
    }

    /// The connection.
    pub fn channel(&self) -> Channel {
        self.channel.clone()
    }

    /// KV client with clientv3's receive limit (MaxInt32: unpaged lists can
    /// be huge).
    pub fn kv(&self) -> KvClient<Channel> {
        KvClient::new(self.channel.clone())
            .max_decoding_message_size(i32::MAX as usize)
            .max_encoding_message_size(2 * 1024 * 1024)
    }

    fn lease(&self) -> LeaseClient<Channel> {
        LeaseClient::new(self.channel.clone())
    }

    /// `KV.Range`, bounded.
    pub async fn range(&self, req: pb::RangeRequest) -> Result<pb::RangeResponse, Status> {
        within("Range", self.kv().range(req))
            .await
            .map(tonic::Response::into_inner)
    }

    /// `KV.Txn`, bounded.
    pub async fn txn(&self, req: pb::TxnRequest) -> Result<pb::TxnResponse, Status> {
        within("Txn", self.kv().txn(req))
            .await
            .map(tonic::Response::into_inner)
    }

    /// `KV.Compact{revision, physical: false}`; returns the header revision.
    pub async fn compact(&self, revision: i64) -> Result<i64, Status> {
        let resp = within(
            "Compact",
            self.kv().compact(pb::CompactionRequest {
                revision,
                physical: false,
            }),
        )
        .await?
        .into_inner();
        Ok(header_rev(&resp.header))
    }

    /// `store.Create`: `Txn{MOD(key) == 0 → Put{key, value, lease}}` with no
    /// failure ops. `Some(rev)` on success (the object's RV), `None` when the
    /// key exists (409 AlreadyExists).
    pub async fn create(&self, key: &str, value: &[u8], lease: i64) -> Result<Option<i64>, Status> {
        let resp = self
            .txn(pb::TxnRequest {
                compare: vec![mod_equals(key.as_bytes(), 0)],
                success: vec![put_op(key.as_bytes(), value, lease)],
                failure: vec![],
            })
            .await?;
        let rev = header_rev(&resp.header);
        assert!(rev > 0, "create {key}: header.revision must be > 0");
        assert_eq!(
            resp.responses.len(),
            usize::from(resp.succeeded),
            "create {key}: one ResponsePut on success, nothing on failure: {resp:?}"
        );
        if resp.succeeded {
            match &resp.responses[0].response {
                Some(OpResponse::ResponsePut(p)) => assert_eq!(
                    header_rev(&p.header),
                    rev,
                    "create {key}: the put's header is the txn's revision"
                ),
                other => panic!("create {key}: success response is not a put: {other:?}"),
            }
            Ok(Some(rev))
        } else {
            Ok(None)
        }
    }

    /// The failure branch of GuaranteedUpdate/conditionalDelete: exactly one
    /// `ResponseRange` (1.30–1.31 and `OptimisticDelete` index
    /// `Responses[0].GetResponseRange()` unchecked; 3.6's `OptimisticPut`
    /// errors out on an empty list).
    #[track_caller]
    fn failure_range(what: &str, resp: &pb::TxnResponse) -> Outcome {
        assert_eq!(
            resp.responses.len(),
            1,
            "{what}: failure branch must answer exactly one ResponseRange: {resp:?}"
        );
        let range = match &resp.responses[0].response {
            Some(OpResponse::ResponseRange(r)) => r,
            other => panic!("{what}: failure response is not a ResponseRange: {other:?}"),
        };
        assert!(
            range.kvs.len() <= 1,
            "{what}: a single-key Range returned {} kvs",
            range.kvs.len()
        );
        match range.kvs.first() {
            Some(kv) => Outcome::Conflict(kv.clone()),
            None => Outcome::NotFound,
        }
    }

    /// One `GuaranteedUpdate` attempt: `Txn{MOD(key) == expected → Put,
    /// failure: Range(key)}`.
    pub async fn update(
        &self,
        key: &str,
        value: &[u8],
        lease: i64,
        expected: i64,
    ) -> Result<Outcome, Status> {
        let resp = self
            .txn(pb::TxnRequest {
                compare: vec![mod_equals(key.as_bytes(), expected)],
                success: vec![put_op(key.as_bytes(), value, lease)],
                failure: vec![get_op(key.as_bytes())],
            })
            .await?;
        let rev = header_rev(&resp.header);
        assert!(rev > 0, "update {key}: header.revision must be > 0");
        if resp.succeeded {
            assert!(
                matches!(
                    resp.responses.as_slice(),
                    [pb::ResponseOp {
                        response: Some(OpResponse::ResponsePut(_))
                    }]
                ),
                "update {key}: success must answer one ResponsePut: {resp:?}"
            );
            Ok(Outcome::Done(rev))
        } else {
            let outcome = Self::failure_range(&format!("update {key}"), &resp);
            if let Outcome::Conflict(kv) = &outcome {
                assert!(
                    kv.mod_revision <= rev,
                    "update {key}: failure kv newer than the header revision"
                );
            }
            Ok(outcome)
        }
    }

    /// `conditionalDelete`: `Txn{MOD(key) == expected → DeleteRange(key),
    /// failure: Range(key)}`.
    pub async fn delete(&self, key: &str, expected: i64) -> Result<Outcome, Status> {
        let resp = self
            .txn(pb::TxnRequest {
                compare: vec![mod_equals(key.as_bytes(), expected)],
                success: vec![delete_op(key.as_bytes())],
                failure: vec![get_op(key.as_bytes())],
            })
            .await?;
        if resp.succeeded {
            match resp.responses.as_slice() {
                [pb::ResponseOp {
                    response: Some(OpResponse::ResponseDeleteRange(d)),
                }] => assert_eq!(d.deleted, 1, "delete {key}: deleted count"),
                other => panic!("delete {key}: success is not one ResponseDeleteRange: {other:?}"),
            }
            Ok(Outcome::Done(header_rev(&resp.header)))
        } else {
            Ok(Self::failure_range(&format!("delete {key}"), &resp))
        }
    }

    /// clientv3 1.32+ `Kubernetes.Get`: `Range{key, limit: 1, revision}`.
    /// Returns (header.revision, the key-value if present).
    pub async fn get_at(
        &self,
        key: &str,
        revision: i64,
    ) -> Result<(i64, Option<KeyValue>), Status> {
        let resp = self
            .range(pb::RangeRequest {
                key: b(key),
                limit: 1,
                revision,
                ..Default::default()
            })
            .await?;
        assert!(resp.kvs.len() <= 1, "get {key}: more than one kv");
        assert!(!resp.more, "get {key}: a single key never has more");
        Ok((header_rev(&resp.header), resp.kvs.into_iter().next()))
    }

    /// [`Apiserver::get_at`] at the latest revision.
    pub async fn get(&self, key: &str) -> Result<(i64, Option<KeyValue>), Status> {
        self.get_at(key, 0).await
    }

    /// `GetCurrentResourceVersion`: `Range{key: "/registry/leases", limit: 1}`
    /// (no trailing slash, no range_end); only `header.revision` is read and
    /// it must be > 0.
    pub async fn current_rv(&self, resource: &str) -> i64 {
        let resp = self
            .range(pb::RangeRequest {
                key: b(resource.trim_end_matches('/')),
                limit: 1,
                ..Default::default()
            })
            .await
            .expect("GetCurrentResourceVersion's Range succeeds");
        let rev = header_rev(&resp.header);
        assert!(
            rev > 0,
            "the current resource version must be greater than 0"
        );
        rev
    }

    /// `Stats()`/`Count`: `Range{prefix, range_end, count_only}`.
    pub async fn count(&self, prefix: &str) -> i64 {
        let resp = self
            .range(pb::RangeRequest {
                key: b(prefix),
                range_end: prefix_end(prefix.as_bytes()).into(),
                count_only: true,
                ..Default::default()
            })
            .await
            .expect("count succeeds");
        assert!(resp.kvs.is_empty(), "count_only returns no kvs");
        resp.count
    }

    /// A paginated `GetList` of the resource `prefix` (with trailing slash):
    /// `limit` per page (0 = unpaged), at `revision` (0 = latest, then pinned
    /// to the first page's header.revision). Every page is checked:
    /// `count` is exactly the live keys left in `[continue, range_end)` at the
    /// pinned revision, `len(kvs) == min(limit, count)`, and 1.30's `more`
    /// agrees with 1.32+'s `len(kvs) < count`.
    pub async fn list(&self, prefix: &str, limit: i64, revision: i64) -> Result<Listed, Status> {
        let end = Bytes::from(prefix_end(prefix.as_bytes()));
        let mut key = b(prefix);
        let mut pinned = revision;
        let mut kvs: Vec<KeyValue> = Vec::new();
        let mut total: Option<i64> = None;
        let mut pages = 0;
        loop {
            let resp = self
                .range(pb::RangeRequest {
                    key: key.clone(),
                    range_end: end.clone(),
                    limit,
                    revision: pinned,
                    ..Default::default()
                })
                .await?;
            pages += 1;
            let hrev = header_rev(&resp.header);
            if pinned == 0 {
                pinned = hrev;
            }
            assert!(
                hrev >= pinned,
                "list {prefix} page {pages}: header.revision {hrev} is the current revision, \
                 never below the pinned {pinned}"
            );
            let total = *total.get_or_insert(resp.count);
            let remaining = total - kvs.len() as i64;
            assert_eq!(
                resp.count,
                remaining,
                "list {prefix} page {pages} (continue {:?}): count must be the live keys left at \
                 the pinned revision {pinned}",
                text(&key)
            );
            let want = if limit > 0 {
                remaining.min(limit)
            } else {
                remaining
            };
            assert_eq!(
                resp.kvs.len() as i64,
                want,
                "list {prefix} page {pages}: number of kvs"
            );
            let has_more = (resp.kvs.len() as i64) < resp.count;
            assert_eq!(
                resp.more, has_more,
                "list {prefix} page {pages}: 1.30's `more` and 1.32+'s `len(kvs) < count` disagree"
            );
            assert!(
                !(resp.kvs.is_empty() && (resp.more || resp.count > 0)),
                "no results were found, but etcd indicated there were more values remaining"
            );
            for kv in &resp.kvs {
                assert!(
                    kv.key.as_ref() >= key.as_ref() && kv.key.as_ref() < end.as_ref(),
                    "list {prefix}: key {} outside the requested range",
                    text(&kv.key)
                );
                if let Some(last) = kvs.last() {
                    assert!(
                        kv.key > last.key,
                        "list {prefix}: keys not strictly ascending across pages"
                    );
                }
                assert!(
                    kv.mod_revision <= pinned
                        && kv.create_revision <= kv.mod_revision
                        && kv.version >= 1,
                    "list {prefix}: bad revisions at pinned {pinned}: {kv:?}"
                );
                kvs.push(kv.clone());
            }
            if !has_more {
                break;
            }
            let mut next = kvs.last().expect("a page with more has kvs").key.to_vec();
            next.push(0);
            key = next.into();
        }
        Ok(Listed {
            revision: pinned,
            kvs,
            pages,
        })
    }

    /// `Lease.LeaseGrant{ID: 0, TTL}`; returns the ID.
    pub async fn try_grant(&self, ttl: i64) -> Result<i64, Status> {
        let resp = within(
            "LeaseGrant",
            self.lease()
                .lease_grant(pb::LeaseGrantRequest { ttl, id: 0 }),
        )
        .await?
        .into_inner();
        assert!(
            resp.id != 0,
            "lease IDs must be non-zero (0 means no lease)"
        );
        assert_eq!(resp.ttl, ttl, "granted TTL");
        Ok(resp.id)
    }

    /// [`Apiserver::try_grant`], which must succeed.
    pub async fn grant(&self, ttl: i64) -> i64 {
        self.try_grant(ttl).await.expect("LeaseGrant succeeds")
    }

    /// `Lease.LeaseTimeToLive{id, keys}` (not used by the apiserver; tests
    /// use it to look at leases).
    pub async fn time_to_live(&self, id: i64, keys: bool) -> pb::LeaseTimeToLiveResponse {
        within(
            "LeaseTimeToLive",
            self.lease()
                .lease_time_to_live(pb::LeaseTimeToLiveRequest { id, keys }),
        )
        .await
        .expect("LeaseTimeToLive succeeds")
        .into_inner()
    }

    /// The healthz/readyz probe: `Get("<prefix>/health")` with a 2 s timeout;
    /// only the error matters.
    pub async fn health(&self) -> Result<(), Status> {
        let mut kv = self.kv();
        let probe = kv.range(pb::RangeRequest {
            key: b(&format!("{REGISTRY}/health")),
            ..Default::default()
        });
        within_for(Duration::from_secs(2), "health probe", probe)
            .await
            .map(|_| ())
    }
}

/// The event lease manager of one storage (`lease_manager.go`): one lease
/// of [`EVENT_LEASE_TTL`] reused for up to [`LEASE_MAX_OBJECTS`] objects
/// (the time-based part of reuse never triggers in a test this short).
pub struct LeaseManager {
    api: Apiserver,
    ttl: i64,
    state: tokio::sync::Mutex<(i64, usize)>,
    granted: Mutex<Vec<i64>>,
}

impl LeaseManager {
    /// A lease manager granting leases of `ttl` seconds.
    pub fn new(api: Apiserver, ttl: i64) -> LeaseManager {
        LeaseManager {
            api,
            ttl,
            state: tokio::sync::Mutex::new((0, 0)),
            granted: Mutex::new(Vec::new()),
        }
    }

    /// `GetLease`: the lease for one more object.
    pub async fn get_lease(&self) -> i64 {
        self.try_get_lease().await.expect("LeaseGrant succeeds")
    }

    /// [`LeaseManager::get_lease`], passing a failed grant on.
    pub async fn try_get_lease(&self) -> Result<i64, Status> {
        let mut state = self.state.lock().await;
        if state.0 == 0 || state.1 >= LEASE_MAX_OBJECTS {
            let id = self.api.try_grant(self.ttl).await?;
            self.granted.lock().unwrap().push(id);
            *state = (id, 0);
        }
        state.1 += 1;
        Ok(state.0)
    }

    /// Every lease granted so far, in order.
    pub fn granted(&self) -> Vec<i64> {
        self.granted.lock().unwrap().clone()
    }
}

/// One acknowledged write, as the writer saw it: `value == None` is a delete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write {
    pub rev: i64,
    pub key: Bytes,
    pub value: Option<Bytes>,
}

/// Every acknowledged write of a test, shared by its writer tasks.
#[derive(Clone, Default)]
pub struct Ledger(Arc<Mutex<Vec<Write>>>);

impl Ledger {
    /// Records an acknowledged put.
    pub fn put(&self, rev: i64, key: &str, value: &[u8]) {
        self.0.lock().unwrap().push(Write {
            rev,
            key: b(key),
            value: Some(Bytes::copy_from_slice(value)),
        });
    }

    /// Records an acknowledged delete.
    pub fn delete(&self, rev: i64, key: &[u8]) {
        self.0.lock().unwrap().push(Write {
            rev,
            key: Bytes::copy_from_slice(key),
            value: None,
        });
    }

    /// Every write so far, in revision (then key) order.
    pub fn writes(&self) -> Vec<Write> {
        let mut w = self.0.lock().unwrap().clone();
        w.sort_by(|a, b| (a.rev, &a.key).cmp(&(b.rev, &b.key)));
        w
    }

    /// The live keys under `prefix` at `rev` with their values, in key order.
    pub fn state_at(&self, prefix: &str, rev: i64) -> std::collections::BTreeMap<Bytes, Bytes> {
        let mut live = std::collections::BTreeMap::new();
        for w in self.writes().into_iter().filter(|w| w.rev <= rev) {
            if !w.key.starts_with(prefix.as_bytes()) {
                continue;
            }
            match w.value {
                Some(v) => live.insert(w.key, v),
                None => live.remove(&w.key),
            };
        }
        live
    }
}

/// A progress notification as the watch cache saw it.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    /// Its header.revision.
    pub revision: i64,
    /// How many events had been delivered when it arrived.
    pub delivered: usize,
    /// `watch_id == -1`: the answer to a progress request.
    pub requested: bool,
}

/// Everything a watch delivered after `created`.
#[derive(Default)]
pub struct Seen {
    /// Every event, in arrival order.
    pub events: Vec<Event>,
    /// Every progress notification.
    pub progress: Vec<Progress>,
    /// The cancel response, if the watch was canceled.
    pub canceled: Option<pb::WatchResponse>,
    /// Contract violations noticed while reading.
    pub violations: Vec<String>,
    /// The watch cache's resource version: the last event's mod_revision or
    /// progress revision.
    pub rv: i64,
    last: Option<(i64, Bytes)>,
}

impl Seen {
    fn observe(&mut self, id: i64, want_prev_kv: bool, resp: pb::WatchResponse) {
        let hrev = resp.header.as_ref().map_or(0, |h| h.revision);
        if resp.watch_id != id && resp.watch_id != -1 {
            self.violations
                .push(format!("response for unknown watch_id {}", resp.watch_id));
        }
        if resp.canceled {
            if self.canceled.is_some() {
                self.violations.push("canceled twice".into());
            }
            self.canceled = Some(resp);
            return;
        }
        if resp.created {
            self.violations.push(format!("a second created: {resp:?}"));
            return;
        }
        if resp.fragment {
            self.violations
                .push("fragment set on a watch that did not ask for fragments".into());
        }
        if resp.events.is_empty() {
            let requested = resp.watch_id == -1;
            if resp.compact_revision != 0 || hrev <= 0 {
                self.violations
                    .push(format!("bad progress response {resp:?}"));
            }
            if hrev < self.rv {
                self.violations.push(format!(
                    "progress revision {hrev} below the revision {} already delivered",
                    self.rv
                ));
            }
            self.progress.push(Progress {
                revision: hrev,
                delivered: self.events.len(),
                requested,
            });
            self.rv = self.rv.max(hrev);
            return;
        }
        if resp.watch_id == -1 {
            self.violations
                .push("events sent with watch_id -1".to_string());
        }
        for e in resp.events {
            let Some(kv) = e.kv.as_ref() else {
                self.violations.push("event without kv".into());
                continue;
            };
            let at = (kv.mod_revision, kv.key.clone());
            if let Some(last) = &self.last {
                if at <= *last {
                    self.violations.push(format!(
                        "event {} @{} not after {} @{} (out of order or duplicate)",
                        text(&kv.key),
                        kv.mod_revision,
                        text(&last.1),
                        last.0
                    ));
                }
            }
            if kv.mod_revision > hrev {
                self.violations.push(format!(
                    "event @{} in a response whose header.revision is {hrev}",
                    kv.mod_revision
                ));
            }
            let put = e.r#type == EventType::Put as i32;
            let create = put && kv.create_revision == kv.mod_revision;
            if put && (kv.version < 1 || kv.create_revision > kv.mod_revision) {
                self.violations.push(format!("bad PUT kv {kv:?}"));
            }
            if !put && (!kv.value.is_empty() || kv.mod_revision <= 0) {
                self.violations.push(format!("bad DELETE kv {kv:?}"));
            }
            match &e.prev_kv {
                None if want_prev_kv && !create => self.violations.push(format!(
                    "etcd event received with PrevKv=nil: {} {} @{}",
                    if put { "PUT" } else { "DELETE" },
                    text(&kv.key),
                    kv.mod_revision
                )),
                Some(p) if p.key != kv.key || p.mod_revision >= kv.mod_revision => self
                    .violations
                    .push(format!("prev_kv {p:?} does not precede {kv:?}")),
                Some(_) if create => self
                    .violations
                    .push(format!("a create carries prev_kv: {kv:?}")),
                _ => {}
            }
            self.rv = self.rv.max(kv.mod_revision);
            self.last = Some(at);
            self.events.push(e);
        }
    }
}

/// A watch on its own gRPC stream, read by a background task the way
/// clientv3 + the watch cache read it.
pub struct Watcher {
    requests: mpsc::Sender<pb::WatchRequest>,
    /// The ID from `created`.
    pub watch_id: i64,
    /// header.revision of `created`.
    pub created_revision: i64,
    start_revision: i64,
    seen: Arc<Mutex<Seen>>,
    rv: tokio::sync::watch::Receiver<i64>,
    reader: Option<tokio::task::JoinHandle<Status>>,
}

/// The watch cache's request: prefix, `prev_kv`, `progress_notify`.
pub fn cache_watch(prefix: &str, start_revision: i64) -> pb::WatchCreateRequest {
    pb::WatchCreateRequest {
        key: b(prefix),
        range_end: prefix_end(prefix.as_bytes()).into(),
        start_revision,
        progress_notify: true,
        prev_kv: true,
        ..Default::default()
    }
}

/// A direct storage watch (events): prefix, `prev_kv`, no progress_notify.
pub fn direct_watch(prefix: &str, start_revision: i64) -> pb::WatchCreateRequest {
    pb::WatchCreateRequest {
        progress_notify: false,
        ..cache_watch(prefix, start_revision)
    }
}

impl Watcher {
    /// Opens a stream on `channel`, sends `req`, and waits for `created`.
    pub async fn open(channel: Channel, req: pb::WatchCreateRequest) -> Watcher {
        let start_revision = req.start_revision;
        let want_prev_kv = req.prev_kv;
        let (requests, rx) = mpsc::channel(64);
        requests
            .send(pb::WatchRequest {
                request_union: Some(RequestUnion::CreateRequest(req)),
            })
            .await
            .expect("request channel open");
        let mut stream = within(
            "open watch stream",
            WatchClient::new(channel)
                .max_decoding_message_size(i32::MAX as usize)
                .watch(ReceiverStream::new(rx)),
        )
        .await
        .expect("watch stream opens")
        .into_inner();
        let created = within("watch created", stream.message())
            .await
            .expect("watch stream did not fail")
            .expect("watch stream did not end");
        assert!(
            created.created && created.events.is_empty() && created.watch_id >= 0,
            "the first response must be created with watch_id >= 0: {created:?}"
        );
        assert!(
            !created.canceled,
            "a create must not fail as a whole (watch_id -1, canceled): {created:?}"
        );
        let watch_id = created.watch_id;
        let created_revision = header_rev(&created.header);
        // The cache starts at the list's RV (start_revision - 1).
        let initial_rv = (start_revision - 1).max(0);
        let seen = Arc::new(Mutex::new(Seen {
            rv: initial_rv,
            ..Seen::default()
        }));
        let (rv_tx, rv) = tokio::sync::watch::channel(initial_rv);
        let reader = {
            let seen = seen.clone();
            tokio::spawn(async move {
                loop {
                    match stream.message().await {
                        Ok(Some(resp)) => {
                            let mut s = seen.lock().unwrap();
                            s.observe(watch_id, want_prev_kv, resp);
                            rv_tx.send_replace(s.rv);
                        }
                        Ok(None) => return Status::ok("stream ended"),
                        Err(status) => return status,
                    }
                }
            })
        };
        Watcher {
            requests,
            watch_id,
            created_revision,
            start_revision,
            seen,
            rv,
            reader: Some(reader),
        }
    }

    /// Sends `progress_request` on this watch's stream.
    pub async fn request_progress(&self) {
        within(
            "send progress request",
            self.requests.send(pb::WatchRequest {
                request_union: Some(RequestUnion::ProgressRequest(pb::WatchProgressRequest {})),
            }),
        )
        .await
        .expect("watch stream still open");
    }

    /// The watch cache's resource version now.
    pub fn rv(&self) -> i64 {
        *self.rv.borrow()
    }

    /// Runs `f` on what the watch delivered so far.
    pub fn seen<T>(&self, f: impl FnOnce(&Seen) -> T) -> T {
        f(&self.seen.lock().unwrap())
    }

    /// The consistent-read wait loop (`waitUntilFreshAndBlock` with the
    /// progress requester): until the cache's RV reaches `target`, request
    /// progress every 100 ms; fails after [`BLOCK_TIMEOUT`] (where 1.31+
    /// would fall back to reading etcd). Returns how long it took.
    pub async fn wait_until_fresh(&self, target: i64) -> Duration {
        let started = Instant::now();
        let mut rv = self.rv.clone();
        loop {
            if *rv.borrow_and_update() >= target {
                return started.elapsed();
            }
            assert!(
                started.elapsed() < BLOCK_TIMEOUT,
                "watch cache stuck at RV {} below {target} after {BLOCK_TIMEOUT:?} of progress \
                 requests (the apiserver would time out the consistent read)",
                self.rv()
            );
            self.request_progress().await;
            tokio::select! {
                changed = rv.changed() => {
                    if changed.is_err() {
                        panic!("watch stream ended while waiting for RV {target}");
                    }
                }
                _ = tokio::time::sleep(PROGRESS_REQUEST_PERIOD) => {}
            }
        }
    }

    /// Waits (bounded) until `pred` holds for what was delivered.
    pub async fn wait_for(&self, what: &str, limit: Duration, pred: impl Fn(&Seen) -> bool) {
        let mut rv = self.rv.clone();
        let wait = async {
            loop {
                if self.seen(&pred) {
                    return;
                }
                tokio::select! {
                    _ = rv.changed() => {}
                    _ = tokio::time::sleep(Duration::from_millis(20)) => {}
                }
            }
        };
        within_for(limit, what, wait).await;
    }

    /// Waits (bounded) until the watch is canceled and returns the cancel.
    pub async fn canceled(&self) -> pb::WatchResponse {
        self.wait_for("watch canceled", Duration::from_secs(10), |s| {
            s.canceled.is_some()
        })
        .await;
        self.seen(|s| s.canceled.clone().expect("canceled"))
    }

    /// Waits (bounded) until the stream ends; returns its final status.
    pub async fn ended(&mut self, limit: Duration) -> Status {
        let reader = self.reader.take().expect("stream not yet awaited");
        within_for(limit, "watch stream ends", reader)
            .await
            .expect("watch reader task")
    }

    /// Fails on any contract violation seen so far.
    #[track_caller]
    pub fn assert_clean(&self) {
        self.seen(|s| {
            assert!(
                s.violations.is_empty(),
                "watch contract violations:\n{}",
                s.violations.join("\n")
            )
        });
    }

    /// Checks the delivered events against `writes` (every acknowledged write
    /// of the test, of any key): exactly the writes in the watched range at
    /// or after the start revision, in order, with the right values, and each
    /// non-create PUT's/DELETE's prev_kv equal to the key's previous value.
    /// Also checks that no progress notification ever claimed a revision
    /// whose events had not all been delivered before it.
    #[track_caller]
    pub fn assert_matches(&self, prefix: &str, writes: &[Write]) {
        self.assert_clean();
        let mut last: HashMap<Bytes, Bytes> = HashMap::new();
        let mut expected = Vec::new();
        for w in writes {
            if !w.key.starts_with(prefix.as_bytes()) {
                continue;
            }
            let prev = match &w.value {
                Some(v) => last.insert(w.key.clone(), v.clone()),
                None => last.remove(&w.key),
            };
            if w.rev >= self.start_revision {
                expected.push((w.clone(), prev));
            }
        }
        self.seen(|s| {
            let got: Vec<String> = s.events.iter().map(describe).collect();
            let want: Vec<String> = expected.iter().map(|(w, _)| describe_write(w)).collect();
            if got != want {
                let first = got
                    .iter()
                    .zip(&want)
                    .position(|(g, w)| g != w)
                    .unwrap_or(got.len().min(want.len()));
                panic!(
                    "watch delivered {} events, {} writes expected; first difference at #{first}: \
                     got {:?}, want {:?}",
                    got.len(),
                    want.len(),
                    got.get(first),
                    want.get(first)
                );
            }
            for (e, (w, prev)) in s.events.iter().zip(&expected) {
                let kv = e.kv.as_ref().expect("kv");
                let create =
                    e.r#type == EventType::Put as i32 && kv.create_revision == kv.mod_revision;
                if create {
                    assert!(
                        prev.is_none(),
                        "{}: a create over a live key",
                        describe_write(w)
                    );
                } else if let Some(p) = &e.prev_kv {
                    assert_eq!(
                        Some(&p.value),
                        prev.as_ref(),
                        "{}: prev_kv value",
                        describe_write(w)
                    );
                }
            }
            for p in &s.progress {
                let due = expected.iter().filter(|(w, _)| w.rev <= p.revision).count();
                assert_eq!(
                    p.delivered,
                    due,
                    "progress @{} ({}) arrived after {} events, but {due} writes are at or \
                     below it: a progress notification overtook events",
                    p.revision,
                    if p.requested { "requested" } else { "periodic" },
                    p.delivered
                );
            }
        });
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        if let Some(r) = self.reader.take() {
            r.abort();
        }
    }
}

fn describe(e: &Event) -> String {
    let kv = e.kv.as_ref().expect("kv");
    if e.r#type == EventType::Put as i32 {
        format!(
            "PUT {} @{} = {}",
            text(&kv.key),
            kv.mod_revision,
            text(&kv.value)
        )
    } else {
        format!("DELETE {} @{}", text(&kv.key), kv.mod_revision)
    }
}

fn describe_write(w: &Write) -> String {
    match &w.value {
        Some(v) => format!("PUT {} @{} = {}", text(&w.key), w.rev, text(v)),
        None => format!("DELETE {} @{}", text(&w.key), w.rev),
    }
}

/// The compactor of one apiserver (`compact.go`): its local view of
/// `compact_rev_key`'s version and the revision seen on its previous tick.
#[derive(Debug, Clone, Copy, Default)]
pub struct Compactor {
    /// Local `compactTime`: the version of `compact_rev_key` it expects.
    pub time: i64,
    /// The header.revision of the previous tick (0 before the first).
    pub rev: i64,
}

/// A `Compact` call's header revision, or its error code and message.
pub type CompactResult = Result<i64, (tonic::Code, String)>;

/// What one compactor tick did.
#[derive(Debug, Clone, PartialEq)]
pub enum Tick {
    /// The CAS won; `compacted` is `Some(revision)` when it then compacted
    /// (with the Compact call's result).
    Won {
        compacted: Option<(i64, CompactResult)>,
    },
    /// The CAS lost; the compactor adopted this version and value.
    Lost { version: i64, value: Bytes },
}

impl Compactor {
    /// One tick: `Txn{VERSION(compact_rev_key) == t → Put(compact_rev_key,
    /// itoa(rev)), failure: Range(compact_rev_key)}`, then, when the CAS won
    /// and `rev != 0`, `Compact{revision: rev}`. The loser path reads
    /// `Responses[0].GetResponseRange().Kvs[0]` unchecked, exactly as every
    /// release from 1.30 to 1.35 does (an empty kvs would panic the apiserver).
    pub async fn tick(&mut self, api: &Apiserver) -> Tick {
        let key = COMPACT_REV_KEY.as_bytes();
        let resp = api
            .txn(pb::TxnRequest {
                compare: vec![version_equals(key, self.time)],
                success: vec![put_op(key, self.rev.to_string().as_bytes(), 0)],
                failure: vec![get_op(key)],
            })
            .await
            .expect("compactor CAS succeeds as an RPC");
        let cur_rev = header_rev(&resp.header);
        if !resp.succeeded {
            let range = match resp.responses.first().and_then(|r| r.response.as_ref()) {
                Some(OpResponse::ResponseRange(r)) => r,
                other => panic!("compactor CAS failure is not a ResponseRange: {other:?}"),
            };
            let kv = range.kvs.first().unwrap_or_else(|| {
                panic!(
                    "compactor CAS failed but Range(compact_rev_key) returned no kvs: \
                     kube-apiserver indexes Kvs[0] unchecked and panics"
                )
            });
            self.time = kv.version;
            self.rev = cur_rev;
            return Tick::Lost {
                version: kv.version,
                value: kv.value.clone(),
            };
        }
        self.time += 1;
        let previous = std::mem::replace(&mut self.rev, cur_rev);
        if previous == 0 {
            return Tick::Won { compacted: None };
        }
        let result = api
            .compact(previous)
            .await
            .map_err(|s| (s.code(), s.message().to_string()));
        Tick::Won {
            compacted: Some((previous, result)),
        }
    }
}

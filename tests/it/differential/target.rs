//! One server under differential test: its raw generated clients, open
//! streams and the ids it chose for leases. Executes an `Op` and returns a
//! normalized `Outcome` that can be compared with another server's.

use std::fmt;
use std::time::Duration;

use ephd::proto::etcdserverpb::{
    compare, kv_client::KvClient, lease_client::LeaseClient, request_op, watch_client::WatchClient,
    watch_request, LeaseGrantResponse, LeaseKeepAliveResponse, LeaseLeasesRequest,
    LeaseLeasesResponse, LeaseRevokeRequest, LeaseRevokeResponse, LeaseTimeToLiveResponse,
    PutResponse, RangeResponse, TxnRequest, TxnResponse, WatchCreateRequest, WatchProgressRequest,
    WatchRequest, WatchResponse,
};
use ephd::proto::etcdserverpb::{CompactionResponse, DeleteRangeResponse};
use tonic::transport::Channel;

use super::normalize::Normalizer;
use super::ops::{Op, ISSUED_BASE, UNKNOWN_LEASE, WATCH_STREAMS};
use super::streams::{open_keep_alive, open_watch, KeepAliveStream, WatchStream};
use crate::harness::connect_channel;

/// Bound for one RPC or one awaited stream response.
pub const OP_TIMEOUT: Duration = Duration::from_secs(5);
/// The bound once a target has let one wait time out: a candidate that
/// never answers some request kind must not stretch a run to hours.
pub const IMPATIENT_TIMEOUT: Duration = Duration::from_millis(1000);

/// A failed call: gRPC status code and message (or a harness-side reason
/// such as a timeout). Compared literally, so error texts must match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub code: String,
    pub message: String,
}

impl From<tonic::Status> for Failure {
    fn from(s: tonic::Status) -> Failure {
        Failure {
            code: format!("{:?}", s.code()),
            message: s.message().to_string(),
        }
    }
}

impl Failure {
    fn harness(what: &str) -> Failure {
        Failure {
            code: "HARNESS".to_string(),
            message: what.to_string(),
        }
    }

    /// Timeouts and closed streams, as opposed to server answers.
    pub fn is_harness(&self) -> bool {
        self.code == "HARNESS"
    }
}

/// A response or the failure that replaced it.
pub type Res<T> = Result<T, Failure>;

/// A normalized result of one op.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Put(Res<PutResponse>),
    Range(Res<RangeResponse>),
    Delete(Res<DeleteRangeResponse>),
    Txn(Res<TxnResponse>),
    Compact(Res<CompactionResponse>),
    LeaseGrant(Res<LeaseGrantResponse>),
    LeaseGrantRevoke(Res<LeaseGrantResponse>, Option<Res<LeaseRevokeResponse>>),
    LeaseRevoke(Res<LeaseRevokeResponse>),
    LeaseTimeToLive(Res<LeaseTimeToLiveResponse>),
    LeaseLeases(Res<LeaseLeasesResponse>),
    LeaseKeepAlive(Res<LeaseKeepAliveResponse>),
    WatchCreated(Res<WatchResponse>),
    WatchProgress(Res<WatchResponse>),
}

impl Outcome {
    /// Header revision of a successful response (the store revision).
    pub fn revision(&self) -> Option<i64> {
        let h = match self {
            Outcome::Put(Ok(r)) => &r.header,
            Outcome::Range(Ok(r)) => &r.header,
            Outcome::Delete(Ok(r)) => &r.header,
            Outcome::Txn(Ok(r)) => &r.header,
            Outcome::Compact(Ok(r)) => &r.header,
            Outcome::LeaseRevoke(Ok(r)) => &r.header,
            Outcome::LeaseGrantRevoke(_, Some(Ok(r))) => &r.header,
            Outcome::WatchCreated(Ok(r)) | Outcome::WatchProgress(Ok(r)) => &r.header,
            _ => return None,
        };
        h.as_ref().map(|h| h.revision)
    }

    /// The failure, if the call (or either call of a pair) failed.
    pub fn failure(&self) -> Option<&Failure> {
        match self {
            Outcome::Put(Err(f))
            | Outcome::Range(Err(f))
            | Outcome::Delete(Err(f))
            | Outcome::Txn(Err(f))
            | Outcome::Compact(Err(f))
            | Outcome::LeaseGrant(Err(f))
            | Outcome::LeaseGrantRevoke(Err(f), _)
            | Outcome::LeaseGrantRevoke(_, Some(Err(f)))
            | Outcome::LeaseRevoke(Err(f))
            | Outcome::LeaseTimeToLive(Err(f))
            | Outcome::LeaseLeases(Err(f))
            | Outcome::LeaseKeepAlive(Err(f))
            | Outcome::WatchCreated(Err(f))
            | Outcome::WatchProgress(Err(f)) => Some(f),
            _ => None,
        }
    }

    /// A failure that means the reference did not really answer: a harness
    /// timeout / closed stream, or `Unavailable`/`Unknown` (stock etcd
    /// crashed: etcd 3.4 panics on some requests, which the generator must
    /// then avoid).
    pub fn reference_failure(&self) -> Option<&Failure> {
        self.failure()
            .filter(|f| f.is_harness() || f.code == "Unavailable" || f.code == "Unknown")
    }
}

/// A watch registered on a target: where it lives and which id it got.
#[derive(Debug, Clone)]
pub struct WatchHandle {
    /// Index into `Target::watch_streams`.
    pub stream: usize,
    /// The id the server assigned (None if creation failed).
    pub id: Option<i64>,
}

/// What a target delivered for one watch, normalized for comparison.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct WatchTranscript {
    pub events: Vec<ephd::proto::mvccpb::Event>,
    /// (compact_revision, cancel_reason) of a server-side cancel.
    pub canceled: Option<(i64, String)>,
}

/// One server under test with its clients, streams and lease ids.
pub struct Target {
    kv: KvClient<Channel>,
    lease: LeaseClient<Channel>,
    /// Ordinary streams plus, last, the history stream.
    pub watch_streams: Vec<WatchStream>,
    /// How many created / progress responses per stream were matched.
    created_seen: Vec<usize>,
    progress_seen: Vec<usize>,
    keep_alive: KeepAliveStream,
    keep_alive_seen: usize,
    /// Server-chosen lease ids in grant order (UNKNOWN_LEASE if a grant
    /// with ID 0 failed, to keep ordinals aligned with the reference).
    pub issued: Vec<i64>,
    /// Current bound for waits on this target (see `IMPATIENT_TIMEOUT`).
    pub patience: Duration,
}

/// Index of the history stream among `watch_streams`.
pub const HISTORY_STREAM: usize = WATCH_STREAMS;

impl Target {
    /// Connects and opens every stream up front, so ops only send.
    pub async fn connect(endpoint: &str) -> Target {
        let channel = connect_channel(endpoint).await;
        let watch_streams = (0..=WATCH_STREAMS)
            .map(|_| open_watch(WatchClient::new(channel.clone())))
            .collect();
        Target {
            kv: KvClient::new(channel.clone()),
            lease: LeaseClient::new(channel.clone()),
            watch_streams,
            created_seen: vec![0; WATCH_STREAMS + 1],
            progress_seen: vec![0; WATCH_STREAMS + 1],
            keep_alive: open_keep_alive(LeaseClient::new(channel)),
            keep_alive_seen: 0,
            issued: Vec::new(),
            patience: OP_TIMEOUT,
        }
    }

    fn norm(&self) -> Normalizer<'_> {
        Normalizer {
            issued: &self.issued,
        }
    }

    /// Replaces issued-lease markers by this target's own ids.
    fn resolve(&self, id: i64) -> i64 {
        if id >= ISSUED_BASE {
            let n = (id - ISSUED_BASE) as usize;
            self.issued.get(n).copied().unwrap_or(UNKNOWN_LEASE)
        } else {
            id
        }
    }

    fn resolve_txn(&self, txn: &mut TxnRequest) {
        for c in &mut txn.compare {
            if let Some(compare::TargetUnion::Lease(l)) = &mut c.target_union {
                *l = self.resolve(*l);
            }
        }
        for op in txn.success.iter_mut().chain(txn.failure.iter_mut()) {
            match &mut op.request {
                Some(request_op::Request::RequestPut(p)) => p.lease = self.resolve(p.lease),
                Some(request_op::Request::RequestTxn(t)) => self.resolve_txn(t),
                _ => {}
            }
        }
    }

    /// Executes `op` (with markers resolved) and normalizes the result.
    pub async fn exec(&mut self, op: &Op) -> Outcome {
        let outcome = self.exec_inner(op).await;
        if outcome.failure().is_some_and(Failure::is_harness) {
            self.patience = IMPATIENT_TIMEOUT;
        }
        outcome
    }

    async fn exec_inner(&mut self, op: &Op) -> Outcome {
        let t = self.patience;
        match op.clone() {
            Op::Put(mut req) => {
                req.lease = self.resolve(req.lease);
                let r = rpc(t, self.kv.put(req)).await;
                Outcome::Put(r.map(|mut r| {
                    self.norm().put(&mut r);
                    r
                }))
            }
            Op::Range(req) => {
                let r = rpc(t, self.kv.range(req.clone())).await;
                Outcome::Range(r.map(|mut r| {
                    self.norm().range(&req, &mut r);
                    r
                }))
            }
            Op::Delete(req) => {
                let r = rpc(t, self.kv.delete_range(req)).await;
                Outcome::Delete(r.map(|mut r| {
                    self.norm().delete(&mut r);
                    r
                }))
            }
            Op::Txn(req) => {
                let mut resolved = req.clone();
                self.resolve_txn(&mut resolved);
                let r = rpc(t, self.kv.txn(resolved)).await;
                Outcome::Txn(r.map(|mut r| {
                    self.norm().txn(&req, &mut r);
                    r
                }))
            }
            Op::Compact(req) => {
                let r = rpc(t, self.kv.compact(req)).await;
                Outcome::Compact(r.map(|mut r| {
                    self.norm().header(&mut r.header);
                    r
                }))
            }
            Op::LeaseGrant(req) => Outcome::LeaseGrant(self.grant(req).await),
            Op::LeaseGrantRevoke(req) => {
                let granted = self.grant(req).await;
                let revoked = match &granted {
                    Ok(g) if g.error.is_empty() => {
                        let id = self.resolve(g.id);
                        let r = rpc(t, self.lease.lease_revoke(LeaseRevokeRequest { id })).await;
                        Some(r.map(|mut r| {
                            self.norm().lease_revoke(&mut r);
                            r
                        }))
                    }
                    _ => None,
                };
                Outcome::LeaseGrantRevoke(granted, revoked)
            }
            Op::LeaseRevoke(mut req) => {
                req.id = self.resolve(req.id);
                let r = rpc(t, self.lease.lease_revoke(req)).await;
                Outcome::LeaseRevoke(r.map(|mut r| {
                    self.norm().lease_revoke(&mut r);
                    r
                }))
            }
            Op::LeaseTimeToLive(mut req) => {
                req.id = self.resolve(req.id);
                let r = rpc(t, self.lease.lease_time_to_live(req)).await;
                Outcome::LeaseTimeToLive(r.map(|mut r| {
                    self.norm().lease_ttl(&mut r);
                    r
                }))
            }
            Op::LeaseLeases => {
                let r = rpc(t, self.lease.lease_leases(LeaseLeasesRequest {})).await;
                Outcome::LeaseLeases(r.map(|mut r| {
                    self.norm().lease_leases(&mut r);
                    r
                }))
            }
            Op::LeaseKeepAlive(mut req) => {
                req.id = self.resolve(req.id);
                Outcome::LeaseKeepAlive(self.keep_alive(req).await)
            }
            Op::WatchCreate { stream, req } => {
                Outcome::WatchCreated(self.create_watch(stream, req).await)
            }
            Op::WatchProgress { stream } => Outcome::WatchProgress(self.progress(stream).await),
        }
    }

    /// Grants a lease; an ID-0 grant records the id the server chose.
    /// The returned response has the id normalized to its marker.
    async fn grant(
        &mut self,
        req: ephd::proto::etcdserverpb::LeaseGrantRequest,
    ) -> Res<LeaseGrantResponse> {
        let server_chosen = req.id == 0;
        let r = rpc(self.patience, self.lease.lease_grant(req)).await;
        if server_chosen {
            match &r {
                Ok(g) if g.error.is_empty() && g.id != 0 => self.issued.push(g.id),
                _ => self.issued.push(UNKNOWN_LEASE),
            }
        }
        r.map(|mut r| {
            self.norm().lease_grant(&mut r);
            r
        })
    }

    async fn keep_alive(
        &mut self,
        req: ephd::proto::etcdserverpb::LeaseKeepAliveRequest,
    ) -> Res<LeaseKeepAliveResponse> {
        self.keep_alive.send(req);
        let want = self.keep_alive_seen;
        let got = self
            .keep_alive
            .wait_for(self.patience, |rx| rx.responses.get(want).cloned())
            .await;
        let Some(mut resp) = got else {
            let closed = self.keep_alive.inspect(|rx| rx.closed.clone());
            return Err(Failure::harness(&format!(
                "no keep-alive response within {:?} ({closed:?})",
                self.patience
            )));
        };
        self.keep_alive_seen += 1;
        self.norm().keep_alive(&mut resp);
        Ok(resp)
    }

    /// Sends a create request and waits for its `created` response.
    pub async fn create_watch(
        &mut self,
        stream: usize,
        req: WatchCreateRequest,
    ) -> Res<WatchResponse> {
        self.watch_streams[stream].send(WatchRequest {
            request_union: Some(watch_request::RequestUnion::CreateRequest(req)),
        });
        let nth = self.created_seen[stream];
        let got = self.watch_streams[stream]
            .wait_for(self.patience, |rx| {
                rx.responses.iter().filter(|r| r.created).nth(nth).cloned()
            })
            .await;
        let Some(mut resp) = got else {
            return Err(Failure::harness("no created response"));
        };
        self.created_seen[stream] += 1;
        self.norm().watch_control(&mut resp);
        Ok(resp)
    }

    /// Sends a progress request and waits for the next progress response
    /// (no events, neither created nor canceled).
    async fn progress(&mut self, stream: usize) -> Res<WatchResponse> {
        self.watch_streams[stream].send(WatchRequest {
            request_union: Some(watch_request::RequestUnion::ProgressRequest(
                WatchProgressRequest {},
            )),
        });
        let nth = self.progress_seen[stream];
        let got = self.watch_streams[stream]
            .wait_for(self.patience, |rx| {
                rx.responses
                    .iter()
                    .filter(|r| is_progress(r))
                    .nth(nth)
                    .cloned()
            })
            .await;
        let Some(mut resp) = got else {
            return Err(Failure::harness("no progress response"));
        };
        self.progress_seen[stream] += 1;
        self.norm().watch_control(&mut resp);
        Ok(resp)
    }

    /// Cancels a watch and waits for the server's cancel confirmation.
    pub async fn cancel_watch(&mut self, w: &WatchHandle) -> Res<WatchResponse> {
        let Some(id) = w.id else {
            return Err(Failure::harness("watch was never created"));
        };
        self.watch_streams[w.stream].send(WatchRequest {
            request_union: Some(watch_request::RequestUnion::CancelRequest(
                ephd::proto::etcdserverpb::WatchCancelRequest { watch_id: id },
            )),
        });
        let got = self.watch_streams[w.stream]
            .wait_for(self.patience, |rx| {
                rx.responses
                    .iter()
                    .find(|r| r.canceled && r.watch_id == id && !r.created)
                    .cloned()
            })
            .await;
        let Some(mut resp) = got else {
            return Err(Failure::harness("no cancel response"));
        };
        self.norm().watch_control(&mut resp);
        Ok(resp)
    }

    /// Events delivered so far for `w` and whether the server canceled it.
    pub fn transcript(&self, w: &WatchHandle) -> WatchTranscript {
        let Some(id) = w.id else {
            return WatchTranscript::default();
        };
        let norm = self.norm();
        self.watch_streams[w.stream].inspect(|rx| {
            let mut t = WatchTranscript::default();
            for r in rx
                .responses
                .iter()
                .filter(|r| r.watch_id == id && !r.created)
            {
                for e in &r.events {
                    let mut e = e.clone();
                    norm.event(&mut e);
                    t.events.push(e);
                }
                if r.canceled && t.canceled.is_none() {
                    t.canceled = Some((r.compact_revision, r.cancel_reason.clone()));
                }
            }
            t
        })
    }

    /// Waits until `w` delivered at least `events` events or was canceled.
    pub async fn wait_watch(&self, w: &WatchHandle, events: usize, timeout: Duration) -> bool {
        let Some(id) = w.id else { return true };
        self.watch_streams[w.stream]
            .wait_for(timeout, |rx| {
                let mine = rx
                    .responses
                    .iter()
                    .filter(|r| r.watch_id == id && !r.created);
                let mut n = 0;
                for r in mine {
                    if r.canceled {
                        return Some(());
                    }
                    n += r.events.len();
                }
                (n >= events).then_some(())
            })
            .await
            .is_some()
    }
}

impl Target {
    /// Waits until `w` delivered an event at revision `rev` or later.
    pub async fn wait_revision(&self, w: &WatchHandle, rev: i64, timeout: Duration) -> bool {
        let Some(id) = w.id else { return false };
        self.watch_streams[w.stream]
            .wait_for(timeout, |rx| {
                rx.responses
                    .iter()
                    .filter(|r| r.watch_id == id)
                    .flat_map(|r| r.events.iter())
                    .filter_map(|e| e.kv.as_ref())
                    .any(|kv| kv.mod_revision >= rev)
                    .then_some(())
            })
            .await
            .is_some()
    }
}

/// A progress response carries no events and is neither created nor canceled.
fn is_progress(r: &WatchResponse) -> bool {
    r.events.is_empty() && !r.created && !r.canceled
}

/// One unary call, bounded by `timeout`.
async fn rpc<T>(
    timeout: Duration,
    call: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Res<T> {
    match tokio::time::timeout(timeout, call).await {
        Ok(Ok(resp)) => Ok(resp.into_inner()),
        Ok(Err(status)) => Err(status.into()),
        Err(_) => Err(Failure::harness(&format!("no answer within {timeout:?}"))),
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

//! What runs on the cluster while the network misbehaves, shaped after
//! what kube-apiserver sends an events and leases store:
//! * Event objects: puts of new keys, each with the events lease;
//! * node Lease heartbeats: kube-apiserver's GuaranteedUpdate, a txn that
//!   puts when the key's mod revision is the one last read and reads it
//!   otherwise;
//! * a watch on the whole prefix carrying `hasleader` (as kube-apiserver's
//!   do), which resumes on the next member from the revision after the
//!   last one it saw whenever its stream ends;
//! * two leases with keys attached: one kept alive all along, one whose
//!   keep-alives stop when the fault starts.
//!
//! Every client moves to the next member when a request fails or takes
//! longer than [`OP_TIMEOUT`]. What was acknowledged, and when, is recorded
//! for the checks of `scenarios.rs`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ephd::proto::etcdserverpb::{
    compare, kv_client::KvClient, lease_client::LeaseClient, request_op, response_op,
    watch_client::WatchClient, watch_request::RequestUnion, Compare, LeaseGrantRequest,
    LeaseKeepAliveRequest, PutRequest, RangeRequest, RequestOp, TxnRequest, WatchCreateRequest,
    WatchRequest,
};
use ephd::proto::mvccpb::event::EventType;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, Endpoint};

/// A request that has not answered within this is of unknown outcome, and
/// its client moves on.
pub const OP_TIMEOUT: Duration = Duration::from_secs(1);

/// The prefix everything but the linearizability registers lives under.
pub const PREFIX: &str = "/registry/";

/// Node Lease objects heartbeating.
const NODES: usize = 8;

/// The TTL of the two watched leases: short enough that one expires
/// within a scenario, and four times the keep-alive interval.
pub const LEASE_TTL: i64 = 4;
const KEEP_ALIVE_EVERY: Duration = Duration::from_millis(500);

/// The keys of the two leases' attached keys.
pub const KEPT_KEY: &str = "/registry/held/kept";
pub const DROPPED_KEY: &str = "/registry/held/dropped";

/// The last write, and what it writes.
const END_KEY: &str = "/registry/end";
const END_VALUE: &str = "end";

/// A lazily connected channel to `endpoint`.
pub fn channel(endpoint: &str) -> Channel {
    Endpoint::from_shared(endpoint.to_string())
        .expect("endpoint URL")
        .connect_timeout(OP_TIMEOUT)
        .timeout(OP_TIMEOUT)
        .connect_lazy()
}

/// One acknowledged write: its key, value and revision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Acked {
    pub key: String,
    pub value: String,
    pub revision: i64,
    /// When the answer came (the shared clock).
    pub at: Duration,
}

/// One event a watch delivered, and when (the shared clock).
#[derive(Clone, Debug)]
pub struct Seen {
    pub revision: i64,
    pub key: String,
    pub value: String,
    pub delete: bool,
    pub at: Duration,
}

/// Everything the workload recorded.
#[derive(Clone, Default)]
pub struct Record {
    /// Acknowledged writes.
    pub acked: Vec<Acked>,
    /// Every value a write carried (acknowledged or not).
    pub attempted: std::collections::HashSet<String>,
    /// What the watch delivered, in order.
    pub seen: Vec<Seen>,
    /// Times the watch resumed on another member, and why.
    pub resumes: Vec<String>,
    /// When each acknowledged renewal of a lease was sent (the grant
    /// first): the lease runs at least its TTL after each.
    pub renewed: BTreeMap<String, Vec<Duration>>,
}

/// The workload's shared state.
pub struct Workload {
    endpoints: Vec<String>,
    start: Instant,
    pub record: Mutex<Record>,
    stop: AtomicBool,
    /// Set when the fault starts: the dropped lease's keep-alives stop.
    pub drop_lease: AtomicBool,
    /// The watch's revision to start from.
    from: i64,
}

impl Workload {
    /// Grants the two leases and the events lease through the first
    /// member, attaches their keys, and notes the revision the watch
    /// starts after.
    pub async fn prepare(endpoints: Vec<String>) -> (Arc<Workload>, [i64; 3]) {
        let start = Instant::now();
        let ch = channel(&endpoints[0]);
        let lease = LeaseClient::new(ch.clone());
        let mut kv = KvClient::new(ch);
        let mut ids = [0; 3];
        let mut renewed = BTreeMap::new();
        for (n, (key, ttl)) in [(KEPT_KEY, LEASE_TTL), (DROPPED_KEY, LEASE_TTL), ("", 3600)]
            .into_iter()
            .enumerate()
        {
            let sent = start.elapsed();
            let id = retry(|| {
                let mut lease = lease.clone();
                async move {
                    lease
                        .lease_grant(LeaseGrantRequest { ttl, id: 0 })
                        .await
                        .map(|r| r.into_inner().id)
                }
            })
            .await;
            ids[n] = id;
            if !key.is_empty() {
                retry(|| {
                    let mut k = kv.clone();
                    async move {
                        k.put(PutRequest {
                            key: key.as_bytes().to_vec().into(),
                            value: b"held".to_vec().into(),
                            lease: id,
                            ..Default::default()
                        })
                        .await
                    }
                })
                .await;
                renewed.insert(key.to_string(), vec![sent]);
            }
        }
        let from = kv
            .range(RangeRequest {
                key: b"/".to_vec().into(),
                ..Default::default()
            })
            .await
            .expect("revision")
            .into_inner()
            .header
            .expect("header")
            .revision
            + 1;
        let workload = Arc::new(Workload {
            endpoints,
            start,
            record: Mutex::new(Record {
                renewed,
                ..Default::default()
            }),
            stop: AtomicBool::new(false),
            drop_lease: AtomicBool::new(false),
            from,
        });
        (workload, ids)
    }

    /// The shared clock.
    pub fn now(&self) -> Duration {
        self.start.elapsed()
    }

    /// Tells every writer to stop (the watch runs on until told too).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// Puts [`END_KEY`] once the writers stopped; its revision.
    pub async fn end(&self) -> i64 {
        self.record
            .lock()
            .unwrap()
            .attempted
            .insert(END_VALUE.to_string());
        let endpoints = self.endpoints.clone();
        let at = std::sync::atomic::AtomicUsize::new(0);
        retry(|| {
            let i = at.fetch_add(1, Ordering::Relaxed) % endpoints.len();
            let mut kv = KvClient::new(channel(&endpoints[i]));
            async move {
                let r = kv
                    .put(PutRequest {
                        key: END_KEY.as_bytes().to_vec().into(),
                        value: END_VALUE.as_bytes().to_vec().into(),
                        ..Default::default()
                    })
                    .await?;
                Ok(r.into_inner().header.expect("header").revision)
            }
        })
        .await
    }

    /// The newest revision the watch delivered.
    pub fn watched_up_to(&self) -> i64 {
        self.record
            .lock()
            .unwrap()
            .seen
            .last()
            .map_or(self.from - 1, |s| s.revision)
    }

    /// Writes Event objects with `lease` until stopped.
    pub async fn events(self: Arc<Self>, writer: usize, lease: i64) {
        let mut at = writer % self.endpoints.len();
        let mut kv = KvClient::new(channel(&self.endpoints[at]));
        let mut seq = 0u64;
        while !self.stopped() {
            seq += 1;
            let key = format!("{PREFIX}events/default/w{writer}-{seq}");
            let value = format!("event-{writer}-{seq}");
            self.record.lock().unwrap().attempted.insert(value.clone());
            let put = kv.put(PutRequest {
                key: key.clone().into_bytes().into(),
                value: value.clone().into_bytes().into(),
                lease,
                ..Default::default()
            });
            match tokio::time::timeout(OP_TIMEOUT, put).await {
                Ok(Ok(r)) => {
                    let revision = r.into_inner().header.expect("header").revision;
                    let at = self.now();
                    self.record.lock().unwrap().acked.push(Acked {
                        key,
                        value,
                        revision,
                        at,
                    });
                }
                _ => {
                    at = (at + 1) % self.endpoints.len();
                    kv = KvClient::new(channel(&self.endpoints[at]));
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            tokio::time::sleep(Duration::from_millis(rand::random_range(1..5))).await;
        }
    }

    /// Heartbeats node Leases with GuaranteedUpdate until stopped.
    pub async fn heartbeats(self: Arc<Self>, writer: usize) {
        let mut at = writer % self.endpoints.len();
        let mut kv = KvClient::new(channel(&self.endpoints[at]));
        let mut known: BTreeMap<String, i64> = BTreeMap::new();
        let mut seq = 0u64;
        while !self.stopped() {
            seq += 1;
            let node = rand::random_range(0..NODES);
            let key = format!("{PREFIX}leases/kube-node-lease/node-{writer}-{node}");
            let value = format!("renew-{writer}-{seq}");
            let last = known.get(&key).copied().unwrap_or(0);
            self.record.lock().unwrap().attempted.insert(value.clone());
            let txn = kv.txn(TxnRequest {
                compare: vec![Compare {
                    result: compare::CompareResult::Equal as i32,
                    target: compare::CompareTarget::Mod as i32,
                    key: key.clone().into_bytes().into(),
                    target_union: Some(compare::TargetUnion::ModRevision(last)),
                    ..Default::default()
                }],
                success: vec![RequestOp {
                    request: Some(request_op::Request::RequestPut(PutRequest {
                        key: key.clone().into_bytes().into(),
                        value: value.clone().into_bytes().into(),
                        ..Default::default()
                    })),
                }],
                failure: vec![RequestOp {
                    request: Some(request_op::Request::RequestRange(RangeRequest {
                        key: key.clone().into_bytes().into(),
                        ..Default::default()
                    })),
                }],
            });
            match tokio::time::timeout(OP_TIMEOUT, txn).await {
                Ok(Ok(r)) => {
                    let r = r.into_inner();
                    let revision = r.header.expect("header").revision;
                    if r.succeeded {
                        known.insert(key.clone(), revision);
                        let at = self.now();
                        self.record.lock().unwrap().acked.push(Acked {
                            key,
                            value,
                            revision,
                            at,
                        });
                    } else {
                        let current = r.responses.into_iter().find_map(|op| match op.response {
                            Some(response_op::Response::ResponseRange(range)) => {
                                Some(range.kvs.first().map_or(0, |kv| kv.mod_revision))
                            }
                            _ => None,
                        });
                        known.insert(key, current.expect("the failure branch's read"));
                    }
                }
                _ => {
                    at = (at + 1) % self.endpoints.len();
                    kv = KvClient::new(channel(&self.endpoints[at]));
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            tokio::time::sleep(Duration::from_millis(rand::random_range(1..5))).await;
        }
    }

    /// Keeps lease `id` (attached to `key`) alive every
    /// [`KEEP_ALIVE_EVERY`] until stopped, or until the fault starts when
    /// `until_fault`.
    pub async fn keep_alive(self: Arc<Self>, id: i64, key: &'static str, until_fault: bool) {
        let mut at = 0;
        let mut stream: Option<(mpsc::Sender<LeaseKeepAliveRequest>, tonic::Streaming<_>)> = None;
        let done = || self.stopped() || (until_fault && self.drop_lease.load(Ordering::SeqCst));
        while !done() {
            if stream.is_none() {
                let (tx, rx) = mpsc::channel(4);
                let mut client = LeaseClient::new(channel(&self.endpoints[at]));
                let opened = tokio::time::timeout(
                    OP_TIMEOUT,
                    client.lease_keep_alive(ReceiverStream::new(rx)),
                )
                .await;
                match opened {
                    Ok(Ok(s)) => stream = Some((tx, s.into_inner())),
                    _ => {
                        at = (at + 1) % self.endpoints.len();
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                }
            }
            let (tx, rx) = stream.as_mut().unwrap();
            let sent = self.now();
            let answer = async {
                tx.send(LeaseKeepAliveRequest { id }).await.ok()?;
                rx.message().await.ok().flatten()
            };
            match tokio::time::timeout(OP_TIMEOUT, answer).await {
                Ok(Some(r)) if r.ttl > 0 => {
                    let mut record = self.record.lock().unwrap();
                    record
                        .renewed
                        .entry(key.to_string())
                        .or_default()
                        .push(sent);
                }
                Ok(Some(_)) => return, // expired: nothing left to renew
                _ => {
                    stream = None;
                    at = (at + 1) % self.endpoints.len();
                    continue;
                }
            }
            tokio::time::sleep(KEEP_ALIVE_EVERY).await;
        }
    }

    /// Watches [`PREFIX`] from the first revision after `prepare` until
    /// `done` is set, resuming on the next member whenever a stream ends.
    pub async fn watch(self: Arc<Self>, done: Arc<AtomicBool>) {
        let mut at = 0;
        while !done.load(Ordering::SeqCst) {
            let next = self.watched_up_to() + 1;
            let why = self.watch_on(&self.endpoints[at], next, &done).await;
            if done.load(Ordering::SeqCst) {
                return;
            }
            self.record
                .lock()
                .unwrap()
                .resumes
                .push(format!("m{at} from {next}: {why}"));
            at = (at + 1) % self.endpoints.len();
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// One watch stream on `endpoint` from `from`; why it ended.
    async fn watch_on(&self, endpoint: &str, from: i64, done: &AtomicBool) -> String {
        let (tx, rx) = mpsc::channel(1);
        let create = WatchCreateRequest {
            key: PREFIX.as_bytes().to_vec().into(),
            range_end: prefix_end(PREFIX).into(),
            start_revision: from,
            ..Default::default()
        };
        if tx
            .send(WatchRequest {
                request_union: Some(RequestUnion::CreateRequest(create)),
            })
            .await
            .is_err()
        {
            return "request channel closed".into();
        }
        let mut req = tonic::Request::new(ReceiverStream::new(rx));
        req.metadata_mut()
            .insert("hasleader", "true".parse().unwrap());
        // No per-request timeout on a stream that may idle: only the
        // connection attempt is bounded.
        let ch = Endpoint::from_shared(endpoint.to_string())
            .expect("endpoint URL")
            .connect_timeout(OP_TIMEOUT)
            .connect_lazy();
        let opened = tokio::time::timeout(OP_TIMEOUT, WatchClient::new(ch).watch(req)).await;
        let mut stream = match opened {
            Ok(Ok(s)) => s.into_inner(),
            Ok(Err(s)) => return format!("open: {}", s.message()),
            Err(_) => return "open: timed out".into(),
        };
        loop {
            let message = tokio::time::timeout(Duration::from_millis(100), stream.message()).await;
            if done.load(Ordering::SeqCst) {
                return "done".into();
            }
            let r = match message {
                Err(_) => continue,
                Ok(Err(s)) => return format!("{:?}: {}", s.code(), s.message()),
                Ok(Ok(None)) => return "stream ended".into(),
                Ok(Ok(Some(r))) => r,
            };
            if r.compact_revision != 0 {
                panic!(
                    "the watch from {from} was compacted at {}",
                    r.compact_revision
                );
            }
            if r.canceled {
                return format!("cancelled: {}", r.cancel_reason);
            }
            let at = self.now();
            let mut record = self.record.lock().unwrap();
            for e in r.events {
                let kv = e.kv.unwrap_or_default();
                record.seen.push(Seen {
                    revision: kv.mod_revision,
                    key: String::from_utf8_lossy(&kv.key).into_owned(),
                    value: String::from_utf8_lossy(&kv.value).into_owned(),
                    delete: e.r#type == EventType::Delete as i32,
                    at,
                });
            }
        }
    }
}

/// The end of the range of keys starting with `prefix`.
fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    *end.last_mut().unwrap() += 1;
    end
}

/// Retries `f` for up to 10 s while it fails (a member settling after the
/// start, or after the heal).
async fn retry<T, F, Fut>(f: F) -> T
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<T, tonic::Status>>,
{
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match tokio::time::timeout(OP_TIMEOUT, f()).await {
            Ok(Ok(t)) => return t,
            Ok(Err(e)) if Instant::now() > deadline => panic!("setup request: {e:?}"),
            Err(_) if Instant::now() > deadline => panic!("setup request timed out"),
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

//! The background load of the soak, kube-apiserver's write mix at a fixed
//! pace: node Lease heartbeats (`Txn(MOD == rev → Put, else Get)`), Event
//! creates with shared leases (`Txn(MOD == 0 → Put(lease))`, a new lease
//! every `--lease-reuse`, cached across restarts as the apiserver caches
//! it), and the apiserver's compactor (a CAS on `compact_rev_key`, then a
//! Compact to the revision of the previous round). Every write goes
//! through the [`Model`]: recorded before it is sent, resolved by its
//! answer.

use super::model::{digest, Family, Model, EVENTS_PREFIX, LEASES_PREFIX, PODS_PREFIX};
use super::violations::Violations;
use crate::keys::value_with;
use crate::ops::{cas_txn, create_txn, header_rev};
use crate::pool::{call, Kv, Pool};
use crate::record::Errors;
use bytes::Bytes;
use ephd::proto::etcdserverpb::{
    compare::{CompareResult, CompareTarget, TargetUnion},
    kv_client::KvClient,
    lease_client::LeaseClient,
    request_op::Request,
    response_op::Response,
    CompactionRequest, Compare, LeaseGrantRequest, PutRequest, RangeRequest, RequestOp, TxnRequest,
    TxnResponse,
};
use hdrhistogram::Histogram;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;
use tonic::transport::Channel;

/// kube-apiserver's compaction key.
pub const COMPACT_REV_KEY: &str = "compact_rev_key";

/// The shape of the load.
#[derive(Debug, Clone)]
pub struct LoadSpec {
    /// Node Lease objects.
    pub nodes: usize,
    /// How often each node renews.
    pub heartbeat_period: Duration,
    /// Event creates per second, over all writers.
    pub event_rate: f64,
    /// TTL of the events' leases, seconds.
    pub event_ttl: i64,
    /// How long one lease is reused for new events.
    pub lease_reuse: Duration,
    /// Writer tasks per kind.
    pub writers: usize,
    /// The compactor's period (0: none).
    pub compact_every: Duration,
    /// Per-request timeout.
    pub timeout: Duration,
}

/// What the load keeps across server runs.
pub struct Shared {
    /// The model.
    pub model: Arc<Mutex<Model>>,
    /// Violations.
    pub viol: Arc<Violations>,
    /// Makes every written value unique.
    pub seq: AtomicU64,
    /// Keeps this run's event names apart from any other run's.
    pub nonce: u32,
    /// The lease new events are attached to, and when it was granted.
    lease: tokio::sync::Mutex<Option<(i64, Instant)>>,
    /// Failed writes by kind (calls that got no answer: killed server,
    /// dropped connection, timeout, shed request).
    pub errors: Mutex<Errors>,
    /// Compactions the compactor made.
    pub compactions: AtomicU64,
    /// Leases granted for events.
    pub leases_granted: AtomicU64,
    /// Latency of acknowledged heartbeat and event writes, µs (faults
    /// included: that is the point).
    pub latency: Mutex<Histogram<u64>>,
}

impl Shared {
    /// State for a new soak.
    pub fn new(model: Arc<Mutex<Model>>, viol: Arc<Violations>) -> Shared {
        Shared {
            model,
            viol,
            seq: AtomicU64::new(0),
            nonce: crate::keys::run_nonce(),
            lease: tokio::sync::Mutex::new(None),
            errors: Mutex::new(Errors::default()),
            compactions: AtomicU64::new(0),
            leases_granted: AtomicU64::new(0),
            latency: Mutex::new(crate::record::histogram()),
        }
    }

    /// The lease new events are attached to now, if any.
    pub async fn cached_lease(&self) -> Option<i64> {
        self.lease.lock().await.map(|(id, _)| id)
    }

    fn took(&self, t0: Instant) {
        self.latency
            .lock()
            .saturating_record(t0.elapsed().as_micros().max(1) as u64);
    }

    fn error(&self, (kind, msg): &(String, String)) {
        self.errors.lock().add(kind, msg);
    }
}

/// A node Lease key.
pub fn node_key(node: usize) -> Bytes {
    Bytes::from(format!("{LEASES_PREFIX}node-{node:05}"))
}

/// A Pod key (the list-storm fixture).
pub fn pod_key(i: usize) -> Bytes {
    Bytes::from(format!("{PODS_PREFIX}ns-{:02}/pod-{i:05}", i % 20))
}

fn lease_object(node: usize, seq: u64) -> Bytes {
    value_with(
        &format!(
            "{{\"kind\":\"Lease\",\"metadata\":{{\"name\":\"node-{node:05}\",\"namespace\":\"kube-node-lease\"}},\"spec\":{{\"holderIdentity\":\"node-{node:05}\",\"leaseDurationSeconds\":40,\"renewTime\":{seq}}}}}"
        ),
        300,
    )
}

/// The running load of one server run.
pub struct Load {
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    timeout: Duration,
}

impl Load {
    /// Starts the writers and the compactor against the server behind
    /// `pool` and `channel`. `compacted` is raised before every
    /// compaction is sent.
    pub fn start(
        pool: &Pool,
        channel: &Channel,
        spec: &LoadSpec,
        sh: &Arc<Shared>,
        compacted: &Arc<AtomicI64>,
    ) -> Load {
        let (stop, stop_rx) = watch::channel(false);
        let mut tasks = Vec::new();
        let writers = spec.writers.max(1);
        for t in 0..writers {
            let nodes: Vec<usize> = (t..spec.nodes).step_by(writers).collect();
            if !nodes.is_empty() {
                tasks.push(tokio::spawn(heartbeat(
                    pool.kv(t),
                    nodes,
                    spec.clone(),
                    sh.clone(),
                    stop_rx.clone(),
                )));
            }
            if spec.event_rate > 0.0 {
                tasks.push(tokio::spawn(events(
                    pool.kv(t + writers),
                    LeaseClient::new(channel.clone()),
                    spec.clone(),
                    spec.event_rate / writers as f64,
                    sh.clone(),
                    stop_rx.clone(),
                )));
            }
        }
        if !spec.compact_every.is_zero() {
            tasks.push(tokio::spawn(compactor(
                KvClient::new(channel.clone()),
                spec.clone(),
                sh.clone(),
                compacted.clone(),
                stop_rx.clone(),
            )));
        }
        Load {
            stop,
            tasks,
            timeout: spec.timeout,
        }
    }

    /// Stops every task after its current call (bounded by the request
    /// timeout; then they are aborted).
    pub async fn stop(self, viol: &Violations) {
        self.stop.send_replace(true);
        let deadline = tokio::time::Instant::now() + self.timeout + Duration::from_secs(5);
        for mut t in self.tasks {
            match tokio::time::timeout_at(deadline, &mut t).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) if e.is_panic() => viol.add(format!("a soak writer panicked: {e}")),
                Ok(Err(_)) => {}
                Err(_) => t.abort(),
            }
        }
    }
}

/// Waits for the next tick; false once the load is stopped.
async fn next_tick(tick: &mut tokio::time::Interval, stop: &mut watch::Receiver<bool>) -> bool {
    if *stop.borrow() {
        return false;
    }
    tokio::select! {
        _ = tick.tick() => !*stop.borrow(),
        _ = stop.changed() => false,
    }
}

fn interval(period: Duration) -> tokio::time::Interval {
    let mut tick = tokio::time::interval(period.max(Duration::from_micros(100)));
    tick.set_missed_tick_behavior(MissedTickBehavior::Skip);
    tick
}

/// The mod revision and value digest a failed CAS's Get found.
fn found(resp: &TxnResponse) -> Option<(i64, u64)> {
    match resp.responses.first().and_then(|r| r.response.as_ref()) {
        Some(Response::ResponseRange(r)) => {
            r.kvs.first().map(|kv| (kv.mod_revision, digest(&kv.value)))
        }
        _ => None,
    }
}

/// One writer's node Leases, renewed in turn, each once per period.
async fn heartbeat(
    mut kv: Kv,
    nodes: Vec<usize>,
    spec: LoadSpec,
    sh: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = interval(spec.heartbeat_period / nodes.len() as u32);
    let mut last_rev = 0i64;
    let mut turn = 0usize;
    while next_tick(&mut tick, &mut stop).await {
        let node = nodes[turn % nodes.len()];
        turn += 1;
        let key = node_key(node);
        let value = lease_object(node, sh.seq.fetch_add(1, Ordering::Relaxed));
        let hash = digest(&value);
        let expect = {
            let mut m = sh.model.lock();
            let cur = m.current(&key).unwrap_or(0);
            m.sent(&key, Family::Leases, hash, 0);
            cur
        };
        let t0 = Instant::now();
        match call(spec.timeout, kv.txn(cas_txn(&key, expect, value, 0))).await {
            Ok(r) if r.succeeded => {
                sh.took(t0);
                let rev = header_rev(&r.header);
                if rev <= last_rev {
                    sh.viol.add(format!(
                        "a writer's acknowledged revisions went backwards: {rev} after {last_rev}"
                    ));
                }
                last_rev = rev;
                if let Err(e) = sh.model.lock().acked(&key, rev, hash) {
                    sh.viol.add(e);
                }
            }
            Ok(r) => {
                let mut m = sh.model.lock();
                m.refused(&key, hash);
                if let Err(e) = m.cas_found(&key, found(&r)) {
                    sh.viol.add(e);
                }
            }
            Err(e) => {
                sh.model.lock().failed(&key, hash);
                sh.error(&e);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// The lease new events attach to: the cached one while it is younger
/// than `--lease-reuse`, else a new grant.
async fn event_lease(
    sh: &Shared,
    client: &mut LeaseClient<Channel>,
    spec: &LoadSpec,
) -> Result<i64, (String, String)> {
    let mut slot = sh.lease.lock().await;
    if let Some((id, at)) = *slot {
        if at.elapsed() < spec.lease_reuse {
            return Ok(id);
        }
    }
    let sent = Instant::now();
    let resp = call(
        spec.timeout,
        client.lease_grant(LeaseGrantRequest {
            ttl: spec.event_ttl,
            id: 0,
        }),
    )
    .await?;
    if !resp.error.is_empty() {
        return Err(("lease grant".into(), resp.error));
    }
    sh.model.lock().lease_granted(resp.id, resp.ttl, sent);
    sh.leases_granted.fetch_add(1, Ordering::Relaxed);
    *slot = Some((resp.id, sent));
    Ok(resp.id)
}

/// One writer of Events at `rate` per second.
async fn events(
    mut kv: Kv,
    mut leases: LeaseClient<Channel>,
    spec: LoadSpec,
    rate: f64,
    sh: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = interval(Duration::from_secs_f64(1.0 / rate.max(0.01)));
    let mut last_rev = 0i64;
    while next_tick(&mut tick, &mut stop).await {
        let lease = match event_lease(&sh, &mut leases, &spec).await {
            Ok(id) => id,
            Err(e) => {
                sh.error(&e);
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let seq = sh.seq.fetch_add(1, Ordering::Relaxed);
        let ns = seq % 10;
        let name = format!("ev-{:08x}.{seq:010}", sh.nonce);
        let key = Bytes::from(format!("{EVENTS_PREFIX}ns-{ns:02}/{name}"));
        let value = value_with(
            &format!(
                "{{\"kind\":\"Event\",\"metadata\":{{\"name\":\"{name}\",\"namespace\":\"ns-{ns:02}\"}},\"reason\":\"Soak\",\"count\":1}}"
            ),
            700,
        );
        let hash = digest(&value);
        sh.model.lock().sent(&key, Family::Events, hash, lease);
        let t0 = Instant::now();
        match call(spec.timeout, kv.txn(create_txn(&key, value, lease))).await {
            Ok(r) if r.succeeded => {
                sh.took(t0);
                let rev = header_rev(&r.header);
                if rev <= last_rev {
                    sh.viol.add(format!(
                        "a writer's acknowledged revisions went backwards: {rev} after {last_rev}"
                    ));
                }
                last_rev = rev;
                if let Err(e) = sh.model.lock().acked(&key, rev, hash) {
                    sh.viol.add(e);
                }
            }
            Ok(_) => {
                sh.model.lock().refused(&key, hash);
                sh.viol.add(format!(
                    "the create of the new event {} found it already there",
                    String::from_utf8_lossy(&key)
                ));
            }
            Err(e) => {
                sh.model.lock().failed(&key, hash);
                sh.error(&e);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// kube-apiserver's compactor, scaled down: every period, a CAS on
/// `compact_rev_key`'s version, then a compaction to the revision the
/// previous round saw.
async fn compactor(
    mut kv: KvClient<Channel>,
    spec: LoadSpec,
    sh: Arc<Shared>,
    compacted: Arc<AtomicI64>,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = interval(spec.compact_every);
    tick.reset();
    let key = Bytes::from_static(COMPACT_REV_KEY.as_bytes());
    let mut version = 0i64;
    let mut prev = 0i64;
    while next_tick(&mut tick, &mut stop).await {
        let txn = TxnRequest {
            compare: vec![Compare {
                result: CompareResult::Equal as i32,
                target: CompareTarget::Version as i32,
                key: key.clone(),
                range_end: Bytes::new(),
                target_union: Some(TargetUnion::Version(version)),
            }],
            success: vec![RequestOp {
                request: Some(Request::RequestPut(PutRequest {
                    key: key.clone(),
                    value: Bytes::from(prev.to_string()),
                    ..Default::default()
                })),
            }],
            failure: vec![RequestOp {
                request: Some(Request::RequestRange(RangeRequest {
                    key: key.clone(),
                    ..Default::default()
                })),
            }],
        };
        let cur = match call(spec.timeout, kv.txn(txn)).await {
            Ok(r) => {
                if r.succeeded {
                    version += 1;
                } else if let Some(Response::ResponseRange(g)) =
                    r.responses.first().and_then(|x| x.response.as_ref())
                {
                    version = g.kvs.first().map_or(0, |kv| kv.version);
                }
                header_rev(&r.header)
            }
            Err(e) => {
                sh.error(&e);
                continue;
            }
        };
        if prev > 0 {
            compacted.fetch_max(prev, Ordering::AcqRel);
            match call(
                spec.timeout,
                kv.compact(CompactionRequest {
                    revision: prev,
                    physical: false,
                }),
            )
            .await
            {
                Ok(_) => {
                    sh.compactions.fetch_add(1, Ordering::Relaxed);
                }
                // Someone compacted further already (the mid-watch fault).
                Err((_, m)) if m.contains("compacted") => {}
                Err(e) => sh.error(&e),
            }
        }
        prev = cur;
    }
}

/// Creates the Pods the list storms read, `size` bytes each, skipping
/// those that exist (after a restart); `conc` at a time.
pub async fn ensure_pods(
    pool: &Pool,
    sh: &Arc<Shared>,
    count: usize,
    size: usize,
    timeout: Duration,
) -> Result<(), String> {
    let conc = 16.min(count.max(1));
    let mut tasks = Vec::new();
    for t in 0..conc {
        let mut kv = pool.kv(t);
        let sh = sh.clone();
        tasks.push(tokio::spawn(async move {
            for i in (t..count).step_by(conc) {
                let key = pod_key(i);
                if sh.model.lock().current(&key).is_some() {
                    continue;
                }
                let value = value_with(
                    &format!(
                        "{{\"kind\":\"Pod\",\"metadata\":{{\"name\":\"pod-{i:05}\",\"uid\":\"{}\"}}}}",
                        sh.seq.fetch_add(1, Ordering::Relaxed)
                    ),
                    size,
                );
                let hash = digest(&value);
                sh.model.lock().sent(&key, Family::Pods, hash, 0);
                match call(timeout, kv.txn(cas_txn(&key, 0, value, 0))).await {
                    Ok(r) if r.succeeded => {
                        if let Err(e) = sh.model.lock().acked(&key, header_rev(&r.header), hash) {
                            sh.viol.add(e);
                        }
                    }
                    Ok(r) => {
                        let mut m = sh.model.lock();
                        m.refused(&key, hash);
                        if let Err(e) = m.cas_found(&key, found(&r)) {
                            sh.viol.add(e);
                        }
                    }
                    Err((k, m)) => return Err(format!("creating {}: {k}: {m}", String::from_utf8_lossy(&key))),
                }
            }
            Ok(())
        }));
    }
    for t in tasks {
        t.await.map_err(|e| format!("pod writer: {e}"))??;
    }
    Ok(())
}

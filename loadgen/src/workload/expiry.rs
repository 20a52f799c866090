//! `lease-expiry`: a lease expiry storm under a heartbeat.
//!
//! `--leases` leases are granted, each with one Event-shaped key attached.
//! A lease granted `s` whole seconds into the grants gets a TTL of
//! `--ttl - s`, so every deadline falls within about a second however long
//! the grants take. Heartbeat puts then run at `--rate` (200/s unless
//! given) through the storm, until a watch (DELETE events only) has seen
//! every key go or `--expiry-timeout` after the last deadline has passed.
//!
//! Reported beside the heartbeat's usual latency figures: how long the
//! server took to expire everything and at what rate, how late each key
//! went after its lease's deadline, the heartbeat's latency before and
//! during the storm, and the checks that fail the run: a key deleted
//! before its lease's deadline (measured from before the grant was sent,
//! so never too strict) or one that never expired.

use crate::driver::{measure_keeping_workers, setup, Shape, Worker};
use crate::keys::{prefix_end, run_nonce, value_with};
use crate::ops::{count_prefix, create_txn};
use crate::options::{parse_duration, Common};
use crate::pool::{call, Kv, Pool};
use crate::record::{histogram, Recorder};
use crate::report::{lag_ms, r3, Report};
use bytes::Bytes;
use ephd::proto::etcdserverpb::{
    lease_client::LeaseClient, watch_create_request::FilterType, watch_request::RequestUnion,
    LeaseGrantRequest, PutRequest, WatchCreateRequest, WatchRequest,
};
use ephd::proto::mvccpb::event::EventType;
use std::collections::HashMap;
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

/// Where the storm's keys live (under the events prefix, as the
/// apiserver's leased objects do).
pub const PREFIX: &str = "/registry/events/expiry-storm/";

/// The heartbeat writers' keys.
const HEARTBEAT_PREFIX: &str = "/registry/leases/kube-node-lease/expiry-heartbeat-";

/// Heartbeats per second when `--rate` is not given.
const DEFAULT_RATE: f64 = 200.0;

/// The shortest TTL asked for: etcd's minimum at its default timing.
const MIN_TTL: i64 = 2;

/// Options of `lease-expiry`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Leases granted, one key attached to each.
    #[arg(long, default_value_t = 100_000)]
    pub leases: u64,
    /// TTL of the first lease, seconds; each later one is shorter by the
    /// whole seconds the grants have taken so far.
    #[arg(long, default_value_t = 20)]
    pub ttl: i64,
    /// How long after the last deadline every key must have gone.
    #[arg(long, value_parser = parse_duration, default_value = "300s")]
    pub expiry_timeout: Duration,
}

/// Setup: one client granting leases and attaching a key to each.
struct Granter {
    kv: Kv,
    lease: LeaseClient<Channel>,
    nonce: u32,
    ttl: i64,
    grants_start: Instant,
    val_size: usize,
    timeout: Duration,
    /// Each attached key and the earliest moment its lease may expire.
    deadlines: Vec<(Bytes, Instant)>,
}

impl Worker for Granter {
    async fn op(&mut self, n: u64, rec: &mut Recorder) -> ControlFlow<()> {
        let ttl = (self.ttl - self.grants_start.elapsed().as_secs() as i64).max(MIN_TTL);
        let sent = Instant::now();
        let grant = call(
            self.timeout,
            self.lease.lease_grant(LeaseGrantRequest { ttl, id: 0 }),
        );
        let granted = match grant.await {
            Ok(r) if r.error.is_empty() => r,
            Ok(r) => {
                rec.err(&("lease grant".into(), r.error));
                return ControlFlow::Continue(());
            }
            Err(e) => {
                rec.err(&e);
                return ControlFlow::Continue(());
            }
        };
        let key = Bytes::from(format!("{PREFIX}ev-{:08x}.{n:010}", self.nonce));
        let value = value_with(
            &format!(
                "{{\"kind\":\"Event\",\"metadata\":{{\"name\":\"ev-{:08x}.{n:010}\",\"namespace\":\"expiry-storm\"}},\"reason\":\"Benchmark\",\"count\":1}}",
                self.nonce
            ),
            self.val_size,
        );
        match call(
            self.timeout,
            self.kv.txn(create_txn(&key, value, granted.id)),
        )
        .await
        {
            Ok(r) if r.succeeded => {
                // The server starts the TTL at or after `sent`.
                let deadline = sent + Duration::from_secs(granted.ttl.max(0) as u64);
                self.deadlines.push((key, deadline));
                rec.ok(sent);
            }
            Ok(_) => rec.err(&("create conflict".into(), "the key already existed".into())),
            Err(e) => rec.err(&e),
        }
        ControlFlow::Continue(())
    }
}

/// Measured: one heartbeat writer, until the storm is over.
struct Heartbeat {
    kv: Kv,
    key: Bytes,
    value: Bytes,
    over: Arc<AtomicBool>,
    timeout: Duration,
    /// When each successful heartbeat was sent, and its latency.
    beats: Vec<(Instant, Duration)>,
}

impl Worker for Heartbeat {
    async fn op(&mut self, _: u64, rec: &mut Recorder) -> ControlFlow<()> {
        if self.over.load(Ordering::Relaxed) {
            return ControlFlow::Break(());
        }
        let t0 = Instant::now();
        let req = PutRequest {
            key: self.key.clone(),
            value: self.value.clone(),
            ..Default::default()
        };
        match call(self.timeout, self.kv.put(req)).await {
            Ok(_) => {
                self.beats.push((t0, t0.elapsed()));
                rec.ok(t0);
            }
            Err(e) => rec.err(&e),
        }
        ControlFlow::Continue(())
    }
}

/// A watch on `prefix` that sends every DELETE event's key, with the time
/// it arrived, to the returned channel. Returns once the watch is created.
async fn watch_deletes(
    pool: &Pool,
    prefix: &Bytes,
    timeout: Duration,
) -> Result<mpsc::UnboundedReceiver<(Bytes, Instant)>, String> {
    let (req_tx, req_rx) = mpsc::channel(4);
    let create = WatchRequest {
        request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
            key: prefix.clone(),
            range_end: prefix_end(prefix),
            filters: vec![FilterType::Noput as i32],
            ..Default::default()
        })),
    };
    req_tx
        .send(create)
        .await
        .map_err(|_| "watch request channel closed".to_string())?;
    let mut client = pool.watch(0);
    let mut stream = tokio::time::timeout(timeout, client.watch(ReceiverStream::new(req_rx)))
        .await
        .map_err(|_| "opening the watch timed out".to_string())?
        .map_err(|e| format!("opening the watch: {e}"))?
        .into_inner();
    let first = tokio::time::timeout(timeout, stream.message())
        .await
        .map_err(|_| "creating the watch timed out".to_string())?
        .map_err(|e| format!("creating the watch: {e}"))?;
    match first {
        Some(r) if r.created && !r.canceled => {}
        other => return Err(format!("the watch was not created: {other:?}")),
    }
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        // Keeps the request side open while the stream is read.
        let _requests = req_tx;
        while let Ok(Some(r)) = stream.message().await {
            let at = Instant::now();
            for ev in r.events {
                if ev.r#type == EventType::Delete as i32 {
                    let key = ev.kv.map(|kv| kv.key).unwrap_or_default();
                    if tx.send((key, at)).is_err() {
                        return;
                    }
                }
            }
            if r.canceled {
                return;
            }
        }
    });
    Ok(rx)
}

/// Defaults: 100 clients for the grants, 100,000 leases with ~20 s TTLs,
/// 300 B values, heartbeats from 10 clients at 200/s.
pub async fn run(c: &Common, a: &Args) -> Result<Report, String> {
    let clients = c.clients_or(100);
    let val_size = c.val_size_or(300);
    let pool = Pool::connect(c).await?;
    let prefix = Bytes::from_static(PREFIX.as_bytes());
    let nonce = run_nonce();
    let mut deletes = watch_deletes(&pool, &prefix, c.timeout).await?;

    let grants_start = Instant::now();
    let granters = (0..clients)
        .map(|ci| Granter {
            kv: pool.kv(ci),
            lease: pool.lease(ci),
            nonce,
            ttl: a.ttl.max(MIN_TTL),
            grants_start,
            val_size,
            timeout: c.timeout,
            deadlines: Vec::new(),
        })
        .collect();
    let (granters, granted) = setup(c, "granting leases", a.leases, granters).await;
    let grants_s = grants_start.elapsed().as_secs_f64();
    let deadlines: HashMap<Bytes, Instant> =
        granters.into_iter().flat_map(|g| g.deadlines).collect();
    if deadlines.is_empty() {
        return Err(format!(
            "no lease with a key was created ({} errors)",
            granted.errors.total()
        ));
    }
    let first_deadline = *deadlines.values().min().expect("not empty");
    let last_deadline = *deadlines.values().max().expect("not empty");

    let over = Arc::new(AtomicBool::new(false));
    let beaters = 10.min(clients);
    let heartbeats: Vec<Heartbeat> = (0..beaters)
        .map(|ci| Heartbeat {
            kv: pool.kv(ci),
            key: Bytes::from(format!("{HEARTBEAT_PREFIX}{ci:02}")),
            value: value_with("{\"kind\":\"Lease\"}", 300),
            over: over.clone(),
            timeout: c.timeout,
            beats: Vec::new(),
        })
        .collect();
    let mut hc = c.clone();
    if hc.rate <= 0.0 {
        hc.rate = DEFAULT_RATE;
    }
    // Until every key has gone (or the wait ends), each with its time.
    let wanted = deadlines.len();
    let wait_until = last_deadline + a.expiry_timeout;
    let collect = async {
        let mut seen: Vec<(Bytes, Instant)> = Vec::with_capacity(wanted);
        while seen.len() < wanted {
            let left = wait_until.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, deletes.recv()).await {
                Ok(Some(d)) => seen.push(d),
                Ok(None) | Err(_) => break,
            }
        }
        over.store(true, Ordering::Relaxed);
        seen
    };
    let ((m, heartbeats), seen) = tokio::join!(
        measure_keeping_workers(&hc, "lease-expiry", u64::MAX, heartbeats),
        collect
    );

    let mut lag = histogram();
    let mut early = 0u64;
    for (key, at) in &seen {
        match deadlines.get(key) {
            Some(d) if at < d => early += 1,
            Some(d) => lag.saturating_record(at.duration_since(*d).as_micros().max(1) as u64),
            None => {}
        }
    }
    let first_delete = seen.iter().map(|(_, t)| *t).min();
    let last_delete = seen.iter().map(|(_, t)| *t).max();
    let storm =
        |t: Instant| first_delete.is_some_and(|f| t >= f) && last_delete.is_some_and(|l| t <= l);
    let (mut before, mut during) = (histogram(), histogram());
    for (sent, took) in heartbeats.iter().flat_map(|h| h.beats.iter()) {
        let us = took.as_micros().max(1) as u64;
        if first_delete.is_none_or(|f| *sent < f) {
            before.saturating_record(us);
        } else if storm(*sent) {
            during.saturating_record(us);
        }
    }
    let remaining = count_prefix(&pool, &prefix, c.timeout).await?;

    let mut r = m.report(
        pool.len(),
        Shape {
            key_size: format!("{PREFIX}ev-00000000.0000000000").len(),
            val_size,
            key_space: wanted as u64,
        },
    );
    let span = match (first_delete, last_delete) {
        (Some(f), Some(l)) => l.duration_since(f).as_secs_f64(),
        _ => 0.0,
    };
    r.set("leases", wanted as u64);
    r.set("lease_ttl_s", a.ttl);
    r.set("grants_s", r3(grants_s));
    r.set("grant_errors", granted.errors.total());
    r.set(
        "deadline_spread_s",
        r3(last_deadline.duration_since(first_deadline).as_secs_f64()),
    );
    r.set("expired", seen.len() as u64);
    r.set("expiry_span_s", r3(span));
    r.set(
        "expiries_per_s",
        if span > 0.0 {
            (seen.len() as f64 / span).round()
        } else {
            0.0
        },
    );
    let (p50, p99, max) = lag_ms(&lag);
    r.set("expiry_lag_p50_ms", p50);
    r.set("expiry_lag_p99_ms", p99);
    r.set("expiry_lag_max_ms", max);
    r.set("early_expiries", early);
    let (p50, p99, max) = lag_ms(&before);
    r.set("heartbeat_before_p50_ms", p50);
    r.set("heartbeat_before_p99_ms", p99);
    r.set("heartbeat_before_max_ms", max);
    let (p50, p99, max) = lag_ms(&during);
    r.set("heartbeat_storm_p50_ms", p50);
    r.set("heartbeat_storm_p99_ms", p99);
    r.set("heartbeat_storm_max_ms", max);
    r.set("keys_remaining", remaining);
    if let Some(s) = r.server_cpu_s {
        if !seen.is_empty() {
            r.set(
                "server_cpu_us_per_expiry",
                (s * 1e6 / seen.len() as f64).round(),
            );
        }
    }
    if early > 0 {
        r.failures.push(format!(
            "{early} keys were deleted before their lease's TTL had passed"
        ));
    }
    if seen.len() < wanted || remaining > 0 {
        r.failures.push(format!(
            "{} of {wanted} keys did not expire within {:?} of the last deadline ({remaining} still listed)",
            wanted - seen.len().min(wanted),
            a.expiry_timeout
        ));
    }
    Ok(r)
}

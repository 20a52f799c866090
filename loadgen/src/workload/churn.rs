//! `event-churn`: Kubernetes Events being created, each attached to a lease
//! shared by up to 1000 objects (kube-apiserver's lease reuse), with a
//! prefix watch attached. With a short `--ttl` and `--wait-expiry` it also
//! waits for the leases to expire and checks that every object's DELETE
//! event arrives.

use crate::driver::{measure, Shape, Worker};
use crate::keys::{run_nonce, value_with};
use crate::ops::{count_prefix, create_txn, current_revision, header_rev};
use crate::options::Common;
use crate::pool::{call, Kv, Pool};
use crate::progress::Progress;
use crate::record::Recorder;
use crate::report::{r3, Report};
use crate::watchcheck::{RevTable, WatchSet};
use bytes::Bytes;
use ephd::proto::etcdserverpb::{lease_client::LeaseClient, LeaseGrantRequest};
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Mutex;
use tonic::transport::Channel;

/// The Kubernetes events prefix.
pub const PREFIX: &str = "/registry/events/";

/// Options of `event-churn`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// TTL of the shared leases, seconds (kube-apiserver: event-ttl 1h + 60 s).
    #[arg(long, default_value_t = 3660)]
    pub ttl: i64,
    /// Objects attached to one lease before a new one is granted.
    #[arg(long, default_value_t = 1000)]
    pub keys_per_lease: u64,
    /// Namespaces the events are spread over.
    #[arg(long, default_value_t = 100)]
    pub namespaces: u64,
    /// After the writes, wait (up to --ttl + 15 s + --drain-timeout) until every
    /// created object has expired, and check its DELETE event arrived.
    #[arg(long)]
    pub wait_expiry: bool,
    /// Watchers on the prefix (0 = no watch).
    #[arg(long, default_value_t = 1)]
    pub watchers: usize,
    /// Watch streams the watchers are spread over.
    #[arg(long, default_value_t = 1)]
    pub streams: usize,
}

/// The lease the next object is attached to, granted on demand.
struct LeasePool {
    slot: Mutex<(i64, u64)>,
    per_lease: u64,
    ttl: i64,
    client: Mutex<LeaseClient<Channel>>,
    timeout: Duration,
}

impl LeasePool {
    async fn get(&self, rec: &mut Recorder) -> Result<i64, (String, String)> {
        let mut slot = self.slot.lock().await;
        if slot.0 == 0 || slot.1 >= self.per_lease {
            let mut client = self.client.lock().await;
            let resp = call(
                self.timeout,
                client.lease_grant(LeaseGrantRequest {
                    ttl: self.ttl,
                    id: 0,
                }),
            )
            .await?;
            if !resp.error.is_empty() {
                return Err(("lease grant".into(), resp.error));
            }
            *slot = (resp.id, 0);
            rec.count("leases_granted", 1);
        }
        slot.1 += 1;
        Ok(slot.0)
    }
}

/// One client: an Event create per op, attached to the shared lease.
struct Creator {
    kv: Kv,
    table: Arc<RevTable>,
    leases: Arc<LeasePool>,
    nonce: u32,
    namespaces: u64,
    val_size: usize,
    timeout: Duration,
}

impl Worker for Creator {
    async fn op(&mut self, n: u64, rec: &mut Recorder) -> ControlFlow<()> {
        let (ns, nonce) = (n % self.namespaces, self.nonce);
        let key = Bytes::from(format!("{PREFIX}ns-{ns:03}/ev-{nonce:08x}.{n:010}"));
        let value = value_with(
            &format!(
                "{{\"kind\":\"Event\",\"metadata\":{{\"name\":\"ev-{nonce:08x}.{n:010}\",\"namespace\":\"ns-{ns:03}\"}},\"reason\":\"Benchmark\",\"count\":1}}"
            ),
            self.val_size,
        );
        let t0 = Instant::now();
        let lease = match self.leases.get(rec).await {
            Ok(id) => id,
            Err(e) => {
                rec.err(&e);
                return ControlFlow::Continue(());
            }
        };
        match call(self.timeout, self.kv.txn(create_txn(&key, value, lease))).await {
            Ok(r) if r.succeeded => {
                self.table.written(header_rev(&r.header));
                rec.ok(t0);
            }
            Ok(_) => rec.err(&("create conflict".into(), "the key already existed".into())),
            Err(e) => rec.err(&e),
        }
        ControlFlow::Continue(())
    }
}

/// Defaults: 100 clients, 50,000 creates, values 700 B, 100 namespaces.
pub async fn run(c: &Common, a: &Args) -> Result<Report, String> {
    let clients = c.clients_or(100);
    let val_size = c.val_size_or(700);
    let pool = Pool::connect(c).await?;
    let prefix = Bytes::from_static(PREFIX.as_bytes());
    let nonce = run_nonce();
    let namespaces = a.namespaces.max(1);

    let base = current_revision(&pool, &prefix, c.timeout).await?;
    let table = RevTable::new(base);
    let watch =
        WatchSet::open_prefix(&pool, &prefix, a.watchers, a.streams, &table, c.timeout).await?;
    let leases = Arc::new(LeasePool {
        slot: Mutex::new((0, 0)),
        per_lease: a.keys_per_lease.max(1),
        ttl: a.ttl,
        client: Mutex::new(pool.lease(0)),
        timeout: c.timeout,
    });

    let workers = (0..clients)
        .map(|ci| Creator {
            kv: pool.kv(ci),
            table: table.clone(),
            leases: leases.clone(),
            nonce,
            namespaces,
            val_size,
            timeout: c.timeout,
        })
        .collect();
    let m = measure(c, "event-churn", 50_000, workers).await;
    let writes_end = Instant::now();

    let mut expiry_s = None;
    let mut remaining = None;
    let expiry_wait = Duration::from_secs(a.ttl.max(0) as u64 + 15) + c.drain_timeout;
    let watch_report = match watch {
        Some(w) => {
            let (deletes, timeout, msg) = if a.wait_expiry {
                (m.rec.ops, expiry_wait, "waiting for lease expiry")
            } else {
                (0, c.drain_timeout, "draining watch")
            };
            let spinner = Progress::spinner(c.progress_enabled(), msg);
            let (wr, last) = w.finish(deletes, timeout, m.start()).await;
            spinner.finish();
            if a.wait_expiry {
                expiry_s = last.map(|t| r3(t.saturating_duration_since(writes_end).as_secs_f64()));
            }
            Some(wr)
        }
        None => None,
    };
    if a.wait_expiry {
        // Without a watch, poll the key count; with one, confirm it.
        let deadline = writes_end + expiry_wait;
        loop {
            let n = count_prefix(&pool, &prefix, c.timeout).await?;
            remaining = Some(n);
            if n == 0 || Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        if expiry_s.is_none() && remaining == Some(0) {
            expiry_s = Some(r3(writes_end.elapsed().as_secs_f64()));
        }
    }
    let mut r = m.report(
        pool.len(),
        Shape {
            key_size: format!("{PREFIX}ns-000/ev-00000000.0000000000").len(),
            val_size,
            key_space: m.rec.ops,
        },
    );
    r.watch = watch_report;
    r.set("lease_ttl_s", a.ttl);
    if a.wait_expiry {
        r.set("expiry_wait_s", expiry_s);
        r.set("keys_remaining", remaining);
    }
    Ok(r)
}

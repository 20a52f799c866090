//! `lease-heartbeat`: kubelets renewing their node Lease objects.
//!
//! N objects under `/registry/leases/kube-node-lease/node-XXXX` are created
//! with the apiserver's create (`Txn(MOD(key) == 0 → Put)`), then renewed
//! with its update (`Txn(MOD(key) == rev → Put, else Get)`). Each client owns
//! a fixed subset of nodes and keeps their last mod revision, so a CAS
//! failure means the server lost or reordered one of our writes (or an
//! earlier request timed out but was applied); the client then takes the
//! revision from the failure branch's Get, as the apiserver does. A prefix
//! watch (prev_kv, progress_notify) checks every renewal is delivered once,
//! in order, and measures the delivery lag.

use crate::driver::{measure, setup, Shape, Worker};
use crate::keys::value_with;
use crate::ops::{cas_txn, create_txn, current_revision, failed_cas_rev, get_op, header_rev};
use crate::options::Common;
use crate::pool::{call, Kv, Pool};
use crate::progress::Progress;
use crate::record::Recorder;
use crate::report::Report;
use crate::watchcheck::{RevTable, WatchSet};
use bytes::Bytes;
use ephd::proto::etcdserverpb::TxnRequest;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The Kubernetes node-lease prefix.
pub const PREFIX: &str = "/registry/leases/kube-node-lease/";

/// Options of `lease-heartbeat`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Node Lease objects [default: --key-space, else 1000].
    #[arg(long)]
    pub nodes: Option<u64>,
    /// Watchers on the prefix (0 = no watch).
    #[arg(long, default_value_t = 1)]
    pub watchers: usize,
    /// Watch streams the watchers are spread over.
    #[arg(long, default_value_t = 1)]
    pub streams: usize,
}

fn lease_value(node: usize, renew: u64, size: usize) -> Bytes {
    // Shaped like a coordination.k8s.io/v1 Lease; padded to --val-size.
    value_with(
        &format!(
            "{{\"kind\":\"Lease\",\"metadata\":{{\"name\":\"node-{node}\",\"namespace\":\"kube-node-lease\"}},\"spec\":{{\"holderIdentity\":\"node-{node}\",\"leaseDurationSeconds\":40,\"renew\":{renew}}}}}"
        ),
        size,
    )
}

/// A node Lease a client owns: node number, key, last mod revision.
type Owned = (usize, Bytes, i64);

/// Setup: one client creating its nodes' Leases, one per op (or adopting
/// those an earlier run left), and keeping their revisions.
struct Creator {
    kv: Kv,
    table: Arc<RevTable>,
    todo: Vec<(usize, Bytes)>,
    owned: Vec<Owned>,
    val_size: usize,
    timeout: Duration,
}

impl Worker for Creator {
    async fn op(&mut self, _: u64, rec: &mut Recorder) -> ControlFlow<()> {
        let Some((node, key)) = self.todo.get(self.owned.len()).cloned() else {
            return ControlFlow::Break(());
        };
        let req = create_txn(&key, lease_value(node, 0, self.val_size), 0);
        let rev = match call(self.timeout, self.kv.txn(req)).await {
            Ok(r) if r.succeeded => {
                let rev = header_rev(&r.header);
                self.table.written(rev);
                rev
            }
            Ok(_) => {
                // Left over from an earlier run: adopt its revision.
                rec.count("setup_existing", 1);
                let get = TxnRequest {
                    success: vec![get_op(&key)],
                    ..Default::default()
                };
                match call(self.timeout, self.kv.txn(get)).await {
                    Ok(r) => failed_cas_rev(&r),
                    Err(e) => {
                        rec.err(&e);
                        0
                    }
                }
            }
            Err(e) => {
                rec.err(&e);
                0
            }
        };
        self.owned.push((node, key, rev));
        // Stop before drawing an op index that another client needs.
        if self.owned.len() == self.todo.len() {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    }
}

/// Measured: one client renewing its nodes' Leases in turn.
struct Renewer {
    kv: Kv,
    table: Arc<RevTable>,
    owned: Vec<Owned>,
    turn: usize,
    val_size: usize,
    timeout: Duration,
}

impl Worker for Renewer {
    async fn op(&mut self, n: u64, rec: &mut Recorder) -> ControlFlow<()> {
        if self.owned.is_empty() {
            return ControlFlow::Break(());
        }
        let slot = self.turn % self.owned.len();
        let (node, key, rev) = &mut self.owned[slot];
        self.turn += 1;
        let req = cas_txn(key, *rev, lease_value(*node, n + 1, self.val_size), 0);
        let t0 = Instant::now();
        match call(self.timeout, self.kv.txn(req)).await {
            Ok(r) if r.succeeded => {
                *rev = header_rev(&r.header);
                self.table.written(*rev);
                rec.ok(t0);
            }
            Ok(r) => {
                // Someone else (or a timed-out retry) moved the key.
                *rev = failed_cas_rev(&r);
                rec.count("cas_failures", 1);
                rec.ok(t0);
            }
            Err(e) => rec.err(&e),
        }
        ControlFlow::Continue(())
    }
}

/// Defaults: 1000 nodes, 100 clients, 50,000 renewals, values 300 B, one watcher.
pub async fn run(c: &Common, a: &Args) -> Result<Report, String> {
    let nodes = a.nodes.or(c.key_space).unwrap_or(1000).max(1) as usize;
    let clients = c.clients_or(100).min(nodes);
    let val_size = c.val_size_or(300);
    let pool = Pool::connect(c).await?;
    let width = nodes.saturating_sub(1).to_string().len().max(4);
    let keys: Vec<Bytes> = (0..nodes)
        .map(|i| Bytes::from(format!("{PREFIX}node-{i:0width$}")))
        .collect();
    let prefix = Bytes::from_static(PREFIX.as_bytes());

    let base = current_revision(&pool, &prefix, c.timeout).await?;
    let table = RevTable::new(base);
    let mut watch =
        WatchSet::open_prefix(&pool, &prefix, a.watchers, a.streams, &table, c.timeout).await?;

    // Setup: create every node's Lease (or adopt it if it exists); client
    // `ci` owns nodes ci, ci + clients, ...
    let creators = (0..clients)
        .map(|ci| Creator {
            kv: pool.kv(ci),
            table: table.clone(),
            todo: (ci..nodes)
                .step_by(clients)
                .map(|n| (n, keys[n].clone()))
                .collect(),
            owned: Vec::new(),
            val_size,
            timeout: c.timeout,
        })
        .collect();
    let (creators, setup_rec) = setup(c, "creating node leases", nodes as u64, creators).await;
    if setup_rec.errors.total() > 0 {
        return Err(format!(
            "creating node leases failed: {:?}",
            setup_rec.errors.samples
        ));
    }

    // Measured phase: renewals.
    if let Some(w) = watch.as_mut() {
        w.mark_start();
    }
    let renewers = creators
        .into_iter()
        .map(|cr| Renewer {
            kv: cr.kv,
            table: cr.table,
            owned: cr.owned,
            turn: 0,
            val_size,
            timeout: c.timeout,
        })
        .collect();
    let mut m = measure(c, "lease-heartbeat", 50_000, renewers).await;
    m.rec.count("cas_failures", 0);

    let watch_report = match watch {
        Some(w) => {
            let spinner = Progress::spinner(c.progress_enabled(), "draining watch");
            let (wr, _) = w.finish(0, c.drain_timeout, m.start()).await;
            spinner.finish();
            Some(wr)
        }
        None => None,
    };

    let mut r = m.report(
        pool.len(),
        Shape {
            key_size: keys[0].len(),
            val_size,
            key_space: nodes as u64,
        },
    );
    r.watch = watch_report;
    Ok(r)
}

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

use crate::budget::Budget;
use crate::cpu::CpuSample;
use crate::keys::value_with;
use crate::ops::{cas_txn, create_txn, current_revision, failed_cas_rev, get_op, header_rev};
use crate::options::Common;
use crate::pool::{call, Pool};
use crate::progress::Progress;
use crate::record::{join_all, Recorder};
use crate::report::Report;
use crate::watchcheck::{RevTable, WatchSet};
use bytes::Bytes;
use ephd::proto::etcdserverpb::TxnRequest;
use std::sync::Arc;
use std::time::Instant;

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

/// Defaults: 1000 nodes, 100 clients, 50,000 renewals, values 300 B, one watcher.
pub async fn run(c: &Common, a: &Args) -> Result<Report, String> {
    let nodes = a.nodes.or(c.key_space).unwrap_or(1000).max(1) as usize;
    let clients = c.clients_or(100).min(nodes);
    let val_size = c.val_size_or(300);
    let pool = Arc::new(Pool::connect(c).await?);
    let width = nodes.saturating_sub(1).to_string().len().max(4);
    let keys: Vec<Bytes> = (0..nodes)
        .map(|i| Bytes::from(format!("{PREFIX}node-{i:0width$}")))
        .collect();
    let prefix = Bytes::from_static(PREFIX.as_bytes());

    let base = current_revision(&pool, &prefix, c.timeout).await?;
    let table = RevTable::new(base);
    let mut watch =
        WatchSet::open_prefix(&pool, &prefix, a.watchers, a.streams, &table, c.timeout).await?;

    // Setup: create every node's Lease (or adopt it if it exists).
    let spinner = Progress::spinner(c.progress_enabled(), "creating node leases");
    let setup_budget = Budget::fixed(nodes as u64, c.max_time);
    let mut handles = Vec::new();
    for ci in 0..clients {
        let mine: Vec<usize> = (ci..nodes).step_by(clients).collect();
        let keys: Vec<Bytes> = mine.iter().map(|&n| keys[n].clone()).collect();
        let mut kv = pool.kv(ci);
        let table = table.clone();
        let budget = setup_budget.clone();
        let timeout = c.timeout;
        handles.push(tokio::spawn(async move {
            let mut rec = Recorder::default();
            let mut owned = Vec::with_capacity(keys.len());
            for (node, key) in mine.into_iter().zip(keys) {
                if budget.next().await.is_none() {
                    break;
                }
                let req = create_txn(&key, lease_value(node, 0, val_size), 0);
                let rev = match call(timeout, kv.txn(req)).await {
                    Ok(r) if r.succeeded => {
                        let rev = header_rev(&r.header);
                        table.written(rev);
                        rev
                    }
                    Ok(_) => {
                        // Left over from an earlier run: adopt its revision.
                        rec.count("setup_existing", 1);
                        let get = TxnRequest {
                            success: vec![get_op(&key)],
                            ..Default::default()
                        };
                        match call(timeout, kv.txn(get)).await {
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
                owned.push((node, key, rev));
            }
            (owned, rec)
        }));
    }
    let mut owned_by_client = Vec::new();
    let mut setup = Recorder::default();
    for h in handles {
        let (owned, rec) = h.await.map_err(|e| e.to_string())?;
        owned_by_client.push(owned);
        setup.merge(rec);
    }
    spinner.finish();
    if setup.errors.total() > 0 {
        return Err(format!(
            "creating node leases failed: {:?}",
            setup.errors.samples
        ));
    }

    // Measured phase: renewals.
    if let Some(w) = watch.as_mut() {
        w.mark_start();
    }
    let budget = c.budget(50_000);
    let progress = Progress::for_budget(c.progress_enabled(), "heartbeat", budget.clone());
    let cpu0 = CpuSample::take(c.server_pid);
    let mut handles = Vec::new();
    for (ci, mut owned) in owned_by_client.into_iter().enumerate() {
        let mut kv = pool.kv(ci);
        let table = table.clone();
        let budget = budget.clone();
        let timeout = c.timeout;
        handles.push(tokio::spawn(async move {
            let mut rec = Recorder::default();
            let mut turn = 0usize;
            while let Some(n) = budget.next().await {
                if owned.is_empty() {
                    break;
                }
                let slot = turn % owned.len();
                let (node, key, rev) = &mut owned[slot];
                turn += 1;
                let req = cas_txn(key, *rev, lease_value(*node, n + 1, val_size), 0);
                let t0 = Instant::now();
                match call(timeout, kv.txn(req)).await {
                    Ok(r) if r.succeeded => {
                        *rev = header_rev(&r.header);
                        table.written(*rev);
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
                budget.complete();
            }
            rec
        }));
    }
    let mut rec = join_all(handles).await;
    let elapsed = budget.start().elapsed();
    progress.finish();
    rec.count("cas_failures", 0);

    let watch_report = match watch {
        Some(w) => {
            let spinner = Progress::spinner(c.progress_enabled(), "draining watch");
            let (wr, _) = w.finish(0, c.drain_timeout, budget.start()).await;
            spinner.finish();
            Some(wr)
        }
        None => None,
    };
    let cpu1 = CpuSample::take(c.server_pid);

    let mut r = Report::new("lease-heartbeat", &rec, elapsed);
    r.clients = clients;
    r.conns = pool.len();
    r.key_size = keys[0].len();
    r.val_size = val_size;
    r.key_space = nodes as u64;
    r.truncated = budget.truncated();
    r.watch = watch_report;
    r.add_cpu(&cpu0, &cpu1, c.server_pid);
    Ok(r)
}

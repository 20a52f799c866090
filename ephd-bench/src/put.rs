//! `put`: plain Puts over a key space, the shape of etcd's
//! `benchmark put --clients 100 --conns 10 --key-size 48 --val-size 1024`.

use crate::cpu::CpuSample;
use crate::keys::{padded_key, value_with};
use crate::options::Common;
use crate::pool::{call, Pool};
use crate::progress::Progress;
use crate::record::join_all;
use crate::report::Report;
use ephd::proto::etcdserverpb::PutRequest;
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use std::time::Instant;

/// Options of `put`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Key prefix (counted in --key-size).
    #[arg(long, default_value = "/bench/put/")]
    pub prefix: String,
    /// Write keys 0, 1, 2, ... (wrapping at --key-space) instead of random ones.
    #[arg(long)]
    pub sequential_keys: bool,
}

/// Defaults: 100 clients, 100,000 puts, key 48 B, value 1 KiB, key space 100,000.
pub async fn run(c: &Common, a: &Args) -> Result<Report, String> {
    let clients = c.clients_or(100);
    let key_size = c.key_size.unwrap_or(48);
    let val_size = c.val_size_or(1024);
    let key_space = c.key_space_or(100_000);
    let pool = Arc::new(Pool::connect(c).await?);
    let value = value_with("", val_size);

    let budget = c.budget(100_000);
    let progress = Progress::for_budget(c.progress_enabled(), "put", budget.clone());
    let cpu0 = CpuSample::take(c.server_pid);
    let mut handles = Vec::new();
    for i in 0..clients {
        let budget = budget.clone();
        let mut kv = pool.kv(i);
        let value = value.clone();
        let prefix = a.prefix.clone();
        let sequential = a.sequential_keys;
        let timeout = c.timeout;
        handles.push(tokio::spawn(async move {
            let mut rec = crate::record::Recorder::default();
            let mut rng = rand::rngs::StdRng::seed_from_u64(rand::random());
            while let Some(n) = budget.next().await {
                let k = if sequential {
                    n % key_space
                } else {
                    rng.random_range(0..key_space)
                };
                let req = PutRequest {
                    key: padded_key(&prefix, k, key_size),
                    value: value.clone(),
                    ..Default::default()
                };
                let t0 = Instant::now();
                match call(timeout, kv.put(req)).await {
                    Ok(_) => rec.ok(t0),
                    Err(e) => rec.err(&e),
                }
                budget.complete();
            }
            rec
        }));
    }
    let rec = join_all(handles).await;
    let elapsed = budget.start().elapsed();
    let cpu1 = CpuSample::take(c.server_pid);
    progress.finish();

    let mut r = Report::new("put", &rec, elapsed);
    r.clients = clients;
    r.conns = pool.len();
    r.key_size = key_size;
    r.val_size = val_size;
    r.key_space = key_space;
    r.truncated = budget.truncated();
    r.add_cpu(&cpu0, &cpu1, c.server_pid);
    Ok(r)
}

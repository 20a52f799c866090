//! `watch-fanout`: many watchers on one prefix, writers at a fixed rate
//! (`--rate`) or flat out. Reports events delivered per second, the
//! delivery lag, and checks that every watcher got every write exactly once
//! and in order.

use crate::cpu::CpuSample;
use crate::keys::{padded_key, prefix_end, value_with};
use crate::ops::{current_revision, header_rev};
use crate::options::Common;
use crate::pool::{call, Pool};
use crate::progress::Progress;
use crate::record::{join_all, Recorder};
use crate::report::Report;
use crate::watchcheck::{RevTable, WatchOpts, WatchSet};
use bytes::Bytes;
use ephd::proto::etcdserverpb::PutRequest;
use std::sync::Arc;
use std::time::Instant;

/// Options of `watch-fanout`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Watchers on the prefix.
    #[arg(long, default_value_t = 1000)]
    pub watchers: usize,
    /// Watch streams the watchers are spread over (round-robin over --conns).
    #[arg(long, default_value_t = 10)]
    pub streams: usize,
    /// Prefix watched and written.
    #[arg(long, default_value = "/bench/fanout/")]
    pub prefix: String,
    /// Watch with prev_kv.
    #[arg(long)]
    pub prev_kv: bool,
}

/// Defaults: 1000 watchers on 10 streams, 1 writer, 2,000 writes of 256 B
/// over 100 keys.
pub async fn run(c: &Common, a: &Args) -> Result<Report, String> {
    let clients = c.clients_or(1);
    let val_size = c.val_size_or(256);
    let key_space = c.key_space_or(100);
    let key_size = c.key_size.unwrap_or(a.prefix.len() + 8);
    let pool = Arc::new(Pool::connect(c).await?);
    let prefix = Bytes::from(a.prefix.clone());

    let base = current_revision(&pool, &prefix, c.timeout).await?;
    let table = RevTable::new(base);
    let spinner = Progress::spinner(c.progress_enabled(), "creating watchers");
    let opts = WatchOpts {
        key: prefix.clone(),
        range_end: prefix_end(&prefix),
        prev_kv: a.prev_kv,
        progress_notify: true,
    };
    let watch = WatchSet::open(
        &pool,
        &opts,
        a.watchers.max(1),
        a.streams,
        table.clone(),
        c.timeout,
    )
    .await?;
    spinner.finish();

    let value = value_with("", val_size);
    let budget = c.budget(2_000);
    let progress = Progress::for_budget(c.progress_enabled(), "fanout", budget.clone());
    let cpu0 = CpuSample::take(c.server_pid);
    let mut handles = Vec::new();
    for ci in 0..clients {
        let mut kv = pool.kv(ci);
        let table = table.clone();
        let budget = budget.clone();
        let value = value.clone();
        let prefix = a.prefix.clone();
        let timeout = c.timeout;
        handles.push(tokio::spawn(async move {
            let mut rec = Recorder::default();
            while let Some(n) = budget.next().await {
                let req = PutRequest {
                    key: padded_key(&prefix, n % key_space, key_size),
                    value: value.clone(),
                    ..Default::default()
                };
                let t0 = Instant::now();
                match call(timeout, kv.put(req)).await {
                    Ok(r) => {
                        table.written(header_rev(&r.header));
                        rec.ok(t0);
                    }
                    Err(e) => rec.err(&e),
                }
                budget.complete();
            }
            rec
        }));
    }
    let rec = join_all(handles).await;
    let elapsed = budget.start().elapsed();
    progress.finish();
    let spinner = Progress::spinner(c.progress_enabled(), "draining watchers");
    let (wr, _) = watch.finish(0, c.drain_timeout, budget.start()).await;
    spinner.finish();
    let cpu1 = CpuSample::take(c.server_pid);

    let mut r = Report::new("watch-fanout", &rec, elapsed);
    r.clients = clients;
    r.conns = pool.len();
    r.key_size = key_size;
    r.val_size = val_size;
    r.key_space = key_space;
    r.truncated = budget.truncated();
    let events = wr.watch_events;
    r.watch = Some(wr);
    r.add_cpu(&cpu0, &cpu1, c.server_pid);
    if let (Some(cpu), true) = (r.server_cpu_s, events > 0) {
        r.set(
            "server_cpu_us_per_event",
            crate::report::r3(cpu * 1e6 / events as f64),
        );
    }
    Ok(r)
}

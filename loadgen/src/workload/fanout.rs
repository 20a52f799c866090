//! `watch-fanout`: many watchers on one prefix, writers at a fixed rate
//! (`--rate`) or flat out. Reports events delivered per second, the
//! delivery lag, and checks that every watcher got every write exactly once
//! and in order.

use crate::driver::{measure, Shape, Worker};
use crate::keys::{padded_key, prefix_end, value_with};
use crate::ops::{current_revision, header_rev};
use crate::options::Common;
use crate::pool::{call, Kv, Pool};
use crate::progress::Progress;
use crate::record::Recorder;
use crate::report::{r3, Report};
use crate::watchcheck::{RevTable, WatchOpts, WatchSet};
use bytes::Bytes;
use ephd::proto::etcdserverpb::PutRequest;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::{Duration, Instant};

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

/// One writer: a Put over the key space per op, noting its revision for
/// the watchers' checks.
struct Writer {
    kv: Kv,
    table: Arc<RevTable>,
    prefix: Arc<str>,
    value: Bytes,
    key_space: u64,
    key_size: usize,
    timeout: Duration,
}

impl Worker for Writer {
    async fn op(&mut self, n: u64, rec: &mut Recorder) -> ControlFlow<()> {
        let req = PutRequest {
            key: padded_key(&self.prefix, n % self.key_space, self.key_size),
            value: self.value.clone(),
            ..Default::default()
        };
        let t0 = Instant::now();
        match call(self.timeout, self.kv.put(req)).await {
            Ok(r) => {
                self.table.written(header_rev(&r.header));
                rec.ok(t0);
            }
            Err(e) => rec.err(&e),
        }
        ControlFlow::Continue(())
    }
}

/// Defaults: 1000 watchers on 10 streams, 1 writer, 2,000 writes of 256 B
/// over 100 keys.
pub async fn run(c: &Common, a: &Args) -> Result<Report, String> {
    let clients = c.clients_or(1);
    let val_size = c.val_size_or(256);
    let key_space = c.key_space_or(100);
    let key_size = c.key_size.unwrap_or(a.prefix.len() + 8);
    let pool = Pool::connect(c).await?;
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
    let prefix: Arc<str> = a.prefix.as_str().into();
    let writers = (0..clients)
        .map(|ci| Writer {
            kv: pool.kv(ci),
            table: table.clone(),
            prefix: prefix.clone(),
            value: value.clone(),
            key_space,
            key_size,
            timeout: c.timeout,
        })
        .collect();
    let m = measure(c, "watch-fanout", 2_000, writers).await;
    let spinner = Progress::spinner(c.progress_enabled(), "draining watchers");
    let (wr, _) = watch.finish(0, c.drain_timeout, m.start()).await;
    spinner.finish();

    let mut r = m.report(
        pool.len(),
        Shape {
            key_size,
            val_size,
            key_space,
        },
    );
    let events = wr.watch_events;
    r.watch = Some(wr);
    if let (Some(cpu), true) = (r.server_cpu_s, events > 0) {
        r.set("server_cpu_us_per_event", r3(cpu * 1e6 / events as f64));
    }
    Ok(r)
}

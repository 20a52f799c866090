//! `put`: plain Puts over a key space, the shape of etcd's
//! `benchmark put --clients 100 --conns 10 --key-size 48 --val-size 1024`.

use crate::driver::{measure, Shape, Worker};
use crate::keys::{padded_key, value_with};
use crate::options::Common;
use crate::pool::{call, Kv, Pool};
use crate::record::Recorder;
use crate::report::Report;
use bytes::Bytes;
use ephd::proto::etcdserverpb::PutRequest;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::{Duration, Instant};

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

/// One client: a Put of a random (or the next) key per op.
struct Putter {
    kv: Kv,
    rng: StdRng,
    prefix: Arc<str>,
    value: Bytes,
    sequential: bool,
    key_space: u64,
    key_size: usize,
    timeout: Duration,
}

impl Worker for Putter {
    async fn op(&mut self, n: u64, rec: &mut Recorder) -> ControlFlow<()> {
        let k = if self.sequential {
            n % self.key_space
        } else {
            self.rng.random_range(0..self.key_space)
        };
        let req = PutRequest {
            key: padded_key(&self.prefix, k, self.key_size),
            value: self.value.clone(),
            ..Default::default()
        };
        let t0 = Instant::now();
        match call(self.timeout, self.kv.put(req)).await {
            Ok(_) => rec.ok(t0),
            Err(e) => rec.err(&e),
        }
        ControlFlow::Continue(())
    }
}

/// Defaults: 100 clients, 100,000 puts, key 48 B, value 1 KiB, key space 100,000.
pub async fn run(c: &Common, a: &Args) -> Result<Report, String> {
    let clients = c.clients_or(100);
    let key_size = c.key_size.unwrap_or(48);
    let val_size = c.val_size_or(1024);
    let key_space = c.key_space_or(100_000);
    let pool = Pool::connect(c).await?;
    let value = value_with("", val_size);
    let prefix: Arc<str> = a.prefix.as_str().into();

    let workers = (0..clients)
        .map(|i| Putter {
            kv: pool.kv(i),
            rng: StdRng::seed_from_u64(rand::random()),
            prefix: prefix.clone(),
            value: value.clone(),
            sequential: a.sequential_keys,
            key_space,
            key_size,
            timeout: c.timeout,
        })
        .collect();
    let m = measure(c, "put", 100_000, workers).await;
    Ok(m.report(
        pool.len(),
        Shape {
            key_size,
            val_size,
            key_space,
        },
    ))
}

//! `range`: full-prefix lists, the apiserver's LIST of a resource.
//!
//! N objects (~1 KiB) are preloaded under a fresh prefix, then each measured
//! op lists the whole prefix: one Range, or with `--page-size` a chain of
//! pages where every page after the first is pinned to the first page's
//! revision and continues from the last key + "\x00" (what the apiserver
//! does with `limit`/`continue`). Every list must return all N objects.

use crate::budget::Budget;
use crate::cpu::CpuSample;
use crate::keys::{prefix_end, run_nonce, value_with};
use crate::options::Common;
use crate::pool::{call, Pool};
use crate::progress::Progress;
use crate::record::{join_all, Recorder};
use crate::report::{r3, Report};
use bytes::Bytes;
use ephd::proto::etcdserverpb::{PutRequest, RangeRequest};
use std::sync::Arc;
use std::time::Instant;

/// Options of `range`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Objects to preload and list [default: --key-space, else 10000].
    #[arg(long)]
    pub objects: Option<u64>,
    /// Objects per page (0 = one unpaginated Range per list).
    #[arg(long, default_value_t = 0)]
    pub page_size: i64,
    /// Parent prefix; objects go under <prefix>bench-<random>/.
    #[arg(long, default_value = "/registry/pods/")]
    pub prefix: String,
    /// Serializable reads (etcd skips the linearizability round).
    #[arg(long)]
    pub serializable: bool,
}

/// Defaults: 10,000 objects of 1 KiB, 10 clients, 200 lists.
pub async fn run(c: &Common, a: &Args) -> Result<Report, String> {
    let objects = a.objects.or(c.key_space).unwrap_or(10_000).max(1);
    let clients = c.clients_or(10);
    let val_size = c.val_size_or(1024);
    let pool = Arc::new(Pool::connect(c).await?);
    let list_prefix = Bytes::from(format!("{}bench-{:08x}/", a.prefix, run_nonce()));
    let list_end = prefix_end(&list_prefix);
    let key = {
        let p = String::from_utf8_lossy(&list_prefix).into_owned();
        move |i: u64| Bytes::from(format!("{p}{i:08}"))
    };

    // Preload (not measured), with up to 100 concurrent puts.
    let spinner = Progress::spinner(c.progress_enabled(), "preloading objects");
    let preload = Budget::fixed(objects, c.max_time);
    let value = value_with("", val_size);
    let mut handles = Vec::new();
    for i in 0..clients.clamp(10, 100) {
        let mut kv = pool.kv(i);
        let budget = preload.clone();
        let value = value.clone();
        let timeout = c.timeout;
        let key = key.clone();
        handles.push(tokio::spawn(async move {
            let mut rec = Recorder::default();
            while let Some(n) = budget.next().await {
                let t0 = Instant::now();
                let req = PutRequest {
                    key: key(n),
                    value: value.clone(),
                    ..Default::default()
                };
                match call(timeout, kv.put(req)).await {
                    Ok(_) => rec.ok(t0),
                    Err(e) => rec.err(&e),
                }
            }
            rec
        }));
    }
    let loaded = join_all(handles).await;
    spinner.finish();
    if loaded.errors.total() > 0 || loaded.ops != objects {
        return Err(format!(
            "preload wrote {} of {objects} objects: {:?}",
            loaded.ops, loaded.errors.samples
        ));
    }

    let budget = c.budget(200);
    let progress = Progress::for_budget(c.progress_enabled(), "range", budget.clone());
    let cpu0 = CpuSample::take(c.server_pid);
    let mut handles = Vec::new();
    for ci in 0..clients {
        let mut kv = pool.kv(ci);
        let budget = budget.clone();
        let (start, end) = (list_prefix.clone(), list_end.clone());
        let (page_size, serializable, timeout) = (a.page_size.max(0), a.serializable, c.timeout);
        handles.push(tokio::spawn(async move {
            let mut rec = Recorder::default();
            'lists: while budget.next().await.is_some() {
                let t0 = Instant::now();
                let (mut from, mut rev, mut got, mut bytes, mut pages) =
                    (start.clone(), 0, 0, 0, 0);
                loop {
                    let req = RangeRequest {
                        key: from.clone(),
                        range_end: end.clone(),
                        limit: page_size,
                        revision: rev,
                        serializable,
                        ..Default::default()
                    };
                    let resp = match call(timeout, kv.range(req)).await {
                        Ok(r) => r,
                        Err(e) => {
                            rec.err(&e);
                            budget.complete();
                            continue 'lists;
                        }
                    };
                    pages += 1;
                    if rev == 0 {
                        rev = crate::ops::header_rev(&resp.header);
                    }
                    got += resp.kvs.len() as u64;
                    bytes += resp
                        .kvs
                        .iter()
                        .map(|kv| (kv.key.len() + kv.value.len()) as u64)
                        .sum::<u64>();
                    match resp.kvs.last() {
                        Some(last) if resp.more && page_size > 0 => {
                            let mut next = last.key.to_vec();
                            next.push(0);
                            from = Bytes::from(next);
                        }
                        _ => break,
                    }
                }
                if got == objects {
                    rec.ok(t0);
                } else {
                    rec.err(&(
                        "incomplete list".into(),
                        format!("a list returned {got} of {objects} objects"),
                    ));
                }
                rec.count("pages", pages);
                rec.count("bytes", bytes);
                budget.complete();
            }
            rec
        }));
    }
    let mut rec = join_all(handles).await;
    let elapsed = budget.start().elapsed();
    let cpu1 = CpuSample::take(c.server_pid);
    progress.finish();

    let pages = rec.counters.remove("pages").unwrap_or(0);
    let bytes = rec.counters.remove("bytes").unwrap_or(0);
    let mut r = Report::new("range", &rec, elapsed);
    r.clients = clients;
    r.conns = pool.len();
    r.key_size = key(0).len();
    r.val_size = val_size;
    r.key_space = objects;
    r.truncated = budget.truncated();
    r.set("page_size", a.page_size);
    r.set(
        "pages_per_list",
        r3(pages as f64 / (rec.ops + rec.errors.total()).max(1) as f64),
    );
    r.set(
        "mb_per_s",
        r3(bytes as f64 / 1e6 / elapsed.as_secs_f64().max(1e-9)),
    );
    r.set("serializable", a.serializable);
    r.add_cpu(&cpu0, &cpu1, c.server_pid);
    Ok(r)
}

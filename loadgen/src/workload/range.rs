//! `range`: full-prefix lists, the apiserver's LIST of a resource.
//!
//! N objects (~1 KiB) are preloaded under a fresh prefix, then each measured
//! op lists the whole prefix: one Range, or with `--page-size` a chain of
//! pages where every page after the first is pinned to the first page's
//! revision and continues from the last key + "\x00" (what the apiserver
//! does with `limit`/`continue`). Every list must return all N objects.

use crate::driver::{measure, setup, Shape, Worker};
use crate::keys::{prefix_end, run_nonce, value_with};
use crate::ops::header_rev;
use crate::options::Common;
use crate::pool::{call, Kv, Pool};
use crate::record::Recorder;
use crate::report::{r3, Report};
use bytes::Bytes;
use ephd::proto::etcdserverpb::{PutRequest, RangeRequest};
use std::ops::ControlFlow;
use std::time::{Duration, Instant};

/// Options of `range`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Objects to preload and list [default: --key-space, else 10000].
    #[arg(long)]
    pub objects: Option<u64>,
    /// Objects per page (0 = one unpaginated Range per list).
    #[arg(long, default_value_t = 0)]
    pub page_size: i64,
    /// Parent prefix; objects go under `<prefix>bench-<random>/`.
    #[arg(long, default_value = "/registry/pods/")]
    pub prefix: String,
    /// Serializable reads (etcd skips the linearizability round).
    #[arg(long)]
    pub serializable: bool,
}

/// The key of object `i` under the run's list prefix.
fn object_key(list_prefix: &Bytes, i: u64) -> Bytes {
    let mut key = list_prefix.to_vec();
    key.extend_from_slice(format!("{i:08}").as_bytes());
    Bytes::from(key)
}

/// Setup: one client writing objects, the op index naming the object.
struct Loader {
    kv: Kv,
    list_prefix: Bytes,
    value: Bytes,
    timeout: Duration,
}

impl Worker for Loader {
    async fn op(&mut self, n: u64, rec: &mut Recorder) -> ControlFlow<()> {
        let t0 = Instant::now();
        let req = PutRequest {
            key: object_key(&self.list_prefix, n),
            value: self.value.clone(),
            ..Default::default()
        };
        match call(self.timeout, self.kv.put(req)).await {
            Ok(_) => rec.ok(t0),
            Err(e) => rec.err(&e),
        }
        ControlFlow::Continue(())
    }
}

/// Measured: one client listing the whole prefix per op, page by page.
struct Lister {
    kv: Kv,
    start: Bytes,
    end: Bytes,
    objects: u64,
    page_size: i64,
    serializable: bool,
    timeout: Duration,
}

impl Worker for Lister {
    async fn op(&mut self, _: u64, rec: &mut Recorder) -> ControlFlow<()> {
        let t0 = Instant::now();
        let (mut from, mut rev, mut got, mut bytes, mut pages) = (self.start.clone(), 0, 0, 0, 0);
        loop {
            let req = RangeRequest {
                key: from.clone(),
                range_end: self.end.clone(),
                limit: self.page_size,
                revision: rev,
                serializable: self.serializable,
                ..Default::default()
            };
            let resp = match call(self.timeout, self.kv.range(req)).await {
                Ok(r) => r,
                Err(e) => {
                    rec.err(&e);
                    return ControlFlow::Continue(());
                }
            };
            pages += 1;
            if rev == 0 {
                rev = header_rev(&resp.header);
            }
            got += resp.kvs.len() as u64;
            bytes += resp
                .kvs
                .iter()
                .map(|kv| (kv.key.len() + kv.value.len()) as u64)
                .sum::<u64>();
            match resp.kvs.last() {
                Some(last) if resp.more && self.page_size > 0 => {
                    let mut next = last.key.to_vec();
                    next.push(0);
                    from = Bytes::from(next);
                }
                _ => break,
            }
        }
        if got == self.objects {
            rec.ok(t0);
        } else {
            rec.err(&(
                "incomplete list".into(),
                format!("a list returned {got} of {} objects", self.objects),
            ));
        }
        rec.count("pages", pages);
        rec.count("bytes", bytes);
        ControlFlow::Continue(())
    }
}

/// Defaults: 10,000 objects of 1 KiB, 10 clients, 200 lists.
pub async fn run(c: &Common, a: &Args) -> Result<Report, String> {
    let objects = a.objects.or(c.key_space).unwrap_or(10_000).max(1);
    let clients = c.clients_or(10);
    let val_size = c.val_size_or(1024);
    let pool = Pool::connect(c).await?;
    let list_prefix = Bytes::from(format!("{}bench-{:08x}/", a.prefix, run_nonce()));
    let list_end = prefix_end(&list_prefix);

    // Preload (not measured), with up to 100 concurrent puts.
    let value = value_with("", val_size);
    let loaders = (0..clients.clamp(10, 100))
        .map(|i| Loader {
            kv: pool.kv(i),
            list_prefix: list_prefix.clone(),
            value: value.clone(),
            timeout: c.timeout,
        })
        .collect();
    let (_, loaded) = setup(c, "preloading objects", objects, loaders).await;
    if loaded.errors.total() > 0 || loaded.ops != objects {
        return Err(format!(
            "preload wrote {} of {objects} objects: {:?}",
            loaded.ops, loaded.errors.samples
        ));
    }

    let listers = (0..clients)
        .map(|ci| Lister {
            kv: pool.kv(ci),
            start: list_prefix.clone(),
            end: list_end.clone(),
            objects,
            page_size: a.page_size.max(0),
            serializable: a.serializable,
            timeout: c.timeout,
        })
        .collect();
    let mut m = measure(c, "range", 200, listers).await;
    let pages = m.rec.counters.remove("pages").unwrap_or(0);
    let bytes = m.rec.counters.remove("bytes").unwrap_or(0);
    let mut r = m.report(
        pool.len(),
        Shape {
            key_size: object_key(&list_prefix, 0).len(),
            val_size,
            key_space: objects,
        },
    );
    r.set("page_size", a.page_size);
    r.set(
        "pages_per_list",
        r3(pages as f64 / (m.rec.ops + m.rec.errors.total()).max(1) as f64),
    );
    r.set(
        "mb_per_s",
        r3(bytes as f64 / 1e6 / m.elapsed().as_secs_f64().max(1e-9)),
    );
    r.set("serializable", a.serializable);
    Ok(r)
}

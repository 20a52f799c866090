//! `storm`: list storms against a heartbeat (issue #9, item 2).
//!
//! When many apiservers (or many informers after a restart) relist a big
//! resource at once, every list is a full Range of a ~10 MB prefix, and the
//! server must build and send hundreds of them together. What must not
//! happen meanwhile is that the small writes keeping nodes alive (Lease
//! renewals) stall, or that the server's memory runs away. This workload
//! reproduces that:
//!
//! 1. preload `--objects` Event-like objects (~1 KiB) under `--prefix`
//!    (not measured), then one warm-up list (not measured: it gives the
//!    reply size);
//! 2. start the heartbeat writer (`beat`): one small write every
//!    `--heartbeat-interval`, open-loop, on its own connection to
//!    `--heartbeat-endpoint` (default: the first of `--endpoints`);
//! 3. a quiet `--baseline`, then `--storms` storms, each of `--lists`
//!    concurrent full lists of the prefix over `--conns` connections,
//!    with `--pause` between storms; a list answered ResourceExhausted
//!    ("etcdserver: too many requests") or Unavailable is retried up to
//!    `--retries` times with a doubling `--backoff`;
//! 4. `--settle`, then the server's RSS: the memory given back.
//!
//! The report has, per storm and overall: lists that succeeded, retries,
//! failures, list rate and times; the heartbeat's latency (from its due
//! time) and failures during the storms, the baseline and the settle; the
//! server's peak RSS (VmHWM), its sampled RSS (max, and a series) and its
//! RSS after the settle. Sending the storm to another server
//! (`--endpoints`) than the heartbeat (`--heartbeat-endpoint`) gives the
//! machine's floor: the heartbeat's latency when only the cores are shared.
//!
//! Lists are read by counting their keys as they stream in (`wire`), so
//! the client's memory does not grow with the storm; a list returning
//! fewer keys than were preloaded is an error. The exit status is 3 when a
//! list failed; heartbeat failures are reported (`hb_*_failures`) but do
//! not change it.

mod beat;
mod lists;
mod rss;
#[cfg(test)]
mod tests;
mod wire;

use crate::cpu::CpuSample;
use crate::driver::{setup, Worker};
use crate::keys::{prefix_end, run_nonce, value_with};
use crate::ops::count_prefix;
use crate::options::{parse_duration, Common, Transport};
use crate::pool::{call, resolve_endpoint, Kv, Pool};
use crate::progress::Progress;
use crate::record::{histogram, Errors, Recorder};
use crate::report::{r3, Report};
use beat::{Beat, BeatConfig, BeatOp, Heartbeat};
use bytes::Bytes;
use ephd::proto::etcdserverpb::PutRequest;
use lists::{range_request, storm, Conn, ListSpec};
use serde_json::{json, Map, Value};
use std::ops::ControlFlow;
use std::time::{Duration, Instant};

/// Options of `storm`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Objects to preload under the prefix [default: --key-space, else 10000].
    #[arg(long)]
    pub objects: Option<u64>,
    /// Namespaces the objects are spread over (keys `<prefix>ns-NNN/...`).
    #[arg(long, default_value_t = 100)]
    pub namespaces: u64,
    /// The prefix every list reads in full.
    #[arg(long, default_value = "/registry/events/")]
    pub prefix: String,
    /// Storms to send.
    #[arg(long, default_value_t = 3)]
    pub storms: usize,
    /// Concurrent lists per storm: one value for every storm, or a
    /// comma-separated value per storm (the last one repeats).
    #[arg(long, value_delimiter = ',', default_value = "300")]
    pub lists: Vec<u64>,
    /// Pause between two storms.
    #[arg(long, value_parser = parse_duration, default_value = "5s")]
    pub pause: Duration,
    /// Heartbeats alone before the first storm (the quiet baseline).
    #[arg(long, value_parser = parse_duration, default_value = "5s")]
    pub baseline: Duration,
    /// Wait after the last storm before reading the server's RSS again.
    #[arg(long, value_parser = parse_duration, default_value = "60s")]
    pub settle: Duration,
    /// Retries of a list answered ResourceExhausted or Unavailable.
    #[arg(long, default_value_t = 3)]
    pub retries: u32,
    /// Wait before a list's first retry; doubled for each next one (±20%).
    #[arg(long, value_parser = parse_duration, default_value = "50ms")]
    pub backoff: Duration,
    /// Bound on each attempt of a list; a slower one fails (not retried).
    #[arg(long, value_parser = parse_duration, default_value = "120s")]
    pub list_timeout: Duration,
    /// Serializable lists (etcd skips the linearizability round).
    #[arg(long)]
    pub serializable: bool,
    /// Where the heartbeats go [default: the first of --endpoints]; another
    /// server than the storm's gives the machine's floor.
    #[arg(long)]
    pub heartbeat_endpoint: Option<String>,
    /// Time between two heartbeats.
    #[arg(long, value_parser = parse_duration, default_value = "5ms")]
    pub heartbeat_interval: Duration,
    /// What a heartbeat sends: a Put, or the apiserver's CAS Txn.
    #[arg(long, value_enum, default_value_t = BeatOp::Put)]
    pub heartbeat_op: BeatOp,
    /// Lease keys the heartbeats write in turn. With `cas`, a write due
    /// while the previous write of its key is still unanswered (a stall
    /// longer than keys × interval) compares against a stale revision and
    /// finds the key moved: counted in `hb_cas_failures`, not as a failure.
    #[arg(long, default_value_t = 100)]
    pub heartbeat_keys: u64,
    /// Heartbeat value size, bytes.
    #[arg(long, default_value_t = 300)]
    pub heartbeat_size: usize,
    /// Bound on each heartbeat; a slower one is a failure.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    pub heartbeat_timeout: Duration,
    /// Period of the server RSS samples (with --server-pid).
    #[arg(long, value_parser = parse_duration, default_value = "100ms")]
    pub rss_every: Duration,
}

/// The key of object `i`: `<prefix>ns-NNN/storm-<nonce>-NNNNNN`.
fn object_key(prefix: &str, namespaces: u64, nonce: u32, i: u64) -> Bytes {
    let ns = i % namespaces.max(1);
    Bytes::from(format!("{prefix}ns-{ns:03}/storm-{nonce:08x}-{i:06}"))
}

/// Setup: one client writing Event-like objects, the op index naming one.
struct Loader {
    kv: Kv,
    prefix: String,
    namespaces: u64,
    nonce: u32,
    val_size: usize,
    timeout: Duration,
}

impl Worker for Loader {
    async fn op(&mut self, n: u64, rec: &mut Recorder) -> ControlFlow<()> {
        let t0 = Instant::now();
        let key = object_key(&self.prefix, self.namespaces, self.nonce, n);
        let ns = n % self.namespaces.max(1);
        let value = value_with(
            &format!(
                "{{\"kind\":\"Event\",\"apiVersion\":\"v1\",\"metadata\":{{\"name\":\"storm-{:08x}-{n:06}\",\"namespace\":\"ns-{ns:03}\"}},\"reason\":\"Scheduled\",\"type\":\"Normal\",\"count\":1,\"message\":\"",
                self.nonce
            ),
            self.val_size,
        );
        let req = PutRequest {
            key,
            value,
            ..Default::default()
        };
        match call(self.timeout, self.kv.put(req)).await {
            Ok(_) => rec.ok(t0),
            Err(e) => rec.err(&e),
        }
        ControlFlow::Continue(())
    }
}

/// A time window of the run, from its epoch: `[from, to)`.
#[derive(Clone, Copy)]
struct Window {
    from: Duration,
    to: Duration,
}

impl Window {
    fn holds(&self, t: Duration) -> bool {
        t >= self.from && t < self.to
    }
}

/// The heartbeat's figures over the writes due in some windows, as JSON
/// fields named `<name>_...`: writes, failures, latency from the due time
/// (p50/p99/p99.9/max) and from the send (p99/max).
///
/// A write that timed out is a failure, and its latency (the timeout, a
/// lower bound) is also kept in the percentiles: leaving it out would make
/// a stall longer than `--heartbeat-timeout` look shorter the longer it
/// lasts. Writes refused with an answer (e.g. Unavailable from a server
/// that went away) count as failures only.
fn beat_fields(out: &mut Map<String, Value>, name: &str, beats: &[Beat], windows: &[Window]) {
    let mut late = histogram();
    let mut service = histogram();
    let (mut n, mut failures) = (0u64, 0u64);
    for b in beats
        .iter()
        .filter(|b| windows.iter().any(|w| w.holds(b.due)))
    {
        n += 1;
        if let Some((kind, _)) = &b.err {
            failures += 1;
            if kind != "timeout" {
                continue;
            }
        }
        late.saturating_record(b.late_us.max(1));
        service.saturating_record(b.service_us.max(1));
    }
    let q = |h: &hdrhistogram::Histogram<u64>, x: f64| {
        if h.is_empty() {
            0.0
        } else {
            r3(h.value_at_quantile(x) as f64 / 1000.0)
        }
    };
    let max = |h: &hdrhistogram::Histogram<u64>| {
        if h.is_empty() {
            0.0
        } else {
            r3(h.max() as f64 / 1000.0)
        }
    };
    out.insert(format!("{name}_n"), n.into());
    out.insert(format!("{name}_failures"), failures.into());
    out.insert(format!("{name}_p50_ms"), q(&late, 0.5).into());
    out.insert(format!("{name}_p99_ms"), q(&late, 0.99).into());
    out.insert(format!("{name}_p999_ms"), q(&late, 0.999).into());
    out.insert(format!("{name}_max_ms"), max(&late).into());
    out.insert(format!("{name}_service_p99_ms"), q(&service, 0.99).into());
    out.insert(format!("{name}_service_max_ms"), max(&service).into());
}

/// One storm's results, kept for the report.
struct StormRun {
    lists: u64,
    window: Window,
    out: lists::StormOutcome,
    cpu0: CpuSample,
    cpu1: CpuSample,
}

/// Sleeps `d` behind a spinner saying `what`.
async fn wait(c: &Common, what: &str, d: Duration) {
    let spinner = Progress::spinner(c.progress_enabled(), what);
    tokio::time::sleep(d).await;
    spinner.finish();
}

/// Defaults: 10,000 objects of 1 KiB, 3 storms of 300 lists over 10
/// connections, a 300-byte Put every 5 ms.
pub async fn run(c: &Common, a: &Args) -> Result<Report, String> {
    let epoch = Instant::now();
    let objects = a.objects.or(c.key_space).unwrap_or(10_000).max(1);
    let val_size = c.val_size_or(1024);
    if a.storms == 0 || a.lists.is_empty() || a.lists.contains(&0) {
        return Err("storm needs --storms ≥ 1 and --lists ≥ 1".into());
    }
    let plan: Vec<u64> = (0..a.storms)
        .map(|i| *a.lists.get(i).unwrap_or(a.lists.last().expect("checked")))
        .collect();
    let addrs = c
        .endpoints
        .iter()
        .map(|e| resolve_endpoint(e))
        .collect::<Result<Vec<_>, _>>()?;
    let hb_endpoint = a
        .heartbeat_endpoint
        .clone()
        .unwrap_or_else(|| c.endpoints[0].clone());
    resolve_endpoint(&hb_endpoint)?;

    // Preload (not measured).
    let nonce = run_nonce();
    let pool = Pool::connect(c).await?;
    let loaders = (0..c.clients_or(50).min(100))
        .map(|i| Loader {
            kv: pool.kv(i),
            prefix: a.prefix.clone(),
            namespaces: a.namespaces,
            nonce,
            val_size,
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
    let prefix = Bytes::from(a.prefix.clone());
    let present = count_prefix(&pool, &prefix, c.timeout).await?;
    drop(pool);

    // The storm's connections, and one warm-up list.
    let conns: Vec<_> = (0..c.conns())
        .map(|i| Conn::new(addrs[i % addrs.len()]))
        .collect();
    let spec = ListSpec {
        request: range_request(&prefix, &prefix_end(&prefix), a.serializable),
        expect: objects,
        timeout: a.list_timeout,
        retries: a.retries,
        backoff: a.backoff,
    };
    let warm = storm(&conns, &spec, 1, a.list_timeout * (a.retries + 1)).await;
    if warm.rec.ops != 1 {
        return Err(format!(
            "the warm-up list failed: {:?}",
            warm.rec.errors.samples
        ));
    }
    let reply_bytes = warm.rec.counters.get("bytes").copied().unwrap_or(0);

    // Heartbeats and RSS samples from here on.
    let sampler = c
        .server_pid
        .map(|pid| rss::Sampler::start(pid, epoch, a.rss_every))
        .transpose()?;
    let mut hc = c.clone();
    hc.endpoints = vec![hb_endpoint.clone()];
    hc.conns = Some(1);
    hc.transport = Transport::H2;
    let hb = Heartbeat::start(BeatConfig {
        common: hc,
        interval: a.heartbeat_interval.max(Duration::from_micros(100)),
        op: a.heartbeat_op,
        keys: a.heartbeat_keys,
        val_size: a.heartbeat_size,
        timeout: a.heartbeat_timeout,
        epoch,
    })
    .await?;
    let base_from = epoch.elapsed();
    wait(c, "quiet baseline", a.baseline).await;
    let baseline = Window {
        from: base_from,
        to: epoch.elapsed(),
    };

    let mut runs = Vec::new();
    for (k, &n) in plan.iter().enumerate() {
        if k > 0 {
            wait(c, "pause between storms", a.pause).await;
        }
        let spinner = Progress::spinner(
            c.progress_enabled(),
            &format!("storm {}/{}: {n} lists", k + 1, plan.len()),
        );
        let cpu0 = CpuSample::take(c.server_pid);
        let from = epoch.elapsed();
        let out = storm(&conns, &spec, n, c.max_time).await;
        let to = epoch.elapsed();
        let cpu1 = CpuSample::take(c.server_pid);
        spinner.finish();
        runs.push(StormRun {
            lists: n,
            window: Window { from, to },
            out,
            cpu0,
            cpu1,
        });
    }
    let settle_from = epoch.elapsed();
    wait(c, "settling", a.settle).await;
    let rss_after = c.server_pid.and_then(rss::rss_mb);
    let settle = Window {
        from: settle_from,
        to: epoch.elapsed(),
    };
    let beats = hb.stop().await?;
    let samples = sampler.map(rss::Sampler::stop).unwrap_or_default();

    // The report: lists as the ops, over the storms' time.
    let mut all = Recorder::default();
    let mut retry_kinds = Errors::default();
    let mut storm_time = Duration::ZERO;
    let mut per_storm = Vec::new();
    for s in &runs {
        let mut m = Map::new();
        let rec = &s.out.rec;
        let secs = s.out.elapsed.as_secs_f64().max(1e-9);
        let q = |x: f64| {
            if rec.hist.is_empty() {
                0.0
            } else {
                r3(rec.hist.value_at_quantile(x) as f64 / 1000.0)
            }
        };
        m.insert("lists".into(), s.lists.into());
        m.insert("ok".into(), rec.ops.into());
        m.insert("failures".into(), rec.errors.total().into());
        let counter = |k: &str| rec.counters.get(k).copied().unwrap_or(0);
        m.insert("retries".into(), counter("retries").into());
        m.insert("cut".into(), s.out.cut.into());
        m.insert("elapsed_s".into(), r3(secs).into());
        m.insert("lists_per_s".into(), r3(rec.ops as f64 / secs).into());
        m.insert("list_p50_ms".into(), q(0.5).into());
        m.insert("list_p99_ms".into(), q(0.99).into());
        m.insert("list_max_ms".into(), q(1.0).into());
        if !rec.errors.by_kind.is_empty() {
            m.insert("error_kinds".into(), json!(rec.errors.by_kind));
        }
        beat_fields(&mut m, "hb", &beats, &[s.window]);
        if !samples.is_empty() {
            let mb = rss::max_between(&samples, s.window.from, s.window.to);
            m.insert("rss_max_mb".into(), mb.round().into());
        }
        let d = s.cpu0.delta(&s.cpu1);
        if let Some(cpu) = d.server_s {
            m.insert("server_cpu_s".into(), r3(cpu).into());
        }
        if let Some(f) = d.other_frac {
            m.insert("other_cpu_frac".into(), r3(f).into());
        }
        per_storm.push(Value::Object(m));
        storm_time += s.out.elapsed;
    }
    for s in runs.iter_mut() {
        let rec = std::mem::take(&mut s.out.rec);
        all.merge(rec);
        retry_kinds.merge(std::mem::take(&mut s.out.retry_kinds));
    }
    let list_bytes = all.counters.remove("bytes").unwrap_or(0);
    all.count("retries", 0);
    all.count("retries_exhausted", 0);
    let mut r = Report::new("storm", &all, storm_time);
    r.clients = plan.iter().copied().max().unwrap_or(0) as usize;
    r.conns = conns.len();
    r.key_size = object_key(&a.prefix, a.namespaces, nonce, 0).len();
    r.val_size = val_size;
    r.key_space = objects;
    if let (Some(first), Some(last)) = (runs.first(), runs.last()) {
        r.add_cpu(&first.cpu0, &last.cpu1, c.server_pid);
    }

    let mut x = Map::new();
    x.insert("storms".into(), plan.len().into());
    x.insert("lists_plan".into(), json!(plan));
    x.insert("objects".into(), objects.into());
    x.insert("list_keys".into(), present.into());
    x.insert("list_reply_mb".into(), r3(reply_bytes as f64 / 1e6).into());
    x.insert(
        "list_mb_received".into(),
        r3(list_bytes as f64 / 1e6).into(),
    );
    x.insert("lists_per_s".into(), r.ops_per_s.into());
    x.insert("list_failures".into(), r.errors.into());
    let mut reconnects = 0;
    for conn in &conns {
        reconnects += conn.opened().await.saturating_sub(1);
    }
    x.insert("list_reconnects".into(), reconnects.into());
    if !retry_kinds.by_kind.is_empty() {
        x.insert("retry_kinds".into(), json!(retry_kinds.by_kind));
        x.insert("retry_samples".into(), json!(retry_kinds.samples));
    }
    x.insert("storm_detail".into(), Value::Array(per_storm));
    x.insert("hb_endpoint".into(), hb_endpoint.into());
    x.insert(
        "hb_interval_ms".into(),
        r3(a.heartbeat_interval.as_secs_f64() * 1000.0).into(),
    );
    x.insert(
        "hb_op".into(),
        match a.heartbeat_op {
            BeatOp::Put => "put",
            BeatOp::Cas => "cas",
        }
        .into(),
    );
    x.insert("hb_sent".into(), beats.len().into());
    let storm_windows: Vec<Window> = runs.iter().map(|s| s.window).collect();
    beat_fields(&mut x, "hb_baseline", &beats, &[baseline]);
    beat_fields(&mut x, "hb_storms", &beats, &storm_windows);
    beat_fields(&mut x, "hb_settle", &beats, &[settle]);
    let mut hb_errors = Errors::default();
    for (k, m) in beats.iter().filter_map(|b| b.err.as_ref()) {
        hb_errors.add(k, m);
    }
    x.insert("hb_failures".into(), hb_errors.total().into());
    if !hb_errors.by_kind.is_empty() {
        x.insert("hb_error_kinds".into(), json!(hb_errors.by_kind));
        x.insert("hb_error_samples".into(), json!(hb_errors.samples));
    }
    if a.heartbeat_op == BeatOp::Cas {
        let cas = beats.iter().filter(|b| b.cas_failed).count();
        x.insert("hb_cas_failures".into(), cas.into());
    }
    if !samples.is_empty() {
        let all_time = Window {
            from: Duration::ZERO,
            to: Duration::MAX,
        };
        let mb = |w: Window| rss::max_between(&samples, w.from, w.to).round();
        x.insert("rss_baseline_mb".into(), mb(baseline).into());
        x.insert("rss_max_mb".into(), mb(all_time).into());
        x.insert(
            "rss_series_mb".into(),
            json!(rss::series(&samples, Duration::from_secs(1))),
        );
    }
    if let Some(mb) = rss_after {
        x.insert("rss_after_settle_mb".into(), mb.round().into());
    }
    x.insert("settle_s".into(), r3(a.settle.as_secs_f64()).into());
    for (k, v) in x {
        r.set(&k, v);
    }
    Ok(r)
}

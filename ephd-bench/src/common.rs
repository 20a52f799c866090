//! What every workload shares: the global options, connections, the op
//! budget (count, duration, rate), latency/error recording, CPU sampling of
//! the server and of this process, and the progress bar.

use crate::h2rpc;
use bytes::Bytes;
use clap::Args;
use ephd::proto::etcdserverpb::{
    kv_client::KvClient, lease_client::LeaseClient, watch_client::WatchClient, PutRequest,
    PutResponse, RangeRequest, RangeResponse, TxnRequest, TxnResponse,
};
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::collections::BTreeMap;
use std::future::Future;
use std::io::IsTerminal;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;
use tonic::transport::{Channel, Endpoint};

/// Options shared by every workload. Those left unset take the workload's
/// own default (shown in each subcommand's help).
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Common options")]
pub struct Common {
    /// Comma-separated endpoints (host:port or http://host:port); loopback only.
    #[arg(
        long,
        global = true,
        value_delimiter = ',',
        default_value = "127.0.0.1:2379"
    )]
    pub endpoints: Vec<String>,

    /// HTTP/2 connections, spread round-robin over the endpoints [default: 10].
    #[arg(long, global = true)]
    pub conns: Option<usize>,

    /// Concurrent in-flight requests, spread over the connections [default: per workload].
    #[arg(long, global = true)]
    pub clients: Option<usize>,

    /// Measured operations [default: per workload, unless --duration is given].
    #[arg(long, global = true)]
    pub total: Option<u64>,

    /// Measure for this long instead of (or as well as) --total: 10s, 500ms, 2m.
    #[arg(long, global = true, value_parser = parse_duration)]
    pub duration: Option<Duration>,

    /// Key size in bytes (put: 48; other workloads use Kubernetes-shaped keys).
    #[arg(long, global = true)]
    pub key_size: Option<usize>,

    /// Value size in bytes [default: per workload].
    #[arg(long, global = true)]
    pub val_size: Option<usize>,

    /// Number of distinct keys written [default: per workload].
    #[arg(long, global = true)]
    pub key_space: Option<u64>,

    /// Target ops/s over all clients (0 = as fast as possible).
    #[arg(long, global = true, default_value_t = 0.0)]
    pub rate: f64,

    /// Server process to sample: CPU (utime+stime) per op and peak RSS (VmHWM).
    #[arg(long, global = true)]
    pub server_pid: Option<u32>,

    /// Print one machine-readable JSON line on stdout instead of the summary.
    #[arg(long, global = true)]
    pub json: bool,

    /// Free-form label copied into the result (e.g. "etcd" or "ephd").
    #[arg(long, global = true)]
    pub label: Option<String>,

    /// Per-request timeout; a request that takes longer counts as an error.
    #[arg(long, global = true, value_parser = parse_duration, default_value = "30s")]
    pub timeout: Duration,

    /// Hard bound on each phase (setup, measurement); the run stops there.
    #[arg(long, global = true, value_parser = parse_duration, default_value = "10m")]
    pub max_time: Duration,

    /// How long to wait, after the last write, for watchers to catch up.
    #[arg(long, global = true, value_parser = parse_duration, default_value = "10s")]
    pub drain_timeout: Duration,

    /// Client threads [default: 1]. With 1 the whole client runs on one
    /// thread (tokio's current-thread runtime): its CPU per op is lowest
    /// there, as no thread wakes another to hand work over, and the cores
    /// are shared with the server anyway. More threads use tokio's
    /// multi-thread runtime.
    #[arg(long, global = true)]
    pub threads: Option<usize>,

    /// Never draw the progress bar (it is off anyway when stderr is not a TTY).
    #[arg(long, global = true)]
    pub no_progress: bool,

    /// How KV requests (Put, Range, Txn) are sent. `h2`: a lean unary gRPC
    /// client on raw HTTP/2, about half the client CPU per request, so the
    /// client takes less of the cores it shares with the server. `tonic`:
    /// tonic's Channel (tower buffer + hyper), the previous path, kept for
    /// comparison. Watch and Lease always use tonic.
    #[arg(long, global = true, value_enum, default_value_t = Transport::H2)]
    pub transport: Transport,
}

/// The client stack that carries unary KV requests (`--transport`).
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// The lean client in `h2rpc`: one HEADERS and one DATA frame per
    /// request straight on h2, no tower or hyper layers.
    H2,
    /// tonic's generated `KvClient` over a `Channel`.
    Tonic,
}

impl Transport {
    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Transport::H2 => "h2",
            Transport::Tonic => "tonic",
        }
    }
}

impl Common {
    /// `--conns`, or 10.
    pub fn conns(&self) -> usize {
        self.conns.unwrap_or(10).max(1)
    }

    /// `--threads`, or 1.
    pub fn threads(&self) -> usize {
        self.threads.unwrap_or(1).max(1)
    }

    /// `--clients`, or the workload's default.
    pub fn clients_or(&self, default: usize) -> usize {
        self.clients.unwrap_or(default).max(1)
    }

    /// `--val-size`, or the workload's default.
    pub fn val_size_or(&self, default: usize) -> usize {
        self.val_size.unwrap_or(default)
    }

    /// `--key-space`, or the workload's default.
    pub fn key_space_or(&self, default: u64) -> u64 {
        self.key_space.unwrap_or(default).max(1)
    }

    /// The measured-phase budget: `--total` and/or `--duration`, else
    /// `default_total` ops; always bounded by `--max-time`.
    pub fn budget(&self, default_total: u64) -> Arc<Budget> {
        let total = match (self.total, self.duration) {
            (Some(t), _) => Some(t),
            (None, Some(_)) => None,
            (None, None) => Some(default_total),
        };
        Arc::new(Budget::new(total, self.duration, self.max_time, self.rate))
    }

    /// Whether to draw progress bars.
    pub fn progress_enabled(&self) -> bool {
        !self.no_progress && std::io::stderr().is_terminal()
    }
}

/// Parses `10s`, `500ms`, `2m`, `1h`, `1m30s`, or a bare number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if let Ok(secs) = s.parse::<f64>() {
        if secs >= 0.0 && secs.is_finite() {
            return Ok(Duration::from_secs_f64(secs));
        }
    }
    ephd::config::parse_duration(s)
}

// ------------------------------------------------------------------ endpoints

/// Resolves an endpoint to a loopback socket address, refusing anything else:
/// this tool generates load and must only ever target this machine.
pub fn resolve_endpoint(raw: &str) -> Result<SocketAddr, String> {
    let s = raw.trim();
    if s.starts_with("https://") {
        return Err(format!("{raw}: TLS endpoints are not supported"));
    }
    let hostport = s.strip_prefix("http://").unwrap_or(s).trim_end_matches('/');
    let addrs: Vec<SocketAddr> = hostport
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve endpoint {raw:?}: {e}"))?
        .collect();
    if addrs.is_empty() {
        return Err(format!("endpoint {raw:?} resolves to no address"));
    }
    if let Some(bad) = addrs.iter().find(|a| !a.ip().is_loopback()) {
        return Err(format!(
            "refusing endpoint {raw:?} ({bad}): ephd-bench only targets loopback addresses"
        ));
    }
    // Prefer IPv4: "localhost" often resolves to ::1 first while servers
    // listen on 127.0.0.1.
    Ok(*addrs.iter().find(|a| a.is_ipv4()).unwrap_or(&addrs[0]))
}

/// The connection pool: `--conns` HTTP/2 connections, round-robin over the
/// endpoints. Every client stub made from one shares its connection.
///
/// With `--transport h2` the KV connections are the lean client's
/// ([`h2rpc::Channel`]), and the tonic channels that Watch and Lease use are
/// opened lazily, on their first request, so a workload that does not watch
/// holds no idle extra connections. With `--transport tonic` everything
/// goes over the tonic channels, connected up front as before.
pub struct Pool {
    channels: Vec<Channel>,
    h2: Vec<h2rpc::Channel>,
}

impl Pool {
    /// Opens every connection (5 s connect timeout each).
    pub async fn connect(common: &Common) -> Result<Pool, String> {
        if common.endpoints.is_empty() {
            return Err("no endpoints given".into());
        }
        let addrs = common
            .endpoints
            .iter()
            .map(|e| resolve_endpoint(e))
            .collect::<Result<Vec<_>, _>>()?;
        let lean = common.transport == Transport::H2;
        let mut channels = Vec::new();
        let mut h2 = Vec::new();
        for i in 0..common.conns() {
            let addr = addrs[i % addrs.len()];
            let ep = Endpoint::from_shared(format!("http://{addr}"))
                .map_err(|e| e.to_string())?
                .connect_timeout(Duration::from_secs(5))
                .tcp_nodelay(true)
                .initial_stream_window_size(Some(4 << 20))
                .initial_connection_window_size(Some(16 << 20));
            if lean {
                h2.push(h2rpc::Channel::connect(addr, Duration::from_secs(5)).await?);
                channels.push(ep.connect_lazy());
                continue;
            }
            let ch = tokio::time::timeout(Duration::from_secs(6), ep.connect())
                .await
                .map_err(|_| format!("connecting to {addr} timed out"))?
                .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
            channels.push(ch);
        }
        Ok(Pool { channels, h2 })
    }

    /// Number of connections.
    pub fn len(&self) -> usize {
        self.channels.len()
    }

    /// The `i`-th tonic connection (wrapping).
    fn channel(&self, i: usize) -> Channel {
        self.channels[i % self.channels.len()].clone()
    }

    /// A KV client on connection `i`, with no message size limits, over
    /// the `--transport` in use.
    pub fn kv(&self, i: usize) -> Kv {
        if self.h2.is_empty() {
            return Kv::Tonic(
                KvClient::new(self.channel(i))
                    .max_decoding_message_size(usize::MAX)
                    .max_encoding_message_size(usize::MAX),
            );
        }
        let ch = &self.h2[i % self.h2.len()];
        Kv::H2(Box::new(LeanKv {
            client: h2rpc::Client::new(ch),
            put: ch.method("/etcdserverpb.KV/Put"),
            range: ch.method("/etcdserverpb.KV/Range"),
            txn: ch.method("/etcdserverpb.KV/Txn"),
        }))
    }

    /// A Lease client on connection `i`.
    pub fn lease(&self, i: usize) -> LeaseClient<Channel> {
        LeaseClient::new(self.channel(i))
    }

    /// A Watch client on connection `i`, with no message size limits.
    pub fn watch(&self, i: usize) -> WatchClient<Channel> {
        WatchClient::new(self.channel(i))
            .max_decoding_message_size(usize::MAX)
            .max_encoding_message_size(usize::MAX)
    }
}

/// A KV client as the workloads use it: the same `put`/`range`/`txn`
/// signatures as tonic's generated `KvClient`, over either transport, so
/// the workloads do not care which one `--transport` picked.
///
/// The tonic calls are boxed: their futures are about twice the size of
/// the lean client's (1.5 KiB against 0.9), and unboxed they would make
/// every call's future that big, to be moved into `call`'s timeout on every
/// request whichever transport is in use.
pub enum Kv {
    /// tonic's generated client.
    Tonic(KvClient<Channel>),
    /// The lean client, with its method URIs built once (boxed: it holds
    /// buffers and a header template, and is made once per client task).
    H2(Box<LeanKv>),
}

/// The lean client's per-task state for the KV service.
pub struct LeanKv {
    client: h2rpc::Client,
    put: http::Uri,
    range: http::Uri,
    txn: http::Uri,
}

impl Kv {
    /// `KV/Put`.
    pub async fn put(
        &mut self,
        request: impl tonic::IntoRequest<PutRequest>,
    ) -> Result<tonic::Response<PutResponse>, tonic::Status> {
        match self {
            Kv::Tonic(c) => Box::pin(c.put(request)).await,
            Kv::H2(l) => l.client.unary(&l.put, request).await,
        }
    }

    /// `KV/Range`.
    pub async fn range(
        &mut self,
        request: impl tonic::IntoRequest<RangeRequest>,
    ) -> Result<tonic::Response<RangeResponse>, tonic::Status> {
        match self {
            Kv::Tonic(c) => Box::pin(c.range(request)).await,
            Kv::H2(l) => l.client.unary(&l.range, request).await,
        }
    }

    /// `KV/Txn`.
    pub async fn txn(
        &mut self,
        request: impl tonic::IntoRequest<TxnRequest>,
    ) -> Result<tonic::Response<TxnResponse>, tonic::Status> {
        match self {
            Kv::Tonic(c) => Box::pin(c.txn(request)).await,
            Kv::H2(l) => l.client.unary(&l.txn, request).await,
        }
    }
}

/// Runs one request with the per-request timeout; errors become a short
/// category ("timeout", or the gRPC code) plus the message.
pub async fn call<T>(
    timeout: Duration,
    fut: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, (String, String)> {
    match tokio::time::timeout(timeout, fut).await {
        Err(_) => Err(("timeout".into(), format!("no answer within {timeout:?}"))),
        Ok(Err(st)) => Err((format!("{:?}", st.code()), st.message().to_string())),
        Ok(Ok(r)) => Ok(r.into_inner()),
    }
}

// --------------------------------------------------------------------- budget

/// How many operations the measured phase may issue, until when, and how
/// fast. Shared by all clients of a phase.
pub struct Budget {
    total: Option<u64>,
    duration: Option<Duration>,
    rate: Option<f64>,
    start: Instant,
    deadline: Instant,
    // The deadline is --max-time rather than the planned --duration.
    deadline_is_max: bool,
    issued: AtomicU64,
    /// Operations completed (successfully or not); drives the progress bar.
    pub done: AtomicU64,
    truncated: AtomicBool,
}

impl Budget {
    /// A budget starting now.
    pub fn new(total: Option<u64>, duration: Option<Duration>, max: Duration, rate: f64) -> Self {
        let start = Instant::now();
        let limit = duration.map_or(max, |d| d.min(max));
        Budget {
            total,
            duration,
            rate: (rate > 0.0).then_some(rate),
            start,
            deadline: start + limit,
            deadline_is_max: duration.is_none_or(|d| d >= max),
            issued: AtomicU64::new(0),
            done: AtomicU64::new(0),
            truncated: AtomicBool::new(false),
        }
    }

    /// A budget of exactly `n` ops (setup phases), bounded by `max`.
    pub fn fixed(n: u64, max: Duration) -> Arc<Self> {
        Arc::new(Budget::new(Some(n), None, max, 0.0))
    }

    /// The next op index, after waiting for its slot when rate-limited;
    /// `None` once the count or the time is used up.
    pub async fn next(&self) -> Option<u64> {
        let i = self.issued.fetch_add(1, Ordering::Relaxed);
        if self.total.is_some_and(|t| i >= t) {
            return None;
        }
        if let Some(rate) = self.rate {
            let due = self.start + Duration::from_secs_f64(i as f64 / rate);
            if due >= self.deadline {
                self.note_deadline();
                return None;
            }
            tokio::time::sleep_until(due.into()).await;
        }
        if Instant::now() >= self.deadline {
            self.note_deadline();
            return None;
        }
        Some(i)
    }

    fn note_deadline(&self) {
        // Hitting --duration is the plan; hitting --max-time is not.
        if self.deadline_is_max {
            self.truncated.store(true, Ordering::Relaxed);
        }
    }

    /// Marks one op finished.
    pub fn complete(&self) {
        self.done.fetch_add(1, Ordering::Relaxed);
    }

    /// When the phase started.
    pub fn start(&self) -> Instant {
        self.start
    }

    /// The op count, if bounded by count.
    pub fn total(&self) -> Option<u64> {
        self.total
    }

    /// The planned duration, if bounded by time.
    pub fn duration(&self) -> Option<Duration> {
        self.duration
    }

    /// Whether the phase was cut short by `--max-time`.
    pub fn truncated(&self) -> bool {
        self.truncated.load(Ordering::Relaxed)
    }
}

// ------------------------------------------------------------------ recording

/// A latency histogram in microseconds (1 µs .. 1 h, 3 significant digits).
pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid histogram bounds")
}

/// Error counts by category, with one sample message per category.
#[derive(Debug, Default, Clone)]
pub struct Errors {
    /// Count per category.
    pub by_kind: BTreeMap<String, u64>,
    /// First message seen per category.
    pub samples: BTreeMap<String, String>,
}

impl Errors {
    /// Records one error.
    pub fn add(&mut self, kind: &str, msg: &str) {
        *self.by_kind.entry(kind.to_string()).or_default() += 1;
        self.samples
            .entry(kind.to_string())
            .or_insert_with(|| msg.chars().take(200).collect());
    }

    /// Total errors.
    pub fn total(&self) -> u64 {
        self.by_kind.values().sum()
    }

    /// Adds another set of counts.
    pub fn merge(&mut self, other: Errors) {
        for (k, v) in other.by_kind {
            *self.by_kind.entry(k).or_default() += v;
        }
        for (k, v) in other.samples {
            self.samples.entry(k).or_insert(v);
        }
    }
}

/// One client's (or a whole phase's) results.
pub struct Recorder {
    /// Latency of successful ops, µs.
    pub hist: Histogram<u64>,
    /// Failed ops.
    pub errors: Errors,
    /// Successful ops.
    pub ops: u64,
    /// Workload-specific counters (e.g. CAS failures, pages).
    pub counters: BTreeMap<&'static str, u64>,
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder {
            hist: histogram(),
            errors: Errors::default(),
            ops: 0,
            counters: BTreeMap::new(),
        }
    }
}

impl Recorder {
    /// Records a successful op that started at `started`.
    pub fn ok(&mut self, started: Instant) {
        self.hist
            .saturating_record(started.elapsed().as_micros().max(1) as u64);
        self.ops += 1;
    }

    /// Records a failed op.
    pub fn err(&mut self, (kind, msg): &(String, String)) {
        self.errors.add(kind, msg);
    }

    /// Adds `n` to a named counter.
    pub fn count(&mut self, name: &'static str, n: u64) {
        *self.counters.entry(name).or_default() += n;
    }

    /// Adds another recorder's results.
    pub fn merge(&mut self, other: Recorder) {
        self.hist.add(&other.hist).expect("same histogram bounds");
        self.errors.merge(other.errors);
        self.ops += other.ops;
        for (k, v) in other.counters {
            *self.counters.entry(k).or_default() += v;
        }
    }
}

/// Waits for every client task and merges their recorders.
pub async fn join_all(handles: Vec<JoinHandle<Recorder>>) -> Recorder {
    let mut all = Recorder::default();
    for h in handles {
        match h.await {
            Ok(r) => all.merge(r),
            Err(e) => all.errors.add("client task", &e.to_string()),
        }
    }
    all
}

// ------------------------------------------------------------------------ cpu

fn clk_tck() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as u64
    } else {
        100
    }
}

/// utime + stime of a process, in clock ticks.
fn cpu_ticks(pid: &str) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 here.
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

/// Peak resident set size (VmHWM) of a process, in MiB.
pub fn peak_rss_mb(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

/// Busy time of all CPUs (user, nice, system, irq, softirq, steal), in ticks.
fn machine_busy_ticks() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let f: Vec<u64> = stat
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    // user nice system idle iowait irq softirq steal
    Some(
        [0, 1, 2, 5, 6, 7]
            .iter()
            .map(|&i| f.get(i).copied().unwrap_or(0))
            .sum(),
    )
}

/// CPU time of the server (if sampled), of this process and of the whole
/// machine at one moment.
#[derive(Debug, Clone, Copy)]
pub struct CpuSample {
    server: Option<u64>,
    client: Option<u64>,
    machine: Option<u64>,
    at: Instant,
}

/// CPU used between two samples.
#[derive(Debug, Clone, Copy)]
pub struct CpuDelta {
    /// Server CPU seconds, if sampled.
    pub server_s: Option<f64>,
    /// This process's CPU seconds.
    pub client_s: Option<f64>,
    /// Share of all CPUs used by everything else (0..1): above ~0.1 the
    /// run was probably disturbed.
    pub other_frac: Option<f64>,
}

impl CpuSample {
    /// Samples now.
    pub fn take(server_pid: Option<u32>) -> Self {
        CpuSample {
            server: server_pid.and_then(|p| cpu_ticks(&p.to_string())),
            client: cpu_ticks("self"),
            machine: machine_busy_ticks(),
            at: Instant::now(),
        }
    }

    /// CPU used between `self` and `later`.
    pub fn delta(&self, later: &CpuSample) -> CpuDelta {
        let hz = clk_tck() as f64;
        let d = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (Some(a), Some(b)) => Some(b.saturating_sub(a) as f64 / hz),
            _ => None,
        };
        let (server_s, client_s) = (d(self.server, later.server), d(self.client, later.client));
        let wall = later.at.duration_since(self.at).as_secs_f64();
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        let other_frac = d(self.machine, later.machine).map(|busy| {
            let other = busy - server_s.unwrap_or(0.0) - client_s.unwrap_or(0.0);
            (other.max(0.0) / (cpus * wall.max(1e-3))).min(1.0)
        });
        CpuDelta {
            server_s,
            client_s,
            other_frac,
        }
    }
}

// ------------------------------------------------------------------- progress

/// A progress bar on stderr, or nothing when disabled.
pub struct Progress {
    bar: Option<ProgressBar>,
    ticker: Option<JoinHandle<()>>,
}

impl Progress {
    /// A bar following `budget`: ops done out of `--total`, or time elapsed
    /// out of `--duration`.
    pub fn for_budget(enabled: bool, name: &str, budget: Arc<Budget>) -> Progress {
        if !enabled {
            return Progress {
                bar: None,
                ticker: None,
            };
        }
        let by_count = budget.total().is_some()
            && budget
                .duration()
                .is_none_or(|d| d > Duration::from_secs(3600));
        let (len, template) = if by_count {
            (
                budget.total().unwrap_or(0),
                "{prefix:>12} [{elapsed_precise}] {wide_bar} {pos}/{len} ops ({per_sec}, eta {eta})",
            )
        } else {
            (
                budget.duration().unwrap_or_default().as_millis() as u64,
                "{prefix:>12} [{elapsed_precise}] {wide_bar} {msg}",
            )
        };
        let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
        bar.set_style(ProgressStyle::with_template(template).expect("valid template"));
        bar.set_prefix(name.to_string());
        let b = bar.clone();
        let ticker = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(200));
            loop {
                tick.tick().await;
                let done = budget.done.load(Ordering::Relaxed);
                if by_count {
                    b.set_position(done);
                } else {
                    b.set_position(budget.start().elapsed().as_millis() as u64);
                    let rate = done as f64 / budget.start().elapsed().as_secs_f64().max(1e-3);
                    b.set_message(format!("{done} ops ({rate:.0}/s)"));
                }
            }
        });
        Progress {
            bar: Some(bar),
            ticker: Some(ticker),
        }
    }

    /// A spinner with a message, for setup and drain phases.
    pub fn spinner(enabled: bool, msg: &str) -> Progress {
        if !enabled {
            return Progress {
                bar: None,
                ticker: None,
            };
        }
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
        bar.set_message(msg.to_string());
        bar.enable_steady_tick(Duration::from_millis(100));
        Progress {
            bar: Some(bar),
            ticker: None,
        }
    }

    /// Removes the bar.
    pub fn finish(self) {
        if let Some(t) = self.ticker {
            t.abort();
        }
        if let Some(b) = self.bar {
            b.finish_and_clear();
        }
    }
}

// --------------------------------------------------------------------- keys

/// The smallest key greater than every key with this prefix (etcd's
/// `GetPrefixRangeEnd`).
pub fn prefix_end(prefix: &[u8]) -> Bytes {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Bytes::from(end);
        }
    }
    Bytes::from_static(b"\0")
}

/// `prefix` followed by `n` in decimal, zero-padded so the key is `size`
/// bytes long when possible. Written by hand rather than with `format!`:
/// it runs once per put, and the formatting machinery was a visible share
/// of the client's CPU per op.
pub fn padded_key(prefix: &str, n: u64, size: usize) -> Bytes {
    let mut digits = [0u8; 20];
    let mut start = digits.len();
    let mut rest = n;
    loop {
        start -= 1;
        digits[start] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    let digits = &digits[start..];
    let zeros = size
        .saturating_sub(prefix.len())
        .saturating_sub(digits.len());
    let mut key = Vec::with_capacity(prefix.len() + zeros + digits.len());
    key.extend_from_slice(prefix.as_bytes());
    key.resize(prefix.len() + zeros, b'0');
    key.extend_from_slice(digits);
    Bytes::from(key)
}

/// A value of exactly `size` bytes: `head`, then filler.
pub fn value_with(head: &str, size: usize) -> Bytes {
    let mut v = Vec::with_capacity(size.max(head.len()));
    v.extend_from_slice(head.as_bytes());
    let filler = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut i = 0;
    while v.len() < size {
        v.push(filler[i % filler.len()]);
        i += 1;
    }
    v.truncate(size.max(head.len()).min(v.len()));
    Bytes::from(v)
}

/// A random 32-bit tag that keeps one run's keys apart from another's.
pub fn run_nonce() -> u32 {
    rand::random::<u32>()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_must_be_loopback() {
        assert!(resolve_endpoint("127.0.0.1:2379").is_ok());
        assert!(resolve_endpoint("http://127.0.0.1:2379/").is_ok());
        assert!(resolve_endpoint("localhost:2379")
            .unwrap()
            .ip()
            .is_loopback());
        assert!(resolve_endpoint("10.0.0.1:2379").is_err());
        assert!(resolve_endpoint("https://127.0.0.1:2379").is_err());
    }

    #[test]
    fn keys_and_values_have_the_requested_sizes() {
        assert_eq!(prefix_end(b"/a/"), Bytes::from_static(b"/a0"));
        assert_eq!(prefix_end(b"a\xff"), Bytes::from_static(b"b"));
        assert_eq!(padded_key("k", 42, 8).as_ref(), b"k0000042");
        for (prefix, n, size) in [
            ("/p/", 0, 10),
            ("k", u64::MAX, 4),
            ("", 7, 0),
            ("ab", 123, 5),
        ] {
            let width = size - prefix.len().min(size);
            assert_eq!(
                padded_key(prefix, n, size).as_ref(),
                format!("{prefix}{n:0width$}").as_bytes()
            );
        }
        assert_eq!(value_with("hi", 10).len(), 10);
        assert_eq!(value_with("hello", 3).as_ref(), b"hello");
    }

    #[test]
    fn durations_accept_bare_seconds() {
        assert_eq!(parse_duration("2").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
    }
}

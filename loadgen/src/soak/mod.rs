//! `soak`: a bounded fault soak against a real ephd process.
//!
//! The soak starts and owns an ephd (`--ephd-bin`) with its own
//! `--data-dir` and a short `--snapshot-interval`, drives kube-apiserver's
//! write mix against it with checking watchers attached (see `load` and
//! `watch`), and injects one fault per round, cycling through the kinds in
//! `--faults`: clients dropping mid-stream, watchers that stop reading,
//! malformed and oversized requests, lease-expiry bursts, compaction under
//! a lagging watcher, list storms, SIGKILL and restart, a damaged snapshot
//! (`faults`). After every round a checkpoint compares each watcher's
//! rebuilt prefix with a Range and every object with the model of what
//! was acknowledged; after every restart the served state is compared with
//! the snapshot generation the server had to restore.
//!
//! It fails (exit status 3) on any violation: an acknowledged write not
//! readable (other than the documented losses: writes after the snapshot
//! restored after a SIGKILL, or after the generation restored in place of a
//! damaged one), a watch event lost, repeated, out of order or inconsistent,
//! a cancel that is not a legitimate compaction, revisions going
//! backwards across a restart, a fault answered other than etcd answers
//! it, the server's RSS over `--rss-budget-mb`, or a panic in its log.
//!
//! Everything is bounded: the rounds stop at `--duration` (the first cycle
//! of faults always completes), every call has `--timeout`, every wait its
//! own bound; the server is killed when the soak ends, however it ends.

mod faults;
mod load;
mod model;
mod rawh2;
mod server;
mod violations;
mod watch;

use crate::options::{parse_duration, Common};
use crate::pool::{call, Kv, Pool};
use crate::record::Recorder;
use crate::report::{r3, Report};
use bytes::Bytes;
use ephd::proto::etcdserverpb::{lease_client::LeaseClient, LeaseLeasesRequest, RangeRequest};
use load::{Load, LoadSpec, Shared};
use model::{Family, Model, Served, Val};
use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use server::{ServerProc, ServerSpec};
use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tonic::transport::{Channel, Endpoint};
use violations::Violations;
use watch::{WatchSet, WatchStats};

/// The kinds of fault, injected one per round in `--faults` order.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum FaultKind {
    /// Watch streams and in-flight unary calls abandoned by resetting or
    /// closing their connections; the server must let go of them.
    DropClients,
    /// The slow stream stops reading for half a round, then resumes.
    StallWatchers,
    /// Garbage protobuf, lying length prefixes, oversized messages,
    /// compression flags, unknown methods, bytes that are not HTTP/2.
    Malformed,
    /// A lease with `--burst-keys` keys expires; every watcher must see
    /// every DELETE, at one revision.
    LeaseBurst,
    /// SIGKILL under load, restart on the same data directory.
    SigkillRestart,
    /// Compaction to the current revision while the slow stream is not
    /// reading, and a watch created below the compaction.
    CompactMidWatch,
    /// `--storm` concurrent lists of every object, whole or paginated.
    ListStorm,
    /// SIGTERM under load, a bit flipped in the newest snapshot (every
    /// `--damage-all-every`-th time in every snapshot), restart.
    DamagedSnapshot,
}

impl FaultKind {
    /// The name used in reports (the command-line name, `_` for `-`).
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::DropClients => "drop_clients",
            FaultKind::StallWatchers => "stall_watchers",
            FaultKind::Malformed => "malformed",
            FaultKind::LeaseBurst => "lease_burst",
            FaultKind::SigkillRestart => "sigkill_restart",
            FaultKind::CompactMidWatch => "compact_mid_watch",
            FaultKind::ListStorm => "list_storm",
            FaultKind::DamagedSnapshot => "damaged_snapshot",
        }
    }
}

/// Options of `soak`. The common `--duration` (default 2m) bounds the
/// rounds and `--timeout` every call; `--endpoints` is ignored (the soak
/// starts its own server).
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// The ephd binary to start [default: `ephd` next to this program].
    #[arg(long, env = "EPHD_BIN")]
    pub ephd_bin: Option<PathBuf>,
    /// Length of one round (a fault, then load until the round ends, then
    /// a checkpoint).
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    pub round: Duration,
    /// Faults in the order they are injected, cycling.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "drop-clients,stall-watchers,malformed,lease-burst,sigkill-restart,compact-mid-watch,list-storm,damaged-snapshot"
    )]
    pub faults: Vec<FaultKind>,
    /// Node Lease objects renewed by CAS.
    #[arg(long, default_value_t = 500)]
    pub nodes: usize,
    /// How often each node renews its Lease.
    #[arg(long, value_parser = parse_duration, default_value = "5s")]
    pub heartbeat_period: Duration,
    /// Event creates per second.
    #[arg(long, default_value_t = 100.0)]
    pub event_rate: f64,
    /// TTL of the events' leases, seconds (kube-apiserver's --event-ttl,
    /// scaled down so events expire during the soak).
    #[arg(long, default_value_t = 20)]
    pub event_ttl: i64,
    /// How long one lease is reused for new events.
    #[arg(long, value_parser = parse_duration, default_value = "5s")]
    pub lease_reuse: Duration,
    /// Writer tasks per kind (heartbeats, events).
    #[arg(long, default_value_t = 2)]
    pub writers: usize,
    /// Pods written once for the list storms to read.
    #[arg(long, default_value_t = 2000)]
    pub pods: usize,
    /// Bytes per Pod.
    #[arg(long, default_value_t = 1024)]
    pub pod_size: usize,
    /// Concurrent lists in a list storm.
    #[arg(long, default_value_t = 50)]
    pub storm: usize,
    /// Keys attached to the lease of a lease-expiry burst.
    #[arg(long, default_value_t = 1000)]
    pub burst_keys: usize,
    /// TTL of a burst's lease, seconds.
    #[arg(long, default_value_t = 5)]
    pub burst_ttl: i64,
    /// Period of the apiserver-like compactor (0: none).
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    pub compact_every: Duration,
    /// The server's `--snapshot-interval`: the crash window.
    #[arg(long, value_parser = parse_duration, default_value = "1s")]
    pub snapshot_interval: Duration,
    /// Every n-th damaged-snapshot fault damages every generation, so the
    /// server must start empty (0: never).
    #[arg(long, default_value_t = 2)]
    pub damage_all_every: u32,
    /// The server's RSS must stay below this (MiB).
    #[arg(long, default_value_t = 1024)]
    pub rss_budget_mb: u64,
    /// Directory for the data directory and server logs [default: a new
    /// one under the system's temporary directory].
    #[arg(long)]
    pub work_dir: Option<PathBuf>,
    /// Keep the work directory even when the soak passes.
    #[arg(long)]
    pub keep_work_dir: bool,
    /// An extra flag for the server (repeatable), e.g.
    /// `--server-arg=--max-request-bytes=2097152`.
    #[arg(long = "server-arg", allow_hyphen_values = true)]
    pub server_args: Vec<String>,
    /// Seed of the soak's random choices (kill timing, damaged byte); 0
    /// picks one, which the report shows.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

/// Counters the report shows, beyond the model's and the watchers'.
#[derive(Debug, Default)]
struct Stats {
    faults: BTreeMap<&'static str, u64>,
    rounds: u64,
    checkpoints: u64,
    restarts: u64,
    max_crash_window_s: f64,
    dropped_streams: u64,
    dropped_calls: u64,
    malformed_cases: u64,
    bursts: u64,
    burst_deletes_checked: u64,
    burst_expiry_max_s: f64,
    storm_lists: u64,
    storm_shed: u64,
    storm_timeouts: u64,
    storm_expired: u64,
    storm_mib: f64,
    storm_max_s: f64,
    below_compaction_cancels: u64,
    snapshots_checked: u64,
    moved_aside: u64,
    started_empty: u64,
    leases_to_adopt: u64,
}

/// One server run: its connections, load and watchers.
struct Epoch {
    pool: Pool,
    channel: Channel,
    kv: Kv,
    load: Option<Load>,
    watches: WatchSet,
    compacted: Arc<AtomicI64>,
}

/// The soak's state; the faults are in `faults`.
struct Soak<'a> {
    c: Common,
    a: &'a Args,
    srv: ServerProc,
    data_dir: PathBuf,
    sh: Arc<Shared>,
    viol: Arc<Violations>,
    model: Arc<Mutex<Model>>,
    spec: LoadSpec,
    ep: Option<Epoch>,
    stats: Stats,
    wstats: WatchStats,
    rng: StdRng,
    damage_rounds: u32,
    max_request_bytes: usize,
}

/// The default binary: `ephd` next to this program.
fn default_bin() -> Result<PathBuf, String> {
    let me = std::env::current_exe().map_err(|e| format!("cannot locate ephd-bench: {e}"))?;
    let bin = me.with_file_name("ephd");
    if bin.is_file() {
        Ok(bin)
    } else {
        Err(format!(
            "no ephd binary at {}; build it (cargo build -p ephd) or pass --ephd-bin",
            bin.display()
        ))
    }
}

/// The server's `--help`, which lists the flags it knows (empty if it
/// cannot be run).
fn server_help(bin: &Path) -> String {
    std::process::Command::new(bin)
        .arg("--help")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

fn lean_endpoint(srv: &ServerProc, window: u32) -> Result<Channel, String> {
    Ok(Endpoint::from_shared(srv.endpoint())
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_secs(5))
        .tcp_nodelay(true)
        .initial_stream_window_size(Some(window))
        .initial_connection_window_size(Some(window))
        .connect_lazy())
}

/// Runs the soak.
pub async fn run(c: &Common, a: &Args) -> Result<Report, String> {
    let duration = c.duration.unwrap_or(Duration::from_secs(120));
    if duration > c.max_time {
        return Err(format!(
            "--duration {duration:?} is over --max-time {:?}; raise --max-time",
            c.max_time
        ));
    }
    if a.faults.is_empty() {
        return Err("--faults is empty".into());
    }
    let bin = match &a.ephd_bin {
        Some(b) => b.clone(),
        None => default_bin()?,
    };
    let seed = if a.seed == 0 {
        rand::random::<u64>() | 1
    } else {
        a.seed
    };
    let work = match &a.work_dir {
        Some(d) => d.clone(),
        None => std::env::temp_dir().join(format!(
            "ephd-soak-{}-{:08x}",
            std::process::id(),
            rand::random::<u32>()
        )),
    };
    let data_dir = work.join("data");
    let mut args = vec![
        "--snapshot-interval".to_string(),
        format!("{}ms", a.snapshot_interval.as_millis()),
        "--experimental-watch-progress-notify-interval".into(),
        "2s".into(),
        "--lease-adopt-unknown-ttl".into(),
        a.event_ttl.max(1).to_string(),
        "--log-level".into(),
        "info".into(),
    ];
    // Memory-related flags, when this server has them and the caller did
    // not set them: a quota far above what the soak stores (so NOSPACE
    // means the accounting is wrong), and a bound on list responses in
    // flight well inside the RSS budget (so a list storm must fit in it).
    let help = server_help(&bin);
    let budget = a.rss_budget_mb * (1 << 20);
    let mut memory_flags = Vec::new();
    for (flag, value) in [
        ("--quota-backend-bytes", budget / 2),
        ("--max-response-bytes-in-flight", budget / 4),
    ] {
        let set_by_caller = a
            .server_args
            .iter()
            .any(|s| s == flag || s.starts_with(&format!("{flag}=")));
        if help.contains(flag) && !set_by_caller {
            memory_flags.push(format!("{flag}={value}"));
        }
    }
    args.extend(memory_flags.iter().cloned());
    args.extend(a.server_args.iter().cloned());
    let max_request_bytes = args
        .iter()
        .find_map(|s| s.strip_prefix("--max-request-bytes="))
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_572_864);
    eprintln!(
        "soak: {} for {duration:?}, rounds of {:?}, seed {seed}, work dir {}",
        bin.display(),
        a.round,
        work.display()
    );
    let srv = ServerProc::start(ServerSpec {
        bin: bin.clone(),
        data_dir: data_dir.clone(),
        log_dir: work.clone(),
        args,
    })
    .await?;
    let model = Arc::new(Mutex::new(Model::default()));
    let viol = Arc::new(Violations::default());
    let sh = Arc::new(Shared::new(model.clone(), viol.clone()));
    let mut common = c.clone();
    common.conns = Some(c.conns.unwrap_or(4));
    let spec = LoadSpec {
        nodes: a.nodes,
        heartbeat_period: a.heartbeat_period,
        event_rate: a.event_rate,
        event_ttl: a.event_ttl,
        lease_reuse: a.lease_reuse,
        writers: a.writers,
        compact_every: a.compact_every,
        timeout: c.timeout,
    };
    let mut soak = Soak {
        c: common,
        a,
        srv,
        data_dir,
        sh,
        viol,
        model,
        spec,
        ep: None,
        stats: Stats::default(),
        wstats: WatchStats::default(),
        rng: StdRng::seed_from_u64(seed),
        damage_rounds: 0,
        max_request_bytes,
    };
    let started = Instant::now();
    let outcome = soak.rounds(started + duration).await;
    if let Err(e) = &outcome {
        soak.viol.add(format!("the soak could not go on: {e}"));
    }
    soak.finish().await;
    let passed = soak.viol.count() == 0;
    let mut r = soak.report(started.elapsed(), seed);
    r.set("memory_flags", json!(memory_flags));
    r.set("work_dir", work.display().to_string());
    if passed && !a.keep_work_dir {
        let _ = std::fs::remove_dir_all(&work);
    } else {
        eprintln!("soak: logs and data kept in {}", work.display());
    }
    Ok(r)
}

impl Soak<'_> {
    /// Connects to the current server and starts the load and watchers.
    async fn open_epoch(&mut self) -> Result<(), String> {
        let mut c = self.c.clone();
        c.endpoints = vec![self.srv.addr.to_string()];
        let pool = Pool::connect(&c).await?;
        let channel = lean_endpoint(&self.srv, 4 << 20)?;
        let mut kv = pool.kv(0);
        let first = watch::list_rev(&mut kv, c.timeout).await?;
        self.model.lock().saw_revision(first);
        load::ensure_pods(&pool, &self.sh, self.a.pods, self.a.pod_size, c.timeout).await?;
        let compacted = Arc::new(AtomicI64::new(first));
        let ctx = watch::Ctx {
            model: self.model.clone(),
            viol: self.viol.clone(),
            compacted: compacted.clone(),
            timeout: c.timeout,
        };
        let mut watches = WatchSet::new(ctx);
        watches
            .add_stream(
                "main",
                channel.clone(),
                &mut kv,
                &[Family::Leases, Family::Events],
            )
            .await?;
        watches
            .add_stream(
                "second",
                lean_endpoint(&self.srv, 4 << 20)?,
                &mut kv,
                &[Family::Events, Family::Leases],
            )
            .await?;
        // Small windows, so the server's sends block as soon as it stops
        // reading.
        watches
            .add_stream(
                "slow",
                lean_endpoint(&self.srv, 65_535)?,
                &mut kv,
                &[Family::Events, Family::Leases],
            )
            .await?;
        let load = Load::start(&pool, &channel, &self.spec, &self.sh, &compacted);
        self.ep = Some(Epoch {
            pool,
            channel,
            kv,
            load: Some(load),
            watches,
            compacted,
        });
        Ok(())
    }

    fn ep(&mut self) -> Result<&mut Epoch, String> {
        self.ep
            .as_mut()
            .ok_or_else(|| "no server connection".to_string())
    }

    /// The rounds, until `deadline` (the first cycle always completes).
    async fn rounds(&mut self, deadline: Instant) -> Result<(), String> {
        self.open_epoch().await?;
        let kinds = self.a.faults.clone();
        let mut i = 0usize;
        loop {
            let first_cycle = i < kinds.len();
            if !first_cycle && Instant::now() + self.a.round > deadline {
                break;
            }
            let kind = kinds[i % kinds.len()];
            i += 1;
            let t0 = Instant::now();
            eprintln!(
                "soak: round {i}: {} ({} violations so far)",
                kind.name(),
                self.viol.count()
            );
            let res = match kind {
                FaultKind::DropClients => self.drop_clients().await,
                FaultKind::StallWatchers => self.stall_watchers().await,
                FaultKind::Malformed => self.malformed().await,
                FaultKind::LeaseBurst => self.lease_burst().await,
                FaultKind::SigkillRestart => self.restart(false).await,
                FaultKind::CompactMidWatch => self.compact_mid_watch().await,
                FaultKind::ListStorm => self.list_storm().await,
                FaultKind::DamagedSnapshot => self.restart(true).await,
            };
            if self.ep.is_none() {
                // A restart that failed to bring the server back.
                return res;
            }
            if let Err(e) = res {
                self.viol.add(format!("{}: {e}", kind.name()));
            }
            *self.stats.faults.entry(kind.name()).or_default() += 1;
            self.stats.rounds += 1;
            let end = (t0 + self.a.round).min(deadline.max(Instant::now()));
            tokio::time::sleep_until(end.into()).await;
            self.checkpoint().await;
        }
        Ok(())
    }

    /// The checks between rounds: every watcher against a Range at its
    /// position, every object against the model.
    async fn checkpoint(&mut self) {
        let timeout = self.c.timeout;
        let catch_up = timeout.max(Duration::from_secs(30));
        let Some(ep) = self.ep.as_mut() else { return };
        ep.watches.checkpoint(&mut ep.kv, catch_up).await;
        for f in Family::ALL {
            match watch::list(&mut ep.kv, f, 0, timeout).await {
                Ok((rev, served)) => {
                    let v = self.model.lock().check_at(f, rev, &served, Instant::now());
                    self.viol.extend(v);
                }
                Err(e) => self
                    .viol
                    .add(format!("checkpoint: listing {}: {e}", f.name())),
            }
        }
        let floor = server::generations(&self.data_dir)
            .get(1)
            .map_or(0, |(rev, _)| *rev);
        self.model.lock().prune(floor);
        self.stats.checkpoints += 1;
    }

    /// Ends the server run: stops the load, closes the watchers.
    async fn close_epoch(&mut self) {
        if let Some(mut ep) = self.ep.take() {
            if let Some(load) = ep.load.take() {
                load.stop(&self.viol).await;
            }
            ep.watches.close();
            let s = ep.watches.stats;
            self.wstats.created += s.created;
            self.wstats.events += s.events;
            self.wstats.compaction_cancels += s.compaction_cancels;
            self.wstats.compares += s.compares;
            self.wstats.prev_kv_missing += s.prev_kv_missing;
        }
    }

    /// Reads a snapshot generation as the server would at `now`.
    fn read_generation(path: &Path) -> Result<ephd::persist::Restored, String> {
        ephd::persist::read_file(path, ephd::persist::wall_clock_ms())
            .map_err(|e| format!("{}: {e}", path.display()))
    }

    /// The objects of our families a snapshot holds.
    fn snapshot_objects(r: &ephd::persist::Restored) -> Served {
        r.kvs
            .iter()
            .filter(|kv| Family::of(&kv.key).is_some())
            .map(|kv| {
                (
                    kv.key.clone(),
                    Val {
                        create: kv.create_revision,
                        rev: kv.mod_revision,
                        version: kv.version,
                        hash: model::digest(&kv.value),
                        lease: kv.lease,
                    },
                )
            })
            .collect()
    }

    /// Checks a snapshot against the model: every write applied at or
    /// below its revision is in it.
    fn check_snapshot(&mut self, what: &str, r: &ephd::persist::Restored) {
        let objects = Self::snapshot_objects(r);
        let mut m = self.model.lock();
        for f in Family::ALL {
            let served: Served = objects
                .iter()
                .filter(|(k, _)| Family::of(k) == Some(f))
                .map(|(k, v)| (k.clone(), *v))
                .collect();
            for v in m.check_at(f, r.revision, &served, Instant::now()) {
                self.viol
                    .add(format!("{what} (revision {}): {v}", r.revision));
            }
        }
        self.stats.snapshots_checked += 1;
    }

    /// A SIGKILL (or, for `damage`, a SIGTERM and a damaged snapshot) and
    /// a restart, with the restart checks.
    async fn restart(&mut self, damage: bool) -> Result<(), String> {
        // Let the stop land anywhere in the snapshot cycle.
        let jitter = self
            .rng
            .random_range(0..self.a.snapshot_interval.as_millis().max(1) as u64);
        tokio::time::sleep(Duration::from_millis(jitter)).await;
        let stop_ms = ephd::persist::wall_clock_ms();
        if damage {
            match self.srv.terminate().await {
                Ok(s) if s.success() => {}
                Ok(s) => self.viol.add(format!("ephd exited with {s} after SIGTERM")),
                Err(e) => self.viol.add(e),
            }
        } else {
            self.srv.kill();
        }
        self.close_epoch().await;
        let prev_max = self.model.lock().max_rev;
        let gens = server::generations(&self.data_dir);
        let Some((_, newest_path)) = gens.first().cloned() else {
            return Err("no snapshot generation in the data directory".into());
        };
        let newest = Self::read_generation(&newest_path);
        let mut flipped = Vec::new();
        let expected = if damage {
            let newest = newest.map_err(|e| format!("the final snapshot is unreadable: {e}"))?;
            // A graceful stop keeps every acknowledged write.
            let lost = self.model.lock().acked_above(newest.revision);
            if lost > 0 {
                self.viol.add(format!(
                    "the snapshot written on SIGTERM (revision {}) misses {lost} writes acknowledged after it",
                    newest.revision
                ));
            }
            self.check_snapshot("the snapshot written on SIGTERM", &newest);
            self.damage_rounds += 1;
            let all = self.a.damage_all_every > 0
                && self.damage_rounds.is_multiple_of(self.a.damage_all_every);
            let victims = if all { gens.len() } else { 1 };
            for (_, path) in gens.iter().take(victims) {
                let len = std::fs::metadata(path).map_err(|e| e.to_string())?.len();
                let at = self.rng.random_range(10..len.max(11));
                server::flip_byte(path, at)?;
                flipped.push(path.clone());
            }
            if all {
                None
            } else {
                match gens.get(1) {
                    Some((_, older)) => Some(
                        Self::read_generation(older)
                            .map_err(|e| format!("the older generation is unreadable: {e}"))?,
                    ),
                    None => None,
                }
            }
        } else {
            match newest {
                Ok(r) => {
                    let window = (stop_ms - r.written_unix_ms) as f64 / 1000.0;
                    self.stats.max_crash_window_s = self.stats.max_crash_window_s.max(window);
                    // Snapshots are written every interval, each taking a
                    // while on a loaded machine: far above that, they
                    // stopped.
                    let bound = self.a.snapshot_interval.as_secs_f64() * 3.0 + 10.0;
                    if window > bound {
                        self.viol.add(format!(
                            "the newest snapshot at SIGKILL was written {window:.1} s before it (interval {:?})",
                            self.a.snapshot_interval
                        ));
                    }
                    self.check_snapshot("the newest snapshot at SIGKILL", &r);
                    Some(r)
                }
                Err(e) => {
                    return Err(format!(
                        "the newest snapshot after SIGKILL is unreadable: {e}"
                    ))
                }
            }
        };
        self.srv.restart().await?;
        self.stats.restarts += 1;
        self.check_restart(prev_max, expected.as_ref(), &flipped, damage)
            .await?;
        self.open_epoch().await
    }

    /// What the restarted server serves: above every earlier revision,
    /// older revisions compacted, exactly the generation it had to restore
    /// (or nothing), damaged files moved aside.
    async fn check_restart(
        &mut self,
        prev_max: i64,
        expected: Option<&ephd::persist::Restored>,
        flipped: &[PathBuf],
        damaged: bool,
    ) -> Result<(), String> {
        let timeout = self.c.timeout;
        let mut c = self.c.clone();
        c.endpoints = vec![self.srv.addr.to_string()];
        c.conns = Some(1);
        let pool = Pool::connect(&c).await?;
        let mut kv = pool.kv(0);
        let mut served = Served::new();
        for f in Family::ALL {
            let (rev, objs) = watch::list(&mut kv, f, 0, timeout).await?;
            if rev <= prev_max {
                self.viol.add(format!(
                    "after the restart the revision is {rev}, not above {prev_max} reached before it"
                ));
            }
            self.model.lock().saw_revision(rev);
            served.extend(objs);
        }
        match call(
            timeout,
            kv.range(RangeRequest {
                key: Bytes::from_static(b"/"),
                range_end: crate::keys::prefix_end(b"/"),
                revision: prev_max,
                count_only: true,
                ..Default::default()
            }),
        )
        .await
        {
            Err((_, m)) if m == watch::ERR_COMPACTED => {}
            other => self.viol.add(format!(
                "after the restart a read at the old revision {prev_max} gave {other:?}, not {:?}",
                watch::ERR_COMPACTED
            )),
        }
        // kube-apiserver's compactor indexes this key's value: it must
        // survive every restart (restored, or created above the old range).
        match call(
            timeout,
            kv.range(RangeRequest {
                key: Bytes::from_static(load::COMPACT_REV_KEY.as_bytes()),
                ..Default::default()
            }),
        )
        .await
        {
            Ok(r) if r.kvs.len() == 1 => {}
            other => self.viol.add(format!(
                "after the restart {} is not there: {other:?}",
                load::COMPACT_REV_KEY
            )),
        }
        // kube-apiserver reuses its cached lease after a restart; one the
        // restored generation lacks (or an empty start) must be adopted,
        // not refused (counted here; refusals are caught at the end).
        if let Some(id) = self.sh.cached_lease().await {
            if expected.is_none_or(|r| !r.leases.iter().any(|l| l.id == id)) {
                self.stats.leases_to_adopt += 1;
            }
        }
        let now = Instant::now();
        let snap_rev = match expected {
            Some(r) => {
                let want = Self::snapshot_objects(r);
                let leases: BTreeMap<i64, Duration> =
                    r.leases.iter().map(|l| (l.id, l.remaining)).collect();
                let mut diffs = 0u64;
                for (k, v) in &want {
                    match served.get(k) {
                        Some(s) if s == v => {}
                        None if v.lease != 0
                            && leases
                                .get(&v.lease)
                                .is_none_or(|rem| *rem < Duration::from_secs(3)) => {}
                        other => {
                            diffs += 1;
                            if diffs <= 5 {
                                self.viol.add(format!(
                                    "after the restart {} is {other:?}, the restored generation (revision {}) has {v:?}",
                                    String::from_utf8_lossy(k),
                                    r.revision
                                ));
                            }
                        }
                    }
                }
                for k in served.keys().filter(|k| !want.contains_key(*k)) {
                    diffs += 1;
                    if diffs <= 5 {
                        self.viol.add(format!(
                            "after the restart {} is served but not in the restored generation (revision {})",
                            String::from_utf8_lossy(k),
                            r.revision
                        ));
                    }
                }
                if diffs > 5 {
                    self.viol.add(format!(
                        "after the restart {diffs} objects differ from the restored generation"
                    ));
                }
                self.check_leases(r).await;
                r.revision
            }
            None => {
                self.stats.started_empty += 1;
                if !served.is_empty() {
                    self.viol.add(format!(
                        "every generation was damaged, yet the restarted server holds {} objects",
                        served.len()
                    ));
                }
                0
            }
        };
        for f in Family::ALL {
            let part: Served = served
                .iter()
                .filter(|(k, _)| Family::of(k) == Some(f))
                .map(|(k, v)| (k.clone(), *v))
                .collect();
            let v = self.model.lock().check_at(f, snap_rev, &part, now);
            self.viol
                .extend(v.into_iter().map(|v| format!("after the restart: {v}")));
        }
        self.model.lock().rebase(snap_rev, &served, damaged);
        let corrupt = server::corrupt_files(&self.data_dir);
        for p in flipped {
            let name = p.file_name().map(|n| n.to_string_lossy().into_owned());
            let moved = corrupt.iter().any(|c| {
                c.file_name()
                    .zip(name.as_ref())
                    .is_some_and(|(c, n)| c.to_string_lossy().starts_with(&format!("{n}.corrupt-")))
            });
            if p.exists() || !moved {
                self.viol.add(format!(
                    "the damaged {} was not moved aside (still there: {}, moved: {moved})",
                    p.display(),
                    p.exists()
                ));
            } else {
                self.stats.moved_aside += 1;
            }
        }
        // They are kept by ephd for inspection; the soak has checked them.
        for c in corrupt {
            let _ = std::fs::remove_file(c);
        }
        Ok(())
    }

    /// Every lease of the restored generation with time left is served
    /// again, with its TTL.
    async fn check_leases(&mut self, r: &ephd::persist::Restored) {
        let channel = match lean_endpoint(&self.srv, 1 << 20) {
            Ok(c) => c,
            Err(e) => return self.viol.add(e),
        };
        let mut client = LeaseClient::new(channel);
        let listed = match call(self.c.timeout, client.lease_leases(LeaseLeasesRequest {})).await {
            Ok(l) => l,
            Err((k, m)) => {
                return self
                    .viol
                    .add(format!("after the restart: LeaseLeases: {k}: {m}"))
            }
        };
        let served: HashSet<i64> = listed.leases.iter().map(|l| l.id).collect();
        for l in &r.leases {
            if l.remaining > Duration::from_secs(3) && !served.contains(&l.id) {
                self.viol.add(format!(
                    "after the restart lease {:x} ({:?} left in the restored generation) is not served",
                    l.id, l.remaining
                ));
            }
        }
    }

    /// The end: stop the load, a last checkpoint, SIGTERM, and the final
    /// snapshot must hold every acknowledged write.
    async fn finish(&mut self) {
        if let Some(load) = self.ep.as_mut().and_then(|e| e.load.take()) {
            load.stop(&self.viol).await;
        }
        if self.ep.is_some() {
            self.checkpoint().await;
        }
        self.close_epoch().await;
        if self.srv.pid().is_some() {
            match self.srv.terminate().await {
                Ok(s) if s.success() => {}
                Ok(s) => self.viol.add(format!("ephd exited with {s} after SIGTERM")),
                Err(e) => self.viol.add(e),
            }
            match server::generations(&self.data_dir).first() {
                Some((_, p)) => match Self::read_generation(p) {
                    Ok(r) => {
                        let lost = self.model.lock().acked_above(r.revision);
                        if lost > 0 {
                            self.viol.add(format!(
                                "the final snapshot (revision {}) misses {lost} acknowledged writes",
                                r.revision
                            ));
                        }
                        self.check_snapshot("the final snapshot", &r);
                    }
                    Err(e) => self
                        .viol
                        .add(format!("the final snapshot is unreadable: {e}")),
                },
                None => self.viol.add("no snapshot after the final SIGTERM"),
            }
        }
        for p in self.srv.panics() {
            self.viol.add(format!("the server panicked: {p}"));
        }
        let peak = self.srv.peak_rss_mb();
        if peak > self.a.rss_budget_mb as f64 {
            self.viol.add(format!(
                "the server's RSS reached {peak:.0} MiB, over the budget of {} MiB",
                self.a.rss_budget_mb
            ));
        }
        let errors = self.sh.errors.lock().clone();
        for (kind, sample) in &errors.samples {
            if sample.contains("database space exceeded") {
                self.viol.add(format!(
                    "writes refused for space ({kind}: {sample}) with a quota far above the data"
                ));
            }
            if sample.contains("requested lease not found") {
                self.viol.add(format!(
                    "event writes refused for an unknown lease ({kind}: {sample}) although the server adopts unknown leases"
                ));
            }
        }
    }

    fn report(&self, elapsed: Duration, seed: u64) -> Report {
        let m = self.model.lock();
        let ms = m.stats.clone();
        let acked: u64 = ms.acked.iter().sum();
        let errors = self.sh.errors.lock().clone();
        let rec = Recorder {
            hist: self.sh.latency.lock().clone(),
            ops: acked,
            ..Default::default()
        };
        let mut r = Report::new("soak", &rec, elapsed);
        r.endpoints = self.srv.endpoint();
        r.clients = self.a.writers.max(1) * 2;
        r.conns = self.c.conns();
        r.val_size = 700;
        r.key_space = (self.a.nodes + self.a.pods) as u64;
        r.server_peak_rss_mb = Some(self.srv.peak_rss_mb().round());
        let s = &self.stats;
        r.set("seed", seed);
        r.set("duration_s", r3(elapsed.as_secs_f64()));
        r.set("rounds", s.rounds);
        r.set("faults", json!(s.faults));
        r.set("restarts", s.restarts);
        r.set("checkpoints", s.checkpoints);
        r.set(
            "writes_acked",
            json!({"node_leases": ms.acked[0], "events": ms.acked[1], "pods": ms.acked[2]}),
        );
        r.set("writes_unknown_outcome", ms.unknown_outcome);
        r.set("writes_unknown_found_applied", ms.resolved_unknown);
        r.set("writes_seen_before_ack", ms.seen_before_ack);
        r.set("cas_conflicts", ms.cas_conflicts);
        r.set("writes_lost_in_crash_window", ms.lost_in_window);
        r.set("writes_lost_to_damaged_snapshots", ms.lost_to_damage);
        r.set("max_crash_window_s", r3(s.max_crash_window_s));
        r.set("objects_expired_seen", ms.expired_seen);
        r.set("write_errors", json!(errors.by_kind));
        r.set("write_error_samples", json!(errors.samples));
        r.set("compactions", self.sh.compactions.load(Ordering::Relaxed));
        r.set(
            "event_leases_granted",
            self.sh.leases_granted.load(Ordering::Relaxed),
        );
        r.set("watchers_created", self.wstats.created);
        r.set("watch_events_checked", self.wstats.events);
        r.set("watch_state_compares", self.wstats.compares);
        r.set("watch_compaction_cancels", self.wstats.compaction_cancels);
        r.set("watch_prev_kv_missing", self.wstats.prev_kv_missing);
        r.set(
            "below_compaction_cancels_checked",
            s.below_compaction_cancels,
        );
        r.set("dropped_streams", s.dropped_streams);
        r.set("dropped_calls", s.dropped_calls);
        r.set("malformed_cases", s.malformed_cases);
        r.set("burst_deletes_checked", s.burst_deletes_checked);
        r.set("burst_expiry_max_s", r3(s.burst_expiry_max_s));
        r.set("storm_lists_ok", s.storm_lists);
        r.set("storm_lists_shed", s.storm_shed);
        r.set("storm_lists_timed_out", s.storm_timeouts);
        r.set("storm_lists_expired", s.storm_expired);
        r.set("storm_mib_listed", r3(s.storm_mib));
        r.set("storm_list_max_s", r3(s.storm_max_s));
        r.set("snapshots_checked", s.snapshots_checked);
        r.set("damaged_moved_aside", s.moved_aside);
        r.set("started_empty", s.started_empty);
        r.set("cached_leases_adopted", s.leases_to_adopt);
        r.set("peak_rss_mib", r3(self.srv.peak_rss_mb()));
        r.set("rss_budget_mib", self.a.rss_budget_mb);
        r.set("server_panics", self.srv.panics().len());
        r.set("server_error_lines", self.srv.error_lines());
        r.set("model_objects", m.tracked());
        r.set("violations", self.viol.count());
        r.set("violation_kinds", json!(self.viol.kinds()));
        r.failures = self.viol.first();
        r
    }
}

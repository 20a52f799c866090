//! Command-line flags. Names follow etcd's where they overlap so operators
//! can reuse what they know; every flag can also be set from an `EPHD_*`
//! environment variable (handy in containers) or from etcd's `ETCD_*` one,
//! and `--config-file` reads etcd's YAML configuration file. etcd flags that
//! mean nothing for an in-memory single member are accepted with a warning
//! (`etcd`); [`load`] puts the sources together as etcd does.

pub mod auth;
mod cluster;
mod etcd;
mod exposure;
mod go_flags;
mod load;
mod wal_mode;
mod yaml;

pub use cluster::{
    member_id, ClusterConfig, Member, PeerAllowed, PeerTls, DEFAULT_CATCHUP_ENTRIES,
    DEFAULT_SNAPSHOT_COUNT,
};
pub use exposure::check_client_exposure;
pub use load::{load, load_from, LoadError, Loaded, Notice};
pub use wal_mode::WalMode;

use clap::Parser;
use serde::Serialize;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

/// ephd's configuration.
///
/// `Serialize` gives the effective configuration for the startup log line
/// ([`Config::effective`]), keyed by flag name. Nothing here is secret: the
/// TLS settings are file paths, never the files' contents.
#[derive(Parser, Debug, Clone, Serialize)]
#[serde(rename_all = "kebab-case")]
#[command(
    name = "ephd",
    version,
    about = "In-memory, etcd-v3-compatible store for Kubernetes' ephemeral resources",
    long_about = None,
    after_help = "Every flag can also be set from ETCD_<FLAG> (etcd's names: --max-txn-ops is \
ETCD_MAX_TXN_OPS). etcd 3.4's other flags are accepted with a warning saying why they do \
not apply, or refused when they set something ephd does not implement (README, Configuration)."
)]
pub struct Config {
    /// The auth flags (`--auth-token`, `--auth-token-ttl`,
    /// `--bcrypt-cost`).
    #[command(flatten)]
    #[serde(flatten)]
    pub auth: auth::AuthFlags,

    /// etcd's YAML configuration file (the format of etcd's
    /// `etcd.conf.yml.sample`). As in etcd, when it is given every other
    /// flag and environment variable is ignored.
    #[arg(long, env = "EPHD_CONFIG_FILE")]
    pub config_file: Option<PathBuf>,

    /// Human-readable member name, reported by MemberList.
    #[arg(long, env = "EPHD_NAME", default_value = "default")]
    pub name: String,

    /// Comma-separated URLs to serve clients on (http://host:port).
    #[arg(
        long,
        env = "EPHD_LISTEN_CLIENT_URLS",
        default_value = "http://127.0.0.1:2379",
        value_delimiter = ','
    )]
    pub listen_client_urls: Vec<String>,

    /// Comma-separated client URLs to advertise (defaults to the listen URLs).
    #[arg(long, env = "EPHD_ADVERTISE_CLIENT_URLS", value_delimiter = ',')]
    pub advertise_client_urls: Vec<String>,

    /// Largest write request accepted, in bytes (etcd's default: 1.5 MiB;
    /// at most 1 GiB here: an event holds a value and the one it replaced,
    /// and a snapshot record of it must stay under 4 GiB).
    #[arg(long, env = "EPHD_MAX_REQUEST_BYTES", default_value_t = 1_572_864, value_parser = parse_request_bytes)]
    pub max_request_bytes: usize,

    /// Most compares, or ops per branch, in one txn.
    #[arg(long, env = "EPHD_MAX_TXN_OPS", default_value_t = 128)]
    pub max_txn_ops: usize,

    /// Interval of periodic watch progress notifications (Go duration syntax, e.g. 10m, 5s).
    #[arg(
        long = "experimental-watch-progress-notify-interval",
        visible_alias = "watch-progress-notify-interval",
        env = "EPHD_WATCH_PROGRESS_NOTIFY_INTERVAL",
        default_value = "10m",
        value_parser = parse_duration
    )]
    #[serde(
        rename = "experimental-watch-progress-notify-interval",
        serialize_with = "duration_text"
    )]
    pub watch_progress_notify_interval: Duration,

    /// Directory for the optional snapshots (keys, leases, revision; the
    /// newest two are kept) and the revision state file. Without it ephd
    /// keeps everything in memory only.
    #[arg(long, env = "EPHD_DATA_DIR")]
    pub data_dir: Option<PathBuf>,

    /// Start from this snapshot file (what `etcdctl snapshot save` wrote
    /// from an ephd, or a generation from a `--data-dir`), all of it or
    /// not at all: a damaged file refuses the start. Revisions continue
    /// above the file's as after any restart. With `--data-dir` the
    /// directory must hold no snapshot yet; the restored state is written
    /// to it at once, so later starts continue from the directory.
    #[arg(long, env = "EPHD_RESTORE_SNAPSHOT")]
    pub restore_snapshot: Option<PathBuf>,

    /// The write-ahead log in `--data-dir` of a single member: `buffered`
    /// (the default with a data directory) writes every change before it is
    /// acknowledged, so a crash of the process loses nothing acknowledged;
    /// `fsync` also syncs it to the disk, so a crash of the machine loses
    /// nothing either; `none` keeps no log, and a crash loses the writes
    /// since the last snapshot.
    #[arg(long, env = "EPHD_WAL", value_parser = parse_wal_mode)]
    pub wal: Option<WalMode>,

    /// How often to write a snapshot when `--data-dir` is set (one is also
    /// written on SIGTERM/SIGINT); 0 writes only on shutdown. Without a
    /// write-ahead log (`--wal none`) a crash loses the writes since the
    /// last snapshot; with one, snapshots bound how much a restart replays.
    #[arg(long, env = "EPHD_SNAPSHOT_INTERVAL", default_value = "30s", value_parser = parse_duration)]
    #[serde(serialize_with = "duration_text")]
    pub snapshot_interval: Duration,

    /// Start above every revision ever issued (the revision state file in
    /// `--data-dir`, the snapshots' revisions plus a margin, and a
    /// wall-clock-derived revision), mark everything below as compacted and
    /// create `compact_rev_key`, so kube-apiserver never sees revisions go
    /// backwards across restarts. `false` starts at revision 1 (or the
    /// snapshot's revision) like etcd, implies `--strict-restore`, and is
    /// refused when the previous run held kube-apiserver's `compact_rev_key`
    /// and this start would lose it.
    #[arg(long, env = "EPHD_REVISION_CONTINUITY", default_value_t = true, action = clap::ArgAction::Set, value_parser = parse_bool)]
    pub revision_continuity: bool,

    /// Exact-etcd mode, for test suites and local development: a fresh
    /// start at revision 1 with nothing pre-created (`--revision-continuity`
    /// false), unknown lease IDs refused (`--lease-adopt-unknown-ttl` 0) and
    /// no compaction safety net (`--compaction-safety-net` 0), so a test
    /// that expects etcd's revisions, key counts or "requested lease not
    /// found" sees them. Any of those flags given explicitly still wins.
    /// Not for kube-apiserver: a restart starts revisions over, as a fresh
    /// etcd does, which breaks its compactor and watch cache.
    #[arg(long, env = "EPHD_ETCD_COMPAT", default_value_t = false, action = clap::ArgAction::Set, value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    pub etcd_compat: bool,

    /// Refuse to start when the newest snapshot in `--data-dir` (or the
    /// revision state file) cannot be read, leaving every file as it is.
    /// Without it, ephd moves the damaged file aside, restores the next
    /// older snapshot or starts empty above every known revision, and logs
    /// an ERROR saying what was lost.
    #[arg(long, env = "EPHD_STRICT_RESTORE", default_value_t = false, action = clap::ArgAction::Set, value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    pub strict_restore: bool,

    /// Adopt a lease ID that a put names but ephd does not know, with this TTL
    /// in seconds, instead of failing with "requested lease not found"
    /// (kube-apiserver reuses cached lease IDs for up to a minute after an
    /// ephd restart). 0 disables adoption: etcd's behaviour.
    #[arg(long, env = "EPHD_LEASE_ADOPT_UNKNOWN_TTL", default_value_t = 3660)]
    pub lease_adopt_unknown_ttl: i64,

    /// Comma-separated URLs for the HTTP endpoints /health, /livez, /readyz,
    /// /metrics and /version, e.g. `http://127.0.0.1:2381` (kubeadm's etcd
    /// already uses 2381 on control-plane nodes, so pick another port there).
    /// Empty by default, like etcd's flag.
    #[arg(long, env = "EPHD_LISTEN_METRICS_URLS", value_delimiter = ',')]
    pub listen_metrics_urls: Vec<String>,

    /// Auto-compaction: `periodic` keeps `--auto-compaction-retention` of
    /// wall-clock history, `revision` keeps that many revisions.
    #[arg(long, env = "EPHD_AUTO_COMPACTION_MODE", default_value = "periodic", value_parser = ["periodic", "revision"])]
    pub auto_compaction_mode: String,

    /// How much history auto-compaction keeps: a duration (`1h`, `30m`; a
    /// bare number means hours, as in etcd) in periodic mode, a revision
    /// count in revision mode. `0` disables auto-compaction (etcd's default;
    /// kube-apiserver compacts every 5 minutes by itself).
    #[arg(long, env = "EPHD_AUTO_COMPACTION_RETENTION", default_value = "0")]
    pub auto_compaction_retention: String,

    /// The compaction safety net: when no compaction (a client's Compact, or
    /// this one) has happened for this long, compact history to the revision
    /// that was current this long ago, so history cannot grow without bound
    /// when no client compacts (kube-apiserver compacts every 5 minutes, so
    /// with one attached it never fires). Logs a WARN each time. Go duration
    /// syntax; `0` turns it off (etcd keeps all history until a client
    /// compacts). Not used when `--auto-compaction-retention` is set, which
    /// bounds history already. `--etcd-compat` defaults it to 0.
    #[arg(long, env = "EPHD_COMPACTION_SAFETY_NET", default_value = "1h", value_parser = parse_duration)]
    #[serde(serialize_with = "duration_text")]
    pub compaction_safety_net: Duration,

    /// Space quota in bytes of accounted memory (keys, values and a fixed
    /// per-version overhead; Status reports it as the DB size). A write that
    /// would go above it fails with "etcdserver: mvcc: database space
    /// exceeded" and raises the NOSPACE alarm, as etcd does. 0 derives it
    /// from the memory available to the process (cgroup limit included):
    /// 40% of it, at most 8 GiB. A negative value turns the quota off.
    #[arg(
        long,
        env = "EPHD_QUOTA_BACKEND_BYTES",
        default_value_t = 0,
        allow_negative_numbers = true
    )]
    pub quota_backend_bytes: i64,

    /// Bytes of Range responses that may be built and in flight at once;
    /// a list that does not fit waits for room, and one that waits longer
    /// than `--overload-queue-timeout` fails with "etcdserver: too many
    /// requests" (ResourceExhausted) for the client to retry. 0 derives it
    /// from the memory available to the process: 20% of it, between 64 MiB
    /// and 2 GiB.
    #[arg(long, env = "EPHD_MAX_RESPONSE_BYTES_IN_FLIGHT", default_value_t = 0)]
    pub max_response_bytes_in_flight: u64,

    /// How long a Range may wait for a builder or for room under
    /// `--max-response-bytes-in-flight` before it is shed with "etcdserver:
    /// too many requests". Waiting costs no memory (a list is built only
    /// once it may proceed), so the default lets a storm of a thousand
    /// 10 MB lists drain at this machine's rate with at most one retry
    /// each, well within kube-apiserver's 60 s request timeout.
    #[arg(long, env = "EPHD_OVERLOAD_QUEUE_TIMEOUT", default_value = "20s", value_parser = parse_duration)]
    #[serde(serialize_with = "duration_text")]
    pub overload_queue_timeout: Duration,

    /// Server certificate (PEM) for https:// listen URLs.
    #[arg(long, env = "EPHD_CERT_FILE")]
    pub cert_file: Option<PathBuf>,

    /// Private key (PEM) of `--cert-file`.
    #[arg(long, env = "EPHD_KEY_FILE")]
    pub key_file: Option<PathBuf>,

    /// CA bundle (PEM): every client must present a certificate it signed,
    /// as in etcd, with or without `--client-cert-auth`.
    #[arg(long, env = "EPHD_TRUSTED_CA_FILE")]
    pub trusted_ca_file: Option<PathBuf>,

    /// Certificate revocation lists (PEM, one or more; or one DER list),
    /// as etcd's flag: a client presenting a certificate they revoke is
    /// refused at the TLS handshake. Read again with the certificates
    /// (`--tls-reload-interval`, SIGHUP), so a newly revoked certificate is
    /// refused without a restart. Needs `--trusted-ca-file`: without it no
    /// client certificate is asked for, so there is nothing to check (etcd
    /// ignores the flag then; ephd warns).
    #[arg(long, env = "EPHD_CLIENT_CRL_FILE")]
    pub client_crl_file: Option<PathBuf>,

    /// The client certificate's CN is the user of requests without a
    /// token, as in etcd. Needs `--trusted-ca-file`.
    #[arg(long, env = "EPHD_CLIENT_CERT_AUTH", default_value_t = false, action = clap::ArgAction::Set, value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    pub client_cert_auth: bool,

    /// How often the files of `--cert-file`, `--key-file`,
    /// `--trusted-ca-file` and `--client-crl-file` are read to see whether they changed; changed
    /// files that load (a certificate and its matching key) are used for new
    /// connections, established ones keep going. Certificates rotate without
    /// a restart, as cert-manager and Kubernetes secret volumes expect. SIGHUP
    /// reloads at once; 0 reloads only on SIGHUP.
    #[arg(long, env = "EPHD_TLS_RELOAD_INTERVAL", default_value = "5s", value_parser = parse_duration)]
    #[serde(serialize_with = "duration_text")]
    pub tls_reload_interval: Duration,
    /// Serve plaintext (`http://`) client URLs on addresses other than
    /// loopback. Without it ephd refuses to start on such a URL, because
    /// anyone who can reach it could read and write every key (ephd has no
    /// users); with it, ephd serves them and logs a WARN at startup. Use it
    /// only on a private test network; otherwise `https://` with a CA.
    #[arg(long, env = "EPHD_ALLOW_INSECURE_PLAINTEXT", default_value_t = false, action = clap::ArgAction::Set, value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    pub allow_insecure_plaintext: bool,
    /// Unary requests that take longer than this get a WARN line ("request
    /// took too long", at most one every 10 s), like etcd's "apply request
    /// took too long" at its default of 100ms. ephd times the whole call,
    /// from its arrival to its status (queueing and sending the response
    /// included), as `grpc_server_handling_seconds` does. 0 turns these
    /// warnings off.
    #[arg(
        long = "experimental-warning-apply-duration",
        env = "EPHD_WARNING_APPLY_DURATION",
        default_value = "100ms",
        value_parser = parse_duration
    )]
    #[serde(
        rename = "experimental-warning-apply-duration",
        serialize_with = "duration_text"
    )]
    pub warning_apply_duration: Duration,

    /// Cluster mode: bytes of snapshot data per frame when this member
    /// sends a snapshot to a peer (1 KiB to 64 MiB). Hidden from `--help`:
    /// the default suits every store; tests set it small to send a
    /// snapshot in many chunks.
    #[arg(
        long = "experimental-snapshot-chunk-bytes",
        env = "EPHD_EXPERIMENTAL_SNAPSHOT_CHUNK_BYTES",
        default_value_t = 4 << 20,
        value_parser = clap::value_parser!(u64).range(1024..=64 << 20),
        hide = true
    )]
    #[serde(rename = "experimental-snapshot-chunk-bytes")]
    pub snapshot_chunk_bytes: u64,

    /// Cluster mode: how Raft messages travel between members: `framed`
    /// (framed lanes, served and dialled, with gRPC streams for members
    /// that do not offer them) or `grpc` (gRPC streams only, as older
    /// builds did; for diagnosis). Hidden from `--help`; usually set as
    /// `EPHD_PEER_TRANSPORT`.
    #[arg(
        long = "peer-transport",
        env = "EPHD_PEER_TRANSPORT",
        default_value = "framed",
        value_parser = ["framed", "grpc"],
        hide = true
    )]
    #[serde(rename = "peer-transport")]
    pub peer_transport: String,

    /// Log format: `zap` writes one JSON object per line with etcd's field
    /// names (`level`, `ts`, `caller`, `msg`), as etcd 3.5+ always does;
    /// `capnslog` writes text lines, for etcd 3.4 command lines that ask for
    /// it. README, Logging, says why JSON is the default.
    #[arg(long, env = "EPHD_LOGGER", default_value = "zap", value_parser = ["zap", "capnslog"])]
    pub logger: String,

    /// Log filter (tracing syntax: error, warn, info, debug, or per-module
    /// directives); etcd's `panic` and `fatal` mean `error`.
    #[arg(long, env = "EPHD_LOG_LEVEL", default_value = "info")]
    pub log_level: String,

    /// etcd's deprecated switch for debug logging: the same as
    /// `--log-level=debug`.
    #[arg(long, env = "EPHD_DEBUG", default_value_t = false, action = clap::ArgAction::Set, value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    pub debug: bool,

    /// Where logs go, comma-separated: `stderr` (also etcd's `default`),
    /// `stdout`, or file paths (appended to); several outputs get every line.
    #[arg(
        long,
        env = "EPHD_LOG_OUTPUTS",
        default_value = "default",
        value_delimiter = ','
    )]
    pub log_outputs: Vec<String>,

    /// Most concurrent gRPC streams one client connection may open (HTTP/2
    /// SETTINGS_MAX_CONCURRENT_STREAMS), as etcd's flag.
    #[arg(long, env = "EPHD_MAX_CONCURRENT_STREAMS", default_value_t = u32::MAX)]
    pub max_concurrent_streams: u32,

    /// How long a connection may be idle before the server pings the client
    /// to check it is alive (Go duration syntax); 0 turns the pings off.
    #[arg(long, env = "EPHD_GRPC_KEEPALIVE_INTERVAL", default_value = "2h", value_parser = parse_duration)]
    #[serde(serialize_with = "duration_text")]
    pub grpc_keepalive_interval: Duration,

    /// How long the server waits for the answer to a keepalive ping before
    /// closing the connection; 0 waits forever.
    #[arg(long, env = "EPHD_GRPC_KEEPALIVE_TIMEOUT", default_value = "20s", value_parser = parse_duration)]
    #[serde(serialize_with = "duration_text")]
    pub grpc_keepalive_timeout: Duration,

    /// Cluster mode's settings, from etcd's clustering flags; set by
    /// [`load`] only when `--initial-cluster` names another member than
    /// this one. `None` runs the single-member path.
    #[arg(skip)]
    #[serde(skip)]
    pub cluster: Option<ClusterConfig>,

    /// A single member's `--initial-advertise-peer-urls`, shown in
    /// MemberList (cluster mode keeps its own in [`Config::cluster`]);
    /// empty shows etcd's default.
    #[arg(skip)]
    #[serde(skip)]
    pub advertise_peer_urls: Vec<String>,
}

impl Config {
    /// The configuration with all defaults, as if run with no flags.
    pub fn defaults() -> Self {
        Config::parse_from(["ephd"])
    }

    /// The tracing filter to log with: `--debug` wins (as in etcd), and
    /// etcd's `panic` and `fatal` levels, which tracing lacks, mean `error`.
    pub fn log_filter(&self) -> String {
        if self.debug {
            return "debug".to_string();
        }
        match self.log_level.trim() {
            "panic" | "fatal" | "dpanic" => "error".to_string(),
            other => other.to_string(),
        }
    }

    /// The configuration of exact-etcd mode (`--etcd-compat`) with every
    /// other setting at its default: what embedded test servers use.
    pub fn etcd_compat() -> Self {
        let mut config = Config::parse_from(["ephd", "--etcd-compat"]);
        config.apply_etcd_compat(|_| false);
        config
    }

    /// Gives the settings `--etcd-compat` covers etcd's values, unless
    /// `is_explicit` says the flag (by its clap id, e.g.
    /// `"revision_continuity"`) was given explicitly. Returns the flags kept
    /// as given, for the startup log. Does nothing without `--etcd-compat`.
    pub fn apply_etcd_compat(&mut self, is_explicit: impl Fn(&str) -> bool) -> Vec<&'static str> {
        let mut kept = Vec::new();
        if !self.etcd_compat {
            return kept;
        }
        if is_explicit("revision_continuity") {
            kept.push("--revision-continuity");
        } else {
            self.revision_continuity = false;
        }
        if is_explicit("lease_adopt_unknown_ttl") {
            kept.push("--lease-adopt-unknown-ttl");
        } else {
            self.lease_adopt_unknown_ttl = 0;
        }
        if is_explicit("compaction_safety_net") {
            kept.push("--compaction-safety-net");
        } else {
            self.compaction_safety_net = Duration::ZERO;
        }
        kept
    }

    /// The effective configuration as a JSON object keyed by flag name
    /// (durations in Go's syntax, as the flags take them), for the startup
    /// log line: what the server really runs with, whatever mix of flags,
    /// `ETCD_*`/`EPHD_*` variables and configuration file set it.
    pub fn effective(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or_else(|e| serde_json::Value::String(e.to_string()))
    }

    /// The write-ahead log mode in force: `--wal`, `buffered` by default
    /// with a data directory, `none` without one.
    pub fn wal_mode(&self) -> WalMode {
        match (&self.data_dir, self.wal) {
            (None, _) => WalMode::None,
            (Some(_), Some(mode)) => mode,
            (Some(_), None) => WalMode::Buffered,
        }
    }

    /// Whether `--logger` asks for JSON lines (`zap`) rather than text.
    pub fn json_logs(&self) -> bool {
        self.logger != "capnslog"
    }

    /// The URLs to advertise: `--advertise-client-urls`, or the listen URLs.
    pub fn advertised_urls(&self) -> Vec<String> {
        if self.advertise_client_urls.is_empty() {
            self.listen_client_urls.clone()
        } else {
            self.advertise_client_urls.clone()
        }
    }
}

/// Parses a listen URL such as `http://127.0.0.1:2379` into a socket
/// address and whether it is served with TLS (`https://`).
pub fn listen_addr(url: &str) -> Result<(SocketAddr, bool), String> {
    let (rest, tls) = if let Some(rest) = url.strip_prefix("http://") {
        (rest, false)
    } else if let Some(rest) = url.strip_prefix("https://") {
        (rest, true)
    } else {
        return Err(format!(
            "unsupported listen URL {url:?}: use http:// or https://"
        ));
    };
    let hostport = rest.trim_end_matches('/');
    let addr = hostport
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve listen URL {url:?}: {e}"))?
        .next()
        .ok_or_else(|| format!("listen URL {url:?} resolves to no address"))?;
    Ok((addr, tls))
}

/// What auto-compaction keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AutoCompaction {
    /// Never compact by itself.
    Off,
    /// Keep this much wall-clock history.
    Periodic(Duration),
    /// Keep this many revisions.
    Revisions(i64),
}

impl Config {
    /// The auto-compaction setting, validated.
    pub fn auto_compaction(&self) -> Result<AutoCompaction, String> {
        let r = self.auto_compaction_retention.trim();
        if r.is_empty() || r == "0" {
            return Ok(AutoCompaction::Off);
        }
        match self.auto_compaction_mode.as_str() {
            "revision" => r
                .parse::<i64>()
                .ok()
                .filter(|n| *n > 0)
                .map(AutoCompaction::Revisions)
                .ok_or_else(|| {
                    format!("--auto-compaction-retention {r:?} is not a revision count")
                }),
            _ => {
                let d = match r.parse::<u64>() {
                    Ok(hours) => Duration::from_secs(hours * 3600),
                    Err(_) => parse_duration(r)?,
                };
                Ok(if d.is_zero() {
                    AutoCompaction::Off
                } else {
                    AutoCompaction::Periodic(d)
                })
            }
        }
    }
}

/// Parses a boolean as Go's `strconv.ParseBool` does (`1`, `t`, `true`,
/// `TRUE`, `True`, `0`, `f`, ...), which etcd's boolean flags and `ETCD_*`
/// variables use.
pub fn parse_bool(s: &str) -> Result<bool, String> {
    etcd::go_bool(s)
}

/// A duration as [`parse_duration`] reads it back (`10m0s`, `250ms`, `0s`),
/// Go's own spelling, so the startup line shows what a flag would be given.
fn duration_text<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&go_duration(*d))
}

/// Go's `time.Duration.String()`: `1h2m3.5s`, `1.5ms`, `0s`.
pub fn go_duration(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".to_string();
    }
    if nanos < 1_000_000_000 {
        let (unit, per) = if nanos < 1_000 {
            ("ns", 1)
        } else if nanos < 1_000_000 {
            ("µs", 1_000)
        } else {
            ("ms", 1_000_000)
        };
        return format!("{}{unit}", fraction(nanos, per));
    }
    let secs = d.as_secs();
    let (h, m) = (secs / 3600, secs / 60 % 60);
    let s = fraction(nanos % 60_000_000_000, 1_000_000_000);
    match (h, m) {
        (0, 0) => format!("{s}s"),
        (0, m) => format!("{m}m{s}s"),
        (h, m) => format!("{h}h{m}m{s}s"),
    }
}

/// `n / per` with the remainder as decimals, trailing zeros dropped.
fn fraction(n: u128, per: u128) -> String {
    let (whole, rest) = (n / per, n % per);
    if rest == 0 {
        return whole.to_string();
    }
    let width = per.ilog10() as usize;
    let decimals = format!("{rest:0width$}");
    format!("{whole}.{}", decimals.trim_end_matches('0'))
}

/// The largest `--max-request-bytes` taken (see that flag).
pub const MAX_REQUEST_BYTES_LIMIT: usize = 1 << 30;

/// Parses `--max-request-bytes`: a byte count up to
/// [`MAX_REQUEST_BYTES_LIMIT`].
pub fn parse_request_bytes(s: &str) -> Result<usize, String> {
    let n: usize = s
        .trim()
        .parse()
        .map_err(|_| format!("not a byte count: {s:?}"))?;
    if n > MAX_REQUEST_BYTES_LIMIT {
        return Err(format!(
            "{n} is above the largest request ephd takes, {MAX_REQUEST_BYTES_LIMIT} bytes (1 GiB): \
             a snapshot record holds a value and the one it replaced and must stay under 4 GiB"
        ));
    }
    Ok(n)
}

fn parse_wal_mode(s: &str) -> Result<WalMode, String> {
    s.parse()
}

/// Parses Go's duration syntax (`1h30m`, `10s`, `250ms`, `0`), which etcd's
/// duration flags use.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    let mut total = Duration::ZERO;
    let mut rest = s;
    if rest.is_empty() {
        return Err("empty duration".into());
    }
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| format!("missing unit in duration {s:?}"))?;
        if digits == 0 {
            return Err(format!("invalid duration {s:?}"));
        }
        let value: f64 = rest[..digits]
            .parse()
            .map_err(|_| format!("invalid number in duration {s:?}"))?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let secs = match &rest[..unit_len] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" => 1e-6,
            "ns" => 1e-9,
            u => return Err(format!("unknown unit {u:?} in duration {s:?}")),
        };
        total += Duration::from_secs_f64(value * secs);
        rest = &rest[unit_len..];
    }
    Ok(total)
}

#[cfg(test)]
#[path = "config/tests.rs"]
mod tests;

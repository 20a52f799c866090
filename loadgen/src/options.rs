//! The command line every workload shares: `Common` (the options before or
//! after the subcommand) and `--transport`. Kept apart from what the options
//! drive (connections, budgets) so that the whole surface of the tool's
//! flags reads in one place, next to bench/README.md's table of them.

use clap::Args;
use std::io::IsTerminal;
use std::sync::Arc;
use std::time::Duration;

use crate::budget::Budget;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_accept_bare_seconds() {
        assert_eq!(parse_duration("2").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
    }
}

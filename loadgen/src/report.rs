//! The result of one run: a flat JSON object (one line with `--json`) or a
//! short human summary.

use crate::cpu::{peak_rss_mb, CpuSample};
use crate::record::Recorder;
use hdrhistogram::Histogram;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

/// What the watchers of a run saw. Every field is prefixed `watch_` so the
/// JSON line stays flat.
#[derive(Debug, Default, Clone, Serialize)]
pub struct WatchReport {
    /// Watchers attached.
    pub watch_watchers: u64,
    /// Watch streams they were spread over.
    pub watch_streams: u64,
    /// Events the watchers should have received for our writes
    /// (successful writes × watchers).
    pub watch_expected: u64,
    /// Events received, all kinds.
    pub watch_events: u64,
    /// PUT events received.
    pub watch_puts: u64,
    /// DELETE events received (lease expiry in event-churn).
    pub watch_deletes: u64,
    /// Expected events never received (must be 0).
    pub watch_lost: u64,
    /// Events whose revision was below one already received (must be 0).
    pub watch_out_of_order: u64,
    /// Events received twice (same revision and key) (must be 0).
    pub watch_duplicates: u64,
    /// PUT events for revisions this run did not see a write response for.
    pub watch_unexpected: u64,
    /// Events received after a progress notification that covered them (must be 0).
    pub watch_progress_violations: u64,
    /// Progress notifications received.
    pub watch_progress_notifies: u64,
    /// Watchers canceled by the server.
    pub watch_canceled: u64,
    /// Delivered events per second, from the first write to the last event.
    pub watch_events_per_s: f64,
    /// Delivery lag (write response → event received), ms.
    pub watch_lag_p50_ms: f64,
    /// See `watch_lag_p50_ms`.
    pub watch_lag_p99_ms: f64,
    /// See `watch_lag_p50_ms`.
    pub watch_lag_max_ms: f64,
    /// Events that arrived before their write's response did (lag counted 0).
    pub watch_early: u64,
    /// Whether every watcher caught up before `--drain-timeout`.
    pub watch_drained: bool,
    /// Up to 10 revisions whose events were lost, for debugging.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub watch_lost_revisions: Vec<i64>,
    /// Cancel reasons, if any watcher was canceled.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub watch_cancel_reasons: Vec<String>,
}

impl WatchReport {
    /// Lost, out-of-order, duplicate or progress-violating events, or cancels.
    pub fn anomalies(&self) -> u64 {
        self.watch_lost
            + self.watch_out_of_order
            + self.watch_duplicates
            + self.watch_progress_violations
            + self.watch_canceled
    }
}

/// One run's result.
#[derive(Debug, Default, Serialize)]
pub struct Report {
    /// Always "ephd-bench".
    pub tool: &'static str,
    /// The subcommand.
    pub workload: String,
    /// `--label`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// Endpoints as given.
    pub endpoints: String,
    /// Concurrent requests.
    pub clients: usize,
    /// Connections.
    pub conns: usize,
    /// `--transport` of the KV requests ("h2" or "tonic"): the client's own
    /// CPU per op depends on it.
    pub transport: &'static str,
    /// `--threads`: the client's runtime threads, which also move its CPU
    /// per op.
    pub client_threads: usize,
    /// Key size (bytes), when the workload has a fixed one.
    pub key_size: usize,
    /// Value size (bytes).
    pub val_size: usize,
    /// Distinct keys (or objects) written/read.
    pub key_space: u64,
    /// Target rate, 0 for unlimited.
    pub rate: f64,
    /// Successful measured ops.
    pub ops: u64,
    /// Failed measured ops.
    pub errors: u64,
    /// Failures by category (gRPC code or "timeout").
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub error_kinds: BTreeMap<String, u64>,
    /// One message per failure category.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub error_samples: BTreeMap<String, String>,
    /// Wall time of the measured phase, s.
    pub elapsed_s: f64,
    /// Successful ops per second.
    pub ops_per_s: f64,
    /// Latency of successful ops, ms.
    pub lat_mean_ms: f64,
    /// See `lat_mean_ms`.
    pub lat_p50_ms: f64,
    /// See `lat_mean_ms`.
    pub lat_p90_ms: f64,
    /// See `lat_mean_ms`.
    pub lat_p99_ms: f64,
    /// See `lat_mean_ms`.
    pub lat_p999_ms: f64,
    /// See `lat_mean_ms`.
    pub lat_max_ms: f64,
    /// Whether `--max-time` cut the run short.
    pub truncated: bool,
    /// Server CPU (utime+stime) over the measured phase, s.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_cpu_s: Option<f64>,
    /// Server CPU per successful op, µs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_cpu_us_per_op: Option<f64>,
    /// Server peak RSS (VmHWM) at the end, MiB.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_peak_rss_mb: Option<f64>,
    /// This tool's CPU per successful op, µs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_cpu_us_per_op: Option<f64>,
    /// Share of all CPUs used by other processes during the run (0..1);
    /// above ~0.1 the figures are probably disturbed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub other_cpu_frac: Option<f64>,
    /// Watch results, for workloads that watch.
    #[serde(flatten)]
    pub watch: Option<WatchReport>,
    /// Workload-specific figures.
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
    /// Checks that failed (the soak's violations, the first ones in
    /// full): any of them fails the run.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub failures: Vec<String>,
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

/// Rounds to 3 decimals, to keep the JSON readable.
pub fn r3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// (p50, p99, max) of a µs histogram, in ms.
pub fn lag_ms(h: &Histogram<u64>) -> (f64, f64, f64) {
    if h.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    (
        r3(ms(h.value_at_quantile(0.5))),
        r3(ms(h.value_at_quantile(0.99))),
        r3(ms(h.max())),
    )
}

impl Report {
    /// A report for `workload` with the measured phase's results.
    pub fn new(workload: &str, rec: &Recorder, elapsed: Duration) -> Report {
        let h = &rec.hist;
        let q = |x: f64| {
            if h.is_empty() {
                0.0
            } else {
                r3(ms(h.value_at_quantile(x)))
            }
        };
        let secs = elapsed.as_secs_f64().max(1e-9);
        Report {
            tool: "ephd-bench",
            workload: workload.to_string(),
            ops: rec.ops,
            errors: rec.errors.total(),
            error_kinds: rec.errors.by_kind.clone(),
            error_samples: rec.errors.samples.clone(),
            elapsed_s: r3(secs),
            ops_per_s: (rec.ops as f64 / secs).round(),
            lat_mean_ms: if h.is_empty() {
                0.0
            } else {
                r3(h.mean() / 1000.0)
            },
            lat_p50_ms: q(0.5),
            lat_p90_ms: q(0.9),
            lat_p99_ms: q(0.99),
            lat_p999_ms: q(0.999),
            lat_max_ms: if h.is_empty() { 0.0 } else { r3(ms(h.max())) },
            extra: rec
                .counters
                .iter()
                .map(|(k, v)| (k.to_string(), serde_json::Value::from(*v)))
                .collect(),
            ..Default::default()
        }
    }

    /// Adds CPU and memory figures measured between two samples.
    pub fn add_cpu(&mut self, before: &CpuSample, after: &CpuSample, server_pid: Option<u32>) {
        let d = before.delta(after);
        let (server, client) = (d.server_s, d.client_s);
        self.other_cpu_frac = d.other_frac.map(r3);
        let per_op = |s: f64| {
            if self.ops > 0 {
                Some((s * 1e6 / self.ops as f64).round())
            } else {
                None
            }
        };
        if let Some(s) = server {
            self.server_cpu_s = Some(r3(s));
            self.server_cpu_us_per_op = per_op(s);
        }
        self.client_cpu_us_per_op = client.and_then(per_op);
        if let Some(pid) = server_pid {
            self.server_peak_rss_mb = peak_rss_mb(pid).map(|m| m.round());
        }
    }

    /// Adds one workload-specific figure.
    pub fn set(&mut self, key: &str, value: impl Into<serde_json::Value>) {
        self.extra.insert(key.to_string(), value.into());
    }

    /// Errors, watch anomalies or failed checks: the run "failed" (exit
    /// code 3).
    pub fn failed(&self) -> bool {
        self.errors > 0
            || self.watch.as_ref().is_some_and(|w| w.anomalies() > 0)
            || !self.failures.is_empty()
    }

    /// The one-line JSON form.
    pub fn json(&self) -> String {
        serde_json::to_string(self).expect("a report always serializes")
    }

    /// The human summary.
    pub fn human(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{} against {}{}: {} clients over {} conns ({}, {} client thread{}), key {} B, value {} B, key space {}{}",
            self.workload,
            self.endpoints,
            self.label
                .as_ref()
                .map(|l| format!(" ({l})"))
                .unwrap_or_default(),
            self.clients,
            self.conns,
            self.transport,
            self.client_threads,
            if self.client_threads == 1 { "" } else { "s" },
            self.key_size,
            self.val_size,
            self.key_space,
            if self.rate > 0.0 {
                format!(", rate {}/s", self.rate)
            } else {
                String::new()
            }
        );
        let _ = writeln!(
            s,
            "  ops {}  errors {}  elapsed {:.2} s  throughput {:.0} ops/s{}",
            self.ops,
            self.errors,
            self.elapsed_s,
            self.ops_per_s,
            if self.truncated {
                "  (cut short by --max-time)"
            } else {
                ""
            }
        );
        for (k, v) in &self.error_kinds {
            let sample = self.error_samples.get(k).cloned().unwrap_or_default();
            let _ = writeln!(s, "    {v} × {k}: {sample}");
        }
        let _ = writeln!(
            s,
            "  latency ms: mean {:.3}  p50 {:.3}  p90 {:.3}  p99 {:.3}  p99.9 {:.3}  max {:.3}",
            self.lat_mean_ms,
            self.lat_p50_ms,
            self.lat_p90_ms,
            self.lat_p99_ms,
            self.lat_p999_ms,
            self.lat_max_ms
        );
        if let Some(w) = &self.watch {
            let _ = writeln!(
                s,
                "  watch: {} watchers on {} streams, events {} (expected {} for our writes; puts {}, deletes {}), {:.0} events/s",
                w.watch_watchers,
                w.watch_streams,
                w.watch_events,
                w.watch_expected,
                w.watch_puts,
                w.watch_deletes,
                w.watch_events_per_s
            );
            let _ = writeln!(
                s,
                "  watch: lost {}  out-of-order {}  duplicates {}  progress violations {}  canceled {}  unexpected {}{}",
                w.watch_lost,
                w.watch_out_of_order,
                w.watch_duplicates,
                w.watch_progress_violations,
                w.watch_canceled,
                w.watch_unexpected,
                if w.watch_drained { "" } else { "  (NOT drained)" }
            );
            if !w.watch_lost_revisions.is_empty() {
                let _ = writeln!(
                    s,
                    "  watch: first lost revisions {:?}",
                    w.watch_lost_revisions
                );
            }
            for r in &w.watch_cancel_reasons {
                let _ = writeln!(s, "  watch: canceled: {r}");
            }
            let _ = writeln!(
                s,
                "  watch lag ms (write response → event): p50 {:.3}  p99 {:.3}  max {:.3}  ({} events before their response)",
                w.watch_lag_p50_ms, w.watch_lag_p99_ms, w.watch_lag_max_ms, w.watch_early
            );
        }
        if self.extra.len() > 8 {
            // Many figures (the soak's): one per line.
            for (k, v) in &self.extra {
                let _ = writeln!(s, "  {k}: {v}");
            }
        } else if !self.extra.is_empty() {
            let kv: Vec<String> = self.extra.iter().map(|(k, v)| format!("{k} {v}")).collect();
            let _ = writeln!(s, "  {}", kv.join("  "));
        }
        if let Some(cpu) = self.server_cpu_us_per_op {
            let _ = writeln!(
                s,
                "  server: {:.1} µs CPU/op ({:.2} s CPU), peak RSS {} MiB",
                cpu,
                self.server_cpu_s.unwrap_or(0.0),
                self.server_peak_rss_mb
                    .map(|m| format!("{m:.0}"))
                    .unwrap_or_else(|| "?".into())
            );
        }
        if let Some(cpu) = self.client_cpu_us_per_op {
            let _ = writeln!(s, "  client: {cpu:.1} µs CPU/op");
        }
        for f in &self.failures {
            let _ = writeln!(s, "  FAILED: {f}");
        }
        if let Some(f) = self.other_cpu_frac {
            let _ = writeln!(
                s,
                "  other processes used {:.0}% of the CPUs{}",
                f * 100.0,
                if f > 0.1 {
                    " (figures probably disturbed)"
                } else {
                    ""
                }
            );
        }
        s
    }
}

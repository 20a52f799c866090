//! What a client records while it runs: the latency histogram of successful
//! ops, errors by category, and workload-specific counters. One `Recorder`
//! per client task, merged by the driver at the end of a phase, so the hot
//! path takes no lock.

use hdrhistogram::Histogram;
use std::collections::BTreeMap;
use std::time::Instant;

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

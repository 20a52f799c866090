//! The op budget of a phase: how many operations it may issue (`--total`),
//! until when (`--duration`, bounded by `--max-time`) and how fast
//! (`--rate`, an open-loop schedule). Every client of a phase draws its op
//! indices from one shared `Budget`, which is also what the progress bar
//! follows.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

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

//! The server's resident set over the run, sampled from /proc on a thread
//! of its own (so a busy client runtime does not space the samples out).
//!
//! The peak (VmHWM) says how far a storm pushed the server; the samples say
//! when, how long it stayed up, and whether the memory was given back once
//! the storms ended.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A process's resident set now (VmRSS), in MiB.
pub fn rss_mb(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

/// One sample: when (from the run's epoch) and the RSS in MiB.
pub type Sample = (Duration, f64);

/// A sampler thread reading one process's RSS every `every`.
pub struct Sampler {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Vec<Sample>>,
}

impl Sampler {
    /// Starts sampling `pid`; samples are timed from `epoch`. Stops by
    /// itself if the process goes away.
    pub fn start(pid: u32, epoch: Instant, every: Duration) -> Result<Sampler, String> {
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("rss-sampler".into())
            .spawn(move || {
                let mut out = Vec::new();
                while !stop2.load(Ordering::Relaxed) {
                    match rss_mb(pid) {
                        Some(mb) => out.push((epoch.elapsed(), mb)),
                        None => break,
                    }
                    std::thread::sleep(every);
                }
                out
            })
            .map_err(|e| format!("cannot start the RSS sampler: {e}"))?;
        Ok(Sampler { stop, thread })
    }

    /// Stops and returns the samples (the thread ends within one period).
    pub fn stop(self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or_default()
    }
}

/// The largest sample in `[from, to)`, MiB (0 without samples there).
pub fn max_between(samples: &[Sample], from: Duration, to: Duration) -> f64 {
    samples
        .iter()
        .filter(|(t, _)| *t >= from && *t < to)
        .map(|&(_, mb)| mb)
        .fold(0.0, f64::max)
}

/// The samples thinned to one per `step` (the largest of each step), as
/// `[seconds, MiB]` pairs for the JSON report.
pub fn series(samples: &[Sample], step: Duration) -> Vec<[f64; 2]> {
    let mut out: Vec<[f64; 2]> = Vec::new();
    let step = step.as_secs_f64().max(1e-3);
    for &(t, mb) in samples {
        let bucket = (t.as_secs_f64() / step).floor() * step;
        match out.last_mut() {
            Some(last) if last[0] == bucket => last[1] = last[1].max(mb),
            _ => out.push([bucket, mb]),
        }
    }
    for p in &mut out {
        p[0] = (p[0] * 10.0).round() / 10.0;
        p[1] = p[1].round();
    }
    out
}

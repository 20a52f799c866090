//! The one driver every workload runs on.
//!
//! Each workload used to repeat the same skeleton around its own request:
//! make the budget, start the progress bar, sample CPU, spawn one task per
//! client drawing op indices from the budget, join them, merge what they
//! recorded, sample CPU again, and fill the report's common fields. That
//! skeleton lives here once. A workload says what one op of one client is
//! (a [`Worker`]), runs its workers through [`setup`] (unmeasured phases
//! such as preloads) or [`measure`], and adds only what is its own to the
//! [`Report`] that [`Measured::report`] starts.
//!
//! The measured phase is timed and counted exactly as before the driver
//! existed: the budget starts when the workers are spawned, elapsed time
//! ends when the last one is joined, and the closing CPU sample is taken
//! when the report is made, so a workload that drains its watchers first
//! counts the server's delivery work in its CPU per op.

use crate::budget::Budget;
use crate::cpu::CpuSample;
use crate::options::Common;
use crate::progress::Progress;
use crate::record::Recorder;
use crate::report::Report;
use std::future::Future;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One client of a phase: what it does for each op the budget hands it.
/// Each worker runs in its own task and owns its state (its KV client,
/// its keys), so the hot path shares nothing but the budget.
pub trait Worker: Send + 'static {
    /// Runs op `n` (the phase's op index, from 0) and records its outcome
    /// in `rec`. `Break` ends this worker after the op; the others go on.
    fn op(&mut self, n: u64, rec: &mut Recorder) -> impl Future<Output = ControlFlow<()>> + Send;
}

/// Runs each worker in its own task until `budget` is used up or the
/// worker breaks, then returns the workers (with whatever state they kept)
/// and their merged results. A worker whose task panicked is left out of
/// the list and counted as a `client task` error.
pub async fn run<W: Worker>(budget: &Arc<Budget>, workers: Vec<W>) -> (Vec<W>, Recorder) {
    let handles: Vec<_> = workers
        .into_iter()
        .map(|w| tokio::spawn(drive(w, budget.clone())))
        .collect();
    let mut all = Recorder::default();
    let mut back = Vec::with_capacity(handles.len());
    for h in handles {
        match h.await {
            Ok((w, rec)) => {
                back.push(w);
                all.merge(rec);
            }
            Err(e) => all.errors.add("client task", &e.to_string()),
        }
    }
    (back, all)
}

/// One worker's task.
async fn drive<W: Worker>(mut worker: W, budget: Arc<Budget>) -> (W, Recorder) {
    let mut rec = Recorder::default();
    while let Some(n) = budget.next().await {
        let flow = worker.op(n, &mut rec).await;
        budget.complete();
        if flow.is_break() {
            break;
        }
    }
    (worker, rec)
}

/// An unmeasured phase (creating or preloading objects): exactly `ops`
/// ops over `workers`, bounded by `--max-time`, behind a spinner saying
/// `what`.
pub async fn setup<W: Worker>(
    c: &Common,
    what: &str,
    ops: u64,
    workers: Vec<W>,
) -> (Vec<W>, Recorder) {
    let spinner = Progress::spinner(c.progress_enabled(), what);
    let out = run(&Budget::fixed(ops, c.max_time), workers).await;
    spinner.finish();
    out
}

/// The measured phase of workload `name`: `workers` under the budget of
/// `--total`/`--duration`/`--rate` (`default_total` ops when neither is
/// given), with a progress bar, between two CPU samples.
pub async fn measure<W: Worker>(
    c: &Common,
    name: &'static str,
    default_total: u64,
    workers: Vec<W>,
) -> Measured {
    measure_keeping_workers(c, name, default_total, workers)
        .await
        .0
}

/// [`measure`], also handing back the workers, for a workload whose
/// clients keep what the report needs beyond the [`Recorder`] (failover's
/// acknowledgement times).
pub async fn measure_keeping_workers<W: Worker>(
    c: &Common,
    name: &'static str,
    default_total: u64,
    workers: Vec<W>,
) -> (Measured, Vec<W>) {
    let clients = workers.len();
    let budget = c.budget(default_total);
    let progress = Progress::for_budget(c.progress_enabled(), name, budget.clone());
    let cpu0 = CpuSample::take(c.server_pid);
    let (workers, rec) = run(&budget, workers).await;
    let elapsed = budget.start().elapsed();
    progress.finish();
    let m = Measured {
        workload: name,
        rec,
        clients,
        start: budget.start(),
        elapsed,
        truncated: budget.truncated(),
        cpu0,
        server_pid: c.server_pid,
    };
    (m, workers)
}

/// The keys and values a workload wrote or read, for the report.
pub struct Shape {
    /// Key size (bytes), when the workload has a fixed one.
    pub key_size: usize,
    /// Value size (bytes).
    pub val_size: usize,
    /// Distinct keys (or objects) written or read.
    pub key_space: u64,
}

/// What a measured phase leaves for its report.
pub struct Measured {
    workload: &'static str,
    /// The merged results of every worker; workloads may take their own
    /// counters out before the report is made.
    pub rec: Recorder,
    clients: usize,
    start: Instant,
    elapsed: Duration,
    truncated: bool,
    cpu0: CpuSample,
    server_pid: Option<u32>,
}

impl Measured {
    /// When the measured phase began (watch events/s count from here).
    pub fn start(&self) -> Instant {
        self.start
    }

    /// Wall time of the measured phase.
    pub fn elapsed(&self) -> Duration {
        self.elapsed
    }

    /// The report of the phase over `conns` connections, with the CPU used
    /// from the phase's start until now: make it after any drain whose
    /// server work should count.
    pub fn report(&self, conns: usize, shape: Shape) -> Report {
        let cpu1 = CpuSample::take(self.server_pid);
        let mut r = Report::new(self.workload, &self.rec, self.elapsed);
        r.clients = self.clients;
        r.conns = conns;
        r.key_size = shape.key_size;
        r.val_size = shape.val_size;
        r.key_space = shape.key_space;
        r.truncated = self.truncated;
        r.add_cpu(&self.cpu0, &cpu1, self.server_pid);
        r
    }
}

//! Differential suite: seeded random operation sequences are applied to a
//! stock etcd (the reference) and to a candidate server through the raw
//! generated tonic clients, and every response — or gRPC error code and
//! message — is compared field by field after normalization (see
//! `normalize`). Watches are compared as whole per-watch event transcripts
//! once the driver has waited for every event the history predicts.
//!
//! Environment knobs (all optional):
//! - `EPHD_DIFF_SEEDS=1,2,3` — seeds to run (default: `DEFAULT_SEEDS`);
//! - `EPHD_DIFF_OPS=N` — ops per seed (default: `DEFAULT_OPS`);
//! - `EPHD_DIFF_SHOW=N` — how many mismatches to print in full;
//! - `EPHD_DIFF_CANDIDATE=etcd` — compare against a second stock etcd
//!   instead of ephd (harness debugging).

mod diff;
mod history;
mod normalize;
mod ops;
mod rng;
mod streams;
mod target;

use std::collections::HashSet;
use std::time::Duration;

use bytes::Bytes;
use ephd::proto::etcdserverpb::WatchCreateRequest;

use crate::harness::{Server, StockEtcd};
use crate::support;
use ephd::proto::mvccpb::Event;
use history::WatchSpec;
use ops::{Generator, Model, Op, WATCH_STREAMS};
use target::{Outcome, Target, WatchHandle, HISTORY_STREAM, IMPATIENT_TIMEOUT};

const DEFAULT_SEEDS: [u64; 4] = [0x5EED_0001, 0x5EED_0002, 0x5EED_0003, 0x5EED_0004];
const DEFAULT_OPS: usize = 1000;
/// Bound for a watch to deliver the events the history predicts.
const WATCH_SYNC_TIMEOUT: Duration = Duration::from_secs(10);
/// etcd moves a watch that starts in the past from its "unsynced" to its
/// "synced" group in a background loop that runs every 100 ms, even when
/// there is nothing to catch up on. A compaction while the watch is still
/// unsynced cancels it; nothing on the wire tells when it is synced, so a
/// compaction waits until the newest past-start watch is this old.
const UNSYNCED_WATCH_SETTLE: Duration = Duration::from_millis(300);
/// How many mismatches are printed in full (`EPHD_DIFF_SHOW` overrides).
const SHOWN_MISMATCHES: usize = 8;

/// One difference between the reference and the candidate.
pub struct Mismatch {
    pub seed: u64,
    /// Op index, or a label for the final watch comparison.
    pub at: String,
    pub op: String,
    pub reference: String,
    pub candidate: String,
}

/// A watch created on both targets.
struct Registered {
    spec: WatchSpec,
    /// Reference first, candidate second.
    handles: [WatchHandle; 2],
    /// Already reported as incomplete on the candidate.
    flagged: bool,
    /// When a watch starting in the past (unsynced in etcd) was created.
    unsynced_since: Option<tokio::time::Instant>,
}

/// Applies `n_ops` ops generated from `seed` to both (fresh) servers and
/// returns every mismatch. Panics if the reference itself misbehaves in a
/// way that means the harness is wrong (timeouts, model disagreement).
pub async fn run_seed(reference: &str, candidate: &str, seed: u64, n_ops: usize) -> Vec<Mismatch> {
    let mut d = Driver {
        stats: Stats::default(),
        candidate_sync_budget: WATCH_SYNC_TIMEOUT,
        a: Target::connect(reference).await,
        b: Target::connect(candidate).await,
        model: Model {
            rev: 1,
            ..Model::default()
        },
        watches: Vec::new(),
        mismatches: Vec::new(),
        seed,
    };
    // Watch #0 records the full history; it drives the expectations.
    let history = Op::WatchCreate {
        stream: HISTORY_STREAM,
        req: WatchCreateRequest {
            key: Bytes::from_static(b"\0"),
            range_end: Bytes::from_static(b"\0"),
            prev_kv: true,
            ..WatchCreateRequest::default()
        },
    };
    d.step("history watch".to_string(), &history).await;
    assert!(
        d.watches.first().is_some_and(|w| w.handles[0].id.is_some()),
        "seed {seed:#x}: stock etcd did not create the history watch"
    );
    let mut generator = Generator::new(seed);
    for i in 0..n_ops {
        let op = generator.next_op(&d.model);
        if matches!(op, Op::Compact(_)) {
            // A compaction cancels watches that are still catching up;
            // make that deterministic by letting every watch catch up first.
            d.sync_watches().await;
            d.settle_unsynced_watches().await;
        }
        d.step(i.to_string(), &op).await;
    }
    d.sync_watches().await;
    d.compare_transcripts();
    d.cancel_all().await;
    let events: usize = d
        .watches
        .iter()
        .map(|w| d.a.transcript(&w.handles[0]).events.len())
        .sum();
    eprintln!(
        "differential seed {seed:#x}: {n_ops} ops, final revision {}, {} watches delivering {events} \
         events, {} mismatches\n{}",
        d.model.rev,
        d.watches.len(),
        d.mismatches.len(),
        d.stats
    );
    d.mismatches
}

/// What the reference answered, per op kind: shows the generator covers
/// both successes and each error path (printed with `--nocapture`).
#[derive(Default)]
struct Stats(std::collections::BTreeMap<String, usize>);

impl Stats {
    fn record(&mut self, o: &Outcome) {
        let kind = format!("{o:?}");
        let kind = kind.split('(').next().unwrap_or("?");
        let detail = match (o, o.failure()) {
            (_, Some(f)) => format!("error {f}"),
            (Outcome::Txn(Ok(t)), _) => format!("ok, succeeded={}", t.succeeded),
            (Outcome::LeaseGrantRevoke(Ok(g), _), _) => format!("ok, ttl={}", g.ttl),
            (Outcome::WatchCreated(Ok(w)), _) => format!("ok, canceled={}", w.canceled),
            _ => "ok".to_string(),
        };
        *self.0.entry(format!("{kind}: {detail}")).or_default() += 1;
    }
}

impl std::fmt::Display for Stats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (k, n) in &self.0 {
            writeln!(f, "  {n:5} {k}")?;
        }
        Ok(())
    }
}

struct Driver {
    stats: Stats,
    /// Deadline per watch sync for the candidate (shrinks after a miss).
    candidate_sync_budget: Duration,
    a: Target,
    b: Target,
    model: Model,
    watches: Vec<Registered>,
    mismatches: Vec<Mismatch>,
    seed: u64,
}

/// Both servers are asked at the same moment, but the remaining TTL is
/// whole seconds: a read right at a second's boundary may round one way on
/// one server and the other way on the other. One second apart counts as
/// the same answer.
fn same_second(reference: &Outcome, mut candidate: Outcome) -> Outcome {
    if let (Outcome::LeaseTimeToLive(Ok(a)), Outcome::LeaseTimeToLive(Ok(b))) =
        (reference, &mut candidate)
    {
        if (a.ttl - b.ttl).abs() <= 1 {
            b.ttl = a.ttl;
        }
    }
    candidate
}

impl Driver {
    async fn step(&mut self, at: String, op: &Op) {
        let (ra, rb) = tokio::join!(self.a.exec(op), self.b.exec(op));
        if let Some(f) = ra.reference_failure() {
            panic!(
                "seed {:#x} op {at}: stock etcd gave no answer ({f}) to {op:#?}",
                self.seed
            );
        }
        self.stats.record(&ra);
        let rb = same_second(&ra, rb);
        if ra != rb {
            self.mismatch(
                at,
                format!("{op:#?}"),
                format!("{ra:#?}"),
                format!("{rb:#?}"),
            );
        }
        self.learn(op, &ra, &rb);
    }

    fn mismatch(&mut self, at: String, op: String, reference: String, candidate: String) {
        self.mismatches.push(Mismatch {
            seed: self.seed,
            at,
            op,
            reference,
            candidate,
        });
    }

    /// Updates the generator's model from the reference's answer.
    fn learn(&mut self, op: &Op, ra: &Outcome, rb: &Outcome) {
        if let Some(rev) = ra.revision() {
            self.model.rev = self.model.rev.max(rev);
        }
        match (op, ra) {
            (Op::Compact(req), Outcome::Compact(Ok(_))) => self.model.compact_rev = req.revision,
            (Op::LeaseGrant(req) | Op::LeaseGrantRevoke(req), _) if req.id == 0 => {
                self.model.issued += 1
            }
            (Op::WatchCreate { stream, req }, Outcome::WatchCreated(created)) => {
                let handle = |o: &Outcome| WatchHandle {
                    stream: *stream,
                    id: match o {
                        Outcome::WatchCreated(Ok(r)) if r.created && !r.canceled => {
                            Some(r.watch_id)
                        }
                        _ => None,
                    },
                };
                let created_rev = created
                    .as_ref()
                    .ok()
                    .and_then(|r| r.header.as_ref())
                    .map_or(0, |h| h.revision);
                let effective_start = if req.start_revision > 0 {
                    req.start_revision
                } else {
                    created_rev + 1
                };
                self.watches.push(Registered {
                    spec: WatchSpec {
                        req: req.clone(),
                        effective_start,
                    },
                    handles: [handle(ra), handle(rb)],
                    flagged: false,
                    unsynced_since: (req.start_revision > 0 && req.start_revision <= created_rev)
                        .then(tokio::time::Instant::now),
                });
                self.model.watches += 1;
                let live = matches!(ra, Outcome::WatchCreated(Ok(r)) if r.created && !r.canceled);
                if live && *stream < WATCH_STREAMS {
                    let current = &mut self.model.progress_streams[*stream];
                    *current = Some(current.unwrap_or(true) && req.start_revision == 0);
                }
            }
            _ => {}
        }
    }

    /// Waits until every watch on both servers delivered all events up to
    /// the current revision (per the reference history) or was canceled.
    /// Each server gets one deadline per sync; a candidate watch that misses
    /// it is reported once and not waited for again, and after the first
    /// miss the candidate gets a short deadline, so a broken candidate
    /// cannot stretch the run.
    async fn sync_watches(&mut self) {
        let rev = self.model.rev;
        let history_handle = self.watches[0].handles[0].clone();
        if rev >= 2 {
            let complete = self
                .a
                .wait_revision(&history_handle, rev, WATCH_SYNC_TIMEOUT)
                .await;
            assert!(
                complete,
                "seed {:#x}: stock etcd's history watch did not reach revision {rev}",
                self.seed
            );
        }
        let history = self.a.transcript(&history_handle).events;
        let now = tokio::time::Instant::now();
        let (deadline_a, deadline_b) = (now + WATCH_SYNC_TIMEOUT, now + self.candidate_sync_budget);
        for k in 0..self.watches.len() {
            let expected = self.watches[k].spec.expected(&history, rev);
            let [ha, hb] = self.watches[k].handles.clone();
            let flagged = self.watches[k].flagged;
            let left = |deadline: tokio::time::Instant| {
                deadline.saturating_duration_since(tokio::time::Instant::now())
            };
            let (ok_a, ok_b) =
                tokio::join!(self.a.wait_watch(&ha, expected, left(deadline_a)), async {
                    flagged || self.b.wait_watch(&hb, expected, left(deadline_b)).await
                });
            if !ok_a {
                self.model_bug(k, &history, rev, expected);
            }
            if !ok_b {
                self.watches[k].flagged = true;
                self.candidate_sync_budget = IMPATIENT_TIMEOUT;
                let got = self.b.transcript(&hb);
                self.mismatch(
                    format!("watch sync at revision {rev}"),
                    format!("watch #{k}: {:#?}", self.watches[k].spec),
                    format!("{expected} events (or a cancel)"),
                    format!("{} events in time: {got:#?}", got.events.len()),
                );
            }
        }
    }

    /// The reference's watch did not deliver what the history predicts:
    /// the expectation model is wrong, not the server. Shows the difference.
    fn model_bug(&self, k: usize, history: &[Event], rev: i64, expected: usize) -> ! {
        let spec = &self.watches[k].spec;
        let want: Vec<String> = history
            .iter()
            .filter(|e| e.kv.as_ref().is_some_and(|kv| kv.mod_revision <= rev))
            .filter(|e| spec.matches(e))
            .map(history::summary)
            .collect();
        let got = self.a.transcript(&self.watches[k].handles[0]).events;
        let got: Vec<String> = got.iter().map(history::summary).collect();
        panic!(
            "seed {:#x}: stock etcd's watch #{k} ({spec:?}) did not deliver the {expected} \
             events its history predicts up to revision {rev}: harness model bug\n{}",
            self.seed,
            diff::line_diff(&want.join("\n"), &got.join("\n"))
        );
    }

    /// See `UNSYNCED_WATCH_SETTLE`: a bounded wait with no observable
    /// alternative, only taken right after a past-start watch was created.
    async fn settle_unsynced_watches(&mut self) {
        let newest = self.watches.iter().filter_map(|w| w.unsynced_since).max();
        if let Some(since) = newest {
            tokio::time::sleep_until(since + UNSYNCED_WATCH_SETTLE).await;
        }
    }

    /// Compares each watch's delivered events and server-side cancel.
    fn compare_transcripts(&mut self) {
        for k in 0..self.watches.len() {
            let [ha, hb] = self.watches[k].handles.clone();
            let (ta, tb) = (self.a.transcript(&ha), self.b.transcript(&hb));
            if ta != tb {
                let spec = format!("watch #{k}: {:#?}", self.watches[k].spec);
                self.mismatch(
                    "final watch transcripts".into(),
                    spec,
                    format!("{ta:#?}"),
                    format!("{tb:#?}"),
                );
            }
        }
    }

    /// Cancels every live watch and compares the cancel responses.
    async fn cancel_all(&mut self) {
        for k in 0..self.watches.len() {
            let [ha, hb] = self.watches[k].handles.clone();
            if ha.id.is_none() || self.a.transcript(&ha).canceled.is_some() {
                continue;
            }
            let (ra, rb) = tokio::join!(self.a.cancel_watch(&ha), self.b.cancel_watch(&hb));
            if let Err(f) = &ra {
                panic!(
                    "seed {:#x}: stock etcd did not cancel watch #{k}: {f}",
                    self.seed
                );
            }
            if ra != rb {
                self.mismatch(
                    format!("cancel of watch #{k}"),
                    format!("{:#?}", self.watches[k].spec),
                    format!("{ra:#?}"),
                    format!("{rb:#?}"),
                );
            }
        }
    }
}

/// Seeds and op count, from the environment or the defaults.
fn config() -> (Vec<u64>, usize) {
    let seeds = std::env::var("EPHD_DIFF_SEEDS")
        .ok()
        .map(|s| {
            s.split(',')
                .map(|x| parse_u64(x.trim()).unwrap_or_else(|| panic!("bad seed {x:?}")))
                .collect()
        })
        .unwrap_or_else(|| DEFAULT_SEEDS.to_vec());
    let ops = std::env::var("EPHD_DIFF_OPS")
        .ok()
        .map(|s| s.parse().expect("EPHD_DIFF_OPS must be a number"))
        .unwrap_or(DEFAULT_OPS);
    (seeds, ops)
}

fn shown_mismatches() -> usize {
    std::env::var("EPHD_DIFF_SHOW")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(SHOWN_MISMATCHES)
}

fn parse_u64(s: &str) -> Option<u64> {
    match s.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => s.parse().ok(),
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// Runs every seed on fresh servers made by `candidate` and fails with a
/// readable report if anything differed.
fn run_suite<S: Server>(label: &str, seeds: &[u64], ops: usize, candidate: impl Fn() -> S) {
    let rt = runtime();
    let mut all = Vec::new();
    for &seed in seeds {
        // Fresh servers per seed: both must start at revision 1.
        let reference = StockEtcd::start();
        let other = candidate();
        let found = rt.block_on(run_seed(
            &reference.endpoint(),
            &other.endpoint(),
            seed,
            ops,
        ));
        all.extend(found);
    }
    assert!(
        all.is_empty(),
        "{}",
        diff::report(label, seeds, ops, &all, shown_mismatches())
    );
}

#[test]
fn differential_ephd_vs_stock_etcd() {
    let (seeds, ops) = config();
    if std::env::var("EPHD_DIFF_CANDIDATE").as_deref() == Ok("etcd") {
        run_suite("second stock etcd", &seeds, ops, StockEtcd::start);
    } else {
        run_suite("ephd", &seeds, ops, || support::ephd(&[]));
    }
}

/// Two stock etcds must never differ: guards the generator, normalization
/// and watch bookkeeping against false positives.
#[test]
fn differential_harness_selfcheck_etcd_vs_etcd() {
    run_suite("second stock etcd", &[0x5E1F_C4EC], 600, StockEtcd::start);
}

#[test]
fn differential_generator_is_deterministic() {
    let ops = |seed| {
        let mut g = Generator::new(seed);
        let mut m = Model::default();
        (0..200)
            .map(|i| {
                m.rev = i;
                format!("{:?}", g.next_op(&m))
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(ops(7), ops(7));
    assert_ne!(ops(7), ops(8));
    let distinct: HashSet<String> = ops(7).into_iter().collect();
    assert!(distinct.len() > 150, "generator repeats itself");
}

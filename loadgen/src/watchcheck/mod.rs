//! Watchers that verify what they receive.
//!
//! Writers record, per revision, when their write's response arrived
//! ([`RevTable::written`]). Watchers record every PUT event they receive
//! against the same table, which gives:
//! * delivery lag: event receipt minus write response (0 when the event
//!   beat the response);
//! * lost events: a written revision that some watcher never received;
//! * duplicates and order: each watcher checks that revisions never go
//!   backwards and that no (revision, key) pair comes twice, and that no
//!   event arrives for a revision a progress notification already covered.
//!
//! Every write of these workloads changes exactly one watched key, so each
//! written revision must reach each watcher exactly once.

mod revtable;

pub use revtable::RevTable;

use crate::pool::Pool;
use crate::record::histogram;
use crate::report::{lag_ms, r3, WatchReport};
use bytes::Bytes;
use ephd::proto::etcdserverpb::{
    watch_request::RequestUnion, WatchCreateRequest, WatchRequest, WatchResponse,
};
use ephd::proto::mvccpb::event::EventType;
use hdrhistogram::Histogram;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

/// What to watch.
#[derive(Debug, Clone)]
pub struct WatchOpts {
    /// First key.
    pub key: Bytes,
    /// Range end (prefix end for a prefix watch).
    pub range_end: Bytes,
    /// Ask for previous versions.
    pub prev_kv: bool,
    /// Ask for periodic progress notifications.
    pub progress_notify: bool,
}

/// When a stream may stop: every watcher has reached `rev` and seen
/// `deletes` DELETE events; or `stop` (the drain timed out).
#[derive(Debug, Clone, Copy, Default)]
struct Goal {
    rev: i64,
    deletes: u64,
    stop: bool,
}

#[derive(Default)]
struct WatcherState {
    last_rev: i64,
    keys_at_last: Vec<Bytes>,
    progress_rev: i64,
    deletes: u64,
}

struct StreamStats {
    events: u64,
    puts: u64,
    deletes: u64,
    out_of_order: u64,
    duplicates: u64,
    progress: u64,
    progress_violations: u64,
    canceled: u64,
    cancel_reasons: Vec<String>,
    early: u64,
    lag: Histogram<u64>,
    last_event: Option<Instant>,
    drained: bool,
}

impl Default for StreamStats {
    fn default() -> Self {
        StreamStats {
            events: 0,
            puts: 0,
            deletes: 0,
            out_of_order: 0,
            duplicates: 0,
            progress: 0,
            progress_violations: 0,
            canceled: 0,
            cancel_reasons: Vec::new(),
            early: 0,
            lag: histogram(),
            last_event: None,
            drained: false,
        }
    }
}

struct Stream {
    // Kept open until the end: dropping it half-closes the stream.
    _requests: mpsc::Sender<WatchRequest>,
    task: JoinHandle<StreamStats>,
}

/// A set of checking watchers over one or more streams.
pub struct WatchSet {
    table: Arc<RevTable>,
    streams: Vec<Stream>,
    goal: watch::Sender<Goal>,
    watchers: usize,
    // Events received so far, and the count when the measured phase began.
    received: Arc<AtomicU64>,
    baseline: u64,
}

impl WatchSet {
    /// The apiserver's watch on a resource prefix (`prev_kv`,
    /// `progress_notify`), or `None` when no watchers are wanted.
    pub async fn open_prefix(
        pool: &Pool,
        prefix: &Bytes,
        watchers: usize,
        streams: usize,
        table: &Arc<RevTable>,
        timeout: Duration,
    ) -> Result<Option<WatchSet>, String> {
        if watchers == 0 {
            return Ok(None);
        }
        let opts = WatchOpts {
            key: prefix.clone(),
            range_end: crate::keys::prefix_end(prefix),
            prev_kv: true,
            progress_notify: true,
        };
        WatchSet::open(pool, &opts, watchers, streams, table.clone(), timeout)
            .await
            .map(Some)
    }

    /// Opens `streams` streams carrying `watchers` watchers in all, and
    /// waits until every watcher is created.
    pub async fn open(
        pool: &Pool,
        opts: &WatchOpts,
        watchers: usize,
        streams: usize,
        table: Arc<RevTable>,
        timeout: Duration,
    ) -> Result<WatchSet, String> {
        let streams = streams.clamp(1, watchers.max(1));
        let (goal, goal_rx) = watch::channel(Goal::default());
        let create = WatchRequest {
            request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
                key: opts.key.clone(),
                range_end: opts.range_end.clone(),
                prev_kv: opts.prev_kv,
                progress_notify: opts.progress_notify,
                ..Default::default()
            })),
        };
        let received = Arc::new(AtomicU64::new(0));
        let mut set = WatchSet {
            table: table.clone(),
            streams: Vec::new(),
            goal,
            watchers,
            received: received.clone(),
            baseline: 0,
        };
        let mut ready = Vec::new();
        for s in 0..streams {
            let n = watchers / streams + usize::from(s < watchers % streams);
            let (tx, rx) = mpsc::channel(n + 8);
            for _ in 0..n {
                tx.send(create.clone())
                    .await
                    .map_err(|_| "watch request channel closed".to_string())?;
            }
            let mut client = pool.watch(s);
            let resp = tokio::time::timeout(timeout, client.watch(ReceiverStream::new(rx)))
                .await
                .map_err(|_| "opening a watch stream timed out".to_string())?
                .map_err(|e| format!("opening a watch stream: {e}"))?;
            let (ready_tx, ready_rx) = oneshot::channel();
            let task = tokio::spawn(run_stream(
                resp.into_inner(),
                n,
                table.clone(),
                received.clone(),
                goal_rx.clone(),
                ready_tx,
            ));
            ready.push(ready_rx);
            set.streams.push(Stream {
                _requests: tx,
                task,
            });
        }
        for r in ready {
            match tokio::time::timeout(timeout, r).await {
                Ok(Ok(Ok(()))) => {}
                Ok(Ok(Err(e))) => return Err(format!("creating watchers: {e}")),
                Ok(Err(_)) => return Err("a watch stream ended during creation".into()),
                Err(_) => return Err("creating watchers timed out".into()),
            }
        }
        Ok(set)
    }

    /// Marks the start of the measured phase: events received before it
    /// (setup writes) do not count towards events/s.
    pub fn mark_start(&mut self) {
        self.baseline = self.received.load(Ordering::Acquire);
    }

    /// Waits until every watcher has received everything up to the last
    /// write (and `deletes` DELETE events each), at most `timeout`, then
    /// closes the streams and reports. `writes_start` is when the writes
    /// began (for events/s). Also returns the time of the last event.
    pub async fn finish(
        self,
        deletes: u64,
        timeout: Duration,
        writes_start: Instant,
    ) -> (WatchReport, Option<Instant>) {
        let goal = Goal {
            rev: self.table.max_written(),
            deletes,
            stop: false,
        };
        self.goal.send_replace(goal);
        let deadline = tokio::time::Instant::now() + timeout;
        let mut all = Vec::new();
        let mut keep = Vec::new();
        for mut s in self.streams {
            let stats = match tokio::time::timeout_at(deadline, &mut s.task).await {
                Ok(r) => r,
                Err(_) => {
                    self.goal.send_modify(|g| g.stop = true);
                    (&mut s.task).await
                }
            };
            all.push(stats.unwrap_or_default());
            keep.push(s._requests);
        }
        drop(keep);

        let audit = self.table.audit(self.watchers as u32);
        let mut lag = histogram();
        let mut w = WatchReport {
            watch_watchers: self.watchers as u64,
            watch_streams: all.len() as u64,
            watch_expected: audit.expected,
            watch_lost: audit.lost,
            watch_unexpected: audit.unexpected,
            watch_lost_revisions: audit.lost_revisions,
            watch_drained: true,
            ..Default::default()
        };
        let mut last_event: Option<Instant> = None;
        for s in all {
            w.watch_events += s.events;
            w.watch_puts += s.puts;
            w.watch_deletes += s.deletes;
            w.watch_out_of_order += s.out_of_order;
            w.watch_duplicates += s.duplicates;
            w.watch_progress_notifies += s.progress;
            w.watch_progress_violations += s.progress_violations;
            w.watch_canceled += s.canceled;
            w.watch_cancel_reasons.extend(s.cancel_reasons);
            w.watch_early += s.early;
            w.watch_drained &= s.drained;
            lag.add(&s.lag).expect("same histogram bounds");
            last_event = last_event.max(s.last_event);
        }
        // Receipts beyond one per watcher that the per-watcher check missed.
        w.watch_duplicates = w.watch_duplicates.max(audit.extra);
        (w.watch_lag_p50_ms, w.watch_lag_p99_ms, w.watch_lag_max_ms) = lag_ms(&lag);
        if let Some(t) = last_event {
            let span = t.saturating_duration_since(writes_start).as_secs_f64();
            let measured = w.watch_events.saturating_sub(self.baseline);
            if span > 0.0 {
                w.watch_events_per_s = r3(measured as f64 / span).round();
            }
        }
        (w, last_event)
    }
}

async fn run_stream(
    mut inbound: Streaming<WatchResponse>,
    expected_watchers: usize,
    table: Arc<RevTable>,
    received: Arc<AtomicU64>,
    mut goal_rx: watch::Receiver<Goal>,
    ready: oneshot::Sender<Result<(), String>>,
) -> StreamStats {
    let mut st = StreamStats::default();
    let mut watchers: HashMap<i64, WatcherState> = HashMap::new();
    let mut ready = Some(ready);
    loop {
        let goal = *goal_rx.borrow_and_update();
        let reached = |watchers: &HashMap<i64, WatcherState>| {
            watchers
                .values()
                .all(|w| w.last_rev >= goal.rev && w.deletes >= goal.deletes)
        };
        if goal.stop || (goal.rev > 0 && ready.is_none() && reached(&watchers)) {
            st.drained = ready.is_none() && reached(&watchers);
            return st;
        }
        tokio::select! {
            msg = inbound.message() => match msg {
                Ok(Some(resp)) => {
                    received.fetch_add(resp.events.len() as u64, Ordering::Relaxed);
                    on_response(resp, &mut st, &mut watchers, &table, &mut ready, expected_watchers)
                }
                Ok(None) | Err(_) => {
                    if let Some(r) = ready.take() {
                        let _ = r.send(Err("the server closed the watch stream".into()));
                    }
                    st.cancel_reasons.push("watch stream closed by the server".into());
                    st.canceled += watchers.len() as u64;
                    return st;
                }
            },
            changed = goal_rx.changed() => {
                if changed.is_err() {
                    return st;
                }
            }
        }
    }
}

fn on_response(
    resp: WatchResponse,
    st: &mut StreamStats,
    watchers: &mut HashMap<i64, WatcherState>,
    table: &RevTable,
    ready: &mut Option<oneshot::Sender<Result<(), String>>>,
    expected_watchers: usize,
) {
    let header_rev = resp.header.as_ref().map_or(0, |h| h.revision);
    if resp.created {
        if resp.canceled || resp.watch_id < 0 {
            if let Some(r) = ready.take() {
                let _ = r.send(Err(resp.cancel_reason));
            }
            return;
        }
        watchers.insert(resp.watch_id, WatcherState::default());
        if watchers.len() == expected_watchers {
            if let Some(r) = ready.take() {
                let _ = r.send(Ok(()));
            }
        }
        return;
    }
    if resp.canceled {
        st.canceled += 1;
        st.cancel_reasons.push(format!(
            "watch {} canceled: {:?} (compact revision {})",
            resp.watch_id, resp.cancel_reason, resp.compact_revision
        ));
        watchers.remove(&resp.watch_id);
        return;
    }
    if resp.events.is_empty() {
        st.progress += 1;
        // A progress notification promises nothing at or below its
        // revision is still to come.
        if resp.watch_id < 0 {
            for w in watchers.values_mut() {
                w.progress_rev = w.progress_rev.max(header_rev);
            }
        } else if let Some(w) = watchers.get_mut(&resp.watch_id) {
            w.progress_rev = w.progress_rev.max(header_rev);
        }
        return;
    }
    let now = table.now_ns();
    st.last_event = Some(Instant::now());
    let Some(w) = watchers.get_mut(&resp.watch_id) else {
        st.cancel_reasons
            .push(format!("events for unknown watch {}", resp.watch_id));
        st.canceled += 1;
        return;
    };
    for ev in resp.events {
        st.events += 1;
        let kv = ev.kv.unwrap_or_default();
        let rev = kv.mod_revision;
        if rev <= w.progress_rev {
            st.progress_violations += 1;
        }
        if rev < w.last_rev {
            st.out_of_order += 1;
        } else if rev == w.last_rev {
            if w.keys_at_last.contains(&kv.key) {
                st.duplicates += 1;
            } else {
                w.keys_at_last.push(kv.key.clone());
            }
        } else {
            w.last_rev = rev;
            w.keys_at_last.clear();
            w.keys_at_last.push(kv.key.clone());
        }
        if ev.r#type == EventType::Delete as i32 {
            st.deletes += 1;
            w.deletes += 1;
            continue;
        }
        st.puts += 1;
        match table.seen(rev, now) {
            Some(lag_us) => st.lag.saturating_record(lag_us),
            None => {
                st.early += 1;
                st.lag.saturating_record(0);
            }
        }
    }
}

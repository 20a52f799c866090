//! Checking watchers, as kube-apiserver's reflectors use them: list a
//! prefix at revision S, then watch it from S + 1 with `prev_kv` and
//! progress notifications, several watchers per stream.
//!
//! Each watcher rebuilds the prefix from its list and the events it gets,
//! and is checked on every event (revisions never go back, no (revision,
//! key) twice, nothing at or below a progress notification, every PUT a
//! write the soak sent, every DELETE of an object with a lease, versions,
//! create revisions and `prev_kv` consistent with what it already had) and
//! at every checkpoint: frozen at its position P, its rebuilt prefix must
//! equal a Range of the prefix at P, and it must have received every write
//! acknowledged in its prefix since the last checkpoint.
//!
//! A watcher the server cancels must have been canceled for a compaction
//! that was requested, past the watcher's next revision (etcd's rule); it
//! is replaced by a new list and watch, as the apiserver relists. A stream
//! can be paused: its task stops reading, so the server's sends block, as
//! with a client that stops reading.

use super::model::{digest, Family, Model, Served, Val, BURST_PREFIX};
use super::violations::Violations;
use crate::keys::prefix_end;
use crate::pool::{call, Kv};
use bytes::Bytes;
use ephd::proto::etcdserverpb::{
    watch_client::WatchClient, watch_request::RequestUnion, RangeRequest, WatchCreateRequest,
    WatchProgressRequest, WatchRequest, WatchResponse,
};
use ephd::proto::mvccpb::event::EventType;
use parking_lot::Mutex;
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

/// The text clients report for a watch canceled by compaction (etcd puts
/// it in no field: clientv3 derives it from `compact_revision`).
pub const ERR_COMPACTED: &str = "etcdserver: mvcc: required revision has been compacted";

/// Per-watcher violations reported in full at one check; the rest counted.
const DETAIL: usize = 5;

/// One event as a watcher keeps it until it is applied.
struct Ev {
    rev: i64,
    put: bool,
    key: Bytes,
    val: Val,
    prev: Option<Val>,
}

/// One watcher's state; see the module docs.
struct WState {
    name: String,
    family: Family,
    start: i64,
    state: Served,
    /// Events at or below it are applied as they come; later ones wait in
    /// `queue` (a checkpoint compares the state at `hold`).
    hold: i64,
    queue: Vec<Ev>,
    last_rev: i64,
    keys_at_last: Vec<Bytes>,
    progress_rev: i64,
    /// Completeness is checked up to here.
    last_cp: i64,
    /// PUT revisions received since `last_cp`, ascending.
    received: Vec<i64>,
    /// DELETE events of lease-burst keys.
    burst_deletes: Vec<(i64, Bytes)>,
    events: u64,
    prev_kv_missing: u64,
}

impl WState {
    fn position(&self) -> i64 {
        self.last_rev.max(self.progress_rev).max(self.start - 1)
    }

    /// Applies one event to the rebuilt prefix; a violation if it does not
    /// follow from what the watcher had.
    fn apply(&mut self, ev: Ev) -> Option<String> {
        let key = String::from_utf8_lossy(&ev.key).into_owned();
        let name = &self.name;
        if ev.put {
            let bad = match self.state.get(&ev.key) {
                Some(prev) => {
                    if ev.val.create != prev.create
                        || ev.val.version != prev.version + 1
                        || ev.val.rev <= prev.rev
                    {
                        Some(format!(
                            "{name}: PUT of {key} at {} (create {}, version {}) does not follow the version it had (create {}, version {}, revision {})",
                            ev.rev, ev.val.create, ev.val.version, prev.create, prev.version, prev.rev
                        ))
                    } else {
                        match ev.prev {
                            Some(p) if p != *prev => Some(format!(
                                "{name}: PUT of {key} at {}: prev_kv {p:?} is not the version it had, {prev:?}",
                                ev.rev
                            )),
                            Some(_) => None,
                            None => {
                                self.prev_kv_missing += 1;
                                None
                            }
                        }
                    }
                }
                None => {
                    if ev.val.version != 1 || ev.val.create != ev.rev || ev.prev.is_some() {
                        Some(format!(
                            "{name}: PUT of {key} at {} for a key it did not have is not a create (version {}, create {}, prev_kv {})",
                            ev.rev, ev.val.version, ev.val.create, ev.prev.is_some()
                        ))
                    } else {
                        None
                    }
                }
            };
            self.state.insert(ev.key, ev.val);
            bad
        } else {
            match self.state.remove(&ev.key) {
                None => Some(format!(
                    "{name}: DELETE of {key} at {}, a key it did not have",
                    ev.rev
                )),
                Some(prev) => match ev.prev {
                    Some(p) if p != prev => Some(format!(
                        "{name}: DELETE of {key} at {}: prev_kv {p:?} is not the version it had, {prev:?}",
                        ev.rev
                    )),
                    _ => None,
                },
            }
        }
    }

    /// Lifts the hold and applies what waited behind it.
    fn unfreeze(&mut self) -> Vec<String> {
        self.hold = i64::MAX;
        let queue = std::mem::take(&mut self.queue);
        queue.into_iter().filter_map(|ev| self.apply(ev)).collect()
    }

    /// Every write acknowledged in the watcher's prefix in `(last_cp,
    /// upto]` must have been received. Moves `last_cp` to `upto`.
    fn check_complete(&mut self, model: &Model, upto: i64) -> Vec<String> {
        let mut v = Vec::new();
        let mut missing = 0u64;
        for rev in model.acked_between(self.family, self.last_cp, upto) {
            if self.received.binary_search(&rev).is_err() {
                missing += 1;
                if v.len() < DETAIL {
                    v.push(format!(
                        "{}: never received the write acknowledged at revision {rev} (it reached revision {})",
                        self.name,
                        self.position()
                    ));
                }
            }
        }
        if missing > DETAIL as u64 {
            v.push(format!(
                "{}: {missing} acknowledged writes in ({}, {upto}] never received in all",
                self.name, self.last_cp
            ));
        }
        self.last_cp = self.last_cp.max(upto);
        let cp = self.last_cp;
        self.received.retain(|r| *r > cp);
        v
    }
}

/// What one stream's task shares with the soak.
#[derive(Default)]
pub struct StreamState {
    pending: VecDeque<WState>,
    watchers: BTreeMap<i64, WState>,
    /// Why the stream ended, once it has.
    pub ended: Option<String>,
    /// Families whose watcher was canceled and needs a new list and watch.
    replace: Vec<Family>,
    /// Watchers canceled by compaction.
    pub compaction_cancels: u64,
    /// Watchers ever started on the stream (names them).
    started: u64,
    /// Events checked on receipt.
    pub events: u64,
}

/// Counters over every watcher of a [`WatchSet`].
#[derive(Debug, Default, Clone, Copy)]
pub struct WatchStats {
    /// Watchers created (lists + watches).
    pub created: u64,
    /// Events received and checked.
    pub events: u64,
    /// Watchers canceled by compaction (all legitimate, or a violation was
    /// recorded).
    pub compaction_cancels: u64,
    /// Watchers compared with a Range at their position.
    pub compares: u64,
    /// Events without the requested `prev_kv`.
    pub prev_kv_missing: u64,
}

/// One watch stream and its task.
pub struct StreamHandle {
    /// For messages.
    pub name: String,
    req: mpsc::Sender<WatchRequest>,
    state: Arc<Mutex<StreamState>>,
    pause: watch::Sender<bool>,
    task: JoinHandle<()>,
}

/// Everything a stream task needs from the soak.
#[derive(Clone)]
pub struct Ctx {
    /// The model writes are checked against.
    pub model: Arc<Mutex<Model>>,
    /// Where violations go.
    pub viol: Arc<Violations>,
    /// The highest compaction revision requested so far in this server
    /// run: a compaction cancel above it is a violation.
    pub compacted: Arc<AtomicI64>,
    /// Per-request timeout.
    pub timeout: Duration,
}

impl StreamHandle {
    /// Opens a stream on `channel`.
    pub async fn open(name: &str, channel: Channel, ctx: &Ctx) -> Result<StreamHandle, String> {
        let (req, rx) = mpsc::channel(64);
        let mut client = WatchClient::new(channel)
            .max_decoding_message_size(usize::MAX)
            .max_encoding_message_size(usize::MAX);
        let inbound = tokio::time::timeout(ctx.timeout, client.watch(ReceiverStream::new(rx)))
            .await
            .map_err(|_| format!("{name}: opening the watch stream timed out"))?
            .map_err(|e| format!("{name}: opening the watch stream: {e}"))?
            .into_inner();
        let state = Arc::new(Mutex::new(StreamState::default()));
        let (pause, pause_rx) = watch::channel(false);
        let task = tokio::spawn(run_stream(inbound, state.clone(), ctx.clone(), pause_rx));
        Ok(StreamHandle {
            name: name.to_string(),
            req,
            state,
            pause,
            task,
        })
    }

    /// Lists `family` with `kv` and starts a watcher from the next
    /// revision; waits until the server confirms it.
    pub async fn add_watcher(&self, kv: &mut Kv, family: Family, ctx: &Ctx) -> Result<(), String> {
        let (rev, state) = list(kv, family, 0, ctx.timeout)
            .await
            .map_err(|e| format!("{}: listing {}: {e}", self.name, family.name()))?;
        ctx.model.lock().saw_revision(rev);
        let name = {
            let mut st = self.state.lock();
            st.started += 1;
            format!("{}/{}#{}", self.name, family.name(), st.started)
        };
        let w = WState {
            name: name.clone(),
            family,
            start: rev + 1,
            state,
            hold: i64::MAX,
            queue: Vec::new(),
            last_rev: 0,
            keys_at_last: Vec::new(),
            progress_rev: 0,
            last_cp: rev,
            received: Vec::new(),
            burst_deletes: Vec::new(),
            events: 0,
            prev_kv_missing: 0,
        };
        self.state.lock().pending.push_back(w);
        let prefix = Bytes::from_static(family.prefix().as_bytes());
        let create = WatchRequest {
            request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
                range_end: prefix_end(&prefix),
                key: prefix,
                start_revision: rev + 1,
                prev_kv: true,
                progress_notify: true,
                ..Default::default()
            })),
        };
        self.req
            .send(create)
            .await
            .map_err(|_| format!("{}: the watch stream is closed", self.name))?;
        let deadline = Instant::now() + ctx.timeout;
        loop {
            {
                let st = self.state.lock();
                if st.watchers.values().any(|w| w.name == name) {
                    return Ok(());
                }
                if let Some(e) = &st.ended {
                    return Err(format!(
                        "{name}: stream ended before the watch was created: {e}"
                    ));
                }
                if !st.pending.iter().any(|w| w.name == name) {
                    return Err(format!("{name}: the watch was not created"));
                }
            }
            if Instant::now() >= deadline {
                return Err(format!("{name}: no answer to the watch create"));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Stops (or resumes) reading the stream.
    pub fn set_paused(&self, paused: bool) {
        self.pause.send_replace(paused);
    }

    fn paused(&self) -> bool {
        *self.pause.borrow()
    }

    /// Asks for a stream-wide progress notification.
    async fn request_progress(&self) {
        let _ = self
            .req
            .send(WatchRequest {
                request_union: Some(RequestUnion::ProgressRequest(WatchProgressRequest {})),
            })
            .await;
    }
}

impl Drop for StreamHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Whether an error is the server shedding load ("etcdserver: too many
/// requests"): the server protecting itself, to be retried, not a fault.
pub fn shed(msg: &str) -> bool {
    msg.contains("too many requests")
}

/// A Range, retried (up to ten times, backing off) while the server sheds
/// it.
pub async fn range_patiently(
    kv: &mut Kv,
    req: RangeRequest,
    timeout: Duration,
) -> Result<ephd::proto::etcdserverpb::RangeResponse, (String, String)> {
    let mut tries = 0;
    loop {
        match call(timeout, kv.range(req.clone())).await {
            Err((_, m)) if shed(&m) && tries < 10 => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(200 * tries)).await;
            }
            other => return other,
        }
    }
}

/// Lists a family at `revision` (0: current): the header revision and
/// every object (retried while the server sheds it).
pub async fn list(
    kv: &mut Kv,
    family: Family,
    revision: i64,
    timeout: Duration,
) -> Result<(i64, Served), String> {
    let prefix = Bytes::from_static(family.prefix().as_bytes());
    let req = RangeRequest {
        range_end: prefix_end(&prefix),
        key: prefix,
        revision,
        ..Default::default()
    };
    let resp = range_patiently(kv, req, timeout)
        .await
        .map_err(|(k, m)| format!("{k}: {m}"))?;
    if resp.more || resp.count != resp.kvs.len() as i64 {
        return Err(format!(
            "an unlimited Range returned {} of {} objects (more: {})",
            resp.kvs.len(),
            resp.count,
            resp.more
        ));
    }
    let rev = resp.header.as_ref().map_or(0, |h| h.revision);
    Ok((
        rev,
        resp.kvs
            .iter()
            .map(|kv| (kv.key.clone(), Val::of(kv)))
            .collect(),
    ))
}

async fn run_stream(
    mut inbound: tonic::Streaming<WatchResponse>,
    state: Arc<Mutex<StreamState>>,
    ctx: Ctx,
    mut pause: watch::Receiver<bool>,
) {
    loop {
        if *pause.borrow_and_update() {
            if pause.changed().await.is_err() {
                return;
            }
            continue;
        }
        tokio::select! {
            msg = inbound.message() => match msg {
                Ok(Some(resp)) => {
                    let mut st = state.lock();
                    let v = on_response(resp, &mut st, &ctx);
                    drop(st);
                    ctx.viol.extend(v);
                }
                Ok(None) => {
                    state.lock().ended = Some("the server ended the stream".into());
                    return;
                }
                Err(e) => {
                    state.lock().ended = Some(format!("{:?}: {}", e.code(), e.message()));
                    return;
                }
            },
            changed = pause.changed() => if changed.is_err() { return },
        }
    }
}

fn on_response(resp: WatchResponse, st: &mut StreamState, ctx: &Ctx) -> Vec<String> {
    let mut v = Vec::new();
    let header_rev = resp.header.as_ref().map_or(0, |h| h.revision);
    if resp.created {
        let Some(w) = st.pending.pop_front() else {
            v.push(format!(
                "watch {}: a created response nobody asked for",
                resp.watch_id
            ));
            return v;
        };
        if resp.canceled || resp.watch_id < 0 {
            v.push(format!(
                "{}: watch create refused: {:?}",
                w.name, resp.cancel_reason
            ));
            return v;
        }
        if st.watchers.contains_key(&resp.watch_id) {
            v.push(format!(
                "{}: watch ID {} handed out twice on one stream",
                w.name, resp.watch_id
            ));
        }
        st.watchers.insert(resp.watch_id, w);
        return v;
    }
    if resp.canceled {
        let Some(mut w) = st.watchers.remove(&resp.watch_id) else {
            v.push(format!("cancel of unknown watch {}", resp.watch_id));
            return v;
        };
        let c = resp.compact_revision;
        if c <= 0 {
            v.push(format!(
                "{}: canceled by the server without a compaction: {:?}",
                w.name, resp.cancel_reason
            ));
            return v;
        }
        let next = w.position() + 1;
        if next >= c {
            v.push(format!(
                "{}: canceled as compacted at revision {c} ({ERR_COMPACTED}) although its next revision {next} was not compacted",
                w.name
            ));
        }
        let requested = ctx.compacted.load(Ordering::Acquire);
        if c > requested {
            v.push(format!(
                "{}: canceled for a compaction at revision {c}, above any compaction requested ({requested})",
                w.name
            ));
        }
        // Everything below its position must have come.
        let upto = w.position();
        let model = ctx.model.lock();
        v.extend(w.check_complete(&model, upto));
        drop(model);
        v.extend(w.unfreeze());
        st.compaction_cancels += 1;
        st.replace.push(w.family);
        return v;
    }
    if resp.events.is_empty() {
        let targets: Vec<&mut WState> = if resp.watch_id < 0 {
            st.watchers.values_mut().collect()
        } else {
            st.watchers.get_mut(&resp.watch_id).into_iter().collect()
        };
        for w in targets {
            if header_rev < w.last_rev {
                v.push(format!(
                    "{}: progress notification at revision {header_rev} after an event at {}",
                    w.name, w.last_rev
                ));
            }
            w.progress_rev = w.progress_rev.max(header_rev);
        }
        return v;
    }
    let Some(w) = st.watchers.get_mut(&resp.watch_id) else {
        v.push(format!("events for unknown watch {}", resp.watch_id));
        return v;
    };
    let prefix = w.family.prefix().as_bytes();
    let mut model = ctx.model.lock();
    model.saw_revision(header_rev);
    let n = resp.events.len() as u64;
    for ev in resp.events {
        let kv = ev.kv.unwrap_or_default();
        let rev = kv.mod_revision;
        let name = &w.name;
        let key = String::from_utf8_lossy(&kv.key).into_owned();
        if rev < w.start {
            v.push(format!(
                "{name}: event at revision {rev}, before its start {}",
                w.start
            ));
        }
        if rev <= w.progress_rev {
            v.push(format!(
                "{name}: event at revision {rev} after a progress notification at {}",
                w.progress_rev
            ));
        }
        if rev < w.last_rev {
            v.push(format!(
                "{name}: event at revision {rev} after one at {} (out of order)",
                w.last_rev
            ));
        } else if rev == w.last_rev {
            if w.keys_at_last.contains(&kv.key) {
                v.push(format!("{name}: {key} at revision {rev} delivered twice"));
            } else {
                w.keys_at_last.push(kv.key.clone());
            }
        } else {
            w.last_rev = rev;
            w.keys_at_last.clear();
            w.keys_at_last.push(kv.key.clone());
        }
        if !kv.key.starts_with(prefix) {
            v.push(format!("{name}: event for {key}, outside its prefix"));
        }
        let put = ev.r#type == EventType::Put as i32;
        if put {
            if let Err(e) = model.observed_put(&kv.key, rev, digest(&kv.value)) {
                v.push(format!("{name}: {e}"));
            }
            w.received.push(rev);
        } else {
            if let Err(e) = model.observed_delete(&kv.key, rev) {
                v.push(format!("{name}: {e}"));
            }
            if kv.key.starts_with(BURST_PREFIX.as_bytes()) {
                w.burst_deletes.push((rev, kv.key.clone()));
            }
        }
        let e = Ev {
            rev,
            put,
            val: Val::of(&kv),
            prev: ev.prev_kv.as_ref().map(Val::of),
            key: kv.key,
        };
        if rev <= w.hold {
            v.extend(w.apply(e));
        } else {
            w.queue.push(e);
        }
    }
    drop(model);
    w.events += n;
    st.events += n;
    v
}

/// The watchers of one server run, over a few streams.
pub struct WatchSet {
    /// The streams.
    pub streams: Vec<StreamHandle>,
    ctx: Ctx,
    /// Counters.
    pub stats: WatchStats,
}

impl WatchSet {
    /// An empty set.
    pub fn new(ctx: Ctx) -> WatchSet {
        WatchSet {
            streams: Vec::new(),
            ctx,
            stats: WatchStats::default(),
        }
    }

    /// Opens a stream on `channel` with a watcher per family in `families`.
    pub async fn add_stream(
        &mut self,
        name: &str,
        channel: Channel,
        kv: &mut Kv,
        families: &[Family],
    ) -> Result<(), String> {
        let s = StreamHandle::open(name, channel, &self.ctx).await?;
        for f in families {
            s.add_watcher(kv, *f, &self.ctx).await?;
            self.stats.created += 1;
        }
        self.streams.push(s);
        Ok(())
    }

    /// Pauses or resumes reading on the streams whose name starts with
    /// `name`.
    pub fn set_paused(&self, name: &str, paused: bool) {
        for s in self.streams.iter().filter(|s| s.name.starts_with(name)) {
            s.set_paused(paused);
        }
    }

    /// Replaces watchers the server canceled (list, then watch).
    async fn replace_canceled(&mut self, kv: &mut Kv) {
        for s in &self.streams {
            let todo = std::mem::take(&mut s.state.lock().replace);
            for f in todo {
                match s.add_watcher(kv, f, &self.ctx).await {
                    Ok(()) => self.stats.created += 1,
                    Err(e) => self
                        .ctx
                        .viol
                        .add(format!("replacing a canceled watcher: {e}")),
                }
            }
        }
    }

    /// The checkpoint described in the module docs. Paused streams are
    /// left out. `catch_up` bounds how long watchers may take to reach the
    /// current revision.
    pub async fn checkpoint(&mut self, kv: &mut Kv, catch_up: Duration) {
        self.replace_canceled(kv).await;
        let timeout = self.ctx.timeout;
        let r0 = match list_rev(kv, timeout).await {
            Ok(r) => r,
            Err(e) => {
                self.ctx
                    .viol
                    .add(format!("checkpoint: reading the revision: {e}"));
                return;
            }
        };
        let active: Vec<&StreamHandle> = self
            .streams
            .iter()
            .filter(|s| !s.paused() && s.state.lock().ended.is_none())
            .collect();
        for s in &active {
            s.request_progress().await;
        }
        let deadline = Instant::now() + catch_up;
        loop {
            let behind: Vec<String> = active
                .iter()
                .flat_map(|s| {
                    let st = s.state.lock();
                    st.watchers
                        .values()
                        .filter(|w| w.position() < r0)
                        .map(|w| format!("{} at {}", w.name, w.position()))
                        .collect::<Vec<_>>()
                })
                .collect();
            if behind.is_empty() {
                break;
            }
            if Instant::now() >= deadline {
                self.ctx.viol.add(format!(
                    "checkpoint: watchers did not reach revision {r0} within {catch_up:?}: {}",
                    behind.join(", ")
                ));
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for s in &active {
            let ids: Vec<i64> = s.state.lock().watchers.keys().copied().collect();
            for id in ids {
                let frozen = {
                    let mut st = s.state.lock();
                    st.watchers.get_mut(&id).map(|w| {
                        w.hold = w.position();
                        (w.family, w.hold)
                    })
                };
                let Some((family, hold)) = frozen else {
                    continue;
                };
                let listed = list(kv, family, hold, timeout).await;
                let mut st = s.state.lock();
                let Some(w) = st.watchers.get_mut(&id) else {
                    continue;
                };
                let mut v = Vec::new();
                match listed {
                    Ok((_, served)) => {
                        self.stats.compares += 1;
                        v.extend(compare(&w.name, hold, &w.state, &served));
                    }
                    Err(e) if e.contains("compacted") => {}
                    Err(e) => v.push(format!("{}: listing at revision {hold}: {e}", w.name)),
                }
                let model = self.ctx.model.lock();
                v.extend(w.check_complete(&model, hold));
                drop(model);
                v.extend(w.unfreeze());
                drop(st);
                self.ctx.viol.extend(v);
            }
        }
        self.forget_checked();
    }

    /// Lets the model forget acknowledged revisions every live watcher has
    /// been checked past.
    fn forget_checked(&self) {
        let mut low = i64::MAX;
        for s in &self.streams {
            let st = s.state.lock();
            for w in st.watchers.values().chain(st.pending.iter()) {
                low = low.min(w.last_cp);
            }
        }
        if low != i64::MAX {
            self.ctx.model.lock().forget_acked_upto(low);
        }
    }

    /// The lease-burst DELETEs each events watcher that started before
    /// `since` received, by watcher name; clears them.
    pub fn take_burst_deletes(&self, since: i64) -> Vec<(String, Vec<(i64, Bytes)>)> {
        let mut out = Vec::new();
        for s in &self.streams {
            let mut st = s.state.lock();
            for w in st.watchers.values_mut() {
                if w.family == Family::Events && w.start <= since {
                    out.push((w.name.clone(), std::mem::take(&mut w.burst_deletes)));
                }
            }
        }
        out
    }

    /// Whether every live events watcher that started before `since` has
    /// received `n` burst DELETEs (or its stream is paused or ended).
    pub fn burst_deletes_at_least(&self, since: i64, n: usize) -> bool {
        self.streams.iter().all(|s| {
            let st = s.state.lock();
            s.paused()
                || st.ended.is_some()
                || st
                    .watchers
                    .values()
                    .filter(|w| w.family == Family::Events && w.start <= since)
                    .all(|w| w.burst_deletes.len() >= n)
        })
    }

    /// The end of a server run (a kill, a stop, the end of the soak): every
    /// watcher must have received every acknowledged write up to the
    /// position it reached. Aborts the stream tasks.
    pub fn close(&mut self) {
        let mut v = Vec::new();
        for s in &self.streams {
            s.task.abort();
            // Stream state before the model, as the stream tasks lock them.
            let mut st = s.state.lock();
            let model = self.ctx.model.lock();
            for w in st.watchers.values_mut() {
                let upto = w.position();
                v.extend(w.check_complete(&model, upto));
            }
            drop(model);
            for w in st.watchers.values_mut() {
                v.extend(w.unfreeze());
            }
        }
        self.ctx.viol.extend(v);
        self.collect();
    }

    /// Adds the streams' counters to `stats`.
    fn collect(&mut self) {
        for s in &self.streams {
            let mut st = s.state.lock();
            self.stats.events += std::mem::take(&mut st.events);
            self.stats.compaction_cancels += std::mem::take(&mut st.compaction_cancels);
            let missing: u64 = st
                .watchers
                .values_mut()
                .map(|w| std::mem::take(&mut w.prev_kv_missing))
                .sum();
            self.stats.prev_kv_missing += missing;
        }
    }
}

/// The current revision (a count-only Range).
pub async fn list_rev(kv: &mut Kv, timeout: Duration) -> Result<i64, String> {
    let key = Bytes::from_static(b"/");
    let req = RangeRequest {
        range_end: prefix_end(&key),
        key,
        count_only: true,
        ..Default::default()
    };
    let resp = range_patiently(kv, req, timeout)
        .await
        .map_err(|(k, m)| format!("{k}: {m}"))?;
    Ok(resp.header.as_ref().map_or(0, |h| h.revision))
}

/// Differences between a watcher's rebuilt prefix and a Range at the same
/// revision.
fn compare(name: &str, at: i64, rebuilt: &Served, served: &Served) -> Vec<String> {
    let mut v = Vec::new();
    let mut n = 0u64;
    for (k, s) in served {
        let mine = rebuilt.get(k);
        if mine != Some(s) {
            n += 1;
            if v.len() < DETAIL {
                v.push(format!(
                    "{name}: at revision {at} a Range shows {} as {s:?}, the watch events give {mine:?}",
                    String::from_utf8_lossy(k)
                ));
            }
        }
    }
    for k in rebuilt.keys().filter(|k| !served.contains_key(*k)) {
        n += 1;
        if v.len() < DETAIL {
            v.push(format!(
                "{name}: at revision {at} the watch events still have {}, which a Range does not show",
                String::from_utf8_lossy(k)
            ));
        }
    }
    if n > DETAIL as u64 {
        v.push(format!(
            "{name}: {n} objects differ between the watch events and a Range at revision {at}"
        ));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use ephd::proto::etcdserverpb::ResponseHeader;
    use ephd::proto::mvccpb::{Event, KeyValue};

    const KEY: &str = "/registry/leases/kube-node-lease/node-1";

    fn ctx() -> Ctx {
        Ctx {
            model: Arc::new(Mutex::new(Model::default())),
            viol: Arc::new(Violations::default()),
            compacted: Arc::new(AtomicI64::new(0)),
            timeout: Duration::from_secs(1),
        }
    }

    fn value(rev: i64) -> Bytes {
        Bytes::from(format!("value written at {rev}"))
    }

    /// A stream with one leases watcher from revision 11, and writes of
    /// KEY acknowledged at `revs` (the first a create).
    fn setup(revs: &[i64]) -> (Ctx, StreamState) {
        let ctx = ctx();
        {
            let mut m = ctx.model.lock();
            for r in revs {
                let key = Bytes::from_static(KEY.as_bytes());
                m.sent(&key, Family::Leases, digest(&value(*r)), 0);
                m.acked(&key, *r, digest(&value(*r))).unwrap();
            }
        }
        let mut st = StreamState::default();
        st.pending.push_back(WState {
            name: "w".into(),
            family: Family::Leases,
            start: 11,
            state: Served::new(),
            hold: i64::MAX,
            queue: Vec::new(),
            last_rev: 0,
            keys_at_last: Vec::new(),
            progress_rev: 0,
            last_cp: 10,
            received: Vec::new(),
            burst_deletes: Vec::new(),
            events: 0,
            prev_kv_missing: 0,
        });
        let created = WatchResponse {
            created: true,
            watch_id: 0,
            ..Default::default()
        };
        assert!(on_response(created, &mut st, &ctx).is_empty());
        (ctx, st)
    }

    fn kv(rev: i64, version: i64) -> KeyValue {
        KeyValue {
            key: Bytes::from_static(KEY.as_bytes()),
            create_revision: 11,
            mod_revision: rev,
            version,
            value: value(rev),
            lease: 0,
        }
    }

    /// A PUT of KEY at `rev` as the `version`-th version, with prev_kv.
    fn put(rev: i64, version: i64, prev: Option<(i64, i64)>) -> Event {
        Event {
            r#type: EventType::Put as i32,
            kv: Some(kv(rev, version)),
            prev_kv: prev.map(|(r, v)| kv(r, v)),
        }
    }

    fn events(evs: Vec<Event>) -> WatchResponse {
        WatchResponse {
            header: Some(ResponseHeader {
                revision: evs
                    .last()
                    .map_or(0, |e| e.kv.as_ref().unwrap().mod_revision),
                ..Default::default()
            }),
            watch_id: 0,
            events: evs,
            ..Default::default()
        }
    }

    fn complete(ctx: &Ctx, st: &mut StreamState, upto: i64) -> Vec<String> {
        let m = ctx.model.lock();
        st.watchers.get_mut(&0).unwrap().check_complete(&m, upto)
    }

    #[test]
    fn a_clean_history_passes() {
        let (ctx, mut st) = setup(&[11, 12, 13]);
        let mut v = on_response(events(vec![put(11, 1, None)]), &mut st, &ctx);
        v.extend(on_response(
            events(vec![put(12, 2, Some((11, 1))), put(13, 3, Some((12, 2)))]),
            &mut st,
            &ctx,
        ));
        v.extend(complete(&ctx, &mut st, 13));
        assert!(v.is_empty(), "{v:?}");
        assert_eq!(st.events, 3);
    }

    #[test]
    fn a_lost_event_is_found_twice_over() {
        let (ctx, mut st) = setup(&[11, 12, 13]);
        let mut v = on_response(events(vec![put(11, 1, None)]), &mut st, &ctx);
        v.extend(on_response(
            events(vec![put(13, 3, Some((12, 2)))]),
            &mut st,
            &ctx,
        ));
        // The version jump and the missing acknowledged revision.
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].contains("does not follow"), "{v:?}");
        let c = complete(&ctx, &mut st, 13);
        assert_eq!(c.len(), 1, "{c:?}");
        assert!(c[0].contains("revision 12"), "{c:?}");
    }

    #[test]
    fn repeats_reordering_and_progress_overtaking_are_caught() {
        let (ctx, mut st) = setup(&[11, 12]);
        assert!(on_response(events(vec![put(11, 1, None)]), &mut st, &ctx).is_empty());
        let v = on_response(events(vec![put(11, 1, None)]), &mut st, &ctx);
        assert!(v.iter().any(|m| m.contains("delivered twice")), "{v:?}");

        let (ctx, mut st) = setup(&[11, 12]);
        assert!(on_response(events(vec![put(12, 2, None)]), &mut st, &ctx).len() == 1);
        let v = on_response(events(vec![put(11, 1, None)]), &mut st, &ctx);
        assert!(v.iter().any(|m| m.contains("out of order")), "{v:?}");

        let (ctx, mut st) = setup(&[11, 12]);
        let progress = WatchResponse {
            header: Some(ResponseHeader {
                revision: 12,
                ..Default::default()
            }),
            watch_id: -1,
            ..Default::default()
        };
        assert!(on_response(progress, &mut st, &ctx).is_empty());
        let v = on_response(events(vec![put(11, 1, None)]), &mut st, &ctx);
        assert!(
            v.iter()
                .any(|m| m.contains("after a progress notification")),
            "{v:?}"
        );
    }

    #[test]
    fn events_must_be_writes_the_soak_sent() {
        let (ctx, mut st) = setup(&[11]);
        let mut bogus = put(11, 1, None);
        bogus.kv.as_mut().unwrap().value = Bytes::from_static(b"not ours");
        let v = on_response(events(vec![bogus]), &mut st, &ctx);
        assert!(v.iter().any(|m| m.contains("another value")), "{v:?}");
        let delete = Event {
            r#type: EventType::Delete as i32,
            kv: Some(kv(12, 0)),
            prev_kv: None,
        };
        let v = on_response(events(vec![delete]), &mut st, &ctx);
        assert!(v.iter().any(|m| m.contains("nobody deletes")), "{v:?}");
    }

    #[test]
    fn only_legitimate_compaction_cancels_pass() {
        let cancel = |c: i64| WatchResponse {
            watch_id: 0,
            canceled: true,
            compact_revision: c,
            ..Default::default()
        };
        // Behind the compaction it asked for: fine, and it is replaced.
        let (ctx, mut st) = setup(&[11, 12]);
        ctx.compacted.store(12, Ordering::Release);
        assert!(on_response(events(vec![put(11, 1, None)]), &mut st, &ctx).is_empty());
        assert!(
            on_response(cancel(13), &mut st, &ctx).len() == 1,
            "above the request"
        );
        let (ctx, mut st) = setup(&[11, 12]);
        ctx.compacted.store(13, Ordering::Release);
        assert!(on_response(events(vec![put(11, 1, None)]), &mut st, &ctx).is_empty());
        // Its next revision, 12, is below the compaction at 13.
        let v = on_response(cancel(13), &mut st, &ctx);
        assert!(v.is_empty(), "{v:?}");
        assert_eq!(st.replace, vec![Family::Leases]);
        assert_eq!(st.compaction_cancels, 1);
        // Canceled although it had everything below the compaction.
        let (ctx, mut st) = setup(&[11, 12]);
        ctx.compacted.store(12, Ordering::Release);
        let mut v = on_response(events(vec![put(11, 1, None)]), &mut st, &ctx);
        v.extend(on_response(
            events(vec![put(12, 2, Some((11, 1)))]),
            &mut st,
            &ctx,
        ));
        assert!(v.is_empty(), "{v:?}");
        let v = on_response(cancel(12), &mut st, &ctx);
        assert!(v.iter().any(|m| m.contains("was not compacted")), "{v:?}");
        // A cancel without a compaction.
        let (ctx, mut st) = setup(&[11]);
        let v = on_response(cancel(0), &mut st, &ctx);
        assert!(
            v.iter().any(|m| m.contains("without a compaction")),
            "{v:?}"
        );
    }

    #[test]
    fn a_frozen_watcher_compares_at_its_hold() {
        let (ctx, mut st) = setup(&[11, 12]);
        assert!(on_response(events(vec![put(11, 1, None)]), &mut st, &ctx).is_empty());
        let w = st.watchers.get_mut(&0).unwrap();
        w.hold = w.position();
        assert_eq!(w.hold, 11);
        assert!(on_response(events(vec![put(12, 2, Some((11, 1)))]), &mut st, &ctx).is_empty());
        let w = st.watchers.get_mut(&0).unwrap();
        let at_11: Served = [(Bytes::from_static(KEY.as_bytes()), Val::of(&kv(11, 1)))]
            .into_iter()
            .collect();
        assert!(compare("w", 11, &w.state, &at_11).is_empty());
        assert!(w.unfreeze().is_empty());
        assert_eq!(compare("w", 11, &w.state, &at_11).len(), 1);
    }
}

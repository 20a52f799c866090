//! The Watch service: one task per client stream drives a
//! [`WatchStream`](crate::watch::WatchStream) and writes its outputs to a
//! small bounded channel. A client that stops reading blocks only its own
//! task; writers and other streams are unaffected.

use super::{convert, Shared};
use crate::backend::{Backend, LeaderLoss};
use crate::proto::etcdserverpb::{self as pb, watch_request::RequestUnion, watch_server::Watch};
use crate::watch::{Output, WatchSpec, WatchStream};
use futures::Stream;
use prost::Message;
use std::pin::Pin;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

/// Revisions read from the log per poll; bounds one batch's memory.
const POLL_REVISIONS: usize = 512;

/// Serves the bidirectional Watch stream.
pub struct WatchService(pub Shared);

type WatchOut = Pin<Box<dyn Stream<Item = Result<pb::WatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Watch for WatchService {
    type WatchStream = WatchOut;

    async fn watch(
        &self,
        req: Request<Streaming<pb::WatchRequest>>,
    ) -> Result<Response<WatchOut>, Status> {
        let lost = self.0.backend.leader_loss(req.metadata());
        let creds = super::authz::Credentials::of(&req);
        let inbound = req.into_inner();
        let (tx, rx) = mpsc::channel(16);
        tokio::spawn(run(self.0.clone(), inbound, tx, lost, creds));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

type Tx = mpsc::Sender<Result<pb::WatchResponse, Status>>;

/// The per-stream loop. Returns when the client goes away.
async fn run(
    shared: Shared,
    mut inbound: Streaming<pb::WatchRequest>,
    tx: Tx,
    mut lost: LeaderLoss,
    creds: super::authz::Credentials,
) {
    let store = shared.store.clone();
    let mut stop = shared.stop.clone();
    let _stream_gauge = GaugeGuard::new(&shared.metrics.watch_streams, 1);
    let mut watchers_gauge = GaugeGuard::new(&shared.metrics.watchers, 0);
    let mut ws = WatchStream::new();
    let mut latest = store.log().subscribe();
    let mut ticker = tokio::time::interval(shared.info.progress_notify_interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await; // the first tick is immediate
    loop {
        latest.borrow_and_update();
        loop {
            let outs = ws.poll(&store, POLL_REVISIONS);
            let done = outs.is_empty() || !ws.behind(&store);
            if !send_all(&shared, &tx, outs).await {
                return;
            }
            if done {
                break;
            }
        }
        let outs = tokio::select! {
            // `hasleader` and no leader for three election timeouts.
            _ = lost.wait() => {
                let _ = tx.send(Err(LeaderLoss::status())).await;
                return;
            }
            msg = inbound.message() => match msg {
                Ok(Some(req)) => match denied(&shared, &creds, &req).await {
                    Some(refusal) => {
                        if tx.send(Ok(refusal)).await.is_err() {
                            return;
                        }
                        Vec::new()
                    }
                    None => handle(&shared, &mut ws, req),
                },
                Ok(None) => return,
                Err(status) => {
                    // An oversized or malformed request ends the stream with
                    // its error, as etcd's does, never with a silent OK.
                    let _ = tx.send(Err(super::limits::as_grpc_go(status))).await;
                    return;
                }
            },
            changed = latest.changed() => {
                if changed.is_err() {
                    return;
                }
                Vec::new()
            }
            _ = ticker.tick() => ws.progress_tick(&store),
            _ = tx.closed() => return,
            _ = crate::api::stopped(&mut stop) => {
                let _ = tx.send(Err(super::shutting_down())).await;
                return;
            }
        };
        watchers_gauge.set(ws.len() as i64);
        if !send_all(&shared, &tx, outs).await {
            return;
        }
    }
}

/// etcd's refusal of a watch create the stream's user may not read.
async fn denied(
    shared: &Shared,
    creds: &super::authz::Credentials,
    req: &pb::WatchRequest,
) -> Option<pb::WatchResponse> {
    match &req.request_union {
        Some(RequestUnion::CreateRequest(c)) => creds.watch_denied(shared, c).await,
        _ => None,
    }
}

fn handle(shared: &Shared, ws: &mut WatchStream, req: pb::WatchRequest) -> Vec<Output> {
    match req.request_union {
        Some(RequestUnion::CreateRequest(c)) => {
            let filter = |f: pb::watch_create_request::FilterType| c.filters.contains(&(f as i32));
            let spec = WatchSpec {
                watch_id: c.watch_id,
                no_put: filter(pb::watch_create_request::FilterType::Noput),
                no_delete: filter(pb::watch_create_request::FilterType::Nodelete),
                key: c.key,
                range_end: c.range_end,
                start_revision: c.start_revision,
                prev_kv: c.prev_kv,
                fragment: c.fragment,
                progress_notify: c.progress_notify,
            };
            ws.create(&shared.store, spec)
        }
        Some(RequestUnion::CancelRequest(c)) => {
            ws.cancel(&shared.store, c.watch_id).into_iter().collect()
        }
        Some(RequestUnion::ProgressRequest(_)) => {
            ws.request_progress(&shared.store);
            Vec::new()
        }
        None => Vec::new(),
    }
}

/// Keeps a gauge in step with one stream's contribution, and takes that
/// contribution back when the stream ends however it ends.
struct GaugeGuard<'a> {
    gauge: &'a prometheus::IntGauge,
    value: i64,
}

impl<'a> GaugeGuard<'a> {
    fn new(gauge: &'a prometheus::IntGauge, value: i64) -> Self {
        gauge.add(value);
        GaugeGuard { gauge, value }
    }

    fn set(&mut self, value: i64) {
        self.gauge.add(value - self.value);
        self.value = value;
    }
}

impl Drop for GaugeGuard<'_> {
    fn drop(&mut self) {
        self.gauge.sub(self.value);
    }
}

/// Sends outputs in order; false when the client is gone.
async fn send_all(shared: &Shared, tx: &Tx, outs: Vec<Output>) -> bool {
    for out in outs {
        if let Output::Events { events, .. } = &out {
            shared.metrics.events_total.inc_by(events.len() as u64);
        }
        for resp in encode(shared, out) {
            if tx.send(Ok(resp)).await.is_err() {
                return false;
            }
        }
    }
    true
}

fn encode(shared: &Shared, out: Output) -> Vec<pb::WatchResponse> {
    let info = &shared.info;
    let base = |watch_id: i64, revision: i64| pb::WatchResponse {
        header: info.header(revision),
        watch_id,
        ..Default::default()
    };
    match out {
        Output::Created { watch_id, revision } => vec![pb::WatchResponse {
            created: true,
            ..base(watch_id, revision)
        }],
        Output::CreateFailed { revision, reason } => vec![pb::WatchResponse {
            created: true,
            canceled: true,
            cancel_reason: reason.to_string(),
            ..base(-1, revision)
        }],
        Output::Canceled { watch_id, revision } => vec![pb::WatchResponse {
            canceled: true,
            ..base(watch_id, revision)
        }],
        // etcd sends the compaction cancel with a zero header revision.
        Output::Compacted {
            watch_id,
            compact_revision,
        } => vec![pb::WatchResponse {
            canceled: true,
            compact_revision,
            ..base(watch_id, 0)
        }],
        Output::Progress { watch_id, revision } => vec![base(watch_id, revision)],
        Output::Events {
            watch_id,
            revision,
            events,
            fragment,
        } => {
            let resp = pb::WatchResponse {
                events: events.iter().map(convert::event).collect(),
                ..base(watch_id, revision)
            };
            if fragment {
                fragments(resp, info.max_request_bytes)
            } else {
                vec![resp]
            }
        }
    }
}

/// etcd's fragmentation: responses at or over the limit with several events
/// are split into pieces just under it, all but the last marked `fragment`.
fn fragments(resp: pb::WatchResponse, limit: usize) -> Vec<pb::WatchResponse> {
    if resp.encoded_len() < limit || resp.events.len() < 2 {
        return vec![resp];
    }
    let mut template = resp.clone();
    template.events.clear();
    template.fragment = true;
    let base_len = template.encoded_len();
    let mut out = Vec::new();
    let mut cur = template.clone();
    let mut cur_len = base_len;
    for ev in resp.events {
        let len = ev.encoded_len();
        let ev_len = 1 + prost::encoding::encoded_len_varint(len as u64) + len;
        if !cur.events.is_empty() && cur_len + ev_len >= limit {
            out.push(std::mem::replace(&mut cur, template.clone()));
            cur_len = base_len;
        }
        cur.events.push(ev);
        cur_len += ev_len;
    }
    cur.fragment = false;
    out.push(cur);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::mvccpb;

    fn event(i: usize, value_len: usize) -> mvccpb::Event {
        mvccpb::Event {
            r#type: 0,
            kv: Some(mvccpb::KeyValue {
                key: format!("k{i:04}").into_bytes().into(),
                value: vec![b'x'; value_len].into(),
                mod_revision: 10,
                ..Default::default()
            }),
            prev_kv: None,
        }
    }

    fn response(events: Vec<mvccpb::Event>) -> pb::WatchResponse {
        pb::WatchResponse {
            watch_id: 3,
            events,
            ..Default::default()
        }
    }

    #[test]
    fn small_responses_and_single_events_are_not_fragmented() {
        let small = response((0..3).map(|i| event(i, 10)).collect());
        assert_eq!(fragments(small.clone(), 1024), vec![small]);
        let one_big = response(vec![event(0, 4096)]);
        assert_eq!(fragments(one_big.clone(), 1024), vec![one_big]);
    }

    #[test]
    fn large_responses_split_under_the_limit_in_order() {
        let events: Vec<_> = (0..50).map(|i| event(i, 100)).collect();
        let whole = response(events.clone());
        let limit = 1024;
        let pieces = fragments(whole, limit);
        assert!(pieces.len() > 1);
        for (i, p) in pieces.iter().enumerate() {
            assert!(p.encoded_len() < limit, "piece {i} is {}", p.encoded_len());
            assert_eq!(p.fragment, i + 1 < pieces.len(), "only the last is final");
            assert_eq!(p.watch_id, 3);
            assert!(!p.events.is_empty());
        }
        let rejoined: Vec<_> = pieces.into_iter().flat_map(|p| p.events).collect();
        assert_eq!(rejoined, events);
    }
}

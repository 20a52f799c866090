//! Target `decode_requests`: arbitrary bytes through the server's request
//! decoder and, when they decode, through the real service handlers.
//!
//! An input is a sequence of framed requests, `[kind][split][len: u16 LE]
//! [payload]`; a short last payload takes what is left, and a length of
//! `0xffff` takes all the rest (so one request can be as large as the
//! server accepts). `kind` picks the
//! message type; `split` cuts the payload into two chunks so the decoder
//! also sees a message spread over two buffers, as tonic hands it over when
//! a message straddles HTTP/2 frames. Every request runs against one store
//! per input, which starts with a few keys and a lease, so later requests
//! see what earlier ones did (a compaction, a raised alarm, a revoked
//! lease).
//!
//! Checked: nothing panics or overflows its stack; a decoded TxnRequest is
//! never nested deeper than the decoder's bound, and is what prost's
//! generated decoder makes of the same bytes wherever that one answers
//! (ephd decodes txns with its own walker); every handler error carries
//! a status code that one of ephd's etcd errors maps to (an INTERNAL or
//! UNKNOWN would mean a path etcd's clients cannot interpret); every
//! response encodes.

use bytes::{Buf, Bytes};
use ephd::api::{KvService, LeaseService, MaintenanceService, ServerInfo, Shared};
use ephd::metrics::Metrics;
use ephd::mvcc::{Store, StoreConfig};
use ephd::proto::codec::decode_request;
use ephd::proto::etcdserverpb::{
    self as pb, kv_server::Kv, lease_server::Lease, maintenance_server::Maintenance,
    watch_request::RequestUnion,
};
use ephd::proto::nesting::MAX_TXN_DEPTH;
use ephd::watch::{WatchSpec, WatchStream};
use prost::Message;
use std::sync::{Arc, OnceLock};
use tonic::{Code, Request, Response, Status};

/// How many message types `kind` chooses from (see `serve`).
pub const KINDS: u8 = 22;

/// Runs one input; panics on a finding.
pub fn run(data: &[u8]) {
    let env = Env::new();
    let mut input = data;
    while input.len() >= 4 {
        let kind = input[0] % KINDS;
        let split = input[1] as usize;
        let len = match u16::from_le_bytes([input[2], input[3]]) {
            u16::MAX => usize::MAX,
            len => len as usize,
        };
        input = &input[4..];
        let payload = &input[..len.min(input.len())];
        input = &input[payload.len()..];
        serve(&env, kind, split.min(payload.len()), payload);
    }
}

/// Frames one request the way [`run`] reads it (for seeds and tests).
pub fn frame(kind: u8, payload: &[u8]) -> Vec<u8> {
    let len = u16::try_from(payload.len())
        .ok()
        .filter(|len| *len < u16::MAX)
        .expect("a seed payload is shorter than 0xffff bytes");
    let mut out = vec![kind, 0];
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// The payload as the decoder receives it: one chunk, or two when `split`
/// falls inside it.
fn buffer(payload: &[u8], split: usize) -> impl Buf + '_ {
    let (a, b) = payload.split_at(split);
    a.chain(b)
}

/// Decodes `payload` as `M` with the server's decoder.
fn decode<M: Message + Default + 'static>(payload: &[u8], split: usize) -> Option<M> {
    decode_request::<M>(buffer(payload, split)).ok()
}

/// One store and the services over it, as the server wires them.
struct Env {
    shared: Shared,
    watch: std::cell::RefCell<WatchStream>,
    runtime: tokio::runtime::Runtime,
}

impl Env {
    fn new() -> Env {
        // Counters only; one registry for the whole run is enough.
        static METRICS: OnceLock<Arc<Metrics>> = OnceLock::new();
        static STOP: OnceLock<tokio::sync::watch::Sender<bool>> = OnceLock::new();
        let metrics = METRICS.get_or_init(|| Arc::new(Metrics::new())).clone();
        let stop = STOP
            .get_or_init(|| tokio::sync::watch::channel(false).0)
            .subscribe();
        let store = Arc::new(Store::new(StoreConfig::default()));
        store.lease_grant(7, 60).expect("grant");
        for (key, lease) in [("a", 0), ("b", 7), ("c", 0)] {
            store
                .put(ephd::mvcc::PutRequest {
                    key: Bytes::from(key),
                    value: Bytes::from_static(b"v"),
                    lease,
                    ..Default::default()
                })
                .expect("put");
        }
        let mut info = ServerInfo::new("fuzz", vec!["http://127.0.0.1:2379".into()]);
        // Small, so that size refusals are reachable with small inputs.
        info.max_request_bytes = 1024;
        let shared = Shared {
            backend: ephd::backend::Mode::Single(ephd::backend::SingleMember::new(
                store.clone(),
                info.member_info(),
                info.raft_term,
            )),
            store,
            info: Arc::new(info),
            metrics,
            overload: Arc::new(ephd::api::Overload::new(
                1,
                1 << 20,
                std::time::Duration::from_secs(1),
            )),
            stop,
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        Env {
            shared,
            watch: Default::default(),
            runtime,
        }
    }

    /// Runs one handler to completion and checks its answer.
    fn call<R: Message>(
        &self,
        fut: impl std::future::Future<Output = Result<Response<R>, Status>>,
    ) {
        match self.runtime.block_on(fut) {
            Ok(resp) => {
                let resp = resp.into_inner();
                let bytes = resp.encode_to_vec();
                assert_eq!(bytes.len(), resp.encoded_len(), "encoded length");
            }
            Err(status) => check_status(&status),
        }
    }
}

/// The codes ephd's etcd errors map to (`ephd::api::status`).
fn check_status(status: &Status) {
    let known = [
        Code::InvalidArgument,
        Code::OutOfRange,
        Code::NotFound,
        Code::FailedPrecondition,
        Code::Unavailable,
        Code::Unimplemented,
        Code::ResourceExhausted,
        Code::DataLoss,
    ];
    assert!(
        known.contains(&status.code()),
        "a handler answered {status:?}, which no etcd error maps to"
    );
}

/// Depth of a decoded txn (1 without nested txns), walked without
/// recursion so that a txn the decoder should have refused cannot
/// overflow the check itself.
fn txn_depth(txn: &pb::TxnRequest) -> usize {
    use pb::request_op::Request as R;
    let mut deepest = 0;
    let mut stack = vec![(txn, 1)];
    while let Some((t, depth)) = stack.pop() {
        deepest = deepest.max(depth);
        for op in t.success.iter().chain(&t.failure) {
            if let Some(R::RequestTxn(inner)) = &op.request {
                stack.push((inner, depth + 1));
            }
        }
    }
    deepest
}

/// Decodes and serves one request of type number `kind`.
fn serve(env: &Env, kind: u8, split: usize, payload: &[u8]) {
    let kv = || KvService(env.shared.clone());
    let lease = || LeaseService(env.shared.clone());
    let maintenance = || MaintenanceService(env.shared.clone());
    let store = &env.shared.store;
    match kind {
        0 => {
            if let Some(r) = decode::<pb::RangeRequest>(payload, split) {
                env.call(kv().range(Request::new(r)));
            }
        }
        1 => {
            if let Some(r) = decode::<pb::PutRequest>(payload, split) {
                env.call(kv().put(Request::new(r)));
            }
        }
        2 => {
            if let Some(r) = decode::<pb::DeleteRangeRequest>(payload, split) {
                env.call(kv().delete_range(Request::new(r)));
            }
        }
        3 => {
            let ours = decode_request::<pb::TxnRequest>(buffer(payload, split));
            // The server decodes txns with its own walker (it lets them nest
            // deeper than prost's limit); wherever prost's generated decoder
            // answers, the two must agree.
            match (pb::TxnRequest::decode(payload), &ours) {
                (Ok(theirs), Ok(ours)) => assert_eq!(ours, &theirs, "txn decoders disagree"),
                (Ok(theirs), Err(status)) => panic!("prost decodes {theirs:?}, ephd: {status:?}"),
                (Err(e), Ok(ours)) if !e.to_string().contains("recursion limit") => {
                    panic!("prost refuses ({e}), ephd decodes {ours:?}")
                }
                _ => {}
            }
            match ours {
                Ok(r) => {
                    let depth = txn_depth(&r);
                    assert!(depth <= MAX_TXN_DEPTH, "decoded a txn {depth} deep");
                    env.call(kv().txn(Request::new(r)));
                }
                Err(status) => assert!(
                    matches!(status.code(), Code::Internal | Code::InvalidArgument),
                    "{status:?}"
                ),
            }
        }
        4 => {
            if let Some(r) = decode::<pb::CompactionRequest>(payload, split) {
                env.call(kv().compact(Request::new(r)));
            }
        }
        5 => {
            if let Some(r) = decode::<pb::WatchRequest>(payload, split) {
                watch(env, r);
            }
        }
        6 => {
            if let Some(r) = decode::<pb::LeaseGrantRequest>(payload, split) {
                env.call(lease().lease_grant(Request::new(r)));
            }
        }
        7 => {
            if let Some(r) = decode::<pb::LeaseRevokeRequest>(payload, split) {
                env.call(lease().lease_revoke(Request::new(r)));
            }
        }
        8 => {
            // The keep-alive stream handler answers each request with this.
            if let Some(r) = decode::<pb::LeaseKeepAliveRequest>(payload, split) {
                store.lease_keep_alive(r.id);
            }
        }
        9 => {
            if let Some(r) = decode::<pb::LeaseTimeToLiveRequest>(payload, split) {
                env.call(lease().lease_time_to_live(Request::new(r)));
            }
        }
        10 => {
            if let Some(r) = decode::<pb::LeaseLeasesRequest>(payload, split) {
                env.call(lease().lease_leases(Request::new(r)));
            }
        }
        11 => {
            if let Some(r) = decode::<pb::AlarmRequest>(payload, split) {
                env.call(maintenance().alarm(Request::new(r)));
            }
        }
        12 => {
            if let Some(r) = decode::<pb::HashKvRequest>(payload, split) {
                env.call(maintenance().hash_kv(Request::new(r)));
            }
        }
        13 => {
            if let Some(r) = decode::<pb::StatusRequest>(payload, split) {
                env.call(maintenance().status(Request::new(r)));
            }
        }
        // Services whose handlers answer without looking at the request:
        // only the decoding matters.
        14 => drop(decode::<pb::AuthRoleGrantPermissionRequest>(payload, split)),
        15 => drop(decode::<pb::AuthUserAddRequest>(payload, split)),
        16 => drop(decode::<pb::AuthenticateRequest>(payload, split)),
        17 => drop(decode::<pb::MemberAddRequest>(payload, split)),
        18 => drop(decode::<pb::MoveLeaderRequest>(payload, split)),
        19 => drop(decode::<pb::DowngradeRequest>(payload, split)),
        20 => drop(decode::<pb::DefragmentRequest>(payload, split)),
        // The health service is tonic-health's, with its own codec: plain
        // prost, as ephd's build configures it.
        _ => drop(tonic_health::pb::HealthCheckRequest::decode(buffer(
            payload, split,
        ))),
    }
}

/// What the watch stream handler does with one request (`api/watch.rs`),
/// then one poll of the stream.
fn watch(env: &Env, req: pb::WatchRequest) {
    use pb::watch_create_request::FilterType;
    let store = &env.shared.store;
    let mut ws = env.watch.borrow_mut();
    match req.request_union {
        Some(RequestUnion::CreateRequest(c)) => {
            let filter = |f: FilterType| c.filters.contains(&(f as i32));
            let spec = WatchSpec {
                watch_id: c.watch_id,
                no_put: filter(FilterType::Noput),
                no_delete: filter(FilterType::Nodelete),
                key: c.key,
                range_end: c.range_end,
                start_revision: c.start_revision,
                prev_kv: c.prev_kv,
                fragment: c.fragment,
                progress_notify: c.progress_notify,
            };
            ws.create(store, spec);
        }
        Some(RequestUnion::CancelRequest(c)) => {
            ws.cancel(store, c.watch_id);
        }
        Some(RequestUnion::ProgressRequest(_)) => ws.request_progress(store),
        None => {}
    }
    ws.poll(store, 16);
}

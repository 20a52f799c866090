//! Helpers shared by the API tests (kv, watch, lease, maintenance,
//! concurrency): bounded waits, exact gRPC error assertions, a server handle
//! that can be pointed at stock etcd, and a raw bidirectional watch stream.

use std::future::Future;
use std::time::Duration;

use ephd::proto::etcdserverpb::{
    watch_client::WatchClient, watch_request::RequestUnion, WatchCancelRequest, WatchCreateRequest,
    WatchProgressRequest, WatchRequest, WatchResponse,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

use crate::harness::{connect_channel, Ephd, Server, StockEtcd};

/// Upper bound for any single awaited step of a test (an RPC, the next
/// watch message, a task joining). Generous: it only catches hangs.
pub const WAIT: Duration = Duration::from_secs(10);

/// Awaits `fut`, failing the test with `what` if it takes longer than `WAIT`.
pub async fn within<F: Future>(what: &str, fut: F) -> F::Output {
    within_for(WAIT, what, fut).await
}

/// Awaits `fut` for at most `limit`, failing the test with `what` otherwise.
pub async fn within_for<F: Future>(limit: Duration, what: &str, fut: F) -> F::Output {
    tokio::time::timeout(limit, fut)
        .await
        .unwrap_or_else(|_| panic!("{what}: no result within {limit:?}"))
}

/// The gRPC status inside an `etcd_client` error (panics on any other kind
/// of error: those mean the request never got an answer from the server).
pub fn grpc_status(err: etcd_client::Error) -> tonic::Status {
    match err {
        etcd_client::Error::GRpcStatus(s) => s,
        other => panic!("expected a gRPC status error, got {other:?}"),
    }
}

/// Asserts that an `etcd_client` call failed with exactly `code` and `message`.
#[track_caller]
pub fn assert_err<T: std::fmt::Debug>(
    result: Result<T, etcd_client::Error>,
    code: tonic::Code,
    message: &str,
) {
    match result {
        Ok(v) => panic!("expected {code:?} {message:?}, got success: {v:?}"),
        Err(e) => assert_status(grpc_status(e), code, message),
    }
}

/// Asserts that a raw tonic call failed with exactly `code` and `message`.
#[track_caller]
pub fn assert_raw_err<T: std::fmt::Debug>(
    result: Result<T, tonic::Status>,
    code: tonic::Code,
    message: &str,
) {
    match result {
        Ok(v) => panic!("expected {code:?} {message:?}, got success: {v:?}"),
        Err(s) => assert_status(s, code, message),
    }
}

#[track_caller]
fn assert_status(s: tonic::Status, code: tonic::Code, message: &str) {
    assert_eq!(
        (s.code(), s.message()),
        (code, message),
        "unexpected gRPC status {s:?}"
    );
}

/// The revision in an optional `etcd_client` response header.
#[track_caller]
pub fn rev(header: Option<&etcd_client::ResponseHeader>) -> i64 {
    header.expect("response has a header").revision()
}

/// Flags that make ephd behave exactly like a fresh etcd: revisions start at
/// 1 (no wall-clock revision continuity, no `compact_rev_key`), a put
/// naming an unknown lease fails instead of adopting it, and history is
/// kept until a client compacts (no compaction safety net).
pub const ETCD_COMPAT: &[&str] = &[
    "--revision-continuity",
    "false",
    "--lease-adopt-unknown-ttl",
    "0",
    "--compaction-safety-net",
    "0",
];

/// Starts ephd in etcd-compatible mode (`ETCD_COMPAT`) plus `extra` flags.
pub fn ephd(extra: &[&str]) -> Ephd {
    let mut args = ETCD_COMPAT.to_vec();
    args.extend_from_slice(extra);
    Ephd::start(&args)
}

/// A server under test: ephd (in etcd-compatible mode), or stock etcd when the environment variable
/// `EPHD_IT_REFERENCE=etcd` is set. Tests written against `TestServer`
/// encode etcd semantics, so running them against stock etcd checks the
/// tests' own expectations (`EPHD_IT_REFERENCE=etcd cargo test --test it kv::`).
/// Tests that need ephd flags or ephd-specific behaviour use `Ephd` directly.
pub enum TestServer {
    Ephd(Ephd),
    Etcd(StockEtcd),
}

impl TestServer {
    /// Starts the server under test: ephd with `ETCD_COMPAT` flags only.
    pub fn start() -> TestServer {
        match std::env::var("EPHD_IT_REFERENCE").as_deref() {
            Ok("etcd") => TestServer::Etcd(StockEtcd::start()),
            _ => TestServer::Ephd(ephd(&[])),
        }
    }
}

impl Server for TestServer {
    fn endpoint(&self) -> String {
        match self {
            TestServer::Ephd(s) => s.endpoint(),
            TestServer::Etcd(s) => s.endpoint(),
        }
    }
}

/// One raw bidirectional Watch stream: requests go in through a channel,
/// responses are read one at a time with a bound.
pub struct RawWatch {
    requests: mpsc::Sender<WatchRequest>,
    responses: Responses,
}

type WatchCall = tokio::task::JoinHandle<Result<tonic::Streaming<WatchResponse>, tonic::Status>>;

/// The response side of a watch stream. A Go gRPC server (stock etcd) sends
/// the response headers only with its first message, so the call is left
/// running in a task until the first read instead of being awaited on open.
enum Responses {
    Opening(WatchCall),
    Open(Box<tonic::Streaming<WatchResponse>>),
}

impl RawWatch {
    /// Opens a watch stream on a new connection to `endpoint`.
    pub async fn open(endpoint: &str) -> RawWatch {
        RawWatch::open_on(connect_channel(endpoint).await)
    }

    /// Opens a watch stream on an existing connection.
    pub fn open_on(channel: Channel) -> RawWatch {
        let (requests, rx) = mpsc::channel(64);
        let call = tokio::spawn(async move {
            WatchClient::new(channel)
                .watch(ReceiverStream::new(rx))
                .await
                .map(tonic::Response::into_inner)
        });
        RawWatch {
            requests,
            responses: Responses::Opening(call),
        }
    }

    async fn stream(&mut self) -> &mut tonic::Streaming<WatchResponse> {
        if let Responses::Opening(call) = &mut self.responses {
            let stream = within("watch stream response headers", call)
                .await
                .expect("watch call task")
                .expect("watch stream opens");
            self.responses = Responses::Open(Box::new(stream));
        }
        match &mut self.responses {
            Responses::Open(s) => s,
            Responses::Opening(_) => unreachable!("just opened"),
        }
    }

    /// Sends one request on the stream.
    pub async fn send(&self, union: RequestUnion) {
        within(
            "send watch request",
            self.requests.send(WatchRequest {
                request_union: Some(union),
            }),
        )
        .await
        .expect("watch stream still open");
    }

    /// Sends a create request (does not wait for the answer).
    pub async fn create(&self, req: WatchCreateRequest) {
        self.send(RequestUnion::CreateRequest(req)).await;
    }

    /// Sends a create request and returns the `created` response.
    pub async fn create_ok(&mut self, req: WatchCreateRequest) -> WatchResponse {
        self.create(req).await;
        let resp = self.next().await;
        assert!(
            resp.created && !resp.canceled,
            "expected a created response, got {resp:?}"
        );
        resp
    }

    /// Sends a cancel request.
    pub async fn cancel(&self, watch_id: i64) {
        self.send(RequestUnion::CancelRequest(WatchCancelRequest { watch_id }))
            .await;
    }

    /// Sends a progress request.
    pub async fn request_progress(&self) {
        self.send(RequestUnion::ProgressRequest(WatchProgressRequest {}))
            .await;
    }

    /// The next response; fails the test if the stream ends, errors, or
    /// stays silent for `WAIT`.
    pub async fn next(&mut self) -> WatchResponse {
        let stream = self.stream().await;
        within("next watch response", stream.message())
            .await
            .expect("watch stream did not fail")
            .expect("watch stream did not end")
    }
}

/// A create request for `[key, range_end)` starting at `start_revision`.
pub fn watch_req(key: &[u8], range_end: &[u8], start_revision: i64) -> WatchCreateRequest {
    WatchCreateRequest {
        key: key.to_vec().into(),
        range_end: range_end.to_vec().into(),
        start_revision,
        ..Default::default()
    }
}

/// The range end that covers every key starting with `prefix` (etcd's
/// `GetPrefixRangeEnd`).
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// A channel to `endpoint` whose calls wait `limit` (the harness' channels
/// give up after 5 s, sooner than a cluster member's request timeout).
pub async fn patient_channel(endpoint: &str, limit: Duration) -> Channel {
    tonic::transport::Endpoint::from_shared(endpoint.to_string())
        .unwrap()
        .timeout(limit)
        .connect()
        .await
        .unwrap()
}

/// Sends `sig` (SIGSTOP, SIGCONT) to a process the test started.
pub fn signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) on a child process the test started.
    assert_eq!(unsafe { libc::kill(pid as i32, sig) }, 0);
}

//! gRPC server metrics as grpc-go's go-grpc-prometheus reports them for
//! etcd: `grpc_server_started_total`, `grpc_server_handled_total`,
//! `grpc_server_handling_seconds`, `grpc_server_msg_received_total` and
//! `grpc_server_msg_sent_total`, labelled `grpc_type`, `grpc_service`,
//! `grpc_method` (and `grpc_code`) exactly as etcd's, so the etcd mixin's
//! dashboard and alerts read them unchanged. Also the client traffic
//! counters `etcd_network_client_grpc_{received,sent}_bytes_total`.
//!
//! [`GrpcMetricsLayer`] is a tower layer around every service, at the HTTP
//! level: it sees the request path, the message frames going each way and
//! the `grpc-status` the call ends with, after the other layers rewrote it
//! (oversized messages become grpc-go's ResourceExhausted). The hot path
//! costs one hash lookup of the path, a few relaxed atomic increments, one
//! histogram observation and one small box for the request body wrapper;
//! every label set is resolved once, when the server starts.
//!
//! The same layer hands calls that failed or took longer than the slow
//! threshold to [`RequestWarnings`] for a rate-limited WARN line; every
//! other call costs it one comparison of the duration measured for the
//! histogram, and one lookup of the client's address in the request's
//! extensions when the call arrives.
//!
//! Semantics follow go-grpc-prometheus: a call is started when it arrives
//! and handled when the handler ends (for streams: when the stream ends),
//! with the code it ended with; a call the client abandoned before it ended
//! is handled with `Canceled`, as grpc-go's handler would return the
//! context's error. Messages are counted one by one as their frames pass,
//! so a unary call that fails sends no message, as in grpc-go. Paths that
//! are no known method (tonic answers them Unimplemented) are not counted,
//! as grpc-go never reaches its interceptors for them.

use super::warnings::{Finished, RequestWarnings};
use bytes::{Buf, Bytes};
use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, Opts, Registry,
};
use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;
use tonic::codegen::http;

/// How a method streams, spelled as go-grpc-prometheus' `grpc_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RpcType {
    /// One request, one response.
    Unary,
    /// A stream of requests, one response.
    ClientStream,
    /// One request, a stream of responses.
    ServerStream,
    /// Streams both ways.
    BidiStream,
}

impl RpcType {
    /// The `grpc_type` label value.
    pub fn label(self) -> &'static str {
        match self {
            RpcType::Unary => "unary",
            RpcType::ClientStream => "client_stream",
            RpcType::ServerStream => "server_stream",
            RpcType::BidiStream => "bidi_stream",
        }
    }
}

/// Every method ephd serves, as (service, method, type): the label sets
/// go-grpc-prometheus registers up front for etcd, each reported from zero.
pub const METHODS: &[(&str, &str, RpcType)] = {
    use RpcType::*;
    &[
        ("etcdserverpb.KV", "Range", Unary),
        ("etcdserverpb.KV", "RangeStream", ServerStream),
        ("etcdserverpb.KV", "Put", Unary),
        ("etcdserverpb.KV", "DeleteRange", Unary),
        ("etcdserverpb.KV", "Txn", Unary),
        ("etcdserverpb.KV", "Compact", Unary),
        ("etcdserverpb.Watch", "Watch", BidiStream),
        ("etcdserverpb.Lease", "LeaseGrant", Unary),
        ("etcdserverpb.Lease", "LeaseRevoke", Unary),
        ("etcdserverpb.Lease", "LeaseKeepAlive", BidiStream),
        ("etcdserverpb.Lease", "LeaseTimeToLive", Unary),
        ("etcdserverpb.Lease", "LeaseLeases", Unary),
        ("etcdserverpb.Cluster", "MemberAdd", Unary),
        ("etcdserverpb.Cluster", "MemberRemove", Unary),
        ("etcdserverpb.Cluster", "MemberUpdate", Unary),
        ("etcdserverpb.Cluster", "MemberList", Unary),
        ("etcdserverpb.Cluster", "MemberPromote", Unary),
        ("etcdserverpb.Maintenance", "Alarm", Unary),
        ("etcdserverpb.Maintenance", "Status", Unary),
        ("etcdserverpb.Maintenance", "Defragment", Unary),
        ("etcdserverpb.Maintenance", "Hash", Unary),
        ("etcdserverpb.Maintenance", "HashKV", Unary),
        ("etcdserverpb.Maintenance", "Snapshot", ServerStream),
        ("etcdserverpb.Maintenance", "MoveLeader", Unary),
        ("etcdserverpb.Maintenance", "Downgrade", Unary),
        ("etcdserverpb.Auth", "AuthEnable", Unary),
        ("etcdserverpb.Auth", "AuthDisable", Unary),
        ("etcdserverpb.Auth", "AuthStatus", Unary),
        ("etcdserverpb.Auth", "Authenticate", Unary),
        ("etcdserverpb.Auth", "UserAdd", Unary),
        ("etcdserverpb.Auth", "UserGet", Unary),
        ("etcdserverpb.Auth", "UserList", Unary),
        ("etcdserverpb.Auth", "UserDelete", Unary),
        ("etcdserverpb.Auth", "UserChangePassword", Unary),
        ("etcdserverpb.Auth", "UserGrantRole", Unary),
        ("etcdserverpb.Auth", "UserRevokeRole", Unary),
        ("etcdserverpb.Auth", "RoleAdd", Unary),
        ("etcdserverpb.Auth", "RoleGet", Unary),
        ("etcdserverpb.Auth", "RoleList", Unary),
        ("etcdserverpb.Auth", "RoleDelete", Unary),
        ("etcdserverpb.Auth", "RoleGrantPermission", Unary),
        ("etcdserverpb.Auth", "RoleRevokePermission", Unary),
        ("grpc.health.v1.Health", "Check", Unary),
        ("grpc.health.v1.Health", "List", Unary),
        ("grpc.health.v1.Health", "Watch", ServerStream),
    ]
};

/// gRPC status codes by number, as grpc-go's `codes.Code.String()` spells
/// them (the `grpc_code` label).
pub const CODES: [&str; 17] = [
    "OK",
    "Canceled",
    "Unknown",
    "InvalidArgument",
    "DeadlineExceeded",
    "NotFound",
    "AlreadyExists",
    "PermissionDenied",
    "ResourceExhausted",
    "FailedPrecondition",
    "Aborted",
    "OutOfRange",
    "Unimplemented",
    "Internal",
    "Unavailable",
    "DataLoss",
    "Unauthenticated",
];

const OK: usize = 0;
const CANCELED: usize = 1;
const UNKNOWN: usize = 2;

/// go-grpc-prometheus' default histogram buckets (Prometheus' defaults),
/// which etcd's `grpc_server_handling_seconds` uses.
const BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// The metrics of one method, with every label set resolved.
struct Method {
    started: IntCounter,
    handled: [IntCounter; 17],
    received: IntCounter,
    sent: IntCounter,
    seconds: Histogram,
}

/// The gRPC metrics of one server.
pub struct GrpcMetrics {
    by_path: HashMap<String, usize, foldhash::fast::FixedState>,
    methods: Vec<Method>,
    received_bytes: IntCounter,
    sent_bytes: IntCounter,
    /// The warnings about rejected, shed and slow calls; the server sets
    /// their slow threshold from its configuration.
    pub warnings: RequestWarnings,
}

impl GrpcMetrics {
    /// Registers the gRPC metrics in `registry`, every known method's label
    /// sets at zero.
    pub fn new(registry: &Registry) -> prometheus::Result<GrpcMetrics> {
        let labels = ["grpc_type", "grpc_service", "grpc_method"];
        let started = IntCounterVec::new(
            Opts::new(
                "grpc_server_started_total",
                "Total number of RPCs started on the server.",
            ),
            &labels,
        )?;
        let handled = IntCounterVec::new(
            Opts::new(
                "grpc_server_handled_total",
                "Total number of RPCs completed on the server, regardless of success or failure.",
            ),
            &["grpc_type", "grpc_service", "grpc_method", "grpc_code"],
        )?;
        let received = IntCounterVec::new(
            Opts::new(
                "grpc_server_msg_received_total",
                "Total number of RPC stream messages received on the server.",
            ),
            &labels,
        )?;
        let sent = IntCounterVec::new(
            Opts::new(
                "grpc_server_msg_sent_total",
                "Total number of gRPC stream messages sent by the server.",
            ),
            &labels,
        )?;
        let seconds = HistogramVec::new(
            HistogramOpts::new(
                "grpc_server_handling_seconds",
                "Histogram of response latency (seconds) of gRPC that had been application-level handled by the server.",
            )
            .buckets(BUCKETS.to_vec()),
            &labels,
        )?;
        let received_bytes = IntCounter::new(
            "etcd_network_client_grpc_received_bytes_total",
            "The total number of bytes received from grpc clients.",
        )?;
        let sent_bytes = IntCounter::new(
            "etcd_network_client_grpc_sent_bytes_total",
            "The total number of bytes sent to grpc clients.",
        )?;
        let mut by_path = HashMap::with_hasher(foldhash::fast::FixedState::default());
        let mut methods = Vec::with_capacity(METHODS.len());
        for (i, (service, method, kind)) in METHODS.iter().enumerate() {
            let l = [kind.label(), *service, *method];
            by_path.insert(format!("/{service}/{method}"), i);
            let by_code = CODES
                .iter()
                .map(|code| handled.get_metric_with_label_values(&[l[0], l[1], l[2], code]))
                .collect::<prometheus::Result<Vec<_>>>()?;
            methods.push(Method {
                started: started.get_metric_with_label_values(&l)?,
                handled: by_code
                    .try_into()
                    .map_err(|_| prometheus::Error::Msg("one counter per code".into()))?,
                received: received.get_metric_with_label_values(&l)?,
                sent: sent.get_metric_with_label_values(&l)?,
                seconds: seconds.get_metric_with_label_values(&l)?,
            });
        }
        for c in [
            Box::new(started) as Box<dyn prometheus::core::Collector>,
            Box::new(handled),
            Box::new(received),
            Box::new(sent),
            Box::new(seconds),
            Box::new(received_bytes.clone()),
            Box::new(sent_bytes.clone()),
        ] {
            registry.register(c)?;
        }
        Ok(GrpcMetrics {
            by_path,
            methods,
            received_bytes,
            sent_bytes,
            warnings: RequestWarnings::default(),
        })
    }

    /// The index of the method at `path`, if ephd serves it.
    fn lookup(&self, path: &str) -> Option<usize> {
        self.by_path.get(path).copied()
    }
}

/// Counts gRPC message frames in a byte stream: each is a 5-byte prefix
/// (a compression flag and a big-endian length), then the message. Chunks
/// may split a prefix or hold several messages.
#[derive(Debug, Default, Clone, Copy)]
struct Frames {
    /// Bytes of the current prefix seen so far.
    prefix_seen: u8,
    /// The length being read from the prefix.
    len: u32,
    /// Bytes of the current message still to come.
    remaining: u64,
}

impl Frames {
    /// Feeds `data`; returns how many messages began in it and the sum of
    /// their lengths.
    fn feed(&mut self, mut data: &[u8]) -> (u64, u64) {
        let (mut messages, mut bytes) = (0u64, 0u64);
        while !data.is_empty() {
            if self.remaining > 0 {
                let n = self.remaining.min(data.len() as u64);
                self.remaining -= n;
                data = &data[n as usize..];
                continue;
            }
            let b = data[0];
            data = &data[1..];
            self.len = if self.prefix_seen == 0 {
                0
            } else {
                (self.len << 8) | b as u32
            };
            self.prefix_seen += 1;
            if self.prefix_seen == 5 {
                self.prefix_seen = 0;
                messages += 1;
                bytes += self.len as u64;
                self.remaining = self.len as u64;
            }
        }
        (messages, bytes)
    }
}

/// The `grpc-status` in `headers` as an index into [`CODES`]; numbers
/// grpc-go does not know count as Unknown, as grpc-go reads them.
fn code_of(headers: &http::HeaderMap) -> Option<usize> {
    let v = headers.get("grpc-status")?;
    let n = std::str::from_utf8(v.as_bytes())
        .ok()?
        .parse::<usize>()
        .ok();
    Some(n.filter(|n| *n < CODES.len()).unwrap_or(UNKNOWN))
}

/// The client's address: tonic puts the TCP connection's details in every
/// request's extensions (TLS connections get them too, beside the TLS ones).
fn remote_of<B>(req: &http::Request<B>) -> Option<SocketAddr> {
    req.extensions()
        .get::<tonic::transport::server::TcpConnectInfo>()
        .and_then(|info| info.remote_addr())
}

/// One call in flight. Handled once: with the code it ends with, or with
/// Canceled when it is dropped before it ended (the client went away).
struct Call {
    metrics: Arc<GrpcMetrics>,
    method: usize,
    start: Instant,
    remote: Option<SocketAddr>,
    done: bool,
    // A response message went out.
    answered: bool,
}

impl Call {
    /// Ends the call with `code`; `status` holds the headers or trailers
    /// that carried it (its message is read only for a warning).
    fn finish(&mut self, code: usize, status: Option<&http::HeaderMap>) {
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        let m = &self.metrics.methods[self.method];
        // etcd 3.6's gRPC metrics count the one message of a unary call as
        // sent whatever the call ends with, errors included.
        if !self.answered && METHODS[self.method].2 == RpcType::Unary {
            m.sent.inc();
        }
        m.handled[code].inc();
        let took = self.start.elapsed();
        m.seconds.observe(took.as_secs_f64());
        if self.metrics.warnings.worth_a_look(code, took) {
            self.warn(code, status, took);
        }
    }

    /// Hands a failed or slow call to the warnings, off the common path.
    #[cold]
    #[inline(never)]
    fn warn(&self, code: usize, status: Option<&http::HeaderMap>, took: std::time::Duration) {
        let (service, method, kind) = METHODS[self.method];
        let message = status
            .filter(|_| code != OK)
            .and_then(tonic::Status::from_header_map)
            .map(|s| s.message().to_string());
        self.metrics.warnings.report(&Finished {
            service,
            method,
            unary: kind == RpcType::Unary,
            code_name: CODES[code],
            code,
            message: message.as_deref(),
            remote: self.remote,
            took,
        });
    }

    fn sent(&mut self, messages: u64, bytes: u64) {
        if messages > 0 {
            self.answered = true;
            self.metrics.methods[self.method].sent.inc_by(messages);
            self.metrics.sent_bytes.inc_by(bytes);
        }
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        self.finish(CANCELED, None);
    }
}

/// Adds the gRPC metrics to every call of the wrapped service (see the
/// module docs). Put it outermost, so it sees the final status.
#[derive(Clone)]
pub struct GrpcMetricsLayer(pub Arc<GrpcMetrics>);

impl<S> tower::Layer<S> for GrpcMetricsLayer {
    type Service = GrpcMetricsService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        GrpcMetricsService {
            inner,
            metrics: self.0.clone(),
        }
    }
}

/// The service [`GrpcMetricsLayer`] builds.
#[derive(Clone)]
pub struct GrpcMetricsService<S> {
    inner: S,
    metrics: Arc<GrpcMetrics>,
}

impl<S, B> tower::Service<http::Request<tonic::body::Body>> for GrpcMetricsService<S>
where
    S: tower::Service<http::Request<tonic::body::Body>, Response = http::Response<B>>,
{
    type Response = http::Response<MetricsBody<B>>;
    type Error = S::Error;
    type Future = MetricsFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let Some(method) = self.metrics.lookup(req.uri().path()) else {
            return MetricsFuture {
                inner: self.inner.call(req),
                call: None,
            };
        };
        self.metrics.methods[method].started.inc();
        let remote = remote_of(&req);
        let metrics = self.metrics.clone();
        let req = req.map(|inner| {
            tonic::body::Body::new(RequestBody {
                inner,
                frames: Frames::default(),
                metrics,
                method,
            })
        });
        MetricsFuture {
            inner: self.inner.call(req),
            call: Some(Call {
                metrics: self.metrics.clone(),
                method,
                start: Instant::now(),
                remote,
                done: false,
                answered: false,
            }),
        }
    }
}

pin_project_lite::pin_project! {
    /// The response future of [`GrpcMetricsService`]: a call that ends in
    /// its headers (trailers-only, as errors of unary calls are) is handled
    /// here; any other goes on in the body.
    pub struct MetricsFuture<F> {
        #[pin]
        inner: F,
        call: Option<Call>,
    }
}

impl<F, B, E> Future for MetricsFuture<F>
where
    F: Future<Output = Result<http::Response<B>, E>>,
{
    type Output = Result<http::Response<MetricsBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let res = std::task::ready!(this.inner.poll(cx));
        let mut call = this.call.take();
        Poll::Ready(res.map(|resp| {
            if let Some(code) = call.as_ref().and_then(|_| code_of(resp.headers())) {
                if let Some(mut c) = call.take() {
                    c.finish(code, Some(resp.headers()));
                }
            }
            resp.map(|inner| MetricsBody {
                inner,
                call,
                frames: Frames::default(),
            })
        }))
    }
}

pin_project_lite::pin_project! {
    /// A response body that counts the messages sent and handles the call
    /// when its trailers pass.
    pub struct MetricsBody<B> {
        #[pin]
        inner: B,
        call: Option<Call>,
        frames: Frames,
    }
}

impl<B> http_body::Body for MetricsBody<B>
where
    B: http_body::Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        let this = self.project();
        let res = std::task::ready!(this.inner.poll_frame(cx));
        if let Some(call) = this.call.as_mut() {
            match &res {
                Some(Ok(frame)) => {
                    if let Some(data) = frame.data_ref() {
                        let (messages, bytes) = this.frames.feed(data.chunk());
                        call.sent(messages, bytes);
                    } else if let Some(trailers) = frame.trailers_ref() {
                        call.finish(code_of(trailers).unwrap_or(UNKNOWN), Some(trailers));
                        *this.call = None;
                    }
                }
                // A body that fails or ends without a status ends the call
                // with no status grpc-go would have sent: Unknown.
                Some(Err(_)) | None => {
                    call.finish(UNKNOWN, None);
                    *this.call = None;
                }
            }
        }
        Poll::Ready(res)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

pin_project_lite::pin_project! {
    /// A request body that counts the messages received.
    struct RequestBody {
        #[pin]
        inner: tonic::body::Body,
        frames: Frames,
        metrics: Arc<GrpcMetrics>,
        method: usize,
    }
}

impl http_body::Body for RequestBody {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        let this = self.project();
        let res = std::task::ready!(this.inner.poll_frame(cx));
        if let Some(Ok(frame)) = &res {
            if let Some(data) = frame.data_ref() {
                let (messages, bytes) = this.frames.feed(data.chunk());
                if messages > 0 {
                    this.metrics.methods[*this.method].received.inc_by(messages);
                    this.metrics.received_bytes.inc_by(bytes);
                }
            }
        }
        Poll::Ready(res)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
#[path = "grpc_tests.rs"]
mod tests;

//! HTTP/1.1 beside gRPC on the client port, as etcd serves it on 2379:
//! `/health`, `/livez`, `/readyz`, `/version` and `/metrics` (the handlers
//! of [`crate::http`]), and etcd's JSON gateway (`POST /v3/kv/range`,
//! `/v3/watch`, …, see `routes::ROUTES`) under `/v3`, `/v3beta` and
//! `/v3alpha`.
//!
//! One listener serves both: tonic accepts HTTP/1.1 connections beside
//! HTTP/2 ones (hyper tells them apart by the HTTP/2 preface), and every
//! request is routed by its path: gRPC methods (`/etcdserverpb.KV/Range`)
//! to the services when the request is gRPC (`grpc_only.rs`; etcd's 404
//! otherwise), anything else to the routes here. So over TLS, where
//! ALPN may settle on `h2`, a JSON request over HTTP/2 works as well.
//!
//! Each JSON call is translated into a real gRPC call of the same server,
//! made in process through the same tower stack the port serves
//! (`call`): the gateway holds no etcd semantics, and a service added to
//! the server is reachable here by naming its path and message types.

mod call;
mod grpc_only;
mod json;
mod routes;

use crate::api::{GrpcGoLimits, SendPreEncoded, Shared};
use crate::backend::Backend;
use crate::metrics::grpc::GrpcMetricsLayer;
use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{post, MethodRouter};
use bytes::{Buf, Bytes, BytesMut};
use call::{GrpcService, Messages};
use futures::{Stream, StreamExt};
use grpc_only::GrpcOnlyLayer;
use routes::{Route, Shape, PREFIXES, ROUTES};
use std::convert::Infallible;
use tonic::Status;
use tower::ServiceExt;

/// JSON overhead allowed on top of `--max-request-bytes` (base64 makes
/// values a third larger, and field names and quotes add to that).
const JSON_OVERHEAD: usize = 2;

/// Everything the client listener routes: `grpc` (the gRPC services) for
/// gRPC requests, and for any other request the HTTP endpoints and the
/// JSON gateway, whose calls go to `grpc` through the same layers the
/// listener applies.
pub fn client_routes(grpc: tonic::service::Routes, shared: &Shared) -> tonic::service::Routes {
    let stack = tower::ServiceBuilder::new()
        .layer(GrpcMetricsLayer(shared.metrics.grpc.clone()))
        .layer(GrpcGoLimits)
        .layer(shared.backend.interceptor())
        .layer(SendPreEncoded)
        .service(grpc.clone())
        .map_response(|r| r.map(tonic::body::Body::new));
    let service = GrpcService::new(stack);
    let limit = shared.info.max_request_bytes.saturating_mul(JSON_OVERHEAD) + 64 * 1024;
    let mut http = crate::http::router(shared.clone());
    for prefix in PREFIXES {
        for route in ROUTES {
            http = http.route(
                &format!("/{prefix}/{}", route.path),
                gateway_route(route, service.clone(), limit),
            );
        }
    }
    let http = http.layer(axum::middleware::map_response(cors));
    let grpc = grpc.into_axum_router().layer(GrpcOnlyLayer {
        not_found: http_not_found,
    });
    let router = grpc.merge(http).fallback(not_found);
    tonic::service::Routes::from(router)
}

/// The method router of one gateway path: POST calls, OPTIONS answers a
/// CORS preflight, anything else is etcd 3.6's gateway answer (501,
/// Unimplemented "Method Not Allowed").
fn gateway_route(route: &'static Route, service: GrpcService, limit: usize) -> MethodRouter {
    post(move |headers: HeaderMap, body: Body| handle(route, service.clone(), limit, headers, body))
        .options(|| async { StatusCode::OK })
        .fallback(|| async { error(&Status::unimplemented("Method Not Allowed")) })
}

/// The CORS headers etcd sends with every HTTP response of the client port
/// (as the HTTP router's response layer).
async fn cors(resp: Response) -> Response {
    with_cors(resp)
}

/// `resp` with etcd's CORS headers.
fn with_cors(mut resp: Response) -> Response {
    let h = resp.headers_mut();
    h.insert(
        "access-control-allow-headers",
        HeaderValue::from_static("accept, content-type, authorization"),
    );
    h.insert(
        "access-control-allow-methods",
        HeaderValue::from_static("POST, GET, OPTIONS, PUT, DELETE"),
    );
    h.insert("access-control-allow-origin", HeaderValue::from_static("*"));
    resp
}

/// A plain-text answer the way Go's `http.Error` writes one.
fn text(status: StatusCode, body: &'static str) -> Response {
    (
        status,
        [
            (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        body,
    )
        .into_response()
}

/// The 404 of etcd's HTTP handler, with its CORS headers.
fn http_not_found() -> Response {
    with_cors(text(StatusCode::NOT_FOUND, "404 page not found\n"))
}

/// Any other path: a gRPC request gets Unimplemented, as from tonic; an
/// HTTP one etcd's 404 (its gateway's text under a version prefix, Go's
/// elsewhere).
async fn not_found(req: axum::extract::Request) -> Response {
    let grpc = req
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
    if grpc {
        let (parts, ()) = Status::unimplemented("").into_http::<()>().into_parts();
        return Response::from_parts(parts, Body::empty());
    }
    let path = req.uri().path();
    let under_gateway = PREFIXES.iter().any(|p| {
        path.strip_prefix('/')
            .and_then(|s| s.strip_prefix(p))
            .is_some_and(|s| s.starts_with('/'))
    });
    if under_gateway {
        with_cors(error(&Status::not_found("Not Found")))
    } else {
        http_not_found()
    }
}

/// A failed call as etcd's gateway answers it.
fn error(status: &Status) -> Response {
    let code = StatusCode::from_u16(json::http_status(status.code()))
        .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        json::error_body(status),
    )
        .into_response()
}

/// A successful answer: `body` is JSON.
fn ok(body: Body) -> Response {
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "application/json"),
            (
                HeaderName::from_static("grpc-metadata-content-type"),
                "application/grpc",
            ),
        ],
        body,
    )
        .into_response()
}

/// The request metadata a JSON call carries into its gRPC call: the
/// `Authorization` header (etcd reads a token from it) and every
/// `Grpc-Metadata-<name>` header as `<name>`, as grpc-gateway forwards them.
fn forwarded(headers: &HeaderMap) -> HeaderMap {
    let mut out = HeaderMap::new();
    for (name, value) in headers {
        if name == header::AUTHORIZATION {
            out.append(header::AUTHORIZATION, value.clone());
        } else if let Some(rest) = name.as_str().strip_prefix("grpc-metadata-") {
            let reserved = rest == "content-type" || rest == "te" || rest.starts_with("grpc-");
            if let (false, Ok(name)) = (reserved, HeaderName::from_bytes(rest.as_bytes())) {
                out.append(name, value.clone());
            }
        }
    }
    out
}

/// One JSON call of `route`.
async fn handle(
    route: &'static Route,
    service: GrpcService,
    limit: usize,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let metadata = forwarded(&headers);
    match route.shape {
        Shape::Unary | Shape::ServerStream => {
            let bytes = match axum::body::to_bytes(body, limit).await {
                Ok(b) => b,
                Err(e) => return error(&Status::invalid_argument(e.to_string())),
            };
            let message = match json::encode_body(route.request, &bytes) {
                Ok(m) => m,
                Err(s) => return error(&s),
            };
            let body = call::unary_body(&message);
            let mut messages = match call::start(&service, route.method, body, metadata).await {
                Ok(m) => m,
                Err(s) => return error(&s),
            };
            if route.shape == Shape::ServerStream {
                return ok(Body::from_stream(lines(route, messages)));
            }
            match messages.next().await {
                // Read on to the trailers, so the call ends as completed
                // (the metrics layer would count a dropped body Canceled).
                Ok(Some(bytes)) => {
                    match (messages.next().await, json::to_json(route.response, &bytes)) {
                        (Err(s), _) | (_, Err(s)) => error(&s),
                        (Ok(_), Ok(text)) => ok(Body::from(text)),
                    }
                }
                Ok(None) => error(&Status::internal("gateway: the call returned no message")),
                Err(s) => error(&s),
            }
        }
        Shape::BidiStream | Shape::BidiHeld => {
            let mut reader = JsonValues::new(body.into_data_stream(), limit);
            // As etcd's gateway: a first request that does not decode fails
            // the call (as Unknown), later ones end the request side.
            let first = match reader.next().await {
                Ok(v) => v,
                Err(s) => return error(&Status::unknown(s.message())),
            };
            let first = match first.map(|v| json::encode_value(route.request, v)) {
                None => None,
                Some(Ok(m)) => Some(call::frame(&m)),
                Some(Err(s)) => return error(&Status::unknown(s.message())),
            };
            let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, Infallible>>(16);
            let held = route.shape == Shape::BidiHeld;
            tokio::spawn(async move {
                if let Some(first) = first {
                    if tx.send(Ok(first)).await.is_err() {
                        return;
                    }
                    while let Ok(Some(value)) = reader.next().await {
                        let Ok(m) = json::encode_value(route.request, value) else {
                            break;
                        };
                        if tx.send(Ok(call::frame(&m))).await.is_err() {
                            return;
                        }
                    }
                }
                if held {
                    // Until the call ends (the client went away).
                    tx.closed().await;
                }
            });
            let body = call::streaming_body(tokio_stream::wrappers::ReceiverStream::new(rx));
            match call::start(&service, route.method, body, metadata).await {
                Ok(messages) => ok(Body::from_stream(lines(route, messages))),
                Err(s) => error(&s),
            }
        }
    }
}

/// A stream's answer: one `{"result":…}` line per message, and an
/// `{"error":…}` line if the call fails.
fn lines(
    route: &'static Route,
    messages: Messages,
) -> impl Stream<Item = Result<Bytes, Infallible>> + Send + 'static {
    futures::stream::unfold(Some(messages), move |state| async move {
        let mut messages = state?;
        let line = match messages.next().await {
            Ok(None) => return None,
            Ok(Some(bytes)) => match json::to_json(route.response, &bytes) {
                Ok(text) => format!("{{\"result\":{text}}}\n"),
                Err(s) => return Some((Ok(Bytes::from(json::stream_error_line(&s))), None)),
            },
            Err(s) => return Some((Ok(Bytes::from(json::stream_error_line(&s))), None)),
        };
        Some((Ok(Bytes::from(line)), Some(messages)))
    })
}

/// The JSON values of a request body, read one by one as they arrive.
struct JsonValues<S> {
    data: S,
    buf: BytesMut,
    done: bool,
    limit: usize,
}

impl<S, E> JsonValues<S>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    fn new(data: S, limit: usize) -> Self {
        JsonValues {
            data,
            buf: BytesMut::new(),
            done: false,
            limit,
        }
    }

    /// The next value, `None` at the end of the body.
    async fn next(&mut self) -> Result<Option<serde_json::Value>, Status> {
        loop {
            let start = self.buf.iter().position(|b| !b.is_ascii_whitespace());
            match start {
                Some(start) => {
                    let mut values = serde_json::Deserializer::from_slice(&self.buf[start..])
                        .into_iter::<serde_json::Value>();
                    match values.next() {
                        Some(Ok(v)) => {
                            let used = start + values.byte_offset();
                            self.buf.advance(used);
                            return Ok(Some(v));
                        }
                        Some(Err(e)) if e.is_eof() && !self.done => {}
                        Some(Err(e)) => return Err(Status::invalid_argument(e.to_string())),
                        None if self.done => return Ok(None),
                        None => {}
                    }
                }
                None if self.done => return Ok(None),
                None => self.buf.clear(),
            }
            match self.data.next().await {
                Some(Ok(chunk)) => {
                    if self.buf.len() + chunk.len() > self.limit {
                        return Err(Status::invalid_argument("request body too large"));
                    }
                    self.buf.extend_from_slice(&chunk);
                }
                Some(Err(e)) => return Err(Status::invalid_argument(e.to_string())),
                None => self.done = true,
            }
        }
    }
}

//! A lean unary gRPC client straight on the `h2` crate.
//!
//! The load tool shares the machine's two cores with the server it measures,
//! so every microsecond of client CPU per request is a microsecond the
//! server does not get, and throughput ratios against stock etcd end up
//! measuring our client as much as either server. tonic's `Channel` pays
//! for a tower `Buffer` (an extra task hop and channel per request),
//! hyper's client dispatch, and tonic's streaming body and codec machinery.
//! None of that is needed for a unary call on a connection we own, so this
//! module sends one HEADERS frame and one DATA frame per request on a
//! shared `h2::client::SendRequest`, reads the reply body and trailers, and
//! leaves the reading of `grpc-status` and `grpc-message` to tonic
//! (`Status::from_header_map`), so error reports do not depend on the
//! transport.
//!
//! It is kept because measurements show it matters. Re-measured when the
//! tool became its own crate (BENCHMARKS.md, "Reorganised load tool vs the
//! old one"): on `put` (100 clients, 1 KiB values) against one ephd build,
//! this client spends 12–14 µs of CPU per request and `--transport tonic`
//! 32–39 µs, nearly three times as much; tonic's undisturbed runs reached
//! 23.8k puts/s against 37.6k (medians of 3), and even the server spent
//! more per request (38 against 30 µs), its replies less batched. The
//! other workloads' KV calls go through the same client; Watch and Lease
//! streams stay on tonic (they are not the hot path), and
//! `--transport tonic` remains for comparison.
//!
//! Only unary calls are supported. The write coalescing under each
//! connection is in `coalesce`, the tests in `tests`.

mod coalesce;
#[cfg(test)]
mod tests;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use coalesce::{CoalescingIo, FlushClock};
use http::header::{HeaderName, HeaderValue, CONTENT_TYPE, TE};
use http::uri::{Authority, PathAndQuery, Scheme, Uri};
use http::{HeaderMap, Method, StatusCode, Version};
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;
use tokio::net::TcpStream;
use tonic::{Code, Status};

/// The gRPC message prefix: 1 byte compressed flag, 4 bytes big-endian length.
const PREFIX_LEN: usize = 5;

/// The status header, as a constant so a lookup does not parse the name.
const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");

/// One HTTP/2 connection to a gRPC server, ready for unary calls.
///
/// Cloning is cheap and shares the connection (each clone is a new handle on
/// the same `SendRequest`); the connection itself is driven by a task
/// spawned in [`Channel::connect`] and ends when the last handle is dropped
/// or the server goes away. There is no reconnecting: once the connection
/// is lost every request on it fails at once with `Unavailable`, which is
/// all a benchmark run can do with a server that went away.
#[derive(Clone)]
pub struct Channel {
    send: h2::client::SendRequest<Bytes>,
    authority: Authority,
}

impl Channel {
    /// Connects over plain TCP (no TLS: the tool only targets loopback),
    /// with TCP_NODELAY and the same large HTTP/2 windows as the tonic
    /// `Endpoint` settings, so both transports see the same flow control.
    /// Errors are worded like the tonic path's (`cannot connect to ADDR:
    /// …`, `connecting to ADDR timed out`).
    pub async fn connect(addr: SocketAddr, timeout: Duration) -> Result<Channel, String> {
        let handshake = async {
            let tcp = TcpStream::connect(addr)
                .await
                .map_err(|e| format!("cannot connect to {addr}: tcp connect error: {e}"))?;
            tcp.set_nodelay(true)
                .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
            let clock = Arc::new(FlushClock::default());
            let io = CoalescingIo::new(tcp, clock.clone());
            h2::client::Builder::new()
                .initial_window_size(4 << 20)
                .initial_connection_window_size(16 << 20)
                .max_send_buffer_size(1 << 20)
                .enable_push(false)
                .handshake::<_, Bytes>(io)
                .await
                .map(|(send, conn)| (send, conn, clock))
                .map_err(|e| format!("cannot connect to {addr}: http2 handshake: {e}"))
        };
        let (send, mut conn, clock) = tokio::time::timeout(timeout, handshake)
            .await
            .map_err(|_| format!("connecting to {addr} timed out"))??;
        // The connection reads and writes frames for every stream on it; its
        // error, if any, also reaches each open or later request through
        // `SendRequest`/`RecvStream`, so there is nothing to do with it here.
        // A poll that put off a flush is followed at once by another, whose
        // flush writes the batch (see `CoalescingIo`). That second poll
        // normally has nothing new to put off; the bound only keeps a
        // connection that is flooded with frames from starving other tasks.
        tokio::spawn(std::future::poll_fn(move |cx| {
            for _ in 0..4 {
                let poll = clock.polls.fetch_add(1, Ordering::Relaxed) + 1;
                if Pin::new(&mut conn).poll(cx).is_ready() {
                    return Poll::Ready(());
                }
                if clock.deferred_in.load(Ordering::Relaxed) != poll {
                    return Poll::Pending;
                }
            }
            // Frames keep coming: let other tasks run, then write them.
            cx.waker().wake_by_ref();
            Poll::Pending
        }));
        let authority = Authority::try_from(addr.to_string())
            .map_err(|e| format!("endpoint {addr}: bad authority: {e}"))?;
        Ok(Channel { send, authority })
    }

    /// The request URI of a gRPC method (`path` like
    /// `/etcdserverpb.KV/Put`), built once per client so that each request
    /// only clones it.
    pub fn method(&self, path: &'static str) -> Uri {
        let mut parts = http::uri::Parts::default();
        parts.scheme = Some(Scheme::HTTP);
        parts.authority = Some(self.authority.clone());
        parts.path_and_query = Some(PathAndQuery::from_static(path));
        Uri::from_parts(parts).expect("scheme, authority and path make a valid URI")
    }
}

/// A unary caller on one [`Channel`], owned by one client task.
///
/// It keeps what can be reused from one request to the next: the request
/// header template (cloned, never rebuilt) and the encode buffer (each
/// request's bytes are split off it, and its storage is reclaimed once h2
/// has written them).
pub struct Client {
    send: h2::client::SendRequest<Bytes>,
    headers: HeaderMap,
    buf: BytesMut,
}

impl Client {
    /// A caller sharing `channel`'s connection.
    pub fn new(channel: &Channel) -> Client {
        let mut headers = HeaderMap::with_capacity(2);
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        headers.insert(TE, HeaderValue::from_static("trailers"));
        Client {
            send: channel.send.clone(),
            headers,
            buf: BytesMut::new(),
        }
    }

    /// Sends one unary request to `uri` (from [`Channel::method`]) and
    /// waits for its reply, like a tonic-generated client method: the
    /// request metadata becomes headers; a non-OK `grpc-status` (in the
    /// trailers, or in the headers of a trailers-only reply), an HTTP/2
    /// reset or a connection error becomes the `Err`. The returned
    /// response carries no metadata (nothing in the tool reads it).
    pub async fn unary<Req, Resp>(
        &mut self,
        uri: &Uri,
        request: impl tonic::IntoRequest<Req>,
    ) -> Result<tonic::Response<Resp>, Status>
    where
        Req: prost::Message,
        Resp: prost::Message + Default,
    {
        let (metadata, _, message) = request.into_request().into_parts();
        let body = encode(&mut self.buf, &message)?;

        let mut req = http::Request::new(());
        *req.method_mut() = Method::POST;
        *req.uri_mut() = uri.clone();
        *req.version_mut() = Version::HTTP_2;
        let mut headers = self.headers.clone();
        if !metadata.is_empty() {
            headers.extend(metadata.into_headers());
        }
        *req.headers_mut() = headers;

        std::future::poll_fn(|cx| self.send.poll_ready(cx))
            .await
            .map_err(h2_status)?;
        let (response, mut stream) = self.send.send_request(req, false).map_err(h2_status)?;
        stream.send_data(body, true).map_err(h2_status)?;

        let (parts, mut body) = response.await.map_err(h2_status)?.into_parts();
        // A trailers-only reply carries its status in the headers; a non-OK
        // one has no message to wait for.
        let status_in_headers = match grpc_status(&parts.headers) {
            Some(Err(st)) => return Err(st),
            Some(Ok(())) => true,
            None => false,
        };

        let data = read_body(&mut body).await?;
        let trailers = body.trailers().await.map_err(h2_status)?;
        match trailers.as_ref().and_then(grpc_status) {
            Some(Err(st)) => return Err(st),
            Some(Ok(())) => {}
            None if status_in_headers => {}
            None => return Err(missing_status(parts.status)),
        }
        let message = decode_message(data)?;
        Ok(tonic::Response::new(message))
    }
}

/// The gRPC frame of `message`: the 5-byte prefix, then the prost
/// encoding, written into the caller's reused buffer and split off as
/// `Bytes` (the buffer's storage is reclaimed once those bytes are dropped).
fn encode<M: prost::Message>(buf: &mut BytesMut, message: &M) -> Result<Bytes, Status> {
    let len = message.encoded_len();
    let len32 = u32::try_from(len).map_err(|_| {
        Status::resource_exhausted(format!("request message of {len} bytes is too large"))
    })?;
    buf.reserve(PREFIX_LEN + len);
    buf.put_u8(0);
    buf.put_u32(len32);
    message
        .encode(buf)
        .map_err(|e| Status::internal(format!("encoding the request: {e}")))?;
    Ok(buf.split().freeze())
}

/// The most a reply buffer is sized for up front from a message prefix.
const MAX_PREALLOC: usize = 256 << 20;

/// Reads the whole response body, returning the flow-control capacity of
/// each chunk as it arrives so the server is never stalled by our windows.
/// The usual single-chunk reply is returned as is, without a copy.
async fn read_body(body: &mut h2::RecvStream) -> Result<Bytes, Status> {
    let mut first = Bytes::new();
    let mut joined: Option<BytesMut> = None;
    while let Some(chunk) = body.data().await {
        let chunk = chunk.map_err(h2_status)?;
        // Only fails once the stream is gone, which `data()` reports next.
        let _ = body.flow_control().release_capacity(chunk.len());
        if chunk.is_empty() {
            continue;
        }
        if let Some(buf) = joined.as_mut() {
            buf.extend_from_slice(&chunk);
        } else if first.is_empty() {
            first = chunk;
        } else {
            // Size the buffer for the whole message when its prefix says how
            // big it is, so a large Range reply is copied once (up to a sane
            // bound, in case the prefix is garbage).
            let framed = if first.len() >= PREFIX_LEN {
                PREFIX_LEN + u32::from_be_bytes([first[1], first[2], first[3], first[4]]) as usize
            } else {
                0
            };
            let framed = framed.min(MAX_PREALLOC);
            let mut buf = BytesMut::with_capacity(framed.max(first.len() + chunk.len()));
            buf.extend_from_slice(&first);
            buf.extend_from_slice(&chunk);
            joined = Some(buf);
        }
    }
    Ok(joined.map_or(first, BytesMut::freeze))
}

/// Decodes the single message of a unary reply (extra messages, which a
/// unary server must not send, are ignored as tonic does).
fn decode_message<M: prost::Message + Default>(mut data: Bytes) -> Result<M, Status> {
    if data.is_empty() {
        return Err(Status::internal("Missing response message."));
    }
    if data.len() < PREFIX_LEN {
        return Err(Status::internal("Unexpected EOF decoding stream."));
    }
    let flag = data.get_u8();
    let len = data.get_u32() as usize;
    match flag {
        0 => {}
        // We never send grpc-accept-encoding, so a compressed reply is the
        // server's protocol error.
        1 => {
            return Err(Status::internal(
                "protocol error: received message with compressed-flag but no grpc-encoding was specified",
            ))
        }
        f => {
            return Err(Status::internal(format!(
                "protocol error: received message with invalid compression flag: {f}"
            )))
        }
    }
    if data.len() < len {
        return Err(Status::internal("Unexpected EOF decoding stream."));
    }
    // Decoding from `Bytes` lets prost slice the `bytes` fields (keys,
    // values) out of the reply instead of copying them.
    M::decode(data.split_to(len)).map_err(|e| Status::internal(e.to_string()))
}

/// The outcome `grpc-status` (with `grpc-message`) gives, if the headers
/// have one; tonic reads it (code, percent-decoded message, details), as
/// its own client does. Only the plain OK of every successful reply is
/// recognised here first: `Status::from_header_map` copies the whole header
/// map into the status's metadata, a cost every successful request would
/// pay for a status that is then thrown away.
fn grpc_status(headers: &HeaderMap) -> Option<Result<(), Status>> {
    if headers.get(&GRPC_STATUS)? == "0" {
        return Some(Ok(()));
    }
    let status = Status::from_header_map(headers)?;
    Some(if status.code() == Code::Ok {
        Ok(())
    } else {
        Err(status)
    })
}

/// The status of a reply that ended without `grpc-status`: gRPC's mapping
/// from the HTTP status (a proxy or a non-gRPC server answered), or
/// `Unknown` for a 200 whose stream was cut short. tonic applies the same
/// table but keeps it private, so it is written out here.
fn missing_status(http: StatusCode) -> Status {
    let code = match http {
        StatusCode::OK => {
            return Status::unknown(
                "protocol error: missing grpc-status trailer, stream was terminated without a final status",
            )
        }
        StatusCode::BAD_REQUEST => Code::Internal,
        StatusCode::UNAUTHORIZED => Code::Unauthenticated,
        StatusCode::FORBIDDEN => Code::PermissionDenied,
        StatusCode::NOT_FOUND => Code::Unimplemented,
        StatusCode::TOO_MANY_REQUESTS
        | StatusCode::BAD_GATEWAY
        | StatusCode::SERVICE_UNAVAILABLE
        | StatusCode::GATEWAY_TIMEOUT => Code::Unavailable,
        _ => Code::Unknown,
    };
    Status::new(
        code,
        format!(
            "grpc-status header missing, mapped from HTTP status code {}",
            http.as_u16()
        ),
    )
}

/// Maps an h2 error to a status. A lost connection (I/O error or GOAWAY)
/// is `Unavailable`, what a tonic channel reports once it finds the server
/// gone; anything else (a stream reset) is mapped by tonic from its reason
/// code, as the gRPC HTTP/2 spec says (REFUSED_STREAM → Unavailable,
/// CANCEL → Cancelled, ENHANCE_YOUR_CALM → ResourceExhausted, ...).
fn h2_status(err: h2::Error) -> Status {
    if err.is_io() || err.is_go_away() {
        return Status::unavailable(format!("connection error: {err}"));
    }
    Status::from_error(Box::new(err))
}

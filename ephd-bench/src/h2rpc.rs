//! A lean unary gRPC client straight on the `h2` crate.
//!
//! The load tool shares the machine's two cores with the server it measures,
//! so every microsecond of client CPU per request is a microsecond the
//! server does not get, and throughput ratios against stock etcd end up
//! measuring our client as much as either server. tonic's `Channel` costs
//! about 27 µs of CPU per 1 KiB Put: a tower `Buffer` (an extra task hop and
//! channel per request), hyper's client dispatch, and tonic's streaming
//! body and codec machinery. None of that is needed for a unary call on a
//! connection we own, so this module sends one HEADERS frame and one DATA
//! frame per request on a shared `h2::client::SendRequest`, reads the reply
//! body and trailers, and maps the outcome to the same `tonic::Status`
//! (code and message) tonic would give, so error reports do not depend on
//! the transport.
//!
//! Only unary calls are supported: Watch and Lease keep-alive streams stay
//! on tonic (they are not the hot path).

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::header::{HeaderName, HeaderValue, CONTENT_TYPE, TE};
use http::uri::{Authority, PathAndQuery, Scheme, Uri};
use http::{HeaderMap, Method, StatusCode, Version};
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tonic::{Code, Status};

/// The gRPC message prefix: 1 byte compressed flag, 4 bytes big-endian length.
const PREFIX_LEN: usize = 5;

/// The status headers, as constants so a lookup does not parse the name.
const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");

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
        let status_in_headers = match status_from_headers(&parts.headers) {
            Some(st) if st.code() != Code::Ok => return Err(st),
            Some(_) => true,
            None => false,
        };

        let data = read_body(&mut body).await?;
        let trailers = body.trailers().await.map_err(h2_status)?;
        match trailers.as_ref().and_then(status_from_headers) {
            Some(st) if st.code() != Code::Ok => return Err(st),
            Some(_) => {}
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

/// Bytes a connection's write buffer takes before a write must go out to
/// the socket even within one poll (back-pressure).
const WRITE_BUF_LIMIT: usize = 64 << 10;

/// The TCP stream under one h2 connection, coalescing its writes.
///
/// h2 writes a DATA frame bigger than 256 bytes straight from the caller's
/// buffer and flushes before it takes the next frame, so with 1 KiB values
/// every request costs its own `writev`, and on loopback each write also
/// pays the receiving side's TCP processing: the largest single item of
/// the client's CPU. Here writes only append to a buffer, and the first
/// flush of a poll of the connection is put off; the connection task then
/// polls the connection once more, right away, and that poll's flush
/// writes everything buffered in one go. So a poll that sends the requests
/// of many client tasks costs one write, as with gRPC's own clients
/// (grpc-go batches frames until its write queue is empty). On the default
/// one-thread runtime, where the client tasks woken by a batch of replies
/// all run before the connection task's next poll, that is about one write
/// per four Puts at 100 clients over 10 connections instead of one per
/// Put. Putting the write off by a wake-up instead (a yield) costs more than
/// it saves on a multi-thread runtime: the threads keep waking each other.
struct CoalescingIo {
    tcp: TcpStream,
    /// Bytes accepted from h2 and not yet written, from `written` on.
    buf: Vec<u8>,
    written: usize,
    clock: Arc<FlushClock>,
}

/// What a connection's task and its [`CoalescingIo`] share to put a flush
/// off to the next poll of the connection.
#[derive(Default)]
struct FlushClock {
    /// Polls of the connection so far.
    polls: AtomicU64,
    /// The poll during which a flush was put off, or 0.
    deferred_in: AtomicU64,
}

impl CoalescingIo {
    fn new(tcp: TcpStream, clock: Arc<FlushClock>) -> Self {
        CoalescingIo {
            tcp,
            buf: Vec::with_capacity(WRITE_BUF_LIMIT),
            written: 0,
            clock,
        }
    }

    /// Writes out everything buffered.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.written < self.buf.len() {
            let n = ready!(Pin::new(&mut self.tcp).poll_write(cx, &self.buf[self.written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.written += n;
        }
        self.buf.clear();
        self.written = 0;
        self.clock.deferred_in.store(0, Ordering::Relaxed);
        Poll::Ready(Ok(()))
    }

    /// Makes room before taking more bytes: only once the buffer is full
    /// does a write have to reach the socket first.
    fn poll_room(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.buf.len() >= WRITE_BUF_LIMIT {
            return self.poll_drain(cx);
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncRead for CoalescingIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_read(cx, buf)
    }
}

impl AsyncWrite for CoalescingIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        ready!(self.poll_room(cx))?;
        self.buf.extend_from_slice(data);
        Poll::Ready(Ok(data.len()))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        ready!(self.poll_room(cx))?;
        let mut n = 0;
        for b in bufs {
            self.buf.extend_from_slice(b);
            n += b.len();
        }
        Poll::Ready(Ok(n))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.written == self.buf.len() {
            return Poll::Ready(Ok(()));
        }
        let now = self.clock.polls.load(Ordering::Relaxed);
        match self.clock.deferred_in.load(Ordering::Relaxed) {
            // Nothing put off yet: more frames may follow in this poll.
            0 => {
                self.clock.deferred_in.store(now, Ordering::Relaxed);
                Poll::Ready(Ok(()))
            }
            // Already put off during this poll.
            poll if poll == now => Poll::Ready(Ok(())),
            // Put off during an earlier poll: this is the batch's write.
            _ => self.poll_drain(cx),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_drain(cx))?;
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
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

/// The status in `grpc-status`/`grpc-message`, if there is one. An unknown
/// code number reads as `Unknown`, as in tonic.
fn status_from_headers(headers: &HeaderMap) -> Option<Status> {
    let code = Code::from_bytes(headers.get(&GRPC_STATUS)?.as_bytes());
    let message = headers
        .get(&GRPC_MESSAGE)
        .map(|v| percent_decode(v.as_bytes()))
        .unwrap_or_default();
    Some(Status::new(code, message))
}

/// Undoes gRPC's percent-encoding of `grpc-message` (`%XX` for each byte
/// outside printable ASCII, and for `%` itself). The gRPC spec asks
/// decoders to keep a malformed `%` sequence as it is rather than fail, and
/// the decoded bytes are UTF-8 (invalid ones become U+FFFD).
fn percent_decode(raw: &[u8]) -> String {
    fn hex(b: u8) -> Option<u8> {
        match b {
            b'0'..=b'9' => Some(b - b'0'),
            b'a'..=b'f' => Some(b - b'a' + 10),
            b'A'..=b'F' => Some(b - b'A' + 10),
            _ => None,
        }
    }
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        if raw[i] == b'%' && i + 2 < raw.len() {
            if let (Some(h), Some(l)) = (hex(raw[i + 1]), hex(raw[i + 2])) {
                out.push(h << 4 | l);
                i += 3;
                continue;
            }
        }
        out.push(raw[i]);
        i += 1;
    }
    match String::from_utf8(out) {
        Ok(s) => s,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    }
}

/// The status of a reply that ended without `grpc-status`: gRPC's mapping
/// from the HTTP status (a proxy or a non-gRPC server answered), or
/// `Unknown` for a 200 whose stream was cut short.
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

/// Maps an h2 error to a status. A stream reset maps by its reason code as
/// the gRPC HTTP/2 spec says (REFUSED_STREAM → Unavailable, CANCEL →
/// Cancelled, ENHANCE_YOUR_CALM → ResourceExhausted, INADEQUATE_SECURITY →
/// PermissionDenied, the rest → Internal). A lost connection (I/O error or
/// GOAWAY) is `Unavailable`, what a tonic channel reports once it finds the
/// server gone.
fn h2_status(err: h2::Error) -> Status {
    if err.is_io() || err.is_go_away() {
        return Status::unavailable(format!("connection error: {err}"));
    }
    let code = match err.reason() {
        Some(h2::Reason::REFUSED_STREAM) => Code::Unavailable,
        Some(h2::Reason::CANCEL) => Code::Cancelled,
        Some(h2::Reason::ENHANCE_YOUR_CALM) => Code::ResourceExhausted,
        Some(h2::Reason::INADEQUATE_SECURITY) => Code::PermissionDenied,
        Some(_) => Code::Internal,
        None => Code::Unknown,
    };
    Status::new(code, format!("h2 protocol error: {err}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_message_is_percent_decoded() {
        assert_eq!(percent_decode(b"plain text"), "plain text");
        assert_eq!(percent_decode(b"100%25 sure"), "100% sure");
        assert_eq!(percent_decode(b"caf%C3%A9"), "café");
        // Malformed sequences stay as they are.
        assert_eq!(percent_decode(b"50% off"), "50% off");
        assert_eq!(percent_decode(b"ends in %"), "ends in %");
        assert_eq!(percent_decode(b"ends in %4"), "ends in %4");
        assert_eq!(percent_decode(b"%zz"), "%zz");
    }

    #[test]
    fn status_matches_tonic_reading_the_same_headers() {
        let mut h = HeaderMap::new();
        h.insert("grpc-status", HeaderValue::from_static("3"));
        h.insert(
            "grpc-message",
            HeaderValue::from_static("etcdserver: requested lease not found %E2%9C%93"),
        );
        let ours = status_from_headers(&h).unwrap();
        let theirs = Status::from_header_map(&h).unwrap();
        assert_eq!(ours.code(), theirs.code());
        assert_eq!(ours.message(), theirs.message());

        h.insert("grpc-status", HeaderValue::from_static("99"));
        assert_eq!(status_from_headers(&h).unwrap().code(), Code::Unknown);
        assert!(status_from_headers(&HeaderMap::new()).is_none());
    }

    #[test]
    fn replies_decode_or_fail_as_internal() {
        use ephd::proto::etcdserverpb::{PutResponse, ResponseHeader};
        let msg = PutResponse {
            header: Some(ResponseHeader {
                revision: 42,
                ..Default::default()
            }),
            prev_kv: None,
        };
        let framed = encode(&mut BytesMut::new(), &msg).unwrap();
        assert_eq!(framed[0], 0);
        let back: PutResponse = decode_message(framed.clone()).unwrap();
        assert_eq!(back, msg);

        let cut = framed.slice(..framed.len() - 1);
        let err = decode_message::<PutResponse>(cut).unwrap_err();
        assert_eq!(err.code(), Code::Internal);
        let err = decode_message::<PutResponse>(Bytes::new()).unwrap_err();
        assert_eq!(err.message(), "Missing response message.");
        let mut compressed = framed.to_vec();
        compressed[0] = 1;
        let err = decode_message::<PutResponse>(compressed.into()).unwrap_err();
        assert_eq!(err.code(), Code::Internal);
    }

    #[test]
    fn missing_status_maps_http_codes() {
        assert_eq!(
            missing_status(StatusCode::NOT_FOUND).code(),
            Code::Unimplemented
        );
        assert_eq!(
            missing_status(StatusCode::SERVICE_UNAVAILABLE).code(),
            Code::Unavailable
        );
        assert_eq!(missing_status(StatusCode::OK).code(), Code::Unknown);
    }

    // ---------------------------------------------------------------
    // Against a scripted HTTP/2 server: each path is one way a reply can
    // end, so every branch of `unary` runs without a real etcd.

    use ephd::proto::etcdserverpb::{
        kv_client::KvClient, PutRequest, PutResponse, RangeRequest, RangeResponse, ResponseHeader,
        TxnRequest,
    };
    use http::Response;

    fn grpc_frame(m: &impl prost::Message) -> Bytes {
        encode(&mut BytesMut::new(), m).unwrap()
    }

    fn ok_trailers() -> HeaderMap {
        let mut t = HeaderMap::new();
        t.insert("grpc-status", HeaderValue::from_static("0"));
        t
    }

    fn grpc_headers(status: u16) -> Response<()> {
        Response::builder()
            .status(status)
            .header("content-type", "application/grpc")
            .body(())
            .unwrap()
    }

    /// Serves one request the way its path says.
    async fn script(
        req: http::Request<h2::RecvStream>,
        mut respond: h2::server::SendResponse<Bytes>,
    ) {
        let path = req.uri().path().to_string();
        let mut body = req.into_body();
        let mut got = BytesMut::new();
        while let Some(Ok(chunk)) = body.data().await {
            let _ = body.flow_control().release_capacity(chunk.len());
            got.extend_from_slice(&chunk);
        }
        match path.as_str() {
            // Echoes the request's key length as the revision, checking the
            // request's framing on the way.
            "/ok" | "/split" => {
                let req: PutRequest = decode_message(got.freeze()).unwrap();
                let reply = grpc_frame(&PutResponse {
                    header: Some(ResponseHeader {
                        revision: req.key.len() as i64,
                        ..Default::default()
                    }),
                    prev_kv: None,
                });
                let mut tx = respond.send_response(grpc_headers(200), false).unwrap();
                if path == "/split" {
                    for part in [reply.slice(..2), reply.slice(2..7), reply.slice(7..)] {
                        tx.send_data(part, false).unwrap();
                    }
                } else {
                    tx.send_data(reply, false).unwrap();
                }
                tx.send_trailers(ok_trailers()).unwrap();
            }
            // A 6 MiB reply: more than the 4 MiB stream window, so it only
            // arrives if the client releases capacity as it reads.
            "/big" => {
                let reply = grpc_frame(&RangeResponse {
                    count: 6,
                    kvs: (0..6)
                        .map(|i| ephd::proto::mvccpb::KeyValue {
                            key: Bytes::from(format!("k{i}")),
                            value: Bytes::from(vec![b'v'; 1 << 20]),
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                });
                let mut tx = respond.send_response(grpc_headers(200), false).unwrap();
                tx.send_data(reply, false).unwrap();
                tx.send_trailers(ok_trailers()).unwrap();
            }
            "/trailers-only" => {
                let mut r = grpc_headers(200);
                r.headers_mut()
                    .insert("grpc-status", HeaderValue::from_static("5"));
                r.headers_mut().insert(
                    "grpc-message",
                    HeaderValue::from_static("no%20such%20key%3A%20%2Fa%25"),
                );
                respond.send_response(r, true).unwrap();
            }
            "/error-after-data" => {
                let mut tx = respond.send_response(grpc_headers(200), false).unwrap();
                tx.send_data(grpc_frame(&PutResponse::default()), false)
                    .unwrap();
                let mut t = HeaderMap::new();
                t.insert("grpc-status", HeaderValue::from_static("9"));
                t.insert("grpc-message", HeaderValue::from_static("nope"));
                tx.send_trailers(t).unwrap();
            }
            "/no-status" => {
                let mut tx = respond.send_response(grpc_headers(200), false).unwrap();
                tx.send_data(grpc_frame(&PutResponse::default()), true)
                    .unwrap();
            }
            "/ok-without-message" => {
                let mut tx = respond.send_response(grpc_headers(200), false).unwrap();
                tx.send_trailers(ok_trailers()).unwrap();
            }
            "/http-404" => {
                respond.send_response(grpc_headers(404), true).unwrap();
            }
            "/refused" => respond.send_reset(h2::Reason::REFUSED_STREAM),
            "/cancel" => respond.send_reset(h2::Reason::CANCEL),
            other => panic!("unscripted path {other}"),
        }
    }

    /// A scripted HTTP/2 server on a free loopback port.
    async fn scripted_server() -> SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let Ok(mut conn) = h2::server::handshake(tcp).await else {
                        return;
                    };
                    while let Some(Ok((req, respond))) = conn.accept().await {
                        tokio::spawn(script(req, respond));
                    }
                });
            }
        });
        addr
    }

    async fn put_to(
        client: &mut Client,
        channel: &Channel,
        path: &'static str,
    ) -> Result<PutResponse, Status> {
        let req = PutRequest {
            key: Bytes::from_static(b"twelve bytes"),
            value: Bytes::from_static(b"v"),
            ..Default::default()
        };
        let uri = channel.method(path);
        let call = client.unary::<_, PutResponse>(&uri, req);
        tokio::time::timeout(Duration::from_secs(10), call)
            .await
            .expect("a reply or an error, never a hang")
            .map(tonic::Response::into_inner)
    }

    #[tokio::test]
    async fn every_way_a_reply_ends_maps_to_a_result() {
        let addr = scripted_server().await;
        let channel = Channel::connect(addr, Duration::from_secs(5))
            .await
            .unwrap();
        let mut c = Client::new(&channel);

        for path in ["/ok", "/split"] {
            let r = put_to(&mut c, &channel, path).await.unwrap();
            assert_eq!(r.header.unwrap().revision, 12, "{path}");
        }
        let big = c
            .unary::<_, RangeResponse>(&channel.method("/big"), RangeRequest::default())
            .await
            .unwrap()
            .into_inner();
        assert_eq!(big.kvs.len(), 6);
        assert!(big.kvs.iter().all(|kv| kv.value.len() == 1 << 20));

        let expect = [
            ("/trailers-only", Code::NotFound, "no such key: /a%"),
            ("/error-after-data", Code::FailedPrecondition, "nope"),
            (
                "/ok-without-message",
                Code::Internal,
                "Missing response message.",
            ),
            (
                "/http-404",
                Code::Unimplemented,
                "grpc-status header missing, mapped from HTTP status code 404",
            ),
        ];
        for (path, code, message) in expect {
            let st = put_to(&mut c, &channel, path).await.unwrap_err();
            assert_eq!((st.code(), st.message()), (code, message), "{path}");
        }
        let st = put_to(&mut c, &channel, "/no-status").await.unwrap_err();
        assert_eq!(st.code(), Code::Unknown);
        let st = put_to(&mut c, &channel, "/refused").await.unwrap_err();
        assert_eq!(st.code(), Code::Unavailable);
        let st = put_to(&mut c, &channel, "/cancel").await.unwrap_err();
        assert_eq!(st.code(), Code::Cancelled);

        // The connection survives all of that.
        assert!(put_to(&mut c, &channel, "/ok").await.is_ok());
    }

    #[tokio::test]
    async fn a_connection_the_server_drops_fails_requests_as_unavailable() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            // Accept, then hang up without a word.
            while let Ok((tcp, _)) = listener.accept().await {
                drop(tcp);
            }
        });
        let channel = Channel::connect(addr, Duration::from_secs(5))
            .await
            .unwrap();
        let mut c = Client::new(&channel);
        for _ in 0..3 {
            let st = put_to(&mut c, &channel, "/ok").await.unwrap_err();
            assert_eq!(st.code(), Code::Unavailable, "{st:?}");
        }
    }

    // ---------------------------------------------------------------
    // Against ephd itself: both transports must report the same thing.

    #[tokio::test]
    async fn lean_and_tonic_clients_agree_against_ephd() {
        use clap::Parser;
        let config = ephd::config::Config::parse_from([
            "ephd",
            "--listen-client-urls",
            "http://127.0.0.1:0",
            // Fail on unknown leases, as etcd does.
            "--lease-adopt-unknown-ttl",
            "0",
        ]);
        let server = ephd::server::Server::bind(config).await.unwrap();
        let addr = server.local_addrs()[0];
        tokio::spawn(server.run(std::future::pending()));

        let channel = Channel::connect(addr, Duration::from_secs(5))
            .await
            .unwrap();
        let mut lean = Client::new(&channel);
        let (put, txn) = (
            channel.method("/etcdserverpb.KV/Put"),
            channel.method("/etcdserverpb.KV/Txn"),
        );
        let mut tonic = KvClient::connect(format!("http://{addr}")).await.unwrap();

        let ok = PutRequest {
            key: Bytes::from_static(b"/a"),
            value: Bytes::from_static(b"1"),
            ..Default::default()
        };
        let a = lean
            .unary::<_, PutResponse>(&put, ok.clone())
            .await
            .unwrap();
        let b = tonic.put(ok).await.unwrap();
        assert_eq!(
            a.into_inner().header.unwrap().revision + 1,
            b.into_inner().header.unwrap().revision
        );

        let no_key = PutRequest::default();
        let bad_lease = TxnRequest {
            success: vec![crate::ops::put_op(
                &Bytes::from_static(b"/b"),
                Bytes::new(),
                0x5eed,
            )],
            ..Default::default()
        };
        let a = lean
            .unary::<_, PutResponse>(&put, no_key.clone())
            .await
            .unwrap_err();
        let b = tonic.put(no_key).await.unwrap_err();
        assert_eq!((a.code(), a.message()), (b.code(), b.message()));
        let a = lean
            .unary::<_, ephd::proto::etcdserverpb::TxnResponse>(&txn, bad_lease.clone())
            .await
            .unwrap_err();
        let b = tonic.txn(bad_lease).await.unwrap_err();
        assert_eq!((a.code(), a.message()), (b.code(), b.message()));
        assert_eq!(a.code(), Code::NotFound);

        // An unknown method: tonic's router answers with a trailers-only reply.
        let st = lean
            .unary::<_, PutResponse>(
                &channel.method("/etcdserverpb.KV/Nope"),
                PutRequest::default(),
            )
            .await
            .unwrap_err();
        assert_eq!(st.code(), Code::Unimplemented);
    }
}

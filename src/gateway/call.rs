//! Calling the server's own gRPC services in process, as real gRPC calls:
//! the request is a gRPC-framed HTTP request handed to the same tower stack
//! the client port serves (metrics, grpc-go limits, pre-encoded bodies), and
//! the response frames and `grpc-status` are read back. So the gateway
//! never reimplements a service: whatever the gRPC answer is, the JSON
//! answer is its translation.

use bytes::{Buf, Bytes, BytesMut};
use futures::Stream;
use http_body_util::BodyExt;
use std::convert::Infallible;
use tonic::codegen::http;
use tonic::Status;
use tower::util::BoxCloneSyncService;
use tower::ServiceExt;

/// The in-process gRPC stack the gateway calls.
pub type GrpcService = BoxCloneSyncService<
    http::Request<tonic::body::Body>,
    http::Response<tonic::body::Body>,
    Infallible,
>;

/// `message` as one uncompressed gRPC frame.
pub fn frame(message: &[u8]) -> Bytes {
    let mut buf = BytesMut::with_capacity(5 + message.len());
    buf.extend_from_slice(&[0]);
    buf.extend_from_slice(&(message.len() as u32).to_be_bytes());
    buf.extend_from_slice(message);
    buf.freeze()
}

/// Starts the call of `method` with `body` (gRPC frames) and the request
/// metadata `metadata`. An error is the call's status when it ended in
/// its headers (trailers-only), as failed unary calls do.
pub async fn start(
    service: &GrpcService,
    method: &'static str,
    body: tonic::body::Body,
    metadata: http::HeaderMap,
) -> Result<Messages, Status> {
    let mut req = http::Request::builder()
        .method(http::Method::POST)
        .uri(method)
        .version(http::Version::HTTP_2)
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(body)
        .map_err(|e| Status::internal(e.to_string()))?;
    req.headers_mut().extend(metadata);
    let resp = match service.clone().oneshot(req).await {
        Ok(resp) => resp,
        Err(never) => match never {},
    };
    if let Some(status) = Status::from_header_map(resp.headers()) {
        if status.code() != tonic::Code::Ok {
            return Err(status);
        }
    }
    Ok(Messages {
        body: resp.into_body(),
        buf: BytesMut::new(),
        done: false,
    })
}

/// The messages of a started call, read one by one.
pub struct Messages {
    body: tonic::body::Body,
    buf: BytesMut,
    done: bool,
}

impl Messages {
    /// The next message; `Ok(None)` when the call ended with OK, `Err` with
    /// its status otherwise.
    pub async fn next(&mut self) -> Result<Option<Bytes>, Status> {
        loop {
            if self.buf.len() >= 5 {
                let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]])
                    as usize;
                if self.buf.len() >= 5 + len {
                    if self.buf[0] != 0 {
                        return Err(Status::internal("compressed gRPC message"));
                    }
                    self.buf.advance(5);
                    return Ok(Some(self.buf.split_to(len).freeze()));
                }
            }
            if self.done {
                return Ok(None);
            }
            match self.body.frame().await {
                None => {
                    self.done = true;
                    if !self.buf.is_empty() {
                        return Err(Status::internal("truncated gRPC message"));
                    }
                }
                Some(Err(status)) => {
                    self.done = true;
                    return Err(status);
                }
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => self.buf.extend_from_slice(&data),
                    Err(frame) => {
                        if let Ok(trailers) = frame.into_trailers() {
                            self.done = true;
                            if let Some(status) = Status::from_header_map(&trailers) {
                                if status.code() != tonic::Code::Ok {
                                    return Err(status);
                                }
                            }
                        }
                    }
                },
            }
        }
    }
}

/// A request body of gRPC frames from `frames`.
pub fn streaming_body(
    frames: impl Stream<Item = Result<Bytes, Infallible>> + Send + 'static,
) -> tonic::body::Body {
    tonic::body::Body::new(axum::body::Body::from_stream(frames))
}

/// A request body of one gRPC frame.
pub fn unary_body(message: &[u8]) -> tonic::body::Body {
    tonic::body::Body::new(axum::body::Body::from(frame(message)))
}

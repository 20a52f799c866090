//! The framed peer lanes: a lane's Raft batches as length-prefixed frames
//! on a TCP connection of its own (TLS when the peer URLs are https://),
//! instead of a gRPC stream (`peer_stream.rs`).
//!
//! Why: on a gRPC stream every batch crossed three tasks on the sending
//! member (the lane, the request body's pipe, the HTTP/2 connection) and
//! two on the receiving one (the connection, the stream's handler), each
//! crossing a wake-up, besides HTTP/2's framing, flow control and window
//! updates. The profile of a three-member cluster under etcd's `benchmark
//! put` put the peer transport at about a quarter of each member's CPU
//! (BENCHMARKS.md). On a framed lane the lane's task writes each batch to
//! the socket itself and the receiving connection's task hands it to the
//! Raft loop itself.
//!
//! The protocol, version 1. The dialling member sends `HELLO` (the magic
//! bytes and the version); a member that serves framed lanes answers with
//! the same bytes, and from then on each side sends frames: a kind byte, the
//! payload's length (4 bytes, big-endian), the payload.
//! * `BATCH` (dialler to listener): a `RaftBatch`, encoded as on the gRPC
//!   stream; its `ack` asks for an ack as there.
//! * `ACK` (listener to dialler): a `RaftAck` answering a batch.
//! * `REFUSED` (listener to dialler), then the connection ends: a gRPC
//!   status code (4 bytes) and its message, as the gRPC stream would have
//!   ended (a removed sender, a message that does not parse).
//!
//! Negotiation keeps members of older builds working (a rolling upgrade):
//! under TLS the dialler offers the ALPN protocol `ALPN` besides `h2`,
//! and a listener that does not select it serves gRPC only; in plaintext a
//! listener that answers `HELLO` with anything else (an older member's
//! HTTP/2 server answers with its settings, or hangs up) serves gRPC only.
//! Either way the lane falls back to its gRPC stream for a while
//! (`GRPC_FALLBACK`) and then tries again. Snapshots, forwarded lease
//! calls and membership calls stay on gRPC. `EPHD_PEER_TRANSPORT=grpc`
//! ([`crate::cluster::PeerSettings::framed_lanes`]) turns the framed lanes off on
//! both sides (diagnosis, or the behaviour of
//! older builds); see CLUSTER.md.

use crate::cluster::transport::peer_metrics::Outgoing;
use crate::cluster::transport::peer_stream::Acks;
use crate::proto::ephd::internal::{RaftAck, RaftBatch};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use prost::Message as _;
use std::io;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadHalf, WriteHalf};
use tonic::{Code, Status};

/// The ALPN protocol of framed lanes under TLS.
pub(crate) const ALPN: &[u8] = b"ephd-raft/1";

/// What both sides send first: the magic bytes, then the version.
pub(crate) const HELLO: &[u8; 12] = b"EPHDRAFT\0\0\0\x01";
/// The magic part of [`HELLO`]: what a listener looks for on plaintext.
pub(crate) const MAGIC: &[u8; 8] = b"EPHDRAFT";
/// A frame carrying a `RaftBatch`.
pub(in crate::cluster) const BATCH: u8 = 1;
/// A frame carrying a `RaftAck`.
pub(in crate::cluster) const ACK: u8 = 2;
/// A frame carrying a refusal (a gRPC status); the last on a connection.
pub(in crate::cluster) const REFUSED: u8 = 3;
/// Bytes before a frame's payload: its kind and its length.
const HEADER: usize = 5;
/// How long a lane uses its gRPC stream after a peer did not offer framed
/// lanes, before it tries them again (an upgraded peer gets them within
/// this long).
pub(in crate::cluster) const GRPC_FALLBACK: Duration = Duration::from_secs(30);
/// Spare room a reader keeps for the next read.
const READ_CHUNK: usize = 64 * 1024;

/// A connection's byte stream, plain or TLS.
pub trait PeerIo: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> PeerIo for T {}

/// Reads frames off a connection. [`FrameReader::next`] may be cancelled
/// (a `select!`) without losing bytes: what was read stays buffered.
pub(in crate::cluster) struct FrameReader<R> {
    io: R,
    buf: BytesMut,
    /// The largest payload taken; a larger one is an error.
    max: usize,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    /// A reader of `io`'s frames up to `max` payload bytes.
    pub(in crate::cluster) fn new(io: R, max: usize) -> Self {
        FrameReader {
            io,
            buf: BytesMut::new(),
            max,
        }
    }

    /// Reads more bytes into the buffer; false at the end of the stream.
    async fn fill(&mut self, want: usize) -> io::Result<bool> {
        if self.buf.capacity() - self.buf.len() < READ_CHUNK.min(want) {
            self.buf.reserve(want.max(READ_CHUNK));
        }
        Ok(self.io.read_buf(&mut self.buf).await? > 0)
    }

    /// The first `n` bytes (a [`HELLO`]); `None` when the stream ends
    /// before.
    pub(in crate::cluster) async fn exact(&mut self, n: usize) -> io::Result<Option<Bytes>> {
        while self.buf.len() < n {
            if !self.fill(n - self.buf.len()).await? {
                return Ok(None);
            }
        }
        Ok(Some(self.buf.split_to(n).freeze()))
    }

    /// The next frame's kind and payload; `None` when the stream ends
    /// between frames.
    pub(in crate::cluster) async fn next(&mut self) -> io::Result<Option<(u8, Bytes)>> {
        loop {
            let mut want = HEADER;
            if self.buf.len() >= HEADER {
                let len = (&self.buf[1..HEADER]).get_u32() as usize;
                if len > self.max {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("a frame of {len} bytes is larger than {}", self.max),
                    ));
                }
                if self.buf.len() >= HEADER + len {
                    let kind = self.buf[0];
                    self.buf.advance(HEADER);
                    return Ok(Some((kind, self.buf.split_to(len).freeze())));
                }
                want = HEADER + len;
            }
            if !self.fill(want - self.buf.len()).await? {
                return if self.buf.is_empty() {
                    Ok(None)
                } else {
                    Err(io::ErrorKind::UnexpectedEof.into())
                };
            }
        }
    }
}

/// Appends a frame of `kind` holding `msg` to `out`.
pub(in crate::cluster) fn put_message(out: &mut BytesMut, kind: u8, msg: &impl prost::Message) {
    let len = msg.encoded_len();
    out.reserve(HEADER + len);
    out.put_u8(kind);
    out.put_u32(len as u32);
    // Cannot fail: the room was reserved above.
    let _ = msg.encode(out);
}

/// Appends a [`REFUSED`] frame carrying `status` to `out`.
pub(in crate::cluster) fn put_refusal(out: &mut BytesMut, status: &Status) {
    let message = status.message().as_bytes();
    out.put_u8(REFUSED);
    out.put_u32((4 + message.len()) as u32);
    out.put_i32(status.code() as i32);
    out.put_slice(message);
}

/// The status a [`REFUSED`] frame carries.
pub(in crate::cluster) fn refusal(mut payload: Bytes) -> Status {
    if payload.len() < 4 {
        return Status::internal("a malformed refusal from the peer");
    }
    let code = Code::from_i32(payload.get_i32());
    Status::new(code, String::from_utf8_lossy(&payload).into_owned())
}

/// What opening a framed lane came to, when it did not open.
pub(in crate::cluster) enum NotOpened {
    /// The peer serves no framed lanes (an older build, or one with them
    /// turned off): use its gRPC stream.
    NotOffered,
    /// The peer could not be reached or did not answer within the limit.
    Failed(Status),
}

/// An open framed lane to a peer: the interface of `peer_stream::Link`.
pub(in crate::cluster) struct FramedLink {
    reader: FrameReader<ReadHalf<Box<dyn PeerIo>>>,
    writer: WriteHalf<Box<dyn PeerIo>>,
    /// The frame being written (kept for its allocation).
    out: BytesMut,
    acks: Acks,
}

impl FramedLink {
    /// Says hello on `io`, a new connection to a peer that may serve
    /// framed lanes; `max`: the largest frame taken from it.
    pub(in crate::cluster) async fn hello(
        io: Box<dyn PeerIo>,
        timed: Option<Arc<Outgoing>>,
        max: usize,
    ) -> Result<FramedLink, NotOpened> {
        let (r, mut writer) = tokio::io::split(io);
        let mut reader = FrameReader::new(r, max);
        if let Err(e) = writer.write_all(HELLO).await {
            return Err(NotOpened::Failed(Status::unavailable(e.to_string())));
        }
        match reader.exact(HELLO.len()).await {
            Ok(Some(answer)) if answer[..] == HELLO[..] => {}
            // An older member's HTTP/2 server answers with its own
            // frames, or hangs up on bytes it cannot read.
            Ok(_) | Err(_) => return Err(NotOpened::NotOffered),
        }
        Ok(FramedLink {
            reader,
            writer,
            out: BytesMut::new(),
            acks: Acks::new(timed),
        })
    }

    /// Writes `batch`, asking for an ack when it is time; false when it
    /// could not be written within `limit` (the connection is then
    /// unusable: a frame may be half written).
    pub(in crate::cluster) async fn send(&mut self, mut batch: RaftBatch, limit: Duration) -> bool {
        self.acks.stamp(&mut batch);
        self.out.clear();
        put_message(&mut self.out, BATCH, &batch);
        let written = tokio::time::timeout(limit, self.writer.write_all(&self.out)).await;
        if self.out.capacity() > READ_CHUNK {
            // A large batch's buffer is not kept.
            self.out = BytesMut::new();
        }
        matches!(written, Ok(Ok(())))
    }

    /// Whether the awaited ack is later than `limit`.
    pub(in crate::cluster) fn overdue(&self, limit: Duration) -> bool {
        self.acks.overdue(limit)
    }

    /// The peer's next answer: `Ok` for an ack, the refusal or the
    /// connection's end otherwise. May be cancelled.
    pub(in crate::cluster) async fn answer(&mut self) -> Result<(), Status> {
        match self.reader.next().await {
            Ok(Some((ACK, payload))) => {
                let ack = RaftAck::decode(payload)
                    .map_err(|e| Status::internal(format!("a malformed ack: {e}")))?;
                self.acks.answered(ack.ack);
                Ok(())
            }
            Ok(Some((REFUSED, payload))) => Err(refusal(payload)),
            Ok(Some((kind, _))) => Err(Status::internal(format!(
                "a frame of unknown kind {kind} from the peer"
            ))),
            // A live member never ends a lane: its process is gone.
            Ok(None) => Err(peer_gone("the peer ended the framed lane")),
            Err(e) => Err(Status::unavailable(e.to_string())),
        }
    }
}

/// The metadata key that marks a failure as the peer's process being gone.
const PEER_GONE: &str = "ephd-peer-gone";

/// An Unavailable `message` that says the peer's process is gone (its port
/// refused the connection, or it ended a lane), not merely slow or cut off.
pub(in crate::cluster) fn peer_gone(message: impl Into<String>) -> Status {
    let mut status = Status::unavailable(message);
    status
        .metadata_mut()
        .insert(PEER_GONE, tonic::metadata::MetadataValue::from_static("1"));
    status
}

/// Whether a failed send says the peer's process is gone: marked so by
/// [`peer_gone`], or (a gRPC stream's failure) caused by a refused
/// connection.
pub(in crate::cluster) fn says_peer_gone(status: &Status) -> bool {
    if status.metadata().contains_key(PEER_GONE) {
        return true;
    }
    let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    while let Some(e) = cause {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if io.kind() == std::io::ErrorKind::ConnectionRefused {
                return true;
            }
        }
        cause = e.source();
    }
    false
}

#[cfg(test)]
#[path = "frames_tests.rs"]
mod tests;

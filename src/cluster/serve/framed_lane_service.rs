//! The listening side of framed lanes (`frames.rs`): which of the peer
//! listener's connections are framed lanes, and the task that serves one.
//!
//! Every connection the peer listener accepts passes `split`: under TLS
//! one whose handshake selected the framed lanes' ALPN protocol, in
//! plaintext one whose first bytes are the magic of `HELLO`, is served
//! here; every other connection (gRPC: snapshots, forwarded lease calls,
//! membership calls, and the lanes of older members) goes on to the gRPC
//! server unchanged. Each connection is looked at in a task of its own, so
//! one that sends nothing holds up no other.

use crate::cluster::serve::peer_service::PeerService;
use crate::cluster::transport::frames::{self, FrameReader, PeerIo, ACK, BATCH, HELLO, MAGIC};
use crate::proto::ephd::internal::{RaftAck, RaftBatch};
use bytes::BytesMut;
use futures::{Stream, StreamExt};
use prost::Message as _;
use std::future::Future;
use std::io;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tonic::Status;

/// How long a plaintext connection may take to send its first bytes before
/// it is handed to the gRPC server (which then judges it).
const FIRST_BYTES: Duration = Duration::from_secs(10);

/// A connection the peer listener accepted, which can tell whether it is a
/// framed lane.
pub trait Sniff: PeerIo {
    /// Whether the connection is a framed lane; reads nothing off it.
    fn framed(&self) -> impl Future<Output = bool> + Send;
}

impl Sniff for TcpStream {
    async fn framed(&self) -> bool {
        let mut first = [0u8; MAGIC.len()];
        let deadline = tokio::time::Instant::now() + FIRST_BYTES;
        loop {
            match tokio::time::timeout_at(deadline, self.peek(&mut first)).await {
                Ok(Ok(n)) if n == MAGIC.len() => return first == *MAGIC,
                // Ended, or already not the magic.
                Ok(Ok(n)) if n == 0 || first[..n] != MAGIC[..n] => return false,
                // The magic's start: the rest is on its way.
                Ok(Ok(_)) => tokio::time::sleep(Duration::from_millis(1)).await,
                Ok(Err(_)) | Err(_) => return false,
            }
        }
    }
}

impl Sniff for tokio_rustls::server::TlsStream<TcpStream> {
    async fn framed(&self) -> bool {
        self.get_ref().1.alpn_protocol() == Some(frames::ALPN)
    }
}

/// `incoming` without its framed lanes, which are served here with
/// `service` until `stop`; dropping the stream ends them too.
fn split<IO, S>(
    incoming: S,
    service: PeerService,
    stop: watch::Receiver<bool>,
) -> impl Stream<Item = io::Result<IO>> + Send
where
    IO: Sniff,
    S: Stream<Item = io::Result<IO>> + Send + 'static,
{
    let incoming = Box::pin(incoming);
    futures::stream::unfold(
        (incoming, JoinSet::<Option<IO>>::new(), service, stop),
        |(mut incoming, mut looking, service, stop)| async move {
            loop {
                tokio::select! {
                    accepted = incoming.next() => match accepted {
                        Some(Ok(io)) => {
                            let (service, stop) = (service.clone(), stop.clone());
                            looking.spawn(async move {
                                if io.framed().await {
                                    serve(io, service, stop).await;
                                    None
                                } else {
                                    Some(io)
                                }
                            });
                        }
                        Some(Err(e)) => return Some((Err(e), (incoming, looking, service, stop))),
                        None => return None,
                    },
                    Some(done) = looking.join_next() => {
                        if let Ok(Some(io)) = done {
                            return Some((Ok(io), (incoming, looking, service, stop)));
                        }
                    }
                }
            }
        },
    )
}

/// The peer listener's connections `incoming`, without the framed Raft
/// lanes (served apart with `service` until `stop`) unless the node's
/// settings turn them off ([`crate::cluster::PeerSettings::framed_lanes`]).
pub fn framed_apart<IO, S>(
    incoming: S,
    (service, stop): (PeerService, watch::Receiver<bool>),
) -> futures::stream::BoxStream<'static, io::Result<IO>>
where
    IO: Sniff,
    S: Stream<Item = io::Result<IO>> + Send + 'static,
{
    if service.framed_lanes() {
        split(incoming, service, stop).boxed()
    } else {
        incoming.boxed()
    }
}

/// Serves one framed lane: answers the hello, hands each batch to the Raft
/// loop, acks the batches that ask, and ends with a refusal (a removed
/// sender, a batch that does not parse), when the sender hangs up, or at
/// `stop`.
pub(in crate::cluster) async fn serve<IO: PeerIo>(
    io: IO,
    service: PeerService,
    mut stop: watch::Receiver<bool>,
) {
    let (r, mut w) = tokio::io::split(io);
    let mut reader = FrameReader::new(r, crate::cluster::transport::sender::MAX_BATCH_BYTES);
    match tokio::time::timeout(FIRST_BYTES, reader.exact(HELLO.len())).await {
        Ok(Ok(Some(hello))) if hello[..] == HELLO[..] => {}
        // Another version, or nothing: the dialler falls back to gRPC.
        _ => return,
    }
    if w.write_all(HELLO).await.is_err() {
        return;
    }
    let mut out = BytesMut::new();
    loop {
        let frame = tokio::select! {
            frame = reader.next() => frame,
            // The server shuts down (or is gone).
            _ = stop.wait_for(|s| *s) => return,
        };
        let refused = match frame {
            Ok(Some((BATCH, payload))) => match RaftBatch::decode(payload) {
                Ok(batch) => {
                    let ack = batch.ack;
                    match service.take(batch) {
                        Ok(()) if ack != 0 => {
                            frames::put_message(&mut out, ACK, &RaftAck { ack });
                            None
                        }
                        Ok(()) => None,
                        Err(status) => Some(status),
                    }
                }
                Err(e) => Some(Status::invalid_argument(format!("not a raft batch: {e}"))),
            },
            Ok(Some((kind, _))) => Some(Status::invalid_argument(format!(
                "a frame of unknown kind {kind} on a framed lane"
            ))),
            // The sender hung up, or the connection broke (which etcd
            // does not count as a receive failure).
            Ok(None) | Err(_) => return,
        };
        if let Some(status) = &refused {
            frames::put_refusal(&mut out, status);
        }
        if !out.is_empty() {
            if w.write_all(&out).await.is_err() {
                return;
            }
            out.clear();
        }
        if refused.is_some() {
            let _ = w.shutdown().await;
            return;
        }
    }
}

//! The receiving side of a snapshot sent in chunks
//! (`ephd.internal.RaftTransport/SendSnapshot`; the sending side and the
//! frames are `snapshot_send.rs`): reassembles the data into one buffer and
//! puts it back into the raft message, which `peer_service.rs` then hands to
//! the Raft thread as it does every other message.
//!
//! Nothing here trusts a number it was sent. The declared length is
//! checked against this member's limit ([`crate::cluster::PeerSettings`]: what its
//! memory can hold) before anything is allocated, and the allocation
//! itself may fail without ending the process; the buffer never grows past
//! the declared length; a stream that is short, long, out of order,
//! damaged (CRC-32) or stalled is refused with a status saying so, and no
//! message reaches Raft. One snapshot is received at a time ([`Gate`]):
//! two would need twice the memory the limit allows.

use crate::cluster::transport::snapshot_send::timeout;
use crate::proto::ephd::internal::snapshot_frame::Part;
use crate::proto::ephd::internal::{SnapshotFrame, SnapshotHeader};
use bytes::Bytes;
use futures::{Stream, StreamExt};
use protobuf::Message as _;
use raft::prelude::{Message, MessageType};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tonic::Status;

/// The limit unless the server sets one ([`crate::cluster::PeerSettings`]): what
/// a member accepted before snapshots were chunked.
pub const DEFAULT_RECEIVE_LIMIT: u64 = 1 << 30;
/// How long a stream may go without a frame: a sender sends its frames
/// back to back, so a longer pause means it stopped (paused, cut off),
/// and its buffer and the [`Gate`] must not wait for it.
const IDLE: Duration = Duration::from_secs(10);

/// What a snapshot stream is checked against.
#[derive(Debug, Clone, Copy)]
pub(in crate::cluster) struct Bounds {
    /// Most data bytes accepted.
    pub(in crate::cluster) limit: u64,
    /// Longest wait for the next frame.
    pub(in crate::cluster) idle: Duration,
}

impl Bounds {
    /// The bounds of a member that accepts up to `limit` bytes.
    pub(in crate::cluster) fn up_to(limit: u64) -> Bounds {
        Bounds { limit, idle: IDLE }
    }
}

/// One snapshot received at a time (per peer service).
#[derive(Debug, Default)]
pub(in crate::cluster) struct Gate(AtomicBool);

/// Held while a snapshot is received; frees the [`Gate`] when dropped.
struct Claim<'a>(&'a Gate);

impl Gate {
    fn claim(&self) -> Result<Claim<'_>, Status> {
        self.0
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .map(|_| Claim(self))
            .map_err(|_| Status::unavailable("snapshot stream: another snapshot is being received"))
    }
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        self.0 .0.store(false, Ordering::Release);
    }
}

/// A stream's checked header.
#[derive(Debug)]
pub(in crate::cluster) struct Header {
    /// The sending member (`SnapshotHeader.from`).
    pub(in crate::cluster) from: u64,
    /// The MsgSnapshot, without its data yet.
    pub(in crate::cluster) message: Message,
    /// The data's declared length, within the limit.
    pub(in crate::cluster) data_bytes: u64,
}

/// A snapshot received whole.
#[derive(Debug)]
pub(in crate::cluster) struct Received {
    /// The MsgSnapshot with its data, for Raft.
    pub(in crate::cluster) message: Message,
    /// The sending member.
    pub(in crate::cluster) from: u64,
    /// How many data frames it came in.
    pub(in crate::cluster) chunks: u64,
}

fn refuse(why: impl std::fmt::Display) -> Status {
    Status::invalid_argument(format!("snapshot stream: {why}"))
}

/// Checks the first frame: a header, within `limit`, whose message is a
/// MsgSnapshot without data.
fn header(frame: SnapshotFrame, limit: u64) -> Result<Header, Status> {
    let SnapshotHeader {
        from,
        message,
        data_bytes,
    } = match frame.part {
        Some(Part::Header(h)) => h,
        _ => return Err(refuse("the first frame is not a header")),
    };
    if data_bytes > limit {
        return Err(Status::resource_exhausted(format!(
            "snapshot stream: a snapshot of {data_bytes} bytes is over this member's limit of \
             {limit} bytes (half its memory)"
        )));
    }
    let message = Message::parse_from_carllerche_bytes(&message)
        .map_err(|e| refuse(format!("the header's message is not a raft message: {e}")))?;
    if message.get_msg_type() != MessageType::MsgSnapshot || !message.has_snapshot() {
        return Err(refuse(format!(
            "the header's message is a {:?}, not a snapshot",
            message.get_msg_type()
        )));
    }
    if !message.get_snapshot().get_data().is_empty() {
        return Err(refuse("the header's message carries data of its own"));
    }
    Ok(Header {
        from,
        message,
        data_bytes,
    })
}

/// The data being reassembled: never more than declared.
struct Assembly {
    buf: Vec<u8>,
    declared: usize,
    crc: crc32fast::Hasher,
    chunks: u64,
}

impl Assembly {
    /// A buffer for `declared` bytes (already checked against the limit);
    /// an allocation that fails is refused, never an abort.
    fn new(declared: u64) -> Result<Assembly, Status> {
        let too_much = || {
            Status::resource_exhausted(format!(
                "snapshot stream: cannot allocate {declared} bytes for a snapshot"
            ))
        };
        let declared = usize::try_from(declared).map_err(|_| too_much())?;
        let mut buf = Vec::new();
        buf.try_reserve_exact(declared).map_err(|_| too_much())?;
        Ok(Assembly {
            buf,
            declared,
            crc: crc32fast::Hasher::new(),
            chunks: 0,
        })
    }

    fn data(&mut self, chunk: &[u8]) -> Result<(), Status> {
        if chunk.len() > self.declared - self.buf.len() {
            return Err(refuse(format!(
                "more data than the {} bytes declared",
                self.declared
            )));
        }
        self.buf.extend_from_slice(chunk);
        self.crc.update(chunk);
        self.chunks += 1;
        Ok(())
    }

    fn end(self, crc: u32) -> Result<(Bytes, u64), Status> {
        if self.buf.len() != self.declared {
            return Err(refuse(format!(
                "cut short: {} of the {} bytes declared",
                self.buf.len(),
                self.declared
            )));
        }
        if self.crc.finalize() != crc {
            return Err(Status::data_loss(
                "snapshot stream: the data fails its checksum",
            ));
        }
        Ok((Bytes::from(self.buf), self.chunks))
    }
}

/// The next frame, or an error after `idle` without one.
async fn next<S>(frames: &mut S, idle: Duration) -> Result<Option<SnapshotFrame>, Status>
where
    S: Stream<Item = Result<SnapshotFrame, Status>> + Unpin,
{
    match tokio::time::timeout(idle, frames.next()).await {
        Err(_) => Err(Status::deadline_exceeded(format!(
            "snapshot stream: stalled, no frame for {idle:?}"
        ))),
        Ok(None) => Ok(None),
        Ok(Some(frame)) => frame.map(Some),
    }
}

/// Reads one snapshot off `frames`: its header, checked, then given to
/// `admit` (who sends, to whom), then, holding `gate`, its data whole
/// within the size's time. Refuses anything else with a status saying why.
pub(in crate::cluster) async fn receive<S>(
    frames: &mut S,
    gate: &Gate,
    bounds: Bounds,
    admit: impl FnOnce(&Header) -> Result<(), Status>,
) -> Result<Received, Status>
where
    S: Stream<Item = Result<SnapshotFrame, Status>> + Unpin,
{
    let first = next(frames, bounds.idle)
        .await?
        .ok_or_else(|| refuse("ended before its header"))?;
    let head = header(first, bounds.limit)?;
    admit(&head)?;
    let _claim = gate.claim()?;
    let mut assembly = Assembly::new(head.data_bytes)?;
    let whole = timeout(head.data_bytes) + bounds.idle;
    let body = async {
        loop {
            let Some(frame) = next(frames, bounds.idle).await? else {
                return Err(refuse(format!(
                    "ended before its end frame, after {} of the {} bytes declared",
                    assembly.buf.len(),
                    assembly.declared
                )));
            };
            match frame.part {
                Some(Part::Data(chunk)) => assembly.data(&chunk)?,
                Some(Part::End(end)) => {
                    if next(frames, bounds.idle).await?.is_some() {
                        return Err(refuse("frames after the end"));
                    }
                    return assembly.end(end.crc32);
                }
                Some(Part::Header(_)) => return Err(refuse("a second header")),
                None => return Err(refuse("an empty frame")),
            }
        }
    };
    let (data, chunks) = tokio::time::timeout(whole, body).await.map_err(|_| {
        Status::deadline_exceeded(format!("snapshot stream: not whole within {whole:?}"))
    })??;
    let Header {
        from, mut message, ..
    } = head;
    message.mut_snapshot().set_data(data);
    Ok(Received {
        message,
        from,
        chunks,
    })
}

#[cfg(test)]
#[path = "snapshot_recv_tests.rs"]
mod tests;

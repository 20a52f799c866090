//! Sending a Raft snapshot to a peer, its data in chunks on a stream of its
//! own (`ephd.internal.RaftTransport/SendSnapshot`; the receiving side is
//! `snapshot_recv.rs`).
//!
//! A snapshot holds the whole store with its history since the last
//! compaction, so it grows with the space quota (up to 8 GiB). Sent as one
//! raft message it could not exceed what one protobuf message may be (rust-
//! protobuf sizes a message in a `u32`, and protobuf messages over 2 GiB
//! are not valid), and a member that must catch up by snapshot from a
//! larger store never could: the cluster stayed one member short. So the
//! data travels outside any protobuf message: a header frame carries the
//! raft message without its snapshot's data, with the data's length; then
//! the data follows as frames of [`chunk_bytes`] each (slices of the
//! snapshot's `Bytes`, never a copy of the whole), then an end frame with
//! the data's CRC-32. The call's answer comes once the receiver has the
//! whole snapshot and handed it to Raft, so it is the delivery report Raft
//! needs (`catchup::report`).
//!
//! A peer that answers `Unimplemented` runs an older ephd: it gets the
//! snapshot as one message in one `Send` call, as before, when it fits
//! what such a member accepts ([`SINGLE_MESSAGE_MAX_BYTES`]); a larger one
//! cannot reach it (the send fails and Raft retries, so a rolling upgrade
//! completes it).

use crate::proto::ephd::internal::raft_transport_client::RaftTransportClient;
use crate::proto::ephd::internal::snapshot_frame::Part;
use crate::proto::ephd::internal::{RaftBatch, SnapshotEnd, SnapshotFrame, SnapshotHeader};
use bytes::Bytes;
use protobuf::Message as _;
use raft::prelude::Message;
use std::time::Duration;
use tonic::transport::Channel;
use tonic::{Code, Status};

/// Bytes of snapshot data per frame unless
/// `--experimental-snapshot-chunk-bytes` says otherwise: large enough that
/// per-frame costs vanish, small enough that a frame is copied and checked
/// in about a millisecond and never holds much memory.
pub const DEFAULT_CHUNK_BYTES: usize = 4 << 20;
/// The smallest chunk size accepted (tests send many small chunks).
pub const MIN_CHUNK_BYTES: usize = 1 << 10;
/// The largest chunk size accepted: far below the peer listener's limit on
/// one decoded frame.
pub const MAX_CHUNK_BYTES: usize = 64 << 20;
/// Largest snapshot data an ephd without `SendSnapshot` accepts in one
/// message (its `MAX_SNAPSHOT_BYTES`), less room for the message around it.
pub const SINGLE_MESSAGE_MAX_BYTES: usize = (1 << 30) - (1 << 20);
/// The time any snapshot transfer is given, on top of its size's.
const BASE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a refusal that sending again at once would only repeat (too
/// large for the peer, not taken there) is held before it is reported:
/// raft sends a failed snapshot again at the follower's next heartbeat
/// answer, and each try would log a warning on both members.
const REFUSED_PAUSE: Duration = Duration::from_secs(5);
/// The slowest transfer a snapshot is given time for, in bytes per second
/// (the bulk lane's rate, `sender.rs`): 8 GiB get about 14 minutes.
const BYTES_PER_SEC: u64 = 10 << 20;

/// `bytes` within [`MIN_CHUNK_BYTES`]..=[`MAX_CHUNK_BYTES`].
fn clamp_chunk(bytes: usize) -> usize {
    bytes.clamp(MIN_CHUNK_BYTES, MAX_CHUNK_BYTES)
}

/// How long a snapshot of `bytes` may take to be delivered (the sender
/// gives up then, and the receiver too): 5 s plus one second per 10 MiB.
/// Never overflows, whatever `bytes` says.
pub(in crate::cluster) fn timeout(bytes: u64) -> Duration {
    BASE_TIMEOUT
        + Duration::from_secs(bytes / BYTES_PER_SEC)
        + Duration::from_nanos((bytes % BYTES_PER_SEC) * 1_000_000_000 / BYTES_PER_SEC)
}

/// The frames of one snapshot: the header, the data in chunks, the end
/// with the data's CRC-32 (computed as the chunks go by).
pub(in crate::cluster) struct Frames {
    header: Option<SnapshotHeader>,
    data: Bytes,
    at: usize,
    chunk: usize,
    crc: crc32fast::Hasher,
    ended: bool,
}

impl Frames {
    /// The frames for `m` (a MsgSnapshot whose data was taken out into
    /// `data`) from member `me`, `chunk` bytes of data each (at least 1).
    pub(in crate::cluster) fn new(
        me: u64,
        m: &Message,
        data: Bytes,
        chunk: usize,
    ) -> Result<Frames, Status> {
        let message = m
            .write_to_bytes()
            .map_err(|e| Status::internal(format!("cannot encode a raft message: {e}")))?;
        Ok(Frames {
            header: Some(SnapshotHeader {
                from: me,
                message: Bytes::from(message),
                data_bytes: data.len() as u64,
            }),
            data,
            at: 0,
            chunk: chunk.max(1),
            crc: crc32fast::Hasher::new(),
            ended: false,
        })
    }

    /// How many data frames a snapshot of `len` bytes takes.
    pub(in crate::cluster) fn chunks(len: u64, chunk: usize) -> u64 {
        len.div_ceil(chunk.max(1) as u64)
    }
}

impl Iterator for Frames {
    type Item = SnapshotFrame;

    fn next(&mut self) -> Option<SnapshotFrame> {
        let part = if let Some(h) = self.header.take() {
            Part::Header(h)
        } else if self.at < self.data.len() {
            let end = self.at + self.chunk.min(self.data.len() - self.at);
            // A slice of the snapshot's buffer: no copy.
            let chunk = self.data.slice(self.at..end);
            self.crc.update(&chunk);
            self.at = end;
            Part::Data(chunk)
        } else if !self.ended {
            self.ended = true;
            Part::End(SnapshotEnd {
                crc32: self.crc.clone().finalize(),
            })
        } else {
            return None;
        };
        Some(SnapshotFrame { part: Some(part) })
    }
}

/// Sends the snapshot message `m` from member `me` on `client`, its data
/// in chunks; falls back to one `Send` call for a peer that answers
/// `Unimplemented` (an older ephd). `Ok` once the peer has it whole and
/// handed it to Raft. The caller reports the outcome to Raft.
pub(in crate::cluster) async fn send_snapshot(
    client: &mut RaftTransportClient<Channel>,
    me: u64,
    mut m: Message,
    chunk: usize,
) -> Result<(), Status> {
    let data = m.mut_snapshot().take_data();
    let bytes = data.len() as u64;
    let chunk = clamp_chunk(chunk);
    let limit = timeout(bytes);
    let frames = Frames::new(me, &m, data.clone(), chunk)?;
    let to = m.get_to();
    let sent = within(limit, client.send_snapshot(futures::stream::iter(frames))).await;
    let sent = match sent {
        Err(s) if s.code() == Code::Unimplemented => {
            tracing::info!(to = %format_args!("{to:x}"), bytes, "peer takes no chunked snapshots (an older ephd): sending it as one message");
            m.mut_snapshot().set_data(data);
            single_message(client, me, m, limit).await
        }
        other => other.map(drop),
    };
    match &sent {
        Ok(()) => tracing::debug!(
            to = %format_args!("{to:x}"),
            bytes,
            chunks = Frames::chunks(bytes, chunk),
            "raft snapshot sent"
        ),
        Err(e) => {
            tracing::warn!(
                to = %format_args!("{to:x}"),
                bytes,
                error = %e,
                "raft snapshot not delivered"
            );
            if lasting(e) {
                tokio::time::sleep(REFUSED_PAUSE).await;
            }
        }
    }
    sent
}

/// Whether sending again at once would meet the same refusal: the
/// snapshot is too large for the peer, or the peer does not take it (but
/// not a removal, which the caller acts on at once).
fn lasting(e: &Status) -> bool {
    match e.code() {
        Code::ResourceExhausted => true,
        Code::FailedPrecondition => !crate::cluster::replicated::removal::says_removed(e),
        _ => false,
    }
}

/// The way to an older ephd: the whole message in one `Send` call, when
/// it fits what that member accepts.
async fn single_message(
    client: &mut RaftTransportClient<Channel>,
    me: u64,
    m: Message,
    limit: Duration,
) -> Result<(), Status> {
    fits_one_message(m.get_snapshot().get_data().len())?;
    // Up to 1 GiB: encoded off the async workers.
    let encoded = tokio::task::spawn_blocking(move || m.write_to_bytes())
        .await
        .map_err(|e| Status::internal(format!("snapshot encoder failed: {e}")))?
        .map_err(|e| Status::internal(format!("cannot encode a raft message: {e}")))?;
    let batch = RaftBatch {
        messages: vec![Bytes::from(encoded)],
        from: me,
        ack: 0,
    };
    within(limit, client.send(batch)).await.map(drop)
}

/// Whether snapshot data of `len` bytes can go to an older ephd in one
/// message.
fn fits_one_message(len: usize) -> Result<(), Status> {
    if len > SINGLE_MESSAGE_MAX_BYTES {
        return Err(Status::failed_precondition(format!(
            "the peer runs an older ephd, which takes a snapshot of at most \
             {SINGLE_MESSAGE_MAX_BYTES} bytes; this one has {len}: upgrade it"
        )));
    }
    Ok(())
}

/// `call`'s answer, or DeadlineExceeded after `limit`.
async fn within<T>(
    limit: Duration,
    call: impl std::future::Future<Output = Result<T, Status>>,
) -> Result<T, Status> {
    tokio::time::timeout(limit, call).await.unwrap_or_else(|_| {
        Err(Status::deadline_exceeded(format!(
            "no answer within {limit:?}"
        )))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use raft::prelude::MessageType;

    fn snapshot_message(data: &[u8]) -> Message {
        let mut m = Message::default();
        m.set_msg_type(MessageType::MsgSnapshot);
        m.to = 2;
        m.from = 1;
        m.mut_snapshot().mut_metadata().index = 7;
        m.mut_snapshot().set_data(Bytes::copy_from_slice(data));
        m
    }

    #[test]
    fn frames_are_a_header_the_data_in_slices_and_the_crc() {
        let data = Bytes::from((0..=255u8).cycle().take(10_000).collect::<Vec<u8>>());
        let mut m = snapshot_message(&data);
        m.mut_snapshot().take_data();
        let frames: Vec<SnapshotFrame> = Frames::new(9, &m, data.clone(), 4096).unwrap().collect();
        assert_eq!(frames.len(), 1 + 3 + 1);
        match &frames[0].part {
            Some(Part::Header(h)) => {
                assert_eq!((h.from, h.data_bytes), (9, 10_000));
                let back = Message::parse_from_bytes(&h.message).unwrap();
                assert_eq!(back.get_snapshot().get_metadata().index, 7);
                assert!(back.get_snapshot().get_data().is_empty());
            }
            other => panic!("{other:?}"),
        }
        let mut joined = Vec::new();
        for f in &frames[1..4] {
            match &f.part {
                Some(Part::Data(d)) => {
                    // Slices of the snapshot's own buffer.
                    let base = data.as_ptr() as usize;
                    assert!((base..base + data.len()).contains(&(d.as_ptr() as usize)));
                    joined.extend_from_slice(d);
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(joined, data);
        match &frames[4].part {
            Some(Part::End(e)) => assert_eq!(e.crc32, crc32fast::hash(&data)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn empty_data_is_a_header_and_an_end() {
        let m = snapshot_message(b"");
        let frames: Vec<SnapshotFrame> = Frames::new(1, &m, Bytes::new(), 8).unwrap().collect();
        assert_eq!(frames.len(), 2);
        assert!(matches!(
            frames[1].part,
            Some(Part::End(SnapshotEnd { crc32: 0 }))
        ));
    }

    #[test]
    fn lengths_beyond_four_gib_count_chunks_and_time_without_overflow() {
        const GIB: u64 = 1 << 30;
        let chunk = DEFAULT_CHUNK_BYTES;
        assert_eq!(Frames::chunks(0, chunk), 0);
        assert_eq!(Frames::chunks(1, chunk), 1);
        assert_eq!(Frames::chunks(chunk as u64, chunk), 1);
        assert_eq!(Frames::chunks(chunk as u64 + 1, chunk), 2);
        // Past every 32-bit boundary: 2 GiB, 4 GiB, 8 GiB and more.
        assert_eq!(Frames::chunks(2 * GIB, chunk), 512);
        assert_eq!(Frames::chunks(4 * GIB + 1, chunk), 1025);
        assert_eq!(Frames::chunks(8 * GIB, chunk), 2048);
        assert_eq!(
            Frames::chunks(u64::MAX, MIN_CHUNK_BYTES),
            u64::MAX / 1024 + 1
        );
        assert_eq!(timeout(0), BASE_TIMEOUT);
        assert_eq!(timeout(10 << 20), BASE_TIMEOUT + Duration::from_secs(1));
        // 8 GiB: 819.2 s on top of the base.
        assert_eq!(
            timeout(8 * GIB),
            BASE_TIMEOUT + Duration::from_millis(819_200)
        );
        assert!(timeout(u64::MAX) > Duration::from_secs(1 << 40));
    }

    #[test]
    fn an_older_peer_gets_at_most_its_single_message_limit() {
        assert!(fits_one_message(0).is_ok());
        assert!(fits_one_message(SINGLE_MESSAGE_MAX_BYTES).is_ok());
        let e = fits_one_message(SINGLE_MESSAGE_MAX_BYTES + 1).unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition);
        assert!(e.message().contains("older ephd"), "{e:?}");
        assert!(fits_one_message(usize::MAX).is_err());
    }

    #[test]
    fn refusals_that_would_repeat_are_held_but_not_a_removal() {
        assert!(lasting(&Status::resource_exhausted("too large")));
        assert!(lasting(&fits_one_message(usize::MAX).unwrap_err()));
        let removed = Status::failed_precondition(crate::cluster::replicated::removal::REMOVED);
        assert!(!lasting(&removed));
        assert!(!lasting(&Status::unavailable("busy")));
        assert!(!lasting(&Status::deadline_exceeded("slow")));
    }

    #[test]
    fn the_chunk_size_is_clamped() {
        assert_eq!(clamp_chunk(1), MIN_CHUNK_BYTES);
        assert_eq!(clamp_chunk(64 << 10), 64 << 10);
        assert_eq!(clamp_chunk(usize::MAX), MAX_CHUNK_BYTES);
    }
}

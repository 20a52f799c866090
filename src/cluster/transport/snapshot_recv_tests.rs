//! Reassembly of chunked snapshots: the frames `snapshot_send.rs` makes
//! come back whole at any chunk size and any split of the data; short,
//! long, oversized, damaged, disordered and stalled streams are refused
//! with a status, before anything is allocated where the header is wrong.

use super::*;
use crate::cluster::transport::snapshot_send::Frames;
use crate::proto::ephd::internal::SnapshotEnd;
use std::cell::Cell;
use tonic::Code;

const LIMIT: u64 = 1 << 20;

fn bounds() -> Bounds {
    Bounds {
        limit: LIMIT,
        idle: Duration::from_secs(5),
    }
}

/// A MsgSnapshot from member 1 to 2 at index 42, and its data.
fn message_and_data(len: usize) -> (Message, Bytes) {
    let mut m = Message::default();
    m.set_msg_type(MessageType::MsgSnapshot);
    m.from = 1;
    m.to = 2;
    m.term = 3;
    m.mut_snapshot().mut_metadata().index = 42;
    m.mut_snapshot().mut_metadata().term = 3;
    // Not a repeating pattern, so a misplaced chunk shows.
    let data: Vec<u8> = (0..len as u64)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    (m, Bytes::from(data))
}

fn frames_of(len: usize, chunk: usize) -> (Vec<SnapshotFrame>, Bytes) {
    let (m, data) = message_and_data(len);
    let frames = Frames::new(7, &m, data.clone(), chunk).unwrap().collect();
    (frames, data)
}

fn header_frame(message: &Message, data_bytes: u64) -> SnapshotFrame {
    SnapshotFrame {
        part: Some(Part::Header(SnapshotHeader {
            from: 7,
            message: Bytes::from(message.write_to_bytes().unwrap()),
            data_bytes,
        })),
    }
}

fn data_frame(bytes: &[u8]) -> SnapshotFrame {
    SnapshotFrame {
        part: Some(Part::Data(Bytes::copy_from_slice(bytes))),
    }
}

fn end_frame(data: &[u8]) -> SnapshotFrame {
    SnapshotFrame {
        part: Some(Part::End(SnapshotEnd {
            crc32: crc32fast::hash(data),
        })),
    }
}

async fn run(frames: Vec<SnapshotFrame>, bounds: Bounds) -> Result<Received, Status> {
    let mut stream = futures::stream::iter(frames.into_iter().map(Ok));
    receive(&mut stream, &Gate::default(), bounds, |_| Ok(())).await
}

async fn refused(frames: Vec<SnapshotFrame>) -> Status {
    run(frames, bounds()).await.expect_err("refused")
}

fn assert_whole(r: &Received, data: &Bytes) {
    assert_eq!(r.from, 7);
    assert_eq!(r.message.get_to(), 2);
    assert_eq!(r.message.get_snapshot().get_metadata().index, 42);
    assert_eq!(r.message.get_snapshot().get_data(), data);
}

#[tokio::test]
async fn every_chunk_size_reassembles_the_exact_data() {
    let len = 10_007;
    for chunk in [1, 2, 3, 64, 1000, 4096, len - 1, len, len + 1, 1 << 20] {
        let (frames, data) = frames_of(len, chunk);
        let r = run(frames, bounds()).await.expect("whole");
        assert_whole(&r, &data);
        assert_eq!(r.chunks, Frames::chunks(len as u64, chunk), "chunk {chunk}");
    }
}

#[tokio::test]
async fn chunk_boundaries_anywhere_and_empty_chunks_reassemble() {
    let (m, data) = message_and_data(50_000);
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..40 {
        let mut frames = vec![header_frame(&m, data.len() as u64)];
        let mut at = 0;
        while at < data.len() {
            seed = seed
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            // From empty frames to a few KiB, cut at any byte.
            let n = ((seed >> 33) % 5000) as usize;
            let end = (at + n).min(data.len());
            frames.push(data_frame(&data[at..end]));
            at = end;
        }
        frames.push(end_frame(&data));
        let r = run(frames, bounds()).await.expect("whole");
        assert_whole(&r, &data);
    }
}

#[tokio::test]
async fn the_exact_limit_is_accepted_and_empty_data_too() {
    let (frames, data) = frames_of(LIMIT as usize, 64 << 10);
    assert_whole(&run(frames, bounds()).await.unwrap(), &data);
    let (frames, data) = frames_of(0, 1024);
    let r = run(frames, bounds()).await.unwrap();
    assert_whole(&r, &data);
    assert_eq!(r.chunks, 0);
}

#[tokio::test]
async fn a_short_stream_is_refused() {
    // The end frame comes with a chunk missing.
    let (mut frames, _) = frames_of(10_000, 1000);
    frames.remove(5);
    let e = refused(frames).await;
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(
        e.message().contains("cut short: 9000 of the 10000"),
        "{e:?}"
    );
    // The stream ends without an end frame.
    let (mut frames, _) = frames_of(10_000, 1000);
    frames.pop();
    let e = refused(frames).await;
    assert!(
        e.message()
            .contains("ended before its end frame, after 10000 of the 10000"),
        "{e:?}"
    );
    let (frames, _) = frames_of(10_000, 1000);
    let e = refused(frames[..4].to_vec()).await;
    assert!(e.message().contains("after 3000 of the 10000"), "{e:?}");
}

#[tokio::test]
async fn a_long_stream_is_refused_at_the_first_byte_too_many() {
    let (mut frames, data) = frames_of(10_000, 1000);
    let end = frames.pop().unwrap();
    frames.push(data_frame(b"x"));
    frames.push(end);
    let e = refused(frames).await;
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(
        e.message()
            .contains("more data than the 10000 bytes declared"),
        "{e:?}"
    );
    // One oversized chunk is refused whole, never copied past the end.
    let (m, _) = message_and_data(0);
    let frames = vec![
        header_frame(&m, 10),
        data_frame(&data[..11]),
        end_frame(&data[..11]),
    ];
    assert!(refused(frames)
        .await
        .message()
        .contains("more data than the 10 bytes"));
}

#[tokio::test]
async fn a_declared_length_over_the_limit_is_refused_before_anything_else() {
    let (m, _) = message_and_data(0);
    for declared in [LIMIT + 1, 1 << 40, u64::MAX] {
        let admitted = Cell::new(false);
        let mut stream = futures::stream::iter(vec![Ok(header_frame(&m, declared))]);
        let gate = Gate::default();
        let e = receive(&mut stream, &gate, bounds(), |_| {
            admitted.set(true);
            Ok(())
        })
        .await
        .unwrap_err();
        assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
        assert!(e.message().contains(&format!("{declared} bytes")), "{e:?}");
        assert!(!admitted.get());
    }
    // Within the limit but more than this machine could ever allocate: a
    // refusal, not an abort.
    let e = Assembly::new(u64::MAX).err().unwrap();
    assert_eq!(e.code(), Code::ResourceExhausted);
    let e = Assembly::new(isize::MAX as u64 + 1).err().unwrap();
    assert!(e.message().contains("cannot allocate"), "{e:?}");
}

#[tokio::test]
async fn bad_headers_are_refused() {
    let (m, data) = message_and_data(100);
    // No frame at all; data first; an empty frame first.
    assert!(refused(vec![])
        .await
        .message()
        .contains("before its header"));
    let e = refused(vec![data_frame(&data), end_frame(&data)]).await;
    assert!(e.message().contains("first frame is not a header"), "{e:?}");
    let e = refused(vec![SnapshotFrame { part: None }]).await;
    assert!(e.message().contains("first frame is not a header"), "{e:?}");
    // A message that does not parse.
    let garbage = SnapshotFrame {
        part: Some(Part::Header(SnapshotHeader {
            from: 7,
            message: Bytes::from_static(&[0xff, 0xff, 0xff]),
            data_bytes: 0,
        })),
    };
    let e = refused(vec![garbage]).await;
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("not a raft message"), "{e:?}");
    // Not a snapshot.
    let mut append = m.clone();
    append.set_msg_type(MessageType::MsgAppend);
    let e = refused(vec![header_frame(&append, 0), end_frame(b"")]).await;
    assert!(e.message().contains("MsgAppend, not a snapshot"), "{e:?}");
    // A snapshot message that carries data itself.
    let mut full = m.clone();
    full.mut_snapshot().set_data(data.clone());
    let e = refused(vec![header_frame(&full, 0), end_frame(b"")]).await;
    assert!(e.message().contains("carries data of its own"), "{e:?}");
}

#[tokio::test]
async fn disorder_and_damage_are_refused() {
    let (m, data) = message_and_data(100);
    let head = || header_frame(&m, 100);
    // A second header.
    let e = refused(vec![head(), data_frame(&data[..50]), head()]).await;
    assert!(e.message().contains("a second header"), "{e:?}");
    // An empty frame in the data.
    let e = refused(vec![head(), SnapshotFrame { part: None }]).await;
    assert!(e.message().contains("an empty frame"), "{e:?}");
    // Frames after the end.
    let e = refused(vec![
        head(),
        data_frame(&data),
        end_frame(&data),
        data_frame(b""),
    ])
    .await;
    assert!(e.message().contains("frames after the end"), "{e:?}");
    // A flipped byte.
    let mut bad = data.to_vec();
    bad[77] ^= 1;
    let e = refused(vec![head(), data_frame(&bad), end_frame(&data)]).await;
    assert_eq!(e.code(), Code::DataLoss);
    // The stream's own error is passed on.
    let mut stream =
        futures::stream::iter(vec![Ok(head()), Err(Status::cancelled("peer went away"))]);
    let e = receive(&mut stream, &Gate::default(), bounds(), |_| Ok(()))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Cancelled);
}

#[tokio::test]
async fn a_refused_sender_gets_its_refusal_and_nothing_is_read() {
    let (frames, _) = frames_of(1000, 100);
    let mut stream = futures::stream::iter(frames.into_iter().map(Ok));
    let e = receive(&mut stream, &Gate::default(), bounds(), |h| {
        assert_eq!((h.from, h.data_bytes), (7, 1000));
        Err(Status::failed_precondition("removed"))
    })
    .await
    .unwrap_err();
    assert_eq!(e.message(), "removed");
    // Only the header was taken off the stream.
    assert_eq!(stream.count().await, 11);
}

#[tokio::test]
async fn one_snapshot_at_a_time() {
    let gate = Gate::default();
    let held = gate.claim().unwrap();
    let (frames, data) = frames_of(1000, 100);
    let mut stream = futures::stream::iter(frames.clone().into_iter().map(Ok));
    let e = receive(&mut stream, &gate, bounds(), |_| Ok(()))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unavailable);
    drop(held);
    let mut stream = futures::stream::iter(frames.into_iter().map(Ok));
    let r = receive(&mut stream, &gate, bounds(), |_| Ok(()))
        .await
        .unwrap();
    assert_whole(&r, &data);
    // Freed again after a refused stream too.
    let (m, _) = message_and_data(0);
    let mut stream = futures::stream::iter(vec![Ok(header_frame(&m, 5))]);
    assert!(receive(&mut stream, &gate, bounds(), |_| Ok(()))
        .await
        .is_err());
    assert!(gate.claim().is_ok());
}

#[tokio::test]
async fn a_stalled_stream_is_given_up() {
    let (frames, _) = frames_of(1000, 100);
    let mut stream =
        futures::stream::iter(frames.into_iter().take(3).map(Ok)).chain(futures::stream::pending());
    let quick = Bounds {
        limit: LIMIT,
        idle: Duration::from_millis(50),
    };
    let gate = Gate::default();
    let e = receive(&mut stream, &gate, quick, |_| Ok(()))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::DeadlineExceeded);
    assert!(e.message().contains("stalled"), "{e:?}");
    assert!(gate.claim().is_ok());
}

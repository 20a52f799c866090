//! Unit tests of the framed lanes (`frames.rs`): the wire format, and what a
//! lane reads after a listener refused it.

use super::*;
use crate::cluster::replicated::removal;

#[tokio::test]
async fn frames_come_back_whole_however_the_bytes_are_cut() {
    let mut out = BytesMut::new();
    put_message(
        &mut out,
        BATCH,
        &RaftBatch {
            messages: vec![Bytes::from_static(b"one"), Bytes::from(vec![7u8; 100_000])],
            from: 9,
            ack: 3,
        },
    );
    put_message(&mut out, ACK, &RaftAck { ack: 3 });
    put_refusal(&mut out, &Status::failed_precondition("removed"));
    // Fed a few bytes at a time, as a slow connection delivers them.
    let (mut tx, rx) = tokio::io::duplex(7);
    let bytes = out.freeze();
    let writer = tokio::spawn(async move { tx.write_all(&bytes).await });
    let mut reader = FrameReader::new(rx, 1 << 20);
    let (kind, payload) = reader.next().await.unwrap().unwrap();
    assert_eq!(kind, BATCH);
    let batch = RaftBatch::decode(payload).unwrap();
    assert_eq!((batch.from, batch.ack, batch.messages.len()), (9, 3, 2));
    assert_eq!(batch.messages[1].len(), 100_000);
    let (kind, payload) = reader.next().await.unwrap().unwrap();
    assert_eq!((kind, RaftAck::decode(payload).unwrap().ack), (ACK, 3));
    let (kind, payload) = reader.next().await.unwrap().unwrap();
    assert_eq!(kind, REFUSED);
    let status = refusal(payload);
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert_eq!(status.message(), "removed");
    writer.await.unwrap().unwrap();
    assert!(
        reader.next().await.unwrap().is_none(),
        "ends between frames"
    );
}

#[tokio::test]
async fn a_frame_over_the_limit_or_cut_short_is_an_error() {
    let mut out = BytesMut::new();
    put_message(
        &mut out,
        BATCH,
        &RaftBatch {
            messages: vec![Bytes::from(vec![1u8; 2000])],
            from: 1,
            ack: 0,
        },
    );
    let mut reader = FrameReader::new(&out[..], 1000);
    let e = reader.next().await.unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    let mut reader = FrameReader::new(&out[..out.len() - 1], 1 << 20);
    let e = reader.next().await.unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    // A refusal too short to hold a code is still a status, not a panic.
    assert_eq!(refusal(Bytes::from_static(b"ab")).code(), Code::Internal);
}

#[tokio::test]
async fn reading_again_after_a_cancelled_read_loses_nothing() {
    let (mut tx, rx) = tokio::io::duplex(64);
    let mut reader = FrameReader::new(rx, 1 << 20);
    let mut out = BytesMut::new();
    put_message(&mut out, ACK, &RaftAck { ack: 42 });
    // Half a frame, then a read that is given up on.
    tx.write_all(&out[..4]).await.unwrap();
    let cut = tokio::time::timeout(Duration::from_millis(50), reader.next()).await;
    assert!(cut.is_err(), "half a frame is not a frame");
    tx.write_all(&out[4..]).await.unwrap();
    let (kind, payload) = reader.next().await.unwrap().unwrap();
    assert_eq!((kind, RaftAck::decode(payload).unwrap().ack), (ACK, 42));
}

/// A listener that refuses this member (it was removed) writes `REFUSED`
/// and hangs up. The lane may find out by a write that fails before it has
/// read the refusal; the refusal is still there to read at once, which is
/// how the lane tells "removed" from a broken connection (`sender.rs`,
/// `stream_send`).
#[tokio::test]
async fn a_refusal_is_still_read_after_the_write_that_found_the_lane_closed() {
    let (ours, mut theirs) = tokio::io::duplex(1 << 16);
    // What the listener answers a removed member (`removal.rs`).
    let refused = Status::new(Code::FailedPrecondition, removal::REMOVED);
    let wire = refused.clone();
    let peer = tokio::spawn(async move {
        let mut hello = [0u8; HELLO.len()];
        tokio::io::AsyncReadExt::read_exact(&mut theirs, &mut hello)
            .await
            .unwrap();
        assert_eq!(&hello, HELLO);
        let mut out = BytesMut::from(&HELLO[..]);
        put_refusal(&mut out, &wire);
        theirs.write_all(&out).await.unwrap();
        // Hangs up: `theirs` is dropped here.
    });
    let io: Box<dyn PeerIo> = Box::new(ours);
    let mut link = match FramedLink::hello(io, None, 1 << 20).await {
        Ok(link) => link,
        Err(_) => panic!("the peer answered the hello"),
    };
    peer.await.unwrap();
    let batch = RaftBatch {
        messages: vec![Bytes::from_static(b"an append")],
        from: 1,
        ack: 0,
    };
    assert!(
        !link.send(batch, Duration::from_secs(1)).await,
        "the peer hung up: the write fails"
    );
    let answer =
        futures::FutureExt::now_or_never(link.answer()).expect("the refusal is already buffered");
    let status = answer.expect_err("a refusal, not an ack");
    assert_eq!(status.code(), refused.code());
    assert_eq!(status.message(), refused.message());
    assert!(removal::says_removed(&status), "read as a removal");
}

#[test]
fn only_a_refused_connection_or_an_ended_lane_says_the_peer_is_gone() {
    assert!(says_peer_gone(&peer_gone("the peer ended the framed lane")));
    // A gRPC stream's failure, caused by a refused connection.
    let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
    assert!(says_peer_gone(&Status::from_error(Box::new(refused))));
    // Slow, cut off or reset: maybe alive.
    assert!(!says_peer_gone(&Status::unavailable(
        "Connection refused in the text only"
    )));
    let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
    assert!(!says_peer_gone(&Status::from_error(Box::new(reset))));
    assert!(!says_peer_gone(&Status::deadline_exceeded("timed out")));
}

#[tokio::test]
async fn dialling_a_port_nobody_listens_on_is_a_refusal() {
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let url = format!("http://127.0.0.1:{closed}");
    let e =
        crate::cluster::transport::peer_dial::connect_framed(None, &url, Duration::from_secs(2))
            .await
            .err()
            .expect("nobody listens");
    assert!(e.refused, "{}", e.message);
}

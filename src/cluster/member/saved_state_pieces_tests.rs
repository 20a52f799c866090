use super::*;
use bytes::Bytes;

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 % 251) as u8).collect()
}

fn piece(offset: u64, total: u64, data: &[u8]) -> Result<SavedChunk, Status> {
    Ok(SavedChunk {
        offset,
        total,
        data: Bytes::copy_from_slice(data),
    })
}

/// Feeds `pieces` to [`receive`]; the error, if any.
async fn fed(pieces: Vec<Result<SavedChunk, Status>>, expect: u64) -> Result<Vec<u8>, String> {
    let dir = tempfile::tempdir().unwrap();
    let to = dir.path().join("got");
    receive(futures::stream::iter(pieces), &to, expect).await?;
    Ok(std::fs::read(&to).unwrap())
}

#[tokio::test]
async fn a_file_of_several_pieces_arrives_whole_and_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let from = dir.path().join("sent");
    let bytes = pattern(2 * CHUNK + 123);
    std::fs::write(&from, &bytes).unwrap();
    let handed_out = HandedOut::default();
    assert!(!handed_out.within(Duration::from_secs(60)), "nothing yet");
    let pieces: Vec<_> = serve(from.clone(), handed_out.clone())
        .unwrap()
        .collect()
        .await;
    let sizes: Vec<usize> = pieces
        .iter()
        .map(|p| p.as_ref().unwrap().data.len())
        .collect();
    assert_eq!(sizes, [CHUNK, CHUNK, 123]);
    // A waiting member sees that its file is being fetched (`resume.rs`).
    assert!(handed_out.within(Duration::from_secs(60)));
    assert_eq!(fed(pieces, bytes.len() as u64).await.unwrap(), bytes);
    // Straight from the sender's stream, the size not announced before.
    let to = dir.path().join("got");
    let n = receive(serve(from, HandedOut::default()).unwrap(), &to, 0)
        .await
        .unwrap();
    assert_eq!(n, bytes.len() as u64);
    assert_eq!(std::fs::read(&to).unwrap(), bytes);
}

#[tokio::test]
async fn an_incomplete_or_empty_stream_is_an_error() {
    let bytes = pattern(300);
    let e = fed(vec![piece(0, 300, &bytes[..100])], 0)
        .await
        .unwrap_err();
    assert!(e.contains("ended after 100 of 300 bytes"), "{e}");
    let e = fed(vec![], 0).await.unwrap_err();
    assert!(e.contains("before any data"), "{e}");
    // An empty file sends no piece: nothing to resume from.
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty");
    std::fs::write(&empty, b"").unwrap();
    let e = receive(
        serve(empty, HandedOut::default()).unwrap(),
        &dir.path().join("got"),
        0,
    )
    .await
    .unwrap_err();
    assert!(e.contains("before any data"), "{e}");
}

#[tokio::test]
async fn pieces_out_of_order_too_large_or_past_the_size_are_refused() {
    let bytes = pattern(300);
    let cases = [
        // A gap, and a piece sent again.
        (
            vec![piece(0, 300, &bytes[..100]), piece(150, 300, &bytes[150..])],
            "starts at byte 150, expected 100",
        ),
        (
            vec![piece(0, 300, &bytes[..100]), piece(0, 300, &bytes[..100])],
            "starts at byte 0, expected 100",
        ),
        // The size changes, or a piece runs past it.
        (
            vec![
                piece(0, 300, &bytes[..100]),
                piece(100, 200, &bytes[100..200]),
            ],
            "the first said 300",
        ),
        (
            vec![piece(0, 300, &bytes[..200]), piece(200, 300, &bytes[..200])],
            "goes past",
        ),
        // An empty piece.
        (vec![piece(0, 300, &[])], "a piece of 0 bytes"),
    ];
    for (pieces, why) in cases {
        let e = fed(pieces, 0).await.unwrap_err();
        assert!(e.contains(why), "{e} (expected {why})");
    }
    // A piece over CHUNK, even within a huge announced size: nothing is
    // allocated or written from that number.
    let big = vec![0u8; CHUNK + 1];
    let e = fed(vec![piece(0, u64::MAX, &big)], 0).await.unwrap_err();
    assert!(
        e.contains(&format!("a piece of {} bytes", CHUNK + 1)),
        "{e}"
    );
}

#[tokio::test]
async fn a_size_other_than_announced_or_a_sender_error_is_refused() {
    let bytes = pattern(300);
    let e = fed(vec![piece(0, 300, &bytes)], 299).await.unwrap_err();
    assert!(e.contains("the member announced 299"), "{e}");
    assert_eq!(fed(vec![piece(0, 300, &bytes)], 300).await.unwrap(), bytes);
    let failed = vec![
        piece(0, 300, &bytes[..100]),
        Err(Status::internal("disk on fire")),
    ];
    let e = fed(failed, 0).await.unwrap_err();
    assert!(e.contains("after 100 bytes: disk on fire"), "{e}");
}

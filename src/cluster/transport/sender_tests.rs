//! Unit tests of a peer lane's sending loop (`sender.rs`) against peers
//! that misbehave on the wire.

use super::*;
use crate::cluster::log::queue;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A listener that accepts connections and never answers on them (nor
/// closes them): a peer whose process is wedged, or a connection the
/// other side dropped without telling. Counts the connections made to it.
async fn black_hole() -> (String, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            held.push(socket);
        }
    });
    (url, accepted)
}

/// A control lane whose peer never answers the opening of a stream gives
/// up on it after the lane's limit and tries again on a new connection,
/// so the peer is probed again (and found again once it answers), rather
/// than the lane waiting on that connection for good.
#[tokio::test]
async fn a_stream_the_peer_never_opens_is_given_up_and_tried_on_a_new_connection() {
    let (url, accepted) = black_hole().await;
    let health = Arc::new(PeerHealth::new(1));
    let to = Target {
        me: 1,
        id: 2,
        name: "m2".into(),
        url,
        inbox: queue::unbounded().0,
        removal: Arc::default(),
        out: health.metrics().outgoing(2),
        settings: crate::cluster::PeerSettings::default(),
    };
    let (_keep, rx) = mpsc::channel(8);
    let lane = tokio::spawn(send_loop(to, Lane::Control, rx, health.clone()));
    // The first probe goes after PROBE_INTERVAL, waits SEND_TIMEOUT for
    // the stream, and the next probe dials anew.
    let deadline = Instant::now() + PROBE_INTERVAL * 3 + SEND_TIMEOUT * 2;
    while accepted.load(Ordering::SeqCst) < 2 {
        assert!(
            Instant::now() < deadline,
            "the lane never dialled again: {} connection(s)",
            accepted.load(Ordering::SeqCst)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        health.active_since(2).is_none(),
        "a silent peer is not active"
    );
    lane.abort();
}

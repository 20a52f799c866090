//! How this member talks to its peers, as the server derives it from its
//! flags and its memory: handed to the node at start, so that two members
//! in one process (`ephd::embed`, tests) each keep their own.

use crate::cluster::transport::peer_dial::PeerDialer;
use crate::cluster::transport::snapshot_recv::DEFAULT_RECEIVE_LIMIT;
use crate::cluster::transport::snapshot_send::DEFAULT_CHUNK_BYTES;

/// See the module docs.
#[derive(Debug, Clone)]
pub struct PeerSettings {
    /// Raft messages travel on framed lanes (`frames.rs`), which the peer
    /// listener serves and this member dials; false: gRPC streams only
    /// (`EPHD_PEER_TRANSPORT=grpc`).
    pub framed_lanes: bool,
    /// Bytes of snapshot data per frame this member sends
    /// (`--experimental-snapshot-chunk-bytes`).
    pub snapshot_chunk_bytes: usize,
    /// The largest snapshot this member accepts from a leader, in bytes
    /// (the server derives it from its memory, `server/memory.rs`).
    pub snapshot_receive_limit: u64,
    /// Peer TLS for outgoing connections, if on.
    pub dialer: PeerDialer,
}

impl Default for PeerSettings {
    fn default() -> Self {
        PeerSettings {
            framed_lanes: true,
            snapshot_chunk_bytes: DEFAULT_CHUNK_BYTES,
            snapshot_receive_limit: DEFAULT_RECEIVE_LIMIT,
            dialer: PeerDialer::default(),
        }
    }
}

impl PeerSettings {
    /// The protocol a TLS peer listener offers in ALPN before h2: framed
    /// lanes', when this member uses them.
    pub fn listener_protocol(&self) -> Option<&'static [u8]> {
        self.framed_lanes
            .then_some(crate::cluster::transport::frames::ALPN)
    }
}

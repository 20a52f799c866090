//! Raft messages to and from the other members: two lanes per peer
//! (control and bulk), each a framed connection (`frames.rs`) or a stream
//! of the small gRPC service on the peer listener (`peer_stream.rs`),
//! chosen per lane (`link.rs`); dialling with peer TLS (`peer_dial.rs`),
//! sending (`sender.rs`, `peers.rs`), snapshots in chunks
//! (`snapshot_send.rs`, `snapshot_recv.rs`), the settings they share
//! (`peer_settings.rs`) and etcd's peer network metrics. Imports only the
//! layers below.

pub mod frames;
pub(in crate::cluster) mod link;
pub(in crate::cluster) mod peer_dial;
pub mod peer_metrics;
pub(in crate::cluster) mod peer_settings;
pub(in crate::cluster) mod peer_stream;
pub(in crate::cluster) mod peers;
pub(in crate::cluster) mod sender;
pub(in crate::cluster) mod snapshot_recv;
pub(in crate::cluster) mod snapshot_send;

//! The peer listener's services: the gRPC Raft transport service
//! (`peer_service.rs`) and the framed lanes served beside it
//! (`framed_lane_service.rs`).

pub mod framed_lane_service;
pub(in crate::cluster) mod peer_service;

//! This member's state beside its store, below the Raft node: the applied
//! membership and the changes waiting for it (`applied_membership.rs`),
//! the cluster-wide lease state (`lease_state.rs`), what a Raft snapshot
//! carries beside the store (`snapshot_sections.rs`), the saved state of
//! `--data-dir` (`saved_state.rs`, sent to other members in pieces by
//! `saved_state_pieces.rs`) and a restart from it (`restart.rs`).

pub(in crate::cluster) mod applied_membership;
pub(in crate::cluster) mod lease_state;
pub mod restart;
pub mod saved_state;
pub(in crate::cluster) mod saved_state_pieces;
pub(in crate::cluster) mod snapshot_sections;

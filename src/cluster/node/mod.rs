//! The Raft node and the threads that run it: the node others hold
//! (`raft_node.rs`), the Raft loop's rounds (`raft_loop.rs`), committed
//! entries applied in log order (`apply_loop.rs`), and what depends on who
//! leads: leader transfers and `hasleader` (`leadership.rs`), what a
//! learner refuses (`learner.rs`), leases answered by the leader
//! (`lease_forward.rs`); writing the saved state while running
//! (`saved_state_writer.rs`), choosing the newest saved state among waiting
//! members (`newest_saved_state.rs`) and `--force-new-cluster`
//! (`force.rs`).

pub(in crate::cluster) mod apply_loop;
#[cfg(test)]
mod apply_loop_tests;
pub(in crate::cluster) mod force;
#[cfg(test)]
mod leaderless_tests;
pub mod leadership;
pub mod learner;
pub mod lease_forward;
pub(in crate::cluster) mod newest_saved_state;
pub(in crate::cluster) mod raft_loop;
pub(in crate::cluster) mod raft_node;
pub(in crate::cluster) mod saved_state_writer;

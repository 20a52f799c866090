//! The bottom layer of cluster mode: what the Raft and apply threads are
//! handed and what they publish. Inputs to the Raft loop and the channels
//! that carry them, requests waiting for their answers, the bounded Raft
//! log and its counters, the Raft status other threads read, why a
//! proposal timed out, the gate that holds client writes until a new
//! member may propose, the members heard from, and the Raft thread's side
//! of a leader transfer. Imports nothing else of `cluster`.

pub(in crate::cluster) mod catchup;
pub(in crate::cluster) mod entry_weight;
pub(in crate::cluster) mod heard_from;
pub(in crate::cluster) mod initial_gate;
#[cfg(test)]
pub(crate) mod initial_gate_tests;
pub(in crate::cluster) mod input;
pub(in crate::cluster) mod leader_transfer;
pub(in crate::cluster) mod queue;
pub(in crate::cluster) mod raft_logger;
pub(in crate::cluster) mod raft_status;
pub(in crate::cluster) mod read_batches;
pub(in crate::cluster) mod timeouts;
pub(in crate::cluster) mod waiters;

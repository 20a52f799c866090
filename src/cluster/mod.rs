//! Cluster mode: several ephd members act as one etcd cluster, replicated
//! by Raft (tikv's `raft` crate). CLUSTER.md has the design and what is not
//! built yet.
//!
//! * `entry.rs`: a store entry as the bytes of a log entry.

pub mod entry;

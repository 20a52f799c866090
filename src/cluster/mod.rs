//! Cluster mode: several ephd members act as one etcd cluster, replicated
//! by Raft (tikv's `raft` crate). CLUSTER.md has the design and what is not
//! built yet.
//!
//! The services reach a cluster member through `backend::ClusterMember`,
//! which proposes mutations to the [`Node`] and calls the modules below for
//! leadership, leases and membership.
//!
//! * `node.rs`: a member's Raft node; `raft_loop.rs`: the Raft loop's
//!   rounds, run by the Raft thread and by the threads that bring it
//!   proposals and peer messages; `apply_loop.rs`: committed entries
//!   applied in log order through `Store::apply`, by the apply thread or,
//!   for small batches, by the thread that ran the round.
//! * `peers.rs`, `sender.rs` and `transport.rs`: Raft messages to and
//!   from the other members (two lanes per peer, control and bulk), each
//!   lane a framed connection (`frames.rs`, `frames_serve.rs`) or, with
//!   members that serve none, a stream of a small gRPC service on the
//!   peer listener;
//!   `peer_metrics.rs`: etcd's peer network metrics of those links.
//! * `queue.rs`: the channels into the Raft and apply threads (park at
//!   once, take everything queued in one lock); `waiters.rs`: requests
//!   waiting for their answer, woken per applied batch.
//! * `crate::entry_bytes`: a store entry as the bytes of a log entry.
//! * `catchup.rs` (with `mvcc::snapshot`): the bounded log, and snapshots of the
//!   whole store for followers behind it; `snapshot_send.rs` and
//!   `snapshot_recv.rs`: a snapshot's data sent to a peer in chunks.
//! * `membership.rs`: the members as replicated state, changed by conf
//!   change entries; `reconfig.rs`: the Cluster API's changes and their
//!   checks; `join.rs`: how a member starts (new or joining) and the peer
//!   service that answers starting members; `removal.rs`: a removed
//!   member stops; `rejoin.rs`: a member restarted without state rejoins
//!   under a new ID; `force.rs`: `--force-new-cluster`.
//! * `logger.rs`: raft's log lines into `tracing`.
//! * `leadership.rs`: MoveLeader, the hand-over on SIGTERM, `hasleader`;
//!   `learner.rs`: what a learner refuses to serve.
//! * `lease_forward.rs`: keep-alives answered by the leader, term-checked
//!   revokes, lease checkpoints.
//! * `initial_gate.rs`: writes held back until a new cluster's initial
//!   revision is applied.
//! * `saved.rs` and `saving.rs`: `--data-dir`, the applied state kept on
//!   disk; `restart.rs`: a member restarting from it and its Raft log
//!   (`wal::RaftLog`) under its own ID; `resume.rs`: a whole cluster resuming from it; `newest.rs`
//!   and `saved_transfer.rs`: from the newest file among the waiting
//!   members, fetched in pieces.

mod apply_loop;
#[cfg(test)]
mod apply_loop_tests;
mod catchup;
mod entry_weight;
mod force;
pub mod frames;
pub mod frames_serve;
mod initial_gate;
#[cfg(test)]
mod initial_gate_tests;
mod input;
mod join;
#[cfg(test)]
mod leaderless_tests;
pub mod leadership;
pub mod learner;
pub mod lease_forward;
mod lease_state;
mod link;
mod logger;
mod members;
pub mod membership;
mod newest;
mod node;
mod peer_dial;
pub mod peer_metrics;
mod peer_settings;
mod peer_stream;
mod peers;
mod queue;
mod raft_loop;
mod reconfig;
mod rejoin;
mod removal;
pub mod restart;
pub mod resume;
pub mod saved;
mod saved_transfer;
mod saving;
mod sections;
mod seen;
mod sender;
mod snapshot_recv;
mod snapshot_send;
mod status;
mod timeouts;
mod transfer;
mod transport;
mod waiters;

pub use catchup::{LogCounters, DEFAULT_CATCHUP_ENTRIES, DEFAULT_SNAPSHOT_COUNT};
pub use force::replay_tail as replay_forced_tail;
pub use initial_gate::{initialized, WritesWaitFor};
pub use input::Progress;
pub use join::{bootstrap, membership_service, MembershipService, NotStarted};
pub use members::Boot;
pub use membership::{MemberInfo, Membership};
pub use node::Node;
pub use peer_dial::PeerDialer;
pub use peer_settings::PeerSettings;
pub use peers::MAX_BATCH_BYTES;
pub use reconfig::{check_urls, start_node};
pub use saving::{save_loop, write as write_saved};
pub use status::RaftStatus;
pub use transport::PeerService;

//! Cluster mode: several ephd members act as one etcd cluster, replicated
//! by Raft (tikv's `raft` crate). docs/cluster.md has the design.
//!
//! The services reach a cluster member through `backend::ClusterMember`,
//! which proposes mutations to the [`Node`] and calls the modules below for
//! leadership, leases and membership.
//!
//! The folders are layers, each importing only those listed before it (a
//! test in `tests/it/layout.rs` holds them to it):
//!
//! 1. `log/`: what the Raft and apply threads are handed and publish (the
//!    inputs and their channels, waiting requests, the bounded log, the
//!    Raft status).
//! 2. `replicated/`: state every member applies alike (the member list,
//!    and what a removed member does).
//! 3. `transport/`: Raft messages and snapshots to and from the peers.
//! 4. `member/`: this member's state beside its store (applied membership,
//!    leases, snapshot sections, the saved state of `--data-dir`).
//! 5. `node/`: the Raft node, its loop and apply threads, leadership,
//!    learners, leases at the leader.
//! 6. `serve/`: the peer listener's services.
//! 7. `lifecycle/`: starting, joining, rejoining, resuming and changing
//!    the membership.

pub mod lifecycle;
pub mod log;
pub mod member;
pub mod node;
pub mod replicated;
pub mod serve;
pub mod transport;

pub use lifecycle::join::{bootstrap, membership_service, MembershipService, NotStarted};
pub use lifecycle::reconfig::{check_urls, start_node};
pub use log::catchup::{LogCounters, DEFAULT_CATCHUP_ENTRIES, DEFAULT_SNAPSHOT_COUNT};
pub use log::initial_gate::{initialized, WritesWaitFor};
pub use log::input::Progress;
pub use log::raft_status::RaftStatus;
pub use member::applied_membership::Boot;
pub use node::force::replay_tail as replay_forced_tail;
pub use node::raft_node::Node;
pub use node::saved_state_writer::{save_loop, write as write_saved};
pub use replicated::member_list::{MemberInfo, Membership};
pub use serve::peer_service::PeerService;
pub use transport::peer_dial::PeerDialer;
pub use transport::peer_settings::PeerSettings;
pub use transport::peers::MAX_BATCH_BYTES;
